"""Values, not just names: the tensors of a draft that still hold the values a freshly built model
holds, found from bounded samples of their bytes (numpy only, never torch, never a whole file).

A draft can load cleanly (every parameter written, every tensor placed) and still carry no training:
a converter that built a fresh model and loaded the trained tensors without strict name matching
saves the fresh model's initial values under the right names (speculators issue #1114); an exporter
that never copied the embedding saves a random one (TorchSpec issue #38); a vocabulary map that was
never filled saves zeros. The engine loads what is written, so only acceptance shows it. This module
looks at the values:

- a tensor whose elements are all one constant (an RMSNorm's 1.0, a zeroed tensor); 1-D tensors
  (norms, biases) are read whole;
- a matrix whose values are, statistically, draws from an initialiser (`INITIALISERS`: the normal law
  of the config's `initializer_range`, PyTorch's defaults for `nn.Linear` and `nn.Embedding`);
- a draft-to-target vocabulary map of all zeros (the identity) although the draft vocabulary is
  smaller than the target's;
- all-NaN tensors (an embedding or head that was never filled).

Reads are bounded: at most `SAMPLE_ELEMENTS` per tensor, in `WINDOWS` windows spread over it.
Which engines use a flagged tensor is the diagnosis' business (`value_findings` takes its report):
an embedding SGLang replaces with the target's is harmless there and fatal in vLLM.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from . import findings as F
from .checkpoint import Checkpoint, TensorInfo
from .configs import layer_config

SAMPLE_ELEMENTS = 1 << 16  # per tensor: 256 kB of float32 at most; the tests' bounds below are set by it
WINDOWS = 32  # a large tensor is read in this many windows, evenly spread from its first byte to its last
# numpy's view of each float dtype; BF16 is widened by hand (numpy has none)
FLOATS = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}
# stored mantissa bits: rounding to the dtype moves a value by at most 2^-(bits+1) of itself
MANTISSA_BITS = {"F64": 52, "F32": 23, "F16": 10, "BF16": 7}
# The statistical tests below must never call a trained tensor "initial". Every bound is SIGMAS standard
# errors wide under the hypothesis that the values are the initialiser's: a tensor really at its initial
# values passes all of them except with probability ~1e-9 per bound; a trained one fails when any
# statistic has moved by more than that, and trained weights move by tens of percent (the kit's demo
# drafts: projection std 1.6-7x their 0.02 initialiser, tests/test_values.py checks every trained draft).
SIGMAS = 6.0
# Below this many sampled values the bounds are too wide to tell a trained matrix from an initial one
# (6 / sqrt(2n) is the std test's relative width: 6.6% at 4096, 4.7% at 8192): the distribution tests
# are not run, only the constant and NaN ones.
MIN_ELEMENTS = 4096


@dataclass(frozen=True)
class Initialiser:
    """A way a framework fills a fresh weight matrix: `law` "normal" (mean 0, standard deviation
    `scale`) or "uniform" (on [-scale, scale]); `scale(config, shape)` gives it, or None where it does
    not apply; `source` says where the rule comes from."""

    name: str
    law: str
    scale: object  # (layer config dict, shape) -> float | None
    source: str


def _initializer_range(config: dict, shape) -> float:
    return float(config.get("initializer_range") or 0.02)


INITIALISERS = (
    Initialiser("N(0, initializer_range)", "normal", _initializer_range,
                "transformers' `_init_weights` for Llama, Qwen3 and DeepSeek models (nn.Linear and nn.Embedding weights "
                "drawn from N(0, config.initializer_range), 0.02 by default); speculators and SpecForge build their "
                "draft layers so, and so does a converter that builds a fresh transformers model"),
    Initialiser("U(-1/sqrt(fan_in), 1/sqrt(fan_in))", "uniform",
                lambda config, shape: 1.0 / math.sqrt(shape[-1]) if len(shape) >= 2 and shape[-1] else None,
                "PyTorch's nn.Linear.reset_parameters (kaiming_uniform with a=sqrt(5)): a layer built from torch.nn "
                "without transformers' initialisation"),
    Initialiser("N(0, 1)", "normal", lambda config, shape: 1.0,
                "PyTorch's nn.Embedding.reset_parameters: an embedding built from torch.nn and never filled"),
)


@dataclass(frozen=True)
class AtInit:
    """A tensor found at initial values: its key, what it holds ("constant 1.0", an initialiser's
    name, "NaN", "identity map") and the statistics that show it."""

    key: str
    holds: str
    evidence: str


def sample(t: TensorInfo) -> np.ndarray | None:
    """Up to SAMPLE_ELEMENTS of a float tensor's values as float64: all of a small tensor, else WINDOWS
    windows spread evenly over it. None for other dtypes (integers, bools, 8-bit floats)."""
    if t.dtype not in FLOATS or t.nbytes == 0:
        return None
    item = 2 if t.dtype in ("F16", "BF16") else np.dtype(FLOATS[t.dtype]).itemsize
    count = t.nbytes // item
    fd = os.open(t.file, os.O_RDONLY)
    try:
        if count <= SAMPLE_ELEMENTS:
            raw = os.pread(fd, count * item, t.begin)
        else:
            window = SAMPLE_ELEMENTS // WINDOWS
            starts = np.linspace(0, count - window, WINDOWS).astype(np.int64)
            raw = b"".join(os.pread(fd, window * item, t.begin + int(s) * item) for s in starts)
    finally:
        os.close(fd)
    raw = raw[:len(raw) // item * item]
    if t.dtype == "BF16":
        return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.frombuffer(raw, dtype=FLOATS[t.dtype]).astype(np.float64)


def tests(values: np.ndarray, law: str, scale: float, dtype: str) -> list[tuple[str, float, float]]:
    """(statistic, its deviation from what the law gives, the bound it must stay within) for each test
    that i.i.d. draws of the law pass. With n values and SIGMAS standard errors per bound:

    - the mean is within SIGMAS * sd / sqrt(n) of 0 (sd: the law's standard deviation);
    - the standard deviation s is within SIGMAS / sqrt(2n) of sd, relatively (the sample deviation's
      standard error for a normal law; a uniform law's is smaller, so the bound is safe for it too),
      widened by the dtype's rounding (a value rounded to the dtype moves by 2^-(bits+1) of itself);
    - the share of values within one "unit" is the law's within SIGMAS binomial standard errors (+1/n):
      |x| <= sd (normal: 0.6827) and |x| <= 2 sd (0.9545); |x| <= scale / 2 (uniform: 0.5). These tell
      the laws apart at equal standard deviation, and a trained matrix's heavier tails from both (a
      trained matrix's deviation often sits near 1/sqrt(fan_in), the uniform law's own);
    - uniform only: no value beyond the bound (its law never exceeds it), but for the dtype's rounding.
    """
    n = len(values)
    sd = scale if law == "normal" else scale / math.sqrt(3.0)
    rounding = 2.0 ** -(MANTISSA_BITS[dtype] + 1)
    mean, std = float(values.mean()), float(values.std())
    out = [("mean", abs(mean) / sd, SIGMAS / math.sqrt(n) + rounding),
           ("std", abs(std / sd - 1.0), SIGMAS / math.sqrt(2.0 * n) + 2 * rounding)]
    magnitude = np.abs(values)
    if law == "normal":
        shares = ((1.0, 0.6826894921370859), (2.0, 0.9544997361036416))
    else:
        out.append(("max", max(0.0, float(magnitude.max()) / scale - 1.0), 2 * rounding))
        shares = ((math.sqrt(3.0) / 2, 0.5),)
    for units, expected in shares:
        share = np.count_nonzero(magnitude <= units * sd) / n
        out.append((f"share within {units:g} sd", abs(share - expected),
                    SIGMAS * math.sqrt(expected * (1 - expected) / n) + 1.0 / n))
    return out


def _matches(values: np.ndarray, law: str, scale: float, dtype: str) -> str | None:
    """The evidence, when `values` pass every one of `tests` for the law; else None."""
    if all(deviation <= bound for _, deviation, bound in tests(values, law, scale, dtype)):
        sd = scale if law == "normal" else scale / math.sqrt(3.0)
        return f"mean {values.mean():+.2g}, std {values.std():.4g} against the law's {sd:.4g}, {len(values)} values sampled"
    return None


_SEEN: dict = {}  # what `at_init` found per tensor (by file identity and place): a draft is diagnosed per engine


def at_init(t: TensorInfo, config: dict) -> AtInit | None:
    """Whether float tensor `t` holds initial values: all NaN, all zero, one constant, or draws of an
    initialiser (matrices only, at least MIN_ELEMENTS sampled)."""
    try:
        info = os.stat(t.file)
    except OSError:
        return None
    key = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size, t.begin, t.end, t.dtype, t.shape,
           config.get("initializer_range"))
    if key not in _SEEN:
        if len(_SEEN) > 1 << 14:
            _SEEN.clear()
        _SEEN[key] = _at_init(t, config)
    hit = _SEEN[key]
    return hit if hit is None or hit.key == t.name else AtInit(t.name, hit.holds, hit.evidence)


def _at_init(t: TensorInfo, config: dict) -> AtInit | None:
    values = sample(t)
    if values is None or len(values) < 2:
        return None
    if np.isnan(values).all():
        return AtInit(t.name, "NaN", f"all {len(values)} sampled values are NaN")
    if values[0] == values[-1] and np.all(values == values[0]):
        whole = len(values) * (2 if t.dtype in ("F16", "BF16") else np.dtype(FLOATS[t.dtype]).itemsize) >= t.nbytes
        return AtInit(t.name, "zeros" if values[0] == 0 else f"the constant {values[0]:g}",
                      f"{'every one' if whole else 'each'} of its {len(values)} {'elements' if whole else 'sampled values'} "
                      f"is {values[0]:g}")
    if len(t.shape) < 2 or len(values) < MIN_ELEMENTS or not np.isfinite(values).all():
        return None
    for rule in INITIALISERS:
        scale = rule.scale(config, t.shape)
        if scale:
            stats = _matches(values, rule.law, float(scale), t.dtype)
            if stats:
                return AtInit(t.name, rule.name, stats)
    return None


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
        return AtInit(d2t.name, "the identity map",
                      f"all {len(offsets)} offsets are 0, so draft id i is target id i, for a draft vocabulary of "
                      f"{draft_vocab_size} of the target's {vocab_size}")
    return None


def scan(checkpoint: Checkpoint, vocab_size: int = 0, draft_vocab_size: int | None = None) -> list[AtInit]:
    """Every tensor of `checkpoint` found at initial values, in checkpoint order."""
    config = layer_config(checkpoint.config or {})
    found = [hit for t in checkpoint.tensors.values() if (hit := at_init(t, config)) is not None]
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
    layer = [p for p in report.params if p.role == "layer"]
    flagged = {keys[h.key].param for h in hits}
    if roles == {"layer"} and layer and all(p.name in flagged for p in layer):
        return "the decoder layer"
    names = {"embed": "the embedding", "lm_head": "the head", "fc": "the fc projection", "norm": "the final norm",
             "vocab-map": "the vocabulary map", "layer": "decoder-layer tensors", "tensor": "other tensors"}
    return " and ".join(names.get(r, r) for r in sorted(roles)) or f"{len(hits)} tensor(s)"


def value_findings(hits: list[AtInit], report) -> list[F.Finding]:
    """Findings for tensors at initial values, as `report`'s engine reads them: an error for a tensor the
    engine serves with, info for one it replaces with the target's or does not read. A weights-at-init
    error's message starts with a headline (before ": ") that the verdict repeats."""
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
    nan = [h for h in used if h.holds == "NaN"]
    if nan:
        out.append(F.finding("nan-weights", f"{_names([h.key for h in nan])}: every sampled value is NaN (speculators "
                                            "saves NaN embeddings and heads when the verifier's weights were never "
                                            "loaded before saving)"))
    # all zeros: a warning, as it always was (sparse test drafts read as zeros); a bias may be zero by design
    zero = [h.key for h in used if h.holds == "zeros" and not h.key.endswith(".bias")]
    if zero:
        out.append(F.finding("nan-weights", f"{_names(zero)}: every sampled value is zero", severity=F.WARNING))
    initial = [h for h in used if h.holds not in ("NaN", "zeros")]
    if initial:
        groups: dict[str, list[AtInit]] = {}
        for h in initial:
            groups.setdefault(h.holds, []).append(h)
        parts = [f"{holds} ({len(g)}: {_names([h.key for h in g])}; e.g. {g[0].evidence})" for holds, g in groups.items()]
        out.append(F.finding("weights-at-init", (
            f"{_what(initial, report, params, keys)} holds a fresh model's initial values, not trained ones "
            f"({len(initial)} tensor(s) {report.engine} serves with): " + "; ".join(parts)
            + ". The names load, so every loader calls it a clean load; served, the draft does not compute what it "
              "was trained to. Compare it with the training output (`draftdoctor compare TRAINED THIS`)")))
    for code, group in (("nan-weights", [h for h in unused if h.holds == "NaN"]),
                        ("weights-at-init", [h for h in unused if h.holds != "NaN"])):
        if group:
            out.append(F.finding(code, (
                f"{_names([h.key for h in group])} hold(s) {'; '.join(sorted({h.holds for h in group}))}, not trained "
                f"values, but {report.engine} replaces them with the target's at serve time: harmless there"),
                severity=F.INFO))
    return out
