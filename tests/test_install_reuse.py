"""A release installed by linking what finished release folders hold (realload.reuse, through
install.install_pins) is the folder pip alone makes: the same paths, types, modes and contents, checked
here offline with small wheels that have what real ones have (a namespace package split between wheels,
console scripts, a `#!python` script, an executable file, data pip keeps and data it leaves out); a file
that no longer matches its RECORD, a script made for another interpreter, two wheels writing one path,
and a folder being installed, unfinished or laid over are never linked from.
(benchmarks/install_reuse.py compares a real vLLM release installed both ways.)"""

import base64
import fcntl
import hashlib
import os
import stat
import zipfile
from contextlib import ExitStack
from pathlib import Path

import pytest

from draftdoctor import realload
from draftdoctor.realload import install as installing
from draftdoctor.realload import reuse


def _wheel(folder: Path, name: str, version: str, files: dict, executable=(), entry_points: str = "") -> None:
    """A wheel of `files` (path -> bytes; `executable` ones with their x bits) and its metadata."""
    dist = f"{name}-{version}.dist-info"
    files = files | {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
                     f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    if entry_points:
        files[f"{dist}/entry_points.txt"] = entry_points.encode()
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
              for path, data in files.items()] + [f"{dist}/RECORD,,"]
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path)
            info.external_attr = (0o100755 if path in executable else 0o100644) << 16
            z.writestr(info, data)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """Offline wheels: one of each kind a release's pin list brings."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(folder, "ddtiny", "1.0", {"ddtiny.py": b"VALUE = 1\n"})
    _wheel(folder, "ddtiny", "2.0", {"ddtiny.py": b"VALUE = 2\n"})
    _wheel(folder, "ddns_a", "1.0", {"ddns/a.py": b"A = 1\n"})  # one namespace package, two wheels
    _wheel(folder, "ddns_b", "1.0", {"ddns/b.py": b"B = 1\n"})
    _wheel(folder, "ddtool", "1.0", {"ddtool/__init__.py": b"def main():\n    return 0\n",
                                     "ddtool/run.sh": b"#!/bin/sh\necho run\n",
                                     "ddtool-1.0.data/scripts/ddrun": b"#!python\nprint('run')\n",
                                     "ddtool-1.0.data/data/share/ddtool/kept.txt": b"kept\n",
                                     "ddtool-1.0.data/data/lib/left_out.so": b"left out by --target\n"},
           executable={"ddtool/run.sh"}, entry_points="[console_scripts]\nddtool = ddtool:main\n")
    _wheel(folder, "ddshadow", "1.0", {"share/__init__.py": b""})  # a package named as ddtool's data folder
    _wheel(folder, "ddclash", "1.0", {"ddclash.py": b"", "ddshared.txt": b"from ddclash\n"})
    _wheel(folder, "ddother", "1.0", {"ddother.py": b"", "ddshared.txt": b"from ddother\n"})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def _pins(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / f"{name}.txt"
    path.write_text("# a pin list\n" + "\n".join(lines) + "\n")
    return path


def _install(tmp_path: Path, pins: Path, folder: Path, sources: list[Path]) -> int:
    folder.parent.mkdir(parents=True, exist_ok=True)
    return installing.install_pins(pins, folder, folder.with_name(folder.name + ".log"), "pip failed", sources=sources)


def _tree(folder: Path) -> dict:
    """Every path under `folder`: its type, mode and bytes."""
    found = {}
    for path in folder.rglob("*"):
        info = path.lstat()
        kind = "link" if stat.S_ISLNK(info.st_mode) else "dir" if stat.S_ISDIR(info.st_mode) else "file"
        found[str(path.relative_to(folder))] = (kind, stat.S_IMODE(info.st_mode),
                                                path.read_bytes() if kind == "file" else None)
    return found


B_PINS = ("ddtiny==2.0", "ddns-a==1.0", "ddns_b==1.0  # a comment pip reads too", "DDTool==1.0")


@pytest.fixture
def source(tmp_path, wheels):
    """Release A, installed by pip alone and finished: what release B links from."""
    folder = tmp_path / "releases" / "a"
    assert _install(tmp_path, _pins(tmp_path, "a", "ddtiny==1.0", "ddns-a==1.0", "ddtool==1.0"), folder, []) == 0
    (folder / realload.READY_MARKER).write_text("pins sha256 -\n")
    return folder


def test_a_release_installed_by_linking_is_the_folder_pip_alone_makes(tmp_path, source):
    pins = _pins(tmp_path, "b", *B_PINS)
    plain, linked = tmp_path / "plain" / "b", tmp_path / "linked" / "b"
    assert _install(tmp_path, pins, plain, []) == 0
    assert _install(tmp_path, pins, linked, [source]) == 2  # ddns-a and ddtool; ddtiny 2.0 and ddns-b by pip
    expected = _tree(plain)
    assert {"ddns/a.py", "ddns/b.py", "bin/ddtool", "bin/ddrun", "share/ddtool/kept.txt",
            "ddtool/run.sh"} <= expected.keys() and not [p for p in expected if "left_out" in p]
    assert expected["ddtool/run.sh"][1] & 0o111 and (expected["bin/ddtool"][2] or b"").startswith(b"#!")
    assert _tree(linked) == expected
    assert os.path.samefile(linked / "ddns/a.py", source / "ddns/a.py")
    assert os.path.samefile(linked / "bin/ddtool", source / "bin/ddtool")
    assert (linked / "ddtiny.py").read_bytes() == b"VALUE = 2\n"
    assert not list(tmp_path.glob("linked/*.pip")), "pip's folder beside is removed"


@pytest.mark.parametrize("spoil", ["content", "shebang", "mode", "missing"])
def test_a_file_that_does_not_match_its_record_is_never_linked(tmp_path, source, spoil):
    """A source file changed (its content; a script made for another interpreter, its RECORD row agreeing;
    its mode; gone): its distribution is installed by pip, and the folder is still pip's own."""
    script = source / "bin" / "ddtool"
    if spoil == "content":
        (source / "ddtool" / "__init__.py").write_bytes(b"def main():\n    return 1\n")
    elif spoil == "shebang":
        body = b"#!/elsewhere/bin/python\n" + script.read_bytes().split(b"\n", 1)[1]
        record = source / "ddtool-1.0.dist-info" / "RECORD"
        digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        rows = [f"../../bin/ddtool,sha256={digest},{len(body)}" if row.startswith("../../bin/ddtool,") else row
                for row in record.read_text().splitlines()]
        script.write_bytes(body), record.write_text("\n".join(rows) + "\n")
    elif spoil == "mode":
        (source / "ddtool" / "__init__.py").chmod(0o600)
    else:
        (source / "share" / "ddtool" / "kept.txt").unlink()
    pins = _pins(tmp_path, "b", *B_PINS)
    plain, linked = tmp_path / "plain" / "b", tmp_path / "linked" / "b"
    _install(tmp_path, pins, plain, [])
    assert _install(tmp_path, pins, linked, [source]) == 1  # ddns-a only
    assert _tree(linked) == _tree(plain)
    assert not os.path.samefile(linked / "bin" / "ddtool", script)
    (found, _), alone = reuse.plan(["ddtool==1.0"], [source]), tmp_path / "alone"
    alone.mkdir()
    assert reuse.link(found["ddtool==1.0"], alone) is False
    assert not list(alone.iterdir()), "none of its files, nor a folder made for them, is left"


