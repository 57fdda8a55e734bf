"""Coverage from what an engine release's own loader really did (`check --loader real`).

`draftdoctor.realload` runs the release's config reader, model class and `load_weights` in a child
process (SGLang, vLLM or llama.cpp) and reports every weight write and every key (a `LoadReport`,
draftdoctor.loadreport). `coverage_from` turns a load report into a `CoverageReport`, whichever loader
made it: the replay (draftdoctor.replay) makes one too, so there is one path from what a loader did to
the verdict, the two can be compared field by field (the differential test) and a user reads one format.

When the engine cannot read the config's format (SGLang and speculators' nested format), it builds
nothing, so nothing can be said about the weights. The check then loads the same tensors once more
with the config written the way `draftdoctor fix` would write it, and reports that weight coverage
together with the `config-unreadable` finding carrying the engine's own message: what the replay
reports too. vLLM's own list of the parameters its proposer takes from the target (`from_target`)
decides those statuses.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from . import findings as F
from .checkpoint import Checkpoint, open_checkpoint
from .configrewrite import rewrite_config
from .configs import FLAT, SPECULATORS, DraftDims, config_format
from .coverage import (PARAM_MISMATCH, CRASHED, DERIVED, DROPPED, FROM_TARGET, IGNORED, LOADED, MISMATCH, NOT_REACHED, PARTIAL, TRAINING_ONLY,
                       PAIR_REASON, UNINITIALIZED, WRITTEN, CoverageReport, KeyStatus, ParamStatus, coverage_findings,
                       dominant_dtype_bytes, draft_dims, resized_finding, settle_unwritten)
from .engines import EngineRelease, expect_release, parameters
from .layouts import detect_layout, is_training_only
from .errors import UserError
from .loadreport import LoadError, LoadReport
from .realload.registry import REAL_LOADERS
from .resources import BUDGET_VARIABLE, build_bytes, dtype_bytes, human, memory_budget
from .statuses import KeyFate, ParamFate

STATUS = {"written": WRITTEN, "partial": PARTIAL, "untouched": UNINITIALIZED}
# the registry has no class for the config's architectures: the config names the wrong class
UNKNOWN_CLASS = ("Cannot find model module", "are not supported for now")
SHAPE_ERRORS = ("Attempted to load weight", "has wrong shape", "exceeds dimension size", "param_data.shape",
                "Tried to load weights of size", "loaded_weight.shape", "Sizes of tensors must match")


class RealCheckError(UserError, RuntimeError):
    """The real loader could not run (release not installed, child crashed, timeout)."""


def real_check(checkpoint, engine: EngineRelease, timeout: float = 180.0, target_config: dict | None = None,
               dims: DraftDims | None = None) -> CoverageReport:
    """The coverage report of `engine`'s own loader on a checkpoint (a path or an open `Checkpoint`);
    `target_config` (vLLM): the target's config, which decides e.g. whether a vocab-map parameter exists;
    `dims`: the checkpoint's (`draft_dims`) when the caller has read them already."""
    return real_checks([checkpoint], engine, timeout=timeout, target_config=target_config,
                       dims=None if dims is None else [dims])[0]


