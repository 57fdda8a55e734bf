"""`fix` under real faults: a full disk, a read-only destination, a SIGKILL midway.

After each, SRC is unchanged and DST is absent (or complete and verified), never partial. The disk
faults use real size-limited / read-only tmpfs mounts (the tests run as root, as CI does).
"""

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftdoctor.synth import DraftShape, write_draft

MiB = 1 << 20


def fingerprint(folder: Path) -> dict:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir())}


@pytest.fixture
def mount(tmp_path):
    mounted = []

    def make(name, options):
        point = tmp_path / name
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True)
        if proc.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"cannot mount a tmpfs in CI: {proc.stderr.strip()}")
            pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def fix_cli(src, dst, *extra):
    return subprocess.run([sys.executable, "-m", "draftdoctor.cli", "fix", str(src), "--engine", "sglang==0.5.10",
                           "--out", str(dst), *extra], capture_output=True, text=True)


@pytest.fixture
def draft_4mb(tmp_path):
    return write_draft(tmp_path / "src", DraftShape(hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=1024,
                                                    vocab=4096, draft_vocab=1024, target_hidden=256),
                       layout="speculators", config="flat")


def test_disk_full_leaves_no_destination_and_source_untouched(draft_4mb, mount):
    before = fingerprint(draft_4mb)
    small = mount("small", "size=1m")
    proc = fix_cli(draft_4mb, small / "fixed")
    assert proc.returncode == 2 and "No space left on device" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert list(small.iterdir()) == [], "nothing half-written may remain"
    assert fingerprint(draft_4mb) == before


def test_a_disk_that_fills_during_the_copy_leaves_no_destination(draft_4mb, mount, monkeypatch):
    """What a disk filled by another writer after fix looked for room does (fix now refuses a copy the file
    system has no room for before writing, so the room is made to look ample here)."""
    from draftdoctor.fix import FixError, apply_fix, plan_fix

    before = fingerprint(draft_4mb)
    small = mount("small", "size=1m")
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((4096, 4096, 1 << 30, 1 << 30, 1 << 30,
                                                                       *tuple(real(path))[5:])))
    plan = plan_fix(draft_4mb, "sglang==0.5.10", predict=False)
    with pytest.raises(FixError, match="No space left on device"):
        apply_fix(plan, small / "fixed")
    assert list(small.iterdir()) == [], "nothing half-written may remain"
    assert fingerprint(draft_4mb) == before


def test_read_only_destination_fails_cleanly(draft_4mb, mount):
    before = fingerprint(draft_4mb)
    ro = mount("ro", "ro,size=64m")
    proc = fix_cli(draft_4mb, ro / "fixed")
    assert proc.returncode == 2 and "Read-only file system" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert list(ro.iterdir()) == []
    assert fingerprint(draft_4mb) == before


def test_sigkill_midway_leaves_no_destination_and_a_rerun_succeeds(tmp_path):
    # big enough that the copy takes a while (140 MB of random data: about 0.5 s, a hundred polls), small
    # enough that source, killed copy and rerun fit beside the rest of the suite on CI's disk
    src = write_draft(tmp_path / "src", DraftShape(hidden=1024, heads=16, kv_heads=4, head_dim=64, intermediate=4096,
                                                   vocab=32768, draft_vocab=16384, target_hidden=1024),
                      layout="speculators", config="flat")
    before = fingerprint(src)
    dst = tmp_path / "out" / "fixed"
    dst.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "draftdoctor.cli", "fix", str(src), "--engine", "sglang==0.5.10",
                             "--out", str(dst)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(dst.parent.glob(".fixed.draftdoctor-*/*.safetensors")):
        time.sleep(0.005)
    assert proc.poll() is None, "fix finished before it could be killed; make the draft bigger"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not dst.exists(), "a killed fix must not leave DST"
    assert fingerprint(src) == before
    assert len(list(dst.parent.glob(".fixed.draftdoctor-*"))) == 1  # the killed run's unverified output
    rerun = fix_cli(src, dst)
    assert rerun.returncode == 0 and "verified" in rerun.stdout
    assert sorted(p.name for p in dst.parent.iterdir()) == ["fixed"]  # the rerun swept it
