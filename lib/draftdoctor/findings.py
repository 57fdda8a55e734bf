"""The registry of finding codes: stable names, severities, and what each means for a user.

Codes are part of the kit's interface (README, `--format json`, tests): never rename one. Each entry
says how bad it is, what it means in words a new engineer understands, and what `fix` can do.
"""

from __future__ import annotations

from dataclasses import dataclass

ERROR, WARNING, INFO = "error", "warning", "info"


@dataclass(frozen=True)
class Code:
    severity: str
    meaning: str
    remedy: str


CODES = {
    "dropped-keys": Code(
        ERROR,
        "checkpoint tensors that the engine's loader matches to no parameter and discards; the weights "
        "they carry never reach the model",
        "`draftdoctor fix` renames keys to the engine's names",
    ),
    "uninitialized-params": Code(
        ERROR,
        "engine parameters that no checkpoint tensor writes; they keep their initial (random or "
        "constant) values, so the draft runs but predicts noise and acceptance collapses",
        "`draftdoctor fix` when the weights are present under other names; otherwise retrain or re-export",
    ),
    "shape-mismatch": Code(
        ERROR,
        "a tensor whose shape does not fit the parameter it loads into; the engine stops with an "
        "assertion while loading",
        "check the draft config (hidden size, heads, vocab sizes, aux layer count) against the checkpoint",
    ),
    "loader-crash": Code(
        ERROR,
        "the engine's loader raises while building or loading the draft: the server does not start",
        "see the message; `draftdoctor fix` handles naming and config causes",
    ),
    "config-unreadable": Code(
        ERROR,
        "the engine cannot read the draft's config.json (wrong format, architecture or missing fields); "
        "the server does not start",
        "`draftdoctor fix` writes the config format the engine reads",
    ),
}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    message: str


def finding(code: str, message: str, severity: str | None = None) -> Finding:
    """A finding of a registered code, with the code's severity unless overridden."""
    return Finding(code, severity or CODES[code].severity, message)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} kB"


def coverage_findings(report) -> list[Finding]:
    """Findings that follow from a coverage report's per-key and per-parameter statuses."""
    out = []
    dropped = report.dropped
    training = [k for k in report.keys if k.status == "training-only"]
    if dropped:
        names = ", ".join(k.key for k in dropped[:6]) + (f" and {len(dropped) - 6} more" if len(dropped) > 6 else "")
        out.append(finding(
            "dropped-keys",
            f"{len(dropped)} of {len(report.keys)} checkpoint tensors ({_mb(sum(k.nbytes for k in dropped))}) "
            f"match no {report.engine} parameter and are discarded: {names}",
        ))
    if training:
        out.append(finding(
            "dropped-keys",
            f"{len(training)} training-only tensor(s) are ignored, as they should be: "
            + ", ".join(k.key for k in training),
            severity=INFO,
        ))
    missing = report.uninitialized
    if missing:
        parts = []
        for p in missing:
            part = p.name + (f" (shards {', '.join(p.shards_missing)} missing)" if p.status == "partial" else "")
            parts.append(part)
        out.append(finding(
            "uninitialized-params",
            f"{len(missing)} of {len(report.params)} parameters ({_mb(report.bytes_uninitialized)} of "
            f"{_mb(report.bytes_needed)}) are never written and keep their initial values: " + ", ".join(parts),
        ))
    return out


def verdict(report) -> str:
    """One line a user can act on."""
    crash = [f for f in report.findings if f.code in ("loader-crash", "shape-mismatch")]
    if crash:
        return f"the server will not start: {crash[0].message}"
    missing = report.uninitialized
    config = [f for f in report.findings if f.code == "config-unreadable"]
    if missing:
        layer = [p for p in missing if p.role == "layer"]
        layer_total = [p for p in report.params if p.role == "layer"]
        what = "decoder layer" if layer and len(layer) == len(layer_total) == len(missing) else "draft parameters"
        line = (
            f"{what} left at initial values ({len(missing)} of {len(report.params)} parameters, "
            f"{_mb(report.bytes_uninitialized)} of {_mb(report.bytes_needed)})"
        )
        if layer:
            line += ": expect accept length 1.00"
        return line + ("; and the config is unreadable" if config else "")
    if config:
        return f"every parameter is written, but the server will not start: {config[0].message}"
    if [f for f in report.findings if f.severity == ERROR]:
        return "loads, with errors: " + "; ".join(f.code for f in report.findings if f.severity == ERROR)
    shared = sum(p.status == "from-target" for p in report.params)
    return (
        f"loads cleanly: {len(report.params) - shared} of {len(report.params)} parameters written"
        + (f" ({shared} taken from the target at serve time)" if shared else "")
        + ", every tensor placed"
    )
