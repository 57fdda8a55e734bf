"""`draftdoctor check`: what an engine release's loader writes, skips or leaves at init, the findings
beyond names, and the one verdict; as text or JSON."""

from __future__ import annotations

from ..diagnose import check
from ..exits import check_status
from ..tables import shape_texts
from .arguments import loader_argument, prediction, prediction_arguments, releases
from .render import safe, table, write_json


def arguments(p) -> None:
    p.add_argument("path")
    p.add_argument("--engine", required=True, help="e.g. sglang==0.5.10, sglang (newest known), vllm")
    p.add_argument("--target", help="the target model's folder (or config.json): check the draft fits it; with its "
                                    "weights, run the loaded draft on it and predict its acceptance")
    p.add_argument("--strict", action="store_true", help="warnings fail too (exit 1), e.g. for a CI gate")
    prediction_arguments(p)
    loader_argument(p, "real: the release's own loader on CPU (`make sglang-loaders`, `make vllm-loaders`, `make "
                       "llamacpp` install them; a warm worker answers in about a second after the first call); "
                       "replay: the engine profile (instant, every release); auto (default): real where that "
                       "release is installed, else replay. The report says which ran")
    p.add_argument("--format", choices=["text", "json"], default="text")


def run(args, out) -> int:
    report = check(args.path, releases(args.engine), loader=args.loader, target=args.target, predict=prediction(args))
    status = check_status(report.findings, strict=args.strict)
    if args.format == "json":
        write_json(report.to_dict(), out)
        return status
    out.write(f"{report.engine} ({report.loader} loader) on {safe(report.path)}\n")
    if report.loader_detail:
        out.write(f"loader: {safe(report.loader_detail)}\n")
    out.write(f"layout: {report.layout.name}; config: {report.config_format}\n\n")
    shapes = shape_texts([p.shape for p in report.params])
    table([(p.name, p.status, shape, ", ".join(p.keys) or "-") for p, shape in zip(report.params, shapes)],
          ["parameter", "status", "shape", "written by"], out)
    out.write("\n")
    table([(k.key, k.status, (k.param + (f" [{k.shard}]" if k.shard else "")) if k.param else k.reason)
           for k in report.keys], ["key", "status", "goes to"], out)
    out.write("\n")
    rows = report.loading_report()  # the same rows notebook 02 shows
    if rows:
        table([tuple(r.values()) for r in rows], list(rows[0]), out)
        out.write("\n")
    for f in report.findings:
        out.write(f.line(safe) + "\n")
    out.write(f"\nverdict: {safe(report.verdict)}\n")
    return status
