"""The guard: inside a serving engine's own process, record what its loader writes into the EAGLE-3
draft, and stop the server before it is ready when a draft parameter is left unwritten or a tensor
is dropped (docs/guard.md).

It is off unless asked for: `DRAFTDOCTOR_GUARD=1` in the server's environment (`draftdoctor serve/bench
--guard` sets it). vLLM loads it through its plugin entry point (`draftdoctor.guard.vllm`); SGLang has
none, so `python -m draftdoctor.guard -- <command>` puts a start-up hook in every Python process the
command starts (`draftdoctor.guard.sglang`). Both hand the recorder's report (draftdoctor.realload.recorder,
the one the real check runs) to `judge`, which gives the real check's findings: the same words `check`
prints before serving. It judges the draft the engine loaded, read from the folder whose files its
loader opened (a hub id's snapshot, say), or, when that folder is not seen, from the keys the loader
read: always through `realcheck.coverage_from`, never a rule of its own. It judges only the EAGLE-3 draft
classes the kit's rows model, and says so in one line for any other draft class (an MTP head).

Each guarded process also says what it did in a private folder the caller names
(`DRAFTDOCTOR_GUARD_REPORTS`): that the guard is present, and each draft it judged or declined to
judge. The launcher (`python -m draftdoctor.guard`) and `serve/bench --guard` read it, and fail when
no process that loaded a draft had the guard in it.

This module imports nothing heavy: it runs inside the engine, beside its own imports.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from dataclasses import dataclass, field

ENV = "DRAFTDOCTOR_GUARD"
# a private folder (the launcher's, or the kit server's) where each guarded process leaves its reports
REPORTS = "DRAFTDOCTOR_GUARD_REPORTS"
PRESENT, DRAFT = "present", "draft"  # the two report events: the guard is in this process; it saw a draft load
SERVED, REFUSED, NOT_JUDGED = "served", "refused", "not-judged"  # what it did with that draft
_REPORT_BYTES = 1 << 16  # a report is a line or two; anything larger in the folder is not one
_SEQUENCE = itertools.count()
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

    engine_spec: str  # the serving engine's own words for its release, e.g. "vllm==0.32.0" (maybe one no row knows)
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
        lines = [f"{PREFIX}: refusing to serve {printable(self.draft)} with {self.engine_spec}{self.where()}: {what}",
                 *("  " + f for f in self.findings),
                 *("  note: " + n for n in self.notes), f"  {live}",
                 "  `draftdoctor check` gives the same findings before serving; `draftdoctor fix` writes a "
                 "copy the engine loads"]
        return "\n".join(lines)


def rows_of(engine_name: str, release: str) -> list:
    """The kit's rows for `engine_name` `release` (a release it does not know: the engine's newest, as `judge`
    reads it): what the guard judges there."""
    from ..engines import EngineRelease, all_profiles
    from ..errors import UserError

    try:
        release = EngineRelease.of(engine_name, release).release
    except UserError:
        release = EngineRelease.newest(engine_name).release
    return [p for p in all_profiles() if p.engine_name == engine_name and p.contains(release)]


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


def judge(raw: dict, draft: str, engine_spec: str, rank: str | None = None, opened=(),
          config: dict | None = None) -> GuardVerdict:
    """The verdict on one recorded load: `raw` is the recorder's report (plus "from_target", the
    parameters the engine was seen to take from the target), or a load report's wire form (`load_report`); `draft` the name the engine was given
    (a folder, or a hub id); `opened` the folders whose weight files its loader opened; `config` the
    engine's own config of the draft, used only when no opened folder can be read. The findings are
    `realcheck.coverage_from`'s, on the folder the loader opened, else on the keys it read (names, shapes,
    dtypes): the real check's rules either way."""
    from ..coverage import DROPPED
    from ..engines import resolve_engine
    from ..errors import UserError
    from ..realcheck import coverage_from

    notes = []
    try:  # the running engine's own words for its release: the guard's edge
        engine = resolve_engine(engine_spec)
    except UserError:  # a release the kit has no row for: its engine's newest row, said so
        engine = resolve_engine(engine_spec.partition("==")[0])
        notes.append(f"{engine_spec} is not a release the kit knows; read with the rows of {engine.spec}")
    checkpoint, note = loaded_checkpoint(raw, opened, config)
    notes += [note] if note else []
    report = coverage_from(load_report(raw, engine, draft), checkpoint, engine)
    refused = bool(report.uninitialized or report.dropped)
    findings = [f.line(printable) for f in report.findings
                if f.severity == "error" and f.code in ("uninitialized-params", "dropped-keys")]
    if refused and not findings:  # never refuse without saying why
        findings = [printable(f"{k.key}: {k.reason}") for k in report.keys if k.status == DROPPED]
    folders = sorted({str(f) for f in opened})
    name = str(draft) if folders in ([], [os.path.abspath(draft)]) else f"{draft} (read from {', '.join(folders)})"
    return GuardVerdict(engine.spec, name, len(report.params) - len(report.uninitialized), len(report.params),
                        refused, findings, notes, rank)


