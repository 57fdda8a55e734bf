"""Predicted acceptance: what the loaded draft does, not what rules say about it.

The draft is taken as the engine release's loader leaves it (the coverage report that `check` made,
replayed or from the release's own loader; `eagle.loading.place`), computed with the reference
EAGLE-3 math of that release (chain positions, norms, captured layers, vocabulary map: its profile row),
and run on the target's own greedy continuation of a few prompts, teacher-forced
(`eagle.teacher`: the target in transformers, recorded once). Greedy verification is then replayed
exactly (`eagle.engine.speculative_generate` over the recording): per prompt, the verify steps and
the draft tokens accepted at each position, counted as the engine counts them. So a defect outside
every rule (a transposed matrix, a re-drawn layer, one NaN, a permuted vocabulary map) shows up as what
it does: no acceptance.

The numbers: accept length L = tokens per verify step, bonus included (the kit's one definition), and
per-position acceptance (the share of verify steps that accepted draft token j), each with its standard
error over the prompts (a ratio estimator: its delta-method variance, from how the prompts differ).

`NOTHING_BELOW`, the bound under which the prediction is an error, is derived in its comment from the
accept lengths measured on the demo's drafts with and without training.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import findings as F
from .prompts import DEMO_PROMPTS

# A loaded draft "predicts essentially nothing" when its predicted accept length is below this, with the
# prediction's own sampling error taken against it (the upper end of a 2-sigma interval must be below it).
# Measured on the demo (reference backend, 4 draft tokens per step, 40 prompts x 48 tokens): a trained
# draft 3.08-3.12; the same draft with every decoder-layer projection re-drawn by an initialiser it was
# never trained from 1.00-1.24 (truncated normal 1.24, Glorot 1.04, N(0, 0.01) 1.00, orthogonal 1.24), a
# trained square projection saved transposed 1.16, one NaN in fc 1.00, the decoder layer left unloaded
# 1.01. Those numbers are the accept length of a draft whose decoder layer carries nothing: its fc, head
# and embedding still make it guess a frequent token now and then. Every such case lies below 1.25 and
# every trained one above 3; the bound sits at 1.3, above the best a draft without a trained layer was
# measured to reach, so an accept length under it is not a weak draft but no draft: at 4 draft tokens a
# step it means fewer than 1 in 13 drafted tokens accepted (strict rate < 0.075), where a trained EAGLE-3
# draft accepts about half. A draft predicted between 1.3 and a useful accept length is information, not
# an error: the prediction says how much it accepts.
NOTHING_BELOW = 1.3
SIGMAS = 2.0  # the prediction's standard error taken against the bound (one-sided ~98%)


@dataclass(frozen=True)
class PredictionSpec:
    """What a prediction runs: the target (a folder with weights), the prompts (the demo's by default),
    how many of them, how many tokens of the target's continuation each, draft tokens per verify step
    (topk 1), where the target runs, and in which dtype the target and the draft compute (float32, as the
    engines serve on CPU; float64 in the tests that compare with the reference engine)."""

    target: Path
    prompts: Path | tuple[str, ...] = DEMO_PROMPTS  # a prompts file, or the prompts themselves
    num_prompts: int = 16
    new_tokens: int = 64
    num_steps: int = 4
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self):  # paths given as text are paths
        object.__setattr__(self, "target", Path(self.target))
        if not isinstance(self.prompts, tuple):
            object.__setattr__(self, "prompts", Path(self.prompts))


@dataclass
class Prediction:
    """The predicted acceptance of one loaded draft (see the module's text)."""

    accept_length: float
    accept_length_se: float
    per_position: list[float]
    per_position_se: list[float]
    prompts: int
    tokens: int  # target tokens the verify steps emitted, over all prompts
    verify_steps: int
    num_steps: int
    loader: str  # whose record placed the draft: "replay" or "real"
    counted: str  # how accepted drafts are counted (the engine's counters: emitted, before_stop, before_eos)
    target: str
    device: str
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def strict_rate(self) -> float:
        return (self.accept_length - 1) / self.num_steps

    @property
    def predicts_nothing(self) -> bool:
        """Sure, within its sampling error, to stay below NOTHING_BELOW."""
        return self.accept_length + SIGMAS * self.accept_length_se < NOTHING_BELOW

    @property
    def works(self) -> bool:
        """Sure, within its sampling error, to stay above NOTHING_BELOW (neither this nor `predicts_nothing`:
        too few prompts to tell; the rules then stand as they are)."""
        return self.accept_length - SIGMAS * self.accept_length_se >= NOTHING_BELOW

    def text(self) -> str:
        """'predicted accept length 2.93 ± 0.12 (strict rate 0.48; per draft position 0.78, 0.55, ...)'"""
        positions = ", ".join(f"{a:.2f}" for a in self.per_position)
        return (f"predicted accept length {self.accept_length:.2f} ± {self.accept_length_se:.2f} (strict rate "
                f"{self.strict_rate:.2f}; per draft position {positions}) over {self.prompts} prompts, {self.tokens} "
                f"target tokens, {self.num_steps} draft tokens a step")

    def to_dict(self) -> dict:
        return asdict(self) | {"strict_rate": self.strict_rate, "predicts_nothing": self.predicts_nothing,
                               "works": self.works}


class PredictionUnavailable(Exception):
    """Why no prediction was made for this draft (said as a `not-checked` finding)."""


def ratio(numerators: list[float], denominators: list[float]) -> tuple[float, float]:
    """sum(n) / sum(d) over the prompts, and its standard error by the delta method: the variance of
    the residuals n_i - r d_i across prompts, over (sum d)^2, with n / (n - 1) for the one mean fitted."""
    total = sum(denominators)
    if not total:
        return 0.0, 0.0
    r = sum(numerators) / total
    n = len(denominators)
    if n < 2:
        return r, 0.0
    residuals = sum((a - r * b) ** 2 for a, b in zip(numerators, denominators))
    return r, math.sqrt(n / (n - 1) * residuals) / total


def _counts(results, how: str) -> tuple[list[int], list[list[int]]]:
    return [r.spec_verify_ct for r in results], [r.counted(how) for r in results]


def summarise(results, how: str, num_steps: int) -> tuple[float, float, list[float], list[float], int]:
    """(accept length, its SE, per-position acceptance, their SEs, tokens) of the replayed verify steps."""
    steps, accepted = _counts(results, how)
    rate, se = ratio([sum(a) for a in accepted], steps)
    per_position = [ratio([a[j] for a in accepted], steps) for j in range(num_steps)]
    return (1 + rate, se, [p for p, _ in per_position], [s for _, s in per_position],
            sum(len(r.output_ids) for r in results))


_RECORDINGS: dict = {}  # (target, dtype, prompts, tokens, capture) -> recordings: check, then fix, reuse them
_MODEL: dict = {}  # the one target kept loaded in this process: (target, dtype, device) -> (model, facts)


def _model(spec: PredictionSpec, dtype, tokens: int):
    from .eagle import teacher

    key = (teacher.fingerprint(spec.target), str(dtype), spec.device)
    if key not in _MODEL:
        _MODEL.clear()  # one at a time: a target can be large
        model = teacher.load_target(spec.target, dtype, spec.device, tokens)
        layers, hidden, vocab = teacher.text_config(model)
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        _MODEL[key] = model, (layers, hidden, vocab, teacher.eos_of(spec.target, model),
                              embed.detach().to("cpu", dtype), head.detach().to("cpu", dtype))
    return _MODEL[key]


def _recordings(spec: PredictionSpec, model, dtype, capture: tuple[int, ...], tokens: int):
    from .prompts import load_prompts
    from .eagle import teacher

    texts = (list(spec.prompts)[:spec.num_prompts] if isinstance(spec.prompts, tuple)
             else load_prompts(spec.prompts, limit=spec.num_prompts))
    key = (teacher.fingerprint(spec.target), str(dtype), spec.device, tuple(texts), tokens, capture)
    if key not in _RECORDINGS:
        if len(_RECORDINGS) > 8:
            _RECORDINGS.clear()
        ids = teacher.tokenize(spec.target, texts)
        with _threads(teacher.threads_for(model)):
            sequences = teacher.continuations(model, ids, tokens)
            _RECORDINGS[key] = [teacher.record(model, p, s, capture) for p, s in zip(ids, sequences)]
    return _RECORDINGS[key]


@contextlib.contextmanager
def _threads(n: int | None):
    """torch on `n` threads while inside (None: as it is)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n or before)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _TargetParts:
    """What `eagle.loading.place` takes from the target: its dtype, layer count, embedding and head."""

    def __init__(self, dtype, n_layers, embed, head):
        self.dtype, self.n_layers, self.embed, self.head = dtype, n_layers, embed, head


def predict(report, spec: PredictionSpec, checkpoint=None) -> Prediction:
    """The predicted acceptance of the draft `report` (a `check` diagnosis of `checkpoint`, the open
    checkpoint; by default the one at `report.path`) describes, served by its engine with `spec.target`.
    Raises PredictionUnavailable saying why it cannot be made (the reference does not compute this
    draft, the target cannot run here, the engine would not start)."""
    try:
        import torch

        from .eagle import teacher
        from .eagle.engine import CaptureMismatch, speculative_generate
        from .eagle.loading import LoadRefused, place
    except ImportError as e:
        raise PredictionUnavailable(f"the prediction needs torch and transformers ({e.name} is not installed)") from None
    from .errors import UserError

    started = time.perf_counter()
    engine = report.engine
    dtype = getattr(torch, spec.dtype)
    tokens = spec.new_tokens + spec.num_steps + 1  # the last verify step looks this far past the budget
    try:
        model, (layers, hidden, vocab, eos, embed, head) = _model(spec, dtype, tokens)
    except UserError as e:  # over the memory budget (with the estimate), or a target transformers cannot run
        raise PredictionUnavailable(str(e)) from None
    try:
        loaded = place(report, _TargetParts(dtype, layers, embed, head), checkpoint)
    except LoadRefused as e:
        raise PredictionUnavailable(f"{engine} would not serve it as the reference computes it: {e}") from None
    capture = tuple(sorted({i for i in loaded.capture if 0 <= i <= layers}))
    try:
        recordings = _recordings(spec, model, dtype, capture, tokens)
    except teacher.TargetUnusable as e:  # its tokenizer
        raise PredictionUnavailable(str(e)) from None
    profile = engine.profile
    results = []
    with _threads(1):  # the draft's operations are tiny: one thread (eagle.teacher.ONE_THREAD_BELOW)
        for rec in recordings:
            recorded = teacher.Recorded(rec, layers, hidden, vocab, dtype)
            budget = min(spec.new_tokens, len(rec.continuation) - spec.num_steps - 1)
            if budget < 1:
                continue
            try:
                results.append(speculative_generate(recorded, loaded.draft, loaded.capture, rec.prompt, budget,
                                                    spec.num_steps, eos, chain_offset=loaded.chain_offset,
                                                    drafts_within_budget=loaded.drafts_within_budget,
                                                    aux_repeats=loaded.aux_repeats))
            except CaptureMismatch as e:
                raise PredictionUnavailable(f"the draft cannot run on what {engine} captures: {e}") from None
    if not results:
        raise PredictionUnavailable("the target's greedy continuations were too short to verify a draft step")
    counts = profile.serving.counts_accepted
    length, se, per_position, per_position_se, emitted = summarise(results, counts, spec.num_steps)
    notes = []
    short = sum(len(rec.continuation) < tokens for rec in recordings)
    if short:
        notes.append(f"{short} continuation(s) ended early: the full forward and token-by-token decoding took another "
                     "token at a near tie")
    return Prediction(length, se, per_position, per_position_se, len(results), emitted,
                      sum(r.spec_verify_ct for r in results), spec.num_steps, report.loader, counts,
                      str(spec.target), spec.device, time.perf_counter() - started, notes)


def findings(prediction: Prediction, report) -> list[F.Finding]:
    """The prediction as findings: an error when the loaded draft predicts essentially nothing, a warning when it
    is within its error of that, else information, with the loader whose record placed it."""
    said = (f"{prediction.text()}: the draft as the {prediction.loader} loader of {report.engine} leaves it, on the "
            f"target's own greedy continuations ({prediction.seconds:.1f} s)")
    if prediction.predicts_nothing:
        return [F.finding("no-acceptance-predicted", (
            f"{said}. Every parameter may load, yet the draft predicts essentially nothing: its values carry no "
            f"training the engine can use (below {NOTHING_BELOW} a draft's decoder layer was measured to carry "
            "nothing)"))]
    if not prediction.works:  # within its error of the bound: it may carry nothing, and the verdict must not hide it
        return [F.finding("predicted-acceptance", (
            f"{said}: within its error of {NOTHING_BELOW}, below which a draft's decoder layer was measured to carry "
            "nothing, so it is not sure the draft accepts anything; more prompts (--num-prompts) tell"),
            severity=F.WARNING)]
    return [F.finding("predicted-acceptance", said, severity=F.INFO)]
