"""The warm real loader: one worker per release, started on first use and reused by later
calls and other processes, serving one request at a time, gone after its idle timeout with nothing left
behind, and a draft that kills it costs that call a clear error, not the next one. `check`'s default
loader is `auto`: the real one where the release is installed. Needs SGLang 0.5.10 (`make sglang-loaders`)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require_release

from draftdoctor import realload
from draftdoctor.realload import RealLoaderCrashed, pool, run_real_loader, stop_worker
from draftdoctor.synth import DraftShape, write_draft

RELEASE = "0.5.10"


@pytest.fixture
def draft(tmp_path):
    require_release(RELEASE)
    stop_worker("sglang", RELEASE)
    yield write_draft(tmp_path / "d", layout="speculators", config="flat")
    stop_worker("sglang", RELEASE)


def worker_pids() -> list[int]:
    sock = str(pool._worker_paths("sglang", RELEASE)[0]).encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if sock in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def written(report) -> set[str]:
    return {p["name"] for p in report["parameters"] if p["status"] == "written"}


def test_the_second_check_is_warm_and_says_the_same_as_a_cold_child(draft, monkeypatch):
    first = run_real_loader(draft, RELEASE)
    started = time.perf_counter()
    warm = run_real_loader(draft, RELEASE)
    assert time.perf_counter() - started < 2.0
    assert len(worker_pids()) == 1
    monkeypatch.setenv(realload.WORKER_SWITCH, "0")
    cold = run_real_loader(draft, RELEASE)
    assert written(first) == written(warm) == written(cold) and len(written(cold)) == 4
    assert [k["consumed"] for k in warm["keys"]] == [k["consumed"] for k in cold["keys"]]


def test_concurrent_callers_share_one_worker(draft):
    """Two processes at once: one starts the worker (under a lock), the other waits for it; each gets its answer."""
    code = ("import json, sys; from draftdoctor.realload import run_real_loader; "
            f"r = run_real_loader(sys.argv[1], {RELEASE!r}); print(json.dumps(sorted(p['name'] for p in r['parameters'] "
            "if p['status'] == 'written')))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(draft)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs) and outs[0] == outs[1] and len(outs[0]) == 4
    assert len(worker_pids()) == 1


class _KilledOnceAsked:
    """The connection to a worker: once the request is sent, the worker is killed (the draft "killed
    the worker" mid-load), whatever the machine's load; a timer had raced the client's connect."""

    def __init__(self, conn, pid):
        self.conn, self.pid = conn, pid

    def sendall(self, data):
        self.conn.sendall(data)
        os.kill(self.pid, signal.SIGKILL)

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_a_worker_that_dies_mid_load_is_a_clear_error_and_the_next_call_gets_a_fresh_one(draft, monkeypatch):
    run_real_loader(draft, RELEASE)  # warm
    [pid] = worker_pids()
    start = pool._start_worker
    monkeypatch.setattr(pool, "_start_worker", lambda *a: _KilledOnceAsked(start(*a), pid))
    os.kill(pid, signal.SIGSTOP)  # it cannot answer before it is killed (a stopped process's socket still accepts)
    with pytest.raises(RealLoaderCrashed, match="died while loading these checkpoints"):
        run_real_loader(draft, RELEASE)
    monkeypatch.setattr(pool, "_start_worker", start)
    assert len(written(run_real_loader(draft, RELEASE))) == 4
    assert worker_pids() and pid not in worker_pids()
    sock = pool._worker_paths("sglang", RELEASE)[0]
    assert list(sock.with_suffix(".tmp").iterdir()), "the worker's temporary files are in its own folder"
    stop_worker("sglang", RELEASE)  # SIGKILL, as a crash: nothing it wrote stays
    assert not sock.with_suffix(".tmp").exists()


def memory_mb(pid: int) -> dict:
    """VmRSS and VmHWM (peak since the last reset) of a process, in MB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: int(v.split()[0]) / 1024 for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "VmHWM")}


def test_a_warm_worker_holds_one_model_at_a_time(draft, tmp_path):
    """Each check's model is freed before the next one is built, and telling written elements from the
    sentinel copies no parameter: a worker had grown by 2 GB per 8B-target draft until CI's OOM killer
    stopped it, and its peak was three times the model (the count made an int64 copy of the embedding)."""
    shape = DraftShape(hidden=1024, heads=8, kv_heads=2, head_dim=128, intermediate=4096, vocab=128256,
                       draft_vocab=32000, target_hidden=1024)
    big = write_draft(tmp_path / "big", shape, layout="midlayer", fill="sparse")
    report = run_real_loader(big, RELEASE)
    assert report["device"] == "cpu" and not report["error"]
    sizes_mb = [p["numel"] * (4 if p["dtype"] == "float32" else 2) / 2**20 for p in report["parameters"]]
    model_mb = sum(sizes_mb)
    assert model_mb > 300
    [pid] = worker_pids()
    before = memory_mb(pid)["VmRSS"]
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak counts from here
    for _ in range(3):
        assert written(run_real_loader(big, RELEASE)) == written(report)
    after = memory_mb(pid)
    # less than one model kept (allocator slack aside); at the peak, the model, the checkpoint's tensors
    # and at most one temporary the size of the largest parameter
    assert after["VmRSS"] - before < model_mb / 2, (before, after, model_mb)
    peak_mb = model_mb + (big / "model.safetensors").stat().st_size / 2**20 + max(sizes_mb)
    assert after["VmHWM"] - before < peak_mb, (before, after, peak_mb)


def test_an_idle_worker_exits_and_leaves_nothing_behind(draft, monkeypatch):
    monkeypatch.setattr(pool, "WORKER_IDLE_S", 3.0)
    run_real_loader(draft, RELEASE)
    sock, pid_file, _ = pool._worker_paths("sglang", RELEASE)
    assert sock.exists() and pid_file.exists() and worker_pids()
    deadline = time.monotonic() + 60
    while worker_pids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not worker_pids() and not sock.exists() and not pid_file.exists()
    assert not sock.with_suffix(".tmp").exists()


def test_check_runs_the_real_loader_by_default_where_the_release_is_installed(draft, tmp_path):
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "check", str(draft), "--engine",
                           f"sglang=={RELEASE}", "--format", "json"], capture_output=True, text=True, env=env, timeout=300)
    assert json.loads(proc.stdout)["loader"] == "real"
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "check", str(draft), "--engine", "sglang==0.5.12",
                           "--format", "json"], capture_output=True, text=True, env=env, timeout=300)
    assert json.loads(proc.stdout)["loader"] == "replay"  # 0.5.12 is not installed here: the replay answers


def test_a_busy_worker_is_never_stopped_to_make_room(tmp_path, monkeypatch):
    """Reliability III item 9: with no room for another worker, the least recently used one goes only if
    no check is using it; while one is, the new release's check runs cold and says the same."""
    require_release(RELEASE)
    require_release("0.5.23")
    monkeypatch.setattr(pool, "MAX_WORKERS", 1)
    story = write_draft(tmp_path / "d", layout="speculators", config="flat")
    first = run_real_loader(story, RELEASE)  # a worker for 0.5.10
    [pid] = worker_pids()
    try:
        with pool._in_use(pool._worker_paths("sglang", RELEASE)[1]):  # a check is using it
            other = run_real_loader(story, "0.5.23")
            assert worker_pids() == [pid], "the busy worker was stopped"
            assert not pool._worker_paths("sglang", "0.5.23")[0].exists(), "0.5.23 ran cold, no worker"
        run_real_loader(story, "0.5.23")  # now idle: it makes room
        assert worker_pids() == []
        assert written(first) and written(other)
    finally:
        stop_worker("sglang", "0.5.23")
        stop_worker("sglang", RELEASE)
