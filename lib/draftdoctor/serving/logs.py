"""Parse engines' periodic speculative-decoding log lines into DataFrames.

SGLang's "Decode batch" line carries `accept len` (every release with speculative decoding) and,
from 0.5.4, `accept rate`, whose formula changed (docs/engine-facts.md: "Acceptance"): 0.5.4–0.5.10 log L / k (the bonus
token counted), 0.5.11 on log the strict rate (L − 1) / (k − 1). So the logged rate is read with its
release's formula, and the strict rate is always recomputed from L and k where k is known.
vLLM's "SpecDecoding metrics" line is parsed by field name: field order varies across versions.
"""

from __future__ import annotations

import re

from ..engines import serving_facts
from ..frames import frame

_SGLANG_DECODE = re.compile(
    r"(?:\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})[^\]]*\]\s*)?"
    r"Decode batch(?: \[\d+\])?[.,]\s+#running-req:\s*(?P<running>\d+),"
    r".*?accept len:\s*(?P<accept_len>[0-9.]+)"
    r"(?:,\s*accept rate:\s*(?P<accept_rate>[0-9.]+))?"
    r"(?:.*?gen throughput \(token/s\):\s*(?P<throughput>[0-9.]+))?"
)

_VLLM_FIELDS = {
    "accept_length": r"Mean acceptance length:\s*([0-9.]+)",
    "accepted": r"Accepted:\s*(\d+) tokens",
    "drafted": r"Drafted:\s*(\d+) tokens",
    "accepted_throughput": r"Accepted throughput:\s*([0-9.]+)",
    "drafted_throughput": r"Drafted throughput:\s*([0-9.]+)",
    "draft_acceptance_pct": r"Avg Draft acceptance rate:\s*([0-9.]+|nan)%",
    "per_position": r"Per-position acceptance rate:\s*((?:[0-9.]+(?:,\s*)?)+)",
}


def sglang_rate_formula(release: str | None) -> str:
    """'none', 'bonus', 'strict' (engines.sglang.SERVING), or 'unknown' for a release no row covers."""
    facts = serving_facts(release) if release is not None else None
    return facts.accept_rate_formula if facts else "unknown"


def strict_rate(accept_length: float, num_draft_tokens: int | None) -> float | None:
    """Accepted drafts / proposed drafts from accept length L and k draft tokens per step."""
    if not num_draft_tokens or num_draft_tokens < 2:
        return None
    return (accept_length - 1) / (num_draft_tokens - 1)


def parse_sglang_lines(lines, release: str | None = None, num_draft_tokens: int | None = None):
    """DataFrame of SGLang "Decode batch" lines: time, running, accept_len, the logged rate, its
    formula for `release`, the strict rate, and throughput. Other lines are ignored."""
    formula = sglang_rate_formula(release)
    rows = []
    for line in lines:
        m = _SGLANG_DECODE.search(line)
        if not m:
            continue
        length = float(m["accept_len"])
        logged = float(m["accept_rate"]) if m["accept_rate"] is not None else None
        strict = strict_rate(length, num_draft_tokens)
        if strict is None and logged is not None and formula == "strict":
            strict = logged
        rows.append({
            "time": m["time"], "running_req": int(m["running"]), "accept_length": length,
            "accept_rate_logged": logged, "accept_rate_formula": formula if logged is not None else "none",
            "accept_rate_strict": strict,
            "gen_throughput": float(m["throughput"]) if m["throughput"] else None,
        })
    return frame(rows, columns=["time", "running_req", "accept_length", "accept_rate_logged",
                                "accept_rate_formula", "accept_rate_strict", "gen_throughput"])


def parse_vllm_lines(lines):
    """DataFrame of vLLM "SpecDecoding metrics" lines, one column per field found."""
    rows = []
    for line in lines:
        if "SpecDecoding metrics" not in line:
            continue
        row = {}
        for field, pattern in _VLLM_FIELDS.items():
            m = re.search(pattern, line)
            if not m:
                continue
            text = m.group(1)
            if field == "per_position":
                row[field] = [float(x) for x in re.findall(r"[0-9.]+", text)]
            elif field in ("accepted", "drafted"):
                row[field] = int(text)
            else:
                row[field] = float(text)
        if row.get("drafted"):
            row["accept_rate_strict"] = row.get("accepted", 0) / row["drafted"]
        rows.append(row)
    return frame(rows)


def format_decode_line(release: str, running: int, tokens: int, token_usage: float, accept_length: float,
                       num_draft_tokens: int, gen_throughput: float, queue: int = 0) -> str:
    """A "Decode batch" line as `release` of SGLang writes it, accept rate by that release's formula.

    Used by the reference backend so its logs read like the emulated release's.
    """
    formula = sglang_rate_formula(release)
    facts = serving_facts(release)
    head = (f"{facts.decode_line_head if facts else 'Decode batch,'} #running-req: {running}, #token: {tokens}, "
            f"token usage: {token_usage:.2f}, ")
    rate = {"bonus": accept_length / num_draft_tokens,
            "strict": strict_rate(accept_length, num_draft_tokens) or 0.0}.get(formula)
    spec = f"accept len: {accept_length:.2f}, " + (f"accept rate: {rate:.2f}, " if rate is not None else "")
    return head + spec + f"cuda graph: False, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queue}, "
