"""`fix` judges its plan while the copy is written: numpy's import, the value scan, the replay and a
prediction take their time beside the copy instead of before it, and the verification reuses the
plan's value scan (the same names over bytes compared equal). Refused, interrupted or failing while
the copy runs, nothing is left: the copy stops at its next chunk and its hidden folder is removed.
"""

import os
import subprocess
import sys
import threading

import pytest

from draftdoctor import rewriter, values
from draftdoctor.fix import FixBlocked, apply_fix, plan_fix
from draftdoctor.synth import edit_config


def _left_in(folder):
    """What fix left beside its destination: any hidden temporary folder, the destination itself."""
    return sorted(name for name in os.listdir(folder) if name.startswith((".out", "out")))


def test_the_plan_is_judged_while_the_shards_are_written_and_scanned_once(draft, tmp_path, monkeypatch):
    writing = threading.Event()
    write_shard = rewriter.write_shard
    monkeypatch.setattr(rewriter, "write_shard", lambda *a, **k: writing.set() or write_shard(*a, **k))
    scan, scans = values.scan, []
    monkeypatch.setattr(values, "scan", lambda *a, **k: scans.append(writing.wait(60)) or scan(*a, **k))
    plan = plan_fix(draft("speculators"), "sglang==0.5.10", judge=False)
    assert plan.predicted is None and plan.findings is None
    result = apply_fix(plan, tmp_path / "out")
    assert result.ok and plan.predicted is not None
    assert scans == [True]  # the plan's scan ran while a shard was being written; the verification reused it


def test_a_plan_refused_while_its_copy_is_written_leaves_nothing(draft, tmp_path):
    src = edit_config(draft("speculators"), norm_before_residual=True)  # lossy for SGLang 0.5.10
    with pytest.raises(FixBlocked) as refused:
        apply_fix(plan_fix(src, "sglang==0.5.10", judge=False), tmp_path / "out")
    assert "lossy-config" in [f.code for f in refused.value.findings]
    assert _left_in(tmp_path) == [] and not [t for t in threading.enumerate() if t.name.startswith("draftdoctor-")]


@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError])
def test_an_interrupt_or_error_while_judging_stops_the_copy_and_removes_it(draft, tmp_path, monkeypatch, raised):
    def scan(*args, **kwargs):
        raise raised()

    monkeypatch.setattr(values, "scan", scan)
    with pytest.raises(raised):
        apply_fix(plan_fix(draft("speculators"), "sglang==0.5.10", judge=False), tmp_path / "out")
    assert _left_in(tmp_path) == [] and not [t for t in threading.enumerate() if t.name.startswith("draftdoctor-")]


def test_a_refusal_outranks_an_unusable_destination(draft, tmp_path):
    """As before the overlap: a refused plan says so, whatever the destination."""
    src = edit_config(draft("speculators"), norm_before_residual=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("a user's file")
    with pytest.raises(FixBlocked):
        apply_fix(plan_fix(src, "sglang==0.5.10", judge=False), tmp_path / "out")
    assert os.listdir(tmp_path / "out") == ["mine.txt"]


@pytest.mark.parametrize("module", ["numpy", "draftdoctor.replay", "draftdoctor.realload"])
def test_the_copy_starts_before_what_only_the_judging_needs_is_imported(draft, tmp_path, module):
    """numpy's import (60-90 ms) is the largest part of fix's start-up, the replay's with the real loaders'
    client (15 ms) the next: both happen while the copy runs."""
    code = ("import sys; from draftdoctor import cli, rewriter\n"
            "enter = rewriter.Background.__enter__\n"
            f"rewriter.Background.__enter__ = lambda self: print({module!r} in sys.modules, file=sys.stderr) or enter(self)\n"
            f"sys.exit(cli.main(['fix', {str(draft('speculators'))!r}, '--engine', 'sglang==0.5.10', '--loader', "
            f"'replay', '--out', {str(tmp_path / 'out')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr.strip() == "False", proc.stderr


def test_the_loader_that_verifies_dst_is_chosen_once_while_the_copy_is_written(draft, tmp_path, monkeypatch):
    """`--loader auto` asks whether the release is installed here (every release folder's trust is read)
    beside the copy, not after it, and only once: the verification uses that choice (here the replay,
    so that no real loader is needed)."""
    from draftdoctor import diagnose

    chosen, asked, calls = diagnose.chosen_loader, threading.Event(), []

    def choose(engine, loader):
        if loader != "auto":  # the plan's own check: always the replay
            return chosen(engine, loader)
        calls.append(engine.spec)
        asked.set()
        return "replay"

    monkeypatch.setattr(diagnose, "chosen_loader", choose)
    write_shard, waited = rewriter.write_shard, []
    monkeypatch.setattr(rewriter, "write_shard", lambda *a, **k: waited.append(asked.wait(10)) or write_shard(*a, **k))
    result = apply_fix(plan_fix(draft("speculators"), "sglang==0.5.10", loader="auto", judge=False), tmp_path / "out")
    assert result.ok and result.verification.coverage is not None
    assert calls == ["sglang==0.5.10"]  # asked once: the verification used the choice
    assert waited == [True]  # the shard's copy waited for the choice, so it was made while the copy ran
