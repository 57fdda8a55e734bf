"""Measure the demo draft's acceptance on the reference engine, loaded the ways the story goes.

`python -m draftdoctor.reference.acceptance [DATA_DIR]` prints accept length (log-line formula,
and meta_info's, which also counts the prefill token) and strict accept rate over the demo prompts for: the speculators checkpoint as saved (`layers.0.*`, which SGLang
0.4.9-0.5.11 drops: decoder layer left at its initial value), the same tensors renamed to
`midlayer.*`, and the renamed draft with aux layer ids given to SGLang unconverted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from draftdoctor.reference.draft import build_draft, replay_sglang_load
from draftdoctor.reference.engine import GenerateResult, sglang_capture_layers, speculative_generate
from draftdoctor.reference.llama import TargetModel, load_safetensors_dir


@dataclass
class Measurement:
    """Totals over a set of requests, with SGLang's definitions (field notes §5)."""

    requests: int
    completion_tokens: int
    spec_verify_ct: int
    accepted_per_position: list[int]

    @property
    def accept_length(self) -> float:
        """meta_info formula: completion tokens (prefill token included) per verify step."""
        return self.completion_tokens / self.spec_verify_ct

    @property
    def step_accept_length(self) -> float:
        """Log-line / server_info formula: (accepted drafts + bonus tokens) per verify step."""
        return (sum(self.accepted_per_position) + self.spec_verify_ct) / self.spec_verify_ct

    @property
    def strict_accept_rate(self) -> float:
        return sum(self.accepted_per_position) / (self.spec_verify_ct * len(self.accepted_per_position))

    @classmethod
    def of(cls, results: list[GenerateResult]) -> "Measurement":
        return cls(len(results), sum(r.completion_tokens for r in results),
                   sum(r.spec_verify_ct for r in results),
                   [sum(c) for c in zip(*(r.accepted_per_position for r in results))])


def flat_sglang_config(spec_config: dict, convert_ids: bool = True) -> dict:
    """A speculators Eagle3 config flattened the way SGLang wants it (field notes §2).

    With convert_ids, aux ids become SGLang's (speculators id - 1) under eagle_config.
    """
    flat = dict(spec_config["transformer_layer_config"])
    ids = spec_config.get("eagle_aux_hidden_state_layer_ids")
    flat.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                draft_vocab_size=spec_config["draft_vocab_size"])
    if spec_config.get("target_hidden_size") is not None:
        flat["target_hidden_size"] = spec_config["target_hidden_size"]
    if ids is not None:
        flat["eagle_config"] = {"use_aux_hidden_state": True,
                                "eagle_aux_hidden_state_layer_ids":
                                    [k - 1 for k in ids] if convert_ids else list(ids)}
    return flat


def load_draft(target: TargetModel, config: dict, tensors: dict[str, torch.Tensor]):
    """The draft SGLang 0.4.9-0.5.11 would run: replayed load, then the target's embedding."""
    state, written, hot = replay_sglang_load(config, tensors)
    draft = build_draft(config, state, written, hot)
    # SGLang's EAGLE worker shares the target's embedding with an EAGLE-3 draft (set_embed).
    draft.params["model.embed_tokens.weight"] = target.embed
    return draft, written


def measure(target: TargetModel, draft, capture: tuple[int, ...], prompts: list[list[int]],
            max_new_tokens: int, num_steps: int) -> Measurement:
    return Measurement.of([speculative_generate(target, draft, capture, p, max_new_tokens, num_steps)
                           for p in prompts])


def demo_cases(data_dir: Path, n_prompts: int | None = None, max_new_tokens: int = 48,
               num_steps: int = 4) -> dict[str, tuple[int, Measurement]]:
    """{case: (parameters written of 11, Measurement)} for the three loads described above."""
    from tokenizers import Tokenizer

    target = TargetModel.from_dir(data_dir / "target")
    tok = Tokenizer.from_file(str(data_dir / "target" / "tokenizer.json"))
    lines = (data_dir / "prompts.jsonl").read_text().splitlines()[:n_prompts]
    prompts = [tok.encode(json.loads(line)["prompt"]).ids for line in lines]
    spec = json.loads((data_dir / "draft-speculators" / "config.json").read_text())
    raw = load_safetensors_dir(data_dir / "draft-speculators")
    renamed = {k.replace("layers.0.", "midlayer."): v for k, v in raw.items()}
    out = {}
    for case, tensors, convert in (("as saved (layers.0.*)", raw, True),
                                   ("renamed to midlayer.*", renamed, True),
                                   ("renamed, aux ids unconverted", renamed, False)):
        config = flat_sglang_config(spec, convert_ids=convert)
        draft, written = load_draft(target, config, tensors)
        capture = sglang_capture_layers(config, target.n_layers)
        out[case] = (len(written), measure(target, draft, capture, prompts, max_new_tokens, num_steps))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", nargs="?", type=Path, default=Path("data/demo"))
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--num-steps", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny ops: a second thread only adds overhead
    cases = demo_cases(args.data_dir, max_new_tokens=args.max_new_tokens, num_steps=args.num_steps)
    print(f"reference backend, SGLang 0.4.9-0.5.11 semantics, {args.num_steps} steps, topk 1")
    for case, (written, m) in cases.items():
        per_pos = ", ".join(f"{c / m.spec_verify_ct:.2f}" for c in m.accepted_per_position)
        print(f"{case:30s} written {written:2d}/11  accept len {m.step_accept_length:.2f} "
              f"(meta_info {m.accept_length:.2f})  strict accept rate "
              f"{m.strict_accept_rate:.2f}  per position [{per_pos}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
