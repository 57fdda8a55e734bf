"""Resolving keys: where a release's `load_weights` puts one checkpoint key, following the steps of the
row's `KeyResolution` record in the order the loader takes them (`resolve_key`, its one interpreter).
The replay (`draftdoctor.replay`) plays it over every key; `fix` (`draftdoctor.renames`) asks it which
names a release loads natively.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..layouts import is_training_only
from ..statuses import KeyFate
from .stages import CRASH, WARN

if TYPE_CHECKING:
    from .profile import Profile

PAIRED = "paired"  # resolve_key's status for a key the loader holds until its partner arrives


def renamed(profile: Profile, key: str) -> str:
    """The key after the loader's own renames (`KeyResolution.renames`; a drop leaves the name as it is)."""
    return profile.keys.renames.apply(key)[0]


def resolve_key(profile: Profile, key: str, params: dict) -> tuple[str, str | None, object, str]:
    """Follow the profile's resolution steps for one key -> (status, parameter, shard, reason). A key
    of a cached pair (`KeyResolution.paired_keys`) gets PAIRED with the name it is looked up as; the replay
    settles it when its partner arrives, or at the end."""
    steps = profile.keys
    name, dropped = steps.renames.apply(key)
    for sub, attribute in steps.derived_keys:
        if sub in name:
            return KeyFate.DERIVED, None, None, f"becomes the {attribute} attribute"
    if dropped is not None:
        return KeyFate.IGNORED, None, None, f"{dropped} is skipped by design"
    for sub in steps.dropped_unless_built:
        if sub in name and not any(sub in param for param in params):
            return KeyFate.DROPPED, None, None, f"the config builds no {sub.strip('.')}; the loader drops it silently"
    for sub, param in steps.renamed_keys:
        if sub in name:
            if param in params:
                return KeyFate.LOADED, param, None, f"renamed to {param}"
            return _unmatched(profile, key, param, steps.on_unmatched)
    for weight_name, param_name, shard in steps.stacked:
        if weight_name in name:
            fused = name.replace(weight_name, param_name)
            target = _lookup(profile, fused, params)
            if target is None:
                return _unmatched(profile, key, fused, steps.on_unmatched_stacked, params)
            return KeyFate.LOADED, target, shard, ""
    if any(first in name or second in name for first, second, _ in steps.paired_keys):
        return PAIRED, steps.lookup_names(name)[-1], None, ""
    target = _lookup(profile, name, params)
    if target is None:
        return _unmatched(profile, key, name, steps.on_unmatched, params)
    return KeyFate.LOADED, target, None, ""


def pair_of(profile: Profile, name: str) -> tuple[str, str]:
    """(partner's looked-up name, fused parameter name) of a key of a cached pair (`KeyResolution.paired_keys`)."""
    first, second, fused_sub = next(p for p in profile.keys.paired_keys if p[0] in name or p[1] in name)
    partner = name.replace(first, second) if first in name else name.replace(second, first)
    return partner, (partner if first in partner else name).replace(first, fused_sub)


def _lookup(profile: Profile, name: str, params: dict) -> str | None:
    return next((c for c in profile.keys.lookup_names(name) if c in params), None)


def _failing_prefix(name: str, params) -> str:
    """The part of `name` a module-tree loader (vLLM's AutoWeightsLoader) names when it cannot place
    it: its components up to the first one no parameter path has at that place."""
    parts = name.split(".")
    paths = [p.split(".") for p in params]
    depth = 0
    while depth < len(parts) and any(p[:depth + 1] == parts[:depth + 1] for p in paths):
        depth += 1
    return ".".join(parts[:depth + 1])


def _unmatched(profile: Profile, key: str, tried: str, on_unmatched: tuple[str, str], params=()):
    policy, message = on_unmatched
    steps = profile.keys
    if is_training_only(key) and policy != CRASH:
        return KeyFate.TRAINING_ONLY, None, None, "training-only tensor; no engine parameter exists for it"
    last = steps.lookup_names(tried)[-1]  # the name the engine looked up last
    if key.endswith(steps.unmatched_skipped_suffixes):
        return KeyFate.DROPPED, None, None, f"no parameter {last}; skipped silently (unexpected {key.rsplit('.', 1)[-1]} weights are ignored)"
    inner = last.startswith("model.")
    outer_module, inner_module = steps.module_names
    prefix = _failing_prefix(last.removeprefix("model.") if inner else last,
                             [p.removeprefix("model.") for p in params if p.startswith("model.") == inner])
    said = (f': "{message.format(name=last, local=tried, key=key, prefix=prefix, module=inner_module if inner else outer_module)}"'
            if message else "")
    if policy == CRASH:
        return KeyFate.CRASHED, None, None, f"no parameter {last}; the load fails{said}"
    if policy == WARN:
        return KeyFate.DROPPED, None, None, f"no parameter {last}; skipped with a warning{said}"
    return KeyFate.DROPPED, None, None, f"no parameter {last}; skipped silently"
