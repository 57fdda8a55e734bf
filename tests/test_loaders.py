"""`draftdoctor loaders`: the engines' own loaders listed and installed from the command line, with the
same refusals, pins and self-check as `make sglang-loaders` (one implementation: realload/install.py).

A real install's success is what `make test` runs for each of CI's releases (the Makefile calls the same
module); here, without the network, the refusals and a failed self-check that leaves no ready marker.
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from draftdoctor import realload
from draftdoctor.realload import registry
from draftdoctor.errors import UserError
from draftdoctor.realload import install as installing

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "draftdoctor.cli", "loaders", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_list_names_every_release_with_a_pin_list_and_whether_it_is_installed(monkeypatch, tmp_path):
    done = cli("list")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    listed = {(r[0], r[1]): r[2] for r in rows}
    for name, row in realload.REAL_LOADERS.items():
        installed = set(realload.installed_releases(name))
        for release in row.releases:
            assert listed[(name, release)] == ("yes" if release in installed else "no")
    assert len(listed) == sum(len(row.releases) for row in realload.REAL_LOADERS.values())


@pytest.mark.parametrize("spec, said", [
    ("sglang==0.1", "sglang==0.1 has no pin list; known releases: 0.4.4.post4"),
    ("sglang", "sglang: name a release"),
    ("llamacpp==0.3.36", "llama.cpp is built"),
    ("tensorrt==1.0", "tensorrt: no pinned real loaders"),
])
def test_install_refuses_what_it_cannot_install_in_one_line(spec, said):
    done = cli("install", spec)
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_pin_list_that_would_replace_the_cpu_torch_is_refused(monkeypatch, tmp_path):
    (tmp_path / "vllm-requirements-0.32.0.txt").write_text("numpy==2.2.6\ntorchaudio==2.9.0\n")
    monkeypatch.setattr(installing, "HERE", tmp_path)
    with pytest.raises(UserError, match=r"vllm-requirements-0\.32\.0\.txt: pins what the kit never installs.*torchaudio"):
        installing.install("vllm", "0.32.0", folder=tmp_path / "never")
    assert not (tmp_path / "never").exists()


def _tiny_wheel(folder: Path, name: str = "ddtiny", version: str = "1.0") -> None:
    """A one-module wheel, made by hand: what pip installs offline."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": b"VALUE = 1\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
              for path, data in files.items()] + [f"{dist}/RECORD,,"]
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")


def test_a_release_that_fails_its_self_check_is_never_marked_ready(monkeypatch, tmp_path):
    """pip installs the pins (offline: a tiny wheel), the self-check finds no SGLang in the folder: the
    install fails naming the log, with its tail, and the folder has no ready marker, so no check uses it."""
    wheels, pins = tmp_path / "wheels", tmp_path / "pins"
    wheels.mkdir(), pins.mkdir()
    _tiny_wheel(wheels)
    (pins / "requirements-0.5.10.txt").write_text("ddtiny==1.0\n")
    monkeypatch.setattr(installing, "HERE", pins)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    folder = tmp_path / "releases" / "0.5.10"
    with pytest.raises(installing.InstallFailed, match=r"self-check failed \(the folder is not marked ready\)") as e:
        installing.install("sglang", "0.5.10", folder=folder, link=False)
    assert (folder / "ddtiny.py").is_file()  # pip ran, from the pin list
    assert not (folder / realload.READY_MARKER).exists()
    assert str(folder.with_name("0.5.10.log")) in str(e.value)
    monkeypatch.setenv("DRAFTDOCTOR_SGLANG_DIR", str(folder.parent))
    assert "0.5.10" not in realload.installed_releases("sglang")


def test_make_installs_releases_through_the_same_module():
    for mk, engine in (("sglang.mk", "sglang"), ("vllm.mk", "vllm")):
        text = (ROOT / "mk" / mk).read_text()
        assert f"-m draftdoctor.realload.install {engine} $* --folder $(@D)" in text
        assert not [line for line in text.splitlines() if line.startswith("\t") and "pip install" in line]


def _offline_release(monkeypatch, tmp_path, pins: str = "ddtiny==1.0\n") -> Path:
    """sglang 0.5.10's pin list replaced by one pip installs offline (a tiny wheel); its folder."""
    wheels, lists = tmp_path / "wheels", tmp_path / "pins"
    wheels.mkdir(exist_ok=True), lists.mkdir(exist_ok=True)
    _tiny_wheel(wheels)
    (lists / "requirements-0.5.10.txt").write_text(pins)
    monkeypatch.setattr(installing, "HERE", lists)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return tmp_path / "releases" / "0.5.10"


