"""Engine profiles: every fact that differs by engine and release, as data, and the one lookup.

`profile.py` defines what a row holds (`Profile`: building and loading the draft, one record per
loading stage, `stages.py`; `ServingFacts`: what a served release spells and reports), `build.py` turns a
row and a draft's dimensions into the engine's parameter list; `sglang.py`, `vllm.py` and `llamacpp.py`
hold the rows. `resolve_engine` turns a spec such as "sglang==0.5.10" into an `EngineRelease` value once,
at the edges (the CLI, `from_parameters`, the widgets, the public entry points a notebook calls with a
spec); every module below them takes that value and refuses a string (`expect_release`); `serving_facts`
finds a release's serving row. Adding a release is one new row (and a serving row where the kit serves
it) and a test.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import llamacpp, sglang, vllm
from ..configs import FLAT, SPECULATORS, config_format, layer_config
from .build import ParamSpec, fc_aux_count, from_target, identity_by_default, parameters
from .profile import CRASH, SKIP, STACKED, WARN, EngineSpecError, Profile, ServingFacts, parse_version

__all__ = ["CRASH", "SKIP", "STACKED", "WARN", "Engine", "EngineRelease", "EngineSpecError", "ParamSpec", "Profile",
           "ServingFacts", "all_profiles", "expect_release", "fc_aux_count", "from_parameters", "from_target",
           "identity_by_default", "parameters", "parse_version", "releases_where", "resolve_engine", "serving_facts"]


@dataclass(frozen=True)
class EngineRelease:
    """One engine release as every module receives it: made once by `resolve_engine` (or `of`), then
    passed on, carrying its rows. Its serving facts are looked up by release where a server is launched
    or read (`serving_facts`): an installed SGLang newer than any profile still has a release, but no
    EngineRelease."""

    name: str  # the engine's name: "sglang" | "vllm" | "llamacpp" (`engine_name` wherever only it is meant)
    release: str
    profile: Profile  # how it builds and loads its Llama EAGLE-3 draft class, and the release's own facts

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.release}"

    def profile_for(self, config: dict | None) -> Profile:
        """The row of the draft class this release builds for `config` (MLA, Qwen3, ...), chosen as the
        engine chooses: a flat config by its `architectures` as the engine rewrites them, a speculators
        config by its layer model_type (`ConfigReading.speculators_classes`); else the Llama class's row."""
        fmt = config_format(config)
        if fmt == FLAT:
            names = set(self.profile.config.registry_names(config.get("architectures") or []))
        elif fmt == SPECULATORS:
            model_type = layer_config(config).get("model_type") or "llama"
            names = {dict(self.profile.config.speculators_classes).get(model_type)}
        else:
            return self.profile
        return next((row for row in self._rows() if names & set(row.config.architectures)), self.profile)

    def class_row(self, draft_class: str) -> Profile | None:
        """This release's row for a draft class (llama, qwen3, mla), None when it registers no such class."""
        return next((row for row in self._rows() if row.build.draft_class == draft_class), None)

    def _rows(self) -> list[Profile]:
        return [row for row in all_profiles() if row.engine_name == self.name and row.contains(self.release)]

    def __str__(self) -> str:
        return self.spec

    @classmethod
    def newest(cls, engine_name: str) -> "EngineRelease":
        """The newest release of `engine_name` the rows model (what the spec "vllm" alone names)."""
        return resolve_engine(engine_name)

    @classmethod
    def of(cls, engine_name: str, release: str) -> "EngineRelease":
        """The release `release` of `engine_name` as its rows model it (a name and release taken from the
        rows or the installed releases, not a user's words: those go through `resolve_engine`)."""
        return resolve_engine(f"{engine_name}=={release}")


Engine = EngineRelease
"""Deprecated: the old name of `EngineRelease`, kept for one release; use `EngineRelease`."""


