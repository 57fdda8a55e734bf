"""What the real-loader children (SGLang's `child`, vLLM's `vllm_child`, llama.cpp's `llamacpp_child`) do
the same way: take the same arguments; record the engine's logged warnings, its errors with their origin
and the stages' times; set up the gloo process group on a file store and loopback; make one `LoadReport`
per checkpoint (draftdoctor.loadreport) and answer a batch's wire forms on stdout, or serve batches as a
warm worker on a Unix socket (`serve`)."""

import contextlib
import gc
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import traceback
from pathlib import Path

from ..loadreport import LoadReport


EXIT_ENVIRONMENT = 3  # the child's exit status when the release's environment is broken (realload reads it)


class Captured(logging.Handler):
    """Keeps warnings and errors logged while the checkpoint is read (an engine's silence is evidence)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.stage = None
        self.records = []

    def emit(self, record):
        self.records.append({"stage": self.stage, "level": record.levelname, "logger": record.name,
                             "message": record.getMessage()})


def die_with_parent() -> None:
    """In a process the kit starts, before it runs (`preexec_fn`): the kernel sends it SIGTERM when the
    process that started it dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG), so nothing it started
    outlives it (a cold real-loader child had grown to 1.6 GB after its parent was killed)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the caller's own clean-up still applies
        pass


