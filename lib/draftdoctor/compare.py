"""Compare two checkpoints: which tensors differ and how, and whether their configs mean the same.

Typical pairs: the training output against the copy a converter wrote (did the values survive?), a
draft against its target (is the embedding the target's?). Tensors are paired, in order:

1. by name, once both sides' names are read the way the engines' rename rules read them (`model.`
   stripped, `midlayer.` as `layers.0.`: `renames.py`'s mappers). Names the rules read as one (a side
   holding both `layers.0.X` and `midlayer.X`) are a *name collision*: every one of them is kept, paired
   within its group (the same bytes first, then the same name) and reported, none silently dropped;
2. by parts: a fused `qkv_proj`/`gate_up_proj` on one side against its q/k/v or gate/up parts on
   the other (the engines' own stacking, `engines.STACKED`), the parts' bytes taken in order;
3. by content: a tensor left unpaired is paired with one of the other side holding the same bytes,
   whatever either is called (a renamed or moved tensor).

Each pair is one of `STATUSES`: same bytes (dtype and shape too: identical); same values in another
dtype; same values in another shape; different values, with how they differ (`relations.py`: the same
bytes read as another dtype, non-finite values introduced, rounded to another dtype, scaled by k,
transposed, rows permuted, unrelated or a fresh initialisation, else the numbers); a name collision;
only in A; only in B. Only identical tensors are the same: the same bytes under another dtype or
shape are a difference. The configs are compared by meaning (`meanings.py`).

Reads stay bounded. A pair's bytes are compared as read, a chunk of each side at a time (as `cmp`
does); a pair whose bytes differ is read again by value, in chunks (differences, the sums behind the
correlation and the scale, non-finite counts), then sampled (`SAMPLE_VALUES` per side: a contiguous
block of rows and runs of random rows) for what needs positions (rounding, transposition, noise);
rows are hashed, in chunks, only for a pair whose sums allow a permutation; of the tensors left
unpaired by name, only those of a size the other side also has are hashed. numpy only.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from dataclasses import asdict, dataclass, field

import numpy as np

from . import relations as R
from .checkpoint import CheckpointError, open_checkpoint
from .engines.profile import STACKED
from .frames import frame
from .engines import resolve_engine
from .meanings import ConfigComparison, compare_configs, target_layers
from .renames import MIDLAYER_TO_LAYERS, STRIP_MODEL
from .values import FLOATS, decode

SAME_BYTES, SAME_VALUES, ANOTHER_SHAPE, DIFFERENT, COLLISION, ONLY_A, ONLY_B = (
    "same bytes", "same values, another dtype", "same values, another shape", "different values", "name collision",
    "only in A", "only in B")
STATUSES = (SAME_BYTES, SAME_VALUES, ANOTHER_SHAPE, DIFFERENT, COLLISION, ONLY_A, ONLY_B)
CHUNK_BYTES = 8 << 20  # what one read brings in: the memory a comparison holds per side
SAMPLE_VALUES = 1 << 20  # values sampled per side of a differing pair (8 MB as float64)
SAMPLE_RUNS = 64  # the random part of a sample: this many runs of neighbouring rows
MAX_HASHED_ROWS = 1 << 22  # a permutation is looked for among at most this many rows (32 MB of hashes a side)
DECODABLE = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64,
             "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
CANONICAL = STRIP_MODEL + MIDLAYER_TO_LAYERS  # names as every engine's rename rules read them


@dataclass
class Pair:
    """Two tensors (or one, unpaired) and how they compare. A fused side names its parts joined by +
    (its shape: the parts stacked)."""

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
    relation: str = ""  # how the values differ (relations.RELATIONS), "" when no relation was found
    correlation: float | None = None
    collision: str = ""  # the names on a side that the rename rules read as this pair's one name


@dataclass
class Comparison:
    """Every tensor of A and B, paired (or not), how each pair compares, and the configs by meaning."""

    a: str
    b: str
    pairs: list[Pair] = field(default_factory=list)
    configs: ConfigComparison = field(default_factory=ConfigComparison)

    @property
    def same_tensors(self) -> bool:
        """Whether every tensor of each side has a partner with the same bytes, dtype and shape."""
        return all(p.status == SAME_BYTES for p in self.pairs)

    @property
    def same(self) -> bool:
        """Identical tensors, and configs that mean the same (or were not compared)."""
        return self.same_tensors and self.configs.same is not False

    def counts(self) -> dict[str, int]:
        return {s: sum(p.status == s for p in self.pairs) for s in STATUSES}

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "same": self.same, "same_tensors": self.same_tensors, "counts": self.counts(),
                "pairs": [asdict(p) for p in self.pairs], "configs": self.configs.to_dict()}

    def frame(self):
        return frame([asdict(p) for p in self.pairs])


class _Reader:
    """Byte ranges of a checkpoint's tensors, one open descriptor per file; no read is larger than
    CHUNK_BYTES."""

    def __init__(self):
        self.fds = {}

    def _range(self, t, offset: int, length: int, size: int):
        fd = self.fds.get(t.file)
        if fd is None:
            fd = self.fds[t.file] = os.open(t.file, os.O_RDONLY)
        offset, end = t.begin + offset, t.begin + offset + length
        while offset < end:
            data = os.pread(fd, min(size, end - offset), offset)
            if not data:
                raise CheckpointError(t.file, f"ends inside tensor {t.name} (changed while being read?)")
            offset += len(data)
            yield data

    def chunks(self, parts, size: int | None = None):
        """The bytes of `parts` (tensors, in order) in chunks of at most `size` (default CHUNK_BYTES)."""
        size = min(size or CHUNK_BYTES, CHUNK_BYTES)
        for t in parts:
            yield from self._range(t, 0, t.nbytes, size)

    def window(self, parts, start: int, length: int) -> bytes:
        """`length` bytes of `parts` (tensors, in order, as one stream) from byte `start`."""
        out = []
        for t in parts:
            if length <= 0:
                break
            if start >= t.nbytes:
                start -= t.nbytes
                continue
            take = min(length, t.nbytes - start)
            out += self._range(t, start, take, CHUNK_BYTES)
            length, start = length - take, 0
        return b"".join(out)

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


def _dtype(parts) -> str:
    """The parts' dtype, or theirs joined by + when they differ."""
    dtypes = [t.dtype for t in parts]
    return dtypes[0] if len(set(dtypes)) == 1 else "+".join(dtypes)


