"""The reference backend against real engines on the demo: acceptance side by side, with the gaps.

For each draft below, the reference engine emulating the installed vLLM release and real vLLM itself
serve the same target with the same prompts (sent as token ids), 4 draft tokens, greedy, 48 new
tokens; acceptance is vLLM's own definition (its /metrics counters). The reference emulating SGLang
0.5.23 on the same tensors is printed beside them: it differs from vLLM by one rope position in the
draft's chain steps (ServedDraft.chain_position_offset). Usage: .venv/bin/python benchmarks/agreement.py [N_PROMPTS]
"""

import json
import sys
import tempfile
from pathlib import Path

from draftdoctor.fix import apply_fix, plan_fix
from draftdoctor.proofs.agreement import compare_with_vllm, prompt_ids, reference_acceptance

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"


def row(label, a, real=None):
    per = " ".join(f"{p:.3f}" for p in a.per_position)
    gap = "" if real is None else f"  gap {a.accept_length - real.accept_length:+.3f}"
    print(f"  {label:<44} {a.accept_length:6.3f}  [{per}]  steps {a.verify_steps}{gap}")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    prompts = [json.loads(line)["prompt"] for line in (DEMO / "prompts.jsonl").read_text().splitlines()][:n]
    ids = prompt_ids(DEMO / "target", prompts)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        drafts = {"draft-speculators (as trained)": DEMO / "draft-speculators",
                  "draft-story fixed for vLLM": apply_fix(plan_fix(DEMO / "draft-story", "vllm", target=DEMO / "target"),
                                                          work / "story-vllm").dst}
        print(f"{n} demo prompts, 4 draft tokens, greedy, 48 new tokens; accept length = 1 + accepted / verify steps")
        for name, draft in drafts.items():
            agreement = compare_with_vllm(DEMO / "target", draft, ids, work)
            sglang_copy = apply_fix(plan_fix(draft, "sglang==0.5.23", target=DEMO / "target"), work / f"{draft.name}-sglang").dst
            sglang = reference_acceptance(DEMO / "target", sglang_copy, "sglang==0.5.23", ids, 48, 4)
            print(f"{name}:")
            row(agreement.real.backend, agreement.real)
            row(agreement.reference.backend, agreement.reference, agreement.real)
            row(sglang.backend + " (same tensors)", sglang, agreement.real)
            print(f"  same greedy outputs: {agreement.same_outputs}/{n}; largest per-position gap "
                  f"{agreement.position_gap:.3f}")


if __name__ == "__main__":
    main()
