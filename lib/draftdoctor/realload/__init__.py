"""Run an engine release's own draft loader on a checkpoint, in a subprocess, and return what happened.

The parent side imports neither torch nor an engine: each release lives in its own folder
`build/<engine>/<release>` (installed by `make sglang-loaders` / `make vllm-loaders`), and a child
process (`python -m draftdoctor.realload.child` for SGLang, `...vllm_child` for vLLM, `...llamacpp_child`)
runs with that folder on `PYTHONPATH`, so import stubs, the gloo process group and the engine's global
state never leak into the caller (e.g. a notebook kernel). The parent side's modules, by job:

    registry.py   the releases: one `RealLoaders` row per engine, its releases, their folders, installed
                  or not (`release_env`), and the errors (RealLoaderError and its kinds)
    childenv.py   what a child sees and runs in (`CHILD_ENV`, `_child`, `kit_path`), the private state
                  folder and scratch folders, and the cold run (`_run_child`: a fresh child per batch)
    pool.py       the warm workers: one per release, reused across calls and processes
    this module   the entry points: `load_reports`, `run_real_loaders`, `run_real_loader`, `parse_launch`,
                  `self_check`

Every child makes one `LoadReport` per checkpoint (draftdoctor.loadreport: the one schema, documented
there) and sends its wire form; `run_real_loaders` reads each back with `LoadReport.from_wire` before
anything else sees it, so a report of another version or shape (a warm worker of an older kit) is an
error naming the field, never a misread.
"""

import json
import os
from pathlib import Path

from ..loadreport import VERSION as SCHEMA_VERSION, LoadReport, LoadReportError
from .childenv import CHILD_ENV, WorkerPlaceUnsafe, _run_child, kit_path, scratch, scratch_folder
from .pool import WORKER_SWITCH, NoRoomForWorker, _worker_call, stop_worker, stop_workers
from .registry import (OVERLAY_RECORD, READY_MARKER, REAL_LOADERS, RealLoaderCrashed, RealLoaderError, RealLoaders,
                       RealLoaderTimeout, ReleaseNotInstalled, installed_releases, release_env, releases, releases_dir)

# the public names, read by callers from `draftdoctor.realload`; each is owned (and patched) where it comes from
__all__ = ["CHILD_ENV", "OVERLAY_RECORD", "READY_MARKER", "REAL_LOADERS", "SCHEMA_VERSION", "WORKER_SWITCH",
           "LoadReport", "NoRoomForWorker", "RealLoaderCrashed", "RealLoaderError", "RealLoaderTimeout", "RealLoaders",
           "ReleaseNotInstalled", "WorkerPlaceUnsafe", "installed_releases", "kit_path", "load_reports", "parse_launch",
           "release_env", "releases", "releases_dir", "run_real_loader", "run_real_loaders", "scratch",
           "scratch_folder", "self_check", "stop_worker", "stop_workers"]


def run_real_loaders(checkpoint_dirs, release: str, timeout: float | None = None, device: str = "auto",
                     engine_name: str = "sglang", target_config=None, meta_for=()) -> list[dict]:
    """The wire form of each checkpoint's `LoadReport` (`load_reports`, checked), for callers that keep
    plain JSON."""
    return [r.to_wire() for r in load_reports(checkpoint_dirs, release, timeout=timeout, device=device, engine_name=engine_name,
                                              target_config=target_config, meta_for=meta_for)]


def load_reports(checkpoint_dirs, release: str, timeout: float | None = None, device: str = "auto",
                 engine_name: str = "sglang", target_config=None, meta_for=()) -> list[LoadReport]:
    """One `LoadReport` per checkpoint, all loaded in one process: the release's
    warm worker (started on first use, reused by later calls and other processes until idle for
    pool.WORKER_IDLE_S), or with $DRAFTDOCTOR_REALLOAD_WORKER=0 a fresh child.

    Each checkpoint gets a fresh config, model and recorder. `timeout` covers the whole batch (default
    120 s + 30 s per checkpoint). `target_config` (vLLM): the target's config.json, else a stand-in
    sized from each draft. `meta_for`: folders built on meta whatever `device` says.
    """
    folders = [Path(d) for d in checkpoint_dirs]
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: not a checkpoint folder")
    if timeout is None:
        timeout = 120.0 + 30.0 * len(folders)
    paths = [str(f.resolve()) for f in folders]
    target = str(Path(target_config).resolve()) if target_config else None
    meta = [str(Path(f).resolve()) for f in meta_for]
    if os.environ.get(WORKER_SWITCH, "1") != "0":
        devices = {"*": device, **dict.fromkeys(meta, "meta")} if meta else device
        try:
            answer = _worker_call(release, {"checkpoints": paths, "device": devices, "target_config": target},
                                  timeout, engine_name)
        except (WorkerPlaceUnsafe, NoRoomForWorker):
            pass  # no worker where another user could answer for it, or no room: this check runs cold
        else:
            return _read(answer, len(paths), engine_name, release, worker=True)
    return _read(_run_child(release, ["--device", device, *(a for f in meta for a in ("--meta-for", f)),
                                      *(["--target-config", target] if target else []), *paths], timeout, engine_name),
                 len(paths), engine_name, release, worker=False)


def _read(wires, count: int, engine_name: str, release: str, worker: bool) -> list[LoadReport]:
    """The boundary: a child's answer read as `count` load reports, or RealLoaderCrashed naming what is
    not (a worker that answered so is stopped: the next call starts one of this kit)."""
    try:
        if not isinstance(wires, list) or len(wires) != count:
            raise LoadReportError(f"{count} load reports asked for, the answer is not a list of {count}")
        return [LoadReport.from_wire(w) for w in wires]
    except LoadReportError as e:
        if worker:
            stop_worker(engine_name, release)
        raise RealLoaderCrashed(f"{engine_name} {release} real loader answered with what this kit cannot read: {e}") from None


def run_real_loader(checkpoint_dir, release: str, timeout: float = 120.0, device: str = "auto",
                    engine_name: str = "sglang") -> dict:
    """Load `checkpoint_dir` with `engine_name` `release`'s own code and return its load report's wire form.

    `device`: "cpu" builds real tensors (sentinel and hashes), "meta" shapes only, "auto" picks meta for
    checkpoints over 1 GiB. Raises ReleaseNotInstalled, RealLoaderTimeout or RealLoaderCrashed
    when no report could be made; the engine's own failures on the checkpoint are in the report's `error`.
    """
    return run_real_loaders([checkpoint_dir], release, timeout=timeout, device=device, engine_name=engine_name)[0]


def parse_launch(release: str, argvs: list[list[str]], timeout: float = 180.0) -> list[dict]:
    """SGLang `release`'s own verdict on each `sglang.launch_server` argument list, from its parser and
    its argument checks run in a cold child on this CPU (`child.parse_launch`; cold, because those
    checks set process-wide state a warm worker's later loads must not see): {"accepted", "stage",
    "message", "device", "notes"} each. Raises ReleaseNotInstalled when that release is not here."""
    return _run_child(release, ["--parse-launch", json.dumps([list(a) for a in argvs])], timeout, "sglang")


def self_check(release: str, timeout: float = 120.0, engine_name: str = "sglang") -> None:
    """Verify that the release's adapter still fits the installed release (raises RealLoaderCrashed if not)."""
    _run_child(release, [], timeout, engine_name)
