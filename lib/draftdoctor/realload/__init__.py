"""Run an SGLang release's own draft loader on a checkpoint, in a subprocess, and return what happened.

The parent side (this module) imports neither torch nor sglang: each release lives in its own folder
`build/sglang/<release>` (installed by `make sglang-loaders`), and a child process
(`python -m draftdoctor.realload.child`) runs with that folder on `PYTHONPATH`, so import stubs, the
gloo process group and SGLang's global state never leak into the caller (e.g. a notebook kernel).

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
import signal
import subprocess
import sys
from pathlib import Path

SCHEMA_VERSION = 1
SUPPORTED_RELEASES = ("0.5.10", "0.5.11", "0.5.23")
INSTALL_COMMAND = "make sglang-loaders"
# Written last by `make sglang-loaders` into each release folder: a folder without it is incomplete.
READY_MARKER = ".installed"
_ENV_OVERRIDE = "DRAFTDOCTOR_SGLANG_DIR"
_EXIT_ENVIRONMENT = 3  # child.EXIT_ENVIRONMENT (not imported: the child module imports torch)


class RealLoaderError(RuntimeError):
    """The real loader could not produce a report (as opposed to SGLang failing on the checkpoint,
    which is reported in the result's `error`)."""


class ReleaseNotInstalled(RealLoaderError):
    pass


class RealLoaderTimeout(RealLoaderError):
    pass


class RealLoaderCrashed(RealLoaderError):
    """The child died, printed no report, or found its release environment or adapter broken."""


def releases_dir():
    """Folder holding one sub-folder per installed release (override with $DRAFTDOCTOR_SGLANG_DIR)."""
    if os.environ.get(_ENV_OVERRIDE):
        return Path(os.environ[_ENV_OVERRIDE])
    return Path(__file__).resolve().parents[3] / "build" / "sglang"


def release_env(release):
    """The installed folder of `release`; raises ReleaseNotInstalled if it is missing or incomplete."""
    if release not in SUPPORTED_RELEASES:
        raise ValueError(f"sglang {release} has no real loader; supported: {', '.join(SUPPORTED_RELEASES)}")
    folder = releases_dir() / release
    if not (folder / READY_MARKER).exists():
        raise ReleaseNotInstalled(f"the sglang {release} environment is not installed ({folder} is missing or "
                                  f"incomplete): run `{INSTALL_COMMAND}`")
    return folder


def _run_child(release, args, timeout):
    env = dict(os.environ, PYTHONPATH=str(release_env(release)), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "draftdoctor.realload.child", "--release", release, *args]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: gloo may have helpers
        proc.communicate()
        raise RealLoaderTimeout(f"sglang {release} real loader did not finish within {timeout:g} s") from None
    tail = "\n".join(stderr.strip().splitlines()[-20:])
    if proc.returncode == _EXIT_ENVIRONMENT:
        raise RealLoaderCrashed(f"sglang {release} environment or adapter is broken (reinstall with "
                                f"`{INSTALL_COMMAND}`; if it persists the adapter needs updating):\n{tail}")
    if proc.returncode != 0:
        raise RealLoaderCrashed(f"sglang {release} real loader died (exit status {proc.returncode}):\n{tail}")
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        raise RealLoaderCrashed(f"sglang {release} real loader printed no report:\n{tail}") from None


def run_real_loaders(checkpoint_dirs, release: str, timeout: float | None = None, device: str = "auto") -> list:
    """One report per checkpoint (see the module docstring), all loaded in one child process.

    The process set-up (importing SGLang, about 5-10 s) is paid once; each checkpoint gets a fresh
    config, model and recorder. `timeout` covers the whole batch (default 120 s + 30 s per checkpoint).
    """
    folders = [Path(d) for d in checkpoint_dirs]
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: not a checkpoint folder")
    if timeout is None:
        timeout = 120.0 + 30.0 * len(folders)
    return _run_child(release, ["--device", device, *(str(f.resolve()) for f in folders)], timeout)


def run_real_loader(checkpoint_dir, release: str, timeout: float = 120.0, device: str = "auto") -> dict:
    """Load `checkpoint_dir` with SGLang `release`'s own code and return the report described above.

    `device`: "cpu" builds real tensors (sentinel and hashes), "meta" shapes only, "auto" picks meta for
    checkpoints over 1 GiB. Raises ReleaseNotInstalled, RealLoaderTimeout or RealLoaderCrashed when no
    report could be made; SGLang's own failures on the checkpoint are in the report's `error`.
    """
    return run_real_loaders([checkpoint_dir], release, timeout=timeout, device=device)[0]


def self_check(release: str, timeout: float = 120.0) -> None:
    """Verify that the release's adapter still fits the installed release (raises RealLoaderCrashed if not)."""
    _run_child(release, [], timeout)
