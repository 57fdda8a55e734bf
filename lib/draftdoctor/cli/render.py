"""What every command's text output shares: control characters escaped, tables as aligned columns,
numbers and values shortened for a line."""

from __future__ import annotations

import json
from itertools import repeat


def safe(text) -> str:
    """`text` with its control characters escaped (a newline as \\n, ESC as \\x1b, ...): a tensor
    name, a path or a config value cannot forge an output line or drive the terminal."""
    text = str(text)
    return text if text.isprintable() else "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def table(rows, columns: list[str], out) -> None:
    """Rows (sequences of cells in `columns` order) as left-aligned text columns under a header."""
    text_columns([list(map(str, column)) for column in zip(*rows)] or [[] for _ in columns], columns, out)


def text_columns(cells: list[list[str]], columns: list[str], out) -> None:
    """Columns of text cells, left-aligned under upper-case headers. Column by column, so that
    10^5 rows (inspect) take milliseconds, not tenths of a second."""
    cells = [[header.upper(), *(column if " ".join(column).isprintable() else map(safe, column))]
             for header, column in zip(columns, cells)]
    padded = [list(map(str.ljust, column, repeat(max(map(len, column))))) for column in cells[:-1]]
    out.write("\n".join(map(str.rstrip, map("  ".join, zip(*padded, cells[-1])))) + "\n")


def number(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def short(value, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def write_json(doc, out) -> None:
    """`doc` as the commands' JSON output: indented by one, one line at the end."""
    json.dump(doc, out, indent=1)
    out.write("\n")
