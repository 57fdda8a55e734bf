"""`draftdoctor compare A B`: tensors paired by name through the engines' rename rules, by fused
parts and by content, each reported as identical (same bytes, dtype and shape), the same values in
another dtype or shape, different values with how they differ (transposed, rows permuted, scaled,
rounded, non-finite introduced, unrelated or a fresh initialisation), a name collision, or only on one
side; the configs compared by what each engine release does with them; exit 0 only when the two are
the same, 1 when they differ."""

import json
import shutil
import subprocess
import tracemalloc
import sys
from pathlib import Path

import numpy as np
import pytest

from draftdoctor import compare as C
from draftdoctor import relations as R
from draftdoctor import tensorbytes as T
from draftdoctor import tensordiff as D
from draftdoctor.checkpoint import encode_header
from draftdoctor.engines import all_profiles, parse_version
from draftdoctor.synth import REMOVE, edit_config, sloppy_convert

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
    different = {(p.a, p.b) for p in result.pairs if p.status == D.DIFFERENT}
    layer = {n for n in json.loads((DEMO / "draft-story" / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (DEMO / "draft-story" / "model.safetensors").read_bytes()[:8], "little")]) if n.startswith("layers.0.")}
    assert different == {(n, "midlayer." + n[len("layers.0."):]) for n in layer}
    assert all(p.paired_by == "name" for p in result.pairs)
    assert result.counts()[D.SAME_BYTES] == 16 - len(layer) and not result.same
    # how: every reinitialised tensor is named as a fresh model's values (norms: the constant 1;
    # matrices: unrelated to the trained ones, and i.i.d. noise), none of the trained ones is
    assert {p.relation for p in result.pairs if p.status == D.DIFFERENT} == {R.FRESH}
    norms = [p for p in result.pairs if p.a.endswith("norm.weight") and p.status == D.DIFFERENT]
    assert len(norms) == 3 and all("holds one value (1) everywhere" in p.detail and p.detail.startswith("B") for p in norms)
    matrices = [p for p in result.pairs if p.status == D.DIFFERENT and p not in norms]
    assert all(abs(p.correlation) < 0.05 and "B looks like a fresh initialisation" in p.detail for p in matrices)
    proc = _cli(DEMO / "draft-story", converted)
    assert proc.returncode == 1 and proc.stdout.strip().endswith("verdict: A and B differ: 10 different values")
    assert proc.stdout.count("DIFFERENT VALUES") == len(layer) == proc.stdout.count("FRESH INITIALISATION")


def test_identical_checkpoints_exit_0(tmp_path):
    copy = shutil.copytree(DEMO / "draft-story", tmp_path / "copy")
    proc = _cli(DEMO / "draft-story", copy)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "16 same bytes" in proc.stdout and "hold the same tensors (bytes, dtypes, shapes), and their configs mean " \
                                              "the same" in proc.stdout
    data = json.loads(_cli(DEMO / "draft-story", copy, "--format", "json").stdout)
    assert data["same"] and data["counts"]["same bytes"] == 16 and data["configs"]["same"]


def test_the_same_tensors_under_a_config_of_another_meaning_differ(tmp_path):
    """The demo's story draft (SGLang's flat config, eagle_config ids [0, 2, 3]) and its speculators
    twin (top-level ids [1, 3, 4]): the same bytes, and as written the same layers; but vLLM before 0.23
    reads eagle_config's ids as they are, later vLLM and llama.cpp read none there and capture their
    defaults, and SGLang cannot read the speculators config at all."""
    proc = _cli(DEMO / "draft-story", DEMO / "draft-speculators", "--target", DEMO / "target")
    assert proc.returncode == 1 and "16 same bytes" in proc.stdout
    lines = proc.stdout.splitlines()
    assert "  as written: same: aux layers [1, 3, 4], norms none, vocabularies 114/96 (target/draft)" in lines
    assert "  vllm 0.12.0–0.22.1: DIFFERENT: aux layers: A [0, 2, 3], B [1, 3, 4]" in lines
    assert "  vllm 0.23.0–0.34.0: DIFFERENT: aux layers: A [2, 3, 3], B [1, 3, 4]" in lines
    assert "  llamacpp==0.3.36: DIFFERENT: aux layers: A [2, 3, 3], B [1, 3, 4]" in lines
    sglang = "  sglang 0.4.4.post2–0.5.23: not compared: reads only A's config (B's: config-unreadable)"
    assert sglang in lines
    assert lines[-1] == "verdict: A and B differ: config meaning (vllm 0.12.0–0.22.1, vllm 0.23.0–0.34.0, llamacpp==0.3.36)"
    # asked about SGLang 0.5.10, which reads only one of the two: that is a difference there
    proc = _cli(DEMO / "draft-story", DEMO / "draft-speculators", "--engine", "sglang==0.5.10")
    assert proc.returncode == 1 and "  sglang==0.5.10: DIFFERENT: reads only A's config (B's: config-unreadable)" \
        in proc.stdout.splitlines()


