"""What tensor names begin with, worked out once per distinct beginning.

A Kimi-class checkpoint has 10^5 tensor names and a few hundred distinct beginnings
('model.layers.12.'), and a regular expression per name costs tens of milliseconds. The functions
the kit asks of a name's beginning (its module, its decoder-layer prefix) read no further than its
third dot, so they are asked once per distinct first WIDTH characters that hold three dots or are
the whole name; only names whose beginning is neither are looked at further (twice as far).
"""

from __future__ import annotations

from itertools import compress
from operator import itemgetter

WIDTH = 16  # 'model.layers.12.': a target's names decided at their first three dots


def per_beginning(names: list[str], fn, width: int = WIDTH) -> list:
    """`[fn(name) for name in names]`, for an `fn` that reads no further than a name's third dot."""
    starts, values, undecided = _beginnings(names, fn, width)
    out = list(map(values.__getitem__, starts))
    if undecided:
        at = list(compress(range(len(names)), map(undecided.__contains__, starts)))
        for i, value in zip(at, per_beginning([names[i] for i in at], fn, 2 * width)):
            out[i] = value
    return out


def each_beginning(names: list[str], fn, width: int = WIDTH) -> set:
    """`{fn(name) for name in names}`, for an `fn` that reads no further than a name's third dot."""
    starts, values, undecided = _beginnings(names, fn, width)
    found = {value for start, value in values.items() if start not in undecided}
    if undecided:
        found |= each_beginning(list(compress(names, map(undecided.__contains__, starts))), fn, 2 * width)
    return found


def _beginnings(names: list[str], fn, width: int) -> tuple[list[str], dict, set[str]]:
    """Each name's first `width` characters; fn of each distinct one that decides (three dots, or the
    whole name); the ones that do not."""
    starts = list(map(itemgetter(slice(0, width)), names))
    values = dict.fromkeys(starts)
    undecided = set()
    for start in values:
        if len(start) == width and start.count(".") < 3:
            undecided.add(start)
        else:
            values[start] = fn(start)
    return starts, values, undecided
