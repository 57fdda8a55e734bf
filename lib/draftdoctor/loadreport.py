"""The load report: what one engine release's own loader did with one draft checkpoint, as one typed
value (`LoadReport`) with one versioned wire form.

Every real-loader child (SGLang's `realload.child`, vLLM's `realload.vllm_child`, llama.cpp's
`realload.llamacpp_child`) builds a `LoadReport` per checkpoint and prints or sends its wire form
(`to_wire`: plain JSON with `"version": VERSION`); the parent reads it back with `from_wire`, which
checks the version and every field's type and names the first field that is not what this schema
says (`LoadReportError`). The replay (draftdoctor.replay) makes one too, `loader` "replay", stating in
its own words what a real child leaves to be read (`KeySaid`, `ParamSaid`, `Stated`). `realcheck.coverage_from` turns
any of them into a `CoverageReport`: one path from what a loader did to the verdict.

This module imports nothing but the standard library: the children import it under `python -S`
beside a pinned release's packages.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any

VERSION = 2  # the wire form's version; a report of another version is refused, not guessed at

STAGES = ("config", "build", "load")
STATUSES = ("written", "partial", "untouched")
CONSUMED_AS = ("parameter", "attribute", None)
LOADERS = ("real", "replay")
# a parameter's and a key's fate, as draftdoctor.statuses' ParamFate and KeyFate spell them (this module
# imports nothing of the kit; tests/test_loadreport.py holds them equal)
PARAM_FATES = ("written", "partial", "uninitialized", "from-target", "identity", "shape-mismatch")
FATES = ("loaded", "derived", "ignored", "dropped", "training-only", "shape-mismatch", "not-reached", "crash")


class LoadReportError(ValueError):
    """A wire form that is not a load report of this version: the message names the field."""


def _choices(*allowed):
    return {"choices": allowed}


@dataclass
class Stated:
    """A finding as the loader words it itself: its code (draftdoctor.findings), severity and message."""
    code: str
    severity: str
    message: str


@dataclass
class LoadError:
    """What the engine raised: at which stage (config = reading config.json; build = registry lookup
    and model construction; load = the class's load_weights, or llama.cpp's converter and loader), its
    type and own message, the checkpoint key being loaded (load stage) or None, where (innermost frame,
    relative to its import root) and the traceback; `said`, the finding as the loader words it (the
    replay's: naming the key, both shapes and the engine's message; it raises nothing, so its `type` and
    `traceback` are empty), else None and the reader words it."""
    stage: str = field(metadata=_choices(*STAGES))
    type: str
    message: str
    key: str | None
    origin: str | None
    traceback: str
    said: Stated | None = None


@dataclass
class ConfigSeen:
    """The draft's config as the engine resolved it (architectures, model_type, dtype such as "float16")."""
    architectures: list[str] | None
    model_type: str | None
    dtype: str | None


@dataclass
class Write:
    """One weight-loader call: the checkpoint key, the shard of a fused parameter ("q"/"k"/"v", "0"/"1")
    or None, and whether it returned (ok false: the loader raised)."""
    key: str | None
    shard: str | None
    ok: bool


@dataclass
class ParamSaid:
    """A loader's own account of one parameter (the replay's): its fate, one of `PARAM_FATES`, once the
    load is over, and the shards of a fused parameter still missing, in the parameter's own order."""
    fate: str = field(metadata=_choices(*PARAM_FATES))
    shards_missing: list[str]


@dataclass
class ParamRecord:
    """One model parameter: "written" | "partial" | "untouched"; `elements_written`, the elements no
    longer holding the sentinel NaN (None on meta, or where no sentinel applies); every weight-loader
    call, in order; the shards a fused parameter expects and those written (else None);
    `unattributed_write`, data changed without a recorded weight-loader call; `sha256` of its bytes
    after loading (CPU), else None; `said`, the loader's own account of it (`ParamSaid`), else None and
    the reader works it out from these facts."""
    name: str
    shape: list[int]
    dtype: str | None
    numel: int
    status: str = field(metadata=_choices(*STATUSES))
    elements_written: int | None
    writes: list[Write]
    shards_expected: list[str] | None
    shards_written: list[str] | None
    unattributed_write: bool
    sha256: str | None
    said: ParamSaid | None = None


