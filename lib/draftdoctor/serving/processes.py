"""What a server leaves behind, removed: its process group, stopped without orphans (SIGTERM to the
whole group, then SIGKILL, until no member is left), and its private temporary folder (its TMPDIR),
with those of owners killed before they could remove theirs swept at the next start."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path



def _stop_group(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM to `process`'s group, SIGKILL after `grace` seconds, until no member is left."""
    pgid = process.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(pgid):
            break
        # The leader exited but children linger: wait briefly, then escalate.
        deadline = time.monotonic() + wait
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _group_alive(pgid):
            break


SERVER_SCRATCH = "dd-server-"  # + the owner's pid: short, for vLLM binds Unix sockets in it (107 bytes at most)


def sweep_server_scratch() -> None:
    """Remove the servers' temporary folders whose owner is gone (killed before it could): this user's
    own folders only, never through a link."""
    for stale in Path(tempfile.gettempdir()).glob(SERVER_SCRATCH + "*"):
        pid = stale.name[len(SERVER_SCRATCH):].split("-")[0]
        try:
            info = stale.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and pid.isdigit() \
                and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)


def _server_scratch() -> Path:
    """A private temporary folder for one server (its TMPDIR), in the system's temporary folder; those
    left by killed owners are removed first."""
    sweep_server_scratch()
    return Path(tempfile.mkdtemp(prefix=f"{SERVER_SCRATCH}{os.getpid()}-"))


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
