"""An investigation's report: report.json (numbers) and report.md (for people), from the run folder.

Reads the steps' records (`runs`: keys, coverage, fix, results); a step that did not run leaves its
part of the report empty and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import html
import re

from . import runs
from .explain import same_draft

# what lets text inside a line become markup: code spans, emphasis (* and _), links and images (no `[`, no
# link or image can open), table cells, strike-through, a heading's #
_MARKDOWN = re.compile(r"([\\`*_\[\]|~#])")
# what starts a block when a line starts with it (a list item, a setext underline, an ordered item)
_BLOCK_START = re.compile(r"^(\d+(?=[.)])|(?=[-+=]))")


def md(value) -> str:
    """`value` as literal text in Markdown: what a checkpoint, a config or an engine's message put in a
    report (a tensor name, a verdict quoting it, a log line) renders as itself. Control characters are
    escaped (a newline cannot start a section: a name is one line of text wherever it lands), HTML cannot
    open a tag, comment or entity, Markdown punctuation cannot make a link, an image, emphasis, a heading
    or a table cell, and text placed at a line's start cannot begin a list item or underline a heading."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return _BLOCK_START.sub(r"\1\\", _MARKDOWN.sub(r"\\\1", html.escape(text, quote=False)))


def _coverage_numbers(doc: dict | None) -> dict | None:
    if not doc:
        return None
    cov = doc["coverage"]
    return {k: cov[k] for k in ("params_total", "params_uninitialized", "bytes_total", "bytes_uninitialized",
                                "keys_total", "keys_dropped")} | {
        "verdict": doc["verdict"], "engine": doc["engine"], "loader": doc["loader"], "replay": doc.get("replay"),
        "findings": [f["code"] for f in doc["findings"] if f["severity"] == "error"]}


def _bench_run(bench: dict | None, name: str) -> dict | None:
    if not bench:
        return None
    run = next((r for r in bench["runs"] if r["name"] == name), None)
    if run is None:
        return None
    return {k: run.get(k) for k in ("accept_length", "accept_rate", "tokens_per_s", "per_position", "requests",
                                    "backend", "backend_label", "failure", "verdict", "explanation",
                                    "predicted_accept_length", "predicted_accept_length_se")}


def _compared(out_dir: Path, params: dict) -> list[dict]:
    """The runs step 05 measured on its `compare_backend` (out_dir/<backend>/results.json), if any."""
    backend = params.get("compare_backend")
    path = out_dir / backend / "results.json" if backend and runs.safe_name(backend) else None
    if path is None or not path.is_file():
        return []
    pair = [_bench_run(json.loads(path.read_text()), name) for name in ("before", "after")]
    return pair if all(pair) else []


def report_data(out_dir: Path, params: dict, error: str | None) -> dict:
    keys, coverage, fix, bench = (runs.load_step(out_dir, n) for n in (runs.KEYS, runs.COVERAGE, runs.FIX, runs.RESULTS))
    return {
        "name": params.get("name"),
        "checkpoint": params.get("checkpoint"),
        "engine": (coverage or {}).get("engine"),
        "layout": (keys or {}).get("layout"),
        "coverage_before": _coverage_numbers(coverage),
        "coverage_after": _coverage_numbers((fix or {}).get("coverage_after")),
        "fix": {k: v for k, v in (fix or {}).items() if k != "coverage_after"} or None,
        "coverage_figure": "coverage.png" if (out_dir / "coverage.png").exists() else None,
        "before": _bench_run(bench, "before"),
        "after": _bench_run(bench, "after"),
        "compared": _compared(out_dir, params),
        "fix_refused": (fix or {}).get("refused"),
        "same_draft": same_draft(fix),
        "error": error,
    }


