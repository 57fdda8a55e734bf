"""SIGTERM or SIGHUP to a command that started a server (timeout(1), a closed terminal, a job system)
stops the server too: no orphan keeps its port or its memory."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"


def processes_with(text: str) -> list[int]:
    """Pids whose command line contains `text`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(pid))
    return found


def gone(marker: str, within: float = 15.0) -> bool:
    """Whether every process whose command line holds `marker` has ended within `within` seconds."""
    deadline = time.monotonic() + within
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_with(marker) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_serve_stops_its_server(tmp_path, signum):
    proc = subprocess.Popen([sys.executable, "-m", "draftdoctor.cli", "serve", "--model-path", DEMO / "target",
                             "--speculative-draft-model-path", DEMO / "draft-story", "--log", tmp_path / "s.log"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = re.search(r"ready at http://127\.0\.0\.1:(\d+)", line)
        assert port, line + proc.stderr.read()
        marker = f"--port {port.group(1)}"
        assert processes_with(marker), "the server runs"
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 128 + signum
        assert gone(marker)
    finally:
        proc.kill()
        proc.wait()


def test_a_server_dies_with_the_process_that_started_it(tmp_path):
    """Even SIGKILL to its owner (a notebook kernel shut down hard, an OOM kill) ends the server."""
    script = (f"import sys; from draftdoctor.serving.launcher import ServeConfig, serve\n"
              f"config = ServeConfig({str(DEMO / 'target')!r}, {str(DEMO / 'draft-story')!r})\n"
              f"server = serve('reference', config, {str(tmp_path / 's.log')!r})\n"
              f"print(server.port, flush=True)\n"
              f"import time; time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = owner.stdout.readline().strip()
        assert port.isdigit(), owner.stderr.read()
        marker = f"--port {port}"
        assert processes_with(marker)
        owner.kill()
        owner.wait()
        assert gone(marker)
    finally:
        owner.kill()


def test_the_session_sees_what_its_tests_leave_running():
    """The end-of-session check (conftest): a process a test starts is found by the session's marker,
    also once reparented (its parent gone), and not once it has ended."""
    from conftest import session_processes

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess; p = subprocess.Popen(['sleep', '60']); "
                               "print(p.pid, flush=True)"], stdout=subprocess.PIPE, text=True)
    orphan = int(parent.stdout.readline())
    parent.wait()
    try:
        assert orphan in [pid for pid, _ in session_processes()]
    finally:
        os.kill(orphan, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while orphan in [pid for pid, _ in session_processes()] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orphan not in [pid for pid, _ in session_processes()]
