"""The replay: an engine profile's `load_weights` played over a checkpoint's keys, which makes a load
report (`replay_report`: a `LoadReport`, `loader` "replay", draftdoctor.loadreport) without running the
engine; `replay` reads it as every loader's report is read (`realcheck.coverage_from`) into a
`CoverageReport` (draftdoctor.coverage).

For every checkpoint key: the parameter (and shard of a fused parameter) it would write, or why it
would not (derived into an attribute, ignored by design, dropped, crash). For every parameter the
engine creates: written, partly written, never written (left at its initial values), taken from the
target at serve time, or shape mismatch. Keys are replayed in the order SGLang's safetensors
iterator yields them (files in order, names sorted), and the replay stops where the engine would
raise, as the real load would. What the replay knows that a real child leaves to be read, it states
in the report's own fields: each key's fate and why (`KeySaid`), each parameter's (`ParamSaid`), its
findings in its own words (`Stated`). The real loader (draftdoctor.realcheck) makes the same report from
the engine's own run; `diagnose` chooses between them.
"""

from __future__ import annotations

from . import findings as F
from .checkpoint import Checkpoint
from .configs import FLAT, SPECULATORS, DraftDims, config_format
from .configrules import config_problem, unmodelled_class
from .engines import EngineRelease, ParamSpec, Profile, expect_release, parameters
from .engines.keys import PAIRED, pair_of, renamed, resolve_key
from .coverage import (PAIR_REASON, PARAM_MISMATCH, CRASHED, DERIVED, DROPPED, LOADED, MISMATCH, NOT_REACHED, PARTIAL,
                       UNINITIALIZED, WRITTEN, CoverageReport, KeyStatus, ParamStatus, dominant_dtype_bytes,
                       draft_dims, resized_finding, settle_unwritten)
from .loadreport import KeySaid, KeyRecord, LoadError, LoadReport, ParamRecord, ParamSaid, Stated, Write
from .realcheck import coverage_from


__all__ = ["PAIRED", "config_problem", "pair_of", "renamed", "replay", "replay_report", "resolve_key", "unmodelled_class"]


def _nbytes(shape, dtype_bytes: int) -> int:
    n = dtype_bytes
    for d in shape:
        n *= d
    return n


def _iteration_order(checkpoint: Checkpoint, key_order: str = "sorted"):
    """Keys in the order SGLang's safetensors iterator yields them: file by file, names sorted (or, for
    `key_order` "offset", in the order of their data in the file)."""
    for shard in checkpoint.shards:
        if key_order == "offset":
            yield from (t.name for t in sorted(shard.tensors, key=lambda t: t.begin))
        else:
            yield from sorted(t.name for t in shard.tensors)


def replay(checkpoint: Checkpoint, engine: EngineRelease, dims: DraftDims | None = None) -> CoverageReport:
    """The coverage report of loading `checkpoint` with `engine`'s profile: its load report read as a
    real loader's is; `dims`: the checkpoint's (`draft_dims`) when the caller has read them already."""
    expect_release(engine)
    shape = (draft_dims(checkpoint) if dims is None else dims, engine.profile_for(checkpoint.config))
    return coverage_from(replay_report(checkpoint, engine, shape), checkpoint, engine, shape)