@dataclass
class KeySaid:
    """A loader's own account of one key (the replay's: the fate its rules give it, one of `FATES`; the
    parameter and shard it writes or was to write; why)."""
    fate: str = field(metadata=_choices(*FATES))
    parameter: str | None
    shard: str | None
    reason: str


@dataclass
class KeyRecord:
    """One key the production weights iterator yielded: consumed as a "parameter" (the names written
    from it, successful writes only), an "attribute" (the model attributes it set), or not (None);
    `said`, the loader's own account of it (`KeySaid`), else None and the reader works it out from these
    facts, the error and the engine's profile."""
    key: str
    shape: list[int]
    dtype: str | None
    consumed: bool
    consumed_as: str | None = field(metadata=_choices(*CONSUMED_AS))
    parameters: list[str]
    attributes: list[str]
    said: KeySaid | None = None


@dataclass
class AttributeRecord:
    """A model attribute a key became (SGLang's `d2t` becomes `hot_token_id`)."""
    from_key: str
    type: str
    shape: list[int] | None
    dtype: str | None


@dataclass
class LogRecord:
    """A warning or error the engine logged, and the stage it came in."""
    stage: str | None
    level: str
    logger: str
    message: str


@dataclass
class LoadReport:
    """What one loader did with one draft checkpoint: the one schema of every real loader's report
    (SGLang, vLLM, llama.cpp), and the replay's.

    Header: `loader` "real" (the engine release's own code ran) or "replay" (its profile's rules were played
    over the checkpoint's keys: draftdoctor.replay); `engine_name` ("sglang" | "vllm" | "llamacpp") and
    `release`; `versions`, the packages as installed in the child; `checkpoint`, the folder's absolute path;
    `device`, "cpu" (real tensors) or "meta" (shapes only: chosen above 1 GiB, or for a draft whose config
    claims more than the machine can spare), or "server" (a load the guard recorded inside a serving
    engine's own process, on the device it serves from: no versions, `checkpoint` the name the engine was
    given), or "none" (the replay: nothing built, no versions).

    What happened: `config` (None when the engine could not read it, and from the replay); `model_class`
    once the registry built one, else None; `error`, None or what the engine raised (`LoadError`);
    `postprocess`, "done" after the post-load processing, "skipped on meta: ..." (it needs real tensors),
    None when loading never finished; `parameters`, one per model parameter (empty when nothing was built);
    `keys`, one per key the weights iterator yielded, in order; `all_keys_seen`, the iterator was exhausted
    (false after an error mid-load); `attributes` by name; `logs`, the warnings and errors logged while
    reading, building and loading; `timings`, seconds per stage that ran ("setup", importing the engine and
    its process group, is per child process and shared by a batch).

    What one engine says and another does not: `from_target`, the parameters the engine's proposer
    takes from the target (vLLM, llama.cpp; None: the engine does not say, and the profile decides);
    `parameters_complete`, False when llama.cpp's converter stopped before writing a model (only the
    tensors it made are listed); `keys_collected_first`, the class's load_weights reads every key
    before placing any (vLLM's EAGLE-3); `gguf`, the converted file's EAGLE-3 metadata (llama.cpp);
    `kernels_stood_in`, `torch_shims`, `overlay` and `stand_ins`, what a vLLM release ran with around
    its own code (None for the other engines).

    What a loader states in its own words, which a reader otherwise works out: `findings`, beside the
    error, in the order it met them (the replay's: a config it read past, converted as `fix` writes it,
    and a tensor the engine pads or cuts to fit); a key's, a parameter's and the error's `said` (see there). A real
    child states none of these."""
    engine_name: str
    release: str
    versions: dict[str, str]
    checkpoint: str
    device: str = field(metadata=_choices("cpu", "meta", "server", "none"))
    loader: str = field(default="real", metadata=_choices(*LOADERS))
    config: ConfigSeen | None = None
    model_class: str | None = None
    error: LoadError | None = None
    postprocess: str | None = None
    parameters: list[ParamRecord] = field(default_factory=list)
    keys: list[KeyRecord] = field(default_factory=list)
    all_keys_seen: bool = False
    attributes: dict[str, AttributeRecord] = field(default_factory=dict)
    logs: list[LogRecord] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    from_target: list[str] | None = None
    parameters_complete: bool = True
    keys_collected_first: bool = False
    gguf: dict[str, Any] | None = None
    kernels_stood_in: dict[str, str] | None = None
    torch_shims: list[str] | None = None
    overlay: dict[str, Any] | None = None
    stand_ins: list[str] | None = None
    findings: list[Stated] = field(default_factory=list)

    def to_wire(self) -> dict:
        """Plain JSON: every field, and `"version": VERSION` first."""
        return {"version": VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_wire(cls, wire) -> LoadReport:
        """The report a wire form carries; LoadReportError naming the field when the version is not
        VERSION, a field is missing or unknown, or a value is not of its field's type."""
        if not isinstance(wire, dict):
            raise LoadReportError(f"a load report is a JSON object, not {_kind(wire)}")
        if wire.get("version") != VERSION:
            said = repr(wire["version"]) if "version" in wire else "none"
            raise LoadReportError(f"load report field 'version': {said}, this kit reads version {VERSION}")
        return _record(cls, {k: v for k, v in wire.items() if k != "version"}, "", partial=False)

    @classmethod
    def of(cls, **fields) -> LoadReport:
        """A report from plain values (as a child's recorder makes them): the fields not given take
        their defaults (in its records too), and each value is checked as `from_wire` checks it."""
        return _record(cls, fields, "", partial=True)


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


@functools.cache
def _hints(cls) -> dict:
    """A record class's field types, evaluated once (a report has dozens of records)."""
    return typing.get_type_hints(cls)


def _record(cls, values: dict, where: str, partial: bool):
    """`cls` (a dataclass of this module) from a dict of plain values, every field checked."""
    hints = _hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in values if k not in known]
    if unknown:
        raise LoadReportError(f"load report field '{where}{unknown[0]}': not a field of {cls.__name__}")
    args = {}
    for name, spec in known.items():
        path = f"{where}{name}"
        if name not in values:
            required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
            if required or not partial:
                raise LoadReportError(f"load report field '{path}': missing")
            continue
        args[name] = _value(hints[name], values[name], path, partial)
        allowed = spec.metadata.get("choices")
        if allowed is not None and args[name] not in allowed:
            raise LoadReportError(f"load report field '{path}': {args[name]!r}, not one of "
                                  f"{', '.join(map(repr, allowed))}")
    return cls(**args)


def _value(hint, value, path: str, partial: bool = False):
    """`value` checked against the type `hint` (records built, containers copied)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, value, path, partial)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise LoadReportError(f"load report field '{path}': expected an object ({hint.__name__}), got {_kind(value)}")
        return _record(hint, value, f"{path}.", partial)
    if origin is list:
        if not isinstance(value, list):
            raise LoadReportError(f"load report field '{path}': expected a list, got {_kind(value)}")
        return [_value(args[0], item, f"{path}[{i}]", partial) for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise LoadReportError(f"load report field '{path}': expected an object, got {_kind(value)}")
        for k in value:
            if not isinstance(k, str):
                raise LoadReportError(f"load report field '{path}': a key {k!r} that is not a string")
        return {k: _value(args[1], v, f"{path}.{k}", partial) for k, v in value.items()}
    wanted = {str: (str,), bool: (bool,), int: (int,), float: (float, int)}[hint]
    if not isinstance(value, wanted) or (hint is not bool and isinstance(value, bool)):
        raise LoadReportError(f"load report field '{path}': expected {hint.__name__}, got {_kind(value)} {value!r:.60}")
    return float(value) if hint is float else value
