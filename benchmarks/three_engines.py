"""Three engines, one draft: the reference backend, real vLLM and real llama.cpp on the demo.

The same correctly loaded draft (data/demo/draft-speculators, speculators' own checkpoint, which every
engine reads), the same prompts sent as token ids, 4 draft tokens, greedy, 48 new tokens. Each real
engine's acceptance is read from its own counters and set beside the reference engine emulating that
engine; then the engines are compared with each other on what they all count alike: tokens emitted per
verify step. Their own mean acceptance lengths differ by definition only: vLLM counts every draft the
target accepted, also past EOS; llama.cpp counts an accepted EOS as the target's own token unless it is
the step's last draft.
Usage: .venv/bin/python benchmarks/three_engines.py [N_PROMPTS]
"""

import json
import sys
import tempfile
from pathlib import Path

from draftdoctor.proofs.agreement import compare_with_llamacpp, compare_with_vllm, prompt_ids

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"


def emitted_per_step(acceptance) -> float:
    """Tokens emitted per verify step: (completion tokens - the prefill token) / verify steps."""
    return sum(len(ids) - 1 for ids in acceptance.output_ids) / acceptance.verify_steps


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    prompts = [json.loads(line)["prompt"] for line in (DEMO / "prompts.jsonl").read_text().splitlines()][:n]
    ids = prompt_ids(DEMO / "target", prompts)
    draft = DEMO / "draft-speculators"
    with tempfile.TemporaryDirectory() as work:
        agreements = [compare_with_vllm(DEMO / "target", draft, ids, work),
                      compare_with_llamacpp(DEMO / "target", draft, ids, work)]
    print(f"{n} demo prompts, {draft.name}, 4 draft tokens, greedy, 48 new tokens")
    print(f"{'backend':<62} {'accept len':>10} {'emitted/step':>12} {'steps':>6}  per position")
    for a in agreements:
        for side in (a.real, a.reference):
            per = " ".join(f"{p:.3f}" for p in side.per_position)
            print(f"{side.backend:<62} {side.accept_length:10.3f} {emitted_per_step(side):12.3f} {side.verify_steps:6d}  [{per}]")
        print(f"  {a.engine}: reference vs real: length gap {a.length_gap:.3f}, largest per-position gap "
              f"{a.position_gap:.3f}, same greedy outputs {a.same_outputs}/{n}")
    vllm, llama = (a.real for a in agreements)
    print(f"real vLLM vs real llama.cpp, tokens emitted per verify step: {emitted_per_step(vllm):.3f} vs "
          f"{emitted_per_step(llama):.3f} (gap {abs(emitted_per_step(vllm) - emitted_per_step(llama)):.3f}); "
          f"same greedy outputs {sum(x == y for x, y in zip(vllm.output_ids, llama.output_ids))}/{n}")


if __name__ == "__main__":
    main()
