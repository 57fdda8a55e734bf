"""Which draft architecture a checkpoint is and which tool wrote it, as far as the evidence shows.

docs/engine-facts.md, "Published drafts": the `architectures` a config names (and whether it is speculators' nested
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
DRAFT_CLASS = {LLAMA: "llama", QWEN3: "qwen3", MLA: "mla"}  # the engines' builder of each (Build.draft_class)
MLA_KEYS = ("kv_a_proj_with_mqa", "q_a_proj", "kv_b_proj")
# the tools that write the plain midlayer layout with SGLang's flat config: nothing in it tells them apart
MIDLAYER_WRITERS = "the EAGLE repo, SpecForge or a converter"
# ModelOpt's nested eagle_config switches (docs/engine-facts.md: "Published drafts", "ModelOpt's EAGLE export")
MODELOPT_FIELDS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_aux_hidden_state")


@dataclass(frozen=True)
class Provenance:
    architecture: str  # LLAMA | QWEN3 | MLA
    # speculators | the EAGLE repo | ModelOpt (with its release range, or the release a quantized export names) |
    # AngelSlim | a converter | MIDLAYER_WRITERS | unknown
    trainer: str
    evidence: tuple[str, ...]

    @property
    def draft_class(self) -> str:
        """The draft class an engine must build for it: llama | qwen3 | mla (`Build.draft_class`)."""
        return DRAFT_CLASS[self.architecture]


def _first(text: str, marker: str) -> str | None:
    """The name (a line of `text`, every key one per line) holding `marker`, or None: one search of
    the joined names, in C, instead of a Python test per name (10^5 names in a target's index)."""
    at = text.find(marker)
    return None if at < 0 else text[text.rfind("\n", 0, at) + 1:text.find("\n", at)]  # text ends with a newline


def _architecture(keys: list[str], config: dict, text: str) -> tuple[str, str]:
    layer = config.get("transformer_layer_config") if isinstance(config.get("transformer_layer_config"), dict) else config
    mla = next(filter(None, (_first(text, m) for m in MLA_KEYS)), None)
    if mla or any("Deepseek" in a for a in config.get("architectures") or []):
        return MLA, (f"MLA projections ({mla}, ...)" if mla else f"architectures {config.get('architectures')}")
    qk = text.count("q_norm.weight\n") + text.count("k_norm.weight\n")
    if qk or layer.get("model_type") == "qwen3":
        return QWEN3, (f"{qk} q_norm/k_norm tensors" if qk else "model_type qwen3")
    return LLAMA, "no q/k norms and no MLA projections: a Llama decoder layer"


def _modelopt(config: dict, text: str, eagle: dict, metadata_absent: bool | None) -> tuple[str, str]:
    """ModelOpt's HF export, and which of its releases, as far as the header and config show
    (docs/engine-facts.md: "ModelOpt's EAGLE export"): only a quantized export names ModelOpt and its
    version; otherwise the layer prefix tells its release range (`midlayer.` up to 0.42, `layers.N.` from 0.43)."""
    quant = config.get("quantization_config") if isinstance(config.get("quantization_config"), dict) else {}
    producer = quant.get("producer") if isinstance(quant.get("producer"), dict) else {}
    switches = sorted(set(eagle) & set(MODELOPT_FIELDS + ("use_mtp_layernorm", "next_layer_regular")))
    facts = [f"eagle_config switches {switches}, which only ModelOpt's export writes"]
    if producer.get("name") == "modelopt" and isinstance(producer.get("version"), str):
        return (f"ModelOpt {producer['version']}", f"config.json quantization_config.producer: modelopt "
                f"{producer['version']} (a quantized export names its producer)")
    if text.startswith("midlayer.") or "\nmidlayer." in text:
        trainer = "ModelOpt ≤ 0.42"
        facts.append("midlayer.* keys (ModelOpt's export renamed its layers to midlayer. up to 0.42)")
    elif text.startswith("layers.") or "\nlayers." in text:
        trainer = "ModelOpt ≥ 0.43"
        facts.append("layers.N.* keys without model. under a flat config (ModelOpt's export from 0.43)")
    else:
        trainer = "ModelOpt"
    if "\nd2t\n" in "\n" + text and "\nt2d\n" not in "\n" + text:
        facts.append("d2t without t2d (ModelOpt writes no t2d)")
    if "embed_tokens" not in text:
        facts.append("no embed_tokens (ModelOpt's export never writes it)")
    if eagle.get("eagle_aux_hidden_state_layer_ids") and not config.get("eagle_aux_hidden_state_layer_ids"):
        facts.append("aux ids only in eagle_config, in SGLang's convention (each names a layer's output)")
    if metadata_absent:
        facts.append("no __metadata__ in the safetensors header (a weak sign: ModelOpt's save_file writes none, "
                     "transformers' save_pretrained writes one)")
    return trainer, "; ".join(facts) + ("; nothing in an unquantized export names its release" if trainer != "ModelOpt"
                                        else "")


def _trainer(keys: list[str], config: dict, text: str, metadata_absent: bool | None = None) -> tuple[str, str]:
    archs = config.get("architectures") or []
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    if config_format(config) == SPECULATORS:
        version = config.get("speculators_version")
        return "speculators", f"speculators' nested config (speculators_version {version})"
    if config.get("draftdoctor"):
        return "a converter", "a `draftdoctor` record in config.json (written by draftdoctor fix)"
    if any(f in eagle for f in MODELOPT_FIELDS[:2]):
        return _modelopt(config, text, eagle, metadata_absent)
    if any("Deepseek" in a for a in archs):
        return "ModelOpt", f"architectures {archs} (ModelOpt's MLA export)"
    if "Eagle3LlamaForCausalLM" in archs:
        return "AngelSlim", "architectures Eagle3LlamaForCausalLM (vLLM's class name, as AngelSlim writes it)"
    midlayer = text.startswith("midlayer.") or "\nmidlayer." in text
    if archs == ["LlamaForCausalLM"] and midlayer:
        return "the EAGLE repo", "architectures LlamaForCausalLM with midlayer.* keys (its published drafts)"
    if text.startswith("layers.") or "\nlayers." in text:
        return "a converter", "speculators' layers.N.* keys under a flat config: a hand-flattened or converted speculators draft"
    if "LlamaForCausalLMEagle3" in archs and midlayer:
        return (MIDLAYER_WRITERS, "architectures LlamaForCausalLMEagle3, midlayer.* keys and a flat config: what the EAGLE "
                "repo and SpecForge export, and what any converter to SGLang's names writes; nothing here tells them apart")
    return "unknown", "no trainer's signature found"


def recognise(keys, config: dict | None, metadata_absent: bool | None = None) -> Provenance:
    """The draft architecture and the trainer, each with the facts that decided it; `metadata_absent`: whether
    the safetensors headers carry no `__metadata__` (None: not known)."""
    keys, config = list(keys), config or {}
    text = "\n".join(keys) + "\n"
    architecture, why_architecture = _architecture(keys, config, text)
    trainer, why_trainer = _trainer(keys, config, text, metadata_absent)
    return Provenance(architecture, trainer, (why_architecture, why_trainer))
