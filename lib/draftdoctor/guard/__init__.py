"""The guard: inside a serving engine's own process, record what its loader writes into the EAGLE-3
draft, and stop the server before it is ready when a draft parameter is left unwritten or a tensor
is dropped (docs/guard.md).

It is off unless asked for: `DRAFTDOCTOR_GUARD=1` in the server's environment (`draftdoctor serve/bench
--guard` sets it). vLLM loads it through its plugin entry point (`draftdoctor.guard.vllm`); SGLang has
none, so `python -m draftdoctor.guard -- <command>` puts a start-up hook in every Python process the
command starts (`draftdoctor.guard.sglang`). Both hand the recorder's report (draftdoctor.realload.recorder,
the one the real check runs) to `judge`, which gives the real check's findings: the same words `check`
prints before serving.

This module imports nothing heavy: it runs inside the engine, beside its own imports.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

ENV = "DRAFTDOCTOR_GUARD"
EXIT_REFUSED = 1  # the status the server ends with when the guard refuses its draft
PREFIX = "draftdoctor guard"
# the initial values kept per parameter, so that one the engine leaves as it is on purpose (a vocabulary
# map whose zeros are right) is served with them, not with the recorder's sentinel
KEEP_INITIAL_BYTES = 1 << 20


def printable(text) -> str:
    """`text` with control characters escaped: a tensor name cannot forge a line of the refusal."""
    text = str(text)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def enabled(environ=None) -> bool:
    """Whether the guard was asked for in this process's environment."""
    return (environ if environ is not None else os.environ).get(ENV, "") not in ("", "0")


@dataclass
class GuardVerdict:
    """What the guard concluded about one draft load in one process (one rank of a tensor-parallel server)."""

    engine: str  # e.g. "vllm==0.32.0"
    draft: str
    written: int  # parameters written (or taken from the target, or right at their initial value)
    total: int
    refused: bool
    findings: list[str] = field(default_factory=list)  # the check's finding lines that refuse it
    notes: list[str] = field(default_factory=list)  # what the guard could not see, said plainly
    rank: str | None = None  # "rank 1 of 2" under tensor parallelism

    def where(self) -> str:
        return f" ({self.rank})" if self.rank else ""

    def announcement(self) -> str:
        """The one line a served draft gets."""
        notes = f"; {'; '.join(self.notes)}" if self.notes else ""
        return f"{PREFIX}: {self.written} of {self.total} draft parameters written{self.where()}{notes}"

    def refusal(self, live: str) -> str:
        """The refusal text: what was found, in the check's words, and what was and was not run live."""
        what = (f"{self.total - self.written} of {self.total} draft parameters left unwritten or tensors dropped by "
                "the engine's own loader" if self.total else "the guard could not see the draft's load")
        lines = [f"{PREFIX}: refusing to serve {printable(self.draft)} with {self.engine}{self.where()}: {what}",
                 *("  " + f for f in self.findings),
                 *("  note: " + n for n in self.notes), f"  {live}",
                 "  `draftdoctor check` gives the same findings before serving; `draftdoctor fix` writes a "
                 "copy the engine loads"]
        return "\n".join(lines)


def rank_label(distributed: str) -> str | None:
    """"rank R of N" under tensor parallelism, from the engine's `distributed` module (vLLM's and SGLang's
    name the two functions alike); None for one process or before its group exists."""
    import importlib

    try:
        module = importlib.import_module(distributed)
        size = module.get_tensor_model_parallel_world_size()
        return f"rank {module.get_tensor_model_parallel_rank()} of {size}" if size > 1 else None
    except Exception:  # noqa: BLE001 - no group: one process
        return None


def judge(raw: dict, draft: str, engine_spec: str, rank: str | None = None) -> GuardVerdict:
    """The verdict on one recorded load: `raw` is the recorder's report (plus "from_target", the
    parameters the engine was seen to take from the target), `draft` the draft's folder."""
    from ..checkpoint import open_checkpoint
    from ..coverage import DROPPED
    from ..engines import resolve_engine
    from ..errors import UserError
    from ..realcheck import from_real

    notes = []
    try:
        engine = resolve_engine(engine_spec)
    except UserError:  # a release the kit has no row for: its engine's newest row, said so
        engine = resolve_engine(engine_spec.partition("==")[0])
        notes.append(f"{engine_spec} is not a release the kit knows; read with the rows of {engine.spec}")
    try:
        checkpoint = open_checkpoint(draft)
    except (UserError, OSError) as exc:
        return _judge_raw(raw, draft, engine.spec, rank, notes + [f"the draft folder could not be read ({exc})"])
    report = from_real(raw, checkpoint, engine)
    refused = bool(report.uninitialized or report.dropped)
    findings = [f.line(printable) for f in report.findings
                if f.severity == "error" and f.code in ("uninitialized-params", "dropped-keys")]
    if refused and not findings:  # never refuse without saying why
        findings = [printable(f"{k.key}: {k.reason}") for k in report.keys if k.status == DROPPED]
    return GuardVerdict(engine.spec, str(draft), len(report.params) - len(report.uninitialized), len(report.params),
                        refused, findings, notes, rank)


def _judge_raw(raw: dict, draft: str, engine: str, rank, notes) -> GuardVerdict:
    """Without the draft's folder: from the recorder's observations alone."""
    shared = set(raw.get("from_target", ()))
    unwritten = [p for p in raw["parameters"] if p["status"] != "written" and p["name"] not in shared]
    dropped = [k["key"] for k in raw["keys"] if not k["consumed"]]
    findings = [f"ERROR   parameter never written: {printable(p['name'])} {p['shape']}" for p in unwritten]
    findings += [f"ERROR   tensor dropped: {printable(key)}" for key in dropped]
    total = len(raw["parameters"])
    return GuardVerdict(engine, str(draft), total - len(unwritten), total, bool(unwritten or dropped), findings, notes,
                        rank)


class GuardRefused(SystemExit):
    """Ends the process that loaded the draft, before the server reports ready, with status 1. A
    SystemExit, not an error: the engines' start-up code catches errors (logs them as a crash, may
    retry), while a SystemExit unwinds through their cleanup (temporary folders, process groups) and
    ends the process; the server's other processes see it gone and stop."""


def refuse(verdict: GuardVerdict, live: str):
    """The refusal on stderr, then GuardRefused."""
    print(verdict.refusal(live), file=sys.stderr, flush=True)
    raise GuardRefused(EXIT_REFUSED)


def guard_refusal(lines: list[str]) -> str | None:
    """The guard's refusal in a server's log lines (its first line and the indented ones after it), if any."""
    start = next((i for i, line in enumerate(lines) if line.startswith(f"{PREFIX}: refusing")), None)
    if start is None:
        return None
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line)
    return "\n".join(block)


def announce(verdict: GuardVerdict):
    print(verdict.announcement(), file=sys.stderr, flush=True)