def load_report(raw: dict, engine, draft: str):
    """`raw` as a LoadReport (draftdoctor.loadreport): a load report's wire form as it is; the recorder's
    record of a load in a server's process (its parameters, keys and attributes, and `from_target`
    where the engine was seen to take some) with `engine` and `draft` as its header."""
    from ..loadreport import LoadReport

    if "version" in raw:
        return LoadReport.from_wire(raw)
    return LoadReport.of(engine_name=engine.name, release=engine.release, versions={}, checkpoint=str(draft),
                         device="server", **raw)


def loaded_checkpoint(raw: dict, opened=(), config: dict | None = None):
    """(the checkpoint the engine's loader read, a note or None): the one folder whose files it opened,
    read again; failing that (no folder seen, several, or unreadable), the keys it read, as a
    checkpoint of those names, shapes and dtypes with `config` (the engine's own config of the draft)."""
    from ..checkpoint import open_checkpoint, read_config
    from ..errors import UserError

    folders = list(dict.fromkeys(str(f) for f in opened))
    if len(folders) == 1:
        try:
            return open_checkpoint(folders[0]), None
        except (UserError, OSError) as exc:
            why = f"the folder its loader opened could not be read again ({printable(exc)})"
            try:
                config = read_config(folders[0]) or config
            except (UserError, OSError):
                pass
    else:
        why = (f"its loader read weights from {len(folders)} folders" if folders
               else "the folder its loader opened was not seen")
    return recorded_checkpoint(raw["keys"], config, folders[0] if folders else "the draft"), (
        f"{why}: judged from the {len(raw['keys'])} keys the loader read")


# torch's dtype names (the recorder's) as safetensors writes them
_SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                       "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32",
                       "uint64": "U64", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
                       "float8_e8m0fnu": "F8_E8M0", "complex64": "C64"}


def recorded_checkpoint(keys: list[dict], config: dict | None, path="the draft"):
    """A checkpoint of the keys a loader read (the recorder's "keys": name, shape, dtype), no file behind it."""
    from pathlib import Path

    from ..checkpoint import DTYPE_BITS, Checkpoint, TensorInfo

    tensors = {}
    for k in keys:
        dtype = _SAFETENSORS_DTYPES.get(k["dtype"], str(k["dtype"]).upper())
        size = 1
        for n in k["shape"]:
            size *= n
        nbytes = size * DTYPE_BITS.get(dtype, 0) // 8
        tensors[k["key"]] = TensorInfo(k["key"], dtype, tuple(k["shape"]), None, 0, nbytes)
    return Checkpoint(path=Path(path), shards=[], tensors=tensors, config=config if isinstance(config, dict) else None)


def engine_config(model_config) -> dict | None:
    """The engine's own config of the draft (`model_config.hf_config`, a transformers config) as a dict."""
    try:
        config = model_config.hf_config.to_dict()
    except Exception:  # noqa: BLE001 - no config object: the keys alone
        return None
    return json.loads(json.dumps(config, default=str)) if isinstance(config, dict) else None


