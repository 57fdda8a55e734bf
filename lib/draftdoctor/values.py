"""Values, not just names: the tensors of a draft whose values carry no training, found from one
bounded read per tensor (numpy only, never torch, never a whole file).

A draft can load cleanly (every parameter written, every tensor placed) and still carry no training:
a converter that built a fresh model and loaded the trained tensors without strict name matching
saves the fresh model's values under the right names (speculators issue #1114); an exporter that
never copied the embedding saves a random one (TorchSpec issue #38); a vocabulary map that was
never filled saves zeros. The engine loads what is written, so only acceptance shows it. This module
looks at the values, and needs no initialiser's name to do so:

- any NaN or infinity in what is read (`NONFINITE`);
- a tensor whose elements are all one constant (an RMSNorm's 1.0, a zeroed tensor);
- a matrix indistinguishable from i.i.d. noise (`IID`) or with a flat spectrum (`ORTHOGONAL`): every
  initialiser draws its entries independently from one law (normal, truncated normal, uniform,
  Laplace, sparse, ... at any scale) or builds an orthogonal matrix, and training leaves neither
  (docs/values.md). `structure` holds the statistics and the reasoning behind each bound;
- a draft-to-target vocabulary map of all zeros (the identity) although the draft vocabulary is
  smaller than the target's.

Reads are bounded: one contiguous block of whole rows per tensor, at most READ_ELEMENTS values (at
least MIN_ROWS rows), at a place drawn from the operating system's entropy (`secrets`), not from
anything in the file: a draft trained only where a reader looks cannot know where that is.
Which engines use a flagged tensor is the diagnosis' business (`value_findings` takes its report):
an embedding SGLang replaces with the target's is harmless there and fatal in vLLM.
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import statistics
from dataclasses import dataclass

import numpy as np

from . import findings as F
from .checkpoint import Checkpoint, TensorInfo

READ_ELEMENTS = 1 << 15  # per tensor: 64 kB of bf16 (more only for rows so long that MIN_ROWS of them are more)
MIN_ROWS = 16  # a block holds at least this many rows (so a 14336-wide row is read 16 at a time: 448 kB of bf16)
MAX_ROW = 1 << 17  # rows longer than this are read as a window of values: constant and finite checks only
# Below these sizes a trained matrix cannot be told from noise with the margin the kit asks for (the
# demo's smallest trained matrices, 32 x 64, clear the bound by 1.7x): no structure test.
MIN_ELEMENTS, MIN_SIDE = 1024, 8
# numpy's view of each float dtype; BF16 is widened by hand (numpy has none)
FLOATS = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}
ITEM = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}

# What a flagged tensor holds (AtInit.holds); a constant reads "the constant 1" or ZEROS.
NONFINITE, ZEROS, IID, ORTHOGONAL, IDENTITY = (
    "non-finite values", "zeros", "i.i.d. noise", "an orthogonal matrix", "the identity map")

# A matrix is "structured" (trained) when any of the four statistics of `structure` lies more than
# Z_STRUCTURE standard deviations above what i.i.d. entries give. Under that hypothesis each statistic
# has (after `gaussianised`) a known law, scored as a standard normal deviate (measured: sd 0.96-1.00,
# at most 4.12 in 120000 draws), so exceeding 6 has probability ~1e-9 per statistic: a never-trained
# matrix is flagged with certainty. Every trained matrix the kit has clears it by at
# least 1.7x (the demo's 32 x 64 v_proj of the target, z = 10.3; tests/test_values.py holds every trained
# matrix to 1.5x; the hidden-256 draft's matrices lie far above: docs/values.md).
Z_STRUCTURE = 6.0
# What norms at 1.0 cost a trained draft, measured (docs/values.md: "What untrained values cost"):
CONSTANT_NORMS_COST = ("the demo draft's accept length is 3.09 with its final norm at 1.0 and 2.77 with all four norms "
                       "at 1.0, against 3.07 trained (reference backend)")
# An orthogonal matrix times a gain has all singular values equal. i.i.d. rows give s_min/s_max =
# (sqrt(n) - sqrt(m)) / (sqrt(n) + sqrt(m)) at best, below 0.985 for the blocks read (m >= 8, n <= MAX_ROW);
# bf16 rounding moves an orthogonal matrix's singular values by ~0.4% at most.
FLAT = 0.99


@dataclass(frozen=True)
class AtInit:
    """A tensor found holding no training: its key, what it holds (NONFINITE, ZEROS, "the constant
    1", IID, ORTHOGONAL, IDENTITY) and the statistics that show it."""

    key: str
    holds: str
    evidence: str
    ndim: int = 2  # the tensor's dimensions: a constant vector (a norm) costs little, a constant matrix a lot


@dataclass(frozen=True)
class Block:
    """What was read of a tensor: `values` (float64; 2-D rows x columns for a matrix read as a block
    of whole rows, else 1-D), whether that is the whole tensor, and where in it (for messages)."""

    values: np.ndarray
    whole: bool
    where: str


def decode(raw: bytes, dtype: str) -> np.ndarray:
    """`raw` (whole elements of `dtype`, a float type of FLOATS) as float64. A signalling NaN (any NaN
    bit pattern with the quiet bit clear: bf16 0x7f81, f32 0x7f800001) is made quiet first: numpy's
    float32-to-float64 cast raises the invalid-operation flag on one and prints a RuntimeWarning."""
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
    elif dtype == "F32":
        bits = np.frombuffer(raw, dtype=np.uint32)
    else:
        return np.frombuffer(raw, dtype=FLOATS[dtype]).astype(np.float64)
    nan = (bits & 0x7F800000 == 0x7F800000) & (bits & 0x007FFFFF != 0)
    if nan.any():
        bits = bits | np.where(nan, np.uint32(0x00400000), np.uint32(0))
    return bits.view(np.float32).astype(np.float64)


def read_block(t: TensorInfo) -> Block | None:
    """One bounded read of float tensor `t`: all of it when it has at most READ_ELEMENTS values; else,
    for a matrix (any tensor of 2+ dimensions, as rows of its last one), a block of whole consecutive
    rows starting at a row drawn with `secrets`; else a window of READ_ELEMENTS values so placed.
    None for other dtypes (integers, bools, 8-bit floats) and empty tensors."""
    if t.dtype not in FLOATS or t.nbytes == 0:
        return None
    item = ITEM[t.dtype]
    count = t.nbytes // item
    width = int(t.shape[-1]) if len(t.shape) >= 2 else 0
    rows = count // width if width else 0
    if count <= READ_ELEMENTS:
        first, length, where = 0, count, f"all {count} values"
    elif width and width <= MAX_ROW and rows >= 2:
        take = min(rows, max(MIN_ROWS, READ_ELEMENTS // width))
        start = secrets.randbelow(rows - take + 1)
        first, length, where = start * width, take * width, f"rows {start}-{start + take - 1} of {rows}"
    else:
        first, length = secrets.randbelow(count - READ_ELEMENTS + 1), READ_ELEMENTS
        width, where = 0, f"values {first}-{first + READ_ELEMENTS - 1} of {count}"
    raw = t.read(first * item, length * item)  # a file shorter than its header says gives fewer bytes
    values = decode(raw[:len(raw) // item * item], t.dtype)
    if width and len(values) == length and length % width == 0 and length // width >= 2:
        values = values.reshape(-1, width)
    return Block(values, len(values) == count, where) if len(values) else None


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


_SEEN: dict = {}  # what `at_init` found per tensor (by file identity and place): a draft is diagnosed per engine


def at_init(t: TensorInfo, config: dict | None = None) -> AtInit | None:
    """Whether float tensor `t` holds no training: a non-finite value read, all zero, one constant, or a
    matrix indistinguishable from i.i.d. noise or orthogonal. `config` is not needed (kept for callers)."""
    try:
        info = os.stat(t.file)
    except OSError:
        return None
    key = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size, t.begin, t.end, t.dtype, t.shape)
    if key not in _SEEN:
        if len(_SEEN) > 1 << 14:
            _SEEN.clear()
        _SEEN[key] = _at_init(t)
    hit = _SEEN[key]
    return hit if hit is None or hit.key == t.name else AtInit(t.name, hit.holds, hit.evidence, hit.ndim)


def _constant(values: np.ndarray) -> float | None:
    """The value every element of `values` holds, or None."""
    flat = values.ravel()
    return float(flat[0]) if flat[0] == flat[-1] and np.all(flat == flat[0]) else None


def _at_init(t: TensorInfo) -> AtInit | None:
    block = read_block(t)
    if block is None:
        return None
    values = block.values
    finite = np.isfinite(values)
    if not finite.all():
        nan = int(np.isnan(values).sum())
        inf = values.size - int(finite.sum()) - nan
        counts = ", ".join(f"{k} {what}" for k, what in ((nan, "NaN"), (inf, "infinite")) if k)
        return AtInit(t.name, NONFINITE, f"{counts} of the {values.size} values read ({block.where})", len(t.shape))
    constant = _constant(values)
    if constant is not None:
        where = block.where
        if not block.whole:  # a stretch of equal rows (a trained vocabulary's unused tokens) is not a constant
            again = read_block(t)  # tensor: a second block, placed independently, must hold the same value
            if again is None or _constant(again.values) != constant:
                return None
            where = f"{block.where}; {again.where}"
        what = "every one of its" if block.whole else "each of the"
        return AtInit(t.name, ZEROS if constant == 0 else f"the constant {constant:g}",
                      f"{what} {values.size} values read is {constant:g} ({where})", len(t.shape))
    if values.ndim != 2:
        return None
    found = structure(values)
    if found is None or found.trained:
        return None
    return AtInit(t.name, ORTHOGONAL if found.orthogonal else IID, f"{found.evidence()} ({block.where})")


def identity_vocab_map(checkpoint: Checkpoint, vocab_size: int, draft_vocab_size: int | None) -> AtInit | None:
    """A d2t of all zeros (each draft id maps to the same target id) while the draft vocabulary is smaller
    than the target's: the value a vocabulary map holds before it is filled. A map chosen from
    training data (the most frequent target tokens) never picks exactly the first Vd target ids."""
    d2t = checkpoint.find("d2t")
    if d2t is None or d2t.dtype not in ("I64", "I32") or len(d2t.shape) != 1 or not draft_vocab_size:
        return None
    if not draft_vocab_size < vocab_size or d2t.nbytes > 64 << 20:
        return None
    offsets = np.frombuffer(d2t.read(), dtype=np.int64 if d2t.dtype == "I64" else np.int32)
    if len(offsets) and not offsets.any():
        return AtInit(d2t.name, IDENTITY,
                      f"all {len(offsets)} offsets are 0, so draft id i is target id i, for a draft vocabulary of "
                      f"{draft_vocab_size} of the target's {vocab_size}")
    return None


def scan(checkpoint: Checkpoint, vocab_size: int = 0, draft_vocab_size: int | None = None) -> list[AtInit]:
    """Every tensor of `checkpoint` found holding no training, in checkpoint order."""
    found = [hit for t in checkpoint.tensors.values() if (hit := at_init(t)) is not None]
    mapped = identity_vocab_map(checkpoint, vocab_size, draft_vocab_size)
    return found + ([mapped] if mapped else [])


def _names(keys: list[str], most: int = 12) -> str:
    """Keys written compactly: `midlayer.{mlp.up_proj, self_attn.q_proj}.weight` (common prefix and suffix
    at dots), at most `most` of them."""
    shown = keys[:most]
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    if len(shown) < 2:
        return ", ".join(shown) + more
    prefix = os.path.commonprefix(shown)
    prefix = prefix[:prefix.rfind(".") + 1]
    suffix = os.path.commonprefix([k[len(prefix):][::-1] for k in shown])[::-1]
    suffix = suffix[suffix.find("."):] if "." in suffix else ""
    middles = [k[len(prefix):len(k) - len(suffix)] for k in shown]
    if not all(middles):
        return ", ".join(shown) + more
    return f"{prefix}{{{', '.join(middles)}}}{suffix}{more}"


def _what(hits: list[AtInit], report, params: dict, keys: dict) -> str:
    """What the flagged tensors are, in a user's words: the decoder layer, the embedding, the head, ..."""
    roles = {params[keys[h.key].param].role if keys[h.key].param in params else "vocab-map" if h.key.endswith("d2t")
             else "tensor" for h in hits}
    layer = [p for p in report.params if p.role == "layer" and p.name in {keys[h.key].param for h in hits}]
    matrices = [p for p in report.params if p.role == "layer" and len(p.shape) >= 2]
    if roles == {"layer"} and matrices and all(p in layer for p in matrices):
        return "the decoder layer's projections"
    names = {"embed": "the embedding", "lm_head": "the head", "fc": "the fc projection", "norm": "the final norm",
             "vocab-map": "the vocabulary map", "layer": "decoder-layer tensors", "tensor": "other tensors"}
    return " and ".join(names.get(r, r) for r in sorted(roles)) or f"{len(hits)} tensor(s)"


def value_findings(hits: list[AtInit], report) -> list[F.Finding]:
    """Findings for tensors holding no training, as `report`'s engine reads them: by the measured effect
    of such a tensor on predictions for one the engine serves with (a constant norm: warning; noise, an
    orthogonal matrix, NaN, an identity map for a reduced vocabulary: error), info for one it replaces
    with the target's or does not read. A weights-at-init error's message starts with a headline
    (before ": ") that the verdict repeats."""
    from .coverage import DERIVED, LOADED

    keys = {k.key: k for k in report.keys}
    params = {p.name: p for p in report.params}
    used, unused = [], []
    for hit in hits:
        fate = keys.get(hit.key)
        param = params.get(fate.param) if fate is not None and fate.param else None
        if fate is None or fate.status not in (LOADED, DERIVED):
            continue  # not placed: the coverage findings already say so
        (unused if param is not None and param.replaced_by_target else used).append(hit)
    out = []
    nonfinite = [h for h in used if h.holds == NONFINITE]
    if nonfinite:
        out.append(F.finding("nan-weights", (
            f"{_names([h.key for h in nonfinite])}: non-finite values where the engine computes with them "
            f"({'; '.join(f'{h.key}: {h.evidence}' for h in nonfinite[:3])}); one NaN in a matrix spreads to every "
            "prediction (speculators saves NaN embeddings and heads when the verifier's weights were never loaded "
            "before saving)")))
    # all zeros: a warning, as it always was (sparse test drafts read as zeros); a bias may be zero by design
    zero = [h.key for h in used if h.holds == ZEROS and not h.key.endswith(".bias")]
    if zero:
        out.append(F.finding("nan-weights", f"{_names(zero)}: every value read is zero", severity=F.WARNING))
    # Without a target, severity follows what such a tensor does to predictions, as measured on the
    # reference backend (`python -m draftdoctor.reference.value_costs`, docs/values.md): a trained draft
    # with its norms at 1.0 keeps most of its accept length: a warning. Projections that are noise or
    # orthogonal, a NaN, an identity map for a reduced vocabulary bring it near 1: an error. A constant
    # matrix (rank one) computes nothing at all: an error too.
    constant = [h for h in used if h.holds.startswith("the constant ")]
    serious = [h for h in used if h.holds in (IID, ORTHOGONAL, IDENTITY) or h in constant and h.ndim >= 2]
    mild = [h for h in constant if h not in serious]
    if serious:
        groups: dict[str, list[AtInit]] = {}
        for h in serious:
            groups.setdefault(h.holds, []).append(h)
        parts = [f"{holds} ({len(g)}: {_names([h.key for h in g])}; e.g. {g[0].evidence})" for holds, g in groups.items()]
        also = f"; also as a fresh model holds them: {_names([h.key for h in mild])} ({mild[0].holds})" if mild else ""
        out.append(F.finding("weights-at-init", (
            f"{_what(serious, report, params, keys)} {'holds' if len(serious) == 1 else 'hold'} no training "
            f"({len(serious)} tensor(s) {report.engine} serves with): " + "; ".join(parts) + also
            + ". The names load, so every loader calls it a clean load; served, the draft does not compute what it "
              "was trained to. Compare it with the training output (`draftdoctor compare TRAINED THIS`)")))
    elif mild:
        out.append(F.finding("weights-at-init", (
            f"{_names([h.key for h in mild])}: {'; '.join(sorted({h.holds for h in mild}))} in every element, as a "
            f"fresh model holds (never trained, or frozen); alone this costs little: {CONSTANT_NORMS_COST}; "
            f"e.g. {mild[0].evidence}"), severity=F.WARNING))
    for code, group in (("nan-weights", [h for h in unused if h.holds == NONFINITE]),
                        ("weights-at-init", [h for h in unused if h.holds != NONFINITE])):
        if group:
            out.append(F.finding(code, (
                f"{_names([h.key for h in group])} hold(s) {'; '.join(sorted({h.holds for h in group}))}, not trained "
                f"values, but {report.engine} replaces them with the target's at serve time: harmless there"),
                severity=F.INFO))
    return out