def replay_report(checkpoint: Checkpoint, engine: EngineRelease, shape: tuple | None = None) -> LoadReport:
    """The load report of `engine`'s profile played over `checkpoint`'s keys (`loader` "replay");
    `shape`: the checkpoint's (dims, draft-class row) when the caller has them already."""
    expect_release(engine)
    dims, profile = shape or (draft_dims(checkpoint), engine.profile_for(checkpoint.config))
    release = engine.release
    dtype_bytes = dominant_dtype_bytes(checkpoint)
    specs: dict[str, ParamSpec] = {p.name: p for p in parameters(profile, dims)}
    params = {
        name: ParamStatus(name, p.role, p.shape, _nbytes(p.shape, dtype_bytes),
                          shards_missing=[str(s) for s in p.shards])
        for name, p in specs.items()
    }
    keys: list[KeyStatus] = []
    findings: list[F.Finding] = []
    blocking = config_problem(profile, release, checkpoint, dims)
    if blocking is not None:
        findings.append(blocking)
    fmt = config_format(checkpoint.config)
    # a config the engine cannot parse at all still has weights worth checking: they are replayed under
    # the config `fix` writes (its dims); any other refusal builds nothing. `stop`: where the load stops,
    # (stage, key), as a real loader's error says it (draftdoctor.loadreport.LoadError)
    stop = None
    if blocking is not None and not (blocking.code == "config-unreadable" and fmt in (FLAT, SPECULATORS)
                                     and fmt not in profile.config.config_formats):
        stop = ("config" if blocking.code == "config-unreadable" else "build", None)
    if stop:
        params = {}  # the engine fails while building the draft (or builds a class not modelled here)
    held: dict[str, KeyStatus] = {}  # keys of a cached pair waiting for their partner, by looked-up name
    for key in _iteration_order(checkpoint, profile.keys.key_order):
        t = checkpoint.tensors[key]
        if stop:
            keys.append(KeyStatus(key, NOT_REACHED, reason="the load failed before this key", shape=t.shape, nbytes=t.nbytes))
            continue
        status, target, shard, reason = resolve_key(profile, key, specs)
        ks = KeyStatus(key, status, target, None if shard is None else str(shard), reason, t.shape, t.nbytes)
        if status == LOADED:
            spec = specs[target]
            expected = spec.shard_shape(shard)
            if tuple(t.shape) != tuple(expected) and _resized_silently(profile, target, t.shape, expected):
                _mark_written(params[target], key, shard)
                findings.append(resized_finding(profile, key, t.shape, target, expected))
            elif tuple(t.shape) != tuple(expected):
                ks.status, ks.reason = MISMATCH, f"shape {list(t.shape)} does not fit {target} {list(expected)}"
                params[target].status = PARAM_MISMATCH
                findings.append(F.finding(
                    "shape-mismatch",
                    f"{key} {list(t.shape)} cannot load into {target}"
                    + (f" shard {shard}" if shard is not None else "") + f" {list(expected)}: "
                    f"\"Attempted to load weight ({list(t.shape)}) into parameter ({list(expected)})\"",
                ))
                stop = ("load", key)
            else:
                _mark_written(params[target], key, shard)
        elif status == CRASHED:
            findings.append(F.finding("loader-crash", f"{key}: {reason}"))
            stop = ("load", key)
        elif status == PAIRED and _settle_pair(profile, ks, target, held, specs, params, findings):
            stop = ("load", key)
        keys.append(ks)
    for p in params.values():
        settle_unwritten(p, profile, dims, specs[p.name], checkpoint.tensors)
    missing = [p for p in params.values() if p.status == UNINITIALIZED]
    if profile.unwritten.unwritten_fails and missing and not stop:  # llama.cpp's load refuses a missing tensor
        findings.append(F.finding("loader-crash", profile.unwritten.unwritten_fails.format(name=missing[0].name)))
        stop = ("load", None)
    if stop and profile.unwritten.loads_all_or_nothing:
        _nothing_loaded(params.values(), keys)
    return _load_report(engine, checkpoint, list(params.values()), keys, findings, stop, specs)


def _load_report(engine: EngineRelease, checkpoint: Checkpoint, params: list[ParamStatus], keys: list[KeyStatus],
                 findings: list[F.Finding], stop: tuple | None, specs: dict) -> LoadReport:
    """What the replay found, as a load report: the finding that stopped the load at `stop` (always the
    last one found) as its error, the others as its stated findings; each key's and parameter's fate as
    said. A load refused after its last key (`Unwritten.unwritten_fails`) saw every key."""
    error = None
    if stop:
        said = findings.pop()
        error = LoadError(stage=stop[0], type="", message=said.message, key=stop[1], origin=None, traceback="",
                          said=Stated(said.code, said.severity, said.message))
    shard_of = {k.key: k.shard for k in keys}
    failed = {k.param: Write(k.key, k.shard, False) for k in keys if k.status == MISMATCH and k.param}
    records = [ParamRecord(
        name=p.name, shape=list(p.shape), dtype=None, numel=_nbytes(p.shape, 1),
        status={WRITTEN: "written", PARTIAL: "partial"}.get(p.status, "untouched"), elements_written=None,
        writes=[Write(k, shard_of.get(k), True) for k in p.keys] + [w for name, w in failed.items() if name == p.name],
        shards_expected=[str(s) for s in specs[p.name].shards] or None,
        shards_written=list(p.shards_written) if specs[p.name].shards else None,
        unattributed_write=False, sha256=None, said=ParamSaid(str(p.status), list(p.shards_missing)))
        for p in params]
    return LoadReport(
        engine_name=engine.name, release=engine.release, versions={}, checkpoint=str(checkpoint.path), device="none",
        loader="replay", error=error, parameters=records,
        keys=[KeyRecord(key=k.key, shape=list(k.shape), dtype=checkpoint.tensors[k.key].dtype,
                        consumed=k.status in (LOADED, DERIVED),
                        consumed_as="parameter" if k.status == LOADED else "attribute" if k.status == DERIVED else None,
                        parameters=[k.param] if k.status == LOADED else [], attributes=[],
                        said=KeySaid(str(k.status), k.param, k.shard, k.reason)) for k in keys],
        all_keys_seen=stop in (None, ("load", None)), findings=[Stated(f.code, f.severity, f.message) for f in findings])


