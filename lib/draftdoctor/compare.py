"""Compare two checkpoints tensor by tensor: is the converted, fixed or served copy the training output?

Typical pairs: the training output against the copy a converter wrote (did the values survive?), a
draft against its target (is the embedding the target's?). Tensors are paired, in order:

1. by name, once both sides' names are read the way the engines' rename rules read them (`model.`
   stripped, `midlayer.` as `layers.0.`: `renames.py`'s mappers);
2. by parts: a fused `qkv_proj`/`gate_up_proj` on one side against its q/k/v or gate/up parts on
   the other (the engines' own stacking, `engines.STACKED`), the parts' bytes taken in order;
3. by content: a tensor left unpaired is paired with one of the other side holding the same bytes,
   whatever either is called (a renamed or moved tensor).

Each pair is one of: same bytes; same values in another dtype; different values (largest absolute
difference, relative L2 distance); only in A; only in B. Everything streams in bounded chunks, a chunk
of each side at a time: a pair's bytes are compared as read (as `cmp` does), pairs whose bytes differ
are read again by value, and only tensors left unpaired by name are hashed. numpy only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from .checkpoint import CheckpointError, open_checkpoint
from .engines.profile import STACKED
from .frames import frame
from .renames import MIDLAYER_TO_LAYERS, STRIP_MODEL
from .values import FLOATS, decode

SAME_BYTES, SAME_VALUES, DIFFERENT, ONLY_A, ONLY_B = ("same bytes", "same values, another dtype", "different values",
                                                      "only in A", "only in B")
CHUNK_BYTES = 8 << 20  # what one read brings in: the memory a comparison holds per side
DECODABLE = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64,
             "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
CANONICAL = STRIP_MODEL + MIDLAYER_TO_LAYERS  # names as every engine's rename rules read them


@dataclass
class Pair:
    """Two tensors (or one, unpaired) and how they compare. A fused side names its parts joined by +."""

    status: str
    a: str | None
    b: str | None
    paired_by: str  # "name" | "parts" | "content" | ""
    dtype_a: str | None = None
    dtype_b: str | None = None
    shape_a: tuple | None = None
    shape_b: tuple | None = None
    max_abs_diff: float | None = None
    rel_l2: float | None = None
    detail: str = ""


@dataclass
class Comparison:
    """Every tensor of A and B, paired (or not), and whether the two hold the same values."""

    a: str
    b: str
    pairs: list[Pair] = field(default_factory=list)

    @property
    def same(self) -> bool:
        """Whether every tensor of each side has a partner holding the same values."""
        return all(p.status in (SAME_BYTES, SAME_VALUES) for p in self.pairs)

    def counts(self) -> dict[str, int]:
        return {s: sum(p.status == s for p in self.pairs) for s in (SAME_BYTES, SAME_VALUES, DIFFERENT, ONLY_A, ONLY_B)}

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "same": self.same, "counts": self.counts(),
                "pairs": [asdict(p) for p in self.pairs]}

    def frame(self):
        return frame([asdict(p) for p in self.pairs])


class _Reader:
    """Byte ranges of a checkpoint's tensors, one open descriptor per file."""

    def __init__(self):
        self.fds = {}

    def chunks(self, parts, size: int | None = None):
        """The bytes of `parts` (tensors, in order) in chunks of at most `size` (default CHUNK_BYTES)."""
        size = size or CHUNK_BYTES
        for t in parts:
            fd = self.fds.get(t.file)
            if fd is None:
                fd = self.fds[t.file] = os.open(t.file, os.O_RDONLY)
            offset = t.begin
            while offset < t.end:
                data = os.pread(fd, min(size, t.end - offset), offset)
                if not data:
                    raise CheckpointError(t.file, f"ends inside tensor {t.name} (changed while being read?)")
                offset += len(data)
                yield data

    def same_bytes(self, a_parts, b_parts) -> bool:
        """Whether the two byte streams are equal, read a chunk of each at a time (stops at the first
        difference)."""
        if sum(t.nbytes for t in a_parts) != sum(t.nbytes for t in b_parts):
            return False
        return all(x == y for x, y in zip(_fixed(self.chunks(a_parts)), _fixed(self.chunks(b_parts))))

    def digest(self, parts) -> str:
        h = hashlib.sha256()
        for data in self.chunks(parts):
            h.update(data)
        return h.hexdigest()

    def close(self):
        for fd in self.fds.values():
            os.close(fd)


def _fixed(chunks, size: int | None = None):
    """`chunks` re-cut into pieces of exactly `size` bytes (default CHUNK_BYTES; the last may be shorter)."""
    size = size or CHUNK_BYTES
    pending = b""
    for data in chunks:
        pending = pending + data if pending else data
        while len(pending) >= size:
            yield pending[:size]
            pending = pending[size:]
    if pending:
        yield pending


def _decode(raw: bytes, dtype: str) -> np.ndarray:
    if dtype in FLOATS:  # signalling NaNs made quiet, so numpy prints no warning (values.decode)
        return decode(raw, dtype)
    return np.frombuffer(raw, dtype=DECODABLE[dtype]).astype(np.float64)


