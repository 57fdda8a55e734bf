"""`inspect` at the speed of reading headers: the column-at-once paths agree with the entry-by-entry
ones they stand in for, on generated input, and a valid header makes no object per tensor.

The header reader checks 10^5 entries as whole columns (`headers._columns`) and hands anything odd
to the entry-by-entry validator; layouts match a regular expression once per distinct key beginning;
inspect writes its rows by one %-format each and its JSON strings by one orjson call per column.
"""

import io
import json
import random
import struct

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from draftdoctor import cli, tables
from draftdoctor.cli import inspect as inspect_command, render
from draftdoctor.beginnings import each_beginning, per_beginning
from draftdoctor.checkpoint import DTYPE_BITS, CheckpointError, open_checkpoint, read_header
from draftdoctor.headers import _check_packing, _tensor_info
from draftdoctor.layouts import LAYER_HEAD, layer_prefixes
from draftdoctor.synthwrite import write_shards
from draftdoctor.tables import human_bytes, module_totals, shape_texts, tensor_columns

ODD = st.one_of(st.integers(-3, 3), st.integers(2**63, 2**66), st.floats(allow_nan=False, allow_infinity=False),
                st.booleans(), st.none(), st.text(max_size=3), st.lists(st.integers(0, 4), max_size=3),
                st.dictionaries(st.text(max_size=2), st.integers(0, 2), max_size=2))


