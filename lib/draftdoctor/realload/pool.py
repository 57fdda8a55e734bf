"""The warm workers: one child per engine release that stays up, reused across calls and processes.

A worker listens on a Unix socket (`common.serve`) in a folder only this user can enter (`_private`),
started on first use under a lock (`_start_worker`), at most MAX_WORKERS at once (the least recently
used idle one goes; one answering a check is never stopped, `_in_use`), and exits after WORKER_IDLE_S
without a request. `_worker_call` asks it for a batch of reports; WorkerPlaceUnsafe and NoRoomForWorker
tell the caller to run the check cold instead (`childenv._run_child`). $DRAFTDOCTOR_REALLOAD_WORKER=0
(WORKER_SWITCH) turns the workers off.
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
import time
from pathlib import Path

from .. import loadreport
from . import registry
from .childenv import WorkerPlaceUnsafe, _broken, _child, _private, worker_state
from .common import EXIT_ENVIRONMENT, peer_uid, read_line
from .registry import (REAL_LOADERS, RealLoaderCrashed, RealLoaderError, RealLoaderTimeout, installed_releases,
                       release_env)

WORKER_IDLE_S = 600.0  # a warm worker exits after this long without a request
MAX_WORKERS = 3  # warm workers alive at once (each holds an engine in memory); the least recently used goes
# set to 0 for a fresh child per call (the cold path: `benchmarks/real_loader.py`, install self-checks)
WORKER_SWITCH = "DRAFTDOCTOR_REALLOAD_WORKER"


def _worker_folder(engine_name, release, state: Path) -> tuple[Path, str]:
    """(folder, file stem) of the worker for `release` installed where it is now: a worker of another
    install (DRAFTDOCTOR_*_DIR), another checkout's kit, an edited child or another load report (its
    module, its wire version) is another worker, so no caller reads an older worker's answers. The
    folder is `state`, or, when the socket's path would pass a Unix socket's 107 bytes, a folder in
    /tmp named by the state folder (a predictable name: `_private` refuses it when it is not ours)."""
    code = sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                  for p in [*registry.HERE.glob("*.py"), Path(loadreport.__file__)])
    tag = hashlib.sha1(f"{release_env(release, engine_name)}|{registry.HERE}|{code}|{loadreport.VERSION}".encode()
                       ).hexdigest()[:10]
    stem = f"{engine_name}-{release}-{tag}"
    if len(str(state / f"{stem}.sock")) > 100:
        return Path("/tmp") / f"draftdoctor-{os.getuid()}-{hashlib.sha1(str(state).encode()).hexdigest()[:8]}", stem
    return state, stem


def _worker_paths(engine_name, release) -> tuple[Path, Path, Path]:
    """(socket, pid file, log) of the worker for `release`, in folders `_private` accepted."""
    state = _private(worker_state())
    folder, stem = _worker_folder(engine_name, release, state)
    sock = _private(folder) / f"{stem}.sock"
    return sock, sock.with_suffix(".pid"), state / f"{engine_name}-{release}.log"


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


def _start_worker(engine_name, release, timeout: float):
    """A connection to the release's worker, starting one when none answers (two callers at once: one
    starts it, under a lock, the other waits for it)."""
    sock, pid_file, log = _worker_paths(engine_name, release)
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
        command, env = _child(engine_name, release, ["--serve", str(sock), "--idle-timeout", str(WORKER_IDLE_S)])
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
                    raise _broken(engine_name, release, tail)
                raise RealLoaderCrashed(f"{engine_name} {release} real loader exited (status {proc.returncode}) while "
                                        f"starting:\n{tail}")
            conn = _connect(sock, timeout)
            if conn is not None:
                return conn
            time.sleep(0.05)
        stop_worker(engine_name, release)
        raise RealLoaderTimeout(f"{engine_name} {release} real loader did not start within {timeout:g} s")


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


def _worker_call(release, request: dict, timeout: float, engine_name: str):
    started = time.monotonic()
    with _in_use(_worker_paths(engine_name, release)[1]):
        return _ask_worker(release, request, timeout, engine_name, started)


def _ask_worker(release, request: dict, timeout: float, engine_name: str, started: float):
    conn = _start_worker(engine_name, release, timeout)
    with contextlib.suppress(FileNotFoundError):
        os.utime(_worker_paths(engine_name, release)[1])  # recently used
    try:
        conn.settimeout(max(1.0, timeout - (time.monotonic() - started)))
        conn.sendall(json.dumps(request).encode() + b"\n")
        line = read_line(conn)
    except socket.timeout:
        stop_worker(engine_name, release)  # a stuck load holds the worker: the next call starts a fresh one
        raise RealLoaderTimeout(f"{engine_name} {release} real loader did not finish within {timeout:g} s") from None
    except OSError:  # the worker died mid-answer (reset, broken pipe)
        line = b""
    finally:
        conn.close()
    if not line:
        log = _worker_paths(engine_name, release)[2]
        tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-10:]) if log.exists() else ""
        raise RealLoaderCrashed(f"{engine_name} {release} real loader died while loading these checkpoints (a fresh one "
                                f"starts on the next check); its log {log} ends:\n{tail}")
    answer = json.loads(line)
    if "error" in answer:
        raise RealLoaderCrashed(f"{engine_name} {release} real loader failed:\n{answer['error'][-2000:]}")
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


def stop_worker(engine_name: str, release: str) -> None:
    """Stop the release's warm worker, if one runs."""
    _kill(_worker_paths(engine_name, release)[1])


def stop_workers() -> None:
    """Stop every warm worker of this checkout's worker state (`worker_state()`; e.g. at the end of a
    test session, which has its own)."""
    state = worker_state()
    for folder in {_worker_folder(e, r, state)[0] for e in REAL_LOADERS for r in installed_releases(e)}:
        with contextlib.suppress(WorkerPlaceUnsafe):
            for pid_file in _private(folder).glob("*.pid"):
                _kill(pid_file)
