"""Tables of checkpoints and coverage reports: DataFrames for notebooks, rows for the CLI.

Tables are plain lists (columns) so the CLI can print them without importing pandas; `*_frame`
functions wrap the same data in DataFrames for notebooks (`frames.frame`: shown as text).
"""

from __future__ import annotations

import json
import re
from itertools import chain, compress, groupby, repeat
from operator import itemgetter, ne

from .beginnings import per_beginning
from .checkpoint import Checkpoint, gc_paused
from .frames import frame

# The module a tensor belongs to: its first part, or `model.` and its second part, plus a layer
# number when one follows: 'layers.0.mlp.up_proj.weight' -> 'layers.0', 'model.layers.3.x' ->
# 'model.layers.3', 'fc.weight' -> 'fc', 'model.norm.weight' -> 'model.norm', 'd2t' -> 'd2t'.
MODULE_PREFIX = re.compile(r"(?:model\.[^.]+(?=\.)|[^.]*)(?:\.\d+(?=\.))?")


def tensor_columns(checkpoint: Checkpoint) -> dict[str, list]:
    """The tensor table as columns (module, name, dtype, shape, bytes, file), one entry per tensor,
    grouped by module prefix: modules in order of first appearance, tensors in stored order within.

    Columns, built with zip, map and sort running the loops in C: a Kimi-class checkpoint has 10^5
    tensors, and each Python-level pass over them costs tens of milliseconds.
    """
    with gc_paused():
        return _tensor_columns(checkpoint)


def _tensor_columns(checkpoint: Checkpoint) -> dict[str, list]:
    tables = [shard.table() for shard in checkpoint.shards]
    names, dtypes, shapes, sizes = (list(chain.from_iterable(t[i] for t in tables)) for i in range(4))
    files = list(chain.from_iterable(repeat(shard.path.name, len(t[0])) for shard, t in zip(checkpoint.shards, tables)))
    modules = per_beginning(names, _module)  # once per distinct beginning: 10^5 names, a few hundred modules
    return grouped({"module": modules, "name": names, "dtype": dtypes, "shape": shapes, "bytes": sizes, "file": files})


def grouped(columns: dict[str, list]) -> dict[str, list]:
    """The rows of `columns` grouped by their "module": modules in order of first appearance, rows in their
    order within (a stable sort by each module's first appearance). Sorted as runs, not rows: a run of rows
    of one module stays together, so the columns are gathered a slice per run (a checkpoint sharded round
    robin holds each module in one run per shard: thousands of runs, not 10^5 rows)."""
    modules = columns["module"]
    rank = {module: i for i, module in enumerate(dict.fromkeys(modules))}
    if len(rank) < 2:
        return columns
    cuts = list(compress(range(1, len(modules)), map(ne, modules[1:], modules[:-1])))  # where each run begins
    if len(cuts) + 1 == len(rank):  # each module's rows stored together already
        return columns
    starts, ends = [0, *cuts], [*cuts, len(modules)]
    ranks = list(map(rank.__getitem__, map(modules.__getitem__, starts)))
    order = sorted(range(len(starts)), key=ranks.__getitem__)
    runs = list(map(slice, map(starts.__getitem__, order), map(ends.__getitem__, order)))
    return {key: list(chain.from_iterable(map(values.__getitem__, runs))) for key, values in columns.items()}


def _module(name: str) -> str:
    """A name's module (reads no further than its third dot)."""
    return MODULE_PREFIX.match(name)[0]


def shape_texts(shapes: list[tuple[int, ...]]) -> list[str]:
    """'2048x7168' for each shape, '' for a scalar. 10^5 shapes are written as one JSON list (in C), whose
    separators become the x's and the breaks between shapes; shapes that are not all integers, each
    distinct one once."""
    if not shapes:
        return []
    try:
        text = _dumps(shapes)
    except (TypeError, ValueError):  # not JSON values (numpy's integers)
        text = b""
    if text.translate(None, b"0123456789,") == b"[" + b"[]" * len(shapes) + b"]":  # lists of non-negative ints
        return text[2:-2].decode().replace(",", "x").split("]x[")
    texts = {shape: "x".join(map(str, shape)) for shape in dict.fromkeys(shapes)}
    return list(map(texts.__getitem__, shapes))


def _dumps(value) -> bytes:
    try:
        import orjson
    except ImportError:  # a real-loader child sees its release's packages only
        return json.dumps(value, separators=(",", ":")).encode()
    return orjson.dumps(value)


def tensor_frame(checkpoint: Checkpoint):
    """The tensor table as a DataFrame."""
    return frame(tensor_columns(checkpoint))


def module_totals(columns: dict[str, list]) -> list[tuple[str, int, int]]:
    """Per module prefix of the tensor table: (module, tensors, bytes), in table order."""
    totals = []
    for module, group in groupby(zip(columns["module"], columns["bytes"]), key=itemgetter(0)):
        sizes = list(map(itemgetter(1), group))
        totals.append((module, len(sizes), sum(sizes)))
    return totals


def human_bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def loading_report(report):
    """`report.loading_report()` as a DataFrame (MISSING / UNEXPECTED / MISMATCH rows)."""
    from .coverage import LOADING_REPORT_COLUMNS

    return frame(report.loading_report(), columns=list(LOADING_REPORT_COLUMNS))


def loaders_side_by_side(replayed, real):
    """Each parameter's status as the replay predicted it and as the release's own loader left it (two
    coverage reports of one draft), and whether they agree: what the kit's rules said, beside what the
    engine's code did."""
    mine = {p.name: p.status for p in replayed.params}
    return frame([{"parameter": p.name, "replay": mine.get(p.name, "-"), "real": p.status,
                   "agree": mine.get(p.name) == p.status} for p in real.params])
