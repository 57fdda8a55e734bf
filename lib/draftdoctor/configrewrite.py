"""Rewriting a draft config for an engine (used by `draftdoctor fix`), in either direction between the
flat Llama config and speculators' nested one.

The two formats carry the same draft, with two traps (docs/engine-facts.md: "SGLang's EAGLE-3 loader"): SGLang reads the aux layer
ids only from `eagle_config` and captures id + 1, where speculators and vLLM use the ids as-is;
and a flag one engine implements may mean nothing to another. A flat config keeps the
speculators fields it cannot hold under RECORD_KEY, so converting back loses nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from . import auxids
from .configs import (DRAFT_OPTIONS, FLAT, SPECULATORS, config_format, draft_options, layer_options,
                      unsupported_options)

ABSENT = "<absent>"
RECORD_KEY = "draftdoctor"  # unknown keys are kept as attributes by transformers and ignored by engines

# keys of a flat config that are not decoder-layer hyper-parameters
FLAT_DRAFT_KEYS = ("architectures", "model_type", "draft_vocab_size", "target_hidden_size", "eagle_config",
                   "eagle_aux_hidden_state_layer_ids", "bias", "use_aux_norm", RECORD_KEY, *DRAFT_OPTIONS)
SPECULATORS_ARCHITECTURE = "Eagle3DraftModel"
# what speculators' own converter writes when it knows nothing better
DEFAULT_SPECULATORS_CONFIG = {
    "algorithm": "eagle3",
    "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
    "default_proposal_method": "greedy",
    "verifier": {"name_or_path": None, "architectures": []},
}


@dataclass(frozen=True)
class ConfigChange:
    """One change a rewrite makes; `before`/`after` are ABSENT where the field does not exist."""

    field: str
    before: object
    after: object
    reason: str
    moved_to: str | None = None  # the field's new place, when it moves


@dataclass
class ConfigRewrite:
    """A config rewritten for an engine, what changed, and what the engine cannot express."""

    config: dict
    format: str
    changes: list[ConfigChange]
    lossy: list[str]  # options the engine cannot express: the draft would compute differently
    defaulted: list[str]  # values the source lacks, filled with defaults


def target_format(profile) -> str:
    """The config format `fix` writes for an engine: speculators' where read (it states the aux-id
    convention and every option explicitly), else flat."""
    return SPECULATORS if SPECULATORS in profile.config.config_formats else FLAT


def rewrite_config(config: dict, profile) -> ConfigRewrite:
    """`config` (flat or speculators) rewritten for `profile`'s engine."""
    fmt = config_format(config)
    if fmt not in (FLAT, SPECULATORS):
        raise ValueError(f"cannot rewrite a config of format {fmt!r}")
    if target_format(profile) == FLAT:
        return _to_flat(config, profile)
    if fmt == FLAT:
        return _to_speculators(config, profile)
    config = json.loads(json.dumps(config))
    layer, options = config.get("transformer_layer_config"), draft_options(config)
    changes = []
    if isinstance(layer, dict):
        changes = _fill_layer_config(layer, config.get("eagle_aux_hidden_state_layer_ids"), options, profile)
    return ConfigRewrite(config, SPECULATORS, changes, _lossy(options, profile, SPECULATORS, layer_options(config)), [])


def _lossy(options: dict, profile, fmt: str, carried: tuple[str, ...] = ()) -> list[str]:
    return [
        f"{name}: true has no equivalent in {profile.engine} {profile.first}–{profile.last}"
        + (" (which implements it, but does not read it from speculators' config)" if profile.implements(name) else "")
        + "; the draft would compute differently there than it was trained"
        for name in unsupported_options(options, profile, fmt, carried)
    ]


def _fill_layer_config(layer: dict, ids, options: dict, profile) -> list[ConfigChange]:
    """Write into a speculators config's transformer_layer_config what the engine reads only there:
    vLLM's reader of that format starts from it, then applies its own copies. fc is sized by
    `num_aux_hidden_states`, else by eagle_config's ids (which this format has none of), else for 3;
    and that reader drops some options in some releases (`profile.config.speculators_drops`)."""
    changes = []
    if ids and len(ids) != 3 and "num_aux_hidden_states" not in layer:
        layer["num_aux_hidden_states"] = len(ids)
        changes.append(ConfigChange("transformer_layer_config.num_aux_hidden_states", ABSENT, len(ids),
                                    f"vLLM sizes fc by it; without it, {len(ids)} aux ids at the top level get a "
                                    "3-state fc"))
    for name in profile.config.speculators_drops:
        if options.get(name) and not layer.get(name):
            layer[name] = True
            changes.append(ConfigChange(f"transformer_layer_config.{name}", ABSENT, True,
                                        f"{profile.engine} {profile.first}–{profile.last} reads it only there"))
    return changes


