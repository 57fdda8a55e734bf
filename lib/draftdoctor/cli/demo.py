"""`draftdoctor demo`: the bundled demo's investigation (what `make demo` runs), from any folder: its data
is package data."""

from __future__ import annotations

from ..investigate import demo_run
from ..toolstate import DEMO
from . import investigate


def arguments(p) -> None:
    p.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo)")
    p.add_argument("--cell-timeout", type=float, default=900.0)


def run(args, out) -> int:
    out.write(f"demo data (read only): {DEMO}\n")
    demo = demo_run()
    if demo.note:
        out.write(f"note: {demo.note}\n")
    args.params = str(demo.params)
    return investigate.run(args, out, override=demo.override)