def _shape(parts) -> tuple | None:
    """A tensor's shape; parts' stacked along their first dim (None when their other dims differ)."""
    if len(parts) == 1:
        return tuple(parts[0].shape)
    if any(not t.shape for t in parts) or len({tuple(t.shape[1:]) for t in parts}) > 1:
        return None
    return (sum(t.shape[0] for t in parts), *parts[0].shape[1:])


def _geometry(shape: tuple | None, numel: int) -> tuple[int, int]:
    """(rows, values per row) of a tensor seen as a matrix: its first dim against the rest."""
    if shape and len(shape) >= 2 and shape[0]:
        return shape[0], numel // shape[0]
    return numel, 1


def _runs(index: np.ndarray, width: int) -> list[tuple[int, int]]:
    """Sorted row indices as (first value, values) windows, neighbouring rows merged."""
    if not len(index):
        return []
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    return [(int(run[0]) * width, len(run) * width) for run in np.split(index, breaks)]


def _plan(rows: int, width: int, seed: int) -> tuple[np.ndarray | None, list[tuple[int, int]]]:
    """(row indices, element windows) of a bounded sample: every row when they fit in SAMPLE_VALUES,
    else a contiguous block of half the rows that fit plus SAMPLE_RUNS runs of random rows; rows too
    long for 16 to fit give windows of values instead (row indices None)."""
    if rows * width <= SAMPLE_VALUES:
        return np.arange(rows), [(0, rows * width)]
    rng = np.random.default_rng(seed)
    fit = SAMPLE_VALUES // width
    if fit >= 2 * R.MIN_NOISE_ROWS:
        block = fit // 2
        run = max(1, (fit - block) // SAMPLE_RUNS)
        starts = [int(rng.integers(0, rows - block + 1))] + list(rng.integers(0, rows - run + 1, SAMPLE_RUNS))
        lengths = [block] + [run] * SAMPLE_RUNS
        index = np.unique(np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)]))
        return index, _runs(index, width)
    total, block = rows * width, SAMPLE_VALUES // 2
    run = block // SAMPLE_RUNS
    spans = sorted([(int(rng.integers(0, total - block + 1)), block)]
                   + [(int(s), run) for s in rng.integers(0, total - run + 1, SAMPLE_RUNS)])
    merged = []
    for start, n in spans:  # overlapping windows read once
        if merged and start <= merged[-1][0] + merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], start + n - merged[-1][0]))
        else:
            merged.append((start, n))
    return None, merged


