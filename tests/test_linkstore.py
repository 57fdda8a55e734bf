"""The release folders' shared files kept once (realload/linkstore.py): real hard links on this disk,
concurrent installs, pruning; and CI's installed releases linked by `make test`'s set-up."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import releases_under_test, require_release

from draftdoctor.realload import release_env
from draftdoctor.realload.linkstore import link, prune


def release(folder: Path, files: dict) -> Path:
    for name, (body, mode) in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        path.chmod(mode)
    return folder


def test_shared_files_become_one_inode_and_keep_their_bytes(tmp_path):
    store = tmp_path / "store"
    a = release(tmp_path / "a", {"pkg/same.py": (b"x = 1\n" * 1000, 0o644), "pkg/only_a.py": (b"a\n", 0o644),
                                 "bin/tool": (b"#!/bin/sh\n", 0o755), "empty.txt": (b"", 0o644)})
    b = release(tmp_path / "b", {"pkg/same.py": (b"x = 1\n" * 1000, 0o644), "pkg/only_b.py": (b"b\n", 0o644),
                                 "bin/tool": (b"#!/bin/sh\n", 0o644), "empty.txt": (b"", 0o644)})
    assert link(store, a) == (0, 0)  # the first release only fills the store
    assert link(store, b) == (1, 6000)
    assert os.path.samefile(a / "pkg/same.py", b / "pkg/same.py")
    assert (b / "pkg/same.py").read_bytes() == b"x = 1\n" * 1000
    assert not os.path.samefile(a / "bin/tool", b / "bin/tool"), "a different mode is a different file"
    assert (a / "bin/tool").stat().st_mode & 0o777 == 0o755 and (b / "bin/tool").stat().st_mode & 0o777 == 0o644
    assert (a / "pkg/only_a.py").stat().st_nlink == 2  # itself and its store entry
    assert not list(tmp_path.rglob(".*.linkstore")), "no spare link may be left behind"
    assert link(store, b) == (0, 0), "a rerun changes nothing"


def test_entries_no_release_uses_are_pruned_and_the_others_kept(tmp_path):
    store = tmp_path / "store"
    a = release(tmp_path / "a", {"same": (b"shared", 0o644), "mine": (b"only a", 0o644)})
    b = release(tmp_path / "b", {"same": (b"shared", 0o644)})
    link(store, a), link(store, b)
    for path in a.iterdir():
        path.unlink()
    assert prune(store) == 1  # "only a"; "shared" is still b's
    assert (b / "same").read_bytes() == b"shared" and (b / "same").stat().st_nlink == 2


def test_concurrent_installs_share_one_copy(tmp_path):
    store = tmp_path / "store"
    files = {f"pkg/m{i}.py": (f"value = {i}\n".encode() * 200, 0o644) for i in range(200)}
    folders = [release(tmp_path / f"r{n}", files) for n in range(4)]
    procs = [subprocess.Popen([sys.executable, "-m", "draftdoctor.realload.linkstore", str(store), str(f)],
                              stdout=subprocess.DEVNULL) for f in folders]
    assert [p.wait() for p in procs] == [0] * 4
    for name in files:
        assert len({(f / name).stat().st_ino for f in folders}) == 1, name
        assert (folders[0] / name).stat().st_nlink == 5  # four releases and the store


def test_the_installed_releases_are_linked_to_the_store():
    """`make test`'s set-up links each release it installs: every file it installed (not the bytecode
    written since by imports) is a link to the store."""
    for engine in ("sglang", "vllm"):
        for version in releases_under_test(engine):
            require_release(version, engine)
            folder = release_env(version, engine)
            unlinked = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_size
                        and "__pycache__" not in p.parts and p.stat().st_nlink < 2]
            assert not unlinked, f"{engine} {version}: {len(unlinked)} files not in the store, e.g. {unlinked[:3]}"


def test_a_file_that_is_a_store_entry_already_is_not_read_again(tmp_path, monkeypatch):
    """A release installed by linking another's files (realload.reuse) holds store entries already: known
    by their inode, they are not hashed again."""
    from draftdoctor.realload import linkstore

    store = tmp_path / "store"
    a = release(tmp_path / "a", {"pkg/same.py": (b"x = 1\n" * 1000, 0o644)})
    link(store, a)
    b = release(tmp_path / "b", {"pkg/new.py": (b"new\n", 0o644)})
    os.link(a / "pkg/same.py", b / "pkg/same.py")
    hashed, real = [], linkstore._entry

    def entry(store, path, mode):
        hashed.append(path.name)
        return real(store, path, mode)

    monkeypatch.setattr(linkstore, "_entry", entry)
    assert link(store, b) == (0, 0) and hashed == ["new.py"]
    assert (b / "pkg/new.py").stat().st_nlink == 2 and (b / "pkg/same.py").stat().st_nlink == 3
