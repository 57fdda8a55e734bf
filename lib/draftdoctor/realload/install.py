"""Installing a release's real loader: one implementation for `make sglang-loaders` / `make vllm-loaders`
and `draftdoctor loaders install ENGINE==RELEASE` (an installed kit has no Makefile).

The release's pin list (beside this package) is refused if it would bring torch, CUDA wheels or kernels
(`RealLoaders.forbidden_pins`); installed into the release's folder as `pip install --no-deps
--only-binary=:all: --no-compile --target` would, beside the kit's own CPU torch (`install_pins`: each
pin another finished release folder holds is hard-linked from it and checked against its RECORD, pip
installs the rest: `reuse`; a vLLM release's pins then take about 5 CPU seconds, not 25); self-checked
as every later check runs it (`python -m draftdoctor.realload`: the adapter fits, a tiny draft loads);
only then is the ready marker written, holding the pin list's digest. Its files are then swapped for
links to the store of what releases share (linkstore), as make does.

A release without a CPU build (an overlay file instead of a pin list: `RealLoaders.overlay`) is installed
as a copy of its base release's install (hard links; the base installed first when it is not) with the
release's own wheel laid over it (`lay_over`): downloaded here, once (`pip download --no-deps
--only-binary=:all:`), every file of its package but the compiled ones replaces the base's, whose
compiled kernels stay; the wheel's metadata is not installed. What was laid is recorded in the folder
(`OVERLAY_RECORD`); the child reads it, and the self-check runs the release's own loader on it.

One install of a release at a time, whoever runs it: each holds the release's lock (`flock` on
`<release>.lock` beside its folder) from before it looks at the folder until its marker is written. A
second install waits for the first and then finds its folder finished for the same pin list, which it
keeps: a finished install is never removed by another (two at once had removed one another's folder
during the self-check). Only a folder no install finished for these pins (a dead install's leftovers,
another pin list's) is replaced. An install links files only from folders whose lock it took without
waiting (`finished_folders`), and holds those locks until it has linked: none is replaced meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from ..errors import UserError
from ..toolstate import BUILD, trusted
from . import reuse
from .registry import HERE, OVERLAY_RECORD, READY_MARKER, REAL_LOADERS, releases_dir

STORE = BUILD / "release-store"  # mk/sglang.mk's RELEASE_STORE
LINKED_MARKER = ".linked"


class InstallFailed(RuntimeError):
    """pip or the self-check failed; the message ends with the tail of what it printed."""


def pin_list(engine_name: str, release: str) -> Path:
    """The pin list `engine` `release` is installed from, checked: a known release with pins, none of them
    forbidden; for a release without a CPU build, its base release's (and its overlay file is checked)."""
    loaders = REAL_LOADERS.get(engine_name)
    if loaders is None or loaders.pin_prefix is None:
        known = ", ".join(name for name, row in REAL_LOADERS.items() if row.pin_prefix)
        raise UserError(f"{engine_name}: no pinned real loaders to install (those are {known}"
                        + (f"; {loaders.display} is built: {loaders.install_hint()})" if loaders else ")"))
    if release not in loaders.releases:
        raise UserError(f"{engine_name}=={release} has no pin list; known releases: {', '.join(loaders.releases)}")
    overlay = loaders.overlay(release)
    if overlay is not None:
        overlay_requirement(overlay, release)
        release = loaders.overlay_base
    pins = HERE / f"{loaders.pin_prefix}{release}.txt"
    bad = [line for line in pins.read_text().splitlines() if re.match(loaders.forbidden_pins, line, re.IGNORECASE)]
    if bad:
        raise UserError(f"{pins}: pins what the kit never installs beside its CPU torch: {', '.join(bad)}")
    return pins


def overlay_requirement(overlay: Path, release: str) -> str:
    """The one requirement an overlay file names, `name==release` (its wheel), checked."""
    lines = [line.split("#", 1)[0].strip() for line in overlay.read_text().splitlines()]
    named = [line for line in lines if line]
    if len(named) != 1 or not re.fullmatch(rf"[A-Za-z0-9][A-Za-z0-9._-]*=={re.escape(release)}", named[0]):
        raise UserError(f"{overlay}: an overlay file names one requirement, the release's own wheel "
                        f"(e.g. vllm=={release}); found {named or 'none'}")
    return named[0]


