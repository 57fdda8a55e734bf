"""Safetensors files written directly, for the synthetic checkpoints of tests and benchmarks (`synth.py`).

No torch: tensors are numpy arrays or (dtype, shape) entries, filled with seeded values that read as
trained (`trained_like`) or left as sparse holes (no disk, read as zeros); the file is written as the
format is (8-byte length, JSON header, packed data), so a multi-GB checkpoint costs no memory and a
sparse one no disk. Also: tensors split over shards with an index, and a published draft rebuilt from
its header alone (`write_header_only`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .checkpoint import INDEX_NAME, encode_header

NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "BOOL": np.bool_, "I32": np.int32}
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "BOOL": 1, "I32": 4, "F8_E4M3": 1}


def write_safetensors(path, tensors: dict, metadata: dict | None = None, fill: str = "random", seed: int = 0) -> None:
    """Write `tensors` ({name: ndarray or (dtype, shape)}) to `path`.

    `fill` for (dtype, shape) entries: "random" (seeded data), or "sparse" (a hole: no disk, reads as zeros).
    """
    rng = np.random.default_rng(seed)
    entries = []
    for name, value in tensors.items():
        if isinstance(value, np.ndarray):
            dtype = {v: k for k, v in NUMPY_DTYPES.items()}[value.dtype.type]
            shape, nbytes = value.shape, value.nbytes
        else:
            dtype, shape = value
            nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[dtype]
        entries.append((name, value, dtype, shape, nbytes))
    with open(path, "wb") as f:
        f.write(encode_header([(name, dtype, shape, nbytes) for name, _, dtype, shape, nbytes in entries],
                              metadata or None))
        for name, value, dtype, shape, nbytes in entries:
            if isinstance(value, np.ndarray):
                f.write(np.ascontiguousarray(value).tobytes())
            elif fill == "sparse":
                f.seek(nbytes, os.SEEK_CUR)
            else:
                f.write(_random_bytes(rng, name, dtype, shape, nbytes))
        f.truncate()


def _random_bytes(rng, name: str, dtype: str, shape, nbytes: int) -> bytes:
    if dtype in ("F16", "BF16", "F32"):
        # Chunked so that multi-GB tensors never sit in memory whole. Synthetic weights stand for trained
        # ones, not a fresh model's (draftdoctor.values): Laplace values wider than any initialiser, and
        # in a matrix, rows and columns of unequal length (as training leaves them), so that no matrix
        # reads as i.i.d. noise.
        item = DTYPE_BYTES[dtype]
        count = nbytes // item
        width = int(shape[-1]) if len(shape) >= 2 and shape[-1] else count
        columns = np.exp(0.5 * rng.standard_normal(width)) if len(shape) >= 2 else np.ones(width)
        per_chunk = max(1, (1 << 22) // width) * width
        return b"".join(_encode(trained_like(rng, columns, min(per_chunk, count - i), len(shape) >= 2), dtype)
                        for i in range(0, count, per_chunk))
    return rng.bytes(nbytes)


def trained_like(rng, columns: np.ndarray, count: int, rows_vary: bool = True) -> np.ndarray:
    """`count` values (whole rows of len(columns), but for a last partial one) that read as trained:
    Laplace(0, 0.03) times each column's scale in `columns` and, if `rows_vary`, a log-normal scale per row."""
    width = len(columns)
    rows = -(-count // width)
    values = rng.laplace(0.0, 0.03, (rows, width)) * columns
    if rows_vary:
        values *= np.exp(0.5 * rng.standard_normal((rows, 1)))
    return values.ravel()[:count]


def _encode(values: np.ndarray, dtype: str) -> bytes:
    """float values as `dtype`'s bytes (bf16: float32 rounded to nearest even)."""
    if dtype == "BF16":
        bits = values.astype(np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
    return values.astype(NUMPY_DTYPES[dtype]).tobytes()


def write_shards(folder: Path, tensors: dict, shards: int, fill: str = "random", metadata: dict | None = None) -> None:
    """Split `tensors` over `shards` files (with an index when more than one)."""
    if shards == 1:
        write_safetensors(folder / "model.safetensors", tensors, metadata or {"format": "pt"}, fill=fill)
        return
    names = list(tensors)
    weight_map, total = {}, 0
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(folder / file, part, metadata or {"format": "pt"}, fill=fill, seed=i)
        for n, v in part.items():
            weight_map[n] = file
            total += v.nbytes if isinstance(v, np.ndarray) else int(np.prod(v[1])) * DTYPE_BYTES[v[0]]
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


HEADER_ONLY_FORMAT = "draftdoctor-header-only/1"


def write_header_only(folder, layout: dict, config: dict | None) -> Path:
    """A published draft rebuilt from its header alone (tests/corpus/public: `tensors.json`, format
    HEADER_ONLY_FORMAT): every tensor's name, dtype and shape, data as a sparse hole (no disk, reads as
    zeros), in the published shards (`shards`, else one model.safetensors: a published `.bin` is
    rebuilt as safetensors, which every engine reads too), with the header's `metadata` (`{"format": "pt"}`, as
    transformers writes, unless the list says otherwise; null: none), and its config.json."""
    if layout.get("format") != HEADER_ONLY_FORMAT:
        raise ValueError(f"not a {HEADER_ONLY_FORMAT} tensor list")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: (t["dtype"], tuple(t["shape"])) for name, t in layout["tensors"].items()}
    shards = layout.get("shards") or {"model.safetensors": list(tensors)}
    metadata = layout.get("metadata", {"format": "pt"})  # null: the writer wrote no __metadata__
    for file, names in shards.items():
        write_safetensors(folder / file, {n: tensors[n] for n in names}, metadata, fill="sparse")
    if len(shards) > 1:
        weight_map = {n: file for file, names in shards.items() for n in names}
        total = sum(int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[dtype] for dtype, shape in tensors.values())
        (folder / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
