"""Whether a matrix is indistinguishable from i.i.d. noise, or orthogonal: what every initialiser draws
and training leaves neither (docs/values.md). `structure` computes four statistics on the ranks'
normal scores of a block (one null law whatever the initialiser), each a standard normal deviate
under "i.i.d. entries", bound by Z_STRUCTURE; the reasoning behind each is with its code. Used by the
value checks (`values.py`) and by `compare`'s relations (a fresh initialisation). numpy only.
"""

from __future__ import annotations

import functools
import math
import secrets
import statistics
from dataclasses import dataclass

import numpy as np

from .valueread import READ_ELEMENTS

# Below these sizes a trained matrix cannot be told from noise with the margin the kit asks for (the
# demo's smallest trained matrices, 32 x 64, clear the bound by 1.7x): no structure test.
MIN_ELEMENTS, MIN_SIDE = 1024, 8

# A matrix is "structured" (trained) when any of the four statistics of `structure` lies more than
# Z_STRUCTURE standard deviations above what i.i.d. entries give. Under that hypothesis each statistic
# has (after `gaussianised`) a known law, scored as a standard normal deviate (measured: sd 0.96-1.00,
# at most 4.12 in 120000 draws), so exceeding 6 has probability ~1e-9 per statistic: a never-trained
# matrix is flagged with certainty. Every trained matrix the kit has clears it by at
# least 1.7x (the demo's 32 x 64 v_proj of the target, z = 10.3; tests/test_values.py holds every trained
# matrix to 1.5x; the hidden-256 draft's matrices lie far above: docs/values.md).
Z_STRUCTURE = 6.0
# An orthogonal matrix times a gain has all singular values equal. i.i.d. rows give s_min/s_max =
# (sqrt(n) - sqrt(m)) / (sqrt(n) + sqrt(m)) at best, below 0.985 for the blocks read (m >= 8, n <= MAX_ROW);
# bf16 rounding moves an orthogonal matrix's singular values by ~0.4% at most.
FLAT = 0.99


@functools.lru_cache(maxsize=16)
def normal_scores(count: int) -> np.ndarray:
    """The expected order statistics of `count` standard normal draws, as Blom approximates them:
    the normal quantile of (i + 5/8) / (count + 1/4) for i = 0 .. count - 1."""
    quantile = statistics.NormalDist().inv_cdf
    return np.array([quantile((i + 0.625) / (count + 0.25)) for i in range(count)])


