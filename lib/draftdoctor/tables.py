"""Tables of checkpoints and coverage reports: DataFrames for notebooks, rows for the CLI.

Rows are plain dicts so the CLI can print them without importing pandas; `*_frame` functions wrap
the same rows in DataFrames for notebooks.
"""

from __future__ import annotations

from operator import itemgetter

from .checkpoint import Checkpoint, gc_paused


def module_prefix(name: str) -> str:
    """The module a tensor belongs to: 'layers.0.mlp.up_proj.weight' -> 'layers.0', 'fc.weight' -> 'fc'."""
    parts = name.split(".", 3)  # the prefix is at most three parts: model.layers.N
    take = 2 if parts[0] == "model" and len(parts) > 2 else 1
    if len(parts) > take + 1 and parts[take].isdigit():
        take += 1
    return ".".join(parts[:take]) if len(parts) > take else parts[0]


def tensor_rows(checkpoint: Checkpoint) -> list[dict]:
    """One row per tensor (module, name, dtype, shape, bytes, file), grouped by module prefix."""
    with gc_paused():
        return _tensor_rows(checkpoint)


def _tensor_rows(checkpoint: Checkpoint) -> list[dict]:
    groups: dict[str, list[dict]] = {}  # module -> rows, modules in order of first appearance
    for shard in checkpoint.shards:
        file = shard.path.name
        for t in shard.tensors:
            module = module_prefix(t.name)
            row = {"module": module, "name": t.name, "dtype": t.dtype, "shape": list(t.shape),
                   "bytes": t.end - t.begin, "file": file}
            group = groups.get(module)
            if group is None:
                groups[module] = [row]
            else:
                group.append(row)
    by_name = itemgetter("name")
    return [row for group in groups.values() for row in sorted(group, key=by_name)]


def tensor_frame(checkpoint: Checkpoint):
    """The tensor table as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(tensor_rows(checkpoint), columns=["module", "name", "dtype", "shape", "bytes", "file"])


def module_totals(rows: list[dict]) -> list[dict]:
    """Per module prefix: tensor count and bytes, in table order."""
    totals: dict[str, dict] = {}
    for r in rows:
        t = totals.setdefault(r["module"], {"module": r["module"], "tensors": 0, "bytes": 0})
        t["tensors"] += 1
        t["bytes"] += r["bytes"]
    return list(totals.values())


def human_bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def loading_report(report):
    """The transformers-style table of a coverage report: MISSING / UNEXPECTED / MISMATCH rows.

    MISSING: an engine parameter no key writes (or only partly); UNEXPECTED: a checkpoint key the
    loader discards; MISMATCH: a key whose shape does not fit its parameter.
    """
    import pandas as pd

    rows = []
    for p in report.params:
        if p.status in ("uninitialized", "partial"):
            detail = "never written" if p.status == "uninitialized" else f"shards {', '.join(p.shards_missing)} missing"
            rows.append({"status": "MISSING", "checkpoint key": "", "engine parameter": p.name, "detail": detail})
    for k in report.keys:
        if k.status == "dropped":
            rows.append({"status": "UNEXPECTED", "checkpoint key": k.key, "engine parameter": "", "detail": k.reason})
        elif k.status == "shape-mismatch":
            rows.append({"status": "MISMATCH", "checkpoint key": k.key, "engine parameter": k.param, "detail": k.reason})
    return pd.DataFrame(rows, columns=["status", "checkpoint key", "engine parameter", "detail"])
