"""Draft configs: recognise their format and read the dimensions an engine builds from.

Two formats exist (docs/engine-facts.md: "Config formats"): the flat Llama config SGLang and the original EAGLE code read
(`architectures: ["LlamaForCausalLMEagle3"]`, `model_type: "llama"`, aux ids in `eagle_config`), and
speculators' nested config (`speculators_model_type`, layer fields under `transformer_layer_config`,
no top-level `model_type`). `DraftDims` is what both have in common, in one place; the draft options
(`DRAFT_OPTIONS`) are read as the engines read them. Rewriting a config for an engine: `configrewrite.py`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from . import auxids

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


class ConfigValueError(ValueError):
    """A config field that is present but cannot be a draft's (a count that is not a positive whole
    number, aux ids that are not layer numbers, an eagle_config that is not an object)."""


class ConfigFieldUnread(KeyError):
    """A field the draft's dimensions are read from that a config leaves out or sets to null (a KeyError,
    as a missing key is): `field` names it where it sits (`transformer_layer_config.hidden_size` in a
    speculators config), `state` is "missing" or "null"."""

    def __init__(self, field: str, state: str):
        super().__init__(field)
        self.field, self.state = field, state

    def __str__(self) -> str:
        return f"{self.field} is {self.state}"


def _needed(layer: dict, name: str, where: str):
    """`layer[name]`, or ConfigFieldUnread naming it (`where`: the prefix saying where the layer's fields sit)."""
    if layer.get(name) is None:
        raise ConfigFieldUnread(where + name, "null" if name in layer else "missing")
    return layer[name]


MAX_DIM = 1 << 24  # no draft dimension comes near this (Kimi-K2: hidden 7168, vocab 163840)
# nor a layer count this (Llama-3.1-405B: 126): the replay, the estimates and a target's default aux ids
# go layer by layer, and 10^6 layers had run past a minute
MAX_LAYERS = 1 << 12
# a target's fields the kit reads as sizes (target_checks, the default aux ids, the prediction's estimate)
TARGET_COUNTS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                 "vocab_size", "num_hidden_layers")


def _count(value, name: str, maximum: int | None = None) -> int:
    maximum = maximum or (MAX_LAYERS if name == "num_hidden_layers" else MAX_DIM)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or not 0 < value <= maximum \
            or int(value) != value:
        raise ConfigValueError(f"{name} must be a whole number from 1 to {maximum}, not {value!r}"[:200])
    return int(value)


def check_shape(config: dict) -> None:
    """ConfigValueError when the config's objects are not objects or its aux ids are not layer numbers:
    what every reader of a config (DraftDims, fix's rewrite) takes for granted."""
    _check_shape(config, layer_config(config))


def _check_shape(config: dict, layer: dict) -> None:
    eagle = config.get("eagle_config")
    if eagle is not None and not isinstance(eagle, dict):
        raise ConfigValueError(f"eagle_config must be an object, not {type(eagle).__name__}")
    if not isinstance(layer, dict):
        raise ConfigValueError("transformer_layer_config must be an object")
    rope = [(f"{name}.rope_theta", holder.get(name)) for holder in (layer, config)
            for name in ("rope_parameters", "rope_scaling") if isinstance(holder.get(name), dict)]
    for name, value in [(n, h.get(n)) for h in (layer, config) for n in ("rms_norm_eps", "rope_theta")] + \
            [(n, r.get("rope_theta")) for n, r in rope]:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
            raise ConfigValueError(f"{name} must be a number, not {json.dumps(value)[:80]}")
    for where in auxids.PLACE_OFFSET:
        ids = (auxids.holder(config, where) or {}).get(auxids.KEY)
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                                   and -1 <= i < MAX_DIM for i in ids)):
            field = auxids.KEY if where == auxids.TOP_LEVEL else f"eagle_config.{auxids.KEY}"
            raise ConfigValueError(f"{field} must be a list of layer numbers, not {json.dumps(ids)[:80]}")


def check_target(config: dict) -> None:
    """ConfigValueError for a target config whose sizes (TARGET_COUNTS, where set) are not counts a
    model can have: a string, zero, a float, more layers than MAX_LAYERS."""
    layer = layer_config(config)
    if not isinstance(layer, dict):
        raise ConfigValueError("transformer_layer_config must be an object")
    for name in TARGET_COUNTS:
        if layer.get(name) is not None:
            _count(layer[name], name)


