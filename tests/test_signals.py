"""SIGTERM or SIGHUP to a command that started a server (timeout(1), a closed terminal, a job system)
stops the server too: no orphan keeps its port or its memory. An interrupted command names the signal;
work run outside the terminal's foreground group is never stopped by the terminal's job control, and a
signal the command started with ignored (nohup, `&` in a script) stays ignored."""

import ast
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"


def processes_with(text: str, *more: str) -> list[int]:
    """Pids whose command line contains `text` (and each of `more`)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and all(t in cmdline for t in more):
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
        said = proc.stderr.read().splitlines()
        assert said[-1] == f"draftdoctor: interrupted by {signum.name} (anything half-written was removed)", said
    finally:
        proc.kill()
        proc.wait()


def test_a_signal_ignored_at_start_stays_ignored(tmp_path):
    """`nohup` starts a command with SIGHUP ignored, a shell without job control starts `cmd &` with SIGINT
    ignored: the terminal's hang-up or Ctrl-C must not end it (the kit had re-armed both). The server
    it started goes on serving; SIGTERM still stops both."""
    def ignoring():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-m", "draftdoctor.cli", "serve", "--model-path", DEMO / "target",
                             "--speculative-draft-model-path", DEMO / "draft-story", "--log", tmp_path / "s.log"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignoring)
    try:
        line = proc.stdout.readline()
        port = re.search(r"ready at http://127\.0\.0\.1:(\d+)", line)
        assert port, line + proc.stderr.read()
        proc.send_signal(signal.SIGHUP)  # discarded by the kernel when ignored; else pending before SIGTERM
        proc.send_signal(signal.SIGINT)
        assert processes_with(f"--port {port.group(1)}") and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert proc.stderr.read().splitlines()[-1].startswith("draftdoctor: interrupted by SIGTERM")
        assert gone(f"--port {port.group(1)}")
    finally:
        proc.kill()
        proc.wait()


# Runs COMMAND in a session whose controlling terminal is the pty named by argv[1], with `stty tostop`
# (a job outside the terminal's foreground group that writes to it is stopped), either in a background
# process group of its own ("background": `cmd &` in an interactive shell) or as it is (`timeout` puts
# itself and its command in a group of their own): prints how it ended, or that it was stopped.
IN_A_TERMINAL = """
import os, signal, subprocess, sys, termios
terminal = os.open(sys.argv[1], os.O_RDWR)  # the session's leader opens it: its controlling terminal
mode = termios.tcgetattr(terminal)
mode[3] |= termios.TOSTOP
termios.tcsetattr(terminal, termios.TCSANOW, mode)
child = subprocess.Popen(sys.argv[3:], stdin=terminal, stdout=terminal, stderr=terminal,
                         process_group=0 if sys.argv[2] == "background" else None)
_, status = os.waitpid(child.pid, os.WUNTRACED)
if os.WIFSTOPPED(status):
    print("stopped by", signal.Signals(os.WSTOPSIG(status)).name, flush=True)
    os.kill(child.pid, signal.SIGKILL)
    os.waitpid(child.pid, 0)
