"""Beyond names: what `draftdoctor check` flags on the demo drafts, and what each case costs.

Every case is served by an SGLang release on the reference backend after `draftdoctor fix`, so
the names are right and the loader writes every parameter; what differs is the config or the
training option:

- fixed draft: draft-speculators as `fix` writes it (aux ids converted into `eagle_config`,
  trained with `norm_before_residual: false`). The baseline.
- aux ids at top level: the same with the ids left at the top level, as a hand-flattened config
  that kept speculators' field has them. SGLang reads only `eagle_config`, so it captures its
  default layers [2, N//2, N-3] instead; on the demo's 6-layer target that is [2, 3, 3], two
  distinct layers for an fc trained on three, and `check` flags `aux-layer-uncapturable`.
- aux ids unconverted: the ids in `eagle_config` but in speculators' convention (not minus one),
  so SGLang captures one layer above each trained one. `check` cannot see this: a flat config
  does not say which convention its ids follow.
- nbr draft: draft-speculators-nbr (same data, seed and steps, `norm_before_residual: true`)
  fixed with `allow_lossy`; SGLang computes the residual from the raw hidden state, not the
  normalised one it was trained with. `check` flags `norm-before-residual`.
- nbr draft as trained: a control, the same weights computed with norm_before_residual (vLLM can;
  no SGLang release does), to show the draft itself is as good as the baseline.

`trained_on_layer_zero` shows the case no rewrite can fix: a draft trained on the input of layer 0,
which SGLang cannot capture (fix refuses it for SGLang, writes it for vLLM).

`python -m draftdoctor.reference.beyond_names [DATA_DIR]` prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from draftdoctor import auxids
from draftdoctor import findings as F

if TYPE_CHECKING:
    from draftdoctor.reference.acceptance import Measurement
    from draftdoctor.engines import EngineRelease


def _ids_at_top_level(config: dict) -> None:
    """Move the ids out of eagle_config, back in speculators' convention (id k = input of layer k)."""
    ids = config["eagle_config"].pop(auxids.KEY)
    config[auxids.KEY] = auxids.convert(ids, auxids.EAGLE_CONFIG, auxids.TOP_LEVEL)


def _ids_unconverted(config: dict) -> None:
    """Leave the ids in eagle_config but undo fix's minus one."""
    eagle = config["eagle_config"]
    eagle[auxids.KEY] = auxids.convert(eagle[auxids.KEY], auxids.EAGLE_CONFIG, auxids.TOP_LEVEL)


@dataclass(frozen=True)
class Case:
    name: str
    source: str  # folder under the demo data
    about: str
    edit: Callable[[dict], None] | None = None  # applied to the fixed draft's config.json
    allow_lossy: bool = False  # fix it although the engine cannot express one of its options
    as_trained: bool = False  # compute norm_before_residual as trained (control; no SGLang release can)


CASES = (
    Case("fixed draft", "draft-speculators", "draftdoctor fix output; trained with norm_before_residual false"),
    Case("aux ids at top level", "draft-speculators", "ids moved out of eagle_config, where SGLang does not read them",
         edit=_ids_at_top_level),
    Case("aux ids unconverted", "draft-speculators", "ids in eagle_config but not minus one (speculators' convention)",
         edit=_ids_unconverted),
    Case("nbr draft", "draft-speculators-nbr", "trained with norm_before_residual true, fixed with allow_lossy",
         allow_lossy=True),
    Case("nbr draft as trained", "draft-speculators-nbr", "control: computed with norm_before_residual, as trained "
         "(vLLM can, no SGLang release does)", allow_lossy=True, as_trained=True),
)


@dataclass
class CaseResult:
    """One case: what `check` says about the served draft, and the acceptance it gets."""

    case: Case
    draft: Path  # the checkpoint served
    findings: list = field(default_factory=list)  # check's error and warning findings
    aux_ids: tuple = (None, None)  # the config's aux layer ids and where they are (configs.aux_layer_ids)
    capture: tuple[int, ...] = ()  # target layers whose input the engine captures
    measurement: Measurement | None = None  # None when the draft cannot run
    error: str | None = None  # why the engine cannot run the draft

    @property
    def codes(self) -> list[str]:
        return sorted({f.code for f in self.findings})

    def summary(self) -> dict:
        """Plain values for tables and charts (accept_length: as `bench` reports it, `Measurement.served_accept_length`)."""
        m = self.measurement
        return {
            "name": self.case.name,
            "flagged": ", ".join(self.codes) or "nothing",
            "aux ids in config": f"{self.aux_ids[0]} ({self.aux_ids[1]})",
            "captured layers": list(self.capture),
            "accept_length": round(m.served_accept_length, 3) if m else None,
            "accept_rate": round(m.strict_accept_rate, 3) if m else None,
            "per_position": [round(c / m.spec_verify_ct, 3) for c in m.counted] if m else None,
            "error": self.error,
            "about": self.case.about,
        }