def install(engine_name: str, release: str, folder: Path | None = None, link: bool = True,
            waiting=None, overlay: str | None = None) -> tuple[Path, bool]:
    """Install `engine` `release`'s real loader into `folder` (default: its release folder) and return the
    folder, ready (marker written) only if its self-check passed, and whether this call installed it
    (False: an install of the same pin list had finished there; it is kept). Under the release's lock;
    `waiting()` is called once if another install holds it. Anything else in the folder is replaced.
    `overlay`: a wheel (`vllm==0.32.0`) to lay over the pinned install, in place of the release's overlay
    file (the overlay's proof lays a CPU build's own release over it: draftdoctor.proofs.overlay)."""
    loaders = REAL_LOADERS[engine_name]
    pins = pin_list(engine_name, release)
    if overlay is None and loaders.overlay(release) is not None:
        overlay = overlay_requirement(loaders.overlay(release), release)
    folder = trusted(folder or loaders.folder(release), f"{loaders.display}'s real loaders")
    folder.parent.mkdir(parents=True, exist_ok=True)
    digest = "pins sha256 " + hashlib.sha256(pins.read_bytes()).hexdigest() + (f"; overlay {overlay}" if overlay else "")
    marker = folder / READY_MARKER
    base = None
    if overlay is not None:  # the base's own folder, installed (or found installed) first, under its own lock
        base_release = loaders.overlay_base if loaders.overlay(release) is not None else release
        base, _ = install(engine_name, base_release, link=link, waiting=waiting)
        if base.resolve() == folder.resolve():
            raise UserError(f"{folder}: an overlay is installed beside its base release, not over it")
    with _release_lock(folder, waiting):
        if _text(marker) == digest:
            marker.touch()  # make's target is the marker: newer than the pin list again
            return folder, False
        shutil.rmtree(folder, ignore_errors=True)
        log = folder.with_name(folder.name + ".log")
        if base is None:
            install_pins(pins, folder, log, f"pip could not install {engine_name} {release}")
        else:
            _install_overlay(engine_name, release, overlay, (base_release, base), folder, log)
        _run([sys.executable, "-m", "draftdoctor.realload", engine_name, release, str(folder)], log,
             f"{engine_name} {release} installed, but its self-check failed (the folder is not marked ready)")
        marker.write_text(digest + "\n")
        if link:
            from .linkstore import link as link_files, prune

            STORE.mkdir(parents=True, exist_ok=True)
            prune(trusted(STORE, "the release store"))
            link_files(STORE, folder)
            (folder / LINKED_MARKER).touch()
    return folder, True


def install_pins(pins: Path, folder: Path, log: Path, failure: str, sources: list[Path] | None = None) -> int:
    """`pins` installed into the new `folder` as `pip install --no-deps --only-binary=:all: --no-compile
    --target` alone would: each pin a finished release folder holds linked from it (`reuse`; from
    `sources`, default `finished_folders`), pip for the rest (into a folder beside, moved in after); pip
    for all of them when two would install one path. Returns how many pins were linked."""
    lines = [line for line in pins.read_text().splitlines() if line.split("#", 1)[0].strip()]
    staging = folder.with_name(folder.name + ".pip")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with contextlib.ExitStack() as locks:
            found, _ = reuse.plan(lines, sources if sources is not None else finished_folders(folder, locks))
            folder.mkdir(exist_ok=True)
            linked = [line for line, dist in found.items() if reuse.link(dist, folder)]
        if not linked:
            _pip(["-r", str(pins)], folder, log, failure)
            return 0
        rest = [re.sub(r"(^|\s+)#.*$", "", line).strip() for line in lines if line not in linked]  # pip's comments
        if rest:
            _pip(rest, staging, log, failure)
            reuse.merge(staging, folder)
        reuse.check_shadowing(folder)
        return len(linked)
    except reuse.Collision:
        shutil.rmtree(folder, ignore_errors=True)
        _pip(["-r", str(pins)], folder, log, failure)
        return 0
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _pip(requirements: list[str], target: Path, log: Path, failure: str) -> None:
    _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
          "--only-binary=:all:", "--no-compile", "--target", str(target), *requirements], log, failure)


