"""Wheels of the distributions this venv has installed, repacked from their own files (RECORD), so that a
fresh venv can install the kit's wheel with its declared dependencies resolved, offline:
`pip install --no-index --find-links FOLDER draftdoctor-*.whl`. A dependency the wheel does not declare
is then missing there, as it would be on a user's machine.

Only what the requirements need is packed: their closure over this venv's metadata (markers evaluated
for this interpreter, extras followed). Console scripts are left to pip, which writes them from the
entry points; other files outside site-packages go in the wheel's data scheme.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import os
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

NOT_PACKED = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}  # what an install adds to a wheel's files


class NotInstalled(LookupError):
    """Distributions the requirements need that this venv lacks (it was set up from other requirements)."""


def closure(requirements: list[str], provided: set[str] = frozenset()) -> list[importlib.metadata.Distribution]:
    """The installed distributions `requirements` need, transitively, less those `provided` (canonical
    names, installed another way). NotInstalled names every needed distribution this venv lacks."""
    found, extras, missing, todo = {}, {}, {}, [(Requirement(r), "the kit") for r in requirements]
    while todo:
        requirement, by = todo.pop()
        key = canonicalize_name(requirement.name)
        if key in provided or (key in found and set(requirement.extras) <= extras[key]):
            continue
        if key not in found:
            try:
                found[key] = importlib.metadata.distribution(requirement.name)
            except importlib.metadata.PackageNotFoundError:
                missing[key] = by
                continue
        extras[key] = extras.get(key, set()) | set(requirement.extras)
        for line in found[key].requires or []:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": e}) for e in {"", *extras[key]}):
                todo.append((needed, found[key].metadata["Name"]))
    if missing:
        raise NotInstalled(", ".join(f"{name} (needed by {by})" for name, by in sorted(missing.items())))
    return [found[k] for k in sorted(found)]


def _tag(wheel_text: str) -> str:
    """The compressed tag set of a WHEEL file's `Tag:` lines (py2.py3-none-any), as a wheel's name has it."""
    tags = [line.split(":", 1)[1].strip().split("-") for line in wheel_text.splitlines() if line.startswith("Tag:")]
    return "-".join(".".join(sorted({tag[i] for tag in tags})) for i in range(3)) if tags else "py3-none-any"


def repack(dist: importlib.metadata.Distribution, folder: Path) -> Path:
    """`dist` as it is installed, as a wheel in `folder`."""
    if dist.files is None:
        raise ValueError(f"{dist.metadata['Name']}: no RECORD, cannot be repacked")
    base, prefix = Path(dist.locate_file("")), Path(sys.prefix)
    info = next(f.parts[0] for f in dist.files if f.parts[0].endswith(".dist-info"))
    wheel_file = base / info / "WHEEL"
    wheel_text = wheel_file.read_text() if wheel_file.is_file() else \
        "Wheel-Version: 1.0\nGenerator: repack\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    data = f"{name}-{dist.version}.data"
    scripts = {e.name for e in dist.entry_points if e.group in ("console_scripts", "gui_scripts")}
    path = folder / f"{name}-{dist.version}-{_tag(wheel_text)}.whl"
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as wheel:
        for file in dist.files:
            source = Path(os.path.normpath(base / file))
            if "__pycache__" in file.parts or file.suffix == ".pyc" or not source.is_file():
                continue
            if file.parts[0] == info and file.name in NOT_PACKED:
                continue
            if file.parts[0] != "..":
                name_in_wheel = file.as_posix()
            elif source.is_relative_to(prefix):
                relative = source.relative_to(prefix)
                if relative.parts[0] == "bin" and relative.name in scripts:
                    continue  # pip writes it from the entry point
                name_in_wheel = (f"{data}/scripts/{relative.name}" if relative.parts[0] == "bin"
                                 else f"{data}/data/{relative.as_posix()}")
            else:
                continue
            content = source.read_bytes()
            wheel.writestr(zipfile.ZipInfo.from_file(source, name_in_wheel), content)
            digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
            record.append((name_in_wheel, f"sha256={digest}", len(content)))
        if not wheel_file.is_file():
            wheel.writestr(f"{info}/WHEEL", wheel_text)
            record.append((f"{info}/WHEEL", "", ""))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([*record, (f"{info}/RECORD", "", "")])
        wheel.writestr(f"{info}/RECORD", text.getvalue())
    return path


def wheelhouse(requirements: list[str], folder: Path, provided: set[str] = frozenset()) -> list[Path]:
    """Every distribution `requirements` need (less `provided`), repacked into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    return [repack(dist, folder) for dist in closure(requirements, provided)]