def _story(tmp_path, name, **changes):
    return edit_config(shutil.copytree(DEMO / "draft-story", tmp_path / name), **changes)


def test_unshifted_aux_ids_capture_other_layers_in_sglang(tmp_path):
    """The story's converter copied speculators' top-level ids [1, 3, 4] into eagle_config unshifted:
    byte for byte the same tensors, yet SGLang captures the inputs of layers [2, 4, 5] instead of
    [1, 3, 4]. compare says so, per release range, and exits 1."""
    unshifted = _story(tmp_path, "unshifted", eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 4],
                                                             "use_aux_hidden_state": True})
    result = C.compare(DEMO / "draft-story", unshifted)
    assert result.same_tensors and result.configs.same is False and not result.same
    rows = {r.releases: r for r in result.configs.rows}
    assert rows["as written"].differences == ["aux layers: A [1, 3, 4], B [2, 4, 5]"]
    assert rows["sglang 0.4.4.post2–0.5.23"].differences == ["aux layers: A [1, 3, 4], B [2, 4, 5]"]
    assert rows["vllm 0.12.0–0.22.1"].differences == ["aux layers: A [0, 2, 3], B [1, 3, 4]"]
    # later vLLM and llama.cpp read no eagle_config ids: both sides get the defaults, which mean the same
    assert rows["vllm 0.23.0–0.34.0"].outcome == rows["llamacpp==0.3.36"].outcome == "same"
    # every release of every engine is in exactly one row: the ranges tile the profile rows
    for engine in ("sglang", "vllm"):
        releases = sorted({v for p in all_profiles() if p.engine == engine for v in (p.first, p.last)}, key=parse_version)
        labels = [r.releases for r in result.configs.rows if r.releases.startswith(engine)]
        assert labels[0].split(" ")[-1].startswith(releases[0]) and labels[-1].endswith(releases[-1])
    proc = _cli(DEMO / "draft-story", unshifted, "--engine", "sglang==0.5.10")
    assert proc.returncode == 1
    assert "  sglang==0.5.10: DIFFERENT: aux layers: A [1, 3, 4], B [2, 4, 5]" in proc.stdout.splitlines()


def test_norms_vocabularies_and_the_heads_source_are_meaning(tmp_path):
    """norm_before_residual, which vLLM computes and SGLang cannot; a null draft_vocab_size, with which
    SGLang from 0.5.2 takes the target's head (and before 0.5.2 cannot build the draft at all)."""
    nbr = C.compare(DEMO / "draft-speculators", DEMO / "draft-speculators-nbr", [])  # no release: as written
    assert [r.differences for r in nbr.configs.rows] == [["norms: A none, B norm_before_residual"]]
    nbr = C.compare(DEMO / "draft-speculators", DEMO / "draft-speculators-nbr", ["vllm==0.32.0", "vllm==0.22.0"])
    assert [(r.releases, r.differences) for r in nbr.configs.rows[1:]] == [
        ("vllm==0.32.0", ["norms: A none, B norm_before_residual"]),  # releases asked for: a row each
        ("vllm==0.22.0", ["norms: A none, B norm_before_residual"])]
    null = _story(tmp_path, "null-vocab", draft_vocab_size=None)
    rows = {r.releases: r for r in C.compare(DEMO / "draft-story", null).configs.rows}
    assert rows["sglang 0.5.2–0.5.23"].differences == ["vocabularies: A 114/96 (target/draft), B 114/114 (target/draft)",
                                                       "head: A the draft's, B the target's"]
    assert rows["sglang 0.4.4.post2–0.5.1.post3"].outcome == "reads one"


