"""The venv's torch and what torch requires, as a folder of symbolic links: with its own release folder
and the kit, all a pinned release's child sees (it runs `python -S`, without the venv's site-packages).

A release is installed `--no-deps` from its pin list beside the venv's CPU torch, as a user installs torch
first and the engine after it. Anything else the venv holds (Jupyter's dependencies, pandas, pyarrow,
xxhash) is not the release's: an engine that imports it when present behaves and times differently
(vLLM 0.29 spent 2.3 s building a grammar for a Jupyter dependency), and a pin list missing a package
would pass unnoticed.
"""

import hashlib
import importlib.metadata
import os
import shutil
from pathlib import Path

ROOT_DISTRIBUTION = "torch"


def closure(root: str = ROOT_DISTRIBUTION) -> list[importlib.metadata.Distribution]:
    """`root`'s distribution and everything it requires for this interpreter (extras left out), as
    installed where this process imports from; a requirement not installed is left to the child to miss."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, todo = {}, [root]
    while todo:
        name = todo.pop()
        key = canonicalize_name(name)
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[key] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return [found[k] for k in sorted(found)]


def _entries(dist) -> set[Path]:
    """The top-level files and folders of a distribution's install (its package folders, modules and
    dist-info), from its RECORD: what must be importable beside the release."""
    base = Path(dist.locate_file(""))
    tops = set()
    for file in dist.files or []:
        first = Path(file).parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            tops.add(base / first)
    return tops


def torch_view(parent: Path) -> Path:
    """The view's folder under `parent` (made once per set of installed versions; safe beside other
    processes making it: built aside, renamed into place)."""
    dists = closure()
    tag = hashlib.sha1(repr([(d.metadata["Name"], d.version, str(d.locate_file(""))) for d in dists]).encode())
    view = parent / f"torch-view-{tag.hexdigest()[:12]}"
    if view.is_dir():
        return view
    parent.mkdir(parents=True, exist_ok=True)
    partial = parent / f".{view.name}.{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for dist in dists:
        for entry in _entries(dist):
            if entry.exists() and not (partial / entry.name).exists():
                (partial / entry.name).symlink_to(entry)
    try:
        partial.rename(view)
    except OSError:  # another process put its view there first: the same links
        shutil.rmtree(partial, ignore_errors=True)
    return view