class _Side:
    """One side of a differing pair: its parts, dtype, shape, and bounded samples of its values."""

    def __init__(self, reader: _Reader, parts, seed: int):
        self.reader, self.parts, self.seed = reader, parts, seed
        self.dtype, self.shape, self.numel = _dtype(parts), _shape(parts), _numel(parts)
        self.rows, self.width = _geometry(self.shape, self.numel)
        self._sampled = {}

    def values(self, windows) -> np.ndarray:
        item = ITEM_BYTES[self.dtype]
        return np.concatenate([_decode(self.reader.window(self.parts, start * item, n * item), self.dtype)
                               for start, n in windows]) if windows else np.zeros(0)

    def sample(self, rows: int, width: int) -> tuple[np.ndarray | None, np.ndarray]:
        """(row indices, values) of the sample `_plan` makes for this geometry (values rows x width
        when the rows are whole, else flat). One plan per geometry, so equal shapes sample alike."""
        if (rows, width) not in self._sampled:
            index, windows = _plan(rows, width, self.seed)
            values = self.values(windows)
            self._sampled[rows, width] = (index, values.reshape(-1, width) if index is not None else values)
        return self._sampled[rows, width]

    def own_rows(self) -> tuple[np.ndarray | None, np.ndarray]:
        return self.sample(self.rows, self.width)


def _scale_tolerance(a: _Side, b: _Side) -> float:
    """How far (relative L2) B may stray from k x A and still be A scaled: both dtypes' rounding."""
    return max(2 * (R.unit_roundoff(a.dtype) + R.unit_roundoff(b.dtype)), 1e-12)


def _aligned(a: _Side, b: _Side) -> tuple[np.ndarray, np.ndarray]:
    """Samples of both sides at the same positions: the same rows when the shapes are equal, else the
    same values in memory order."""
    geometry = (a.rows, a.width) if a.shape == b.shape else (a.numel, 1)
    return a.sample(*geometry)[1].ravel(), b.sample(*geometry)[1].ravel()


def _stream(reader: _Reader, a: _Side, b: _Side) -> R.Sums:
    """Every value of both sides, in step, a chunk at a time, into one `relations.Sums` (whose scale
    is the one a sample suggests)."""
    sums = R.Sums(k=R.sample_scale(*_aligned(a, b), _scale_tolerance(a, b)))
    per_chunk = CHUNK_BYTES // 8
    for x, y in zip(_elements(reader, a.parts, a.dtype, per_chunk), _elements(reader, b.parts, b.dtype, per_chunk)):
        sums.add(x, y)
    return sums


def _weights(columns: np.ndarray) -> np.ndarray:
    """An odd 64-bit weight per column index (splitmix64): a row's hash is its words weighted so."""
    z = columns.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))) | np.uint64(1)


def _row_hashes(side: _Side) -> np.ndarray:
    """A 64-bit hash of each row's bytes (sum of its words times per-column weights, modulo 2^64),
    read a chunk at a time."""
    item, word = ITEM_BYTES[side.dtype], WORDS[ITEM_BYTES[side.dtype]]
    per_chunk = CHUNK_BYTES // 8  # elements per read: the uint64 words take CHUNK_BYTES
    hashes = np.zeros(side.rows, dtype=np.uint64)
    width = side.width
    if width <= per_chunk:
        weights, step = _weights(np.arange(width)), per_chunk // width
        for r0 in range(0, side.rows, step):
            r1 = min(side.rows, r0 + step)
            raw = side.reader.window(side.parts, r0 * width * item, (r1 - r0) * width * item)
            words = np.frombuffer(raw, dtype=word).astype(np.uint64).reshape(r1 - r0, width)
            hashes[r0:r1] = (words * weights).sum(axis=1, dtype=np.uint64)
        return hashes
    for r in range(side.rows):
        for c0 in range(0, width, per_chunk):
            c1 = min(width, c0 + per_chunk)
            raw = side.reader.window(side.parts, (r * width + c0) * item, (c1 - c0) * item)
            words = np.frombuffer(raw, dtype=word).astype(np.uint64)
            hashes[r] += (words * _weights(np.arange(c0, c1))).sum(dtype=np.uint64)
    return hashes


