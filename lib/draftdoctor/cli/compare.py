"""`draftdoctor compare`: two checkpoints' tensors paired and how each pair differs, and their configs by
what each engine release does with them; exit 1 if they differ."""

from __future__ import annotations

from ..compare import SAME_BYTES, compare
from ..exits import status as exit_status
from ..meanings import DIFFERENT, READS_ONE, SAME
from .render import safe, table, write_json
from .arguments import releases


def arguments(p) -> None:
    p.add_argument("a", metavar="A", help="a checkpoint (e.g. the training output)")
    p.add_argument("b", metavar="B", help="another (e.g. the converted, fixed or served copy, or the target)")
    p.add_argument("--engine", action="append", metavar="SPEC",
                   help="compare the configs by what this release does with each (repeat for more; e.g. "
                        "sglang==0.5.10). Default: every release whose engine reads both configs")
    p.add_argument("--target", help="the target model's folder (or config.json): its layer count settles which "
                                    "layers an engine's default aux ids capture")
    p.add_argument("--all", action="store_true", help="list the pairs holding the same bytes too")
    p.add_argument("--format", choices=["text", "json"], default="text")


def run(args, out) -> int:
    result = compare(args.a, args.b, releases(args.engine), args.target)
    if args.format == "json":
        write_json(result.to_dict(), out)
        return exit_status(not result.same)
    shown = [p for p in result.pairs if args.all or p.status != SAME_BYTES or p.collision]
    if shown:
        table([(p.status.upper(), p.a or "-", p.b or "-", p.paired_by or "-",
                f"{p.dtype_a or '-'}/{p.dtype_b or '-'}",
                "-" if p.max_abs_diff is None else f"{p.max_abs_diff:.3g}", "-" if p.rel_l2 is None else f"{p.rel_l2:.3g}",
                p.relation.upper() or "-", "; ".join(filter(None, (p.detail, p.collision))) or "-") for p in shown],
              ["status", "A", "B", "paired by", "dtypes", "max abs diff", "rel L2", "relation", "detail"], out)
        out.write("\n")
    counts = ", ".join(f"{n} {status}" for status, n in result.counts().items() if n)
    out.write(f"A = {safe(args.a)}, B = {safe(args.b)}: {counts or 'no tensors'}"
              + ("" if args.all or not result.counts()[SAME_BYTES] else " (same-bytes pairs not listed; --all lists them)")
              + "\n")
    _configs_text(result.configs, out)
    out.write("verdict: " + _verdict(result) + "\n")
    return exit_status(not result.same)


def _configs_text(configs, out) -> None:
    """The configs by meaning: one line per release range (or as written), what differs, what was not compared."""
    target = (f"a {configs.target_layers}-layer target" if configs.target_layers
              else "the target's layer count unknown: --target gives it")
    out.write(f"configs by meaning (aux layers: the target layers whose input is captured; {target})"
              + (f": {safe(configs.note)}" if configs.note else "") + "\n")
    for row in configs.rows:
        if row.counted:
            label = DIFFERENT if row.outcome == READS_ONE else row.outcome  # one side does not load there
            what = f"same: {row.summary}" if row.outcome == SAME else f"{label.upper()}: " + "; ".join(row.differences)
        else:
            what = "not compared: " + "; ".join(row.differences)
        out.write(f"  {safe(row.releases)}: {safe(what)}\n")


def _verdict(result) -> str:
    if result.same:
        return ("A and B hold the same tensors (bytes, dtypes, shapes)"
                + ("" if result.configs.same is None else ", and their configs mean the same"))
    why = []
    if not result.same_tensors:
        why.append(", ".join(f"{n} {status}" for status, n in result.counts().items() if n and status != "same bytes"))
    if result.configs.same is False:
        differing = result.configs.differing
        why.append("config meaning" + (f" ({', '.join(differing)})" if differing else f": {result.configs.note}"))
        if differing and result.configs.unsettled_only:
            why[-1] += ", unless the target has the layer count named above: --target settles it"
    return safe("A and B differ: " + "; ".join(why))
