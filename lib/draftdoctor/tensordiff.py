"""How one pair of tensors compares, for `compare`: its status (`STATUSES`) and, for values that differ,
the numbers (max abs, relative L2, correlation) and how they relate (`relations.py`). Every value of
both sides is streamed in step into one `relations.Sums`; what needs positions (rounding, transposition,
noise) reads a bounded sample (`SAMPLE_VALUES` per side: a contiguous block of rows and runs of random
rows); rows are hashed, a chunk at a time, only when the sums allow a permutation. numpy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import relations as R
from .tensorbytes import CHUNK_BYTES, DECODABLE, ITEM_BYTES, _decode, _dtype, _elements, _geometry, _numel, _Reader, _shape

SAME_BYTES, SAME_VALUES, ANOTHER_SHAPE, DIFFERENT, COLLISION, ONLY_A, ONLY_B = (
    "same bytes", "same values, another dtype", "same values, another shape", "different values", "name collision",
    "only in A", "only in B")
STATUSES = (SAME_BYTES, SAME_VALUES, ANOTHER_SHAPE, DIFFERENT, COLLISION, ONLY_A, ONLY_B)
SAMPLE_VALUES = 1 << 20  # values sampled per side of a differing pair (8 MB as float64)
SAMPLE_RUNS = 64  # the random part of a sample: this many runs of neighbouring rows
MAX_HASHED_ROWS = 1 << 22  # a permutation is looked for among at most this many rows (32 MB of hashes a side)
WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


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