def _nothing_loaded(params, keys: list[KeyStatus]) -> None:
    """A failed all-or-nothing load (`Unwritten.loads_all_or_nothing`): no parameter was written."""
    for p in params:
        if p.status in (WRITTEN, PARTIAL):
            p.status, p.keys, p.shards_written = UNINITIALIZED, [], []
    for k in keys:
        if k.status == LOADED:
            k.status, k.param, k.shard, k.reason = NOT_REACHED, None, None, "the load failed, and it loads all or nothing"


def _settle_pair(profile: Profile, ks: KeyStatus, name: str, held: dict, specs: dict, params: dict, findings: list) -> bool:
    """One key of a cached pair (`KeyResolution.paired_keys`): held until its partner arrives, then both are
    concatenated (first, second) into the fused parameter; returns whether the load fails here."""
    first = next(p for p in profile.keys.paired_keys if p[0] in name or p[1] in name)[0]
    partner, fused = pair_of(profile, name)
    ks.status, ks.param = DROPPED, None
    ks.reason = (f"held until {partner} arrives, which it never does: {profile.engine} never loads it, and says nothing")
    if partner not in held:
        held[name] = ks
        return False
    other = held.pop(partner)
    pair = (other, ks) if first in partner else (ks, other)
    if fused not in specs:
        for k in pair:
            k.reason = f"concatenated with its partner into {fused}, which is no parameter: dropped silently"
        return False
    shapes = [tuple(k.shape) for k in pair]
    want = specs[fused].shape
    if shapes[0][1:] != shapes[1][1:]:  # torch.cat fails before anything is written
        ks.status, ks.reason = MISMATCH, f"cannot be concatenated with {other.key} {list(other.shape)}"
        findings.append(F.finding("shape-mismatch", (
            f"{pair[0].key} {list(shapes[0])} and {pair[1].key} {list(shapes[1])} cannot be concatenated into {fused}: "
            "\"Sizes of tensors must match except in dimension 0\"")))
        return True
    if shapes[0][0] + shapes[1][0] != want[0] or shapes[0][1:] != want[1:]:
        got = [shapes[0][0] + shapes[1][0], *shapes[0][1:]]
        ks.status, ks.param, ks.reason = MISMATCH, fused, f"with {other.key}, shape {got} does not fit {fused} {list(want)}"
        params[fused].status = PARAM_MISMATCH
        findings.append(F.finding("shape-mismatch", (
            f"{pair[0].key} {list(shapes[0])} and {pair[1].key} {list(shapes[1])}, concatenated, cannot load into "
            f"{fused} {list(want)}")))
        return True
    for k in pair:
        k.status, k.param, k.reason = LOADED, fused, f"{PAIR_REASON} into {fused}"
        _mark_written(params[fused], k.key, None)
    return False


def _resized_silently(profile: Profile, param: str, got, expected) -> bool:
    """Whether the engine pads or cuts this weight to fit instead of failing (only one dim differs, on
    the side the engine resizes)."""
    differing = [d for d, (a, b) in enumerate(zip(got, expected)) if a != b]
    return len(got) == len(expected) and any(
        param.endswith(suffix) and differing == [dim] and (side == "either" or got[dim] > expected[dim])
        for suffix, dim, side in profile.keys.resized_silently)


def _mark_written(param: ParamStatus, key: str, shard) -> None:
    param.keys.append(key)
    if shard is None:
        param.status, param.shards_missing = WRITTEN, []
        return
    shard = str(shard)
    if shard not in param.shards_written:
        param.shards_written.append(shard)
    if shard in param.shards_missing:
        param.shards_missing.remove(shard)
    param.status = PARTIAL if param.shards_missing else WRITTEN