def real_checks(checkpoints, engine: EngineRelease, timeout: float | None = None, target_config: dict | None = None,
                dims: list | None = None) -> list[CoverageReport]:
    """`real_check` of several checkpoints in one child process (the engine's import cost paid once);
    `dims`: theirs, in their order, when the caller has read them already."""
    import json

    from .realload import load_reports
    from .realload.childenv import scratch as scratch_for
    from .realload.registry import RealLoaderError, installed_releases

    profile, release = expect_release(engine).profile, engine.release
    if release not in REAL_LOADERS[engine.name].releases:
        have = "; ".join(f"{name} {', '.join(row.releases)} (installed: {', '.join(installed_releases(name)) or 'none'}, "
                         f"{row.install_hint()})" for name, row in REAL_LOADERS.items())
        raise RealCheckError(f"{engine.spec} has no real loader in this kit; real loaders: {have}; "
                             "use `--loader replay`, or `auto` (the default), which replays where no real loader is installed")
    checkpoints = [c if isinstance(c, Checkpoint) else open_checkpoint(c) for c in checkpoints]
    budget, row = memory_budget(), REAL_LOADERS[engine.name]
    # each checkpoint's dims and draft-class row, once: for its size and for its report
    shapes = [(draft_dims(c) if d is None else d, engine.profile_for(c.config))
              for c, d in zip(checkpoints, dims or [None] * len(checkpoints))]
    claimed = {c.folder: claimed_bytes(c, engine, target_config, shape) for c, shape in zip(checkpoints, shapes)}
    over = [folder for folder, size in claimed.items() if size > budget]
    if over and not row.builds_on_meta:
        raise RealCheckError(f"{over[0]}: the {_display(engine)} real check of this draft would take about "
                             f"{human(claimed[over[0]])} (its config's sizes), more than the {human(budget)} this "
                             f"machine can spare (${BUDGET_VARIABLE}); refused before building anything")
    with scratch_for("real") as scratch:  # removed with this check, or by the next one if it is killed
        folders = [c.folder for c in checkpoints]
        # a config format the engine cannot read builds nothing: load the tensors once more with the
        # config `fix` writes
        converted = {i: _with_converted_config(c, profile, Path(scratch) / str(i)) for i, c in enumerate(checkpoints)
                     if c.config is not None and config_format(c.config) not in profile.config.config_formats
                     and config_format(c.config) in (FLAT, SPECULATORS)}
        target_file = None
        if target_config is not None:
            target_file = Path(scratch) / "target-config.json"
            target_file.write_text(json.dumps(target_config))
        try:
            raws = load_reports(folders + list(converted.values()), release, engine_name=engine.name,
                                    target_config=target_file, meta_for=over,
                                    timeout=timeout or 120.0 + 30.0 * (len(folders) + len(converted)))
        except (RealLoaderError, ValueError, FileNotFoundError) as e:
            raise RealCheckError(str(e)) from None
    extra = dict(zip(converted, raws[len(folders):]))
    reports = []
    for i, (checkpoint, raw) in enumerate(zip(checkpoints, raws)):
        said = _error_finding(raw.error, checkpoint, engine) if raw.error else None
        if i in extra and said and said.code == "config-unreadable":  # refused at its config or class lookup
            report = coverage_from(extra[i], checkpoint, engine, shapes[i])
            report.findings.insert(0, F.Finding(said.code, said.severity, said.message + (
                f"; {_display(engine)} built nothing from this config, so the weight coverage shown is with "
                "the config converted the way `draftdoctor fix` writes it")))
        else:
            report = coverage_from(raw, checkpoint, engine, shapes[i])
        if checkpoint.folder in over:
            report.findings.append(F.finding("not-checked", (
                f"{_display(engine)} built this draft on the meta device: its config's sizes ask for about "
                f"{human(claimed[checkpoint.folder])}, more than the {human(budget)} this machine can spare "
                f"(${BUDGET_VARIABLE}); names, shapes and every weight-loader call were checked, the engine's "
                "post-load processing of values was not"), severity=F.INFO))
        reports.append(report)
    return reports


def claimed_bytes(checkpoint: Checkpoint, engine: EngineRelease, target_config: dict | None = None,
                  shape: tuple | None = None) -> int:
    """About how much memory `engine`'s real loader takes to build this draft, from what its config
    claims (not from the size of its files: a 335 kB draft may claim a 200000 x 8192 vocabulary):
    every parameter the engine creates, at the config's dtype; the rotary cache engines build at load
    (max positions x head dim, float32); and what the check itself builds per vocabulary entry. `shape`:
    the checkpoint's (dims, draft-class row) when the caller has them already."""
    dims, profile = shape or (draft_dims(checkpoint), engine.profile_for(checkpoint.config))
    config = checkpoint.config or {}
    total = build_bytes((p.shape for p in parameters(profile, dims)), dtype_bytes(config))
    layer = config.get("transformer_layer_config") if isinstance(config.get("transformer_layer_config"), dict) else config
    positions = layer.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        total += positions * dims.head_dim * 4
    vocabulary = (target_config or {}).get("vocab_size")
    vocabulary = vocabulary if isinstance(vocabulary, int) and vocabulary > 0 else dims.vocab_size
    return total + vocabulary * REAL_LOADERS[engine.name].bytes_per_vocabulary_entry


