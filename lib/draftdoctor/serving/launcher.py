"""Launch a speculative-decoding server, wait until it is ready, and stop it without orphans.

One launcher for every backend, each a row (serving.backends) and a module that says what it runs
(`MODULES`): `sglang` runs the real `python -m sglang.launch_server` (GPU hosts only; not run here,
where its own parser checks the command first); `reference` runs draftdoctor's CPU reference server,
which takes the same flags; `vllm` runs real vLLM's OpenAI server on the CPU; `llamacpp` runs
llama.cpp's llama-server on GGUF conversions of the target and draft. The server runs in its
own process group with its output in a log file. Readiness is the backend's health endpoint
answering 200 (`/health_generate`, vLLM's `/health`) or its ready log line, *and* the kernel saying
that every socket listening on the port belongs to the server's process group (`listeners`): a port
chosen here can be taken by another process before the server binds it, which would then answer in
its place. Port 0 means "choose one". The kit's own server (the reference backend) is started on a
listening socket the launcher already holds (`listen_fd_flag`): its port is never free for another
process to take. A server that binds its own `--port` (vLLM, llama-server, SGLang, JupyterLab) gets a
free port outside the kernel's ephemeral range (`ports.choose_port`): the kernel hands ports of that range to
every outbound connection and every bind to port 0 on the host, so on a busy host a port found free
there by binding port 0 is soon someone's. A chosen port found taken all the same is given up for
another (up to PORT_ATTEMPTS times); a port the user gave is refused by name. A process that exits is a crash, a log
that stops growing for `hang_timeout` seconds is a hang (EAGLE start-ups are known to hang in
CUDA-graph capture); both errors carry the last log lines. `stop()` sends SIGTERM to the whole group,
then SIGKILL (`processes.py`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import listeners
from ..realload.common import die_with_parent
from ..engines import EngineRelease, expect_release
from ..errors import UserError
from ..guard import REPORTS as GUARD_REPORTS, guard_refusal, reports as guard_reports, unguarded
from . import llamacpp, reference, sglang, vllm
from .backends import BACKENDS
from .ports import choose_port, listening_socket, port_is_free
from .processes import _server_scratch, _stop_group
from .sglang import LaunchUnchecked, ServeConfig, cuda_graph_flags, launch_args  # noqa: F401  (the launcher's words)

READY_LINE = sglang.READY_LINE  # a Server's default readiness: SGLang's, which the reference server prints too
REFERENCE_DEFAULT_ENGINE = reference.DEFAULT_ENGINE
MODULES = {module.ROW.name: module for module in (reference, sglang, vllm, llamacpp)}


class ServerError(UserError, RuntimeError):
    """A server that did not come up; `log_tail` holds its last log lines."""

    def __init__(self, message: str, log_tail: list[str] | None = None):
        self.log_tail = log_tail or []
        tail = "\n".join("    " + line for line in self.log_tail)
        super().__init__(message + (f"\n  last log lines:\n{tail}" if tail else ""))


class ServerCrashed(ServerError):
    pass


class ServerHung(ServerError):
    pass


class PortBusy(ServerError):
    """The port is held by a process that is not the server the kit started."""


class GuardStopped(ServerCrashed):
    """The guard in the server's process refused its draft (`--guard`): a finding about the draft,
    `refusal` the guard's own words."""

    def __init__(self, message: str, refusal: str):
        super().__init__(message)
        self.refusal = refusal


class GuardAbsent(ServerError):
    """`--guard`: the server became ready, but the guard never reported from a process that loaded its
    draft (it was not in that process, or did not see the load): the server is stopped, never served blind."""


class LaunchRefused(ServerError):
    """A launch configuration that cannot work, refused before anything starts."""


def backend_module(backend: str):
    """The module of `backend`'s row (serving.backends): what it runs and how it is measured."""
    if backend not in MODULES:
        raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    return MODULES[backend]


