"""`fix` never deletes, follows or leaks what a user owns (each way `fix` could lose a user's data), and its output
is readable as a folder the user made would be."""

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from draftdoctor import fixwrite as fixmod
from draftdoctor.fix import MARKER, FixError, apply_fix, plan_fix


def run(*args):
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", *map(str, args)], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_force_refuses_a_project_folder_and_names_what_stands_in_the_way(draft, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.json").write_text("{}")
    (project / "main.py").write_text("print('mine')")
    (project / "api.key").write_text("secret")
    before = files(project)
    code, _, err = run("fix", draft("speculators"), "--engine", "vllm", "--out", project, "--force")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "api.key" in err and "main.py" in err and "replaces only" in err
    assert files(project) == before


def test_force_replaces_its_own_output_but_not_a_file_added_to_it(draft, tmp_path):
    src, dst = draft("speculators"), tmp_path / "out"
    assert apply_fix(plan_fix(src, "vllm"), dst).ok
    assert set(json.loads((dst / MARKER).read_text())["files"]) == set(os.listdir(dst)) - {MARKER}
    assert apply_fix(plan_fix(src, "sglang==0.5.10"), dst, force=True).ok
    (dst / "notes.md").write_text("my notes")
    with pytest.raises(FixError, match="notes.md was not written by it"):
        apply_fix(plan_fix(src, "vllm"), dst, force=True)
    assert (dst / "notes.md").read_text() == "my notes"


def test_a_folder_that_appears_meanwhile_is_never_replaced(draft, tmp_path, monkeypatch):
    src, dst = draft("speculators"), tmp_path / "out"
    real_verify = fixmod._verify

    def verify_while_someone_creates_dst(*args):
        dst.mkdir()
        (dst / "theirs.txt").write_text("keep")
        return real_verify(*args)

    monkeypatch.setattr(fixmod, "_verify", verify_while_someone_creates_dst)
    with pytest.raises(FixError, match="appeared while"):
        apply_fix(plan_fix(src, "vllm"), dst)
    assert files(dst) == {"theirs.txt": b"keep"}
    assert not [p for p in tmp_path.iterdir() if ".draftdoctor-" in p.name]


def test_two_runs_to_one_destination_one_wins_the_other_fails(draft, tmp_path):
    src, dst = draft("speculators", shards=2), tmp_path / "out"
    outcomes, start = [], threading.Barrier(2)

    def one_run():
        plan = plan_fix(src, "vllm")
        start.wait()
        try:
            outcomes.append(apply_fix(plan, dst).ok)
        except FixError as e:
            outcomes.append(str(e))

    threads = [threading.Thread(target=one_run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(True) == 1, outcomes
    [failure] = [o for o in outcomes if o is not True]
    assert "already exists" in failure or "appeared while" in failure


def test_companion_links_are_not_followed(draft, tmp_path):
    src = draft("speculators")
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2")
    os.symlink(secret, src / "tokenizer.json")
    os.mkfifo(src / "pipe.txt")
    plan = plan_fix(src, "vllm")
    reasons = {f.name: (f.copy, f.reason) for f in plan.files}
    assert reasons["tokenizer.json"][0] is False and "symbolic link" in reasons["tokenizer.json"][1]
    assert reasons["pipe.txt"][0] is False and "not a regular file" in reasons["pipe.txt"][1]
    dst = tmp_path / "out"
    assert apply_fix(plan, dst).ok
    assert not (dst / "tokenizer.json").exists() and not (dst / "pipe.txt").exists()
    assert not any(b"hunter2" in p.read_bytes() or str(tmp_path).encode() in p.read_bytes()
                   for p in dst.iterdir() if p.is_file())


def test_a_hugging_face_cache_snapshot_keeps_its_companion_files(draft, tmp_path):
    made = draft("speculators")
    repo = tmp_path / "models--org--draft"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (made / "tokenizer.json").write_text('{"model": {}}')
    for i, item in enumerate(sorted(made.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        blob.write_bytes(item.read_bytes())
        os.symlink(Path("../../blobs") / blob.name, snapshot / item.name)
    plan = plan_fix(snapshot, "vllm")
    assert {f.name: f.copy for f in plan.files}["tokenizer.json"] is True
    dst = tmp_path / "out"
    assert apply_fix(plan, dst).ok and (dst / "tokenizer.json").read_text() == '{"model": {}}'
    assert not (dst / "tokenizer.json").is_symlink()


def test_a_source_shard_that_resolves_into_the_destination_is_refused(draft, tmp_path):
    made = draft("speculators")
    dst = tmp_path / "out"
    assert apply_fix(plan_fix(made, "vllm"), dst).ok  # DST: an earlier fix's output
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text((made / "config.json").read_text())
    os.symlink(dst / "model.safetensors", src / "model.safetensors")  # SRC's weights live in DST
    before = files(dst)
    with pytest.raises(FixError, match="inside"):
        apply_fix(plan_fix(src, "vllm"), dst, force=True)
    assert files(dst) == before


def test_destination_gets_the_permissions_of_a_new_folder(draft, tmp_path):
    old = os.umask(0o022)
    try:
        dst = tmp_path / "out"
        assert apply_fix(plan_fix(draft("speculators"), "vllm"), dst).ok
    finally:
        os.umask(old)
    assert stat.S_IMODE(dst.stat().st_mode) == 0o755
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in dst.iterdir())


def test_a_copy_the_file_system_has_no_room_for_is_refused_before_writing(draft, tmp_path, monkeypatch):
    """A sparse SRC holds on no disk what it claims: fix had written it out whole, with no look at the room
    left (claiming a terabyte, it would fill the disk for every user before failing)."""
    src = draft("speculators")
    plan = plan_fix(src, "vllm==0.32.0", predict=False)
    real = os.statvfs

    def full(path):  # the file system of --out with 1 kB left; others as they are
        st = real(path)
        return os.statvfs_result((st.f_bsize, 1024, st.f_blocks, 1, 1, *tuple(st)[5:])) if Path(path) == tmp_path else st

    monkeypatch.setattr(os, "statvfs", full)
    with pytest.raises(FixError, match="No space left on device: the fixed copy takes about .* more than the 1.0 kB free") as e:
        apply_fix(plan, tmp_path / "fixed")
    assert str(tmp_path / "fixed") in str(e.value)
    assert os.listdir(tmp_path) == [src.name]  # nothing written, not even the hidden folder beside DST
