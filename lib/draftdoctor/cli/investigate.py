"""`draftdoctor investigate`: the five notebooks run with papermill over a parameters file, each run's
verdict and outcome said in a few lines; exit 1 while a run's problem is unresolved."""

from __future__ import annotations

import sys

from ..exits import status
from ..investigate import investigate
from ..report import outcome, unresolved
from .arguments import writable_folder
from .render import safe


def arguments(p) -> None:
    p.add_argument("--params", required=True, help="YAML: checkpoint (or checkpoints: [...]), engine_name, release, ...")
    p.add_argument("--out", required=True, help="run folder, e.g. runs/NAME")
    p.add_argument("--cell-timeout", type=float, default=900.0)


def run(args, out, override: dict | None = None) -> int:
    writable_folder(args.out, "--out")
    results = investigate(args.params, args.out, cell_timeout=args.cell_timeout,
                          progress=lambda m: sys.stderr.write(f"[investigate] {m}\n"), override=override)
    for r in results:
        if r.error:
            out.write(f"{r.name}: FAILED: {safe(r.error)}\n")
            continue
        rep = r.report
        measured = rep.get("before") or rep.get("after") or {}
        out.write(f"{r.name}: {safe((rep.get('coverage_before') or {}).get('verdict'))}\n")
        for line in outcome(rep):
            out.write(f"  {safe(line)}\n")
        if measured:
            out.write(f"  measured on {safe(measured.get('backend_label') or measured.get('backend'))}; report: {r.out_dir}/report.md\n")
    return status(any(unresolved(r.report or {}, r.error) for r in results))
