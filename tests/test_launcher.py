"""The launcher: SGLang command lines per release, and process handling on real child processes."""

import os
import socket
import subprocess
import sys
import time

import pytest

from draftdoctor.serving.launcher import (
    READY_LINE, PortBusy, Server, ServeConfig, ServerCrashed, ServerHung, launch_args, server_command,
)
from draftdoctor.serving.ports import free_port
from draftdoctor.engines import resolve_engine


def test_sglang_command_for_the_story():
    config = ServeConfig(target="/m/kimi", draft="/m/draft", num_steps=4, topk=1, num_draft_tokens=5, port=30000,
                         tp_size=8, disable_cuda_graph=True)
    argv = server_command("sglang", config, engine=resolve_engine("sglang==0.5.10"), python="python")
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    joined = " ".join(argv)
    assert "--model-path /m/kimi --speculative-algorithm EAGLE3 --speculative-draft-model-path /m/draft" in joined
    assert "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5" in joined
    assert "--host 127.0.0.1 --port 30000" in joined and "--tp-size 8" in joined
    assert argv[-1] == "--disable-cuda-graph"


@pytest.mark.parametrize("release, disable, max_bs", [
    ("0.4.8", ["--disable-cuda-graph"], "--cuda-graph-max-bs"),
    ("0.5.14", ["--disable-cuda-graph"], "--cuda-graph-max-bs"),
    ("0.5.15", ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"],
     "--cuda-graph-max-bs-decode"),
    ("0.5.23", ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"],
     "--cuda-graph-max-bs-decode"),
])
def test_cuda_graph_flags_follow_the_release(release, disable, max_bs):
    args = launch_args(ServeConfig("t", "d", disable_cuda_graph=True, cuda_graph_max_bs=8), release)
    assert args[-len(disable) - 2:-2] == disable and args[-2:] == [max_bs, "8"]


def test_multi_node_flags_pass_through():
    config = ServeConfig("t", "d", tp_size=16, dp_size=2, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000",
                         extra_args=["--enable-metrics", "--decode-log-interval", "10"])
    args = launch_args(config, "0.5.23")
    for pair in (["--tp-size", "16"], ["--dp-size", "2"], ["--nnodes", "2"], ["--node-rank", "1"],
                 ["--dist-init-addr", "10.0.0.1:5000"]):
        i = args.index(pair[0])
        assert args[i:i + 2] == pair
    assert args[-3:] == ["--enable-metrics", "--decode-log-interval", "10"]


def test_spec_flags_all_or_none():
    with pytest.raises(ValueError, match="together"):
        launch_args(ServeConfig("t", "d", num_steps=4, topk=None))
    args = launch_args(ServeConfig("t", "d", num_steps=None, topk=None, num_draft_tokens=None))
    assert "--speculative-num-steps" not in args and "--speculative-algorithm" in args


# a fake server's first lines: listen on the port it is given (a server is ready only once it holds its port)
LISTEN = ("import socket, sys\n_listening = socket.socket()\n"
          "_listening.bind(('127.0.0.1', int(sys.argv[1])))\n_listening.listen()\n")


def _python(tmp_path, code, listen=True):
    """A fake server: a function of the port giving its argv (the launcher's port 0 chooses one)."""
    script = tmp_path / "fake_server.py"
    script.write_text((LISTEN if listen else "") + code)
    return lambda port: [sys.executable, str(script), str(port)]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_ready_by_log_line_and_stop_leaves_no_process(tmp_path):
    argv = _python(tmp_path, f"""
import subprocess, sys, time
child = subprocess.Popen(["sleep", "600"])
print("child", child.pid, flush=True)
print({READY_LINE!r}, flush=True)
time.sleep(600)
""")
    server = Server(argv, tmp_path / "server.log", "127.0.0.1", 0)
    with server:
        leader = server.process.pid
        time.sleep(0.2)
        child = int(next(l for l in (tmp_path / "server.log").read_text().splitlines() if l.startswith("child")).split()[1])
        assert _alive(leader) and _alive(child)
    assert not _alive(leader) and not _alive(child)


def test_a_ready_line_without_the_port_is_not_ready(tmp_path):
    """A process that says it is ready but does not listen on its port is not the server (hang, not ready)."""
    argv = _python(tmp_path, f"import time\nprint({READY_LINE!r}, flush=True)\ntime.sleep(600)\n", listen=False)
    with pytest.raises(ServerHung):
        with Server(argv, tmp_path / "server.log", "127.0.0.1", 0, hang_timeout=1.5):
            pass


