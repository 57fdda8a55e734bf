"""Crash-safe rewriting of safetensors shards: new headers, tensor bytes copied by the kernel and
compared as they are copied, in a hidden folder beside the destination that is renamed into place.

Knows nothing of engines: `fix` decides the names, this module writes them. Each shard gets a new
header (`checkpoint.encode_header`) and its data is copied by the kernel (`copy_file_range`, else
`sendfile`, else a bounded buffer), 4 MB at a time, while a second thread reads each copied chunk
back from SRC and DST and compares the two, close behind the copy so both are usually still in the
CPU cache (see `fix` for why comparing beats hashing). SRC is only ever opened for reading.
"""

from __future__ import annotations

import errno
import os
import queue
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import ShardHeader, encode_header, open_regular
from .errors import UserError

CHUNK = 4 << 20  # copied in one call, then read back from SRC and DST and compared
COMPARE_PIECE = 64 << 10  # read back in pieces this size: the two buffers stay in the core's own cache
VERIFY_LAG = 16  # chunks the comparison may trail the copy by: the copy never waits on a briefly busy core


class RewriteError(UserError):
    """A source that changed or ended while it was copied."""


class Stopped(Exception):
    """A copy told to stop (`Background`): what it wrote is its caller's to remove."""


class Background:
    """`work(stop)` run in a thread of its own while this thread does something else (`fix` judges its
    plan while the shards are copied). `result()` waits for what it returns, or raises what it raised;
    leaving the with-block before that (an exception, Ctrl-C) sets `stop`, which the copy reads at
    each chunk, and waits for the thread: nothing is still writing once the block is left."""

    def __init__(self, work):
        self.stop = threading.Event()
        self._outcome: list = []
        self._thread = threading.Thread(target=self._run, args=(work,), name="draftdoctor-write", daemon=True)

    def _run(self, work) -> None:
        try:
            self._outcome.append((True, work(self.stop)))
        except BaseException as e:  # raised again in the caller's thread
            self._outcome.append((False, e))

    def __enter__(self) -> "Background":
        self._thread.start()
        return self

    def result(self):
        self._thread.join()
        ok, value = self._outcome[0]
        if not ok:
            raise value
        return value

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self._thread.join()