def prepare(case: Case, data_dir: Path, workdir: Path, engine: EngineRelease) -> Path:
    """The checkpoint `case` serves: its source fixed for `engine`, then its config edited."""
    from draftdoctor.fix import apply_fix, plan_fix

    out = workdir / case.name.replace(" ", "-")
    dst = apply_fix(plan_fix(data_dir / case.source, engine), out, force=True, allow_lossy=case.allow_lossy).dst
    if case.edit is not None:
        config_path = dst / "config.json"
        config = json.loads(config_path.read_text())
        case.edit(config)
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    return dst


def trained_on_layer_zero(data_dir, workdir, engines) -> dict:
    """`fix`'s plan, per engine, for the demo draft as if it had been trained on the inputs of target
    layers 0, 1, 2 (speculators' top-level ids [0, 1, 2]; a copy under `workdir`). SGLang captures the
    input of layer id + 1 at the start of layers 1..N-1, so no id it reads names layer 0's input: the
    plan is refused (`plan.refusal()`) for SGLang and not for vLLM, which captures the embedding too."""
    import shutil

    from draftdoctor.fix import plan_fix

    data_dir = Path(data_dir)
    src = Path(workdir) / "trained-on-layer-0"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(data_dir / "draft-speculators", src)
    config = json.loads((src / "config.json").read_text())
    config[auxids.KEY] = [0, 1, 2]
    (src / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {engine: plan_fix(src, engine, target=data_dir / "target") for engine in engines}


def measure_cases(data_dir, workdir, release: str = "0.5.10", n_prompts: int | None = None,
                  max_new_tokens: int = 48, num_steps: int = 4, dtype=None) -> list[CaseResult]:
    """Every case of CASES under sglang==`release` on the reference backend; drafts go to `workdir`.
    Computed in `dtype` (default float32, what the reference backend serves in)."""
    import torch

    from draftdoctor.diagnose import check
    from draftdoctor.reference.acceptance import one_thread, run_prompts, tokenized_prompts
    from draftdoctor.eagle.engine import CaptureMismatch
    from draftdoctor.eagle.llama import TargetModel
    from draftdoctor.eagle.loading import place

    from draftdoctor.engines import EngineRelease

    data_dir, workdir, engine = Path(data_dir), Path(workdir), EngineRelease.of("sglang", release)
    workdir.mkdir(parents=True, exist_ok=True)
    target = TargetModel.from_dir(data_dir / "target", dtype or torch.float32)
    prompts = tokenized_prompts(data_dir, n_prompts)
    results = []
    for case in CASES:
        draft_dir = prepare(case, data_dir, workdir, engine)
        report = check(draft_dir, engine, target=data_dir / "target")
        result = CaseResult(case, draft_dir, [f for f in report.findings if f.severity in (F.ERROR, F.WARNING)],
                            auxids.find(json.loads((draft_dir / "config.json").read_text())))
        loaded = place(report, target)
        result.capture = loaded.capture
        draft = loaded.draft.with_norm_before_residual() if case.as_trained else loaded.draft
        try:
            with one_thread():
                result.measurement = run_prompts(target, loaded, prompts, max_new_tokens, num_steps, draft=draft)
        except CaptureMismatch as e:
            result.error = str(e)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", nargs="?", type=Path, default=Path("data/demo"))
    ap.add_argument("--release", default="0.5.10", help="the SGLang release to emulate")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--num-steps", type=int, default=4)
    args = ap.parse_args(argv)
    missing = [n for n in ("target", "prompts.jsonl", *dict.fromkeys(c.source for c in CASES))
               if not (args.data_dir / n).exists()]
    if missing:
        ap.error(f"{args.data_dir}: no {', '.join(missing)} (the demo data; `make demo-data` builds it)")
    with tempfile.TemporaryDirectory() as work:
        results = measure_cases(args.data_dir, work, args.release, max_new_tokens=args.max_new_tokens,
                                num_steps=args.num_steps)
    print(f"sglang=={args.release} on the reference backend, {args.num_steps} steps, topk 1, "
          f"{args.max_new_tokens} new tokens per prompt")
    for r in results:
        s = r.summary()
        outcome = (f"accept len {s['accept_length']:.2f}  strict accept rate {s['accept_rate']:.2f}  per position "
                   f"{s['per_position']}" if r.measurement else f"cannot run: {r.error}")
        print(f"{s['name']:22s} flagged: {s['flagged']:22s} captures {s['captured layers']}  {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
