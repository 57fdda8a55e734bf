"""The reference backend proven against real vLLM: on the same correctly loaded draft, prompts
and number of draft tokens, the reference engine emulating vLLM 0.32.0 gives vLLM's own acceptance
(its /metrics counters) within 0.1 in mean length and 0.05 per position, and the same greedy tokens.
Measured here: identical (3.117 both, every position, 40/40 outputs). Needs `make vllm-loaders`."""

import json
from pathlib import Path

import pytest
from conftest import require_release

from draftdoctor.proofs.agreement import compare_with_vllm, prompt_ids, reference_acceptance
from draftdoctor.engines import resolve_engine

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
PROMPTS = [json.loads(line)["prompt"] for line in (DEMO / "prompts.jsonl").read_text().splitlines()][:16]


@pytest.fixture(scope="module")
def agreement(tmp_path_factory):
    require_release("0.32.0", "vllm")
    # speculators' own checkpoint, which vLLM serves as it is
    return compare_with_vllm(DEMO / "target", DEMO / "draft-speculators", prompt_ids(DEMO / "target", PROMPTS),
                             tmp_path_factory.mktemp("agreement"))


def test_reference_backend_agrees_with_real_vllm(agreement):
    assert agreement.real.backend == "vLLM 0.32.0 (real engine, CPU)"
    assert agreement.real.accept_length > 2.0  # a good draft, not two dead ones agreeing
    assert agreement.length_gap <= 0.1, (agreement.reference, agreement.real)
    assert agreement.position_gap <= 0.05, (agreement.reference.per_position, agreement.real.per_position)
    assert agreement.same_outputs == len(PROMPTS)
    assert agreement.reference.verify_steps == agreement.real.verify_steps


@pytest.mark.parametrize("release, agrees", [("0.5.11", False), ("0.5.12.post1", True), ("0.5.23", True)])
def test_sglangs_chain_positions_per_release(agreement, tmp_path, release, agrees):
    """Each side of SGLang's edge: up to 0.5.11 it runs draft chain step j at rope position P + j, one
    further than vLLM and the trainers (its `positions.add_(1)` before each draft forward); from 0.5.12
    at P + j - 1, as they do (PR #25015 moved the increment after the forward). Emulating a release on
    the same tensors (fixed for it), the greedy tokens are the same either way; from 0.5.12 the
    acceptance is real vLLM's within the agreement bounds, before it the chain's later positions move."""
    from draftdoctor.fix import apply_fix, plan_fix

    fixed = apply_fix(plan_fix(DEMO / "draft-speculators", f"sglang=={release}", target=DEMO / "target"), tmp_path / "f").dst
    sglang = reference_acceptance(DEMO / "target", fixed, resolve_engine(f"sglang=={release}"), prompt_ids(DEMO / "target", PROMPTS), 48, 4)
    assert sglang.output_ids == agreement.real.output_ids
    gap = max(abs(a - b) for a, b in zip(sglang.per_position, agreement.real.per_position))
    if agrees:
        assert abs(sglang.accept_length - agreement.real.accept_length) <= 0.1 and gap <= 0.05, (sglang, agreement.real)
    else:
        assert sglang.per_position != agreement.real.per_position and gap > 0, (sglang, agreement.real)