def _may_be_permuted(a: _Side, b: _Side, sums: R.Sums) -> bool:
    """Same dtype and shape, rows worth hashing, and sums equal as a reordering of rows leaves them."""
    if a.dtype != b.dtype or a.shape != b.shape or not a.shape or len(a.shape) < 2:
        return False
    if not 2 <= a.rows <= MAX_HASHED_ROWS or sums.finite != sums.values:
        return False
    scale = (sums.saa * sums.finite) ** 0.5  # bounds |sum a|: the sums' rounding is relative to it
    return abs(sums.saa - sums.sbb) <= 1e-9 * max(sums.saa, sums.sbb) and abs(sums.sa - sums.sb) <= 1e-9 * scale


def _constant_detail(sums: R.Sums, side: str, other: str) -> tuple[str, str]:
    value = (sums.sb if side == "B" else sums.sa) / sums.finite
    fresh = any(abs(value - c) <= 1e-9 for c in R.INIT_CONSTANTS)
    return (R.FRESH if fresh else R.UNRELATED,
            f"{side} holds one value ({value:.6g}) everywhere"
            + (", as a fresh model's norms and biases do" if fresh else "") + f"; {other} does not")


def _noise_like(side: _Side) -> bool:
    """Whether a float side's sampled rows look like i.i.d. noise (relations.noise_like)."""
    if side.dtype not in R.FLOAT_FORMAT:
        return False
    index, rows = side.own_rows()
    return index is not None and R.noise_like(rows)


def _relation(a: _Side, b: _Side, sums: R.Sums, bytes_equal: bool) -> tuple[str, str]:
    """(relations.RELATIONS entry or "", detail) for a pair whose values differ."""
    if bytes_equal:
        return R.SAME_BYTES_OTHER_DTYPE, f"the same bytes, read as {a.dtype} in A and {b.dtype} in B"
    if sums.only_b_nonfinite or sums.only_a_nonfinite:
        where = "; ".join(f"{n} NaN/inf value(s) in {side} where {other} is finite" for n, side, other in (
            (sums.only_b_nonfinite, "B", "A"), (sums.only_a_nonfinite, "A", "B")) if n)
        rest = ("the finite values are equal" if sums.largest_finite == 0
                else f"the finite values differ too (largest difference {sums.largest_finite:.3g})")
        return R.NON_FINITE, f"{where}; {rest}"
    a_rows, b_rows = (a.rows, a.width), (b.rows, b.width)
    xa, xb = _aligned(a, b)
    found = R.rounded(xa, xb, a.dtype, b.dtype)
    if found and sums.rel_l2 <= 1.01 * R.unit_roundoff(found[0]):
        d, side, nearest = found
        stored = b.dtype if side == "B" else a.dtype
        return R.ROUNDED, (f"{side} is {'A' if side == 'B' else 'B'} rounded to {d}"
                           + (f" (stored as {stored})" if stored != d else "")
                           + ("" if nearest else ", truncated rather than rounded to nearest")
                           + f", as each of {xa.size} sampled values shows; relative L2 {sums.rel_l2:.3g}")
    tolerance = _scale_tolerance(a, b)
    k = sums.scale(tolerance)
    if k is not None and abs(k - 1) > tolerance:
        return R.SCALED, f"B = {k:.6g} x A, one factor for every value (to the dtypes' rounding)"
    if a.shape and b.shape and len(a.shape) == 2 and a.shape == b.shape[::-1] and min(a.shape) >= 2:
        ia, va = a.sample(*a_rows)
        ib, vb = b.sample(*b_rows)
        if ia is not None and ib is not None:
            floats = [d for d in (a.dtype, b.dtype) if d in R.FLOAT_FORMAT]
            narrow = None if a.dtype == b.dtype or not floats else min(floats, key=lambda d: R.FLOAT_FORMAT[d][0])
            matched = R.transposed(va, ia, vb, ib, narrow)
            if matched:
                return R.TRANSPOSED, (f"B ({b.shape[0]} x {b.shape[1]}) is A ({a.shape[0]} x {a.shape[1]}) transposed: "
                                      f"{matched} values of sampled rows crossed, every one equal")
    if _may_be_permuted(a, b, sums):
        ha, hb = _row_hashes(a), _row_hashes(b)
        if np.array_equal(np.sort(ha), np.sort(hb)):
            return R.PERMUTED, f"B holds A's {a.rows} rows in another order ({int((ha != hb).sum())} moved)"
    const_a, const_b = sums.constant("a"), sums.constant("b")
    if const_a != const_b:
        return _constant_detail(sums, "B" if const_b else "A", "A" if const_b else "B")
    if R.unrelated(sums):
        noise = [name for name, side in (("A", a), ("B", b)) if _noise_like(side)]
        text = f"correlation {sums.correlation:+.3f} ({sums.finite} values)"
        if noise:
            who = "A and B both look" if len(noise) == 2 else f"{noise[0]} looks"
            return R.FRESH, f"{text}; {who} like a fresh initialisation (i.i.d. noise, by its row and column norms)"
        return R.UNRELATED, text
    r = sums.correlation
    return "", "" if r is None else f"correlation {r:+.4f}"