@dataclass(frozen=True)
class WrittenTensor:
    """A tensor as written: its name and range in DST and the range it came from in SRC."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    src: Path
    src_begin: int
    dst: Path
    dst_begin: int
    nbytes: int


def write_shard(shard: ShardHeader, names: dict[str, str | None], folder: Path, copier,
                progress, stop: threading.Event | None = None) -> tuple[list[WrittenTensor], set[str]]:
    """Write one shard under `folder` (same file name) with its tensors renamed by `names` (None:
    left out): the new header, then the data, copied and compared with SRC chunk by chunk (until
    `stop` is set: then Stopped). Returns the tensors as written and those whose bytes differ."""
    kept = [t for t in sorted(shard.tensors, key=lambda t: t.begin) if names[t.name] is not None]
    head = encode_header([(names[t.name], t.dtype, t.shape, t.nbytes) for t in kept], shard.metadata,
                         page_offset_of=kept[0].begin if kept else 8)
    out_path = folder / shard.path.name
    planned, position = [], len(head)
    for t in kept:
        planned.append(WrittenTensor(names[t.name], t.dtype, t.shape, t.file, t.begin, out_path, position, t.nbytes))
        position += t.nbytes
    with open_regular(shard.path) as src, open(out_path, "x+b") as out:  # a FIFO swapped in: refused, not waited on
        out.write(head)
        out.flush()
        bad = _copy_and_compare(src.fileno(), out.fileno(), _runs(planned), copier, shard.path, progress, stop)
    mismatched = {p.name for p in planned for lo, hi in bad if lo < p.dst_begin + p.nbytes and p.dst_begin < hi}
    return planned, mismatched


def _runs(planned: list[WrittenTensor]):
    """Contiguous (src offset, dst offset, length) runs: usually the whole data section in one."""
    runs = []
    for p in planned:
        if runs and runs[-1][0] + runs[-1][2] == p.src_begin and runs[-1][1] + runs[-1][2] == p.dst_begin:
            runs[-1][2] += p.nbytes
        else:
            runs.append([p.src_begin, p.dst_begin, p.nbytes])
    return [tuple(r) for r in runs]


class Copier:
    """Copy byte ranges between files in the kernel where it can, remembering what worked."""

    _UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.ENOTSUP}

    def __init__(self):
        self.method = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"

    def copy(self, src_fd: int, dst_fd: int, src_off: int, dst_off: int, count: int, src_path) -> None:
        while count > 0:
            n = self._once(src_fd, dst_fd, src_off, dst_off, count)
            if n == 0:
                raise RewriteError(f"{src_path}: ended at byte {src_off}, before the data its header describes "
                               "(was it changed while it was copied?)")
            src_off, dst_off, count = src_off + n, dst_off + n, count - n

    def _once(self, src_fd, dst_fd, src_off, dst_off, count) -> int:
        if self.method == "copy_file_range":
            try:
                return os.copy_file_range(src_fd, dst_fd, count, src_off, dst_off)
            except OSError as e:
                if e.errno not in self._UNSUPPORTED:
                    raise
                self.method = "sendfile"
        if self.method == "sendfile":
            try:
                os.lseek(dst_fd, dst_off, os.SEEK_SET)  # sendfile writes at DST's position; one writer
                return os.sendfile(dst_fd, src_fd, src_off, count)
            except OSError as e:
                if e.errno not in self._UNSUPPORTED:
                    raise
                self.method = "buffered"
        view = memoryview(bytearray(min(count, CHUNK)))
        n = os.preadv(src_fd, [view], src_off)
        written = 0
        while written < n:
            written += os.pwrite(dst_fd, view[written:n], dst_off + written)
        return n


def _copy_and_compare(src_fd: int, dst_fd: int, runs, copier, src_path, progress,
                      stop: threading.Event | None = None) -> list[tuple[int, int]]:
    """Copy the runs chunk by chunk in this thread while another thread reads each copied chunk back
    from SRC and DST and compares them, at most VERIFY_LAG chunks behind. Returns the DST ranges
    whose bytes differ.

    This thread reports progress and receives KeyboardInterrupt; an error in either thread stops
    both and is raised here.
    """
    copied = queue.Queue(VERIFY_LAG)
    state = {"bad": [], "error": None}

    def compare():
        a, b = bytearray(COMPARE_PIECE), bytearray(COMPARE_PIECE)
        while (chunk := copied.get()) is not None:
            if state["error"] is not None:
                continue  # drain, so the copy never waits on a full queue
            src_off, dst_off, length = chunk
            try:
                for start in range(0, length, COMPARE_PIECE):
                    n = min(COMPARE_PIECE, length - start)
                    got = _read_exactly(dst_fd, dst_off + start, b, n, "DST")
                    want = _read_exactly(src_fd, src_off + start, a, n, src_path)
                    if got != want:
                        state["bad"] += _differing(got, want, dst_off + start)
            except BaseException as e:  # raised again in the copying thread
                state["error"] = e

    checker = threading.Thread(target=compare, name="draftdoctor-compare", daemon=True)
    checker.start()
    try:
        for src_off, dst_off, length in runs:
            for start, n in _chunks(src_off, length):
                if state["error"] is not None:
                    raise state["error"]
                if stop is not None and stop.is_set():
                    raise Stopped()
                copier.copy(src_fd, dst_fd, src_off + start, dst_off + start, n, src_path)
                copied.put((src_off + start, dst_off + start, n))
                if progress:
                    progress(n)
    finally:
        copied.put(None)
        checker.join()
    if state["error"] is not None:
        raise state["error"]
    return state["bad"]


def _chunks(src_off: int, length: int):
    """(start within the run, length) of each copy call over a run starting at `src_off`: split at
    SRC's multiples of CHUNK, so that every call but the first starts on one. Where DST's data starts
    at SRC's offset (the usual case), both files' calls start on a CHUNK boundary. Measured on Linux
    6.18 (1.9 GB from the page cache): CHUNK steps from a data section starting at byte 1632 or 65536
    ran at `cp`'s speed, from byte 4096, 5000 or 12000 1.4x slower; split at CHUNK boundaries, all at
    `cp`'s speed. (The kernel copies in 64 kB rounds from where each call starts.)"""
    start = 0
    while start < length:
        n = min(CHUNK - (src_off + start) % CHUNK, length - start)
        yield start, n
        start += n