def finished_folders(folder: Path, locks: contextlib.ExitStack) -> list[Path]:
    """The release folders a new install into `folder` may link files from: its siblings and every
    engine's installed releases that are finished (ready marker written) and no overlay, each under its
    install lock, taken without waiting (a folder being installed or replaced is skipped) and held until
    `locks` closes; those already linked to the store first."""
    candidates = [Path(e.path) for e in os.scandir(folder.parent) if e.is_dir(follow_symlinks=False)]
    for name, loaders in REAL_LOADERS.items():
        if loaders.pin_prefix is not None and releases_dir(name).is_dir():
            candidates += [Path(e.path) for e in os.scandir(releases_dir(name)) if e.is_dir(follow_symlinks=False)]
    found, seen = [], {os.path.realpath(folder)}
    for candidate in candidates:
        real = os.path.realpath(candidate)
        if real in seen or not (candidate / READY_MARKER).is_file():
            continue
        seen.add(real)
        try:
            trusted(candidate, "a release folder to link from")
            fd = os.open(candidate.with_name(candidate.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except (UserError, OSError):
            continue
        locks.callback(os.close, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        if (candidate / READY_MARKER).is_file() and not (candidate / OVERLAY_RECORD).exists():
            found.append(candidate)
    return sorted(found, key=lambda f: not (f / LINKED_MARKER).exists())


def _install_overlay(engine_name: str, release: str, requirement: str, base: tuple[str, Path], folder: Path,
                     log: Path) -> None:
    """`folder`: a copy of the installed base (its release, its folder) with `requirement`'s wheel laid
    over it, downloaded into a folder beside it (removed after)."""
    base_release, base = base
    downloads = folder.with_name(folder.name + ".download")
    shutil.rmtree(downloads, ignore_errors=True)
    try:
        _run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
              "--only-binary=:all:", "--no-cache-dir", "--dest", str(downloads), requirement], log,
             f"pip could not download {requirement}, the wheel {engine_name} {release} is laid over its base from")
        wheels = sorted(downloads.glob("*.whl"))
        if len(wheels) != 1:
            raise InstallFailed(f"pip download {requirement} gave {[w.name for w in wheels]}, not one wheel ({log})")
        copy_install(base, folder)
        record = lay_over(folder, wheels[0])
    finally:
        shutil.rmtree(downloads, ignore_errors=True)
    record |= {"release": release, "requirement": requirement, "base": base_release}
    (folder / OVERLAY_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def copy_install(base: Path, folder: Path) -> None:
    """A copy of an installed release's folder, by hard links where the file system allows (nothing writes
    into an installed release: linkstore), without its markers, records and bytecode."""
    skipped = {READY_MARKER, LINKED_MARKER, OVERLAY_RECORD}

    def copy(source, target):
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    shutil.copytree(base, folder, symlinks=True, copy_function=copy,
                    # a `.linkstore` file is linkstore's spare link, there only while it relinks the base
                    ignore=lambda where, names: [n for n in names if n == "__pycache__" or n.endswith(".linkstore")
                                                 or (Path(where) == base and n in skipped)])


def is_compiled(data: bytes) -> bool:
    """A compiled file (an ELF shared object or program), by its first bytes."""
    return data[:4] == b"\x7fELF"


def _is_compiled_file(path: Path) -> bool:
    with open(path, "rb") as f:
        return is_compiled(f.read(4))


def lay_over(folder: Path, wheel: Path) -> dict:
    """Lay `wheel`'s package over the same package installed in `folder`: every file of the installed one
    but its compiled ones (`is_compiled`) removed, then every file of the wheel's but its compiled ones
    written (the installed build's compiled kernels stay; the wheel's, built for other hardware, are never
    used); folders left empty are removed; the wheel's metadata (`*.dist-info`) is not installed, so the
    folder's distribution stays the base's. Returns what was done: the wheel, its sha256, the files laid,
    the base's compiled files kept and the wheel's left out."""
    with open(wheel, "rb") as f:
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.infolist() if not m.is_dir()]
        packages = sorted({m.filename.split("/", 1)[0] for m in members if "/" in m.filename}
                          - {m.filename.split("/", 1)[0] for m in members if m.filename.split("/", 1)[0].endswith(
                              (".dist-info", ".data"))})
        if not packages:
            raise InstallFailed(f"{wheel.name}: no package to lay over")
        kept = []
        for package in packages:
            root = folder / package
            if not root.is_dir():
                raise InstallFailed(f"{wheel.name}: its package {package}/ is not installed in {folder} to lay over")
            for path in sorted(p for p in root.rglob("*") if p.is_symlink() or p.is_file()):
                if not path.is_symlink() and _is_compiled_file(path):
                    kept.append(str(path.relative_to(folder)))
                else:
                    path.unlink()
        laid, left_out = 0, []
        for member in members:
            name = member.filename
            if name.split("/", 1)[0] not in packages:
                continue
            target = (folder / name).resolve()
            if folder.resolve() not in target.parents:
                raise InstallFailed(f"{wheel.name}: {name} would be written outside {folder}")
            data = z.read(member)
            if is_compiled(data):
                left_out.append(name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            laid += 1
    for package in packages:
        for where in sorted((p for p in (folder / package).rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            if not any(where.iterdir()):
                where.rmdir()
    return {"wheel": wheel.name, "sha256": sha256, "files_laid": laid, "compiled_kept": kept,
            "compiled_left_out": left_out}


def waiting_note(engine_name: str, release: str) -> str:
    """What an install says while its release's lock is held elsewhere: by another install of that
    release, or by an install of another release linking files from it (`finished_folders`)."""
    return (f"waiting for {engine_name} {release}'s install lock: another process is installing it, "
            "or installing another release with files linked from it")


@contextlib.contextmanager
def _release_lock(folder: Path, waiting=None):
    """The release's install lock, held for the block (released if the process dies): `<folder>.lock`
    beside the folder, never opened through a link."""
    fd = os.open(folder.with_name(folder.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _text(path: Path) -> str | None:
    """A marker's text (stripped), None when there is none."""
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None


def _run(command: list[str], log: Path, failure: str) -> None:
    with open(log, "w") as out:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=out, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise InstallFailed(f"{failure} (exit {done.returncode}; {log}):\n{tail}")


def main(argv=None) -> int:
    """`python -m draftdoctor.realload.install ENGINE RELEASE [--folder F] [--no-link]`: make's recipe."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine")
    parser.add_argument("release")
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--no-link", action="store_true", help="leave linking to the store to make's .linked rule")
    args = parser.parse_args(argv)
    try:
        install(args.engine, args.release, args.folder, link=not args.no_link,
                waiting=lambda: sys.stderr.write(waiting_note(args.engine, args.release) + "\n"))
    except (UserError, InstallFailed) as e:
        sys.stderr.write(f"{e}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