def outcome(data: dict) -> list[str]:
    """What the investigation found, in sentences: before and after, each with what its number means,
    or why there is no "after" (the fix refused), or why a server did not start; and when the fix
    changed nothing the engine reads, that the two numbers are one draft measured twice."""
    before, after = data.get("before"), data.get("after")
    lines = []
    if before:
        lines.append(f"before the fix: {before.get('explanation') or 'not measured'}")
    if data.get("fix_refused"):
        refused = (data.get("fix") or {}).get("refused_codes") or []
        codes = ", ".join(refused) or "an error finding"
        lines.append(f"the fix was refused ({codes}: no rewrite of names or config removes it), so there is no "
                     "\"after\" to measure; the fix section says why and what you can do")
        if set(refused) & VALUE_CODES:
            lines.append(VALUES_CARRY_NOTHING)
    if after:
        lines.append(f"after the fix: {after.get('explanation') or 'not measured'}")
        if data.get("same_draft"):
            lines.append("the fix changed nothing the engine reads (no tensor renamed or left out, no config change): "
                         "before and after are one draft measured twice, so the same accept length is expected; the "
                         "cause is not in the names or the config")
        if _accepts_nothing(after):
            lines.append(VALUES_CARRY_NOTHING)
    return lines


# the refusals that say the values carry no training: the prediction's, and the value rules' own
VALUE_CODES = {"no-acceptance-predicted", "weights-at-init", "nan-weights"}
# why an investigation ends unresolved when the draft, its names and config right, still accepts nothing
VALUES_CARRY_NOTHING = ("the draft the engine reads still gets no acceptance: its values carry no training the engine "
                        "can use, which no rewrite of names or config restores: re-export from the training output "
                        "(`draftdoctor compare TRAINED THIS` names the tensors that differ and how)")


def _accepts_nothing(run: dict) -> bool:
    """A measured (else predicted) accept length below what a draft with a trained layer was ever measured at
    (`predict.NOTHING_BELOW`)."""
    from .predict import NOTHING_BELOW

    length = run.get("accept_length")
    length = run.get("predicted_accept_length") if length is None else length
    return length is not None and length < NOTHING_BELOW


def unresolved(data: dict, error: str | None) -> bool:
    """An investigation ends unresolved (exit 1) when it failed, its fix was refused, the fixed draft's server
    did not start, or the fixed draft still gets (or is predicted to get) no acceptance: its status follows the
    "after" result."""
    after = data.get("after") or {}
    return bool(error or data.get("fix_refused") or after.get("failure") or (after and _accepts_nothing(after)))


def _md_coverage(title: str, cov: dict | None) -> list[str]:
    if not cov:
        return [f"**{title}:** not measured", ""]
    replay = cov.get("replay")
    beside = ([f"The kit's replay of that loader said: {md(replay['verdict'])} (the same status for "
               f"{replay['params_agreeing']} of {cov['params_total']} parameters).", ""] if replay else [])
    return [f"**{title}** ({md(cov['engine'])}, {md(cov['loader'])} loader): {md(cov['verdict'])}", "", *beside,
            "| parameters | left at init | bytes left at init | keys | keys dropped |", "|---|---|---|---|---|",
            f"| {cov['params_total']} | {cov['params_uninitialized']} | {cov['bytes_uninitialized']:,} of "
            f"{cov['bytes_total']:,} | {cov['keys_total']} | {cov['keys_dropped']} |", ""]


