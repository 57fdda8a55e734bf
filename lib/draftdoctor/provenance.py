"""Which draft architecture a checkpoint is and which tool wrote it, as far as the evidence shows.

Field notes §13–§14: the `architectures` a config names (and whether it is speculators' nested
format) tells the draft class an engine would build; key patterns tell the attention kind (q/k norms
for Qwen3-style drafts, MLA projections for Kimi/DeepSeek targets); config fields and key layouts
tell the trainer. Each rule is a row: the first that matches wins, and its evidence is shown. A
rule names one tool only where a fact only that tool writes decides it; where several tools write
the same thing, it names them all. Headers and config only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .configs import SPECULATORS, config_format

LLAMA, QWEN3, MLA = "Llama EAGLE-3", "Qwen3 EAGLE-3 (q/k norms)", "MLA EAGLE-3 (DeepSeek/Kimi targets)"
DRAFT_CLASS = {LLAMA: "llama", QWEN3: "qwen3", MLA: "mla"}  # the engines' builder of each (Profile.draft_class)
MLA_KEYS = ("kv_a_proj_with_mqa", "q_a_proj", "kv_b_proj")
# the tools that write the plain midlayer layout with SGLang's flat config: nothing in it tells them apart
MIDLAYER_WRITERS = "the EAGLE repo, SpecForge or a converter"
# ModelOpt's nested eagle_config switches (field notes §14)
MODELOPT_FIELDS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_aux_hidden_state")


@dataclass(frozen=True)
class Provenance:
    architecture: str  # LLAMA | QWEN3 | MLA
    trainer: str  # speculators | the EAGLE repo | ModelOpt | AngelSlim | a converter | MIDLAYER_WRITERS | unknown
    evidence: tuple[str, ...]

    @property
    def draft_class(self) -> str:
        """The draft class an engine must build for it: llama | qwen3 | mla (`Profile.draft_class`)."""
        return DRAFT_CLASS[self.architecture]


def _architecture(keys: list[str], config: dict) -> tuple[str, str]:
    layer = config.get("transformer_layer_config") if isinstance(config.get("transformer_layer_config"), dict) else config
    mla = [k for k in keys if any(m in k for m in MLA_KEYS)]
    if mla or any("Deepseek" in a for a in config.get("architectures") or []):
        return MLA, (f"MLA projections ({mla[0]}, ...)" if mla else f"architectures {config.get('architectures')}")
    qk = [k for k in keys if k.endswith(("q_norm.weight", "k_norm.weight"))]
    if qk or layer.get("model_type") == "qwen3":
        return QWEN3, (f"{len(qk)} q_norm/k_norm tensors" if qk else "model_type qwen3")
    return LLAMA, "no q/k norms and no MLA projections: a Llama decoder layer"


def _trainer(keys: list[str], config: dict) -> tuple[str, str]:
    archs = config.get("architectures") or []
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    if config_format(config) == SPECULATORS:
        version = config.get("speculators_version")
        return "speculators", f"speculators' nested config (speculators_version {version})"
    if config.get("draftdoctor"):
        return "a converter", "a `draftdoctor` record in config.json (written by draftdoctor fix)"
    if any(f in eagle for f in MODELOPT_FIELDS[:2]) or any("Deepseek" in a for a in archs):
        return "ModelOpt", f"eagle_config switches {sorted(set(eagle) & set(MODELOPT_FIELDS))} or architectures {archs}"
    if "Eagle3LlamaForCausalLM" in archs:
        return "AngelSlim", "architectures Eagle3LlamaForCausalLM (vLLM's class name, as AngelSlim writes it)"
    if archs == ["LlamaForCausalLM"] and any(k.startswith("midlayer.") for k in keys):
        return "the EAGLE repo", "architectures LlamaForCausalLM with midlayer.* keys (its published drafts)"
    if any(k.startswith("layers.") for k in keys):
        return "a converter", "speculators' layers.N.* keys under a flat config: a hand-flattened or converted speculators draft"
    if "LlamaForCausalLMEagle3" in archs and any(k.startswith("midlayer.") for k in keys):
        return (MIDLAYER_WRITERS, "architectures LlamaForCausalLMEagle3, midlayer.* keys and a flat config: what the EAGLE "
                "repo and SpecForge export, and what any converter to SGLang's names writes; nothing here tells them apart")
    return "unknown", "no trainer's signature found"


def recognise(keys, config: dict | None) -> Provenance:
    """The draft architecture and the trainer, each with the fact that decided it."""
    keys, config = list(keys), config or {}
    architecture, why_architecture = _architecture(keys, config)
    trainer, why_trainer = _trainer(keys, config)
    return Provenance(architecture, trainer, (why_architecture, why_trainer))