def test_default_aux_layers_need_the_target_only_where_they_could_coincide(tmp_path):
    """A names no ids (the engines capture [2, N//2, N-3]); B names [2, 3, 3] at the top level: the same
    layers for a 6-layer target only. Without --target compare cannot call them the same (exit 1,
    saying why); with the demo's 6-layer target they are."""
    defaults = _story(tmp_path, "defaults", eagle_config={"use_aux_hidden_state": True})
    explicit = _story(tmp_path, "explicit", eagle_config={"use_aux_hidden_state": True},
                      eagle_aux_hidden_state_layer_ids=[2, 3, 3])
    proc = _cli(defaults, explicit)
    assert proc.returncode == 1
    assert ("  vllm 0.12.0–0.34.0: NEEDS A TARGET: aux layers: A the defaults [2, N//2, N-3], B [2, 3, 3] (the same "
            "only for a 6-layer target: give --target to settle it)") in proc.stdout.splitlines()
    assert proc.stdout.splitlines()[-1].endswith("unless the target has the layer count named above: --target settles it")
    proc = _cli(defaults, explicit, "--target", DEMO / "target")
    assert proc.returncode == 0, proc.stdout
    other = _story(tmp_path, "other", eagle_config={"use_aux_hidden_state": True}, eagle_aux_hidden_state_layer_ids=[1, 3, 4])
    assert "(different for every target)" in _cli(defaults, other).stdout


def test_a_draft_against_its_target_compares_no_configs():
    result = C.compare(DEMO / "draft-story", DEMO / "target")
    assert result.configs.same is None and "B is not an EAGLE-3 draft" in result.configs.note and not result.same


def test_bad_compare_arguments_are_one_line_exit_2(tmp_path):
    layerless = tmp_path / "layerless" / "config.json"
    layerless.parent.mkdir()
    layerless.write_text(json.dumps({"hidden_size": 64}))
    for args, said in (((DEMO / "draft-story", DEMO / "draft-story", "--engine", "sglang==9.9.9"), "is newer than every release the kit knows"),
                       ((DEMO / "draft-story", DEMO / "draft-story", "--target", tmp_path), "no config.json for the target"),
                       ((DEMO / "draft-story", DEMO / "draft-story", "--target", layerless), "no usable num_hidden_layers")):
        proc = _cli(*args)
        assert proc.returncode == 2 and said in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


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
    comparison = C.compare(a, b)
    assert not comparison.same
    result = statuses(comparison)
    qkv = "+".join(f"layers.0.self_attn.{p}_proj.weight" for p in "qkv")
    assert result[(qkv, "model.midlayer.self_attn.qkv_proj.weight")] == D.SAME_BYTES
    assert result[("layers.0.mlp.gate_proj.weight+layers.0.mlp.up_proj.weight",
                   "model.midlayer.mlp.gate_up_proj.weight")] == D.DIFFERENT
    assert result[("norm.weight", "model.norm.weight")] == D.SAME_VALUES
    assert result[("lm_head.weight", "output.weight")] == D.SAME_BYTES
    assert result[("only_a", None)] == D.ONLY_A and result[(None, "only_b")] == D.ONLY_B
    pair = next(p for p in C.compare(a, b).pairs if p.b == "model.midlayer.mlp.gate_up_proj.weight")
    expected = np.abs(up).max()  # up against 2 * up
    assert pair.max_abs_diff == pytest.approx(expected, rel=1e-6)
    assert pair.rel_l2 == pytest.approx(np.linalg.norm(up) / np.linalg.norm(np.concatenate([gate, up])), rel=1e-6)


def test_rounding_to_a_narrower_dtype_is_a_difference_with_its_size(tmp_path):
    values = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    a = write(tmp_path / "a.safetensors", {"w": ("F32", values)})
    b = write(tmp_path / "b.safetensors", {"w": ("BF16", values)})
    [pair] = C.compare(a, b).pairs
    assert pair.status == D.DIFFERENT and 0 < pair.rel_l2 < 2 ** -8  # BF16 keeps 8 bits of mantissa
    assert pair.relation == R.ROUNDED and pair.detail.startswith("B is A rounded to BF16, as each of 4096 sampled values shows")
    # stored back as F32, the rounded values are still named as BF16's
    b32 = write(tmp_path / "b32.safetensors", {"w": ("F32", ((values.view(np.uint32) + 0x8000) >> 16 << 16).view(np.float32))})
    [pair] = C.compare(a, b32).pairs
    assert pair.relation == R.ROUNDED and pair.detail.startswith("B is A rounded to BF16 (stored as F32), as each")
    [pair] = C.compare(b32, a).pairs
    assert pair.relation == R.ROUNDED and pair.detail.startswith("A is B rounded to BF16 (stored as F32), as each")


def _trained(rng, rows, columns):
    """A matrix with rows and columns of their own scale, as trained weights have."""
    return (rng.standard_normal((rows, columns)) * rng.uniform(0.2, 3.0, (rows, 1))
            * rng.uniform(0.5, 2.0, (1, columns))).astype(np.float32)


