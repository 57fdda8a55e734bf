"""Installing a release's real loader: one implementation for `make sglang-loaders` / `make vllm-loaders`
and `draftdoctor loaders install ENGINE==RELEASE` (an installed kit has no Makefile).

The release's pin list (beside this package) is refused if it would bring torch, CUDA wheels or kernels
(`RealLoaders.forbidden_pins`); installed `--no-deps --target` into the release's folder, beside the
kit's own CPU torch; self-checked as every later check runs it (`python -m draftdoctor.realload`: the
adapter fits, a tiny draft loads); only then is the ready marker written. Its files are then swapped for
links to the store of what releases share (linkstore), as make does.
"""

from __future__ import annotations

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


def install(engine: str, release: str, folder: Path | None = None, link: bool = True) -> Path:
    """Install `engine` `release`'s real loader into `folder` (default: its release folder) and return the
    folder, ready (marker written) only if its self-check passed. A folder there before is replaced."""
    pins = pin_list(engine, release)
    folder = trusted(folder or LOADERS[engine].folder(release), f"{LOADERS[engine].display}'s real loaders")
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = folder.with_name(folder.name + ".log")
    _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
          "--only-binary=:all:", "--no-compile", "--target", str(folder), "-r", str(pins)], log,
         f"pip could not install {engine} {release}")
    _run([sys.executable, "-m", "draftdoctor.realload", engine, release, str(folder)], log,
         f"{engine} {release} installed, but its self-check failed (the folder is not marked ready)")
    (folder / READY_MARKER).touch()
    if link:
        from .linkstore import link as link_files, prune

        STORE.mkdir(parents=True, exist_ok=True)
        prune(trusted(STORE, "the release store"))
        link_files(STORE, folder)
        (folder / LINKED_MARKER).touch()
    return folder


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
        install(args.engine, args.release, args.folder, link=not args.no_link)
    except (UserError, InstallFailed) as e:
        sys.stderr.write(f"{e}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
