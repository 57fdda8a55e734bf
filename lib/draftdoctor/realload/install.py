"""Installing a release's real loader: one implementation for `make sglang-loaders` / `make vllm-loaders`
and `draftdoctor loaders install ENGINE==RELEASE` (an installed kit has no Makefile).

The release's pin list (beside this package) is refused if it would bring torch, CUDA wheels or kernels
(`RealLoaders.forbidden_pins`); installed `--no-deps --target` into the release's folder, beside the
kit's own CPU torch; self-checked as every later check runs it (`python -m draftdoctor.realload`: the
adapter fits, a tiny draft loads); only then is the ready marker written, holding the pin list's digest.
Its files are then swapped for links to the store of what releases share (linkstore), as make does.

One install of a release at a time, whoever runs it: each holds the release's lock (`flock` on
`<release>.lock` beside its folder) from before it looks at the folder until its marker is written. A
second install waits for the first and then finds its folder finished for the same pin list, which it
keeps: a finished install is never removed by another (two at once had removed one another's folder
during the self-check). Only a folder no install finished for these pins (a dead install's leftovers,
another pin list's) is replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import UserError
from ..toolstate import BUILD, trusted
from . import HERE, LOADERS, READY_MARKER

STORE = BUILD / "release-store"  # mk/sglang.mk's RELEASE_STORE
LINKED_MARKER = ".linked"


class InstallFailed(RuntimeError):
    """pip or the self-check failed; the message ends with the tail of what it printed."""


def pin_list(engine: str, release: str) -> Path:
    """The pin list of `engine` `release`, checked: a known release with pins, none of them forbidden."""
    loaders = LOADERS.get(engine)
    if loaders is None or loaders.pin_prefix is None:
        known = ", ".join(name for name, row in LOADERS.items() if row.pin_prefix)
        raise UserError(f"{engine}: no pinned real loaders to install (those are {known}"
                        + (f"; {loaders.display} is built: {loaders.install_hint()})" if loaders else ")"))
    if release not in loaders.releases:
        raise UserError(f"{engine}=={release} has no pin list; known releases: {', '.join(loaders.releases)}")
    pins = HERE / f"{loaders.pin_prefix}{release}.txt"
    bad = [line for line in pins.read_text().splitlines() if re.match(loaders.forbidden_pins, line, re.IGNORECASE)]
    if bad:
        raise UserError(f"{pins}: pins what the kit never installs beside its CPU torch: {', '.join(bad)}")
    return pins


def install(engine: str, release: str, folder: Path | None = None, link: bool = True,
            waiting=None) -> tuple[Path, bool]:
    """Install `engine` `release`'s real loader into `folder` (default: its release folder) and return the
    folder, ready (marker written) only if its self-check passed, and whether this call installed it
    (False: an install of the same pin list had finished there; it is kept). Under the release's lock;
    `waiting()` is called once if another install holds it. Anything else in the folder is replaced."""
    pins = pin_list(engine, release)
    folder = trusted(folder or LOADERS[engine].folder(release), f"{LOADERS[engine].display}'s real loaders")
    folder.parent.mkdir(parents=True, exist_ok=True)
    digest = "pins sha256 " + hashlib.sha256(pins.read_bytes()).hexdigest()
    marker = folder / READY_MARKER
    with _release_lock(folder, waiting):
        if _text(marker) == digest:
            marker.touch()  # make's target is the marker: newer than the pin list again
            return folder, False
        shutil.rmtree(folder, ignore_errors=True)
        log = folder.with_name(folder.name + ".log")
        _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
              "--only-binary=:all:", "--no-compile", "--target", str(folder), "-r", str(pins)], log,
             f"pip could not install {engine} {release}")
        _run([sys.executable, "-m", "draftdoctor.realload", engine, release, str(folder)], log,
             f"{engine} {release} installed, but its self-check failed (the folder is not marked ready)")
        marker.write_text(digest + "\n")
        if link:
            from .linkstore import link as link_files, prune

            STORE.mkdir(parents=True, exist_ok=True)
            prune(trusted(STORE, "the release store"))
            link_files(STORE, folder)
            (folder / LINKED_MARKER).touch()
    return folder, True


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
                waiting=lambda: sys.stderr.write(f"waiting for another install of {args.engine} {args.release}\n"))
    except (UserError, InstallFailed) as e:
        sys.stderr.write(f"{e}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