def _fmt(value, digits=2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def write_report(out_dir: Path, params: dict, error: str | None) -> dict:
    """Write report.json and report.md into `out_dir`; return the report.json data."""
    data = report_data(out_dir, params, error)
    runs.write_atomically(out_dir / "report.json", json.dumps(data, indent=1))
    lines = [f"# draftdoctor investigation: {md(data['name'])}", "", f"checkpoint: {md(data['checkpoint'])}  ",
             f"layout: {md(data['layout'] or '–')}; engine: {md(data['engine'] or '–')}", ""]
    if error:
        lines += [f"> **The investigation stopped:** {md(error)}", ""]
    before, after = data["before"], data["after"]
    if before or after:
        run = before or after
        lines += ["## Verdict", "", *(f"- {md(line)}" for line in outcome(data)), "",
                  f"Measured on {md(run.get('backend_label') or (run.get('backend') or 'reference') + ' backend')}.", ""]
    elif data["fix_refused"]:
        lines += ["## Verdict", "", *(f"- {md(line)}" for line in outcome(data)), ""]
    lines += ["## Load coverage", ""] + _md_coverage("Before", data["coverage_before"])
    if data["coverage_figure"]:
        lines += [f"![load coverage before the fix]({data['coverage_figure']})", ""]
    lines += _md_coverage("After the fix", data["coverage_after"])
    fix = data["fix"]
    if fix and fix.get("refused"):
        lines += ["## Fix", "", md(f"{fix['refused'][0].upper()}{fix['refused'][1:]}"), ""]
    elif fix:
        verified = "verified" if fix.get("ok") else "NOT verified: " + md("; ".join(fix["verification"]["problems"]))
        lines += ["## Fix", "", f"Wrote {md(fix.get('dst'))}: {fix.get('tensors_renamed', 0)} tensors renamed, "
                  f"{fix.get('bytes_copied', 0):,} bytes copied in {_fmt(fix.get('seconds'), 2)} s, {verified}.", ""]
        for change in fix.get("config_changes", []):
            lines.append(f"- config {md(change['field'])}: {md(change['reason'])}")
        lines.append("")
    if before or after:
        lines += ["## Acceptance", "", "Measured on the server, and predicted before serving (the draft as the engine loads "
                  "it, run on the target's own continuations of the same prompts).", "",
                  "| run | accept length | predicted | strict accept rate | tokens/s |", "|---|---|---|---|---|"]
        for name, run in (("before", before), ("after", after)):
            if run:
                predicted = (f"{_fmt(run.get('predicted_accept_length'))} ± {_fmt(run.get('predicted_accept_length_se'))}"
                             if run.get("predicted_accept_length") is not None else "–")
                lines.append(f"| {name} | {_fmt(run['accept_length'])} | {predicted} | {_fmt(run['accept_rate'])} | "
                             f"{_fmt(run['tokens_per_s'], 1)} |")
        lines.append("")
        if (out_dir / "acceptance.png").exists():
            lines += ["![acceptance before and after](acceptance.png)", ""]
    if data["compared"] and before and after:
        lines += ["## Backends compared", "", "The same drafts, prompts and steps on a second backend.", "",
                  "| backend | accept length before | after |", "|---|---|---|"]
        for first, second in ((before, after), data["compared"]):
            label = first.get("backend_label") or first.get("backend")
            lines.append(f"| {md(label)} | {_fmt(first['accept_length'])} | {_fmt(second['accept_length'])} |")
        lines.append("")
        if (out_dir / "backends.png").exists():
            lines += ["![the two backends side by side](backends.png)", ""]
    runs.write_atomically(out_dir / "report.md", "\n".join(lines))
    return data


def write_summary(out: Path, results) -> None:
    """summary.md and summary.json of a batch: one row per checkpoint."""
    rows = []
    for r in results:
        rep = r.report or {}
        rows.append({"name": r.name, "verdict": (rep.get("coverage_before") or {}).get("verdict"),
                     "accept_length_before": (rep.get("before") or {}).get("accept_length"),
                     "accept_length_after": (rep.get("after") or {}).get("accept_length"),
                     "error": r.error, "folder": str(r.out_dir)})
    runs.write_atomically(out / "summary.json", json.dumps(rows, indent=1))
    lines = ["# draftdoctor batch summary", "", "| checkpoint | verdict before | accept length before | after | status |",
             "|---|---|---|---|---|"]
    for row in rows:
        status = "failed: " + md(row["error"].splitlines()[0]) if row["error"] else "ok"
        lines.append(f"| [{md(row['name'])}]({row['name']}/report.md) | {md(row['verdict'] or '–')} | "
                     f"{_fmt(row['accept_length_before'])} | {_fmt(row['accept_length_after'])} | {status} |")
    runs.write_atomically(out / "summary.md", "\n".join(lines) + "\n")