def opened_folders(loader, into: list):
    """While the engine's loader loads: record in `into` the folder of each weight source it prepares
    (`_prepare_weights`, vLLM's and SGLang's, which resolves a hub id to its local snapshot and returns
    (folder, files, ...)). Returns a function that undoes it."""
    prepare = getattr(loader, "_prepare_weights", None)
    if prepare is None:
        return lambda: None

    def recorded(*args, **kwargs):
        result = prepare(*args, **kwargs)
        into.append(os.path.abspath(result[0]))
        return result

    loader._prepare_weights = recorded
    return lambda: vars(loader).pop("_prepare_weights", None)


class GuardRefused(SystemExit):
    """Ends the process that loaded the draft, before the server reports ready, with status 1. A
    SystemExit, not an error: the engines' start-up code catches errors (logs them as a crash, may
    retry), while a SystemExit unwinds through their cleanup (temporary folders, process groups) and
    ends the process; the server's other processes see it gone and stop."""


def refuse(verdict: GuardVerdict, live: str):
    """The refusal on stderr, then GuardRefused."""
    text = verdict.refusal(live)
    print(text, file=sys.stderr, flush=True)
    report(DRAFT, outcome=REFUSED, draft=verdict.draft, line=text.splitlines()[0])
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
    line = verdict.announcement()
    print(line, file=sys.stderr, flush=True)
    report(DRAFT, outcome=SERVED, draft=verdict.draft, line=line)


def not_judged(engine_spec: str, draft: str, draft_class: str, judged, rank: str | None = None) -> str:
    """The line a draft of a class the kit does not model gets (an MTP head, EAGLE-1): said, never passed
    off as a verdict; its load was left as the engine made it."""
    where = f" ({rank})" if rank else ""
    line = (f"{PREFIX}: not judged: {printable(draft)} is loaded by {engine_spec} as {printable(draft_class)}{where}, not "
            f"an EAGLE-3 draft class the kit models ({', '.join(sorted(judged))}); its load was not recorded and "
            "nothing is said about its weights")
    print(line, file=sys.stderr, flush=True)
    report(DRAFT, outcome=NOT_JUDGED, draft=str(draft), line=line)
    return line


# -- what each guarded process tells its launcher ---------------------------------------------------

def report(event: str, **fields) -> None:
    """Leave one report in the folder $DRAFTDOCTOR_GUARD_REPORTS names (none: nobody asked). Written
    aside and renamed in, so a reader never sees half of one; a folder that is gone is not the
    server's problem (its launcher then says the guard never reported)."""
    folder = os.environ.get(REPORTS)
    if not folder:
        return
    name = f"{os.getpid()}-{next(_SEQUENCE)}-{event}.json"
    record = {"event": event, "pid": os.getpid(), **fields}
    try:
        aside = os.path.join(folder, "." + name)
        with open(aside, "x") as f:
            json.dump(record, f)
        os.rename(aside, os.path.join(folder, name))
    except OSError:
        pass


def reports(folder) -> list[dict]:
    """The reports left in `folder` (a private folder its reader made), oldest process first."""
    from pathlib import Path

    found = []
    for path in sorted(Path(folder).glob("[0-9]*.json")):
        try:
            with open(path, "rb") as f:
                record = json.loads(f.read(_REPORT_BYTES + 1)[:_REPORT_BYTES])
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            found.append(record)
    return found


def unguarded(records: list[dict]) -> str | None:
    """Why the reports do not show the guard in a process that loaded a draft (None: they do)."""
    if any(r["event"] == DRAFT for r in records):
        return None
    present = {r.get("pid") for r in records if r["event"] == PRESENT}
    if not present:
        return ("the guard's start-up hook ran in none of its processes (an interpreter started with -I, -S or "
                "-E, a cleared environment or PYTHONPATH, a Python without the kit), so no draft it loaded was judged")
    return (f"the guard was present in {len(present)} of its processes, but no "
            "draft was loaded there through the loader the guard wraps (another --load-format or loader class, or no "
            "draft at all), so nothing was judged")