def test_two_wheels_writing_one_path_are_installed_by_pip_alone(tmp_path, wheels):
    """ddclash (linked) and ddother (pip's) both install ddshared.txt: which pip keeps depends on its order,
    so the release is installed by pip alone, and is its folder."""
    a = tmp_path / "releases" / "a"
    _install(tmp_path, _pins(tmp_path, "a", "ddclash==1.0"), a, [])
    (a / realload.READY_MARKER).touch()
    pins = _pins(tmp_path, "b", "ddclash==1.0", "ddother==1.0")
    plain, linked = tmp_path / "plain" / "b", tmp_path / "linked" / "b"
    _install(tmp_path, pins, plain, [])
    assert _install(tmp_path, pins, linked, [a]) == 0
    assert _tree(linked) == _tree(plain)
    assert not os.path.samefile(linked / "ddclash.py", a / "ddclash.py")


def test_data_named_as_a_package_is_installed_by_pip_alone(tmp_path, source):
    """ddshadow's package is `share/`, the folder ddtool's data goes to: pip moves the packages into the
    target first and leaves that data out, so the whole release is pip's (linking ddtool would keep it)."""
    pins = _pins(tmp_path, "b", "ddtool==1.0", "ddshadow==1.0")
    plain, linked = tmp_path / "plain" / "b", tmp_path / "linked" / "b"
    _install(tmp_path, pins, plain, [])
    assert not (plain / "share" / "ddtool").exists() and (plain / "share" / "__init__.py").exists()
    assert _install(tmp_path, pins, linked, [source]) == 0
    assert _tree(linked) == _tree(plain)