def server_command(backend: str, config: ServeConfig, engine: EngineRelease | None = None, loader: str | None = None,
                   python: str | None = None) -> list[str]:
    """The full argv for `backend`; `engine` is the release served, emulated by the reference backend,
    or (vLLM) the one whose load the served checkpoint stands for."""
    _expect_release_or_none(engine)
    return backend_module(backend).command(config, engine, loader, python)


def _expect_release_or_none(engine) -> None:
    if engine is not None:
        expect_release(engine)



def tail(path: Path, lines: int = 20, offset: int = 0) -> list[str]:
    """The last `lines` lines of `path` written after byte `offset`."""
    try:
        with open(path, "rb") as f:
            f.seek(max(offset, os.fstat(f.fileno()).st_size - (1 << 16)))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    return list(deque(text.splitlines(), maxlen=lines))


_ERROR_WORDS = ("Error", "Exception", "error:", "failed", "Traceback")


def cause(lines: list[str]) -> str:
    """The log line that most likely names why a server failed: the last one naming an error or
    exception (a traceback's last line), else the last non-empty one."""
    text = [line.strip() for line in lines if line.strip() and not set(line.strip()) <= set("-=")]
    return next((line for line in reversed(text) if any(w in line for w in _ERROR_WORDS)), text[-1] if text else "")


PORT_ATTEMPTS = 5  # chosen ports found taken before the server is ready, before giving up
# how servers say their port was taken (Python's errno 98, uvicorn, llama-server, Go/Node-style)
_PORT_TAKEN_WORDS = re.compile(r"address already in use|EADDRINUSE|errno 98|couldn't bind|could not bind|"
                               r"failed to bind|cannot bind", re.IGNORECASE)


