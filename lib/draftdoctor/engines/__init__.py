"""Engine profiles: every fact that differs by engine and release, as data, and the one lookup.

`profile.py` defines what a row holds (`Profile`) and turns a row and a draft's dimensions into the
engine's parameter list; `sglang.py` and `vllm.py` hold the rows. Adding a release is one new row
and a test.
"""

from __future__ import annotations

from . import sglang, vllm
from .profile import (CRASH, SKIP, STACKED, WARN, EngineSpecError, ParamSpec, Profile, from_target,
                      identity_by_default, parameters, parse_version)

__all__ = ["CRASH", "SKIP", "STACKED", "WARN", "EngineSpecError", "ParamSpec", "Profile", "all_profiles",
           "from_target", "identity_by_default", "parameters", "parse_version", "resolve_engine"]


def all_profiles() -> list[Profile]:
    return [*sglang.PROFILES, *vllm.PROFILES]


def resolve_engine(spec: str) -> tuple[Profile, str]:
    """'sglang==0.5.10' | 'sglang' (newest known) | 'vllm' -> (profile, release)."""
    engine, _, version = spec.strip().partition("==")
    engine = engine.strip().lower()
    profiles = [p for p in all_profiles() if p.engine == engine]
    known = "; ".join(p.spec for p in all_profiles())
    if not profiles:
        raise EngineSpecError(f"unknown engine {engine!r}: known releases are {known}")
    if not version:
        newest = max(profiles, key=lambda p: parse_version(p.last))
        return newest, newest.last
    parse_version(version)
    for p in profiles:
        if p.contains(version):
            return p, version.strip()
    raise EngineSpecError(f"{engine}=={version.strip()} is not a known release: known releases are {known}")
