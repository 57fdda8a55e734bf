"""Rename rules: how each producer layout's tensor names become the names an engine loads.

The rules are data, `engines.mapper.WeightsMapper` (the one rename type, also the rows'): ordered prefix
(and substring) maps, no branches. For each producer layout, `RULES` lists candidate mappers in order of preference. Which
one applies to an engine is not written down per release: `choose` asks the engine's profile, via
`engines.keys.resolve_key`, and keeps the first candidate under which every key loads *natively*, i.e.
with the profile's own renames switched off (its drops kept), so the result does not lean on an engine's
compatibility path (SGLang >= 0.5.12 and vLLM accept `midlayer.` only through such a rename).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .coverage import CRASHED, DERIVED, DROPPED, IGNORED, LOADED, TRAINING_ONLY
from .layouts import MIDLAYER_LAYOUT, PREFIXED_LAYOUT, SPECULATORS_LAYOUT, UNKNOWN_LAYOUT, is_training_only
from .engines.keys import PAIRED, pair_of, resolve_key
from .engines.mapper import WeightsMapper


KEEP = WeightsMapper("keep the names")
# SGLang 0.4.x-0.5.11 name the single decoder layer `midlayer` (docs/engine-facts.md: "SGLang's EAGLE-3 loader")
LAYERS_TO_MIDLAYER = WeightsMapper.of("layers.0. -> midlayer.", prefix=(("layers.0.", "midlayer."),))
# speculators' layout, which vLLM and SGLang >= 0.5.12 load natively
MIDLAYER_TO_LAYERS = WeightsMapper.of("midlayer. -> layers.0.", prefix=(("midlayer.", "layers.0."),))
# keys saved with an engine's `model.` parameter prefix; engines that always add it would double it
STRIP_MODEL = WeightsMapper.of("strip model.", prefix=(("model.", ""),))

# EAGLE 3.1's per-aux norms under their other names (docs/engine-facts.md: "EAGLE 3.1"): every release that
# builds the norm reads `fc_norm.N`; SGLang from 0.5.12 renames the legacy `aux_norm_*` itself and finds
# `model.fc_norm.N` too, vLLM and llama.cpp take neither
NORM_NAMES = WeightsMapper.of("aux_norm_low/mid/high and model.fc_norm. -> fc_norm.N",
                              substr=(("aux_norm_low.", "fc_norm.0."), ("aux_norm_mid.", "fc_norm.1."),
                                      ("aux_norm_high.", "fc_norm.2.")),
                              prefix=(("model.fc_norm.", "fc_norm."),))

# producer layout -> candidate mappers, most preferred first
RULES: dict[str, tuple[WeightsMapper, ...]] = {
    SPECULATORS_LAYOUT: (KEEP, LAYERS_TO_MIDLAYER),
    MIDLAYER_LAYOUT: (MIDLAYER_TO_LAYERS, KEEP),
    PREFIXED_LAYOUT: (STRIP_MODEL, STRIP_MODEL + MIDLAYER_TO_LAYERS, STRIP_MODEL + LAYERS_TO_MIDLAYER, KEEP),
    UNKNOWN_LAYOUT: (KEEP, STRIP_MODEL),
}


@dataclass
class Renaming:
    """The chosen mapper and, per key, its new name (None: left out) and why."""

    mapper: WeightsMapper
    names: dict[str, str | None]
    reasons: dict[str, str]
    unresolved: list[str]  # keys the engine would still not load


def _native_profile(profile):
    """`profile` with the loader's own renames left out (its drops kept): a key as the engine finds it natively."""
    return replace(profile, keys=replace(profile.keys, renames=profile.keys.renames.drops_only()))


def _native(native, profile, name: str, params: dict) -> tuple[str, str]:
    status, param, _, reason = resolve_key(native, name, params)
    if status == PAIRED:  # loads with its partner, into the fused parameter, when that exists
        fused = pair_of(profile, param)[1]
        status, param, reason = (LOADED, fused, "") if fused in params else (DROPPED, None, f"no parameter {fused}")
    return status, (f"loads into {param}" if status == LOADED else reason)


def _apply(mapper: WeightsMapper, keys, profile, params: dict, expendable: dict[str, str]) -> Renaming:
    names, reasons, unresolved = {}, {}, []
    native = _native_profile(profile)  # once: building it per key was most of a plan's time on 10^6 keys
    for key in keys:
        new = mapper.map(key)
        status, why = _native(native, profile, new, params)
        if status == CRASHED and (is_training_only(key) or key in expendable):
            names[key] = None
            reasons[key] = expendable.get(key, "training-only tensor") + "; the engine would fail on it, so left out"
            continue
        if status == DROPPED and key in expendable:
            names[key], reasons[key] = None, expendable[key] + "; the engine would skip it, so left out"
            continue
        names[key], reasons[key] = new, why
        if status not in (LOADED, DERIVED, IGNORED, TRAINING_ONLY):
            unresolved.append(key)
    return Renaming(mapper, names, reasons, unresolved)


def choose(layout: str, keys, profile, params: dict, expendable: dict[str, str] | None = None) -> Renaming:
    """The first of `RULES[layout]` under which the engine loads every key natively; failing that,
    the candidate leaving the fewest keys unloaded (so the plan can show what is still wrong).
    Training-only keys are left out where the engine would fail on them, `expendable` ones (key: why the
    engine needs none of it) where it would fail on them or skip them. EAGLE 3.1's norms get the one name
    every release that builds them reads (`NORM_NAMES`)."""
    keys = list(keys)
    best = None
    norms = any(NORM_NAMES.map(k) != k for k in keys)
    for mapper in RULES.get(layout, RULES[UNKNOWN_LAYOUT]):
        mapper = NORM_NAMES + mapper if norms else mapper
        renaming = _apply(mapper, keys, profile, params, expendable or {})
        if not renaming.unresolved:
            return renaming
        if best is None or len(renaming.unresolved) < len(best.unresolved):
            best = renaming
    return best