def test_only_finished_folders_under_no_install_are_linked_from(tmp_path, source, monkeypatch):
    """The new folder's siblings and every engine's releases: a folder without its ready marker (being
    installed, or a dead install's), one whose install lock another install holds (being replaced), and
    an overlay (its package's files differ from its RECORD) are not offered; finished ones are, those
    linked to the store first, and held under their lock until the caller has linked."""
    releases = source.parent
    vllm = tmp_path / "vllm"
    (vllm / "0.32.0").mkdir(parents=True)
    (vllm / "0.32.0" / realload.READY_MARKER).touch()
    monkeypatch.setenv("DRAFTDOCTOR_VLLM_DIR", str(vllm))
    monkeypatch.setenv("DRAFTDOCTOR_SGLANG_DIR", str(tmp_path / "no-sglang"))
    for name in ("unfinished", "locked", "overlay", "linked"):
        (releases / name).mkdir()
        if name != "unfinished":
            (releases / name / realload.READY_MARKER).touch()
    (releases / "overlay" / realload.OVERLAY_RECORD).write_text("{}")
    (releases / "linked" / installing.LINKED_MARKER).touch()
    held = os.open(releases / "locked.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        with ExitStack() as locks:
            found = installing.finished_folders(releases / "new", locks)
            assert found[0] == releases / "linked" and set(found[1:]) == {source, vllm / "0.32.0"}
            other = os.open(releases / "a.lock", os.O_RDWR)
            with pytest.raises(BlockingIOError):  # held while the caller links from it
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.close(other)
        other = os.open(releases / "a.lock", os.O_RDWR)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # and released after
        os.close(other)
    finally:
        os.close(held)


def test_a_pin_is_linked_only_for_its_exact_version_and_a_supported_tag(tmp_path, source):
    """ddtiny 1.0 is installed in A: not for `ddtiny==2.0`, nor `ddtiny==1.0+cpu`; and not when its
    METADATA says another version than its folder's name, or its WHEEL names only a tag this interpreter
    cannot run."""
    lines = ["ddtiny==2.0", "ddtiny==1.0+cpu", "ddtiny==1.0.0", "ddtiny >= 1.0"]
    found, rest = reuse.plan(lines, [source])
    assert list(found) == ["ddtiny==1.0.0"] and rest == ["ddtiny==2.0", "ddtiny==1.0+cpu", "ddtiny >= 1.0"]
    info = source / "ddtiny-1.0.dist-info"
    for name, was, now in (("METADATA", "Version: 1.0", "Version: 1.1"), ("WHEEL", "py3-none-any", "cp27-cp27m-win32")):
        text = (info / name).read_text()
        (info / name).write_text(text.replace(was, now))  # its folder's name still says 1.0
        assert reuse.plan(["ddtiny==1.0"], [source]) == ({}, ["ddtiny==1.0"]), name
        (info / name).write_text(text)


def test_a_release_lock_held_elsewhere_is_waited_for_and_says_who_may_hold_it(tmp_path):
    """An install of another release holds this release's lock while it links files from it
    (`finished_folders`): the install waiting for it says so, not only "another install of it"."""
    other = os.open(tmp_path / "0.1.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)  # another open file: as another process's lock, to flock
    said = []

    def waiting():
        said.append(installing.waiting_note("vllm", "0.1"))
        os.close(other)  # that install finishes

    with installing._release_lock(tmp_path / "0.1", waiting):
        said.append("locked")
    assert said == ["waiting for vllm 0.1's install lock: another process is installing it, or installing "
                    "another release with files linked from it", "locked"]