def _self_check_imports_ddtiny(monkeypatch, folder: Path, before_check=lambda: None, before_pip=lambda: None):
    """pip runs for real; the self-check imports from the folder what pip put there (as SGLang's import
    does in the real one). Returns the names of the threads whose install ran pip."""
    real_run, pip_runs = installing._run, []

    def run(command, log, failure):
        if command[1:3] == ["-m", "pip"]:
            pip_runs.append(threading.current_thread().name)
            before_pip()
            return real_run(command, log, failure)
        before_check()
        return real_run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(folder)!r}); import ddtiny"],
                        log, failure)

    monkeypatch.setattr(installing, "_run", run)
    return pip_runs


def test_two_installs_of_a_release_at_once_keep_the_finished_one(monkeypatch, tmp_path):
    """Reliability IV item 9: a second install of a release started while the first runs its self-check
    (it had removed the first one's folder then: "self-check failed ... No module named ...") waits for
    the first, finds its folder finished for the same pins and keeps it. The two are ordered by events:
    the first's self-check goes on once the second has either waited for the lock or begun its own pip
    run, which it starts only after the first's check (so without the lock it must have removed the folder)."""
    folder = _offline_release(monkeypatch, tmp_path)
    first_checking, second_moved, first_checked = threading.Event(), threading.Event(), threading.Event()

    def before_check():
        if threading.current_thread().name == "first":
            first_checking.set()
            second_moved.wait(120)

    def before_pip():
        if threading.current_thread().name == "second":
            second_moved.set()
            first_checked.wait(120)

    pip_runs = _self_check_imports_ddtiny(monkeypatch, folder, before_check, before_pip)
    results = {}

    def go():
        name = threading.current_thread().name
        try:
            results[name] = installing.install("sglang", "0.5.10", folder=folder, link=False, waiting=second_moved.set)
        except Exception as e:  # noqa: BLE001 (the test reports what each install ended with)
            results[name] = e
        finally:
            if name == "first":
                first_checked.set()

    first = threading.Thread(target=go, name="first")
    first.start()
    assert first_checking.wait(120)
    second = threading.Thread(target=go, name="second")
    second.start()
    first.join(300), second.join(300)
    assert results == {"first": (folder, True), "second": (folder, False)}, results
    assert pip_runs == ["first"]
    assert (folder / "ddtiny.py").is_file() and (folder / realload.READY_MARKER).is_file()


def test_a_finished_install_is_kept_and_anything_else_replaced(monkeypatch, tmp_path):
    """Installed again, a release finished for the same pin list is kept (pip does not run); a folder no
    install finished (a dead install's, or one marked by an older kit) or another pin list's is replaced."""
    folder = _offline_release(monkeypatch, tmp_path)
    pip_runs = _self_check_imports_ddtiny(monkeypatch, folder)
    assert installing.install("sglang", "0.5.10", folder=folder, link=False) == (folder, True)
    assert installing.install("sglang", "0.5.10", folder=folder, link=False) == (folder, False)
    assert len(pip_runs) == 1
    (folder / realload.READY_MARKER).write_text("")  # marked by a kit that wrote no digest
    (folder / "left-over").write_text("")
    assert installing.install("sglang", "0.5.10", folder=folder, link=False) == (folder, True)
    assert not (folder / "left-over").exists()
    _offline_release(monkeypatch, tmp_path, pins="ddtiny==1.0  # another list\n")
    assert installing.install("sglang", "0.5.10", folder=folder, link=False) == (folder, True)
    assert len(pip_runs) == 3


ELF = b"\x7fELF"  # how a compiled file begins (`install.is_compiled`)


def _wheel(folder: Path, name: str, version: str, files: dict) -> None:
    """A wheel of `files` (path -> bytes) and its metadata, made by hand: what pip installs offline."""
    dist = f"{name}-{version}.dist-info"
    files = files | {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
                     f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
              for path, data in files.items()] + [f"{dist}/RECORD,,"]
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")


