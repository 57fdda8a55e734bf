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
  (docs/values.md). `noise.structure` holds the statistics and the reasoning behind each bound;
- a draft-to-target vocabulary map of all zeros (the identity) although the draft vocabulary is
  smaller than the target's;
- a matrix whose bytes are the other 16-bit float type's than its header says (`MISLABELLED`, `_saved_as`):
  its ranks, and so every statistic above, are the trained ones; its magnitudes are not.

Reads are bounded (`valueread.py`): one contiguous block of whole rows per tensor, at most READ_ELEMENTS values (at
least MIN_ROWS rows), at a place drawn from the operating system's entropy (`secrets`), not from
anything in the file: a draft trained only where a reader looks cannot know where that is.
Which engines use a flagged tensor is the diagnosis' business (`value_findings` takes its report):
an embedding SGLang replaces with the target's is harmless there and fatal in vLLM.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import findings as F
from .checkpoint import Checkpoint, TensorInfo
from .noise import MIN_ELEMENTS, structure
from .valueread import decode, read_block

# What a flagged tensor holds (AtInit.holds); a constant reads "the constant 1" or ZEROS; MISLABELLED: the other
# 16-bit float type's bytes (AtInit.evidence says which)
NONFINITE, ZEROS, IID, ORTHOGONAL, IDENTITY, MISLABELLED = (
    "non-finite values", "zeros", "i.i.d. noise", "an orthogonal matrix", "the identity map",
    "another 16-bit float type's bytes")

# What norms at 1.0 cost a trained draft, measured (docs/values.md: "What untrained values cost"):
CONSTANT_NORMS_COST = ("the demo draft's accept length is 3.05 with its final norm at 1.0 and 2.95 with all four norms "
                       "at 1.0, against 3.08 trained (reference backend)")


@dataclass(frozen=True)
class AtInit:
    """A tensor found holding no training: its key, what it holds (NONFINITE, ZEROS, "the constant
    1", IID, ORTHOGONAL, IDENTITY) and the statistics that show it."""

    key: str
    holds: str
    evidence: str
    ndim: int = 2  # the tensor's dimensions: a constant vector (a norm) costs little, a constant matrix a lot


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
    saved_as = _saved_as(values, t.dtype)
    if saved_as is not None:
        return AtInit(t.name, MISLABELLED, saved_as)
    found = structure(values)
    if found is None or found.trained:
        return None
    return AtInit(t.name, ORTHOGONAL if found.orthogonal else IID, f"{found.evidence()} ({block.where})")


def _saved_as(values: np.ndarray, dtype: str) -> str | None:
    """What shows that a matrix labelled F16 holds bf16 bytes, or one labelled BF16 holds fp16 bytes; None when
    nothing does. A bf16 value's 8-bit exponent read as fp16's 5-bit one (and 3 mantissa bits) puts every weight
    between 2^-23 and 2^8 into [2^-2, 2^2): read as F16 such a matrix has (nearly) no value near zero, which no
    trained matrix lacks (a normal law has 10% of its values within 0.125 sigma of it). An fp16 value read as bf16
    lands near 2^-55 for a weight of 0.02: a median magnitude below 2^-24, where no trained matrix's lies. In both
    cases the bytes read as the other type must be weights: finite, of a plausible size, spread over binades (so
    a matrix of +-1 in fp16, which reads as +-2^-7 in bf16, is not taken for one)."""
    if dtype not in ("F16", "BF16") or values.size < MIN_ELEMENTS:
        return None
    if dtype == "F16":
        other = decode(values.astype(np.float16).tobytes(), "BF16")
    else:
        other = decode((values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes(), "F16")
    read, meant = np.abs(values[values != 0]), np.abs(other[other != 0])
    if len(read) < MIN_ELEMENTS // 2 or len(meant) < MIN_ELEMENTS // 2 or not np.isfinite(meant).all():
        return None
    low, mid, high = np.percentile(meant, [10, 50, 90])
    if high < 4 * low or not 2 ** -14 <= mid < 4:
        return None
    if dtype == "F16":
        banded = float(np.mean((read >= 2 ** -3) & (read < 2 ** 3)))
        if banded < 0.99:
            return None
        return (f"bf16 bytes labelled F16: read as F16, {banded:.1%} of its nonzero values lie in [0.125, 8) (a trained "
                f"matrix has many near zero); read as BF16, their median magnitude is {mid:.3g}")
    if np.median(read) >= 2 ** -24:
        return None
    return (f"fp16 bytes labelled BF16: read as BF16, its median magnitude is {np.median(read):.3g}; read as F16, "
            f"{mid:.3g}")


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
    for code, holds, said, why in (
            ("nan-weights", NONFINITE, "non-finite values where the engine computes with them",
             "one NaN in a matrix spreads to every prediction (speculators saves NaN embeddings and heads when the "
             "verifier's weights were never loaded before saving)"),
            ("dtype-mislabelled", MISLABELLED, "the header says one 16-bit float type, the bytes are the other's",
             "the engine reads them as the header says, so every value it computes with is wrong. The bytes are "
             "right: write the header's dtype as the type they were saved in")):
        group = [h for h in used if h.holds == holds]
        if group:
            out.append(F.finding(code, f"{_names([h.key for h in group])}: {said} "
                                       f"({'; '.join(f'{h.key}: {h.evidence}' for h in group[:3])}); {why}"))
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
                        ("dtype-mislabelled", [h for h in unused if h.holds == MISLABELLED]),
                        ("weights-at-init", [h for h in unused if h.holds not in (NONFINITE, MISLABELLED)])):
        if group:
            out.append(F.finding(code, (
                f"{_names([h.key for h in group])} hold(s) {'; '.join(sorted({h.holds for h in group}))}, not trained "
                f"values, but {report.engine} replaces them with the target's at serve time: harmless there"),
                severity=F.INFO))
    return out