def _judge(reader: _Reader, a_parts, b_parts, pair: Pair, bytes_equal: bool, seed: int) -> None:
    """Fill `pair`'s status, numbers and relation."""
    a, b = _Side(reader, a_parts, seed), _Side(reader, b_parts, seed)
    shapes = f"shaped {list(a.shape or ())} in A and {list(b.shape or ())} in B"
    if bytes_equal and a.dtype == b.dtype:
        pair.status, pair.detail = (SAME_BYTES, "") if a.shape == b.shape else (ANOTHER_SHAPE, f"the same bytes, {shapes}")
        return
    pair.status = DIFFERENT
    if a.numel != b.numel:
        pair.detail = f"{a.numel} values against {b.numel} ({shapes})"
        return
    if a.dtype not in DECODABLE or b.dtype not in DECODABLE:
        pair.relation = R.SAME_BYTES_OTHER_DTYPE if bytes_equal else ""
        pair.detail = (f"the same bytes under {a.dtype} and {b.dtype} (not decoded)" if bytes_equal
                       else "bytes differ; dtype not compared by value")
        return
    sums = _stream(reader, a, b)
    pair.max_abs_diff, pair.rel_l2, pair.correlation = sums.largest, sums.rel_l2, sums.correlation
    if sums.equal:
        if a.dtype != b.dtype:
            pair.status, pair.detail = SAME_VALUES, "" if a.shape == b.shape else shapes
        elif a.shape != b.shape:
            pair.status, pair.detail = ANOTHER_SHAPE, f"equal values, {shapes}"
        else:
            pair.detail = "equal values, other bytes (e.g. -0.0 against 0.0, or NaN payloads)"
        return
    pair.relation, pair.detail = _relation(a, b, sums, bytes_equal)
    if pair.relation in (R.TRANSPOSED, R.PERMUTED):  # numbers taken in memory order describe another alignment
        pair.max_abs_diff = pair.rel_l2 = pair.correlation = None
    elif a.shape != b.shape:
        pair.detail = f"{pair.detail}; compared in memory order, {shapes}".lstrip("; ")


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


def _groups(tensors: dict) -> dict[str, list]:
    """{canonical name: the tensors whose names the rename rules read as it}."""
    groups: dict[str, list] = {}
    for name, t in tensors.items():
        groups.setdefault(CANONICAL.map(name), []).append(t)
    return groups


def _pair_group(reader: _Reader, mine: list, theirs: list):
    """Pairs within one colliding name group: the same bytes first, then the same name, then the last
    one of each side; returns (pairs, A's left, B's left)."""
    mine, theirs, pairs = list(mine), list(theirs), []
    for same in (lambda t, u: t.nbytes == u.nbytes and reader.same_bytes([t], [u]), lambda t, u: t.name == u.name):
        for t in list(mine):
            match = next((u for u in theirs if same(t, u)), None)
            if match is not None:
                pairs.append(([t], [match], "name"))
                mine.remove(t)
                theirs.remove(match)
    if len(mine) == 1 and len(theirs) == 1:
        pairs.append(([mine.pop()], [theirs.pop()], "name"))
    return pairs, mine, theirs


def _by_content(reader: _Reader, rest_a: list, rest_b: list):
    """Pairs of leftovers holding the same bytes; only sizes both sides have are hashed."""
    sizes_a = {sum(t.nbytes for t in parts) for parts in rest_a}
    digests_b: dict[str, list[int]] = {}
    for j, parts in enumerate(rest_b):
        if sum(t.nbytes for t in parts) in sizes_a:
            digests_b.setdefault(reader.digest(parts), []).append(j)
    sizes_b = {sum(t.nbytes for t in rest_b[j]) for js in digests_b.values() for j in js}
    pairs, left_a, used = [], [], set()
    for parts in rest_a:
        found = digests_b.get(reader.digest(parts)) if sum(t.nbytes for t in parts) in sizes_b else None
        if found:
            j = found.pop(0)
            used.add(j)
            pairs.append((parts, rest_b[j], "content"))
        else:
            left_a.append(parts)
    return pairs, left_a, [parts for j, parts in enumerate(rest_b) if j not in used]