def test_a_release_without_a_cpu_build_is_its_wheel_laid_over_the_base_install(monkeypatch, tmp_path):
    """An overlay file names the release's own wheel: the install copies the base release's (installed first,
    by its pin list), lays every file of the wheel's package over it but the compiled ones (the base's stay,
    the wheel's are left out), installs none of the wheel's metadata, records what it did, and leaves the
    base as it was; offline, with a package standing for vLLM."""
    wheels, lists, releases = tmp_path / "wheels", tmp_path / "pins", tmp_path / "releases"
    wheels.mkdir(), lists.mkdir()
    _wheel(wheels, "ddpkg", "1.0", {"ddpkg/__init__.py": b"VALUE = 1\n", "ddpkg/gone.py": b"", "ddpkg/_C.so": ELF + b"cpu",
                                     "ddpkg/sub/only_in_base.py": b"X = 1\n"})
    _wheel(wheels, "ddpkg", "0.34.0", {"ddpkg/__init__.py": b"VALUE = 34\n", "ddpkg/new.py": b"", "ddpkg/data.json": b"{}",
                                        "ddpkg/_C.so": ELF + b"cuda", "ddpkg/_cuda_only.so": ELF + b"cuda"})
    (lists / "vllm-requirements-0.32.0.txt").write_text("ddpkg==1.0\n")
    (lists / "vllm-overlay-0.34.0.txt").write_text("# the release's own wheel\nddpkg==0.34.0\n")
    monkeypatch.setattr(installing, "HERE", lists)
    monkeypatch.setattr(registry, "HERE", lists)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("DRAFTDOCTOR_VLLM_DIR", str(releases))
    checked = []

    def run(command, log, failure):  # pip runs for real; the self-check imports the package from the folder
        if command[1:3] != ["-m", "pip"]:
            checked.append(command[-1])
            command = [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {command[-1]!r}); import ddpkg; "
                                                   "assert ddpkg.VALUE == (34 if sys.path[0].endswith('0.34.0') else 1)"]
        return real_run(command, log, failure)

    real_run = installing._run
    monkeypatch.setattr(installing, "_run", run)
    assert realload.REAL_LOADERS["vllm"].releases == ("0.32.0", "0.34.0")
    folder, fresh = installing.install("vllm", "0.34.0", link=False)
    base = releases / "0.32.0"
    assert (folder, fresh) == (releases / "0.34.0", True) and checked == [str(base), str(folder)]
    package = folder / "ddpkg"
    assert (package / "__init__.py").read_bytes() == b"VALUE = 34\n" and (package / "new.py").exists()
    assert (package / "data.json").exists() and not (package / "gone.py").exists() and not (package / "sub").exists()
    assert (package / "_C.so").read_bytes() == ELF + b"cpu" and not (package / "_cuda_only.so").exists()
    assert os.path.samefile(package / "_C.so", base / "ddpkg" / "_C.so")  # copied by a hard link
    assert (folder / "ddpkg-1.0.dist-info").is_dir() and not (folder / "ddpkg-0.34.0.dist-info").exists()
    assert (base / "ddpkg" / "__init__.py").read_bytes() == b"VALUE = 1\n" and (base / "ddpkg" / "gone.py").exists()
    record = json.loads((folder / realload.OVERLAY_RECORD).read_text())
    assert record | {"sha256": None} == {
        "wheel": "ddpkg-0.34.0-py3-none-any.whl", "sha256": None, "files_laid": 3, "compiled_kept": ["ddpkg/_C.so"],
        "compiled_left_out": ["ddpkg/_C.so", "ddpkg/_cuda_only.so"], "release": "0.34.0", "requirement": "ddpkg==0.34.0",
        "base": "0.32.0"}
    assert "overlay ddpkg==0.34.0" in (folder / realload.READY_MARKER).read_text()
    assert not list(releases.glob("*.download")) and "0.34.0" in realload.installed_releases("vllm")
    assert installing.install("vllm", "0.34.0", link=False) == (folder, False)  # finished for the same overlay: kept
    assert len(checked) == 2


@pytest.mark.parametrize("text", ["", "vllm==0.34.0\nnumpy==2.2.6\n", "vllm==0.33.0\n", "vllm>=0.34.0\n"])
def test_an_overlay_file_names_exactly_the_releases_own_wheel(monkeypatch, tmp_path, text):
    (tmp_path / "vllm-requirements-0.32.0.txt").write_text("numpy==2.2.6\n")
    (tmp_path / "vllm-overlay-0.34.0.txt").write_text(text)
    monkeypatch.setattr(installing, "HERE", tmp_path)
    monkeypatch.setattr(registry, "HERE", tmp_path)
    with pytest.raises(UserError, match=r"vllm-overlay-0\.34\.0\.txt: an overlay file names one requirement"):
        installing.install("vllm", "0.34.0", folder=tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_the_overlays_are_listed_installed_by_make_and_on_the_base_make_names():
    """`loaders list` shows vLLM 0.33.0 and 0.34.0 (no CPU build: overlays); make installs every overlay
    file's release after the base realload names, through the same module."""
    done = cli("list")
    listed = {tuple(line.split()[:2]) for line in done.stdout.splitlines()[1:]}
    assert {("vllm", "0.33.0"), ("vllm", "0.34.0")} <= listed
    loaders = realload.REAL_LOADERS["vllm"]
    assert loaders.overlay("0.34.0") and loaders.overlay("0.33.0") and loaders.overlay("0.32.0") is None
    text = (ROOT / "mk" / "vllm.mk").read_text()
    assert f"VLLM_OVERLAY_BASE := {loaders.overlay_base}\n" in text and "vllm-overlay-%.txt" in text