def test_how_each_pair_differs(tmp_path):
    rng = np.random.default_rng(3)
    w = _trained(rng, 96, 80)
    nan = w.copy()
    nan[5, 7] = np.nan
    tensors_a = {"transposed": w, "permuted": w, "scaled": w, "nan": w, "fresh": w, "unrelated": w, "close": w,
                 "norm": (1 + 0.05 * rng.standard_normal(80)).astype(np.float32)}
    tensors_b = {"transposed": w.T.copy(), "permuted": w[rng.permutation(96)], "scaled": w * np.float32(-0.25),
                 "nan": nan, "fresh": rng.normal(0, 0.02, w.shape).astype(np.float32), "unrelated": _trained(rng, 96, 80),
                 "close": w + np.float32(0.1) * rng.standard_normal(w.shape).astype(np.float32),
                 "norm": np.ones(80, np.float32)}
    a = write(tmp_path / "a.safetensors", {k: ("F32", v) for k, v in tensors_a.items()})
    b = write(tmp_path / "b.safetensors", {k: ("F32", v) for k, v in tensors_b.items()})
    pairs = {p.a: p for p in C.compare(a, b).pairs}
    assert {name: p.relation for name, p in pairs.items()} == {
        "transposed": R.TRANSPOSED, "permuted": R.PERMUTED, "scaled": R.SCALED, "nan": R.NON_FINITE, "fresh": R.FRESH,
        "unrelated": R.UNRELATED, "close": "", "norm": R.FRESH}
    assert all(p.status == D.DIFFERENT for p in pairs.values())
    assert pairs["scaled"].detail.startswith("B = -0.25 x A")
    assert pairs["nan"].detail == "1 NaN/inf value(s) in B where A is finite; the finite values are equal"
    assert pairs["fresh"].detail.endswith("B looks like a fresh initialisation (i.i.d. noise, by its row and column norms)")
    assert pairs["norm"].detail.startswith("B holds one value (1) everywhere")
    assert pairs["close"].correlation > 0.9 and pairs["transposed"].rel_l2 is None  # memory order means nothing there
    proc = _cli(a, b)
    assert proc.returncode == 1
    for word in ("TRANSPOSED", "ROWS PERMUTED", "SCALED", "NON-FINITE INTRODUCED", "FRESH INITIALISATION", "UNRELATED"):
        assert word in proc.stdout


def test_the_same_bytes_under_another_dtype_or_shape_differ(tmp_path):
    """F16 bytes read as BF16 are other values; [8, 8] read as [4, 16] is another tensor: exit 1."""
    raw = np.random.default_rng(4).standard_normal((8, 8)).astype(np.float16).tobytes()
    for dtype, shape, status, relation in (("F16", (8, 8), D.SAME_BYTES, ""),
                                           ("BF16", (8, 8), D.DIFFERENT, R.SAME_BYTES_OTHER_DTYPE),
                                           ("F16", (4, 16), D.ANOTHER_SHAPE, "")):
        other = tmp_path / f"{dtype}-{shape[0]}.safetensors"
        other.write_bytes(encode_header([("w", dtype, shape, len(raw))], None) + raw)
        a = tmp_path / "a.safetensors"
        a.write_bytes(encode_header([("w", "F16", (8, 8), len(raw))], None) + raw)
        [pair] = C.compare(a, other).pairs
        assert (pair.status, pair.relation) == (status, relation)
        assert _cli(a, other).returncode == (0 if status == D.SAME_BYTES else 1)


def test_colliding_names_are_kept_apart_and_reported(tmp_path):
    """A holds its decoder layer twice, as layers.0.X (trained) and midlayer.X (fresh), one name to the
    engines' rename rules; B holds the trained one as midlayer.X. Neither of A's vanishes."""
    rng = np.random.default_rng(5)
    trained, fresh = _trained(rng, 32, 32), rng.normal(0, 0.02, (32, 32)).astype(np.float32)
    a = write(tmp_path / "a" / "model.safetensors", {"layers.0.mlp.down_proj.weight": ("F32", trained),
                                                     "midlayer.mlp.down_proj.weight": ("F32", fresh)})
    b = write(tmp_path / "b" / "model.safetensors", {"midlayer.mlp.down_proj.weight": ("F32", trained)})
    result = C.compare(a, b)
    assert {(p.a, p.b, p.status) for p in result.pairs} == {
        ("layers.0.mlp.down_proj.weight", "midlayer.mlp.down_proj.weight", D.COLLISION),
        ("midlayer.mlp.down_proj.weight", None, D.COLLISION)}
    assert all(p.collision.startswith("A holds layers.0.mlp.down_proj.weight, midlayer.mlp.down_proj.weight") for p in result.pairs)
    assert {p.detail for p in result.pairs} == {"same bytes", "no partner in B"}
    proc = _cli(a, b)
    assert proc.returncode == 1 and proc.stdout.count("NAME COLLISION") == 2
    same = C.compare(a, a)  # the same collision on both sides: identical, and still named
    assert same.same and all(p.status == D.SAME_BYTES and p.collision for p in same.pairs) and len(same.pairs) == 2


