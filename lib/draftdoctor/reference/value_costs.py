"""What a draft's values cost: the accept length of the demo draft with one kind of untrained value
put in, next to what `draftdoctor check` says about it. The numbers behind the severity of value
findings without a target (draftdoctor.values, docs/values.md).

Every case starts from draft-speculators fixed for the SGLang release (names and config right, every
parameter written), served on the reference backend; then one edit to its tensors:

- norms at 1.0 (the final norm; all four): what a frozen or never-trained RMSNorm holds;
- the decoder layer's seven projections re-drawn by an initialiser torch ships (truncated normal
  within 2 sd, Xavier/Glorot uniform, N(0, 0.01), orthogonal with gain 0.05), or v_proj alone, or fc;
- non-finite values in fc.weight (one NaN; every 50th value +-inf);
- the vocabulary map as an unfilled one holds it (all offsets 0).

`python -m draftdoctor.reference.value_costs [DATA_DIR]` prints the table; `cases()` builds the
drafts (tests/test_values.py checks `check` on each without serving them).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from draftdoctor.engines import EngineRelease, resolve_engine

NORMS = ("hidden_norm", "input_layernorm", "post_attention_layernorm")
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")


def _redraw(init: Callable[[torch.Tensor], None], suffixes) -> Callable[[dict], None]:
    """An edit that fills every tensor whose name ends with one of `suffixes` as `init` fills a fresh one."""
    def edit(tensors: dict) -> None:
        torch.manual_seed(0)
        for name, t in tensors.items():
            if f".{name}".endswith(tuple(f".{s}" for s in suffixes)):
                fresh = torch.empty(t.shape, dtype=torch.float32)
                init(fresh)
                tensors[name] = fresh.to(t.dtype)
    return edit


def _ones(names) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        for name in list(tensors):
            if f".{name}".endswith(tuple(f".{n}.weight" for n in names)):
                tensors[name] = torch.ones_like(tensors[name])
    return edit


def _one_nan(tensors: dict) -> None:
    fc = tensors["fc.weight"].clone()
    fc.view(-1)[fc.numel() // 3] = float("nan")
    tensors["fc.weight"] = fc


def _every_50th_inf(tensors: dict) -> None:
    fc = tensors["fc.weight"].clone()
    flat = fc.view(-1)
    flat[::50] = torch.where(torch.arange(len(flat[::50])) % 2 == 0, float("inf"), float("-inf"))
    tensors["fc.weight"] = fc


def _identity_map(tensors: dict) -> None:
    tensors["d2t"] = torch.zeros_like(tensors["d2t"])


def _projections(suffixes=PROJECTIONS):
    return tuple(f"{s}.weight" for s in suffixes)


@dataclass(frozen=True)
class Case:
    name: str
    edit: Callable[[dict], None] | None


CASES = (
    Case("trained (fix output)", None),
    Case("final norm at 1.0", _ones(("norm",))),
    Case("all four norms at 1.0", _ones((*NORMS, "norm"))),
    Case("projections: trunc_normal(0, 0.02, +-2 sd)",
         _redraw(lambda t: torch.nn.init.trunc_normal_(t, 0.0, 0.02, -0.04, 0.04), _projections())),
    Case("projections: xavier_uniform", _redraw(torch.nn.init.xavier_uniform_, _projections())),
    Case("projections: N(0, 0.01)", _redraw(lambda t: torch.nn.init.normal_(t, 0.0, 0.01), _projections())),
    Case("projections: orthogonal (gain 0.05)", _redraw(lambda t: torch.nn.init.orthogonal_(t, 0.05), _projections())),
    Case("v_proj alone: N(0, 0.02)", _redraw(lambda t: torch.nn.init.normal_(t, 0.0, 0.02),
                                             _projections(("self_attn.v_proj",)))),
    Case("fc: N(0, 0.02)", _redraw(lambda t: torch.nn.init.normal_(t, 0.0, 0.02), ("fc.weight",))),
    Case("one NaN in fc.weight", _one_nan),
    Case("every 50th value of fc.weight +-inf", _every_50th_inf),
    Case("vocabulary map all zeros (identity)", _identity_map),
)


def build(case: Case, fixed: Path, out: Path) -> Path:
    """`fixed` (a draft folder) with `case`'s edit applied, written to `out`."""
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(fixed / "model.safetensors"))
    if case.edit is not None:
        case.edit(tensors)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(fixed / "config.json", out / "config.json")
    return out


def cases(data_dir, workdir, engine: EngineRelease | None = None) -> dict[str, Path]:
    """{case name: its draft folder under `workdir`}: draft-speculators fixed for `engine` (None: SGLang
    0.5.10), then edited."""
    from draftdoctor.fix import apply_fix, plan_fix

    engine = engine or EngineRelease.of("sglang", "0.5.10")
    data_dir, workdir = Path(data_dir), Path(workdir)
    fixed = apply_fix(plan_fix(data_dir / "draft-speculators", engine), workdir / "fixed", force=True).dst
    return {c.name: build(c, fixed, workdir / f"case-{i:02d}") for i, c in enumerate(CASES)}


def measure(data_dir, workdir, engine: EngineRelease | None = None, n_prompts: int | None = None,
            max_new_tokens: int = 48, num_steps: int = 4) -> list[dict]:
    """Each case: check's worst value finding (severity and code, no target given) and the accept length
    (tokens per verify step, the log line's formula) on the reference backend."""
    from draftdoctor import findings as F
    from draftdoctor.diagnose import check
    from draftdoctor.reference.acceptance import one_thread, run_prompts, tokenized_prompts
    from draftdoctor.eagle.llama import TargetModel
    from draftdoctor.eagle.loading import place

    data_dir, engine = Path(data_dir), engine or EngineRelease.of("sglang", "0.5.10")
    target = TargetModel.from_dir(data_dir / "target", torch.float32)
    prompts = tokenized_prompts(data_dir, n_prompts)
    rows = []
    for name, folder in cases(data_dir, workdir, engine).items():
        report = check(folder, engine)
        value = [f for f in report.findings if f.code in ("weights-at-init", "nan-weights")]
        worst = min(value, key=lambda f: (F.ERROR, F.WARNING, F.INFO).index(f.severity), default=None)
        loaded = place(report, target)  # the draft as check's loader leaves it
        with one_thread():
            m = run_prompts(target, loaded, prompts, max_new_tokens, num_steps)
        rows.append({"case": name, "check": f"{worst.severity} {worst.code}" if worst else "nothing",
                     "exit": 1 if report.errors else 0, "accept_length": round(m.served_accept_length, 3)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", nargs="?", type=Path, default=Path("data/demo"))
    ap.add_argument("--engine", default="sglang==0.5.10")
    ap.add_argument("--num-prompts", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    if not (args.data_dir / "draft-speculators").is_dir() or not (args.data_dir / "target").is_dir():
        ap.error(f"{args.data_dir}: no draft-speculators or target (the demo data; `make demo-data` builds it)")
    with tempfile.TemporaryDirectory() as work:
        rows = measure(args.data_dir, work, resolve_engine(args.engine), args.num_prompts)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{args.engine} on the reference backend, 4 steps, topk 1, 48 new tokens per prompt; check without a target")
    for r in rows:
        print(f"{r['case']:44s} accept len {r['accept_length']:.2f}   check: {r['check']} (exit {r['exit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
