"""The `draftdoctor` command line: the only module (besides notebooks) that prints.

Exit status: 0 no error findings, 1 error findings, 2 unusable input or arguments.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys

from .checkpoint import CheckpointError, open_checkpoint
from .engines import EngineSpecError
from .fix import FixError

EXIT_OK, EXIT_FINDINGS, EXIT_UNUSABLE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 as well; keep the message to one line
        self.exit(EXIT_UNUSABLE, f"draftdoctor: error: {message}\n")


def _table(rows: list[dict], columns: list[str], out) -> None:
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")


def cmd_inspect(args, out) -> int:
    from .layouts import detect_layout
    from .tables import human_bytes, module_totals, tensor_rows

    ckpt = open_checkpoint(args.path)
    rows = tensor_rows(ckpt)
    layout = detect_layout(ckpt.tensors, ckpt.config)
    if args.format == "json":
        json.dump({"path": str(ckpt.path), "files": [str(s.path) for s in ckpt.shards],
                   "layout": {"name": layout.name, "evidence": list(layout.evidence)},
                   "tensors": rows, "total_bytes": ckpt.total_bytes}, out, indent=1)
        out.write("\n")
        return EXIT_OK
    if args.format == "csv":
        writer = csv.DictWriter(out, fieldnames=["module", "name", "dtype", "shape", "bytes", "file"], lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow(r | {"shape": "x".join(map(str, r["shape"]))})
        return EXIT_OK
    totals = {t["module"]: t for t in module_totals(rows)}
    current = None
    table = []
    for r in rows:
        if r["module"] != current:
            current = r["module"]
            t = totals[current]
            table.append({"name": f"[{current}]", "dtype": "", "shape": f"{t['tensors']} tensors",
                          "bytes": human_bytes(t["bytes"]), "file": ""})
        table.append({**r, "name": "  " + r["name"], "shape": "x".join(map(str, r["shape"])) or "scalar",
                      "bytes": human_bytes(r["bytes"])})
    _table(table, ["name", "dtype", "shape", "bytes", "file"], out)
    out.write(f"\n{len(rows)} tensors, {human_bytes(ckpt.total_bytes)} in {len(ckpt.shards)} file(s)\n")
    out.write(f"layout: {layout.name}\n" + "".join(f"  - {e}\n" for e in layout.evidence))
    return EXIT_OK


def cmd_check(args, out) -> int:
    from .coverage import check

    report = check(args.path, args.engine, target=args.target)
    status = EXIT_FINDINGS if report.errors else EXIT_OK
    if args.format == "json":
        json.dump(report.to_dict(), out, indent=1)
        out.write("\n")
        return status
    out.write(f"{report.engine} ({report.loader} loader) on {report.path}\n")
    out.write(f"layout: {report.layout.name}; config: {report.config_format}\n\n")
    _table([{"parameter": p.name, "status": p.status, "shape": "x".join(map(str, p.shape)),
             "written by": ", ".join(p.keys) or "-"} for p in report.params],
           ["parameter", "status", "shape", "written by"], out)
    out.write("\n")
    _table([{"key": k.key, "status": k.status,
             "goes to": (k.param + (f" [{k.shard}]" if k.shard else "")) if k.param else k.reason}
            for k in report.keys], ["key", "status", "goes to"], out)
    out.write("\n")
    for f in report.findings:
        out.write(f"{f.severity.upper():7} {f.code}: {f.message}\n")
    out.write(f"\nverdict: {report.verdict}\n")
    return status


def cmd_fix(args, out) -> int:
    from .fix import apply_fix, plan_fix
    from .tables import human_bytes

    plan = plan_fix(args.path, args.engine)
    if args.plan:
        if args.format == "json":
            json.dump(plan.to_dict(), out, indent=1)
            out.write("\n")
        else:
            _print_plan(plan, out)
        return EXIT_OK if plan.can_apply(args.allow_lossy) else EXIT_FINDINGS
    if args.out is None:
        raise _UsageError("fix needs --out DST (or --plan to only show the plan)")
    bar = None
    if plan.bytes_to_copy >= PROGRESS_MIN_BYTES:
        from tqdm import tqdm

        bar = tqdm(total=plan.bytes_to_copy, unit="B", unit_scale=True, desc="copying", file=sys.stderr,
                   disable=None, leave=False)
    try:
        result = apply_fix(plan, args.out, force=args.force, allow_lossy=args.allow_lossy,
                           progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    status = EXIT_OK if result.ok else EXIT_FINDINGS
    if args.format == "json":
        json.dump(result.to_dict(), out, indent=1)
        out.write("\n")
        return status
    v = result.verification
    if result.ok:
        out.write(f"wrote {result.dst} for {plan.engine}: {result.tensors_renamed} tensors renamed, "
                  f"{result.tensors_copied} copied ({human_bytes(result.bytes_copied)}, {result.copy_method}), "
                  f"{len(plan.config.changes)} config changes, {result.files_copied} other files, "
                  f"{result.seconds:.2f} s\n")
        out.write(f"verified: headers re-read, {v.tensors_checked} tensors' bytes compared equal to the source, "
                  f"{plan.engine} coverage: {v.coverage.verdict}\n")
        for f in plan.findings:
            if f.severity != "info":
                out.write(f"{f.severity.upper():7} {f.code}: {f.message}\n")
        return status
    out.write(f"verification failed; nothing written to {result.dst}:\n")
    for problem in v.problems:
        out.write(f"  {problem}\n")
    return status


PROGRESS_MIN_BYTES = 256 << 20


def _print_plan(plan, out) -> None:
    out.write(f"fix plan: {plan.src} for {plan.engine}\n")
    out.write(f"layout: {plan.layout.name}; rule: {plan.rule}\n\n")
    _table([{"tensor": t.old, "becomes": t.new if t.new is not None else "(left out)", "why": t.reason}
            for t in plan.tensors], ["tensor", "becomes", "why"], out)
    out.write(f"\nconfig.json ({plan.config.format}):\n")
    for c in plan.config.changes:
        moved = f" (now {c.moved_to})" if c.moved_to else ""
        out.write(f"  {c.field}: {_short(c.before)} -> {_short(c.after)}{moved}: {c.reason}\n")
    if not plan.config.changes:
        out.write("  unchanged\n")
    for f in plan.files:
        out.write(f"file {f.name}: {f.reason}\n")
    out.write(f"\n{len(plan.renamed)} renamed, {len(plan.tensors) - len(plan.renamed) - len(plan.omitted)} kept, "
              f"{len(plan.omitted)} left out; {plan.bytes_to_copy:,} bytes to copy\n")
    for f in plan.findings:
        out.write(f"{f.severity.upper():7} {f.code}: {f.message}\n")
    out.write(f"predicted: {plan.predicted.verdict}\n")


def _short(value, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[:width - 3] + "..."


class _UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="draftdoctor", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("inspect", help="list a checkpoint's tensors from its headers alone")
    p.add_argument("path", help=".safetensors file, folder, or sharded folder with model.safetensors.index.json")
    p.add_argument("--format", choices=["text", "json", "csv"], default="text")
    p.set_defaults(run=cmd_inspect)
    p = sub.add_parser("check", help="what an engine's loader would write, skip, or leave at init")
    p.add_argument("path")
    p.add_argument("--engine", required=True, help="e.g. sglang==0.5.10, sglang (newest known), vllm")
    p.add_argument("--target", help="the target model's folder (or config.json): check the draft fits it")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(run=cmd_check)
    p = sub.add_parser("fix", help="rewrite a draft so an engine loads every tensor, verified; SRC is never modified")
    p.add_argument("path", metavar="SRC")
    p.add_argument("--engine", required=True, help="e.g. sglang==0.5.10, sglang (newest known), vllm")
    p.add_argument("--out", metavar="DST", help="new checkpoint folder (must not exist unless --force)")
    p.add_argument("--plan", action="store_true", help="show what would change; write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing DST, once the new one is verified")
    p.add_argument("--allow-lossy", action="store_true",
                   help="write even if the engine cannot express a config option (reported)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(run=cmd_fix)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args, sys.stdout)
    except (CheckpointError, EngineSpecError, FixError, _UsageError) as e:
        sys.stderr.write(f"draftdoctor: error: {e}\n")
        return EXIT_UNUSABLE
    except KeyboardInterrupt:
        sys.stderr.write("draftdoctor: interrupted; nothing written\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