def test_comparing_streams_in_bounded_chunks(tmp_path, monkeypatch):
    """A 64 MB pair is compared a chunk of each side at a time: no read larger than CHUNK_BYTES."""
    for module in (T, D):  # the reads, and the values judged per chunk
        monkeypatch.setattr(module, "CHUNK_BYTES", 1 << 20)
    values = np.random.default_rng(2).standard_normal((4096, 4096)).astype(np.float32)
    a = write(tmp_path / "a.safetensors", {"w": ("F32", values)})
    values[-1, -1] += 1.0
    b = write(tmp_path / "b.safetensors", {"w": ("F32", values)})
    reads = []
    real = T.os.pread
    monkeypatch.setattr(T.os, "pread", lambda fd, n, off: reads.append(n) or real(fd, n, off))
    [pair] = C.compare(a, b).pairs
    assert pair.status == D.DIFFERENT and pair.max_abs_diff == pytest.approx(1.0)
    assert max(reads) <= 1 << 20


@pytest.mark.parametrize("how", ["transposed", "permuted"])
def test_judging_how_reads_and_holds_bounded_amounts(tmp_path, monkeypatch, how):
    """Telling a 64 MB pair transposed (bounded samples of rows) or permuted (every row hashed, a chunk
    at a time) reads no more than CHUNK_BYTES at once and holds far less than a tensor's values."""
    for module in (T, D):  # the reads, and the values judged per chunk
        monkeypatch.setattr(module, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(D, "SAMPLE_VALUES", 1 << 18)
    values = _trained(np.random.default_rng(6), 4096, 4096)
    other = values.T.copy() if how == "transposed" else values[np.random.default_rng(7).permutation(4096)]
    a = write(tmp_path / "a.safetensors", {"w": ("F32", values)})
    b = write(tmp_path / "b.safetensors", {"w": ("F32", other)})
    del values, other
    reads = []
    real = T.os.pread
    monkeypatch.setattr(T.os, "pread", lambda fd, n, off: reads.append(n) or real(fd, n, off))
    tracemalloc.start()
    try:
        [pair] = C.compare(a, b).pairs
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pair.relation == {"transposed": R.TRANSPOSED, "permuted": R.PERMUTED}[how]
    assert max(reads) <= 1 << 20
    assert peak < 32 << 20, f"{peak >> 20} MB held for a pair of 64 MB tensors (128 MB each as float64)"


@pytest.mark.parametrize("config", [
    {"architectures": 5, "model_type": "llama"},
    {"architectures": ["LlamaForCausalLMEagle3"], "model_type": ["llama"]},
], ids=["architectures-int", "model-type-list"])
def test_a_config_whose_names_are_no_names_is_unusable_input(tmp_path, config):
    """What says what a config is, in the wrong JSON type: no reader takes it (checkpoint.read_config), so
    compare, as every command, says so in one line, exit 2."""
    hostile = shutil.copytree(DEMO / "draft-story", tmp_path / "hostile")
    (hostile / "config.json").write_text(json.dumps(config))
    proc = _cli(DEMO / "draft-story", hostile)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "config.json: " in proc.stderr, proc.stderr


@pytest.mark.parametrize("config", [
    {"speculators_model_type": "eagle3", "transformer_layer_config": 3},
    {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "eagle_config": "x"},
], ids=["layer-config-int", "eagle-config-str"])
def test_a_config_no_engine_can_read_is_named_not_a_traceback(tmp_path, config):
    hostile = shutil.copytree(DEMO / "draft-story", tmp_path / "hostile")
    (hostile / "config.json").write_text(json.dumps(config))
    proc = _cli(DEMO / "draft-story", hostile)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    assert "cannot be read as a draft config" in proc.stdout and "reads only A's config (B's: unreadable)" in proc.stdout
