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
    this module   the entry points: `run_real_loaders`, `run_real_loader`, `parse_launch`, `self_check`

Every child prints reports of this shape (the vLLM child adds `from_target`: the parameters its EAGLE
proposer takes from the target).

`run_real_loader(checkpoint_dir, release)` returns the child's report, a JSON object:

    schema        1
    loader        "real"
    engine        "sglang"
    release       "0.5.10"
    versions      {"sglang": ..., "torch": ..., "transformers": ...} as installed in the child
    checkpoint    absolute path of the checkpoint folder
    device        "cpu" (real tensors) or "meta" (shapes only; chosen for checkpoints > 1 GiB)
    config        null if SGLang could not read the config, else
                  {"architectures": [...], "model_type": str, "dtype": "float16"} as SGLang resolved them
    model_class   "sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3" once the registry built it, else null
    error         null, or what SGLang raised:
                  {"stage": "config" | "build" | "load",   config = reading config.json (ModelConfig),
                                                           build = registry lookup and model construction,
                                                           load = the class's load_weights
                   "type": "ValueError", "message": SGLang's own message,
                   "key": checkpoint key being loaded when it raised (load stage) or null,
                   "origin": "sglang/srt/...py:LINE in FUNC" (innermost frame), "traceback": str}
    postprocess   "done" after SGLang's post-load processing, "skipped on meta: ..." (it needs real tensors),
                  null if loading never finished
    parameters    one entry per model parameter (empty if the model was never built):
                  {"name": "model.midlayer.self_attn.qkv_proj.weight", "shape": [128, 128], "dtype": "float16",
                   "numel": int,
                   "status": "written" | "partial" | "untouched",
                   "elements_written": int (elements no longer holding the pre-filled sentinel NaN) or null on meta,
                   "writes": [{"key": checkpoint key, "shard": "q"|"k"|"v"|"0"|"1"|null, "ok": bool}, ...]
                             every weight-loader call, in order (ok false: the loader raised),
                   "shards_expected": ["q","k","v"] / ["0","1"] for fused parameters, else null,
                   "shards_written": shards with a successful write (fused parameters), else null,
                   "unattributed_write": true if data changed without a recorded weight-loader call,
                   "sha256": hex digest of the parameter's bytes after loading (cpu), else null}
    keys          one entry per key the production weights iterator yielded, in order:
                  {"key": "layers.0.mlp.up_proj.weight", "shape": [...], "dtype": "float16",
                   "consumed": bool, "consumed_as": "parameter" | "attribute" | null,
                   "parameters": [names written from it, successful writes only],
                   "attributes": [model attributes it set]}
    all_keys_seen true if the iterator was exhausted (false after an error mid-load: later keys absent)
    attributes    {"hot_token_id": {"from_key": "d2t", "type": "Tensor", "shape": [...], "dtype": "int64"}}
    logs          warnings/errors logged while reading, building and loading:
                  [{"stage": ..., "level": "WARNING", "logger": "sglang....", "message": ...}]
    timings       seconds: {"setup", "config", "build", "load", "postprocess"} for the stages that ran;
                  "setup" (importing SGLang, process group) is per child process, shared by a batch
"""

import json
import os
from pathlib import Path

from .childenv import CHILD_ENV, WorkerPlaceUnsafe, _run_child, kit_path, scratch, scratch_folder
from .pool import WORKER_SWITCH, NoRoomForWorker, _worker_call, stop_worker, stop_workers
from .registry import (OVERLAY_RECORD, READY_MARKER, REAL_LOADERS, RealLoaderCrashed, RealLoaderError, RealLoaders,
                       RealLoaderTimeout, ReleaseNotInstalled, installed_releases, release_env, releases, releases_dir)

SCHEMA_VERSION = 1

# the public names, read by callers from `draftdoctor.realload`; each is owned (and patched) where it comes from
__all__ = ["CHILD_ENV", "OVERLAY_RECORD", "READY_MARKER", "REAL_LOADERS", "SCHEMA_VERSION", "WORKER_SWITCH",
           "NoRoomForWorker", "RealLoaderCrashed", "RealLoaderError", "RealLoaderTimeout", "RealLoaders",
           "ReleaseNotInstalled", "WorkerPlaceUnsafe", "installed_releases", "kit_path", "parse_launch",
           "release_env", "releases", "releases_dir", "run_real_loader", "run_real_loaders", "scratch",
           "scratch_folder", "self_check", "stop_worker", "stop_workers"]


def run_real_loaders(checkpoint_dirs, release: str, timeout: float | None = None, device: str = "auto",
                     engine_name: str = "sglang", target_config=None, meta_for=()) -> list:
    """One report per checkpoint (see the module docstring), all loaded in one process: the release's
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
            return _worker_call(release, {"checkpoints": paths, "device": devices, "target_config": target}, timeout,
                                engine_name)
        except (WorkerPlaceUnsafe, NoRoomForWorker):
            pass  # no worker where another user could answer for it, or no room: this check runs cold
    return _run_child(release, ["--device", device, *(a for f in meta for a in ("--meta-for", f)),
                                *(["--target-config", target] if target else []), *paths], timeout, engine_name)


def run_real_loader(checkpoint_dir, release: str, timeout: float = 120.0, device: str = "auto",
                    engine_name: str = "sglang") -> dict:
    """Load `checkpoint_dir` with `engine` `release`'s own code and return the report described above.

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
