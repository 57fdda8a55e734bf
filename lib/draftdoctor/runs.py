"""An investigation's folder: what each notebook step saves there, for the next steps and the report.

One function per step builds the step's record, writes it (atomically) as the step's JSON file and
returns it; `investigate` and `report` read the records back through `load_step` by the same names.
The bench step (05) writes `results.json` itself (`serving.bench.write_results`). Before any work,
`unwritable_folder` and `unwritable_file` say why an output place cannot be written (a read-only or
full file system, a file or folder in the way), so the command refuses in one line, not later.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

KEYS, NAMES, COVERAGE, FIX, RESULTS = "keys", "names", "coverage", "fix", "results"  # the files' names


def safe_name(name) -> bool:
    """Whether `name` can name a file or folder inside an output folder without leaving it."""
    return isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name) is not None and name not in (".", "..")


def unwritable_folder(folder) -> str | None:
    """Why nothing can be written in `folder` ("cannot write there (...)"), or None: it is made (if
    missing) and written to once, and what the probe made is removed again (a later refusal leaves
    nothing behind)."""
    import os

    folder = Path(folder)
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # what the probe makes, then removes
    probe = folder / f".draftdoctor-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"x")
    except OSError as e:
        return f"cannot write there ({e.strerror or e})"
    finally:
        for path in (probe, *made):
            try:
                path.rmdir() if path.is_dir() else path.unlink()
            except OSError:
                pass
    return None


def among_inputs(folder, inputs) -> str | None:
    """Why `folder` may not take a command's output: it is one of the model folders `inputs` names ((what,
    path) pairs; a file given as a model is no folder of it) or lies inside one, where results, logs and
    notebooks would land among the model's own files, replacing any of the same name; None otherwise."""
    out = Path(folder).resolve()
    for what, path in inputs:
        home = Path(path).resolve()
        if home.is_dir() and (out == home or out.is_relative_to(home)):
            return f"is inside {what} ({path}): its files are not the kit's to add to; choose another folder"
    return None


def unwritable_file(path) -> str | None:
    """Why `path` cannot be appended to ("is a folder; give a file name", "cannot write there (...)"), or
    None; its folder and the (empty) file are made where missing, as the writer would."""
    path = Path(path)
    if path.is_dir():
        return "is a folder; give a file name"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as e:
        return f"cannot write there ({e.strerror or e})"
    return None


def write_atomically(path: Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all (beside it, then renamed: a reader never sees half a
    file, and a full disk leaves no empty one)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def save_step(out_dir, name: str, data: dict) -> Path:
    """Write `data` as `out_dir/name.json` (atomically)."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return write_atomically(folder / f"{name}.json", json.dumps(data, indent=1, default=str))


def load_step(out_dir, name: str) -> dict | None:
    """A step's record, or None when that step has not run."""
    path = Path(out_dir) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def record_keys(out_dir, checkpoint, layout, modules) -> dict:
    """Step 01: what the checkpoint holds (`modules`: the per-module DataFrame the notebook shows)."""
    record = {"checkpoint": str(checkpoint.path), "tensors": len(checkpoint.tensors), "bytes": checkpoint.total_bytes,
              "layout": layout.name, "evidence": list(layout.evidence),
              "modules": modules.reset_index().to_dict("records")}
    save_step(out_dir, KEYS, record)
    return record


def record_names(out_dir, report) -> dict:
    """Step 02: the loading report (MISSING / UNEXPECTED / MISMATCH rows) of a coverage report."""
    record = {"engine": report.engine.spec, "rows": report.loading_report()}
    save_step(out_dir, NAMES, record)
    return record


def record_coverage(out_dir, report, replayed=None) -> dict:
    """Step 03: the whole coverage report, findings and verdict; with `replayed` (the replay's report of the
    same draft, when `report` is the release's own loader's), what the replay said and on how many
    parameters the two agree."""
    record = report.to_dict()
    if replayed is not None:
        mine = {p.name: p.status for p in replayed.params}
        record["replay"] = {"verdict": replayed.verdict, "params_agreeing": sum(mine.get(p.name) == p.status
                                                                                for p in report.params)}
    save_step(out_dir, COVERAGE, record)
    return record


def record_fix(out_dir, result) -> dict:
    """Step 04: what `apply_fix` wrote and verified, with the coverage of the written checkpoint."""
    after = result.verification.coverage
    record = result.to_dict() | {"coverage_after": after.to_dict() if after else None}
    save_step(out_dir, FIX, record)
    return record


def record_fix_refused(out_dir, refusal) -> dict:
    """Step 04 when `fix` refused (a `fix.FixBlocked`): nothing was written, so step 05 measures the draft
    as it is and nothing "after"; the report says why."""
    record = {"src": str(refusal.plan.src), "dst": None, "engine": refusal.plan.engine.spec, "ok": False,
              "written": False, "refused": str(refusal),
              "refused_codes": [f.code for f in refusal.findings], "coverage_after": None}
    save_step(out_dir, FIX, record)
    return record


def fixed_checkpoint(out_dir) -> str | None:
    """Where step 04 wrote the fixed draft (None: it has not run, or `fix` refused)."""
    record = load_step(out_dir, FIX)
    return record["dst"] if record else None
