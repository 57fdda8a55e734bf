"""The tensor table behind `inspect`: module grouping, stored order, and the CLI's text and CSV forms."""

import csv
import io

from draftdoctor import cli
from draftdoctor.cli import inspect as inspect_command
from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.synthwrite import write_shards
from draftdoctor.tables import module_totals, shape_texts, tensor_columns

TENSORS = {  # stored in this order (round-robin over shards when sharded)
    "model.embed_tokens.weight": ("BF16", (16, 8)),
    "layers.0.mlp.up_proj.weight": ("BF16", (4, 8)),
    "fc.weight": ("BF16", (8, 24)),
    "layers.0.input_layernorm.weight": ("BF16", (8,)),
    "model.layers.3.self_attn.q_proj.weight": ("F32", (8, 8)),
    "d2t": ("I64", (16,)),
    "layers.10.mlp.down_proj.weight": ("BF16", (8, 4)),
    "model.norm.weight": ("F32", (8,)),
    "lm_head.weight": ("BF16", (16, 8)),
    "scale": ("F32", ()),
    "layers.0.mlp.gate_proj.weight": ("BF16", (4, 8)),
    "weird,name \"quoted\"": ("F16", (3,)),
}


def table_of(tmp_path, shards=1, tensors=TENSORS):
    write_shards(tmp_path, tensors, shards)
    return open_checkpoint(tmp_path)


def test_modules_group_tensors_in_order_of_first_appearance_and_keep_stored_order(tmp_path):
    table = tensor_columns(table_of(tmp_path, shards=3))
    assert list(table) == ["module", "name", "dtype", "shape", "bytes", "file"]
    assert list(dict.fromkeys(table["module"])) == [  # first appearance, shard by shard
        "model.embed_tokens", "layers.0", "layers.10", "scale", "model.layers.3", "model.norm", "fc", "d2t",
        "lm_head", "weird,name \"quoted\""]
    layer0 = [n for m, n in zip(table["module"], table["name"]) if m == "layers.0"]
    assert layer0 == ["layers.0.input_layernorm.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.gate_proj.weight"]
    assert table["module"][:4] == ["model.embed_tokens", "layers.0", "layers.0", "layers.0"]  # grouped
    row = table["name"].index("model.layers.3.self_attn.q_proj.weight")
    assert (table["dtype"][row], table["shape"][row], table["bytes"][row]) == ("F32", (8, 8), 256)
    assert sorted(table["name"]) == sorted(TENSORS)
    assert module_totals(table)[:2] == [("model.embed_tokens", 1, 256), ("layers.0", 3, 144)]


def test_shape_texts():
    assert shape_texts([(), (3,), (2, 4), (2, 4)]) == ["", "3", "2x4", "2x4"]


def test_csv_quotes_what_needs_it_and_matches_the_table(tmp_path):
    ckpt = table_of(tmp_path)
    out = io.StringIO()
    inspect_command._inspect(cli.build_parser().parse_args(["inspect", str(tmp_path), "--format", "csv"]), out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    table = tensor_columns(ckpt)
    assert [r["name"] for r in rows] == table["name"] and "weird,name \"quoted\"" in table["name"]
    assert [r["shape"] for r in rows] == shape_texts(table["shape"])
    assert [int(r["bytes"]) for r in rows] == table["bytes"]


def test_csv_without_special_characters_is_plain(tmp_path):
    tensors = {k: v for k, v in TENSORS.items() if "," not in k}
    table_of(tmp_path, tensors=tensors)
    out = io.StringIO()
    inspect_command._inspect(cli.build_parser().parse_args(["inspect", str(tmp_path), "--format", "csv"]), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "module,name,dtype,shape,bytes,file"
    assert "layers.0,layers.0.mlp.up_proj.weight,BF16,4x8,64,model.safetensors" in lines
    assert "scale,scale,F32,,4,model.safetensors" in lines
    assert list(csv.reader(io.StringIO(out.getvalue())))[1:] == [line.split(",") for line in lines[1:]]


def test_text_table_aligns_columns_under_module_totals(tmp_path):
    table_of(tmp_path)
    out = io.StringIO()
    inspect_command._inspect(cli.build_parser().parse_args(["inspect", str(tmp_path)]), out)
    lines = out.getvalue().splitlines()
    header = lines[0]
    assert header.split() == ["NAME", "DTYPE", "SHAPE", "BYTES", "FILE"]
    module = next(i for i, line in enumerate(lines) if line.startswith("[layers.0]"))
    assert lines[module].split()[1:] == ["3", "tensors", "144", "B"]
    assert lines[module + 1].split() == ["layers.0.mlp.up_proj.weight", "BF16", "4x8", "64", "B", "model.safetensors"]
    scalar = next(line for line in lines if line.startswith("  scale"))
    assert scalar.split()[2] == "scalar"
    column = header.index("SHAPE")
    assert all(line[column - 2:column] == "  " for line in lines[1:module + 4])  # aligned, two spaces apart
    assert "12 tensors" in out.getvalue()