def _mark_collisions(pairs: list[Pair], groups_a: dict, groups_b: dict, colliding: set) -> None:
    """Name every pair one of whose tensors shares its canonical name with another on its side; a
    collision that is not the same on both sides (the same names) is the pair's status."""
    names = {side: {t.name: c for c, ts in groups.items() if c in colliding for t in ts}
             for side, groups in (("A", groups_a), ("B", groups_b))}
    for pair in pairs:
        c = names["A"].get(pair.a) or names["B"].get(pair.b)
        if c is None:
            continue
        held = {side: sorted(t.name for t in groups.get(c, ())) for side, groups in (("A", groups_a), ("B", groups_b))}
        pair.collision = "; ".join(f"{side} holds {', '.join(ns)}" for side, ns in held.items() if len(ns) > 1) \
            + f" (one name to the engines' rename rules: {c})"
        if held["A"] != held["B"]:
            was = pair.status if pair.status not in (ONLY_A, ONLY_B) else f"no partner in {'B' if pair.b is None else 'A'}"
            pair.detail = f"{was}; {pair.detail}" if pair.detail else was
            pair.status = COLLISION


def _tensor_pairs(ca, cb) -> list[Pair]:
    groups_a, groups_b = _groups(ca.tensors), _groups(cb.tensors)
    colliding = {c for groups in (groups_a, groups_b) for c, ts in groups.items() if len(ts) > 1}
    side_a = {c: ts for c, ts in groups_a.items() if c not in colliding}
    side_b = {c: ts for c, ts in groups_b.items() if c not in colliding}
    reader = _Reader()
    try:
        found: list[tuple[list, list, str]] = []
        loose_a, loose_b = [], []
        for c in dict.fromkeys([*groups_a, *groups_b]):
            if c in colliding:
                within, left_a, left_b = _pair_group(reader, groups_a.get(c, []), groups_b.get(c, []))
                found += within
                loose_a += [[t] for t in left_a]
                loose_b += [[t] for t in left_b]
        for name in [n for n in side_a if n in side_b]:
            found.append((side_a.pop(name), side_b.pop(name), "name"))
        for mine, theirs, flip in ((side_a, side_b, False), (side_b, side_a, True)):
            for fused, parts in _fused_groups(mine).items():
                if fused in theirs and all(p in mine for p in parts):
                    joined = [mine.pop(p)[0] for p in parts]
                    other = theirs.pop(fused)
                    found.append((other, joined, "parts") if flip else (joined, other, "parts"))
        moved, left_a, left_b = _by_content(reader, [*side_a.values(), *loose_a], [*side_b.values(), *loose_b])
        found += moved
        pairs = []
        for a_parts, b_parts, how in found:
            pair = Pair("", "+".join(t.name for t in a_parts), "+".join(t.name for t in b_parts), how,
                        _dtype(a_parts), _dtype(b_parts), _shape(a_parts), _shape(b_parts))
            seed = zlib.crc32(f"{pair.a}\0{pair.b}".encode())
            _judge(reader, a_parts, b_parts, pair, how == "content" or reader.same_bytes(a_parts, b_parts), seed)
            pairs.append(pair)
        pairs += [Pair(ONLY_A, t.name, None, "", t.dtype, None, tuple(t.shape)) for [t] in left_a]
        pairs += [Pair(ONLY_B, None, t.name, "", None, t.dtype, None, tuple(t.shape)) for [t] in left_b]
    finally:
        reader.close()
    _mark_collisions(pairs, groups_a, groups_b, colliding)
    return pairs


def compare(a, b, engines=None, target=None) -> Comparison:
    """Pair every tensor of checkpoint `a` with one of `b` (see the module docstring), say how each
    pair compares, and compare the configs by meaning on `engines` (EngineRelease values or specs such as
    "sglang==0.5.10": an edge, which a notebook calls with them; default: every release whose engine reads both) for the target model at
    `target` (its folder or config.json; None: its layer count unknown). Raises CheckpointError for
    a path that is not a readable checkpoint, or a target without a layer count."""
    engines = None if engines is None else [resolve_engine(e) for e in engines]
    n_layers = None if target is None else target_layers(target)
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    configs = compare_configs(ca, cb, engines, n_layers)
    return Comparison(str(a), str(b), _tensor_pairs(ca, cb), configs)
