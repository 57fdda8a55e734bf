"""The `draftdoctor` command line: the only module (besides notebooks) that prints.

Exit status: 0 no error findings, 1 error findings (a refused fix, a failed measurement), 2 unusable
input or arguments.
"""

from __future__ import annotations

import signal
import sys

from . import _arm_early_interrupt

if __name__ == "__main__":  # `python -m draftdoctor.cli`; the console script's package import did it already
    _arm_early_interrupt()

import argparse
import gc
import json
from itertools import chain, islice, repeat

from .errors import UserError
from .serving.backends import BACKENDS

EXIT_OK, EXIT_FINDINGS, EXIT_UNUSABLE = 0, 1, 2
DESCRIPTION = """\
Find out why a speculative-decoding draft model (EAGLE-3) gets no acceptance once served, fix its
checkpoint, and prove the fix by measuring acceptance before and after. The usual order:
  inspect DRAFT                        what the checkpoint holds (headers only, any size)
  check DRAFT --engine E --target T    what engine release E's loader writes, skips or leaves at
                                       init, and whether the draft fits target T
  fix DRAFT --engine E --target T --out FIXED
                                       rename tensors and rewrite the config for E; verified, and
                                       refused when the result would still fail `check`
  compare TRAINED DRAFT                how two checkpoints differ: tensor by tensor, and their configs
                                       by what each engine release does with them
  bench --target T --draft before=DRAFT --draft after=FIXED --out DIR
                                       serve each draft, measure acceptance, chart it
  investigate --params P.yaml --out runs/NAME
                                       all of it as notebooks, with a report
  demo [--out runs/demo]               the bundled demo draft, investigated end to end
  loaders list | install E==R          the engines' own loaders (check --loader real): list, install
E is e.g. sglang==0.5.10 or vllm==0.32.0. Exit status: 0 no error findings; 1 error findings, a
refused fix or a failed measurement; 2 unusable input or arguments. Each command's --help says more.
What the kit builds and installs (real loaders, llama.cpp) and tool state (Jupyter, matplotlib, ...)
go under $DRAFTDOCTOR_STATE; unset, the checkout's build/ when run from a checkout, else the user
cache folder ($XDG_CACHE_HOME or ~/.cache, then draftdoctor)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 as well; keep the message to one line
        self.exit(EXIT_UNUSABLE, f"draftdoctor: error: {message}\n")


def _table(rows, columns: list[str], out) -> None:
    """Rows (sequences of cells in `columns` order) as left-aligned text columns under a header."""
    _text_columns([list(map(str, column)) for column in zip(*rows)] or [[] for _ in columns], columns, out)


def _safe(text) -> str:
    """`text` with its control characters escaped (a newline as \\n, ESC as \\x1b, ...): a tensor
    name, a path or a config value cannot forge an output line or drive the terminal."""
    text = str(text)
    return text if text.isprintable() else "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _text_columns(cells: list[list[str]], columns: list[str], out) -> None:
    """Columns of text cells, left-aligned under upper-case headers. Column by column, so that
    10^5 rows (inspect) take milliseconds, not tenths of a second."""
    cells = [[header.upper(), *(column if " ".join(column).isprintable() else map(_safe, column))]
             for header, column in zip(columns, cells)]
    padded = [list(map(str.ljust, column, repeat(max(map(len, column))))) for column in cells[:-1]]
    out.write("\n".join(map(str.rstrip, map("  ".join, zip(*padded, cells[-1])))) + "\n")


def cmd_inspect(args, out) -> int:
    from .checkpoint import gc_paused

    with gc_paused():  # 10^5 tensors: millions of live objects the cyclic GC would rescan many times
        return _inspect(args, out)


CHUNK_LINES = 1 << 14  # inspect writes its 10^5 rows this many at a time: no 20 MB string, no 20 MB encoding


def _inspect(args, out) -> int:
    """The tensor table in each format. A Kimi-class checkpoint has 10^5 tensors, and every Python-level
    pass over them costs milliseconds: rows are made by one %-format each (the column widths in the
    format), cells that repeat (dtypes, shapes, sizes, files) are made once each, and JSON strings
    are escaped by one orjson call per column."""
    from .checkpoint import open_checkpoint
    from .layouts import detect_layout
    from .provenance import recognise
    from .tables import human_bytes, module_totals, shape_texts, tensor_columns

    ckpt = open_checkpoint(args.path)
    table = tensor_columns(ckpt)
    keys = ckpt.keys()
    layout = detect_layout(keys, ckpt.config)
    found = recognise(keys, ckpt.config, metadata_absent=all(s.metadata is None for s in ckpt.shards))
    if args.format == "json":
        _inspect_json(ckpt, table, layout, found, out)
        return EXIT_OK
    shapes = shape_texts(table["shape"])
    if args.format == "csv":
        _csv([table["module"], table["name"], table["dtype"], shapes, table["bytes"], table["file"]], list(table), out)
        return EXIT_OK
    names, dtypes, sizes, files = table["name"], table["dtype"], table["bytes"], table["file"]
    totals = module_totals(table)
    if not _printable(names):
        names = list(map(_safe, names))
    size_text = {size: human_bytes(size) for size in set(sizes)}
    if "" in shapes:
        shapes = list(map({"": "scalar"}.get, shapes, shapes))
    file_text = {f: _safe(f) for f in set(files)}
    if any(text != f for f, text in file_text.items()):
        files = list(map(file_text.__getitem__, files))
    lines = [(f"[{_safe(module)}]", "", f"{count} tensors", human_bytes(size), "") for module, count, size in totals]
    widths = [max([4, max(map(len, names), default=0) + 2, *(len(cells[0]) for cells in lines)]),
              max([5, *map(len, set(dtypes))]),
              max([5, max(map(len, shapes), default=0), *(len(cells[2]) for cells in lines)]),
              max([5, *map(len, size_text.values()), *(len(cells[3]) for cells in lines)])]
    row = "  %%-%ds  %%-%ds  %%-%ds  %%-%ds  %%s" % (widths[0] - 2, *widths[1:])
    rows = map(row.__mod__, zip(names, dtypes, shapes, map(size_text.__getitem__, sizes), files))
    if any(f != f.rstrip() for f in file_text.values()):  # a file name ending in a space: lines end at their text
        rows = map(str.rstrip, rows)
    line = "%%-%ds  %%-%ds  %%-%ds  %%-%ds  %%s" % tuple(widths)
    text = [(line % ("NAME", "DTYPE", "SHAPE", "BYTES", "FILE")).rstrip()]
    for (module, count, _), cells in zip(totals, lines):
        text.append((line % cells).rstrip())
        text += islice(rows, count)
        if len(text) >= CHUNK_LINES:
            out.write("\n".join(text) + "\n")
            text = []
    if text:
        out.write("\n".join(text) + "\n")
    out.write(f"\n{len(names)} tensors, {human_bytes(sum(sizes))} in {len(ckpt.shards)} file(s)\n")
    out.write(f"layout: {layout.name}\n" + "".join(f"  - {_safe(e)}\n" for e in layout.evidence))
    out.write(f"draft: {found.architecture}, written by {found.trainer}, as far as this evidence shows:\n"
              + "".join(f"  - {_safe(e)}\n" for e in found.evidence))
    return EXIT_OK


def _inspect_json(ckpt, table: dict, layout, found, out) -> None:
    """inspect's JSON: what orjson writes for the whole document (then `_json_text`), the tensor rows
    written by one %-format per row from columns orjson escaped (one call per column, not per cell),
    and written out CHUNK_LINES rows at a time."""
    import orjson

    head = orjson.dumps({"path": str(ckpt.path), "files": [str(s.path) for s in ckpt.shards],
                         "layout": {"name": layout.name, "evidence": list(layout.evidence)},
                         "architecture": found.architecture, "trainer": found.trainer,
                         "provenance_evidence": list(found.evidence)}).decode()
    out.write(_json_text(head[:-1] + ',"tensors":['))
    if table["name"]:
        strings = {key: _json_strings(table[key]) for key in ("module", "name", "dtype", "file")}
        shapes = orjson.dumps(table["shape"]).decode()[2:-2].split("],[")
        row = '{"module":"%s","name":"%s","dtype":"%s","shape":[%s],"bytes":%d,"file":"%s"}'
        rows = map(row.__mod__, zip(strings["module"], strings["name"], strings["dtype"], shapes, table["bytes"],
                                    strings["file"]))
        out.write(_json_text(",".join(islice(rows, CHUNK_LINES))))
        while chunk := ",".join(islice(rows, CHUNK_LINES)):
            out.write("," + _json_text(chunk))
    out.write(f'],"total_bytes":{sum(table["bytes"])}}}\n')


def _json_strings(texts: list[str]) -> list[str]:
    """Each text as orjson writes it inside a JSON string (quotes left off): the column written as one
    JSON list, cut where one string ends and the next begins (a quote, a comma, a quote: inside a string
    a quote is always escaped, so that is never inside one)."""
    import orjson

    distinct = dict.fromkeys(texts)
    if len(distinct) * 4 < len(texts):  # mostly repeats (modules, dtypes, files): each distinct one once
        escaped = dict(zip(distinct, orjson.dumps(list(distinct)).decode()[2:-2].split('","')))
        return list(map(escaped.__getitem__, texts))
    return orjson.dumps(texts).decode()[2:-2].split('","')


def _printable(texts) -> bool:
    """Whether every character of every text is printable: for ASCII, one pass over the bytes in C
    (str.isprintable looks each character up in Unicode's tables, 14 ms for 10^5 tensor names)."""
    text = "".join(texts)
    if text.isascii():
        return not text.encode("ascii").translate(None, _PRINTABLE_ASCII)
    return text.isprintable()


_PRINTABLE_ASCII = bytes(range(0x20, 0x7f))


# what makes a spreadsheet read a cell as a formula (=HYPERLINK(...), +cmd|..., @SUM(...), -1+...)
_FORMULA_START = ("=", "+", "-", "@", "|")


def _csv_cell(text: str) -> str:
    """A cell a spreadsheet or terminal shows as the text it is: control characters escaped as in the
    text output (`_safe`), and a formula's first character behind a quote, as spreadsheets themselves
    write literal text."""
    text = _safe(text)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _json_text(text: str) -> str:
    """JSON text as orjson writes it with every character that is not printable (a right-to-left
    override, a zero-width space, a line separator) written as its \\u escape, as the standard encoder
    writes them: the same data to a JSON reader, and nothing a terminal or editor reorders or hides.
    (orjson writes them raw, but escapes every character below 0x20 itself: in ASCII text only DEL can
    be left, found by one search in C.)"""
    if text.isascii() and "\x7f" not in text or text.isprintable():
        return text
    import re

    return re.sub(r"[^\x20-\x7e]", lambda m: m[0] if m[0].isprintable() else json.dumps(m[0])[1:-1], text)


def _csv(columns: list[list], header: list[str], out) -> None:
    """Columns as CSV. Joined directly when no cell holds a comma, quote or line break (for 10^5
    rows a fifth of csv.writer's time); otherwise csv.writer, which quotes what needs it. A cell that
    holds a control character or starts like a formula goes through `_csv_cell` first."""
    columns = [c if not c or type(c[0]) is str else list(map({v: str(v) for v in set(c)}.__getitem__, c))
               for c in columns]
    text = "\0".join(chain.from_iterable(columns))
    separators = sum(map(len, columns)) - 1  # a NUL inside a cell is one more than these
    if text.isascii():  # printable: one pass over the bytes in C (str.isprintable takes 2-3 times as long)
        printable = not text.encode("ascii").translate(None, _PRINTABLE_ASCII + b"\0")
    else:
        printable = text.replace("\0", "").isprintable()
    if (not printable or text.count("\0") > separators
            or any(text.startswith(s) or f"\0{s}" in text for s in _FORMULA_START)):
        columns = [list(map(_csv_cell, c)) for c in columns]
        text = "\0".join(chain.from_iterable(columns))
    if any(ch in text for ch in ',"\r\n'):
        import csv

        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(zip(*columns))
        return
    rows = map(",".join, zip(*columns))
    out.write(",".join(header) + "\n")
    while chunk := "\n".join(islice(rows, CHUNK_LINES)):
        out.write(chunk + "\n")


def _releases(specs):
    """--engine's words as EngineRelease values, resolved once here, where they enter (one spec, a list of
    them, or None); the serving commands resolve theirs with their backend's default (`_serving_engine`)."""
    from .engines import resolve_engine

    if specs is None:
        return None
    return [resolve_engine(s) for s in specs] if isinstance(specs, list) else resolve_engine(specs)


def cmd_check(args, out) -> int:
    from .diagnose import check
    from .tables import shape_texts

    report = check(args.path, _releases(args.engine), loader=args.loader, target=args.target,
                   predict=_prediction(args))
    warned = any(f.severity == "warning" for f in report.findings)
    status = EXIT_FINDINGS if report.errors or (args.strict and warned) else EXIT_OK
    if args.format == "json":
        json.dump(report.to_dict(), out, indent=1)
        out.write("\n")
        return status
    out.write(f"{report.engine} ({report.loader} loader) on {_safe(report.path)}\n")
    if report.loader_detail:
        out.write(f"loader: {_safe(report.loader_detail)}\n")
    out.write(f"layout: {report.layout.name}; config: {report.config_format}\n\n")
    shapes = shape_texts([p.shape for p in report.params])
    _table([(p.name, p.status, shape, ", ".join(p.keys) or "-") for p, shape in zip(report.params, shapes)],
           ["parameter", "status", "shape", "written by"], out)
    out.write("\n")
    _table([(k.key, k.status, (k.param + (f" [{k.shard}]" if k.shard else "")) if k.param else k.reason)
            for k in report.keys], ["key", "status", "goes to"], out)
    out.write("\n")
    rows = report.loading_report()  # the same rows notebook 02 shows
    if rows:
        _table([tuple(r.values()) for r in rows], list(rows[0]), out)
        out.write("\n")
    for f in report.findings:
        out.write(f.line(_safe) + "\n")
    out.write(f"\nverdict: {_safe(report.verdict)}\n")
    return status


def cmd_fix(args, out) -> int:
    from dataclasses import asdict

    from .findings import CODES
    from .fix import NOTHING_TO_CHANGE, FixBlocked, apply_fix, plan_fix
    from .tables import human_bytes

    # writing, the plan is judged (`check` on the result: values, replay, prediction) while the copy is written
    plan = plan_fix(args.path, _releases(args.engine), target=args.target, loader=args.loader,
                    head_from_target=args.head_from_target, predict=_prediction(args),
                    judge=args.plan or args.out is None)
    if args.plan:
        refused = plan.refusal(args.allow_lossy)
        if args.format == "json":
            json.dump(plan.to_dict() | {"refused": [f.code for f in refused.findings] if refused else []}, out, indent=1)
            out.write("\n")
        else:
            _print_plan(plan, out, skip=refused.findings if refused else ())
            if refused:
                _print_refusal(refused, out)
        return EXIT_FINDINGS if refused else EXIT_OK
    if args.out is None:
        raise _UsageError("fix needs --out DST (or --plan to only show the plan)")
    bar = None
    if plan.bytes_to_copy >= PROGRESS_MIN_BYTES and sys.stderr.isatty():  # tqdm's own rule; its import costs 60 ms
        from tqdm import tqdm

        bar = tqdm(total=plan.bytes_to_copy, unit="B", unit_scale=True, desc="copying", file=sys.stderr, leave=False)
    try:
        result = apply_fix(plan, args.out, force=args.force, allow_lossy=args.allow_lossy,
                           progress=bar.update if bar else None)
    except FixBlocked as e:
        if args.format == "json":
            json.dump({"src": str(plan.src), "engine": plan.engine.spec, "ok": False, "written": False,
                       "refused": [asdict(f) | {"remedy": CODES[f.code].remedy} for f in e.findings],
                       "verdict": plan.predicted.verdict}, out, indent=1)
            out.write("\n")
        else:
            _print_refusal(e, out)
        return EXIT_FINDINGS
    finally:
        if bar:
            bar.close()
    status = EXIT_OK if result.ok else EXIT_FINDINGS
    if args.format == "json":
        json.dump(result.to_dict(), out, indent=1)
        out.write("\n")
        return status
    v = result.verification
    if result.ok:
        out.write(f"wrote {_safe(result.dst)} for {plan.engine}: {result.tensors_renamed} tensors renamed, "
                  f"{result.tensors_copied} copied ({human_bytes(result.bytes_copied)}, {result.copy_method}), "
                  f"{len(plan.config.changes)} config changes, {result.files_copied} other files, "
                  f"{result.seconds:.2f} s\n")
        out.write(f"verified: headers re-read, {v.tensors_checked} tensors' bytes compared equal to the source, "
                  f"then checked as `draftdoctor check --engine {plan.engine.spec}"
                  f"{' --target ' + _safe(args.target) if args.target else ''}` would\n")
        shown = [f for f in plan.findings if f.code in ("config-defaulted", "lossy-config")] + v.coverage.findings
        for f in shown:
            if f.severity != "info" or f.code == "not-checked":
                out.write(f.line(_safe) + "\n")
        if v.accepted_losses and v.coverage.errors:
            out.write(f"accepted with --allow-lossy: {', '.join(sorted({f.code for f in v.coverage.errors}))}\n")
        if plan.changes_nothing:
            out.write(NOTHING_TO_CHANGE.format(engine=plan.engine) + "\n")
        out.write(f"verdict: {_safe(v.coverage.verdict)}\n")
        return status
    out.write(f"verification failed; nothing written to {_safe(result.dst)}:\n")
    for problem in v.problems:
        out.write(f"  {_safe(problem)}\n")
    return status


def _print_refusal(refused, out) -> None:
    """Why fix writes nothing: each error finding the result would carry, and what the user can do."""
    from .findings import CODES

    out.write(f"refused: nothing written. The fixed checkpoint would still carry {len(refused.findings)} "
              f"finding(s) for {refused.plan.engine} that stop it:\n")
    for f in refused.findings:
        out.write(f"{f.line(_safe)}\n        what you can do: {CODES[f.code].remedy}\n")
    if refused.plan.lossy and not refused.plan.blocking:
        out.write("pass --allow-lossy to write it anyway (the loss is then yours to accept)\n")
    out.write(f"verdict (check on the result): {_safe(refused.plan.predicted.verdict)}\n")


PROGRESS_MIN_BYTES = 256 << 20


def _print_plan(plan, out, skip=()) -> None:
    from .fix import NOTHING_TO_CHANGE

    out.write(f"fix plan: {_safe(plan.src)} for {plan.engine}\n")
    out.write(f"layout: {plan.layout.name}; rule: {plan.rule}\n\n")
    _table([(t.old, t.new if t.new is not None else "(left out)", t.reason) for t in plan.tensors],
           ["tensor", "becomes", "why"], out)
    out.write(f"\nconfig.json ({plan.config.format}):\n")
    for c in plan.config.changes:
        moved = f" (now {c.moved_to})" if c.moved_to else ""
        out.write(_safe(f"  {c.field}: {_short(c.before)} -> {_short(c.after)}{moved}: {c.reason}") + "\n")
    if not plan.config.changes:
        out.write("  unchanged\n")
    for f in plan.files:
        out.write(f"file {_safe(f.name)}: {f.reason}\n")
    out.write(f"\n{len(plan.renamed)} renamed, {len(plan.tensors) - len(plan.renamed) - len(plan.omitted)} kept, "
              f"{len(plan.omitted)} left out; {plan.bytes_to_copy:,} bytes to copy\n")
    for f in plan.findings:
        if f not in skip:
            out.write(f.line(_safe) + "\n")
    if not skip:
        out.write(f"predicted: {_safe(plan.predicted.verdict)}\n")
    if plan.changes_nothing:
        out.write(NOTHING_TO_CHANGE.format(engine=plan.engine) + "\n")


def _number(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _short(value, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[:width - 3] + "..."


class _UsageError(UserError):
    pass


def _serve_config(args):
    from .serving.launcher import ServeConfig

    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    return ServeConfig(target=args.target, draft=args.draft, algorithm=args.speculative_algorithm,
                       num_steps=args.num_steps, topk=args.topk,
                       num_draft_tokens=args.num_draft_tokens or args.num_steps + 1,
                       host=args.host, port=args.port or 0, tp_size=args.tp_size,
                       dp_size=args.dp_size, nnodes=args.nnodes, node_rank=args.node_rank,
                       dist_init_addr=args.dist_init_addr, disable_cuda_graph=args.disable_cuda_graph,
                       extra_args=extra, guard=args.guard)


def _serving_engine(args):
    """(EngineRelease or None, label): the release served (sglang: --engine, else the installed one; vllm:
    --engine, else the tested one) or emulated (reference: --engine, else the default), decided here
    once for serve and bench, by the backend's module."""
    from .serving.launcher import backend_module

    if args.guard and BACKENDS[args.backend].guard is None:
        offered = ", ".join(name for name, row in BACKENDS.items() if row.guard)
        raise _UsageError(f"--guard: the guard runs inside an engine's own server process (--backend {offered}); "
                          f"{BACKENDS[args.backend].display} is not one")
    module = backend_module(args.backend)
    engine = module.resolve(args.engine)
    return engine, module.backend_label(engine)


def cmd_serve(args, out) -> int:
    import time

    from .serving.launcher import GuardStopped, serve

    from pathlib import Path

    if args.dry_run:
        return _serve_dry_run(args, out)
    if Path(args.log).is_dir():
        raise _UsageError(f"--log {args.log}: is a folder; give a file name")
    try:
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        with open(args.log, "ab"):
            pass
    except OSError as e:
        raise _UsageError(f"--log {args.log}: cannot write there ({e.strerror or e})") from None
    config = _serve_config(args)
    engine, label = _serving_engine(args)
    exposed = _beyond_loopback(args.host)
    if exposed:
        sys.stderr.write(f"draftdoctor: warning: --host {_safe(args.host)} listens on {exposed}: anyone who can reach "
                         "this machine there can send the server requests"
                         + (f" ({BACKENDS[args.backend].display} asks for no authentication)"
                            if not BACKENDS[args.backend].authenticated else "")
                         + "; the kit's default is 127.0.0.1\n")
    sys.stderr.write(f"starting {label}; log: {args.log}\n")
    try:
        server = serve(args.backend, config, args.log, engine=engine, loader=args.loader,
                       ready_timeout=args.ready_timeout, hang_timeout=args.hang_timeout)
    except GuardStopped as e:  # a finding about the draft, not a usage error
        sys.stderr.write("".join(f"draftdoctor: {_safe(line)}\n" if i == 0 else f"{_safe(line)}\n"
                                 for i, line in enumerate(str(e).splitlines())))
        return EXIT_FINDINGS
    try:
        out.write(f"{label} ready at {server.base_url} (Ctrl-C stops it)\n")
        out.flush()
        while server.process.poll() is None:
            time.sleep(0.5)
        sys.stderr.write(f"draftdoctor: the server exited (status {server.process.returncode}); see {args.log}\n")
        return EXIT_FINDINGS
    finally:
        server.stop()


def _serve_dry_run(args, out) -> int:
    """The command `serve` would run; for real SGLang, that release's own parser and checks on it:
    exit 0 accepted, 1 refused (SGLang's words)."""
    import shlex

    from .serving.launcher import dry_run

    engine, label = _serving_engine(args)
    checked = dry_run(args.backend, _serve_config(args), engine=engine, loader=args.loader)
    out.write(f"{label}: {_safe(shlex.join(checked.command))}\n")
    if args.port is None:
        out.write(f"(serve picks a free port in place of {checked.command[checked.command.index('--port') + 1]})\n"
                  if "--port" in checked.command else "")
    verdict = checked.verdict
    if verdict is None:
        out.write(f"not checked by an engine's parser: only --backend sglang's command is (SGLang's own, on CPU)\n")
        return EXIT_OK
    for note in verdict["notes"]:
        out.write(f"  SGLang {checked.release} says: {_safe(note.strip())}\n")
    if verdict["accepted"]:
        out.write(f"accepted by SGLang {checked.release}'s own parser and argument checks (device {verdict['device']}; "
                  "what needs a GPU, its memory and CUDA graphs, is not checked here)\n")
        return EXIT_OK
    out.write(f"refused by SGLang {checked.release}'s own {verdict['stage']}: {_safe(verdict['message'])}\n")
    return EXIT_FINDINGS


def _draft_pairs(values) -> list[tuple[str, str]]:
    from .runs import safe_name

    pairs = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise _UsageError(f"--draft expects NAME=PATH, got {value!r}")
        if not safe_name(name):
            raise _UsageError(f"--draft NAME {name!r} must be a plain file name (letters, digits, . _ -; not . or ..): "
                              "it names the server log under --out")
        pairs.append((name, path))
    if len({n for n, _ in pairs}) != len(pairs):
        raise _UsageError("--draft names must differ")
    return pairs


def cmd_bench(args, out) -> int:
    from .serving.bench import DEMO_PROMPTS, BenchFailed, DraftMisfit, bench_drafts, load_prompts
    from .serving.launcher import ServerError

    from pathlib import Path

    drafts = _draft_pairs(args.draft)
    _writable_folder(args.out, "--out")
    for path in [args.target] + [p for _, p in drafts]:
        if not Path(path).exists() and BACKENDS[args.backend].runs_here:  # a GPU host's SGLang may name a hub id
            raise _UsageError(f"{path}: no such file or folder")
    engine, label = _serving_engine(args)
    prompts = load_prompts(args.prompts or DEMO_PROMPTS, limit=args.num_prompts)

    requests = RequestProgress(label, sys.stderr)

    def progress(message):
        requests.close()
        sys.stderr.write(f"[{label}] {message}\n")

    try:
        runs = bench_drafts(args.backend, args.target, drafts, args.out, prompts, engine=engine, loader=args.loader,
                            num_steps=args.num_steps, max_new_tokens=args.max_new_tokens, concurrency=args.concurrency,
                            extra_args=args.extra[1:] if args.extra[:1] == ["--"] else args.extra, progress=progress,
                            ready_timeout=args.ready_timeout, hang_timeout=args.hang_timeout,
                            prompts_file=args.prompts or DEMO_PROMPTS, on_request=requests, guard=args.guard)
    except DraftMisfit as e:
        sys.stderr.write(f"draftdoctor: not launched: {_safe(e)}\n")
        return EXIT_FINDINGS
    except BenchFailed as e:
        sys.stderr.write(f"draftdoctor: measurement failed: {_safe(e)}\n")
        return EXIT_FINDINGS
    except ServerError as e:  # a server that did not come up: a failed measurement, its log's last lines as lines
        sys.stderr.write(f"draftdoctor: measurement failed: {_safe(str(e).splitlines()[0])}\n")
        for line in e.log_tail[-12:]:
            sys.stderr.write(f"    {_safe(line)}\n")
        return EXIT_FINDINGS
    _table([(r.result.name, _number(r.result.accept_length),
             _number(r.predicted.accept_length) if r.predicted else "-", _number(r.result.accept_rate),
             _number(r.result.tokens_per_s, 1), len(r.result.requests)) for r in runs],
           ["draft", "accept length", "predicted", "strict accept rate", "tokens/s", "requests"], out)
    out.write("\n")
    notes = []
    for r in runs:  # what each number means, read with check's verdict on the same draft; a shared remark once
        line, note = r.explained()
        out.write(f"{_safe(r.result.name)}: {_safe(line)}\n")
        if note and note not in notes:
            notes.append(note)
    out.write("".join(f"\n{_safe(note)}\n" for note in notes))
    out.write(f"\n{label}; results: {args.out}/results.json, charts: acceptance.png, per_position.png, throughput.png\n")
    return EXIT_OK


def cmd_compare(args, out) -> int:
    from .compare import SAME_BYTES, compare

    result = compare(args.a, args.b, _releases(args.engine), args.target)
    status = EXIT_OK if result.same else EXIT_FINDINGS
    if args.format == "json":
        json.dump(result.to_dict(), out, indent=1)
        out.write("\n")
        return status
    shown = [p for p in result.pairs if args.all or p.status != SAME_BYTES or p.collision]
    if shown:
        _table([(p.status.upper(), p.a or "-", p.b or "-", p.paired_by or "-",
                 f"{p.dtype_a or '-'}/{p.dtype_b or '-'}",
                 "-" if p.max_abs_diff is None else f"{p.max_abs_diff:.3g}", "-" if p.rel_l2 is None else f"{p.rel_l2:.3g}",
                 p.relation.upper() or "-", "; ".join(filter(None, (p.detail, p.collision))) or "-") for p in shown],
               ["status", "A", "B", "paired by", "dtypes", "max abs diff", "rel L2", "relation", "detail"], out)
        out.write("\n")
    counts = ", ".join(f"{n} {status}" for status, n in result.counts().items() if n)
    out.write(f"A = {_safe(args.a)}, B = {_safe(args.b)}: {counts or 'no tensors'}"
              + ("" if args.all or not result.counts()[SAME_BYTES] else " (same-bytes pairs not listed; --all lists them)")
              + "\n")
    _compare_configs_text(result.configs, out)
    out.write("verdict: " + _compare_verdict(result) + "\n")
    return status


def _compare_configs_text(configs, out) -> None:
    """The configs by meaning: one line per release range (or as written), what differs, what was not compared."""
    from .meanings import DIFFERENT, READS_ONE, SAME

    target = (f"a {configs.target_layers}-layer target" if configs.target_layers
              else "the target's layer count unknown: --target gives it")
    out.write(f"configs by meaning (aux layers: the target layers whose input is captured; {target})"
              + (f": {_safe(configs.note)}" if configs.note else "") + "\n")
    for row in configs.rows:
        if row.counted:
            label = DIFFERENT if row.outcome == READS_ONE else row.outcome  # one side does not load there
            what = f"same: {row.summary}" if row.outcome == SAME else f"{label.upper()}: " + "; ".join(row.differences)
        else:
            what = "not compared: " + "; ".join(row.differences)
        out.write(f"  {_safe(row.releases)}: {_safe(what)}\n")


def _compare_verdict(result) -> str:
    if result.same:
        return ("A and B hold the same tensors (bytes, dtypes, shapes)"
                + ("" if result.configs.same is None else ", and their configs mean the same"))
    why = []
    if not result.same_tensors:
        why.append(", ".join(f"{n} {status}" for status, n in result.counts().items() if n and status != "same bytes"))
    if result.configs.same is False:
        differing = result.configs.differing
        why.append("config meaning" + (f" ({', '.join(differing)})" if differing else f": {result.configs.note}"))
        if differing and result.configs.unsettled_only:
            why[-1] += ", unless the target has the layer count named above: --target settles it"
    return _safe("A and B differ: " + "; ".join(why))


def _writable_folder(folder, flag: str) -> None:
    """`folder` made (if missing) and written to once, before any work: a read-only or full file system, or
    a regular file in the way, is one line naming the flag and the place (exit 2), not a traceback later."""
    import os
    from pathlib import Path

    folder = Path(folder)
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # what the probe makes, then removes
    probe = folder / f".draftdoctor-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"x")
    except OSError as e:
        raise _UsageError(f"{flag} {folder}: cannot write there ({e.strerror or e})") from None
    finally:
        for path in (probe, *made):  # nothing stays behind: a later refusal writes nothing
            try:
                path.rmdir() if path.is_dir() else path.unlink()
            except OSError:
                pass


def cmd_investigate(args, out) -> int:
    from .investigate import investigate

    _writable_folder(args.out, "--out")
    results = investigate(args.params, args.out, cell_timeout=args.cell_timeout,
                          progress=lambda m: sys.stderr.write(f"[investigate] {m}\n"),
                          override=getattr(args, "params_override", None))
    from .report import outcome

    for r in results:
        if r.error:
            out.write(f"{r.name}: FAILED: {_safe(r.error)}\n")
            continue
        rep = r.report
        run = rep.get("before") or rep.get("after") or {}
        out.write(f"{r.name}: {_safe((rep.get('coverage_before') or {}).get('verdict'))}\n")
        for line in outcome(rep):
            out.write(f"  {_safe(line)}\n")
        if run:
            out.write(f"  measured on {_safe(run.get('backend_label') or run.get('backend'))}; report: {r.out_dir}/report.md\n")
    return EXIT_FINDINGS if any(_unresolved(r) for r in results) else EXIT_OK


class RequestProgress:
    """Each draft's answered requests: a progress bar on a terminal (tqdm); off one, a few lines (the
    first request, each quarter, the last) instead of one per request."""

    def __init__(self, label: str, stream):
        self.label, self.stream, self.bar, self.name = label, stream, None, None

    def __call__(self, name: str, done: int, total: int) -> None:
        if self.stream.isatty():
            if self.bar is None or self.name != name:
                from tqdm import tqdm

                self.close()
                self.bar = tqdm(total=total, desc=f"[{self.label}] {name}", unit="request", file=self.stream,
                                leave=False)
                self.name = name
            self.bar.update(done - self.bar.n)
            if done >= total:
                self.close()
        elif done in (1, total) or done * 4 // total > (done - 1) * 4 // total:
            self.stream.write(f"[{self.label}] {name}: {done}/{total} requests\n")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar = self.name = None


def cmd_demo(args, out) -> int:
    """The bundled demo's investigation (what `make demo` runs), from any folder: its data is package data."""
    from .investigate import load_params
    from .realload.registry import REAL_LOADERS, installed_releases
    from .toolstate import DEMO

    out.write(f"demo data (read only): {DEMO}\n")
    args.params = str(DEMO / "investigate.yaml")
    [params] = load_params(args.params)
    if params.get("loader") == "real" and params["release"] not in installed_releases(params["engine"]):
        # the demo's drafts as the release's own loader leaves them: without it here, as the kit's replay of it
        spec = f"{params['engine']}=={params['release']}"
        out.write(f"note: {spec}'s own loader is not installed here ({REAL_LOADERS[params['engine']].install_hint(params['release'])} "
                  "installs it, about a minute): the drafts are loaded as the kit's replay of it says\n")
        args.params_override = {"loader": "replay"}
    return cmd_investigate(args, out)


def cmd_loaders(args, out) -> int:
    """`loaders list`: every release with a real loader, installed or not; `loaders install E==R ...`."""
    from .realload.registry import REAL_LOADERS, installed_releases

    if args.action == "list":
        rows = []
        for name, row in REAL_LOADERS.items():
            installed, ci = set(installed_releases(name)), set(row.ci_releases)
            rows += [(name, release, "yes" if release in installed else "no", "yes" if release in ci else "",
                      row.folder(release)) for release in row.releases]
        _table(rows, ["engine", "release", "installed", "ci", "folder"], out)
        return EXIT_OK
    from .realload.install import InstallFailed, install, pin_list

    specs = []
    for spec in args.specs:
        engine, _, release = (part.strip() for part in spec.partition("=="))
        if not release:
            raise UserError(f"{spec}: name a release, e.g. sglang==0.5.10 (`draftdoctor loaders list` lists them)")
        pin_list(engine.lower(), release)  # every spec checked before anything is installed
        specs.append((engine.lower(), release))
    if not specs:
        raise UserError("loaders install: name at least one release, e.g. sglang==0.5.10")
    for engine, release in specs:
        sys.stderr.write(f"[loaders] installing {engine} {release} (pip, then its self-check)\n")
        try:
            folder, fresh = install(engine, release, waiting=lambda: sys.stderr.write(
                f"[loaders] waiting for another install of {engine} {release} to finish\n"))
        except InstallFailed as e:
            out.write(f"{engine} {release}: FAILED: {_safe(e)}\n")
            return EXIT_FINDINGS
        out.write(f"{engine} {release}: {'installed' if fresh else 'already installed'} and self-checked in {folder}\n")
    return EXIT_OK


def _unresolved(result) -> bool:
    from .report import unresolved

    return unresolved(result.report or {}, result.error)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < 1e7:
        raise ValueError(text)
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise ValueError(text)
    return value


def _beyond_loopback(host: str) -> str | None:
    """What a server bound to `host` is reachable from, when that is more than this machine: None for a
    loopback address."""
    import ipaddress
    import socket

    addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    if all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        return None
    if any(ipaddress.ip_address(a.split("%")[0]).is_unspecified for a in addresses):
        return "every network interface"
    return f"{', '.join(sorted(addresses))}, not loopback"


def _host(text: str) -> str:
    import socket

    try:
        socket.getaddrinfo(text, None)
    except (socket.gaierror, UnicodeError):
        raise argparse.ArgumentTypeError(f"cannot resolve host {text!r}") from None
    return text


for _type, _name in ((_positive_int, "whole number (>= 1)"), (_positive_seconds, "seconds (> 0)"),
                     (_port, "port (1-65535)")):
    _type.__name__ = _name  # argparse names the type in its one-line error: "invalid <name> value"


def _add_serving_arguments(p) -> None:
    p.add_argument("--backend", choices=list(BACKENDS), default="reference",
                   help="reference: CPU EAGLE-3 server emulating an SGLang release; sglang: the real "
                        "sglang.launch_server (GPU host; not run here); vllm: real vLLM on the CPU "
                        "(`make vllm-loaders` installs it); llamacpp: llama.cpp's llama-server on the CPU, the "
                        "target and drafts converted to GGUF by its own converter (`make llamacpp` builds it)")
    p.add_argument("--engine", help="an engine release: to emulate (reference; e.g. sglang==0.5.10), whose flags to "
                                    "use (sglang; default: the installed release); with --backend vllm, vllm==X.Y.Z "
                                    "picks the vLLM release that serves (default: the tested one, 0.32.0), another "
                                    "engine's release serves each draft as that release's loader leaves it")
    p.add_argument("--loader", choices=["replay", "real"], default="replay",
                   help="reference backend: how the emulated release's loader is reproduced")
    p.add_argument("--num-steps", type=_positive_int, default=4, help="--speculative-num-steps")
    p.add_argument("--guard", action="store_true",
                   help="the guard in the server's own process: it stops the server before it is ready (exit "
                        "status 1, naming the parameters) when the engine's loader leaves a draft parameter "
                        "unwritten or drops a tensor (vllm: the kit's plugin; sglang: python -m draftdoctor.guard; "
                        "docs/guard.md)")
    p.add_argument("--ready-timeout", type=_positive_seconds, default=900.0, help="seconds to wait for readiness")
    p.add_argument("--hang-timeout", type=_positive_seconds, default=300.0,
                   help="seconds without log output during start-up that count as a hang")
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="after --: SGLang flags passed through unchanged (e.g. -- --tp-size 8 --enable-metrics)")


def _inspect_arguments(p) -> None:
    p.add_argument("path", help=".safetensors file, folder, or sharded folder with model.safetensors.index.json")
    p.add_argument("--format", choices=["text", "json", "csv"], default="text")


def _check_arguments(p) -> None:
    p.add_argument("path")
    p.add_argument("--engine", required=True, help="e.g. sglang==0.5.10, sglang (newest known), vllm")
    p.add_argument("--target", help="the target model's folder (or config.json): check the draft fits it; with its "
                                    "weights, run the loaded draft on it and predict its acceptance")
    p.add_argument("--strict", action="store_true", help="warnings fail too (exit 1), e.g. for a CI gate")
    _prediction_arguments(p)
    _loader_argument(p, "real: the release's own loader on CPU (`make sglang-loaders`, `make vllm-loaders`, `make "
                        "llamacpp` install them; a warm worker answers in about a second after the first call); "
                        "replay: the engine profile (instant, every release); auto (default): real where that "
                        "release is installed, else replay. The report says which ran")
    p.add_argument("--format", choices=["text", "json"], default="text")


def _prediction_arguments(p) -> None:
    """The prediction of acceptance (`predict.PredictionSpec`): with a --target folder holding weights."""
    p.add_argument("--no-predict", action="store_true", help="names, configs and values only: do not run the draft "
                                                               "on the target (the prediction takes seconds)")
    p.add_argument("--prompts", help="prompts for the prediction (.jsonl of {\"prompt\": ...}; default: the demo's)")
    p.add_argument("--num-prompts", type=_positive_int, default=None, help="prompts the prediction runs (default 16)")
    p.add_argument("--new-tokens", type=_positive_int, default=None,
                   help="tokens of the target's continuation per prompt (default 64)")
    p.add_argument("--num-steps", type=_positive_int, default=None, help="draft tokens per verify step (default 4)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the target runs for the prediction (cuda: over the GPUs torch sees, by "
                        "transformers' device_map=auto; needs accelerate)")


def _prediction(args):
    """What the command's --target and prediction flags ask for: a PredictionSpec, or False."""
    if args.no_predict or not args.target:
        return False
    from .diagnose import prediction_spec

    spec = prediction_spec(args.target, prompts=args.prompts, num_prompts=args.num_prompts,
                           new_tokens=args.new_tokens, num_steps=args.num_steps, device=args.device)
    return spec or True


def _loader_argument(p, help_text: str) -> None:
    # diagnose.LOADERS, spelled out: importing diagnose here would slow every command's start
    p.add_argument("--loader", choices=["auto", "replay", "real"], default="auto", help=help_text)


def _fix_arguments(p) -> None:
    p.add_argument("path", metavar="SRC")
    p.add_argument("--engine", required=True, help="e.g. sglang==0.5.10, sglang (newest known), vllm")
    p.add_argument("--out", metavar="DST", help="new checkpoint folder (must not exist unless --force)")
    p.add_argument("--target", help="the target model's folder (or config.json): refuse a result that does not fit it "
                                    "(hidden size, vocabulary, aux layers the engine can capture)")
    p.add_argument("--plan", action="store_true", help="show what would change; write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing DST, once the new one is verified")
    p.add_argument("--allow-lossy", action="store_true",
                   help="write even if the engine cannot compute an option or norm the draft was trained with "
                        "(reported; such a draft serves, with lower acceptance)")
    p.add_argument("--head-from-target", action="store_true",
                   help="for a draft with no lm_head whose draft_vocab_size is the target's vocabulary: assume it was "
                        "trained with the target's head (frozen, so not saved) and write draft_vocab_size: null, so "
                        "the engine takes the target's head; refused where that cannot be right or the release "
                        "cannot do it")
    _loader_argument(p, "which loader verifies the written draft, as `check --loader` (the plan is always "
                        "replayed: it exists only as headers until written)")
    _prediction_arguments(p)
    p.add_argument("--format", choices=["text", "json"], default="text")


def _serve_arguments(p) -> None:
    p.add_argument("--model-path", dest="target", required=True, help="the target model")
    p.add_argument("--speculative-draft-model-path", dest="draft", required=True, help="the draft")
    p.add_argument("--speculative-algorithm", default="EAGLE3")
    p.add_argument("--speculative-eagle-topk", dest="topk", type=_positive_int, default=1)
    p.add_argument("--speculative-num-draft-tokens", dest="num_draft_tokens", type=_positive_int, default=None)
    p.add_argument("--host", type=_host, default="127.0.0.1")
    p.add_argument("--port", type=_port, default=None, help="default: a free port")
    for flag in ("--tp-size", "--dp-size", "--nnodes", "--node-rank"):
        p.add_argument(flag, type=int, default=None, help="passed to SGLang")
    p.add_argument("--dist-init-addr", default=None, help="passed to SGLang")
    p.add_argument("--disable-cuda-graph", action="store_true", help="spelled for the SGLang release in use")
    p.add_argument("--log", default="build/serve.log", help="the server's log file")
    p.add_argument("--dry-run", action="store_true",
                   help="print the command instead of running it; with --backend sglang, checked by that SGLang "
                        "release's own parser and argument checks, on this CPU (exit 1 if refused)")
    _add_serving_arguments(p)


def _bench_arguments(p) -> None:
    p.add_argument("--target", required=True, help="the target model")
    p.add_argument("--draft", action="append", required=True, metavar="NAME=PATH", help="a draft to measure (repeat)")
    p.add_argument("--out", required=True, help="folder for results.json, charts and server logs")
    p.add_argument("--prompts", default=None, help=".jsonl ({\"prompt\": ...}) or text lines (default: the demo's prompts)")
    p.add_argument("--num-prompts", type=_positive_int, default=None)
    p.add_argument("--max-new-tokens", type=_positive_int, default=48)
    p.add_argument("--concurrency", type=_positive_int, default=1)
    _add_serving_arguments(p)


def _compare_arguments(p) -> None:
    p.add_argument("a", metavar="A", help="a checkpoint (e.g. the training output)")
    p.add_argument("b", metavar="B", help="another (e.g. the converted, fixed or served copy, or the target)")
    p.add_argument("--engine", action="append", metavar="SPEC",
                   help="compare the configs by what this release does with each (repeat for more; e.g. "
                        "sglang==0.5.10). Default: every release whose engine reads both configs")
    p.add_argument("--target", help="the target model's folder (or config.json): its layer count settles which "
                                    "layers an engine's default aux ids capture")
    p.add_argument("--all", action="store_true", help="list the pairs holding the same bytes too")
    p.add_argument("--format", choices=["text", "json"], default="text")


def _investigate_arguments(p) -> None:
    p.add_argument("--params", required=True, help="YAML: checkpoint (or checkpoints: [...]), engine, release, ...")
    p.add_argument("--out", required=True, help="run folder, e.g. runs/NAME")
    p.add_argument("--cell-timeout", type=float, default=900.0)


def _loaders_arguments(p) -> None:
    p.add_argument("action", choices=["list", "install"])
    p.add_argument("specs", nargs="*", metavar="ENGINE==RELEASE", help="install: e.g. sglang==0.5.10 vllm==0.32.0")


def _demo_arguments(p) -> None:
    p.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo)")
    p.add_argument("--cell-timeout", type=float, default=900.0)


# name: (help, arguments, run)
COMMANDS = {
    "inspect": ("list a checkpoint's tensors from its headers alone", _inspect_arguments, cmd_inspect),
    "check": ("what an engine's loader would write, skip, or leave at init", _check_arguments, cmd_check),
    "fix": ("rewrite a draft so an engine loads every tensor, verified; SRC is never modified", _fix_arguments,
            cmd_fix),
    "compare": ("pair two checkpoints' tensors by name, parts or content, say how each pair differs, and compare "
                "the configs by meaning; exit 1 if they differ", _compare_arguments, cmd_compare),
    "serve": ("start a speculative-decoding server and wait until it is ready", _serve_arguments, cmd_serve),
    "bench": ("serve each draft in turn, measure acceptance, write results.json and charts", _bench_arguments,
              cmd_bench),
    "investigate": ("run the five notebooks with papermill and write report.md/report.json", _investigate_arguments,
                    cmd_investigate),
    "loaders": ("list the engine releases whose real loader the kit runs, or install some (pinned, self-checked)",
                _loaders_arguments, cmd_loaders),
    "demo": ("investigate the bundled demo draft end to end (what `make demo` runs), from any folder", _demo_arguments,
             cmd_demo),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with `command`, only that sub-command's (all of them take 5 ms to
    build, a tenth of a short command's run)."""
    parser = _Parser(prog="draftdoctor", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        if command in (None, name):
            p = sub.add_parser(name, help=help_text)
            add_arguments(p)
            p.set_defaults(run=run)
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so every server started is stopped on the way out."""


def _terminate(signum, frame):
    raise _Terminated(signum)


def _handle_signals() -> None:
    """SIGTERM and SIGHUP unwind as Ctrl-C (SIGINT) does: servers stopped, temporary folders removed. A
    signal the process started with ignored stays ignored (`nohup` ignores SIGHUP; a shell without job
    control starts `cmd &` with SIGINT ignored), so a terminal's hang-up or Ctrl-C does not end work put
    in the background. SIGTTOU and SIGTTIN are ignored here and, inherited, in every child: work run
    outside its terminal's foreground group (under `timeout`, with `&`, by a job system) that writes to
    or sets the terminal goes on instead of stopping (it had stopped for good: timeout's SIGTERM and
    SIGCONT woke it only for it to stop again writing that it was interrupted). The kit never reads the
    terminal, and its children get no terminal as their input."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _terminate)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here, Ctrl-C unwinds (servers stopped)
    for signum in (signal.SIGTTOU, signal.SIGTTIN):
        signal.signal(signum, signal.SIG_IGN)


def main(argv=None) -> int:
    from .toolstate import keep_out_of_home

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    try:
        _handle_signals()
        keep_out_of_home()  # the build area checked before any command uses it (toolstate.trusted)
        return args.run(args, sys.stdout)
    except UserError as e:
        sys.stderr.write(f"draftdoctor: error: {_safe(e)}\n")
        return EXIT_UNUSABLE
    except KeyboardInterrupt as e:
        signum = e.args[0] if isinstance(e, _Terminated) else signal.SIGINT
        sys.stderr.write(f"draftdoctor: interrupted by {signal.Signals(signum).name} "
                         "(anything half-written was removed)\n")
        return 128 + signum
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:  # the file system refused something not caught where it happened: still one line
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"draftdoctor: error: {_safe(where)}{_safe(e.strerror or e)}\n")
        return EXIT_UNUSABLE


def entry() -> None:
    """The `draftdoctor` console script. Freezes the heap before exiting: the interpreter's final
    collections would otherwise rescan every object (5 ms of a 60 ms command, measured)."""
    status = main()
    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":
    entry()
