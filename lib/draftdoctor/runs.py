"""An investigation's folder: each notebook step writes one JSON there for the next steps.

`investigate` chains the five notebooks through these files, and builds report.md/report.json from
them.
"""

from __future__ import annotations

import json
from pathlib import Path


def save_step(out_dir, name: str, data: dict) -> Path:
    """Write `data` as `out_dir/name.json` (atomically: a reader never sees half a file)."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)
    return path


def load_step(out_dir, name: str) -> dict:
    path = Path(out_dir) / f"{name}.json"
    return json.loads(path.read_text())
