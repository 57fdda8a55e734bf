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

    report = check(args.path, args.engine)
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
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(run=cmd_check)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args, sys.stdout)
    except (CheckpointError, EngineSpecError) as e:
        sys.stderr.write(f"draftdoctor: error: {e}\n")
        return EXIT_UNUSABLE
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
