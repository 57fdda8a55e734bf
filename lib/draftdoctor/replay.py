"""The replay: an engine profile's `load_weights` played over a checkpoint's keys, which makes a
`CoverageReport` (draftdoctor.coverage) without running the engine.

For every checkpoint key: the parameter (and shard of a fused parameter) it would write, or why it
would not (derived into an attribute, ignored by design, dropped, crash). For every parameter the
engine creates: written, partly written, never written (left at its initial values), taken from the
target at serve time, or shape mismatch. Keys are replayed in the order SGLang's safetensors
iterator yields them (files in order, names sorted), and the replay stops where the engine would
raise, as the real load would. The real loader (draftdoctor.realcheck) makes the same report from
the engine's own run; `diagnose` chooses between them.
"""

from __future__ import annotations

from . import findings as F
from .checkpoint import Checkpoint
from .configs import FLAT, SPECULATORS, DraftDims, config_format
from .configrules import config_problem, unmodelled_class
from .engines import EngineRelease, ParamSpec, Profile, expect_release, parameters
from .engines.keys import PAIRED, pair_of, renamed, resolve_key
from .layouts import detect_layout
from .coverage import (PAIR_REASON, PARAM_MISMATCH, CRASHED, DROPPED, LOADED, MISMATCH, NOT_REACHED, PARTIAL,
                       UNINITIALIZED, WRITTEN, CoverageReport, KeyStatus, ParamStatus, coverage_findings,
                       dominant_dtype_bytes, draft_dims, resized_finding, settle_unwritten)


__all__ = ["PAIRED", "config_problem", "pair_of", "renamed", "replay", "resolve_key", "unmodelled_class"]


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
    """The coverage report of loading `checkpoint` with `engine`'s profile; `dims`: the checkpoint's
    (`draft_dims`) when the caller has read them already."""
    expect_release(engine)
    profile, release = engine.profile_for(checkpoint.config), engine.release
    dims = draft_dims(checkpoint) if dims is None else dims
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
    # the config `fix` writes (its dims); any other refusal builds nothing
    crashed = blocking is not None and not (blocking.code == "config-unreadable" and fmt in (FLAT, SPECULATORS)
                                            and fmt not in profile.config_formats)
    if crashed:
        params = {}  # the engine fails while building the draft (or builds a class not modelled here)
    held: dict[str, KeyStatus] = {}  # keys of a cached pair waiting for their partner, by looked-up name
    for key in _iteration_order(checkpoint, profile.key_order):
        t = checkpoint.tensors[key]
        if crashed:
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
                crashed = True
            else:
                _mark_written(params[target], key, shard)
        elif status == CRASHED:
            findings.append(F.finding("loader-crash", f"{key}: {reason}"))
            crashed = True
        elif status == PAIRED:
            crashed = _settle_pair(profile, ks, target, held, specs, params, findings)
        keys.append(ks)
    report = CoverageReport(
        engine=engine, loader="replay", path=str(checkpoint.path),
        layout=detect_layout(checkpoint.tensors, checkpoint.config), config_format=config_format(checkpoint.config),
        params=list(params.values()), keys=keys, findings=findings, profile=profile,
    )
    for p in report.params:
        settle_unwritten(p, profile, dims, specs[p.name], checkpoint.tensors)
    missing = [p for p in report.params if p.status == UNINITIALIZED]
    if profile.unwritten_fails and missing and not crashed:  # llama.cpp's load refuses a missing tensor
        report.findings.append(F.finding("loader-crash", profile.unwritten_fails.format(name=missing[0].name)))
        crashed = True
    if crashed and profile.loads_all_or_nothing:
        _nothing_loaded(report)
    report.findings += coverage_findings(report)
    return report


def _nothing_loaded(report: CoverageReport) -> None:
    """A failed all-or-nothing load (`Profile.loads_all_or_nothing`): no parameter was written."""
    for p in report.params:
        if p.status in (WRITTEN, PARTIAL):
            p.status, p.keys, p.shards_written = UNINITIALIZED, [], []
    for k in report.keys:
        if k.status == LOADED:
            k.status, k.param, k.shard, k.reason = NOT_REACHED, None, None, "the load failed, and it loads all or nothing"


def _settle_pair(profile: Profile, ks: KeyStatus, name: str, held: dict, specs: dict, params: dict, findings: list) -> bool:
    """One key of a cached pair (`Profile.paired_keys`): held until its partner arrives, then both are
    concatenated (first, second) into the fused parameter; returns whether the load fails here."""
    first = next(p for p in profile.paired_keys if p[0] in name or p[1] in name)[0]
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
        for suffix, dim, side in profile.resized_silently)


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