# transformers' config classes' defaults that the engines build with when a flat config leaves a field
# out: head_dim by model_type (else hidden / heads: LlamaConfig, speculators' config), and the MLA ranks
# (DeepseekV2Config; kimi_k2 and deepseek_v3 configs are read with it or its V3 sibling)
HEAD_DIM_DEFAULTS = {"qwen3": 128, "qwen3_moe": 128, "gemma": 256, "gemma2": 256, "gemma3_text": 256}
MLA_DEFAULTS = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128}
MLA_FIELDS = tuple(MLA_DEFAULTS)


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
    aux_ids_at: str | None = None  # where the config holds them: "eagle_config" or "top-level"
    config_format: str | None = None  # FLAT or SPECULATORS: the config these were read from
    # fc's aux-state count as the engines' configs state it (flat: top level; speculators: inside
    # transformer_layer_config, which vLLM's config reader starts from)
    num_aux_hidden_states: int | None = None
    layer_options: tuple[str, ...] = ()  # draft options set inside a speculators transformer_layer_config
    fc_bias: bool = False
    tie_word_embeddings: bool = False
    fc_norm: bool = False
    use_aux_norm: bool = False  # SGLang's older name for fc_norm
    # norm_before_fc where the config sets it: ((place, value), ...), eagle_config's first
    # (ConfigReading.norm_before_fc_from)
    norm_before_fc_at: tuple[tuple[str, bool], ...] = ()
    model_type: str | None = None  # the decoder layer's model_type (llama, qwen3, deepseek_v2, kimi_k2, ...)
    # the ids at each place, for the engines' fc-width rules (Build.fc_aux_count_from)
    aux_ids_top: tuple[int, ...] | None = None
    aux_ids_eagle: tuple[int, ...] | None = None
    num_aux_layers: int | None = None  # vLLM's Qwen3 class reads it before num_aux_hidden_states
    attention_bias: bool = False  # the layer config's own (SGLang's Llama attention also takes `bias`: fc_bias)
    # MLA (DeepSeek-V2/V3, Kimi-K2 drafts), with transformers' DeepseekV2Config defaults where absent;
    # q_lora_rank None: the config says null (q_proj instead of q_a_proj/q_b_proj)
    q_lora_rank: int | None = MLA_DEFAULTS["q_lora_rank"]
    kv_lora_rank: int = MLA_DEFAULTS["kv_lora_rank"]
    qk_nope_head_dim: int = MLA_DEFAULTS["qk_nope_head_dim"]
    qk_rope_head_dim: int = MLA_DEFAULTS["qk_rope_head_dim"]
    v_head_dim: int = MLA_DEFAULTS["v_head_dim"]

    @property
    def norm_before_fc(self) -> bool:
        """norm_before_fc as SGLang and vLLM read it: eagle_config's, else the top level's."""
        return bool(self.norm_before_fc_at and self.norm_before_fc_at[0][1])

    @property
    def fc_in(self) -> int:
        """Input width of `fc` (three aux layers unless the ids say otherwise)."""
        return (self.target_hidden_size or self.hidden_size) * (len(self.aux_layer_ids or ()) or 3)

    @classmethod
    def from_config(cls, config: dict) -> "DraftDims":
        """Read the dims from a flat or speculators config; ConfigFieldUnread (a KeyError) if a field
        they need is missing or null, ConfigValueError if one is there but impossible."""
        layer = layer_config(config)
        _check_shape(config, layer)
        where = "transformer_layer_config." if config_format(config) == SPECULATORS else ""
        for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                     "vocab_size", "draft_vocab_size", "target_hidden_size", "num_hidden_layers", "num_aux_hidden_states",
                     "num_aux_layers", *MLA_FIELDS):
            for holder in (layer, config):
                if holder.get(name) is not None:
                    _count(holder[name], name)
        hidden = int(_needed(layer, "hidden_size", where))
        heads = int(_needed(layer, "num_attention_heads", where))
        ids, ids_at = auxids.find(config)
        fmt = config_format(config)
        model_type = layer.get("model_type") if isinstance(layer.get("model_type"), str) else None
        default_head_dim = HEAD_DIM_DEFAULTS.get(model_type, hidden // heads) if fmt == FLAT else hidden // heads
        top, eagle = (auxids.ids_at(config, where) for where in (auxids.TOP_LEVEL, auxids.EAGLE_CONFIG))
        mla = {name: int(layer[name]) if layer.get(name) is not None else (None if name in layer else default)
               for name, default in MLA_DEFAULTS.items()}
        for name in MLA_FIELDS[1:]:
            mla[name] = MLA_DEFAULTS[name] if mla[name] is None else mla[name]
        draft_vocab = config.get("draft_vocab_size", layer.get("draft_vocab_size"))
        target_hidden = config.get("target_hidden_size", layer.get("target_hidden_size"))
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or default_head_dim),
            intermediate_size=int(_needed(layer, "intermediate_size", where)),
            vocab_size=int(_needed(layer, "vocab_size", where)),
            draft_vocab_size=int(draft_vocab) if draft_vocab is not None else None,
            target_hidden_size=int(target_hidden) if target_hidden is not None else None,
            num_layers=int(_needed(layer, "num_hidden_layers", where)) if "num_hidden_layers" in layer else 1,
            aux_layer_ids=tuple(ids) if ids else None,
            aux_ids_at=ids_at,
            config_format=fmt,
            num_aux_hidden_states=int(layer["num_aux_hidden_states"]) if layer.get("num_aux_hidden_states") else None,
            num_aux_layers=int(layer["num_aux_layers"]) if layer.get("num_aux_layers") else None,
            model_type=model_type,
            aux_ids_top=tuple(top) if top else None,
            aux_ids_eagle=tuple(eagle) if eagle else None,
            attention_bias=bool(layer.get("attention_bias", False)),
            **mla,
            layer_options=layer_options(config),
            fc_bias=bool(config.get("bias", False)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", layer.get("tie_word_embeddings", False))),
            fc_norm=bool(config.get("fc_norm", False)),
            use_aux_norm=bool(config.get("use_aux_norm", False)),
            norm_before_fc_at=norm_before_fc_at(config),
        )


