"""`draftdoctor compare A B` (issue 30): tensors paired by name through the engines' rename rules,
by fused parts and by content, each reported as same bytes, same values in another dtype, different
values, or only on one side; exit 0 when the two hold the same values, 1 when they differ."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from draftdoctor import compare as C
from draftdoctor.checkpoint import encode_header
from draftdoctor.synth import sloppy_convert

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"


def write(path: Path, tensors: dict) -> Path:
    """A safetensors file of {name: (dtype, array)}; BF16 from float32 by rounding its top 16 bits."""
    entries, data = [], []
    for name, (dtype, values) in tensors.items():
        values = np.asarray(values)
        if dtype == "BF16":
            raw = ((values.astype(np.float32).view(np.uint32) + 0x8000) >> 16).astype(np.uint16).tobytes()
        else:
            raw = values.astype({"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64}[dtype]).tobytes()
        entries.append((name, dtype, values.shape, len(raw)))
        data.append(raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_header(entries, None) + b"".join(data))
    return path


def statuses(result) -> dict:
    return {(p.a, p.b): p.status for p in result.pairs}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "draftdoctor.cli", "compare", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_the_training_output_against_a_reinitialising_converter_lists_exactly_what_it_reinitialised(tmp_path):
    converted = sloppy_convert(DEMO / "draft-story", tmp_path / "converted", {"layers.0.": "midlayer."})
    result = C.compare(DEMO / "draft-story", converted)
    different = {(p.a, p.b) for p in result.pairs if p.status == C.DIFFERENT}
    layer = {n for n in json.loads((DEMO / "draft-story" / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (DEMO / "draft-story" / "model.safetensors").read_bytes()[:8], "little")]) if n.startswith("layers.0.")}
    assert different == {(n, "midlayer." + n[len("layers.0."):]) for n in layer}
    assert all(p.paired_by == "name" for p in result.pairs)
    assert result.counts()[C.SAME_BYTES] == 16 - len(layer) and not result.same
    proc = _cli(DEMO / "draft-story", converted)
    assert proc.returncode == 1 and proc.stdout.strip().endswith("verdict: A and B differ")
    assert proc.stdout.count("DIFFERENT VALUES") == len(layer)


def test_identical_checkpoints_exit_0(tmp_path):
    proc = _cli(DEMO / "draft-story", DEMO / "draft-speculators")  # the same tensors, another config
    assert proc.returncode == 0 and "16 same bytes" in proc.stdout and "hold the same values" in proc.stdout
    data = json.loads(_cli(DEMO / "draft-story", DEMO / "draft-story", "--format", "json").stdout)
    assert data["same"] and data["counts"]["same bytes"] == 16


def test_another_dtype_fused_parts_and_moved_tensors(tmp_path):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((8, 4)).astype(np.float32) for _ in range(3))
    gate, up = (rng.standard_normal((6, 4)).astype(np.float32) for _ in range(2))
    norm = rng.standard_normal(4).astype(np.float32)
    head = rng.standard_normal((5, 4)).astype(np.float32)
    a = write(tmp_path / "a.safetensors", {
        "layers.0.self_attn.q_proj.weight": ("F32", q), "layers.0.self_attn.k_proj.weight": ("F32", k),
        "layers.0.self_attn.v_proj.weight": ("F32", v), "layers.0.mlp.gate_proj.weight": ("F32", gate),
        "layers.0.mlp.up_proj.weight": ("F32", up), "norm.weight": ("BF16", norm), "lm_head.weight": ("F32", head),
        "only_a": ("F32", np.ones(3))})
    bf16_norm = ((norm.view(np.uint32) + 0x8000) >> 16 << 16).view(np.float32)  # the BF16 values, exactly
    b = write(tmp_path / "b.safetensors", {
        "model.midlayer.self_attn.qkv_proj.weight": ("F32", np.concatenate([q, k, v])),
        "model.midlayer.mlp.gate_up_proj.weight": ("F32", np.concatenate([gate, up * 2])),
        "model.norm.weight": ("F32", bf16_norm),  # the same values, widened
        "output.weight": ("F32", head),  # moved under another name
        "only_b": ("F64", np.zeros(2))})
    result = statuses(C.compare(a, b))
    qkv = "+".join(f"layers.0.self_attn.{p}_proj.weight" for p in "qkv")
    assert result[(qkv, "model.midlayer.self_attn.qkv_proj.weight")] == C.SAME_BYTES
    assert result[("layers.0.mlp.gate_proj.weight+layers.0.mlp.up_proj.weight",
                   "model.midlayer.mlp.gate_up_proj.weight")] == C.DIFFERENT
    assert result[("norm.weight", "model.norm.weight")] == C.SAME_VALUES
    assert result[("lm_head.weight", "output.weight")] == C.SAME_BYTES
    assert result[("only_a", None)] == C.ONLY_A and result[(None, "only_b")] == C.ONLY_B
    pair = next(p for p in C.compare(a, b).pairs if p.b == "model.midlayer.mlp.gate_up_proj.weight")
    expected = np.abs(up).max()  # up against 2 * up
    assert pair.max_abs_diff == pytest.approx(expected, rel=1e-6)
    assert pair.rel_l2 == pytest.approx(np.linalg.norm(up) / np.linalg.norm(np.concatenate([gate, up])), rel=1e-6)


def test_rounding_to_a_narrower_dtype_is_a_difference_with_its_size(tmp_path):
    values = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    a = write(tmp_path / "a.safetensors", {"w": ("F32", values)})
    b = write(tmp_path / "b.safetensors", {"w": ("BF16", values)})
    [pair] = C.compare(a, b).pairs
    assert pair.status == C.DIFFERENT and 0 < pair.rel_l2 < 2 ** -8  # BF16 keeps 8 bits of mantissa


def test_comparing_streams_in_bounded_chunks(tmp_path, monkeypatch):
    """A 64 MB pair is compared a chunk of each side at a time: no read larger than CHUNK_BYTES."""
    monkeypatch.setattr(C, "CHUNK_BYTES", 1 << 20)
    values = np.random.default_rng(2).standard_normal((4096, 4096)).astype(np.float32)
    a = write(tmp_path / "a.safetensors", {"w": ("F32", values)})
    values[-1, -1] += 1.0
    b = write(tmp_path / "b.safetensors", {"w": ("F32", values)})
    reads = []
    real = C.os.pread
    monkeypatch.setattr(C.os, "pread", lambda fd, n, off: reads.append(n) or real(fd, n, off))
    [pair] = C.compare(a, b).pairs
    assert pair.status == C.DIFFERENT and pair.max_abs_diff == pytest.approx(1.0)
    assert max(reads) <= 1 << 20
