"""Installing a pin list without unpacking again the wheels other release folders already hold.

Every release folder is `pip install --no-deps --only-binary=:all: --no-compile --target` of an exact pin
list, and most pins are in many lists (CI's vLLM releases share all but a few of their ~150). pip spends
most of an install reading the index for each pin (about 18 of a vLLM release's 27 CPU seconds) and the
rest unpacking. A pin whose wheel a finished release folder already holds (`plan`) is not given to pip:
its installed files, every path its RECORD lists, are hard-linked from that folder and checked against
RECORD's sha256 and size after linking (`link`: a file that does not match is never kept, and the pin
goes to pip); pip installs only the other pins, into a folder beside, which is then moved in (`merge`).
The folder is the one pip alone would make: the same paths, contents and modes (benchmarks/install_reuse.py
compares a vLLM release installed both ways; tests/test_install_reuse.py a small one).

An installed distribution is taken from a folder when it is what pip would install for the pin here:
- its METADATA names the pin's project and exactly its version (a local version such as `+cpu` only
  when the pin names it), and its WHEEL tags include one this interpreter supports;
- its RECORD gives every file but itself a sha256 and a size, and names no `direct_url.json` (installed
  from a URL, not the index); paths outside the package folder are what `--target` makes of a wheel's
  scripts and data (`../../bin/x` is `<folder>/bin/x`; under `lib/`, pip leaves them out: `LIB_DIRS`);
- each file is a regular file with the mode pip gives under this process's umask, and a script pip
  wrote or rewrote (in `bin/`, starting `#!`) starts with this interpreter's `#!` line: a folder
  installed through another path to Python holds other scripts.
Two distributions installing one path, or a wheel's data named as a package (`Collision`): what pip
keeps depends on its order, so the caller installs the release with pip alone.
The caller (realload.install) names the folders to take from: finished ones (ready marker written),
each under its install lock taken without waiting (one being installed or removed is skipped), no
overlay (its package's files differ from its RECORD). The folders were installed by the same kit code,
interpreter and index: pip ran there with `--no-compile` and picked the wheel it would pick here.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import posixpath
import re
import stat
import sys
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)")
# where `--target` installs packages first (pip's home scheme: lib/python, the platform's platlib dir):
# a wheel's data under these names it leaves out
LIB_DIRS = {"lib", sys.platlibdir}


class Collision(Exception):
    """Two distributions install the same path (or a wheel's data the name of a package): which one pip
    keeps depends on its order, so the caller installs with pip alone."""


@dataclass(frozen=True)
class Dist:
    """One installed distribution to link: its folder, and each RECORD row's file as (path in the
    folder, urlsafe-base64 sha256, size); RECORD itself with None, None."""

    source: Path
    name: str  # its .dist-info folder
    files: tuple[tuple[str, str | None, int | None], ...]
    record: bytes  # RECORD as read


def plan(lines: list[str], sources: list[Path]) -> tuple[dict[str, Dist], list[str]]:
    """Which of the pin list's `lines` a folder of `sources` holds (the first that does, each), and the
    lines left for pip, in their order."""
    supported = {str(tag) for tag in sys_tags()}
    umask = _umask()
    indexes = [(source, _index(source)) for source in sources]
    found, rest = {}, []
    for line in lines:
        match = PIN.fullmatch(line.split("#", 1)[0].strip())
        dist = None
        if match and umask is not None:
            key = (canonicalize_name(match[1]), _version(match[2]))
            dist = next((d for source, index in indexes if key in index
                         for d in [_dist(source, index[key], key, supported)] if d is not None), None)
        if dist is None:
            rest.append(line)
        else:
            found[line] = dist
    return found, rest


def link(dist: Dist, folder: Path) -> bool:
    """Hard-link each of `dist`'s files into `folder` and check it there (the linked file is the one kept:
    a change after checking would change the source's too, which nothing does: linkstore). False, with
    none of them left, when one is missing or differs; Collision when one is there already."""
    umask, made, done = _umask(), [], False
    if umask is None:
        return False
    try:
        for path, digest, size in dist.files:
            target = folder / path
            made.append(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(dist.source / path, target, follow_symlinks=False)
            except FileExistsError:
                made.pop()  # another's
                raise Collision(f"{path}: installed by {dist.name} and another distribution") from None
            except OSError:
                return False
            if not _matches(target, path, digest, size, dist.record, _modes(umask)):
                return False
        done = True
        return True
    finally:
        if not done:  # none of its files, nor the folders made for them, stays
            for target in made:
                target.unlink(missing_ok=True)
            for target in made:
                _remove_empty_parents(target.parent, folder)


def merge(staging: Path, folder: Path) -> None:
    """Move everything pip installed into `staging` into `folder`, folders merged (as pip merges the wheels
    it installs at once); Collision when a file is in both."""
    for entry in sorted(os.scandir(staging), key=lambda e: e.name):
        target = folder / entry.name
        if not os.path.lexists(target):
            os.rename(entry.path, target)
        elif entry.is_dir(follow_symlinks=False) and target.is_dir() and not target.is_symlink():
            merge(Path(entry.path), target)
        else:
            raise Collision(f"{target.relative_to(folder.parent)}: installed by pip and linked from another release")


def check_shadowing(folder: Path) -> None:
    """Collision when a wheel's data or scripts folder (`../../<name>/` in a RECORD) has the name of a
    package folder: pip moves the packages into `--target` first and then leaves out data whose name is
    taken, so what it keeps depends on the whole set, not on each wheel."""
    packages, data = set(), set()
    for record in folder.glob("*.dist-info/RECORD"):
        for row in csv.reader(io.StringIO(record.read_text(encoding="utf-8"))):
            if not row:
                continue
            path = posixpath.normpath(row[0])
            if path.startswith("../../"):
                data.add(path[len("../../"):].split("/", 1)[0])
            elif not path.startswith("../"):
                packages.add(path.split("/", 1)[0])
    if packages & (data - LIB_DIRS):
        raise Collision(f"{folder}: data of a wheel named as a package: {sorted(packages & (data - LIB_DIRS))}")


def _index(source: Path) -> dict[tuple[str, Version], str]:
    """The folder's installed distributions by (project, version), from their .dist-info folders' names."""
    index = {}
    try:
        names = os.listdir(source)
    except OSError:
        return index
    for name in names:
        if name.endswith(".dist-info") and "-" in name:
            project, version = name[:-len(".dist-info")].rsplit("-", 1)
            parsed = _version(version)
            if parsed is not None:
                index.setdefault((canonicalize_name(project), parsed), name)
    return index


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _dist(source: Path, name: str, key: tuple[str, Version], supported: set[str]) -> Dist | None:
    """The distribution `name` in `source` as a Dist when it is what pip would install for `key` here."""
    info = source / name
    try:
        metadata = BytesHeaderParser().parsebytes((info / "METADATA").read_bytes())
        wheel = BytesHeaderParser().parsebytes((info / "WHEEL").read_bytes())
        record = (info / "RECORD").read_bytes()
        rows = list(csv.reader(io.StringIO(record.decode("utf-8"))))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if ((canonicalize_name(metadata.get("Name", "")), _version(metadata.get("Version", ""))) != key
            or not supported.intersection(wheel.get_all("Tag") or [])):
        return None
    files = []
    for row in rows:
        if not row:
            continue
        if len(row) != 3:
            return None
        path, digest, size = posixpath.normpath(row[0]), row[1], row[2]
        if path == f"{name}/RECORD":
            files.append((path, None, None))
            continue
        if path == f"{name}/direct_url.json" or not digest.startswith("sha256=") or not size.isdigit():
            return None
        if path.startswith("../../"):  # a wheel's scripts or data: `--target` keeps them beside the packages
            path = path[len("../../"):]
            if path.split("/", 1)[0] in LIB_DIRS:  # ... but for what lies under lib/, which it leaves out
                continue
        elif path.startswith("../"):  # under lib/ too
            continue
        if path.startswith(("../", "/")) or path in (".", ""):
            return None
        files.append((path, digest[len("sha256="):], int(size)))
    if (f"{name}/RECORD", None, None) not in files:
        return None
    return Dist(source, name, tuple(files), record)


def _matches(target: Path, path: str, digest: str | None, size: int | None, record: bytes,
             modes: tuple[int, int]) -> bool:
    """The linked file is a regular file with pip's mode here, with RECORD's sha256 and size (RECORD
    itself: the one read when planning, unchanged) and, for a script, this interpreter's `#!` line."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with open(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) not in modes:
            return False
        if digest is None:  # RECORD: the rows `_dist` read
            return f.read() == record
        if info.st_size != size:
            return False
        if path.startswith("bin/"):
            first = f.readline()
            if first.startswith(b"#!") and first.rstrip(b"\r\n") != b"#!" + os.fsencode(sys.executable):
                return False
            f.seek(0)
        found = base64.urlsafe_b64encode(hashlib.file_digest(f, "sha256").digest()).rstrip(b"=").decode()
        return found == digest


def _modes(umask: int) -> tuple[int, int]:
    """The modes pip gives a file it installs: written (0o666), or executable (0o777, every x bit set)."""
    return 0o666 & ~umask, (0o777 & ~umask) | 0o111


def _umask() -> int | None:
    """This process's umask, read without changing it (threads may be creating files), None if unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return None


def _remove_empty_parents(where: Path, folder: Path) -> None:
    while where != folder and folder in where.parents:
        try:
            where.rmdir()
        except OSError:
            return
        where = where.parent