def expect_release(value, parameter: str = "engine") -> EngineRelease:
    """`value` when it is an EngineRelease; a TypeError naming `parameter` when it is anything else (a spec
    string is resolved at the edges, never again below them)."""
    if not isinstance(value, EngineRelease):
        raise TypeError(f"{parameter} must be an EngineRelease (engines.resolve_engine makes one from a spec such "
                        f"as 'sglang==0.5.10' where the user's words enter), not {type(value).__name__} {value!r}")
    return value


def all_profiles() -> list[Profile]:
    return [*sglang.PROFILES, *vllm.PROFILES, *llamacpp.PROFILES]


def releases_where(holds, draft_class: str = "llama") -> list[str]:
    """The release ranges whose rows of `draft_class` (llama, qwen3, mla) `holds(row)`, one per run of
    neighbouring rows of one engine, e.g. ["sglang 0.5.12–0.5.23", "vllm 0.9.1–0.32.0"]: what a message
    names where it says which releases do something, so that it can never disagree with the rows."""
    from itertools import groupby

    rows = [p for p in all_profiles() if p.build.draft_class == draft_class]
    out = []
    for engine in dict.fromkeys(p.engine_name for p in rows):
        ranges = sorted((p for p in rows if p.engine_name == engine), key=lambda p: parse_version(p.first))
        for held, run in groupby(ranges, key=lambda p: bool(holds(p))):
            if held:
                run = list(run)  # one class's rows of one engine do not overlap: the run ends at its last row
                first, last = run[0].first, run[-1].last
                out.append(f"{engine}=={first}" if first == last else f"{engine} {first}–{last}")
    return out


def all_serving() -> list[ServingFacts]:
    return list(sglang.SERVING)


def _row_for(rows, version: str):
    """The row whose release range holds `version` (the one range lookup), or None."""
    return next((row for row in rows if row.contains(version)), None)


def serving_facts(release: str, engine_name: str = "sglang") -> ServingFacts | None:
    """The serving row of `engine_name` `release`, None for a release no row covers."""
    return _row_for([row for row in all_serving() if row.engine_name == engine_name], release)


def from_parameters(engine_name: str, release: str | None, old_name: str | None = None) -> EngineRelease:
    """The EngineRelease a notebook's `engine_name` and `release` parameters name (no release: the newest
    known). `old_name`: the notebook's `engine` parameter, the old name of `engine_name` read for one
    release; set, it is the engine's name."""
    name = engine_name if old_name is None else old_name
    return resolve_engine(f"{name}=={release}" if release else name)


def resolve_engine(spec: "str | EngineRelease") -> EngineRelease:
    """'sglang==0.5.10' | 'sglang' (newest known) | 'vllm' -> EngineRelease, where the user's words enter;
    an EngineRelease is returned as it is."""
    if isinstance(spec, EngineRelease):
        return spec
    engine, _, version = spec.strip().partition("==")
    engine = engine.strip().lower()
    profiles = [p for p in all_profiles() if p.engine_name == engine and p.build.draft_class == "llama"]
    known = "; ".join(p.spec for p in all_profiles() if p.build.draft_class == "llama")
    if not profiles:
        raise EngineSpecError(f"unknown engine {engine!r}: known releases are {known}")
    if not version:
        newest = max(profiles, key=lambda p: parse_version(p.last))
        return EngineRelease(engine, newest.last, newest)
    version = version.strip()
    parse_version(version)
    profile = _row_for(profiles, version)
    if profile is not None:
        return EngineRelease(engine, version, profile)
    newest = max(profiles, key=lambda p: parse_version(p.last))
    if parse_version(version) > parse_version(newest.last):
        raise EngineSpecError(
            f"{engine}=={version} is newer than every release the kit knows (newest: {newest.last}); the nearest row, "
            f"{newest.spec}, would assume {newest.assumptions()}. `--engine {engine}=={newest.last}` checks as that "
            f"row says; if {version} loads drafts that way, add it to the row, else add a row of its own: "
            f"docs/adding-a-release.md says how")
    raise EngineSpecError(f"{engine}=={version} is not a known release: known releases are {known}")
