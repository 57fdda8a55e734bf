"""Read safetensors checkpoints from their headers alone.

A checkpoint is a `.safetensors` file, a folder holding one, or a sharded folder with
`model.safetensors.index.json`. Only each file's 8-byte length and JSON header are read (`headers`):
never tensor data, never mmap, never torch. So a 64-shard, 10^5-tensor checkpoint lists in a fraction
of a second, and a shard larger than memory is no problem.

This module puts the headers together: which files form the checkpoint (the index, or the folder's
one file), and what the reference reader misses across them: index entries that point at missing
files or outside the folder, index entries absent from the shard headers, tensors in shards that the
index does not list, a tensor stored twice. Every problem is one `CheckpointError` naming the file,
and the tensor where there is one. The names other modules import from here (the header reader's and
the JSON reader's among them) stay importable from here.
"""

from __future__ import annotations

import json
import os
from itertools import chain, repeat
from operator import attrgetter, sub
from pathlib import Path

from .headers import (CheckpointError, ShardHeader, TensorInfo, _reject_duplicates, gc_paused, open_regular, orjson,
                      read_header)
from .jsonfiles import read_config, read_json_file

# what importers of this module use from the header and JSON readers, importable from here as before
from .headers import DTYPE_BITS, PAGE, encode_header  # noqa: E402,F401
from .jsonfiles import CONFIG_NAME, MAX_JSON_BYTES  # noqa: E402,F401

INDEX_NAME = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class Checkpoint:
    """A whole checkpoint: its shards, its tensors by name, and its config.json if any. `tensors`, when
    not given, is made from the shards the first time it is asked for."""

    def __init__(self, path: Path, shards: list[ShardHeader], tensors: dict[str, TensorInfo] | None,
                 config: dict | None, index: dict | None = None, index_text: bytes | None = None):
        self.path, self.shards, self._tensors, self.config = path, shards, tensors, config
        self._index, self._index_text = index, index_text

    @property
    def index(self) -> dict | None:
        """The index, parsed (again) from its text the first time it is asked for: a target's holds
        10^5 names, and keeping them parsed took tens of megabytes `inspect` never reads."""
        if self._index is None and self._index_text is not None:
            self._index = orjson.loads(self._index_text) if orjson else json.loads(self._index_text)
        return self._index

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r}, {len(self.shards)} shards)"

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        if self._tensors is None:
            tensors = {}
            for shard in self.shards:
                tensors.update(zip(shard.names, shard.tensors))
            self._tensors = tensors
        return self._tensors

    @property
    def folder(self) -> Path:
        return self.path if self.path.is_dir() else self.path.parent

    @property
    def config_path(self) -> Path:
        return self.folder / CONFIG_NAME

    def named(self, suffix: str):
        """The tensors named `suffix` or ending in `.` + `suffix` ('d2t', 'fc.weight'), lazily."""
        return (t for name, t in self.tensors.items() if name == suffix or name.endswith("." + suffix))

    def find(self, suffix: str) -> TensorInfo | None:
        """The first of `named(suffix)`, if any."""
        return next(self.named(suffix), None)

    @property
    def total_bytes(self) -> int:
        if self._tensors is None:
            return sum(sum(shard.table()[3]) for shard in self.shards)
        values = self._tensors.values()
        return sum(map(sub, map(attrgetter("end"), values), map(attrgetter("begin"), values)))

    def keys(self) -> list[str]:
        """The tensors' names: shard by shard, in file order."""
        if self._tensors is None:
            return list(chain.from_iterable(shard.names for shard in self.shards))
        return list(self._tensors)


def _resolve_files(path: Path) -> tuple[dict[str, Path], dict | None, Path, bytes | None]:
    """The safetensors files of a checkpoint path (by index name), its index (if sharded), its folder,
    and the index's text."""
    if not path.exists():
        raise CheckpointError(path, "no such file or folder")
    if path.is_file():
        if path.name == INDEX_NAME or path.suffix == ".json" and path.name.endswith(".index.json"):
            return _resolve_index(path)
        if path.suffix in PICKLE_SUFFIXES:
            raise CheckpointError(path, _PICKLE_HELP)
        return {path.name: path}, None, path.parent, None
    if not path.is_dir():
        raise CheckpointError(path, "neither a regular file nor a folder (a device, FIFO or socket): a checkpoint "
                                    "is a .safetensors file or a folder of them")
    index_path = path / INDEX_NAME
    if index_path.exists():
        return _resolve_index(index_path)
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if len(indexes) == 1:
        return _resolve_index(indexes[0])
    files = sorted(path.glob("*.safetensors"))
    if not files:
        if any(next(path.glob(f"*{s}"), None) for s in PICKLE_SUFFIXES):
            raise CheckpointError(path, _PICKLE_HELP)
        raise CheckpointError(path, "no .safetensors file in this folder")
    if len(files) > 1:
        raise CheckpointError(
            path, f"{len(files)} .safetensors files but no {INDEX_NAME} to say how they form one checkpoint"
        )
    return {files[0].name: files[0]}, None, path, None


_PICKLE_HELP = (
    "pickle-based checkpoints (.bin/.pt/.pth) are not read: unpickling runs arbitrary code. Convert to "
    "safetensors first, e.g. safetensors.torch.save_file(torch.load(path, weights_only=True), 'model.safetensors')"
)