class Server:
    """A running server process group; use as a context manager to guarantee it is stopped.

    `argv` is the command, or a function of the port that gives it; with a function, port 0 means a
    free port chosen at start (and another one when a process takes it before the server binds it).
    `listen_fd_flag`: the server's flag taking a listening socket it inherits (its number follows the
    flag): the launcher binds the port itself and passes the socket, so the port is never free.
    """

    def __init__(self, argv, log_path, host: str, port: int, env: dict | None = None,
                 ready_timeout: float = 900.0, hang_timeout: float = 300.0, poll: float = 0.2,
                 health_path: str = sglang.HEALTH_PATH, ready_line: str = READY_LINE,
                 listen_fd_flag: str | None = None, guarded: bool = False):
        if port == 0 and not callable(argv):
            raise ValueError("port 0 (choose one) needs argv as a function of the port")
        self.listen_fd_flag = listen_fd_flag
        self.command, self.log_path = argv, Path(log_path)
        self.health_path, self.ready_line = health_path, ready_line
        self.host, self.port, self.env = host, port, env
        self.chosen_port = port == 0  # the kit chose the port: a taken one is given up for another
        self.ready_timeout, self.hang_timeout, self.poll = ready_timeout, hang_timeout, poll
        self.process: subprocess.Popen | None = None
        self.log_offset = 0  # the log is appended to: this start's output begins here
        self.attempts = 0
        self.scratch: Path | None = None  # the server's TMPDIR, removed when it stops
        # `--guard`: the folder its guarded processes report to (draftdoctor.guard), read when it is ready
        self.guarded = guarded
        self.guard_reports: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def argv(self) -> list[str]:
        return self.command(self.port) if callable(self.command) else self.command

    def start(self) -> "Server":
        self.attempts += 1
        held = None
        if self.listen_fd_flag:
            try:
                held = listening_socket(self.host, 0 if self.chosen_port else self.port)
            except OSError as e:
                raise PortBusy(f"port {self.port} on {self.host} cannot be bound ({e.strerror}); pick another with "
                               f"--port") from None
            self.port = held.getsockname()[1]
        elif self.chosen_port:
            self.port = choose_port(self.host)
        elif not port_is_free(self.host, self.port):
            raise PortBusy(f"port {self.port} on {self.host} is already in use; pick another with --port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.log_offset = log.tell()
        try:
            # PYTHONSAFEPATH: a Python server started in a model's folder never imports a file from it;
            # TMPDIR: its temporary files (vLLM's IPC folders) go with it when it stops, or with the next
            # server's start when the kit was killed
            self.scratch = self.scratch or _server_scratch()
            env = dict(self.env if self.env is not None else os.environ, PYTHONSAFEPATH="1", TMPDIR=str(self.scratch))
            env.pop(GUARD_REPORTS, None)  # only this server's own folder counts
            if self.guarded:  # a fresh one per start: a server stopped before (port taken) reported there
                self.guard_reports = self.scratch / "guard-reports"
                shutil.rmtree(self.guard_reports, ignore_errors=True)
                self.guard_reports.mkdir(mode=0o700)
                env[GUARD_REPORTS] = str(self.guard_reports)
            argv = self.argv + ([self.listen_fd_flag, str(held.fileno())] if held else [])
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, env=env, preexec_fn=die_with_parent,
                                            pass_fds=(held.fileno(),) if held else ())
        finally:
            log.close()
            if held is not None:
                held.close()  # the server's own now: the listener proof wants it held by the server's group alone
        return self

    def holder(self) -> str:
        """Who listens on the server's port (listeners.port_holder): OURS when only this server does."""
        return listeners.port_holder(self.port, self.process.pid) if self.process else listeners.NONE

    def still_ours(self) -> bool:
        """Whether the server is alive and alone on its port: checked after a measurement, so that
        answers from a process that took the port of a server that died are never reported."""
        return self.process is not None and self.process.poll() is None and self.holder() in (listeners.OURS,
                                                                                                 listeners.UNKNOWN)

    def _port_taken(self, message: str) -> None:
        """The port was taken by another process: start again on another chosen port, or refuse."""
        lines = tail(self.log_path, offset=self.log_offset)
        self.stop()
        if self.chosen_port and self.attempts < PORT_ATTEMPTS:
            self.start()
            return
        advice = (f"{self.attempts} chosen ports were each taken by another process first; give one with --port"
                  if self.chosen_port else "pick another with --port")
        raise PortBusy(f"port {self.port} on {self.host} {message}; {advice}", lines)

    def wait_ready(self) -> float:
        """Block until ready; return seconds taken. Raises ServerCrashed / ServerHung / PortBusy / ServerError."""
        start = last_growth = time.monotonic()
        size = -1
        while True:
            code = self.process.poll()
            if code is not None:
                lines = tail(self.log_path, 200, offset=self.log_offset)
                if self.holder() == listeners.FOREIGN or _PORT_TAKEN_WORDS.search("\n".join(lines[-20:])):
                    self._port_taken("was taken by another process before the server bound it")
                    start = last_growth = time.monotonic()
                    continue
                refusal = guard_refusal(lines)
                if refusal:
                    raise GuardStopped(f"server exited with status {code} before it was ready: {refusal}", refusal)
                raise ServerCrashed(f"server exited with status {code} before it was ready: {cause(lines)[:300]} "
                                    f"(log: {self.log_path})", lines[-20:])
            # whoever holds the port is asked nothing until the kernel says it is this server
            holder = self.holder()
            if holder == listeners.FOREIGN:
                self._port_taken("is held by another process, not the server the kit started")
                start = last_growth = time.monotonic()
                continue
            if holder in (listeners.OURS, listeners.UNKNOWN) and (
                    self.ready_line in "\n".join(tail(self.log_path, 50, self.log_offset)) or self._healthy()):
                self._guard_was_there()
                return time.monotonic() - start
            now = time.monotonic()
            current = self.log_path.stat().st_size if self.log_path.exists() else 0
            if current != size:
                size, last_growth = current, now
            if now - last_growth > self.hang_timeout:
                self.stop()
                raise ServerHung(f"no log output for {self.hang_timeout:.0f} s during start-up: the server hangs "
                                 f"(for SGLang often in CUDA-graph capture; retry with CUDA graphs disabled)",
                                 tail(self.log_path, offset=self.log_offset))
            if now - start > self.ready_timeout:
                self.stop()
                raise ServerError(f"not ready after {self.ready_timeout:.0f} s", tail(self.log_path, offset=self.log_offset))
            time.sleep(self.poll)

    def _guard_was_there(self) -> None:
        """`--guard`: a ready server whose draft the guard never judged (or said it does not judge) in the
        process that loaded it ran blind: stopped, GuardAbsent. The guard judges while the draft loads,
        before any engine says it is ready, so its report is there by now."""
        if not self.guarded:
            return
        why = unguarded(guard_reports(self.guard_reports))
        if why:
            self.stop()
            raise GuardAbsent(f"--guard: the server became ready, but {why}; it was stopped (log: {self.log_path})")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + self.health_path, timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL after `grace` seconds; then its temporary folder goes.
        Idempotent."""
        if self.process is not None:
            _stop_group(self.process, grace)
            self.process = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def __enter__(self) -> "Server":
        if self.process is None:
            self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()



def _ready_server(backend: str, config: ServeConfig, log_path, engine, loader, **server_kwargs) -> Server:
    module = backend_module(backend)
    argv, launch_kwargs = module.launch(config, engine, loader)
    server = Server(argv, log_path, config.host, config.port, guarded=config.guard,
                    **{**launch_kwargs, **server_kwargs})
    try:
        server.start().wait_ready()
        why = module.not_serving(server.base_url) if config.draft else None
        if why:
            raise LaunchRefused(f"{why} (log: {log_path})")
    except BaseException:
        server.stop()
        raise
    return server


@dataclass
class DryRun:
    """The command `serve` would run, and the served engine's own verdict on it where the kit can ask
    (SGLang: its parser and argument checks, run on this CPU in that release's child)."""

    command: list[str]
    verdict: dict | None  # realload.parse_launch's answer; None: no engine parser was asked
    release: str | None = None


def dry_run(backend: str, config: ServeConfig, engine: EngineRelease | None = None,
            loader: str | None = None) -> DryRun:
    """What `serve` would launch (a port the launcher would pick shown as SGLang's default), checked by
    SGLang's own parser when the backend is real SGLang, which is run only on GPU hosts. Raises
    LaunchUnchecked when that SGLang release's parser is not installed here."""
    _expect_release_or_none(engine)
    config = replace(config, port=config.port or sglang.DEFAULT_PORT)
    command = server_command(backend, config, engine, loader)
    if BACKENDS[backend].runs_here:
        return DryRun(command, None)
    if engine is None:
        raise LaunchUnchecked("no SGLang release to check the command with: give --engine sglang==X.Y.Z")
    return DryRun(command, sglang.verdict(config, engine), engine.release)


def serve(backend: str, config: ServeConfig, log_path, engine: EngineRelease | None = None, loader: str | None = None,
          retry_without_cuda_graph: bool = True, **server_kwargs) -> Server:
    """Start and wait for a server; on a start-up hang of real SGLang, retry once with CUDA graphs off.

    Returns a ready Server; the caller stops it (or uses it as a context manager). A configuration
    with an error finding (e.g. algorithm-mismatch) is refused before anything starts.
    """
    from ..checks import launch_checks

    refused = [f for f in launch_checks(config.algorithm, config.draft) if f.severity == "error"]
    if refused:
        raise LaunchRefused("; ".join(f.brief() for f in refused))
    _expect_release_or_none(engine)
    why = backend_module(backend).refusal(config, engine, loader)  # e.g. SGLang's own parser, before anything runs
    if why:
        raise LaunchRefused(why)
    try:
        return _ready_server(backend, config, log_path, engine, loader, **server_kwargs)
    except ServerHung:
        if not (retry_without_cuda_graph and BACKENDS[backend].retries_without_cuda_graph
                and not config.disable_cuda_graph):
            raise
    retry = replace(config, disable_cuda_graph=True)
    return _ready_server(backend, retry, log_path, engine, loader, **server_kwargs)