def test_sigterm_ignoring_server_is_killed(tmp_path):
    argv = _python(tmp_path, f"""
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print({READY_LINE!r}, flush=True)
time.sleep(600)
""")
    server = Server(argv, tmp_path / "server.log", "127.0.0.1", 0).start()
    server.wait_ready()
    pid = server.process.pid
    started = time.monotonic()
    server.stop(grace=0.5)
    assert not _alive(pid) and time.monotonic() - started < 5


def test_crash_at_start_up_reports_last_log_lines(tmp_path):
    argv = _python(tmp_path, "import sys\nprint('loading draft', flush=True)\nraise SystemExit('CUDA error: no device')\n")
    with pytest.raises(ServerCrashed) as e:
        with Server(argv, tmp_path / "server.log", "127.0.0.1", 0):
            pass
    assert "exited with status 1" in str(e.value) and "CUDA error: no device" in str(e.value)


def test_hang_at_start_up_is_detected_and_stopped(tmp_path):
    argv = _python(tmp_path, "import time\nprint('Capture cuda graph begin', flush=True)\ntime.sleep(600)\n")
    server = Server(argv, tmp_path / "server.log", "127.0.0.1", 0, hang_timeout=1.5)
    with pytest.raises(ServerHung) as e:
        with server:
            pass
    assert "Capture cuda graph begin" in str(e.value)
    assert server.process is None


def test_busy_port_is_refused_before_starting(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = Server([sys.executable, "-c", "pass"], tmp_path / "server.log", "127.0.0.1", port)
        with pytest.raises(PortBusy, match=str(port)):
            server.start()
        assert server.process is None


# --- the SGLang command, proven by SGLang's own parser ---

from pathlib import Path  # noqa: E402

from conftest import releases_under_test, require_release  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
CLI = Path(sys.executable).with_name("draftdoctor")


@pytest.mark.parametrize("release", releases_under_test("sglang"))
def test_sglang_accepts_the_command_the_kit_builds_and_refuses_a_misspelled_flag(release):
    """Each CI release's own prepare_server_args and checks, on this CPU: the command `serve` and `bench`
    run, with the release's CUDA-graph flags spelled for it, is accepted; a misspelled pass-through
    flag is refused in SGLang's words."""
    from draftdoctor.realload import parse_launch

    require_release(release)
    config = ServeConfig(target=str(DEMO / "target"), draft=str(DEMO / "draft-story"), num_steps=4, topk=1,
                         num_draft_tokens=5, port=30000, disable_cuda_graph=True, cuda_graph_max_bs=8,
                         extra_args=["--enable-metrics"])
    argv = server_command("sglang", config, engine=resolve_engine(f"sglang=={release}"))[3:]
    assert set(launch_args(config, release)) <= set(argv)
    accepted, misspelled = parse_launch(release, [argv, argv + ["--enable-metricz"]])
    assert accepted["accepted"], accepted
    assert not misspelled["accepted"] and misspelled["stage"] == "parser"
    assert "unrecognized arguments: --enable-metricz" in misspelled["message"]


@pytest.mark.parametrize("release", ["0.5.10", "0.5.23"])
def test_serve_dry_run_prints_the_command_and_sglangs_verdict(release):
    require_release(release)
    base = [CLI, "serve", "--backend", "sglang", "--engine", f"sglang=={release}", "--model-path", DEMO / "target",
            "--speculative-draft-model-path", DEMO / "draft-story", "--dry-run"]
    refused = subprocess.run([*base, "--", "--speculative-num-stepz", "3"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1, refused.stderr
    command, *_, verdict = refused.stdout.strip().splitlines()
    assert "-m sglang.launch_server --model-path" in command and "--speculative-num-stepz 3" in command
    assert verdict == (f"refused by SGLang {release}'s own parser: unrecognized arguments: "
                       "--speculative-num-stepz 3")


def test_bench_on_sglang_is_refused_by_sglangs_parser_before_launching(tmp_path):
    """No SGLang can serve here, so a launch would fail anyway; the refusal comes first, in SGLang's words."""
    require_release("0.5.10")
    out = tmp_path / "out"
    run = subprocess.run([CLI, "bench", "--backend", "sglang", "--engine", "sglang==0.5.10", "--target", DEMO / "target",
                          "--draft", f"a={DEMO / 'draft-story'}", "--out", out, "--", "--enable-metricz"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert "SGLang 0.5.10 refused the command at its parser: unrecognized arguments: --enable-metricz" in run.stderr
    assert not (out / "server-a.log").exists(), "nothing was launched"