def _with_converted_config(checkpoint, profile, scratch: Path) -> Path:
    """A folder with the checkpoint's files linked in and the config rewritten for the engine."""
    import json

    folder = scratch / checkpoint.folder.name
    folder.mkdir(parents=True)
    for item in checkpoint.folder.iterdir():
        if item.is_file() and item.name != "config.json":
            os.symlink(item.resolve(), folder / item.name)
    rewritten = rewrite_config(checkpoint.config, profile).config
    (folder / "config.json").write_text(json.dumps(rewritten))
    return folder


def _display(engine) -> str:
    return REAL_LOADERS[engine.name].display


def is_shape_error(error: LoadError) -> bool:
    """A load that failed on a tensor's shape: as the loader says it (`said`), else a shape message, or a
    bare assertion of a weight loader (vLLM's merged-column loader asserts shapes without a message)."""
    if error.said is not None:
        return error.said.code == "shape-mismatch"
    return error.stage == "load" and (any(s in error.message for s in SHAPE_ERRORS) or error.type == "AssertionError")


def _error_finding(error: LoadError, checkpoint, engine) -> F.Finding:
    if error.said is not None:  # worded by the loader itself
        return F.Finding(error.said.code, error.said.severity, error.said.message)
    name = _display(engine)
    message = f"{error.type}: {error.message}"
    where = f" (loading {error.key})" if error.key else ""
    if error.stage == "config" or error.stage == "build" and any(s in error.message for s in UNKNOWN_CLASS):
        return F.finding("config-unreadable", f"{checkpoint.config_path}: {name} says \"{message}\"")
    if is_shape_error(error):
        return F.finding("shape-mismatch", f"{name} raised{where}: {message}")
    return F.finding("loader-crash", f"{name} raised while {'building' if error.stage == 'build' else 'loading'}"
                                     f" the draft{where}: {message}")


