"""The reference backend proven against real engines: one draft, the same prompts (as token ids), the
same number of draft tokens, greedy, measured on the reference engine emulating an engine release and
on that engine itself (vLLM, llama.cpp); acceptance compared by the real engine's own definition.

On vLLM the definition is its `/metrics` counters: mean acceptance length = 1 + accepted / drafts
and per-position acceptance = accepted at position i / drafts, both counting every draft the target
accepted, also where a stop (EOS, the token budget) cut the output short (scheduler.py counts before
its stop check). llama.cpp's counters count the drafts accepted before an accepted EOS, which ends the
step as the target's own token (unless it is the step's last draft: then it counts as accepted). The reference engine counts as the engine it emulates does
(`ServedDraft.counts_accepted`).

`compare` returns one `Agreement` per emulation with the differences; `benchmarks/agreement.py`
prints them, `tests/test_vllm_agreement.py` holds them within 0.1 (length) and 0.05 (per position).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..engines import EngineRelease, expect_release


@dataclass(frozen=True)
class Acceptance:
    """One backend's acceptance over a run: what a user compares."""

    backend: str  # what ran, as a user sees it labelled
    accept_length: float  # 1 + accepted drafts per verify step
    per_position: tuple[float, ...]  # share of verify steps accepting draft i
    verify_steps: int
    output_ids: tuple[tuple[int, ...], ...] = ()  # per prompt, where the backend returns them


@dataclass(frozen=True)
class Agreement:
    """The reference engine emulating `engine` against the real engine on one draft."""

    engine: EngineRelease
    reference: Acceptance
    real: Acceptance

    @property
    def length_gap(self) -> float:
        return abs(self.reference.accept_length - self.real.accept_length)

    @property
    def position_gap(self) -> float:
        return max((abs(a - b) for a, b in zip(self.reference.per_position, self.real.per_position)), default=0.0)

    @property
    def same_outputs(self) -> int | None:
        """Prompts whose greedy output is token for token the same (None: a backend returned no ids)."""
        if not (self.reference.output_ids and self.real.output_ids):
            return None
        return sum(a == b for a, b in zip(self.reference.output_ids, self.real.output_ids))


def prompt_ids(target_dir, prompts: list[str]) -> list[list[int]]:
    """The target tokenizer's ids for each prompt (sent as ids, so every backend sees the same tokens)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json"))
    return [tokenizer.encode(p).ids for p in prompts]


def eos_token_id(target_dir) -> int | None:
    config = json.loads((Path(target_dir) / "config.json").read_text())
    return config.get("eos_token_id")


def reference_acceptance(target_dir, draft_dir, engine: EngineRelease, prompts: list[list[int]], max_new_tokens: int,
                         num_steps: int) -> Acceptance:
    """The reference engine emulating `engine` (loading, aux layers, chain positions from its profile)."""
    import torch

    from ..reference.acceptance import one_thread
    from ..eagle.llama import TargetModel
    from ..diagnose import check
    from ..eagle.loading import place

    expect_release(engine)
    target = TargetModel.from_dir(Path(target_dir), torch.float32)
    loaded = place(check(draft_dir, engine), target)
    eos = eos_token_id(target_dir)
    with one_thread():
        results = [loaded.speculate(target, ids, max_new_tokens, num_steps, eos) for ids in prompts]
    steps = sum(r.spec_verify_ct for r in results)
    per_position = [sum(c) for c in zip(*(r.counted(engine.profile.serving.counts_accepted) for r in results))]
    return Acceptance(f"reference backend emulating {engine.spec}", 1 + sum(per_position) / steps,
                      tuple(c / steps for c in per_position), steps, tuple(tuple(r.output_ids) for r in results))


def vllm_acceptance(target_dir, draft_dir, prompts: list[list[int]], max_new_tokens: int, num_steps: int,
                    log_path) -> Acceptance:
    """Real vLLM serving `draft_dir` as it is, its counters read around the run."""
    from ..serving import vllm
    from ..serving.launcher import ServeConfig, serve

    config = ServeConfig(target=str(target_dir), draft=str(draft_dir), num_steps=num_steps, num_draft_tokens=num_steps + 1)
    with serve("vllm", config, log_path) as server:
        result = vllm.run_bench(server.base_url, prompts, max_new_tokens=max_new_tokens, num_draft_tokens=num_steps + 1)
    return Acceptance(vllm.label(vllm.served_release()), result.accept_length, tuple(result.per_position or ()),
                      result.verify_steps, tuple(tuple(r.output_ids) for r in result.requests))


def llamacpp_acceptance(target_dir, draft_dir, prompts: list[list[int]], max_new_tokens: int, num_steps: int,
                        log_path) -> Acceptance:
    """Real llama.cpp serving `draft_dir` (converted by its own converter), its counters read around the run."""
    from ..serving import llamacpp
    from ..serving.launcher import ServeConfig, serve

    config = ServeConfig(target=str(target_dir), draft=str(draft_dir), num_steps=num_steps, num_draft_tokens=num_steps + 1)
    with serve("llamacpp", config, log_path) as server:
        result = llamacpp.run_bench(server.base_url, prompts, max_new_tokens=max_new_tokens,
                                    num_draft_tokens=num_steps + 1)
    return Acceptance(llamacpp.label(), result.accept_length, tuple(result.per_position or ()), result.verify_steps,
                      tuple(tuple(r.output_ids) for r in result.requests))


def compare_with_llamacpp(target_dir, draft_dir, prompts: list[list[int]], out_dir, max_new_tokens: int = 48,
                          num_steps: int = 4) -> Agreement:
    """The reference engine emulating llama.cpp (its profile row) against llama.cpp itself, on one draft."""
    from ..realload.registry import REAL_LOADERS

    real = llamacpp_acceptance(target_dir, draft_dir, prompts, max_new_tokens, num_steps,
                               Path(out_dir) / f"llamacpp-{Path(draft_dir).name}.log")
    engine = EngineRelease.of("llamacpp", REAL_LOADERS["llamacpp"].built)
    return Agreement(engine, reference_acceptance(target_dir, draft_dir, engine, prompts, max_new_tokens, num_steps), real)


def compare_with_vllm(target_dir, draft_dir, prompts: list[list[int]], out_dir, max_new_tokens: int = 48,
                      num_steps: int = 4) -> Agreement:
    """The reference engine emulating the installed vLLM release against that release, on one draft."""
    from ..serving import vllm

    release = vllm.served_release()
    real = vllm_acceptance(target_dir, draft_dir, prompts, max_new_tokens, num_steps,
                           Path(out_dir) / f"vllm-{Path(draft_dir).name}.log")
    engine = EngineRelease.of("vllm", release)
    return Agreement(engine, reference_acceptance(target_dir, draft_dir, engine, prompts, max_new_tokens, num_steps), real)
