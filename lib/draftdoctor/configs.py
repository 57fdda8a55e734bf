"""Draft configs: recognise their format and read the dimensions an engine builds from.

Two formats exist (field notes §2): the flat Llama config SGLang and the original EAGLE code read
(`architectures: ["LlamaForCausalLMEagle3"]`, `model_type: "llama"`, aux ids in `eagle_config`), and
speculators' nested config (`speculators_model_type`, layer fields under `transformer_layer_config`,
no top-level `model_type`). `DraftDims` is what both have in common, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

FLAT = "flat"
SPECULATORS = "speculators"
MISSING = "missing"
UNKNOWN = "unknown"


def config_format(config: dict | None) -> str:
    """`flat`, `speculators`, `missing` (no config.json) or `unknown`."""
    if config is None:
        return MISSING
    if "speculators_model_type" in config or "transformer_layer_config" in config:
        return SPECULATORS
    if "model_type" in config or "architectures" in config:
        return FLAT
    return UNKNOWN


def layer_config(config: dict) -> dict:
    """The dict holding the decoder-layer hyper-parameters (hidden_size, heads, ...)."""
    if config_format(config) == SPECULATORS:
        return config.get("transformer_layer_config") or {}
    return config


def aux_layer_ids(config: dict) -> tuple[list[int] | None, str | None]:
    """The aux hidden-state layer ids and where they were found (`eagle_config` or `top-level`)."""
    eagle = config.get("eagle_config") or {}
    if isinstance(eagle, dict) and eagle.get("eagle_aux_hidden_state_layer_ids"):
        return list(eagle["eagle_aux_hidden_state_layer_ids"]), "eagle_config"
    if config.get("eagle_aux_hidden_state_layer_ids"):
        return list(config["eagle_aux_hidden_state_layer_ids"]), "top-level"
    return None, None


@dataclass(frozen=True)
class DraftDims:
    """The dimensions and options an engine builds a draft's parameters from."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int | None
    target_hidden_size: int | None
    num_layers: int = 1
    aux_layer_ids: tuple[int, ...] | None = None
    fc_bias: bool = False
    tie_word_embeddings: bool = False
    fc_norm: bool = False
    norm_before_fc: bool = False

    @property
    def fc_in(self) -> int:
        """Input width of `fc` (three aux layers unless the ids say otherwise)."""
        return (self.target_hidden_size or self.hidden_size) * (len(self.aux_layer_ids or ()) or 3)

    @classmethod
    def from_config(cls, config: dict) -> "DraftDims":
        """Read the dims from a flat or speculators config; KeyError/TypeError if a field is missing."""
        layer = layer_config(config)
        hidden = int(layer["hidden_size"])
        heads = int(layer["num_attention_heads"])
        ids, _ = aux_layer_ids(config)
        draft_vocab = config.get("draft_vocab_size", layer.get("draft_vocab_size"))
        target_hidden = config.get("target_hidden_size", layer.get("target_hidden_size"))
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            intermediate_size=int(layer["intermediate_size"]),
            vocab_size=int(layer["vocab_size"]),
            draft_vocab_size=int(draft_vocab) if draft_vocab is not None else None,
            target_hidden_size=int(target_hidden) if target_hidden is not None else None,
            num_layers=int(layer.get("num_hidden_layers", 1)),
            aux_layer_ids=tuple(ids) if ids else None,
            fc_bias=bool(config.get("bias", False)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", layer.get("tie_word_embeddings", False))),
            fc_norm=bool(config.get("fc_norm", False) or config.get("use_aux_norm", False)),
            norm_before_fc=bool((config.get("eagle_config") or {}).get("norm_before_fc", config.get("norm_before_fc", False))),
        )