else:
    print("exit", os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.parametrize("how", ["background", "timeout"])
def test_work_outside_the_terminals_foreground_is_not_stopped_by_it(tmp_path, how):
    """Reliability IV item 10: a command in a background process group of its terminal (`&`, or under
    `timeout`, which makes a group of its own) that writes to the terminal was stopped by SIGTTOU (with
    `stty tostop`); under timeout for good, as timeout's SIGTERM and SIGCONT only woke it to stop again
    writing that it was interrupted. It now writes and ends. (Under timeout, a command stopped that way
    would end only by timeout's -k KILL, a minute later.)"""
    master, slave = os.openpty()  # the slave end stays open here until the command is done
    terminal = os.ttyname(slave)
    shown = []

    def drain():  # the terminal's screen: read until every end of the terminal is closed
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    command = [sys.executable, "-m", "draftdoctor.cli", "inspect", str(DEMO / "draft-story")]
    if how == "timeout":
        command = ["timeout", "-k", "5", "60", *command]
    try:
        done = subprocess.run([sys.executable, "-c", IN_A_TERMINAL, terminal, how, *command], capture_output=True,
                              text=True, timeout=300, start_new_session=True)
    finally:
        os.close(slave)
        reader.join(30)
        os.close(master)
    assert done.stdout.strip() == "exit 0", done.stdout + done.stderr
    assert "layers.0.self_attn" in b"".join(shown).decode(errors="replace")


def test_no_child_the_kit_starts_reads_its_terminal():
    """Every process lib/ starts gets its input from /dev/null (or a pipe), never the terminal the kit
    was started from: a child in another session or group would otherwise read the user's keystrokes,
    or be stopped reading them."""
    calls = []
    for path in (ROOT / "lib" / "draftdoctor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"
                    and node.func.attr in ("run", "Popen", "call", "check_call", "check_output")):
                if not {k.arg for k in node.keywords} & {"stdin", "input"}:
                    calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls == []


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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_an_interrupted_bench_stops_at_once(tmp_path, signum, concurrency):
    """Reliability III item 6: Ctrl-C or SIGTERM while bench sends its prompts stops it within seconds
    (it had waited for the requests in flight and then run every queued prompt), its server too."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time there was a little draft model\n" * 2000)
    proc = subprocess.Popen([sys.executable, "-m", "draftdoctor.cli", "bench", "--target", DEMO / "target", "--draft",
                             f"d={DEMO / 'draft-story'}", "--out", tmp_path / "out", "--prompts", prompts,
                             "--concurrency", str(concurrency)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while "d: 1/2000 requests" not in (line := proc.stderr.readline()):
            assert line, "bench ended before its first request"
        marker = str(tmp_path / "out")
        sent = time.monotonic()
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 128 + signum
        assert time.monotonic() - sent < 10
        assert "Traceback" not in proc.stderr.read()
        assert gone("draftdoctor.reference.server") or not any(marker in open(f"/proc/{p}/cmdline").read()
                                                                for p in processes_with("draftdoctor.reference.server"))
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("when", ["after the package import", "after the command's imports", "while parsing"])
def test_ctrl_c_while_the_command_starts_is_one_line(when):
    """Ctrl-C while the command imports and parses its arguments (it had given a traceback): one line,
    exit 130. The signal is sent by the process itself at each point, so the test is exact."""
    steps = {"after the package import": "import draftdoctor; interrupt(); from draftdoctor.cli import entry",
             "after the command's imports": "from draftdoctor.cli import entry; interrupt()",
             "while parsing": "from draftdoctor import cli; cli.build_parser = interrupting(cli.build_parser); "
                              "from draftdoctor.cli import entry"}
    code = ("import os, signal, sys; sys.argv = ['draftdoctor', 'inspect', %r]\n"
            "def interrupt(): os.kill(os.getpid(), signal.SIGINT)\n"
            "def interrupting(f): return lambda *a, **k: (interrupt(), f(*a, **k))[1]\n"
            "%s\nentry()\n") % (str(DEMO / "draft-story"), steps[when])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (130, "draftdoctor: interrupted by SIGINT\n")


def test_serve_on_every_interface_says_what_it_exposes(tmp_path):
    """Reliability III item 14: `serve --host 0.0.0.0` binds every interface; it says so before starting."""
    proc = subprocess.Popen([sys.executable, "-m", "draftdoctor.cli", "serve", "--model-path", DEMO / "target",
                             "--speculative-draft-model-path", DEMO / "draft-story", "--log", tmp_path / "s.log",
                             "--host", "0.0.0.0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        warning = proc.stderr.readline()
        assert warning.startswith("draftdoctor: warning: --host 0.0.0.0 listens on every network interface")
        assert "no authentication" in warning
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_cold_real_check_takes_its_child_and_files_with_it(tmp_path, signum):
    """Reliability III item 10: killing a cold real check (no warm worker) ends its child too (it had
    grown on, orphaned); its temporary folder goes with it (SIGTERM) or with the next cold check (SIGKILL)."""
    from conftest import require_release

    require_release("0.5.10")
    state = tmp_path / "state"
    env = dict(os.environ, DRAFTDOCTOR_REALLOAD_WORKER="0", DRAFTDOCTOR_REALLOAD_STATE=str(state))
    command = [sys.executable, "-m", "draftdoctor.cli", "check", DEMO / "draft-story", "--engine", "sglang==0.5.10",
               "--loader", "real"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (child := _children(proc.pid)):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        time.sleep(1.0)  # the child is importing SGLang
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == (-9 if signum == signal.SIGKILL else 128 + signum)
        deadline = time.monotonic() + 15
        while _alive(child[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child[0]), "the cold child outlived its caller"
    finally:
        proc.kill()
        proc.wait()
    left = list(state.glob("cold-*"))
    if signum == signal.SIGTERM:
        assert left == []
    else:
        assert left, "the killed caller could not remove it"
        again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 1 and "decoder layer" in again.stdout, again.stderr
        assert list(state.glob("cold-*")) == []


def test_an_interrupted_conversion_leaves_nothing_in_the_cache(tmp_path):
    """A partial GGUF of a conversion that was stopped is removed, now or, if its process was killed,
    by the next conversion (the CLI had said 'anything half-written was removed' while it stayed)."""
    import shutil

    from draftdoctor.serving import llamacpp

    from conftest import require_release

    require_release("0.3.36", "llamacpp")
    target = Path(shutil.copytree(DEMO / "target", tmp_path / "target"))
    (target / "generation_config.json").write_text("{}")  # another fingerprint: a fresh conversion
    stale = llamacpp.GGUF_CACHE / "left-by-a-killed-run.partial-999999999"
    llamacpp.GGUF_CACHE.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"half")
    proc = subprocess.Popen([sys.executable, "-m", "draftdoctor.cli", "bench", "--backend", "llamacpp", "--target",
                             target, "--draft", f"d={DEMO / 'draft-speculators'}", "--out", tmp_path / "out"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600  # a hang's bound only: a busy machine takes its time to get there
        while not processes_with("convert_hf_to_gguf.py", str(target)):  # converting: one scan of /proc a turn
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert not stale.exists()
    assert list(llamacpp.GGUF_CACHE.glob(f"{target.name}-*.partial-*")) == []