def in_hf_cache_blobs(folder: Path, path: Path) -> bool:
    """Whether `path`, in a Hugging Face cache snapshot folder (`<repo>/snapshots/<rev>/`), is a link
    to a file of that repository's `blobs/`, as every file of a snapshot is."""
    blobs = folder.parent.parent / "blobs"
    return (folder.parent.name == "snapshots" and path.is_symlink() and path.resolve().parent == blobs.resolve()
            and path.resolve().is_file())


def _read_index(index_path: Path) -> tuple[object, bytes | None]:
    """The index file, parsed, and its text; a tensor listed twice is refused by name. The fast parser keeps the last
    of repeated keys, so a count decides whether any repeats: every string in the text has two quote
    characters (more, with escaped quotes), so the text holds exactly twice as many quotes as the
    parsed value has strings (keys and string values) only when parsing lost none, i.e. no key repeats.
    Otherwise the slow parse names the tensor (or finds an escaped quote, and nothing wrong)."""
    try:
        with open_regular(index_path) as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError:
        raw = None
    if raw is not None and len(raw) <= MAX_JSON_BYTES:
        try:
            index = orjson.loads(raw) if orjson else json.loads(raw)
        except (ValueError, RecursionError):
            index = None
        if index is not None and raw.count(b'"') == 2 * _strings(index):
            return index, raw
    index = read_json_file(index_path, object_pairs_hook=_reject_duplicates(index_path))  # names the problem
    return index, None


def _strings(value) -> int:
    """How many strings a parsed JSON value holds: object keys and string values, at any depth."""
    if isinstance(value, str):
        return 1
    if isinstance(value, dict):
        values = value.values()
        if set(map(type, values)) <= {str}:  # a weight_map: 10^5 entries counted in C
            return 2 * len(value)
        return len(value) + sum(map(_strings, values))
    if isinstance(value, list):
        return sum(map(_strings, value))
    return 0


def _resolve_index(index_path: Path) -> tuple[dict[str, Path], dict, Path, bytes | None]:
    folder = index_path.parent
    index, text = _read_index(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not set(map(type, weight_map.values())) <= {str}:
        raise CheckpointError(index_path, "no weight_map object mapping tensor names to file names")
    root = folder.resolve()
    files: dict[str, Path] = {}
    for name in dict.fromkeys(weight_map.values()):  # each file once, in index order
        candidate = folder / name
        nul = "\0" in name  # no file has such a name; resolving it raised ValueError
        outside = not nul and (os.path.isabs(name) or os.path.normpath(name).startswith("..")
                               or not (candidate.resolve().is_relative_to(root) or in_hf_cache_blobs(folder, candidate)))
        if nul or outside or not candidate.is_file():
            tensor = next(t for t, n in weight_map.items() if n == name)
            problem = ("holds a NUL character, which no file name can" if nul else "is outside the checkpoint folder"
                       if outside else "is not a regular file (a folder, FIFO, device or socket)"
                       if candidate.exists() else "does not exist")
            raise CheckpointError(index_path, f"file {name!r} {problem}", tensor=tensor)
        files[name] = candidate
    return files, index, folder, text



def open_checkpoint(path) -> Checkpoint:
    """Read every header of the checkpoint at `path` and validate them together."""
    with gc_paused():
        return _open_checkpoint(Path(path))


def _open_checkpoint(path: Path) -> Checkpoint:
    files, index, folder, index_text = _resolve_files(path)
    shards = [read_header(f) for f in files.values()]
    if index is not None:
        weight_map = index["weight_map"]
        listed = all(set(map(weight_map.get, s.names)) == {name} or not len(s) for name, s in zip(files, shards))
        if not listed or len(weight_map) != sum(map(len, shards)):  # in C; then the problem is named:
            tensors = {}  # a tensor stored twice first (the index cannot list both), then the index
            for shard in shards:
                before = len(tensors)
                tensors.update(zip(shard.names, repeat(shard)))
                if len(tensors) != before + len(shard):
                    _raise_duplicate(shards, shard)
            _check_index(folder / INDEX_NAME if (folder / INDEX_NAME).exists() else path, weight_map,
                         dict(zip(files, shards)), tensors)
    return Checkpoint(path, shards, None, read_config(folder), None if index_text else index, index_text)


def _check_index(index_path: Path, weight_map: dict[str, str], shards: dict[str, ShardHeader],
                 tensors: dict) -> None:
    """The index must list every tensor, each in the shard whose header holds it."""
    for file_name, shard in shards.items():
        tensor = next((t for t in shard.names if weight_map.get(t) != file_name), None)
        if tensor is not None:
            if tensor in weight_map:
                raise CheckpointError(index_path, f"listed in {weight_map[tensor]} but stored in {file_name}",
                                      tensor=tensor)
            raise CheckpointError(shard.path, f"not listed in {index_path.name}", tensor=tensor)
    if len(weight_map) != len(tensors):
        tensor, name = next((t, n) for t, n in weight_map.items() if t not in tensors)
        raise CheckpointError(index_path, f"listed in {name} but not in that file's header", tensor=tensor)


def _raise_duplicate(shards: list[ShardHeader], shard: ShardHeader) -> None:
    earlier = {t.name: s for s in shards[:shards.index(shard)] for t in s.tensors}
    name = next(t.name for t in shard.tensors if t.name in earlier)
    raise CheckpointError(shard.path, f"tensor also stored in {earlier[name].path.name}", tensor=name)
