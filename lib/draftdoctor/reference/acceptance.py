"""The story on the reference backend: acceptance before and after `draftdoctor fix`.

`python -m draftdoctor.reference.acceptance [DATA_DIR]` prints, over the demo prompts, accept length
(the log line's formula, and meta_info's, which also counts the prefill token) and the strict accept
rate for:
- draft-story under sglang==0.5.10: speculators' tensors with a hand-flattened config, the
  checkpoint the story served (decoder layer dropped: expect accept length about 1.00);
- the same after `draftdoctor fix --engine sglang==0.5.10` (expect well above 2);
- draft-speculators as speculators saved it, under sglang==0.5.23: refused, as SGLang refuses its
  nested config;
- the same after `draftdoctor fix --engine sglang==0.5.23` (config converted; names load as they are).
Each draft is loaded the way the emulated release's loader leaves it (draftdoctor.eagle.loading).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from draftdoctor.eagle.draft import EagleDraft
from draftdoctor.eagle.engine import GenerateResult
from draftdoctor.eagle.llama import TargetModel
from draftdoctor.eagle.loading import LoadedDraft, LoadRefused, place
from draftdoctor.engines import EngineRelease


@dataclass
class Measurement:
    """Totals over a set of requests, with SGLang's definitions (docs/engine-facts.md: "Acceptance")."""

    requests: int
    completion_tokens: int
    spec_verify_ct: int
    accepted_per_position: list[int]  # as emitted (SGLang's log line)
    accepted_before_stop: list[int]  # as the target accepted them, stop or not (vLLM's counters)
    counted: list[int]  # as the emulated engine's counters count them (`GenerateResult.counted`)

    @property
    def accept_length(self) -> float:
        """meta_info formula: completion tokens (prefill token included) per verify step."""
        return self.completion_tokens / self.spec_verify_ct

    @property
    def step_accept_length(self) -> float:
        """Log-line / server_info formula: (accepted drafts + bonus tokens) per verify step."""
        return (sum(self.accepted_per_position) + self.spec_verify_ct) / self.spec_verify_ct

    @property
    def accept_length_before_stop(self) -> float:
        """vLLM's mean acceptance length: 1 + accepted drafts (counted before a stop cuts them) per verify step."""
        return 1 + sum(self.accepted_before_stop) / self.spec_verify_ct

    @property
    def served_accept_length(self) -> float:
        """1 + counted accepted drafts per verify step: the accept length `bench` reports for the emulated
        engine, and the one its prediction predicts."""
        return 1 + sum(self.counted) / self.spec_verify_ct

    @property
    def strict_accept_rate(self) -> float:
        """Counted accepted drafts per drafted token (`counted`), as `bench` reports it."""
        return sum(self.counted) / (self.spec_verify_ct * len(self.counted))

    @classmethod
    def of(cls, results: list[GenerateResult], counts_accepted: str = "before_stop") -> "Measurement":
        """The totals of `results`, their accepted drafts counted as `ServedDraft.counts_accepted` says."""
        return cls(len(results), sum(r.completion_tokens for r in results),
                   sum(r.spec_verify_ct for r in results),
                   [sum(c) for c in zip(*(r.accepted_per_position for r in results))],
                   [sum(c) for c in zip(*(r.accepted_before_stop for r in results))],
                   [sum(c) for c in zip(*(r.counted(counts_accepted) for r in results))])


@contextmanager
def one_thread():
    """torch on one thread while inside: the reference engine's ops are tiny, and on 2 cores a second
    thread made measuring over 10x slower (thread synchronisation per op)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tokenized_prompts(data_dir: Path, n_prompts: int | None = None) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(data_dir / "target" / "tokenizer.json"))
    lines = (data_dir / "prompts.jsonl").read_text().splitlines()[:n_prompts]
    return [tok.encode(json.loads(line)["prompt"]).ids for line in lines]


def run_prompts(target: TargetModel, loaded: LoadedDraft, prompts: list[list[int]], max_new_tokens: int,
                num_steps: int, draft: EagleDraft | None = None) -> Measurement:
    """Measurement of the loaded draft (or `draft` in its place, run as `loaded` says) speculating for
    `target` over `prompts`, one request at a time, each stopping at the target's end-of-sequence token
    as the reference server's requests do (so that the two measure the same thing)."""
    eos = target.config.get("eos_token_id")
    return Measurement.of([loaded.speculate(target, p, max_new_tokens, num_steps, eos, draft) for p in prompts],
                          loaded.counts_accepted)


def measure(target: TargetModel, draft_dir, engine: EngineRelease, prompts: list[list[int]], max_new_tokens: int,
            num_steps: int, loader: str = "replay") -> tuple[int, Measurement]:
    """(parameters written, Measurement) of `draft_dir` served by `engine`; LoadRefused if it would not start."""
    from draftdoctor.diagnose import check

    loaded = place(check(draft_dir, engine, loader=loader), target)
    return len(loaded.written), run_prompts(target, loaded, prompts, max_new_tokens, num_steps)


def demo_cases(data_dir: Path, workdir: Path, n_prompts: int | None = None, max_new_tokens: int = 48,
               num_steps: int = 4, dtype=torch.float32) -> dict[str, tuple[int, Measurement] | str]:
    """{case: (parameters written, Measurement), or the refusal message} for the four cases above,
    target and drafts computed in `dtype` (the tests compare float32 with float64)."""
    from draftdoctor.fix import apply_fix, plan_fix

    target = TargetModel.from_dir(data_dir / "target", dtype)
    prompts = tokenized_prompts(data_dir, n_prompts)
    cases = {}
    for name, draft, engine, fixed in (
        ("story draft, sglang==0.5.10", data_dir / "draft-story", "0.5.10", False),
        ("story draft fixed, sglang==0.5.10", data_dir / "draft-story", "0.5.10", True),
        ("speculators draft, sglang==0.5.23", data_dir / "draft-speculators", "0.5.23", False),
        ("speculators draft fixed, sglang==0.5.23", data_dir / "draft-speculators", "0.5.23", True),
    ):
        engine = EngineRelease.of("sglang", engine)
        if fixed:
            out = workdir / name.replace(" ", "-").replace(",", "").replace("=", "")
            draft = apply_fix(plan_fix(draft, engine), out, force=True).dst
        try:
            cases[name] = measure(target, draft, engine, prompts, max_new_tokens, num_steps)
        except LoadRefused as e:
            cases[name] = f"refused: {e}"
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", nargs="?", type=Path, default=Path("data/demo"))
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--num-steps", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny ops: a second thread only adds overhead
    with tempfile.TemporaryDirectory() as work:
        cases = demo_cases(args.data_dir, Path(work), max_new_tokens=args.max_new_tokens, num_steps=args.num_steps)
    print(f"reference backend (CPU), {args.num_steps} steps, topk 1, {args.max_new_tokens} new tokens per prompt")
    for case, outcome in cases.items():
        if isinstance(outcome, str):
            print(f"{case:40s} {outcome}")
            continue
        written, m = outcome
        per_pos = ", ".join(f"{c / m.spec_verify_ct:.2f}" for c in m.counted)
        print(f"{case:40s} written {written:2d}/11  accept len {m.served_accept_length:.2f} "
              f"(log line {m.step_accept_length:.2f}, meta_info {m.accept_length:.2f})  strict accept rate "
              f"{m.strict_accept_rate:.2f}  per position [{per_pos}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