def _differing(got, want, base: int, block: int = 4096) -> list[tuple[int, int]]:
    """The exact byte ranges where two equal-length buffers differ (only run when they do)."""
    ranges = []
    for i in range(0, len(got), block):
        if got[i:i + block] == want[i:i + block]:
            continue
        for k in range(i, min(len(got), i + block)):
            if got[k] != want[k]:
                if ranges and ranges[-1][1] == base + k:
                    ranges[-1] = (ranges[-1][0], base + k + 1)
                else:
                    ranges.append((base + k, base + k + 1))
    return ranges


def _read_exactly(fd: int, offset: int, buffer: bytearray, n: int, path) -> bytes | bytearray:
    """`n` bytes at `offset`, in `buffer` (whole) or a slice of it (the last, short chunk)."""
    view = memoryview(buffer)
    got = 0
    while got < n:
        k = os.preadv(fd, [view[got:n]], offset + got)
        if k == 0:
            raise RewriteError(f"{path}: ends at byte {offset + got}, before the data its header describes "
                           "(was it changed while it was copied?)")
        got += k
    return buffer if n == len(buffer) else buffer[:n]


def temp_base(dst: Path) -> str:
    """The start of every hidden folder fix makes beside DST."""
    return f".{dst.name}.draftdoctor-"


def temp_prefix(dst: Path, pid: int) -> str:
    """Temporary folders are named after DST, this host and the process, so that a later run can
    tell the folders of a killed process from those of one still running."""
    return f"{temp_base(dst)}{pid}-{os.uname().nodename}-"


def new_folder(parent: Path, prefix: str) -> Path:
    """A new folder `parent/prefix<random>`, for its owner only, as tempfile.mkdtemp makes them
    (importing tempfile took 2 ms of fix's 60 ms start-up)."""
    while True:
        folder = parent / f"{prefix}{os.urandom(6).hex()}"
        try:
            os.mkdir(folder, 0o700)
            return folder
        except FileExistsError:
            continue


def sweep_killed_runs(dst: Path) -> None:
    """Remove the temporary folders that earlier runs on this host left for DST when they were
    killed: they only ever hold unverified output. A live process's folder is left alone."""
    base = temp_base(dst)
    try:
        names = [name for name in os.listdir(dst.parent) if name.startswith(base)]
    except OSError:  # a folder we may write in but not list: nothing of ours to find
        return
    for folder in map(dst.parent.joinpath, names):
        pid = folder.name[len(base):].partition("-")[0]
        if not pid.isdigit() or not folder.name.startswith(temp_prefix(dst, int(pid))) or folder.is_symlink():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # alive, owned by someone else
            pass


def put_in_place(tmp: Path, dst: Path, replace: bool = False) -> None:
    """Rename the finished folder to DST with the permissions a new folder gets (as `mkdir` under the
    umask); never over something else: with `replace` the old DST is moved aside first and removed
    only once the new one is in place. Whatever appears at DST meanwhile (another run, a user) is
    left alone: RewriteError."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    old = None
    if replace and os.path.lexists(dst):
        old = new_folder(dst.parent, f"{temp_base(dst)}old-")
        os.rename(dst, old / dst.name)
    try:
        rename_noreplace(tmp, dst)
    except BaseException:
        if old is not None:
            rename_noreplace(old / dst.name, dst)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


_RENAME_NOREPLACE, _AT_FDCWD = 1, -100


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename that fails, atomically, when DST exists (Linux renameat2 RENAME_NOREPLACE; elsewhere,
    or on a file system without it, a check just before the rename)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.renameat2
    except (OSError, AttributeError):
        call = None
    if call is not None:
        if call(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise RewriteError(f"{dst}: appeared while this run wrote its output (another run, or a user?); "
                               "left as it is, and nothing was put in its place")
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        raise RewriteError(f"{dst}: appeared while this run wrote its output (another run, or a user?); "
                           "left as it is, and nothing was put in its place")
    os.rename(src, dst)


def copy_regular_file(src: Path, dst: Path) -> None:
    """Copy a regular file without following a link at `src` (one swapped in since it was planned is
    refused, not followed)."""
    import stat

    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RewriteError(f"{src}: became a symbolic link since the plan; not followed") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RewriteError(f"{src}: not a regular file; not copied")
        with open(dst, "xb") as out:
            shutil.copyfileobj(f, out)