def norm_before_fc_at(config: dict) -> tuple[tuple[str, bool], ...]:
    """Where a config sets norm_before_fc, and to what: eagle_config first, then the top level (a
    speculators config has only the top level)."""
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    return tuple((where, bool(holder["norm_before_fc"])) for where, holder in
                 ((auxids.EAGLE_CONFIG, eagle), (auxids.TOP_LEVEL, config)) if "norm_before_fc" in holder)


# speculators' boolean draft options -> the Profile attribute saying the engine implements it
DRAFT_OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")  # Profile.implements each


def draft_options(config: dict, norm_before_fc_from=(auxids.EAGLE_CONFIG, auxids.TOP_LEVEL)) -> dict:
    """The draft options a config sets, read the way the engines read them: norm_before_fc from the first
    of `norm_before_fc_from` that holds it (SGLang and vLLM: eagle_config's, else the top level's)."""
    placed = dict(norm_before_fc_at(config))
    at = next((where for where in norm_before_fc_from if where in placed), None)
    found = {k: placed[at] if k == "norm_before_fc" else config[k] for k in DRAFT_OPTIONS
             if (at is not None if k == "norm_before_fc" else k in config)}
    if "fc_norm" not in found and "use_aux_norm" in config:
        found["fc_norm"] = config["use_aux_norm"]
    return found


def layer_options(config: dict) -> tuple[str, ...]:
    """The draft options a speculators config sets inside transformer_layer_config, where vLLM's
    reader of that format starts (so they reach the model even where the reader drops them)."""
    if config_format(config) != SPECULATORS:
        return ()
    return tuple(name for name in DRAFT_OPTIONS if layer_config(config).get(name))


def unsupported_options(options: dict, profile, fmt: str = FLAT, carried: tuple[str, ...] = ()) -> list[str]:
    """The options set true that `profile`'s engine does not implement, or does not read from a
    config of format `fmt` (ConfigReading.speculators_drops) unless `carried` where it does read them."""
    return [name for name, value in options.items()
            if value and (not profile.implements(name)
                          or fmt == SPECULATORS and name in profile.config.speculators_drops and name not in carried)]
