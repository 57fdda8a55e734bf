"""What a measured accept length means, said next to the verdict of the same draft.

An accept length is a symptom, not a diagnosis: 1.24 does not say "broken", and "loads cleanly" does
not say "works". Read together they do. The ranges below are of the strict accept rate (accepted
drafts / drafted tokens, which does not depend on how many tokens are drafted), each with what was
measured on the kit's demo (tiny target, 4 draft tokens, 40 prompts, reference backend unless said;
`benchmarks/three_engines.py`, `draftdoctor.reference.beyond_names`, tests/test_values.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """Strict accept rates below `upto` mean `meaning`; `measured` says where the kit saw them."""

    upto: float
    meaning: str
    measured: str


RANGES = (
    Range(0.02, "no draft token was accepted", "a decoder layer left at initial values by dropped names: accept "
          "length 1.01 (1.00 on real vLLM); a vocabulary map of zeros: 1.01"),
    Range(0.15, "the draft runs but predicts little", "a decoder layer holding a fresh model's values under the right "
          "names, re-drawn by any of five initialisers: 1.00-1.25; a trained projection saved transposed: 1.16; a "
          "random embedding served by vLLM: 1.12"),
    Range(0.40, "the draft helps, far less than trained", "a draft trained with norm_before_residual served by SGLang, "
          "which does not compute it: 2.00"),
    Range(float("inf"), "the draft works", "the demo's draft fixed for SGLang 0.5.10: 3.08; with its aux ids one layer "
          "off (nothing flags it): 2.84"),
)


def strict_rate(accept_length: float, num_draft_tokens: int) -> float | None:
    """Accepted drafts per drafted token, from the accept length L and k draft tokens: (L - 1)/(k - 1)."""
    return (accept_length - 1) / (num_draft_tokens - 1) if num_draft_tokens and num_draft_tokens > 1 else None


def meaning(rate: float) -> Range:
    return next(r for r in RANGES if rate < r.upto)


def explain(accept_length: float | None, rate: float | None, verdict: str | None = None,
            errors: tuple[str, ...] = (), predicted=None) -> str:
    """One sentence: the accept length, what its range means, what the verdict says about why, and what
    was predicted before serving. `errors`: the error finding codes of the same draft's diagnosis;
    `predicted`: its `predict.Prediction`, if one was made."""
    line, note = explain_parts(accept_length, rate, verdict, errors, predicted)
    return line + (f". {note}" if note else "")


def explain_parts(accept_length: float | None, rate: float | None, verdict: str | None = None,
                  errors: tuple[str, ...] = (), predicted=None) -> tuple[str, str | None]:
    """`explain` in two parts: the draft's own sentence, and a remark that holds alike for every draft in
    its situation (what the demo measured in that range; where to look when nothing was found), which a
    list of drafts says once."""
    if accept_length is None or rate is None:
        return "not measured", None
    found = meaning(rate)
    head = f"accept length {accept_length:.2f} (strict rate {rate:.2f}): {found.meaning}"
    if predicted is not None and not (errors and "predicted accept length" in (verdict or "")):  # said once
        head += f" (predicted before serving: {predicted.accept_length:.2f} ± {predicted.accept_length_se:.2f})"
    if found.upto == float("inf"):
        return head + (f"; yet check says: {verdict}" if errors else ""), None
    if not verdict:
        return head, f"On the demo, {found.meaning}: {found.measured}"
    if errors:
        return head + f"; check says why: {verdict}", None
    return (head + ", although check finds no error", "Where check finds no error and the draft accepts little, the "
            "engine loads what is written, so the cause is in the written values or in what no check sees (the "
            "value findings list tensors at initial values; `draftdoctor compare TRAINED THIS` shows which "
            f"tensors differ from the training output). On the demo, {found.meaning}: {found.measured}")


def same_draft(fix_record: dict | None) -> bool:
    """Whether a fix changed nothing the engine reads (no tensor renamed or left out, no config change):
    "before" and "after" are then one draft measured twice."""
    if not fix_record:
        return False
    return not (fix_record.get("tensors_renamed") or fix_record.get("config_changes") or fix_record.get("tensors_omitted"))