def _elements(reader: _Reader, parts, dtype: str, per_chunk: int):
    """The values of `parts` in float64 chunks of `per_chunk` elements (the last may be shorter)."""
    item = ITEM_BYTES[dtype]
    pending = b""
    for data in reader.chunks(parts, per_chunk * item):
        pending += data
        while len(pending) >= per_chunk * item:
            yield _decode(pending[:per_chunk * item], dtype)
            pending = pending[per_chunk * item:]
    if pending:
        yield _decode(pending, dtype)


def _numel(parts) -> int:
    return sum(int(np.prod(t.shape, dtype=np.int64)) for t in parts)


def _value_difference(reader: _Reader, a_parts, b_parts, pair: Pair) -> Pair:
    """Fill `pair` from the values of both sides, streamed in step."""
    da, db = a_parts[0].dtype, b_parts[0].dtype
    if _numel(a_parts) != _numel(b_parts):
        pair.status, pair.detail = DIFFERENT, f"{_numel(a_parts)} elements against {_numel(b_parts)}"
        return pair
    if da not in DECODABLE or db not in DECODABLE or len({t.dtype for t in a_parts}) > 1 or len({t.dtype for t in b_parts}) > 1:
        pair.status, pair.detail = DIFFERENT, "bytes differ; dtype not compared by value"
        return pair
    per_chunk = CHUNK_BYTES // 8
    largest, squares, norm = 0.0, 0.0, 0.0
    for x, y in zip(_elements(reader, a_parts, da, per_chunk), _elements(reader, b_parts, db, per_chunk)):
        both_nan = np.isnan(x) & np.isnan(y)
        diff = np.where(both_nan, 0.0, np.abs(x - y))
        if np.isnan(diff).any():
            largest = float("nan")
        elif not np.isnan(largest):
            largest = max(largest, float(diff.max(initial=0.0)))
        squares += float(np.nansum(diff * diff))
        norm += float(np.nansum(np.where(both_nan, 0.0, x * x)))
    pair.max_abs_diff = largest
    pair.rel_l2 = (squares ** 0.5) / (norm ** 0.5) if norm else (0.0 if squares == 0 else float("inf"))
    pair.status = SAME_VALUES if largest == 0.0 and da != db else DIFFERENT
    if pair.status == DIFFERENT and largest == 0.0:
        pair.detail = "equal values, other bytes (e.g. -0.0 against 0.0, or NaN payloads)"
    return pair


def _fused_groups(names: dict[str, list]) -> dict[str, list[str]]:
    """{fused canonical name: its parts' canonical names, in stacking order} for parts present here."""
    groups: dict[str, list[tuple[object, str]]] = {}
    for name in names:
        for part, fused, shard in STACKED:
            marker = part + "."
            if marker in name:
                groups.setdefault(name.replace(marker, fused + ".", 1), []).append((shard, name))
    order = {}
    for part, fused, shard in STACKED:
        order.setdefault(fused, []).append(shard)
    out = {}
    for fused_name, found in groups.items():
        fused = next(f for _, f, _ in STACKED if f + "." in fused_name)
        if len(found) == len(order[fused]):
            out[fused_name] = [n for _, n in sorted(found, key=lambda item: order[fused].index(item[0]))]
    return out


def compare(a, b) -> Comparison:
    """Pair every tensor of checkpoint `a` with one of `b` (see the module docstring) and say how each
    pair compares. Raises CheckpointError for a path that is not a readable checkpoint."""
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    side_a = {CANONICAL.map(n): [t] for n, t in ca.tensors.items()}
    side_b = {CANONICAL.map(n): [t] for n, t in cb.tensors.items()}
    reader = _Reader()
    result = Comparison(str(a), str(b))
    try:
        pairs: list[tuple[list, list, str]] = []
        for name in [n for n in side_a if n in side_b]:
            pairs.append((side_a.pop(name), side_b.pop(name), "name"))
        for mine, theirs, flip in ((side_a, side_b, False), (side_b, side_a, True)):
            for fused, parts in _fused_groups(mine).items():
                if fused in theirs and all(p in mine for p in parts):
                    joined = [mine.pop(p)[0] for p in parts]
                    other = theirs.pop(fused)
                    pairs.append((other, joined, "parts") if flip else (joined, other, "parts"))
        digests_b = {}
        for name, parts in side_b.items():
            digests_b.setdefault(reader.digest(parts), []).append(name)
        for name, parts in list(side_a.items()):
            found = digests_b.get(reader.digest(parts))
            if found:
                pairs.append((side_a.pop(name), side_b.pop(found.pop(0)), "content"))
        for a_parts, b_parts, how in pairs:
            pair = Pair("", "+".join(t.name for t in a_parts), "+".join(t.name for t in b_parts), how,
                        a_parts[0].dtype, b_parts[0].dtype, tuple(a_parts[0].shape) if len(a_parts) == 1 else None,
                        tuple(b_parts[0].shape) if len(b_parts) == 1 else None)
            if how == "content" or reader.same_bytes(a_parts, b_parts):
                pair.status = SAME_BYTES
            else:
                _value_difference(reader, a_parts, b_parts, pair)
            result.pairs.append(pair)
        result.pairs += [Pair(ONLY_A, t.name, None, "", t.dtype, None, tuple(t.shape)) for [t] in side_a.values()]
        result.pairs += [Pair(ONLY_B, None, t.name, "", None, t.dtype, None, tuple(t.shape)) for [t] in side_b.values()]
    finally:
        reader.close()
    return result