def coverage_from(raw: LoadReport | dict, checkpoint, engine: EngineRelease, shape: tuple | None = None) -> CoverageReport:
    """Map a load report (a `LoadReport`, or its wire form, read with `LoadReport.from_wire`) onto a
    CoverageReport, whichever loader made it (its `loader`: the replay's or a real child's): what the
    loader states in its own words is taken as said, the rest is read from its records. `shape`: the
    checkpoint's (dims, draft-class row) when the caller has them already."""
    raw = raw if isinstance(raw, LoadReport) else LoadReport.from_wire(raw)
    dims, profile = shape or (draft_dims(checkpoint), engine.profile_for(checkpoint.config))
    specs = {p.name: p for p in parameters(profile, dims)}
    bytes_per = dominant_dtype_bytes(checkpoint)
    params, keys, findings = [], [], []
    error = raw.error
    written_by: dict[str, tuple[str, str | None]] = {}
    for p in raw.parameters:
        spec = specs.get(p.name)
        ok = [w for w in p.writes if w.ok]
        for w in ok:
            written_by[w.key] = (p.name, w.shard)
        expected = set(p.shards_expected or [])
        status = ParamStatus(
            name=p.name, role=spec.role if spec else "other", shape=tuple(spec.shape if spec else p.shape),
            nbytes=math.prod(spec.shape if spec else p.shape) * bytes_per, status=STATUS[p.status], keys=[w.key for w in ok],
            shards_written=list(p.shards_written or []),
            shards_missing=sorted(expected - set(p.shards_written or [])))
        shape_error = error and is_shape_error(error)
        if shape_error and any(not w.ok for w in p.writes):
            status.status = PARAM_MISMATCH
        if spec:
            settle_unwritten(status, profile, dims, spec, checkpoint.tensors)
        if raw.from_target is not None and not error:  # the engine's own word on what its proposer takes from the target
            status.replaced_by_target = p.name in raw.from_target
            if status.status == FROM_TARGET and not status.replaced_by_target:
                status.status = STATUS[p.status]
            elif status.replaced_by_target and status.status in (UNINITIALIZED, PARTIAL):
                status.status = FROM_TARGET
        if p.said is not None:  # the loader's own account (the replay's)
            status.status, status.shards_missing = ParamFate(p.said.fate), list(p.said.shards_missing)
        params.append(status)
    if not raw.parameters_complete:  # llama.cpp's converter stopped before it wrote a model
        listed = {p.name for p in params}
        for spec in specs.values():
            if spec.name not in listed:
                status = ParamStatus(name=spec.name, role=spec.role, shape=tuple(spec.shape),
                                     nbytes=math.prod(spec.shape) * bytes_per, status=UNINITIALIZED)
                settle_unwritten(status, profile, dims, spec, checkpoint.tensors)
                params.append(status)
    seen = {k.key for k in raw.keys}
    for k in raw.keys:
        t = checkpoint.tensors.get(k.key)
        ks = KeyStatus(k.key, DROPPED, shape=tuple(k.shape), nbytes=t.nbytes if t else 0)
        if k.said is not None:  # the loader's own account (the replay's), its resizes among its findings
            ks.status, ks.param, ks.shard, ks.reason = KeyFate(k.said.fate), k.said.parameter, k.said.shard, k.said.reason
            keys.append(ks)
            continue
        if k.consumed_as == "parameter":
            ks.status, (ks.param, ks.shard) = LOADED, written_by.get(k.key, (k.parameters[0], None))
            if any(part in k.key for pair in profile.keys.paired_keys for part in pair[:2]):
                ks.reason = f"{PAIR_REASON} into {ks.param}"  # the engine caches one, then writes both at once
        elif k.consumed_as == "attribute":
            ks.status, ks.reason = DERIVED, f"becomes the {', '.join(k.attributes)} attribute"
        elif error and error.stage == "load" and error.key == k.key:
            ks.status, ks.reason = (MISMATCH if is_shape_error(error) else CRASHED, error.message)
        elif error and error.stage == "load" and (raw.keys_collected_first or profile.unwritten.loads_all_or_nothing):
            # vLLM's EAGLE-3 load_weights reads every key, then places them in its own order, and
            # llama.cpp places nothing from a failed load: after the error, an unplaced key was not
            # reached, not skipped
            ks.status, ks.reason = NOT_REACHED, "the load failed before this key was placed"
        elif any(sub in k.key for sub in profile.keys.renames.drops):
            ks.status, ks.reason = IGNORED, "skipped by design"
        elif is_training_only(k.key):
            ks.status, ks.reason = TRAINING_ONLY, "training-only tensor; no engine parameter exists for it"
        else:
            ks.reason = "consumed by no weight loader: skipped" + (" with a warning" if _warned(raw, k.key) else " silently")
        keys.append(ks)
        if ks.status == LOADED:
            findings += _resized(ks, specs, profile)
    for name, t in checkpoint.tensors.items():
        if name not in seen:
            keys.append(KeyStatus(name, NOT_REACHED, reason="the load failed before this key", shape=t.shape,
                                  nbytes=t.nbytes))
    if error:
        findings.insert(0, _error_finding(error, checkpoint, engine))
    findings[:0] = [F.Finding(f.code, f.severity, f.message) for f in raw.findings]
    report = CoverageReport(engine=engine, loader=raw.loader, path=str(checkpoint.path),
                            layout=detect_layout(checkpoint.tensors, checkpoint.config),
                            config_format=config_format(checkpoint.config), params=params, keys=keys,
                            findings=findings, loader_detail=overlay_detail(raw), profile=profile)
    report.findings += coverage_findings(report)
    return report


def overlay_detail(raw: LoadReport) -> str:
    """How a release without a CPU build ran (realload.install's overlay), for the report's loader line:
    whose Python on which build, with what stood in; "" for a release's own CPU build."""
    laid = raw.overlay
    if not laid:
        return ""
    name = REAL_LOADERS[raw.engine_name].display
    return (f"{name} {laid['release']}'s own Python ({laid['wheel']}) on {raw.engine_name}-cpu {laid['base']}'s compiled "
            f"kernels (no CPU build of {laid['release']} exists); stood in: {'; '.join(raw.stand_ins or []) or 'nothing'}")


def _resized(key: KeyStatus, specs: dict, profile) -> list[F.Finding]:
    """A key written into a parameter of another shape: SGLang pads or narrows row-parallel weights silently."""
    spec = specs.get(key.param)
    if spec is None or any(part in key.key for pair in profile.keys.paired_keys for part in pair[:2]):
        return []  # one of a concatenated pair fills only its block of rows
    expected = spec.shard_shape(key.shard)
    if tuple(key.shape) == tuple(expected):
        return []
    return [resized_finding(profile, key.key, key.shape, key.param, expected)]


def _warned(raw: LoadReport, key: str) -> bool:
    return any(key in entry.message for entry in raw.logs)