def gaussianised(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`values` with each one replaced by the normal score of its rank (`normal_scores`), ties in random
    order (sorted after a random shuffle: equal keys give the sort nothing to tell them apart by, so
    where each lands depends only on where the shuffle put it).

    If the entries are i.i.d. draws of ANY law, their ranks are a uniformly random arrangement, so the
    result is a uniformly random arrangement of fixed normal scores: i.i.d. standard normal entries to
    within O(1/N) (a group of n of the N scores has its variance scaled by (N - n)/(N - 1), which the
    statistics below absorb by measuring spread over g - 1 degrees of freedom). The statistics then have
    one known null law whatever the initialiser: heavy tails, a Cauchy law without a mean, a sparse law
    with ties, any scale or offset. A trained matrix keeps its order, so its correlated rows and
    columns and its uneven row and column lengths survive, and its statistics are a fixed function of
    it (no draw is involved but the order of ties)."""
    flat = values.ravel()
    shuffle = rng.permutation(flat.size)
    order = shuffle[np.argsort(flat[shuffle])]
    out = np.empty(flat.size)
    out[order] = normal_scores(flat.size)
    return out.reshape(values.shape)


def _wilson_hilferty(mean: float, dof: float) -> float:
    """Standard normal deviate of `mean`, the mean of a statistic distributed as chi-square(dof)/dof
    (Wilson and Hilferty, 1931: the cube root of chi-square/dof is nearly normal, accurate far into the
    tails even for a few degrees of freedom)."""
    a = 2.0 / (9.0 * dof)
    return (max(mean, 0.0) ** (1.0 / 3.0) - (1.0 - a)) / math.sqrt(a)


def _gram(a: np.ndarray) -> np.ndarray:
    """The smaller Gram matrix of `a` (a a^T or a^T a; both hold its singular values squared). By
    einsum, not BLAS: these products are small, and a multi-threaded BLAS on a busy machine made them
    50x slower."""
    return np.einsum("ij,kj->ik", a, a) if a.shape[0] <= a.shape[1] else np.einsum("ji,jk->ik", a, a)


def _pairs(z: np.ndarray, axis: int) -> float:
    """z-score of the mean squared cosine between the rows (axis 1) or the columns (axis 0) of `z`:
    `count` vectors of dimension n.

    Mean and variance: for two independent vectors of n i.i.d. normal entries, n cos^2 has the law
    n Beta(1/2, (n-1)/2): mean 1, variance 2(n-1)/(n+2); the pairs sharing a vector are uncorrelated
    (each direction is uniform on the sphere, independently). So the mean over the P pairs has mean 1
    and variance 2(n-1)/((n+2)P).

    Shape: the sum over all pairs is the squared Frobenius norm of the vectors' Gram matrix, that is of
    sum u u^T (the normalised block's singular values to the fourth power), which Marchenko-Pastur
    fixes. Its fluctuation has as many degrees of freedom as the smaller of the two Gram matrices has
    free entries: the P pairs when the vectors are few and long (rows of a block), the (n-1)(n+2)/2 of
    a traceless symmetric n x n matrix when they are many and short (columns of a 16-row block: 135).
    So the mean, standardised, is scored as chi-square(d)/d with d the smaller of the two (the heavier
    tail: with d = P, 1500 blocks of 8 x 1024 i.i.d. values once put the column statistic at 6.09).
    A trained matrix's rows share directions (and its columns), so it lies far above."""
    unit = z / np.linalg.norm(z, axis=axis, keepdims=True)
    count, n = (z.shape[0], z.shape[1]) if axis == 1 else (z.shape[1], z.shape[0])
    gram = _gram(unit)
    pairs = count * (count - 1) / 2
    mean = n * (float(np.sum(gram * gram)) - count) / 2 / pairs  # the vectors' own products are count ones
    sd = math.sqrt(2 * (n - 1) / ((n + 2) * pairs))
    dof = min(pairs * (n + 2) / (n - 1), (n - 1) * (n + 2) / 2)
    return _wilson_hilferty(1 + (mean - 1) / sd * math.sqrt(2 / dof), dof)


def _lengths(z: np.ndarray) -> float:
    """z-score of the spread of the rows' squared lengths, for g rows of k gaussianised values.

    Under "i.i.d. entries" the gaussianised block is a random arrangement of fixed scores, so the
    values y = z^2 are a fixed population (mean mu, variance s2) dealt at random into g rows of k. Each
    row's sum q then has variance k s2 (N - k)/(N - 1), and the rows' deviations sum to 0, so
    Q = sum (q - mean q)^2 / (k s2 (g - 1)) has mean N/(N - 1), i.e. 1. Its fluctuation comes only from
    the products of two values dealt into the same row (the squares' sum is the population's, fixed):
    g k (k - 1)/2 nearly uncorrelated products of variance s2^2, so Var Q = 2 g (k - 1)/(k (g - 1)^2),
    scored as chi-square(d)/d, d = 2 / Var Q (about g - 1 for long rows). (Fresh normal draws instead
    of fixed scores would add the fourth moment of y, a 12/k more: for a 16-row block's columns that
    was the bound's sd overstated by a third.) A trained matrix's rows (and columns) differ in
    length: some outputs and inputs matter more."""
    g, k = z.shape
    y = z * z
    q = y.sum(axis=1)
    spread = float(np.sum((q - q.mean()) ** 2)) / (k * float(y.var()) * (g - 1))
    return _wilson_hilferty(spread, (k * (g - 1) ** 2) / (g * (k - 1)))


@dataclass(frozen=True)
class Structure:
    """The statistics of one block of a matrix: `z` (each statistic's standard normal deviate under
    the hypothesis of i.i.d. entries), the shape they were computed on, the block's entry standard
    deviation and, for a block found untrained only (else None: nothing needs them), the largest
    singular value over the Marchenko-Pastur edge (of the gaussianised values, whose entries have
    variance 1: sqrt(m) + sqrt(n)) and the raw block's smallest over largest singular value."""

    z: dict
    shape: tuple
    std: float
    edge_ratio: float | None = None
    flatness: float | None = None

    @property
    def trained(self) -> bool:
        """Some statistic lies beyond what i.i.d. entries give (Z_STRUCTURE)."""
        return max(self.z.values()) > Z_STRUCTURE

    @property
    def orthogonal(self) -> bool:
        return self.flatness is not None and self.flatness >= FLAT

    def evidence(self) -> str:
        m, n = self.shape
        if self.orthogonal:
            return (f"flat spectrum: every singular value within {1 - self.flatness:.1%} of the largest, as an "
                    f"orthogonal matrix times a gain; entry std {self.std:.3g}")
        worst = max(self.z, key=self.z.get)
        return (f"largest singular value {self.edge_ratio:.2f}x the Marchenko-Pastur edge; rows and columns as "
                f"uncorrelated and as evenly long as i.i.d. draws (strongest sign of training {self.z[worst]:+.1f} sd, "
                f"{worst}, over {m} x {n} values; a trained matrix exceeds {Z_STRUCTURE:g}); entry std {self.std:.3g}")


def structure(values: np.ndarray, rng: np.random.Generator | None = None) -> Structure | None:
    """The statistics of a finite, non-constant block (rows x columns), or None when it is too small to
    tell (MIN_ELEMENTS, MIN_SIDE). Each statistic is computed on the gaussianised block (at most
    READ_ELEMENTS of its values: a span of whole columns placed at random; a block of rows and columns
    of an i.i.d. matrix is again one), so under the hypothesis "i.i.d. entries" its law is the normal
    case's, whatever the initialiser:

    - row pairs: the rows' mean squared cosine (`_pairs`): correlated rows;
    - column pairs: the same for the columns: correlated columns;
    - row lengths, column lengths (`_lengths`): rows or columns of unequal length.

    The largest singular value is reported, not used to decide: with heavy-tailed entries (a Student-t
    law) it sits well above the edge although the entries are i.i.d.; the statistics above do not."""
    m, n = values.shape
    if values.size < MIN_ELEMENTS or min(m, n) < MIN_SIDE:
        return None
    rng = rng or np.random.default_rng(secrets.randbits(128))
    peak = float(np.abs(values).max())  # scaled to at most 1 for the raw spectrum and deviation: float64
    block = values / peak  # values near its limit (1e300) would overflow when squared
    std = float(block.std()) * peak
    if m * n > READ_ELEMENTS and n > MIN_SIDE:
        span = max(MIN_SIDE, READ_ELEMENTS // m)
        first = int(rng.integers(n - span + 1))
        values = values[:, first:first + span]
        m, n = values.shape
    z = gaussianised(values, rng)
    stats = {"row pairs": _pairs(z, 1), "column pairs": _pairs(z, 0),
             "row lengths": _lengths(z), "column lengths": _lengths(z.T)}
    found = Structure(stats, (m, n), std)
    if found.trained:
        return found
    edge_ratio = math.sqrt(max(float(np.linalg.eigvalsh(_gram(z))[-1]), 0.0)) / (math.sqrt(m) + math.sqrt(n))
    spectrum = np.linalg.eigvalsh(_gram(block))  # the whole block's: a span of an orthogonal matrix's rows is not flat
    flatness = math.sqrt(max(float(spectrum[0]), 0.0) / float(spectrum[-1])) if spectrum[-1] > 0 else 0.0
    return Structure(stats, (m, n), std, edge_ratio, flatness)
