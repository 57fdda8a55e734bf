"""How two tensors' values relate, judged from sums streamed over both and from bounded samples.

`compare` reads the bytes; this module says what they show, numpy only, in float64. A pair of
tensors that differ is one of (`RELATIONS`, checked in this order):

- *same bytes, another dtype*: the bytes are equal but are read as another dtype (F16 against BF16);
- *non-finite introduced*: NaN or inf on one side where the other is finite (counted over every value);
- *rounded*: one side is the other rounded to a narrower float dtype (every sampled value within half
  a unit in the last place of that dtype, round to nearest; within one: truncated);
- *scaled*: B = k x A for one k, over every value, to the dtypes' rounding;
- *transposed*: B is A's transpose (A [m, n], B [n, m]; a block of sampled rows of each, crossed);
- *rows permuted*: B holds A's rows in another order (a hash of every row of each side);
- *unrelated*: correlation near 0 over every value, or one side holding one constant; *fresh
  initialisation* when a side also looks like what a fresh model holds: i.i.d. noise (row and column
  norms varying no more than noise's do) or the constant 0 or 1;
- else no relation: different values, with the numbers (correlation, largest difference, relative L2).

The i.i.d.-noise statistic here is small and local; `values.py` (the value checks) is getting an
initialiser-free "indistinguishable from i.i.d. noise" test, and this should use it once it exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SAME_BYTES_OTHER_DTYPE, NON_FINITE, ROUNDED, SCALED, TRANSPOSED, PERMUTED, UNRELATED, FRESH = (
    "same bytes, another dtype", "non-finite introduced", "rounded", "scaled", "transposed", "rows permuted",
    "unrelated", "fresh initialisation")
RELATIONS = (SAME_BYTES_OTHER_DTYPE, NON_FINITE, ROUNDED, SCALED, TRANSPOSED, PERMUTED, UNRELATED, FRESH)
# (stored mantissa bits, exponent of the smallest normal value) per float dtype
FLOAT_FORMAT = {"F64": (52, -1022), "F32": (23, -126), "F16": (10, -14), "BF16": (7, -126)}
MIN_NOISE_ROWS = 16  # a sample's contiguous block of rows: what the value statistics need to tell noise
MIN_UNRELATED_VALUES = 64  # fewer: a correlation near 0 happens by chance too often to name
INIT_CONSTANTS = (0.0, 1.0)  # what a fresh model's norms and biases hold


def unit_roundoff(dtype: str) -> float:
    """The largest relative change rounding to `dtype` makes (0 for an integer dtype)."""
    return 2.0 ** -(FLOAT_FORMAT[dtype][0] + 1) if dtype in FLOAT_FORMAT else 0.0


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` (float64) rounded to the nearest `dtype` value (ties to even), as float64."""
    if dtype == "F64":
        return values
    if dtype == "F16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float64)
    single = values.astype(np.float32)
    if dtype == "F32":
        return single.astype(np.float64)
    bits = single.view(np.uint32).astype(np.uint64)  # BF16: the top 16 bits of a float32, rounded to even
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return np.where(np.isfinite(single), rounded.view(np.float32), single).astype(np.float64)


def ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of `dtype`'s values around each of `values` (subnormals included)."""
    mantissa, smallest = FLOAT_FORMAT[dtype]
    _, exponent = np.frexp(values)
    exponent = np.where(values == 0, smallest, np.maximum(exponent - 1, smallest))
    return np.ldexp(1.0, exponent - mantissa)


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    """sum(x * y) in one single-threaded pass (np.dot's BLAS threads cost several times the CPU on a
    busy machine, for nothing on vectors this short)."""
    return float(np.einsum("i,i->", x, y))


