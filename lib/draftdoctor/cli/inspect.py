"""`draftdoctor inspect`: a checkpoint's tensors from its headers alone, as text, JSON or CSV.

A Kimi-class checkpoint has 10^5 tensors, and every Python-level pass over them costs milliseconds:
rows are made by one %-format each, cells that repeat are made once each, and the output is written
CHUNK_LINES rows at a time (no 20 MB string, no 20 MB encoding).
"""

from __future__ import annotations

import csv
import json
import re
from itertools import chain, islice

import orjson

from ..checkpoint import gc_paused, open_checkpoint
from ..exits import EXIT_OK
from ..layouts import detect_layout
from ..provenance import recognise
from ..tables import human_bytes, module_totals, shape_texts, tensor_columns
from .render import safe

CHUNK_LINES = 1 << 14  # inspect writes its 10^5 rows this many at a time: no 20 MB string, no 20 MB encoding


def arguments(p) -> None:
    p.add_argument("path", help=".safetensors file, folder, or sharded folder with model.safetensors.index.json")
    p.add_argument("--format", choices=["text", "json", "csv"], default="text")


def run(args, out) -> int:
    with gc_paused():  # 10^5 tensors: millions of live objects the cyclic GC would rescan many times
        return _inspect(args, out)


def _inspect(args, out) -> int:
    """The tensor table in each format. A Kimi-class checkpoint has 10^5 tensors, and every Python-level
    pass over them costs milliseconds: rows are made by one %-format each (the column widths in the
    format), cells that repeat (dtypes, shapes, sizes, files) are made once each, and JSON strings
    are escaped by one orjson call per column."""
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
        names = list(map(safe, names))
    size_text = {size: human_bytes(size) for size in set(sizes)}
    if "" in shapes:
        shapes = list(map({"": "scalar"}.get, shapes, shapes))
    file_text = {f: safe(f) for f in set(files)}
    if any(text != f for f, text in file_text.items()):
        files = list(map(file_text.__getitem__, files))
    lines = [(f"[{safe(module)}]", "", f"{count} tensors", human_bytes(size), "") for module, count, size in totals]
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
    out.write(f"layout: {layout.name}\n" + "".join(f"  - {safe(e)}\n" for e in layout.evidence))
    out.write(f"draft: {found.architecture}, written by {found.trainer}, as far as this evidence shows:\n"
              + "".join(f"  - {safe(e)}\n" for e in found.evidence))
    return EXIT_OK


def _inspect_json(ckpt, table: dict, layout, found, out) -> None:
    """inspect's JSON: what orjson writes for the whole document (then `_json_text`), the tensor rows
    written by one %-format per row from columns orjson escaped (one call per column, not per cell),
    and written out CHUNK_LINES rows at a time."""
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
    """Each text as orjson writes it inside a JSON string (quotes left off). Printable ASCII but for quotes
    and backslashes is written as it is, so a column of nothing else is its own (one pass over its bytes
    in C). Otherwise, where no text holds a quote, the column is written as one JSON list and cut at each
    quote-comma-quote (every quote in it then ends or starts a string); a column with a quote in a text
    (a hostile name: its escaped quote, a comma and the next string's quote would look like a cut) is
    written a text at a time. Mostly repeated columns (modules, dtypes, files) write each distinct text once."""
    text = "".join(texts)
    if text.isascii() and not text.encode("ascii").translate(None, _JSON_AS_IS):
        return texts
    distinct, quoted = dict.fromkeys(texts), '"' in text
    if len(distinct) * 4 >= len(texts):
        return _json_strings_of(texts, quoted)
    escaped = dict(zip(distinct, _json_strings_of(list(distinct), quoted)))
    return list(map(escaped.__getitem__, texts))


def _json_strings_of(texts: list[str], quoted: bool) -> list[str]:
    """`_json_strings`' two ways: a text at a time when one holds a quote, else one list cut at its seams."""
    if quoted:
        return [orjson.dumps(t).decode()[1:-1] for t in texts]
    return orjson.dumps(texts).decode()[2:-2].split('","') if texts else []


def _printable(texts) -> bool:
    """Whether every character of every text is printable: for ASCII, one pass over the bytes in C
    (str.isprintable looks each character up in Unicode's tables, 14 ms for 10^5 tensor names)."""
    text = "".join(texts)
    if text.isascii():
        return not text.encode("ascii").translate(None, _PRINTABLE_ASCII)
    return text.isprintable()


_PRINTABLE_ASCII = bytes(range(0x20, 0x7f))
_JSON_AS_IS = _PRINTABLE_ASCII.translate(None, b'"\\')  # what a JSON string holds unescaped


# what makes a spreadsheet read a cell as a formula (=HYPERLINK(...), +cmd|..., @SUM(...), -1+...)
_FORMULA_START = ("=", "+", "-", "@", "|")


def _starts_formula(text: str) -> bool:
    """Whether a cell of `text` (cells joined by NULs) starts like a formula. A character absent from the
    whole text is ruled out by one memchr-speed search each, then one search finds a NUL followed by any
    character left (15 MB of cells: 7 ms, where a search per character took 13 ms each)."""
    present = "".join(s for s in _FORMULA_START if s in text)
    return text.startswith(_FORMULA_START) or bool(present) and re.search(
        "\0[%s]" % re.escape(present), text) is not None


def _csv_cell(text: str) -> str:
    """A cell a spreadsheet or terminal shows as the text it is: control characters escaped as in the
    text output (`render.safe`), and a formula's first character behind a quote, as spreadsheets themselves
    write literal text."""
    text = safe(text)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _json_text(text: str) -> str:
    """JSON text as orjson writes it with every character that is not printable (a right-to-left
    override, a zero-width space, a line separator) written as its \\u escape, as the standard encoder
    writes them: the same data to a JSON reader, and nothing a terminal or editor reorders or hides.
    (orjson writes them raw, but escapes every character below 0x20 itself: in ASCII text only DEL can
    be left, found by one search in C.)"""
    if text.isascii() and "\x7f" not in text or text.isprintable():
        return text
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
    if not printable or text.count("\0") > separators or _starts_formula(text):
        columns = [list(map(_csv_cell, c)) for c in columns]
        text = "\0".join(chain.from_iterable(columns))
    if any(ch in text for ch in ',"\r\n'):
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(zip(*columns))
        return
    rows = map(",".join, zip(*columns))
    out.write(",".join(header) + "\n")
    while chunk := "\n".join(islice(rows, CHUNK_LINES)):
        out.write(chunk + "\n")