def _legacy_rope(layer: dict) -> dict:
    """rope_theta / rope_scaling for readers older than transformers 5, from rope_parameters."""
    rope = layer.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        return {}
    out = {} if "rope_theta" in layer else {"rope_theta": rope["rope_theta"]}
    if rope.get("rope_type", rope.get("type", "default")) != "default" and "rope_scaling" not in layer:
        out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return out


def _to_flat(config: dict, profile) -> ConfigRewrite:
    config = json.loads(json.dumps(config))  # never alias the caller's dict
    source, options, changes = config_format(config), draft_options(config), []
    if source == SPECULATORS:
        layer = dict(config.get("transformer_layer_config") or {})
        body = {k: v for k, v in layer.items() if k not in ("architectures", "model_type")}
        record = {"converted_from": SPECULATORS, "layer": {k: layer[k] for k in ("architectures", "model_type") if k in layer},
                  "derived": sorted(_legacy_rope(layer))}
        eagle, sglang_ids, ids = {}, None, config.get("eagle_aux_hidden_state_layer_ids")
        changes += [ConfigChange("(format)", SPECULATORS, FLAT, f"{profile.engine} reads only the flat Llama config"),
                    ConfigChange("transformer_layer_config", f"{len(layer)} fields", "top level",
                                 "the flat config holds the decoder-layer fields at the top level")]
    else:
        record = config.pop(RECORD_KEY, None)
        body = {k: v for k, v in config.items() if k not in FLAT_DRAFT_KEYS}
        eagle = {k: v for k, v in (config.get("eagle_config") or {}).items() if k not in DRAFT_OPTIONS}
        sglang_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        ids = None if sglang_ids else config.get("eagle_aux_hidden_state_layer_ids")
    arch = [profile.config.architectures[0]]
    if config.get("architectures") != arch:
        changes.append(ConfigChange("architectures", config.get("architectures", ABSENT), arch,
                                    f"the draft class {profile.engine} registers"))
    source_type = (layer if source == SPECULATORS else config).get("model_type")
    model_type = source_type if source_type in profile.config.model_types else profile.config.model_types[0]
    if config.get("model_type") != model_type:
        changes.append(ConfigChange("model_type", config.get("model_type", ABSENT), model_type,
                                    "transformers needs model_type to read the config" if source_type is None else
                                    f"{profile.engine} reads this draft class with model_type "
                                    f"{' or '.join(profile.config.model_types)}"))
    flat = {"architectures": arch, "model_type": model_type, **body}
    for key, value in _legacy_rope(flat).items():
        flat[key] = value
        changes.append(ConfigChange(key, ABSENT, value, "restates rope_parameters for transformers < 5 (SGLang 0.4.x)"))
    flat["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        flat["target_hidden_size"] = config["target_hidden_size"]
    elif "target_hidden_size" in config:
        changes.append(ConfigChange("target_hidden_size", None, ABSENT,
                                    "left out: SGLang computes target_hidden_size * 3 and crashes on null"))
    if "bias" in config:
        flat["bias"] = config["bias"]
    if profile.aux.aux_ids_from[0] == auxids.TOP_LEVEL:  # an engine reading the top level (vLLM): the ids go there
        if sglang_ids:
            ids = auxids.convert(eagle.pop("eagle_aux_hidden_state_layer_ids"), auxids.EAGLE_CONFIG, auxids.TOP_LEVEL)
            changes.append(ConfigChange("eagle_config.eagle_aux_hidden_state_layer_ids", sglang_ids, ids,
                                        f"plus 1, at the top level: {profile.engine} reads the ids only there, as-is",
                                        "eagle_aux_hidden_state_layer_ids"))
        if ids:
            flat["eagle_aux_hidden_state_layer_ids"] = ids
            if len(ids) != 3 and "num_aux_hidden_states" in profile.build.fc_aux_count_from and "num_aux_hidden_states" not in flat:
                flat["num_aux_hidden_states"] = len(ids)
                changes.append(ConfigChange("num_aux_hidden_states", ABSENT, len(ids),
                                            f"{profile.engine} sizes fc from it, not from top-level ids"))
    elif ids:
        eagle["eagle_aux_hidden_state_layer_ids"] = auxids.convert(ids, auxids.TOP_LEVEL, auxids.EAGLE_CONFIG)
        changes.append(ConfigChange("eagle_aux_hidden_state_layer_ids", ids, eagle["eagle_aux_hidden_state_layer_ids"],
                                    "minus 1, in eagle_config: SGLang reads the ids only there and captures id + 1",
                                    "eagle_config.eagle_aux_hidden_state_layer_ids"))
    if "use_aux_hidden_state" not in eagle:
        eagle["use_aux_hidden_state"] = True
        changes.append(ConfigChange("eagle_config.use_aux_hidden_state", ABSENT, True, "EAGLE-3 drafts read aux hidden states"))
    flat["eagle_config"] = eagle
    unsupported = {}
    for name, value in options.items():
        if profile.implements(name):
            flat[name] = value
        else:
            unsupported[name] = value
            if source == FLAT:
                changes.append(ConfigChange(name, value, ABSENT, f"no such option in {profile.engine} "
                                            f"{profile.first}–{profile.last}; kept under {RECORD_KEY}"))
    if source == SPECULATORS:
        consumed = {"transformer_layer_config", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids", *flat}
        record["fields"] = {k: v for k, v in config.items() if k not in consumed or k in unsupported
                            or k == "target_hidden_size" and v is None or k == "architectures"}
        changes.append(ConfigChange(RECORD_KEY, ABSENT, "{" + ", ".join(sorted(record["fields"])) + "}",
                                    "speculators fields the flat config cannot hold, kept for converting back"))
    elif unsupported:
        record = record or {"converted_from": FLAT}
        record["fields"] = {**record.get("fields", {}), **unsupported}
    if record:
        flat[RECORD_KEY] = record
    return ConfigRewrite(flat, FLAT, changes, _lossy(options, profile, FLAT), [])


def _to_speculators(config: dict, profile) -> ConfigRewrite:
    flat = json.loads(json.dumps(config))
    record = flat.pop(RECORD_KEY, None) or {}
    fields, changes, defaulted = dict(record.get("fields") or {}), [], []
    options = {**{k: v for k, v in fields.items() if k in DRAFT_OPTIONS}, **draft_options(flat)}
    eagle = flat.get("eagle_config") if isinstance(flat.get("eagle_config"), dict) else {}
    changes.append(ConfigChange("(format)", FLAT, SPECULATORS, f"{profile.engine} reads speculators' nested config, "
                                "which states the aux-id convention and every option explicitly"))
    if eagle.get("eagle_aux_hidden_state_layer_ids"):
        before = eagle["eagle_aux_hidden_state_layer_ids"]
        ids = auxids.convert(before, auxids.EAGLE_CONFIG, auxids.TOP_LEVEL)
        changes.append(ConfigChange("eagle_config.eagle_aux_hidden_state_layer_ids", before, ids,
                                    "plus 1, at the top level: eagle_config ids are in SGLang's convention (it "
                                    "captures id + 1); speculators and vLLM use them as-is",
                                    "eagle_aux_hidden_state_layer_ids"))
    else:
        ids = flat.get("eagle_aux_hidden_state_layer_ids")
    derived = set(record.get("derived", ()))
    layer = {**record.get("layer", {"model_type": flat.get("model_type", "llama")}),
             **{k: v for k, v in flat.items() if k not in FLAT_DRAFT_KEYS and k not in derived}}
    changes.append(ConfigChange("transformer_layer_config", ABSENT, f"{len(layer)} fields",
                                "speculators' nested config holds the decoder-layer fields there"))
    changes += _fill_layer_config(layer, ids, options, profile)
    draft_vocab = flat.get("draft_vocab_size")
    if draft_vocab is None:
        draft_vocab = layer.get("vocab_size")
        defaulted.append(f"draft_vocab_size: null (head taken from the target) written as vocab_size {draft_vocab}")
    if "speculators_config" not in fields:
        defaulted.append("speculators_config: no verifier is named (verifier.name_or_path null, 3 speculative "
                         "tokens, as speculators' converter writes); serve with an explicit target, or fill it in")
    out = {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        **fields,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": flat.get("target_hidden_size"),
        "eagle_aux_hidden_state_layer_ids": ids or None,
        # every option explicit: vLLM's speculators path defaults norm_before_residual to true
        **{name: bool(options.get(name, False)) for name in DRAFT_OPTIONS},
        "speculators_config": fields.get("speculators_config", json.loads(json.dumps(DEFAULT_SPECULATORS_CONFIG))),
        "transformer_layer_config": layer,
    }
    lossy = _lossy(options, profile, SPECULATORS, layer_options(out))
    if flat.get("bias"):
        lossy.append("bias: true (fc has a bias) has no equivalent in speculators' config")
    return ConfigRewrite(out, SPECULATORS, changes, lossy, defaulted)