def process_group_init() -> str:
    """The init method for the child's world-size-1 gloo group: a file store in a folder of its own
    (removed when the child exits), not a TCP store, whose server listens on every network interface
    for as long as the process lives (and on a port chosen before it is bound); gloo itself is told to
    use the loopback interface. Nothing a child starts listens beyond loopback
    (tests/test_realload_worker.py)."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    folder = tempfile.mkdtemp(prefix="draftdoctor-gloo-")
    on_exit(lambda: shutil.rmtree(folder, ignore_errors=True))
    return f"file://{folder}/store"


def error(stage, exc, key=None):
    """What the engine raised, at which stage and key, and where (innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    origin = frames[-1] if frames else None
    return {
        "stage": stage, "type": type(exc).__name__, "message": str(exc), "key": key,
        "origin": f"{short_path(origin.filename)}:{origin.lineno} in {origin.name}" if origin else None,
        "traceback": "".join(traceback.format_exception(exc)),
    }


def short_path(filename):
    """Path relative to its import root (sglang/..., vllm/...), not the machine's."""
    for root in sorted((p for p in sys.path if p), key=len, reverse=True):
        if filename.startswith(root.rstrip("/") + "/"):
            return filename[len(root.rstrip("/")) + 1:]
    return filename


class Stages:
    """The stage a check is in (config, build, load, postprocess, done) and each stage's seconds,
    written into `timings`; the log capture is told the stage, so a warning says when it came."""

    def __init__(self, timings: dict, captured: Captured, first: str = "config"):
        import time

        self._clock = time.perf_counter
        self.timings, self.captured = timings, captured
        self.current, self._since = first, self._clock()
        captured.stage = first

    def enter(self, stage: str) -> None:
        now = self._clock()
        self.timings[self.current] = round(now - self._since, 3)
        self.current, self._since = stage, now
        self.captured.stage = stage


def fused_shards(module, qkv_class, merged_class):
    """The shard ids a fused module expects (q/k/v, or 0/1 for gate/up), None for any other module;
    both engines name their fused linear classes alike."""
    if isinstance(module, qkv_class):
        return ["q", "k", "v"]
    if isinstance(module, merged_class):
        return list(range(len(module.output_sizes)))
    return None


def report_stream():
    """The child's stdout, kept for its one JSON document; anything the engine prints goes to stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


_ON_EXIT = []


def on_exit(cleanup) -> None:
    """Run `cleanup` when the child exits (`exit_now`), for what outlives `main`'s `with` blocks."""
    _ON_EXIT.append(cleanup)


def exit_now(status: int) -> None:
    """End the child once its answer is out, skipping the interpreter's teardown: after torch and an
    engine are imported it takes 1.3-1.8 s (module finalizers, the gloo group, thread joins) that every
    cold check waited for. Nothing else is left to do by then: the child's temporary folders are gone
    (the `with` blocks that made them, or `on_exit`)."""
    for cleanup in _ON_EXIT:
        cleanup()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def emit(out, reports) -> int:
    """Write the reports as the child's one JSON document; exit status 0."""
    json.dump(reports, out)
    out.write("\n")
    out.flush()
    return 0


# Checkpoints larger than this are built on the meta device: shapes, key resolution and weight-loader
# calls still run, but no parameter memory is allocated (so no sentinel and no hashes).
CPU_BUILD_LIMIT_BYTES = 1 << 30


def device_for(checkpoint, requested) -> str:
    """"cpu" or "meta" for `checkpoint` ("auto": meta above CPU_BUILD_LIMIT_BYTES of safetensors).
    `requested` is a device, or {folder: device, "*": device} for a batch whose checkpoints differ (a
    draft whose config claims more than the machine can spare is built on meta, see realcheck)."""
    if isinstance(requested, dict):
        requested = requested.get(str(checkpoint), requested.get("*", "auto"))
    if requested != "auto":
        return requested
    size = sum(f.stat().st_size for f in Path(checkpoint).glob("*.safetensors"))
    return "meta" if size > CPU_BUILD_LIMIT_BYTES else "cpu"


def add_child_arguments(parser) -> None:
    """The arguments every child takes: checkpoints (one batch, printed on stdout), or --serve (a warm
    worker answering batches on a Unix socket until idle)."""
    parser.add_argument("checkpoints", nargs="*", help="draft checkpoint folders (none: the install's self-check on a tiny draft)")
    parser.add_argument("--release", required=True)
    parser.add_argument("--device", choices=("auto", "cpu", "meta"), default="auto")
    parser.add_argument("--meta-for", action="append", default=[], metavar="FOLDER",
                        help="build this checkpoint on meta whatever --device says (repeatable)")
    parser.add_argument("--target-config", help="(vLLM) the target's config.json (default: a stand-in sized from each draft)")
    parser.add_argument("--serve", metavar="SOCKET", help="answer requests on this Unix socket until idle")
    parser.add_argument("--idle-timeout", type=float, default=600.0, help="(--serve) seconds without a request before exiting")


def batch(paths, header: dict, setup_s: float, check_one) -> list[dict]:
    """One `LoadReport` per checkpoint folder, as its wire form: `header` (engine, release, versions, ...),
    the checkpoint, then the fields `check_one(checkpoint, scratch)` found (plain values, checked as the
    parent checks them), the set-up time first among its timings; `scratch` is a temporary folder the
    batch shares."""
    reports = []
    with tempfile.TemporaryDirectory(prefix=f"draftdoctor-{header['engine_name']}-") as scratch:
        for checkpoint in map(Path.resolve, map(Path, paths)):
            found = check_one(checkpoint, Path(scratch))
            found["timings"] = {"setup": setup_s, **found.get("timings", {})}
            reports.append(LoadReport.of(**header, checkpoint=str(checkpoint), **found).to_wire())
            # The model just checked lives in reference cycles (modules and their parents, the recorder's
            # wrapped weight loaders): freed now, not at some later collection, so a batch or a warm
            # worker holds one model at a time (it had grown by 2 GB per 8B-target draft, to an OOM kill).
            gc.collect()
    return reports


def run(args, out, checks) -> int:
    """After set-up: one batch (`checks(paths, device, target_config)` -> the LoadReports' wire forms,
    printed on `out`), or,
    with --serve, every request a client sends until the worker is idle for --idle-timeout seconds;
    with neither checkpoints nor --serve, the install's self-check (`self_check`)."""
    # What set-up made (torch, the engine, its registry) lives as long as the process: out of the
    # collector's sight, so the collection after each check (`batch`) walks only what that check made.
    gc.freeze()
    if not args.serve:
        if not args.checkpoints:
            return self_check(out, checks)
        device = {"*": args.device, **{str(Path(f).resolve()): "meta" for f in args.meta_for}} if args.meta_for \
            else args.device
        return emit(out, checks(args.checkpoints, device, args.target_config))
    return serve(args.serve, args.idle_timeout, lambda request: checks(
        request["checkpoints"], request.get("device", "auto"), request.get("target_config")))


def self_check(out, checks) -> int:
    """A tiny draft in the EAGLE repo's layout (`midlayer.*`, flat config) through the release's whole
    path: config, build, load. An install that imports but cannot load then fails at `make`, not in a
    user's first check, and the caches the release keeps are filled (vLLM's model inspection, about 25 s
    cold). Every release the replay models loads that draft without error (docs/releases/); one that
    raises exits 3. A release no profile row covers (vLLM before 0.12: another draft class, sweep only)
    may refuse it: said on stderr, not a failure."""
    from ..engines import EngineRelease, EngineSpecError
    from ..synth import write_draft

    with tempfile.TemporaryDirectory(prefix="draftdoctor-self-check-") as folder:
        reports = checks([write_draft(Path(folder) / "draft", layout="midlayer")], "auto", None)
    for report in reports:
        if report["error"]:
            engine, release, found = report["engine_name"], report["release"], report["error"]
            print(f"draftdoctor: {engine} {release}'s self-check draft did not load "
                  f"({found['stage']}: {found['type']}: {found['message']})", file=sys.stderr)
            try:
                EngineRelease.of(engine, release)  # a release some profile row models
            except EngineSpecError:
                continue
            return EXIT_ENVIRONMENT
    return emit(out, reports)


def serve(socket_path: str, idle_timeout: float, handle) -> int:
    """A warm worker: one request at a time on a Unix socket (a JSON line in, a JSON line out), the
    engine imported once; exits after `idle_timeout` seconds without one, removing its socket and its
    temporary folder. A request that raises gets {"error": traceback}; a request that kills the process
    gets no answer."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    os.chmod(socket_path, 0o600)  # its folder is the user's alone already (realload.childenv._private)
    server.listen(16)  # concurrent clients queue here and are answered in turn
    server.settimeout(idle_timeout)
    try:
        while True:
            try:
                conn, _ = server.accept()
            except socket.timeout:
                return 0
            with conn:
                if peer_uid(conn) != os.getuid():  # only its own user's checks: it reads any path it is sent
                    continue
                conn.settimeout(None)
                try:
                    answer = {"reports": handle(json.loads(read_line(conn)))}
                except Exception:  # a bug of ours, not the engine's failure (that is in the report)
                    answer = {"error": traceback.format_exc()}
                try:
                    conn.sendall(json.dumps(answer).encode() + b"\n")
                except OSError:
                    pass  # the client gave up (its timeout): the next one is served
    finally:
        server.close()
        for path in (Path(socket_path), Path(socket_path).with_suffix(".pid")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        shutil.rmtree(Path(socket_path).with_suffix(".tmp"), ignore_errors=True)  # its TMPDIR (realload)


def peer_uid(conn) -> int:
    """The user id of the process at the other end of a Unix socket (the kernel's word, SO_PEERCRED)."""
    import struct

    return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]


def read_line(conn) -> bytes:
    """Bytes up to the first newline (b"" when the peer closed first)."""
    chunks = []
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)