def _entry_by_entry(path):
    """The tensors the entry-by-entry validator reads, or its error."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = orjson.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    try:
        tensors = [_tensor_info(path, name, entry, 8 + n) for name, entry in header.items()]
        _check_packing(path, tensors, 8 + n, len(raw))
    except CheckpointError as e:
        return str(e)
    return tensors


@st.composite
def headers(draw):
    """A valid header of a few tensors, tiled in order, then as many odd things done to it as drawn:
    a field replaced by another JSON value, entries reordered, an offset or the data size moved, an
    extra key, a dtype whose size is not a whole byte."""
    names = draw(st.lists(st.text(min_size=1, max_size=6), min_size=0, max_size=5, unique=True))
    entries, offset = {}, 0
    for name in names:
        dtype = draw(st.sampled_from(sorted(DTYPE_BITS)))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        if len(shape) == 1 and draw(st.booleans()):
            shape.append(1)  # [n, 1] negated is [-n, -1]: the same number of elements
        bits = DTYPE_BITS[dtype]
        for d in shape:
            bits *= d
        size = bits // 8
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    data = offset
    for _ in range(draw(st.integers(0, 3))):
        if not entries:
            break
        name = draw(st.sampled_from(sorted(entries)))
        action = draw(st.sampled_from(["field", "element", "retype", "negate", "order", "offset", "data", "extra",
                                       "entry"]))
        if not isinstance(entries[name], dict) and action not in ("order", "data"):
            continue
        if action == "field":
            entries[name][draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(ODD)
        elif action == "element" and isinstance(entries[name].get("shape"), list) and entries[name]["shape"]:
            entries[name]["shape"][0] = draw(ODD)
        elif action in ("retype", "negate"):  # a number of the same value but another type, or signs that cancel
            field = draw(st.sampled_from(["shape", "data_offsets"]))
            values = entries[name].get(field)
            if isinstance(values, list) and values and all(isinstance(v, int) for v in values):
                i = draw(st.integers(0, len(values) - 1))
                if action == "negate":
                    entries[name][field] = [-v for v in values]
                else:
                    entries[name][field][i] = draw(st.sampled_from(
                        [float(values[i]), str(values[i]), [values[i]]] + ([bool(values[i])] if values[i] in (0, 1) else [])))
        elif action == "order":
            items = list(entries.items())
            random.Random(draw(st.integers(0, 99))).shuffle(items)
            entries = dict(items)
        elif action == "offset" and isinstance(entries[name].get("data_offsets"), list):
            entries[name]["data_offsets"] = [v + draw(st.integers(-2, 2)) if isinstance(v, int) else v
                                             for v in entries[name]["data_offsets"]]
        elif action == "data":
            data = max(0, data + draw(st.integers(-2, 2)))
        elif action == "extra":
            entries[name]["extra"] = draw(ODD)
        elif action == "entry":
            entries[name] = draw(ODD)
    header = ({"__metadata__": {"format": "pt"}} if draw(st.booleans()) else {}) | entries
    spaced = draw(st.booleans())  # as the standard encoder writes it, or compact
    return json.dumps(header, separators=(", ", ": ") if spaced else (",", ":")).encode(), data


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(case=headers())
def test_header_columns_agree_with_the_entry_by_entry_reader(tmp_path_factory, case):
    text, data = case
    path = tmp_path_factory.getbasetemp() / "case.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(data))
    expected = _entry_by_entry(path)
    try:
        got = read_header(path).tensors
    except CheckpointError as e:
        got = str(e)
    assert got == expected


def test_a_valid_header_makes_no_object_per_tensor(tmp_path):
    """Read from a valid file, a shard holds columns; inspect never asks for TensorInfo rows."""
    write_shards(tmp_path, {f"layers.{i}.w": ("BF16", (4, 2)) for i in range(6)}, 2)
    ckpt = open_checkpoint(tmp_path)
    assert all(shard._tensors is None for shard in ckpt.shards)
    inspect_command._inspect(cli.build_parser().parse_args(["inspect", str(tmp_path)]), io.StringIO())
    assert all(shard._tensors is None for shard in ckpt.shards) and ckpt._tensors is None
    assert [t.name for t in ckpt.tensors.values()] == ckpt.keys() == [n for s in ckpt.shards for n in s.names]
    assert ckpt.index["weight_map"] == json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]


PARTS = ["model", "layers", "midlayer", "0", "7", "12", "0123456789" * 3, "mlp", "weight", "layers0", "", "x" * 20]


@settings(max_examples=1000, deadline=None, database=None)
@given(keys=st.lists(st.lists(st.sampled_from(PARTS), min_size=1, max_size=6).map(".".join), max_size=10))
def test_layer_prefixes_agree_with_one_match_per_key(keys):
    heads = {m[0] for m in map(LAYER_HEAD.match, keys) if m}
    assert layer_prefixes(keys) == tuple(sorted(heads, key=lambda h: (int(LAYER_HEAD.match(h).group(1) or -1), h)))


@settings(max_examples=1000, deadline=None, database=None)
@given(names=st.lists(st.lists(st.sampled_from(PARTS + ["a\nb", "model\n"]), min_size=1, max_size=6).map(".".join),
                      max_size=10))
def test_modules_agree_with_one_match_per_name(names):
    assert per_beginning(names, tables._module) == [tables.MODULE_PREFIX.match(n)[0] for n in names]
    assert each_beginning(names, tables._module) == {tables.MODULE_PREFIX.match(n)[0] for n in names}


CELL = st.text(alphabet="ab.=+-@|\0,\"\\ \x7f\x1b\u202eé", max_size=4)


@settings(max_examples=1000, deadline=None, database=None)
@given(cells=st.lists(CELL, max_size=6))
def test_formula_check_agrees_with_a_search_per_formula_character(cells):
    text = "\0".join(cells)
    assert inspect_command._starts_formula(text) == any(text.startswith(s) or f"\0{s}" in text
                                                        for s in inspect_command._FORMULA_START)


@settings(max_examples=1000, deadline=None, database=None)
@given(texts=st.one_of(st.lists(CELL, max_size=6), st.lists(st.sampled_from(["a", "b\"", "é", '",', ""]), min_size=5)))
@example(texts=['",', ''])  # an escaped quote, a comma and the next string's quote: not where one string ends
@example(texts=['é', 'a","b', '\\', '"'])
@example(texts=['é'] * 5 + ['",'] * 3)
@example(texts=[])
def test_json_strings_are_what_orjson_writes_of_each(texts):
    assert inspect_command._json_strings(texts) == [orjson.dumps(t).decode()[1:-1] for t in texts]


@settings(max_examples=1000, deadline=None, database=None)
@given(modules=st.lists(st.sampled_from(["a", "b", "c", "model.layers.1"]), max_size=30))
def test_grouping_by_runs_is_a_stable_sort_by_first_appearance(modules):
    rank = {module: i for i, module in enumerate(dict.fromkeys(modules))}
    order = sorted(range(len(modules)), key=lambda i: rank[modules[i]])
    assert tables.grouped({"module": modules, "row": list(range(len(modules)))}) == {
        "module": [modules[i] for i in order], "row": order}


def test_shape_texts_of_anything_else_are_each_shape_joined():
    assert shape_texts([(2, 4), (), (1,)]) == ["2x4", "", "1"]
    assert shape_texts([(-1, 2), ("a",), (2, 4)]) == ["-1x2", "a", "2x4"]


NAMES = ['plain.weight', 'a","b', 'ends in a backslash\\', 'quote"', "tab\there", "\u202eright-to-left", "\x7fdel",
         "é.weight", "layers.0.fc.weight", "=formula", "z" * 40]


@pytest.fixture
def hostile(tmp_path):
    tensors = {name: ("F16", (i + 1, 2)) for i, name in enumerate(NAMES)} | {"scale": ("F32", ())}
    write_shards(tmp_path, tensors, 3)
    return tmp_path


@pytest.mark.parametrize("chunk", [1, 3, 1 << 14])
def test_json_rows_are_the_table(hostile, chunk, monkeypatch):
    monkeypatch.setattr(inspect_command, "CHUNK_LINES", chunk)
    out = io.StringIO()
    inspect_command._inspect(cli.build_parser().parse_args(["inspect", str(hostile), "--format", "json"]), out)
    doc = json.loads(out.getvalue())
    table = tensor_columns(open_checkpoint(hostile))
    assert doc["tensors"] == [dict(zip(table, (m, n, d, list(s), b, f))) for m, n, d, s, b, f in zip(*table.values())]
    assert doc["total_bytes"] == sum(table["bytes"]) and out.getvalue().isascii() or "é" in out.getvalue()
    assert all(line.isprintable() for line in out.getvalue().splitlines())


@pytest.mark.parametrize("chunk", [1, 3, 1 << 14])
def test_text_is_the_table_in_aligned_columns(hostile, chunk, monkeypatch):
    """The rows as `render.text_columns` lays out any table (header, a line per module, then its tensors)."""
    monkeypatch.setattr(inspect_command, "CHUNK_LINES", chunk)
    out = io.StringIO()
    inspect_command._inspect(cli.build_parser().parse_args(["inspect", str(hostile)]), out)
    table = tensor_columns(open_checkpoint(hostile))
    cells, start = [[], [], [], [], []], 0
    shapes = [s or "scalar" for s in shape_texts(table["shape"])]
    for module, count, size in module_totals(table):
        rows = [(f"[{module}]", "", f"{count} tensors", human_bytes(size), "")]
        rows += [("  " + n, d, s, human_bytes(b), f) for n, d, s, b, f in zip(
            *(column[start:start + count] for column in (table["name"], table["dtype"], shapes, table["bytes"],
                                                           table["file"])))]
        for row in rows:
            for column, cell in zip(cells, row):
                column.append(cell)
        start += count
    expected = io.StringIO()
    render.text_columns(cells, ["name", "dtype", "shape", "bytes", "file"], expected)
    assert out.getvalue().startswith(expected.getvalue()) and "\n12 tensors," in out.getvalue()


def test_heads_of_one_layer_come_in_one_order_in_every_process():
    """`midlayer.` and `model.midlayer.` are one layer: their order was a set's, so it changed with the hash seed
    of the process (inspect's text and a layout's evidence with it); now it is by name in every process."""
    import os
    import subprocess
    import sys

    code = ("from draftdoctor.layouts import layer_prefixes; "
            "print(layer_prefixes(['model.midlayer.x', 'midlayer.model', 'model.layers.2.a', 'layers.2.b']))")
    seen = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(seed)},
                           capture_output=True, text=True, check=True).stdout for seed in range(16)}
    assert seen == {"('midlayer.', 'model.midlayer.', 'layers.2.', 'model.layers.2.')\n"}


@pytest.mark.parametrize("shards", [1, 3])
def test_json_output_keeps_names_that_hold_quotes_and_commas(tmp_path, shards):
    """`inspect --format json` on tensors named with a quote and a comma (a hostile checkpoint's names): the
    output parses and names each tensor as its header does (it had cut one name in two at its escaped quote)."""
    import subprocess
    import sys

    names = ['a",', "", 'b","c', "\\", 'é"', "plain"] + [f"x{i}" for i in range(30)]
    tensors = {name: ("F32", (2,)) for name in names}
    write_shards(tmp_path, tensors, shards)
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "inspect", str(tmp_path), "--format", "json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(t["name"] for t in json.loads(proc.stdout)["tensors"]) == sorted(names)