@dataclass
class Sums:
    """What one pass over both sides, in memory order, accumulates: the differences, the sums the
    correlation comes from, the residual of B against `k` x A for a k found beforehand (from a
    sample), over values finite on both sides; and the non-finite counts."""

    k: float | None = None  # the scale the residual is measured against
    values: int = 0
    finite: int = 0  # values finite on both sides
    largest: float = 0.0  # max |a - b|; NaN when a NaN faces a number, inf when an inf does
    largest_finite: float = 0.0  # max |a - b| where both are finite
    squares: float = 0.0  # sum (a - b)^2, both finite
    residual: float = 0.0  # sum (b - k a)^2, both finite
    sa: float = 0.0
    sb: float = 0.0
    saa: float = 0.0
    sbb: float = 0.0
    sab: float = 0.0
    nonfinite_a: int = 0
    nonfinite_b: int = 0
    only_b_nonfinite: int = 0  # B non-finite where A is finite
    only_a_nonfinite: int = 0

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        """Add one chunk of each side (float64, equal lengths)."""
        self.values += len(x)
        d = x - y
        if not np.isfinite(d).all():  # a non-finite value on either side makes its difference non-finite
            x, y, d = self._nonfinite(x, y)
        if len(d):
            biggest = max(float(d.max()), -float(d.min()))
            self.largest_finite = max(self.largest_finite, biggest)
            if not np.isnan(self.largest):
                self.largest = max(self.largest, biggest)
        self.finite += len(d)
        self.squares += _dot(d, d)
        self.sa += float(x.sum())
        self.sb += float(y.sum())
        self.saa += _dot(x, x)
        self.sbb += _dot(y, y)
        self.sab += _dot(x, y)
        if self.k is not None:
            r = y - self.k * x
            self.residual += _dot(r, r)

    def _nonfinite(self, x, y):
        fx, fy = np.isfinite(x), np.isfinite(y)
        self.nonfinite_a += int((~fx).sum())
        self.nonfinite_b += int((~fy).sum())
        self.only_b_nonfinite += int((fx & ~fy).sum())
        self.only_a_nonfinite += int((~fx & fy).sum())
        both = fx & fy
        alike = ~fx & ~fy & ((np.isnan(x) & np.isnan(y)) | (x == y))  # NaN against NaN, inf against the same inf
        unlike = ~both & ~alike
        if unlike.any():
            self.largest = float("nan") if (np.isnan(x[unlike]) | np.isnan(y[unlike])).any() else max(
                self.largest, float("inf"))
        x, y = x[both], y[both]
        return x, y, x - y

    @property
    def equal(self) -> bool:
        """Every value of A equals B's (NaN against NaN counted equal)."""
        return self.largest == 0.0

    @property
    def rel_l2(self) -> float:
        """||A - B|| / ||A|| over the values finite on both sides."""
        if self.saa:
            return (self.squares ** 0.5) / (self.saa ** 0.5)
        return 0.0 if self.squares == 0 else float("inf")

    def variance(self, side: str) -> float:
        s, ss = (self.sa, self.saa) if side == "a" else (self.sb, self.sbb)
        return max(ss / self.finite - (s / self.finite) ** 2, 0.0) if self.finite else 0.0

    def constant(self, side: str) -> bool:
        """Whether the side's finite values are one constant, to the sums' precision."""
        s, ss = (self.sa, self.saa) if side == "a" else (self.sb, self.sbb)
        return self.finite > 0 and self.variance(side) <= 1e-12 * (ss / self.finite)

    @property
    def correlation(self) -> float | None:
        """Pearson's correlation of A and B (None when either side is constant)."""
        if not self.finite or self.constant("a") or self.constant("b"):
            return None
        n = self.finite
        cov = self.sab / n - (self.sa / n) * (self.sb / n)
        return max(-1.0, min(1.0, cov / (self.variance("a") * self.variance("b")) ** 0.5))

    def scale(self, tolerance: float) -> float | None:
        """k when B = k x A for every value (||B - kA|| / ||B|| within `tolerance`), else None."""
        if self.k is None or not self.sbb:
            return None
        return self.k if self.residual <= tolerance ** 2 * self.sbb else None


def sample_scale(a: np.ndarray, b: np.ndarray, tolerance: float) -> float | None:
    """The k for which k x A is closest to B over sampled values (finite on both sides), when it fits
    them within `tolerance` (relative L2, twice over: a sample is no proof); else None."""
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]
    aa, bb = _dot(a, a), _dot(b, b)
    if not aa or not bb:
        return None
    k = _dot(a, b) / aa
    r = b - k * a
    return k if _dot(r, r) <= (2 * tolerance) ** 2 * bb else None


def rounded(a: np.ndarray, b: np.ndarray, dtype_a: str, dtype_b: str) -> tuple[str, str, bool] | None:
    """(dtype D, side rounded, to nearest) when the sampled values of one side are the other's rounded
    to D, a float dtype narrower than the other side's, else None. D is that side's own dtype or, for a
    side stored wider (F32 holding BF16 values), the narrowest dtype its values all fit."""
    for side, (narrow, wide, dn, dw) in (("B", (b, a, dtype_b, dtype_a)), ("A", (a, b, dtype_a, dtype_b))):
        if dw not in FLOAT_FORMAT or dn not in FLOAT_FORMAT:
            continue
        for d in sorted(FLOAT_FORMAT, key=lambda t: FLOAT_FORMAT[t][0]):  # narrowest first
            if FLOAT_FORMAT[d][0] >= FLOAT_FORMAT[dw][0] or FLOAT_FORMAT[d][0] > FLOAT_FORMAT[dn][0]:
                continue
            if not np.array_equal(round_to(narrow, d), narrow):  # the narrow side's values must be d's
                continue
            moved = np.abs(narrow - wide)
            spacing = ulp(wide, d)
            if (moved <= spacing / 2).all():
                return d, side, True
            if (moved < spacing).all():
                return d, side, False
    return None


def transposed(a_rows: np.ndarray, a_index: np.ndarray, b_rows: np.ndarray, b_index: np.ndarray,
               tolerance_dtype: str | None) -> int:
    """How many values of A[I, J] the sampled rows show equal to B[J, I] (0 when one differs or the
    crossed block is one constant, which would match anything): A's rows I (a_rows, |I| x n) and B's
    rows J (b_rows, |J| x m), A being m x n and B n x m. Equal within half a unit in the last place of
    `tolerance_dtype` (the narrower side's, when the dtypes differ), else exactly."""
    block_a = a_rows[:, b_index]
    block_b = b_rows[:, a_index].T
    if block_a.size == 0 or np.ptp(block_a) == 0:
        return 0
    if tolerance_dtype is None:
        return block_a.size if np.array_equal(block_a, block_b, equal_nan=True) else 0
    return block_a.size if (np.abs(block_a - block_b) <= ulp(block_a, tolerance_dtype) / 2).all() else 0


def noise_like(rows: np.ndarray) -> bool:
    """Whether sampled rows (k x n) hold no training: indistinguishable from i.i.d. draws of any law, or an
    orthogonal matrix times a gain (`noise.structure`, the value checks' own statistics)."""
    from .noise import structure

    found = structure(rows)
    return found is not None and (not found.trained or found.orthogonal)


def unrelated(sums: Sums) -> bool:
    """Correlation near 0: at most 0.05, or for few values at most 4 standard errors of a chance
    correlation (4 / sqrt(n))."""
    r = sums.correlation
    return r is not None and sums.finite >= MIN_UNRELATED_VALUES and abs(r) <= max(0.05, 4.0 / sums.finite ** 0.5)
