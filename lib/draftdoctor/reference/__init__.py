"""Reference backend: a CPU EAGLE-3 engine with SGLang semantics, and the demo data it runs on."""
