"""The reference backend proven against real vLLM (issue 19): on the same correctly loaded draft, prompts
and number of draft tokens, the reference engine emulating vLLM 0.32.0 gives vLLM's own acceptance
(its /metrics counters) within 0.1 in mean length and 0.05 per position, and the same greedy tokens.
Measured here: identical (3.117 both, every position, 40/40 outputs). Needs `make vllm-loaders`."""

import json
from pathlib import Path

import pytest
from conftest import require_release

from draftdoctor.serving.agreement import compare_with_vllm, prompt_ids, reference_acceptance

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


def test_chain_positions_are_the_engines_difference(agreement, tmp_path):
    """SGLang runs draft chain steps one rope position further on than vLLM (and than speculators trains
    with); emulating SGLang on the same tensors (fixed for it), the tokens are the same and the
    acceptance moves."""
    from draftdoctor.fix import apply_fix, plan_fix

    fixed = apply_fix(plan_fix(DEMO / "draft-speculators", "sglang==0.5.23", target=DEMO / "target"), tmp_path / "f").dst
    sglang = reference_acceptance(DEMO / "target", fixed, "sglang==0.5.23", prompt_ids(DEMO / "target", PROMPTS), 48, 4)
    assert sglang.output_ids == agreement.reference.output_ids
    assert sglang.per_position != agreement.reference.per_position
