"""`draftdoctor fix`: renames and config rewrites per engine, byte-exact copies, verification, and safety."""

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from draftdoctor import fixwrite as fixmod
from draftdoctor import rewriter
from draftdoctor.checkpoint import PAGE, open_checkpoint
from draftdoctor.configrewrite import RECORD_KEY, rewrite_config
from draftdoctor.diagnose import check
from draftdoctor.engines import resolve_engine
from draftdoctor.fix import FixBlocked, FixError, apply_fix, plan_fix
from draftdoctor.synth import DraftShape, speculators_config, write_draft

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"

ENGINES = ["sglang==0.5.10", "sglang==0.5.23", "vllm"]
LAYER_NAME = {"sglang==0.5.10": "midlayer.", "sglang==0.5.23": "layers.0.", "vllm": "layers.0."}


def run(*args):
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", *map(str, args)], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def snapshot(folder: Path) -> dict:
    """Every file under `folder`: content hash, size and modification time."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def tensor_bytes(path) -> dict[str, bytes]:
    ckpt = open_checkpoint(path)
    out = {}
    for name, t in ckpt.tensors.items():
        with open(t.file, "rb") as f:
            f.seek(t.begin)
            out[name] = f.read(t.nbytes)
    return out


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".draftdoctor-" in p.name]


def with_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# --- what fix writes -----------------------------------------------------------------------------


def test_round_trip_speculators_to_sglang_and_back_is_byte_identical(draft, tmp_path):
    src = draft("speculators", shape=DraftShape(target_hidden=96))
    before = snapshot(src)
    sglang = apply_fix(plan_fix(src, "sglang==0.5.10"), tmp_path / "sglang")
    back = apply_fix(plan_fix(sglang.dst, "vllm"), tmp_path / "back")
    assert sglang.ok and back.ok
    assert sglang.tensors_renamed == 10 and back.tensors_renamed == 10
    assert tensor_bytes(tmp_path / "back") == tensor_bytes(src)
    original = json.loads((src / "config.json").read_text())
    flat = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert json.loads((tmp_path / "back" / "config.json").read_text()) == original
    assert flat["architectures"] == ["LlamaForCausalLMEagle3"] and flat["model_type"] == "llama"
    assert flat["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 2, 4], "use_aux_hidden_state": True}
    assert flat["target_hidden_size"] == 96 and flat["draft_vocab_size"] == 128
    assert not any(k.startswith("layers.") for k in tensor_bytes(tmp_path / "sglang"))
    assert snapshot(src) == before


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layout,config", [("speculators", "speculators"), ("speculators", "flat"),
                                           ("midlayer", "flat"), ("midlayer", "speculators"),
                                           ("prefixed", "flat")])
def test_every_layout_loads_completely_in_every_engine(draft, tmp_path, layout, config, engine):
    src = draft(layout, config=config)
    result = apply_fix(plan_fix(src, engine), tmp_path / "out")
    assert result.ok, result.verification.problems
    report = check(tmp_path / "out", engine)
    assert not report.errors and not report.uninitialized and not report.dropped
    names = tensor_bytes(tmp_path / "out")
    layer = [k for k in names if "self_attn.q_proj" in k]
    assert layer == [LAYER_NAME[engine] + "self_attn.q_proj.weight"]
    assert not any(k.startswith("model.") for k in names)
    # the same bytes under the new names
    source = tensor_bytes(src)
    assert sorted(map(len, source.values())) == sorted(map(len, names.values()))
    assert sorted(source.values()) == sorted(names.values())


@pytest.mark.parametrize("first", ENGINES)
@pytest.mark.parametrize("second", ENGINES)
def test_fixing_a_fixed_draft_for_another_engine(draft, tmp_path, first, second):
    src = draft("speculators")
    a = apply_fix(plan_fix(src, first), tmp_path / "a")
    b = apply_fix(plan_fix(a.dst, second), tmp_path / "b")
    assert a.ok and b.ok
    assert sorted(tensor_bytes(tmp_path / "b").values()) == sorted(tensor_bytes(src).values())
    if second == "vllm":  # back in speculators' format: the original config, whatever the route
        assert json.loads((tmp_path / "b" / "config.json").read_text()) == json.loads((src / "config.json").read_text())


def test_sharded_input_keeps_shards_and_rewrites_the_index(draft, tmp_path):
    src = draft("speculators", shards=3)
    result = apply_fix(plan_fix(src, "sglang==0.5.10"), tmp_path / "out")
    assert result.ok
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    old = json.loads((src / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(set(old["weight_map"].values()))
    assert index["weight_map"]["midlayer.mlp.up_proj.weight"] == old["weight_map"]["layers.0.mlp.up_proj.weight"]
    assert index["metadata"]["total_size"] == old["metadata"]["total_size"] == result.bytes_copied
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == sorted(p.name for p in src.glob("*.safetensors"))
    assert tensor_bytes(tmp_path / "out")["midlayer.mlp.up_proj.weight"] == tensor_bytes(src)["layers.0.mlp.up_proj.weight"]


@pytest.mark.parametrize("layout,prefix", [("speculators", ""), ("prefixed", "model.")])
def test_output_is_a_valid_safetensors_file_for_the_reference_reader(draft, tmp_path, layout, prefix):
    from safetensors import safe_open
    from safetensors.numpy import load_file

    src = draft(layout)
    apply_fix(plan_fix(src, "sglang==0.5.10"), tmp_path / "out")
    path = tmp_path / "out" / "model.safetensors"
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    src_header_len = int.from_bytes((src / "model.safetensors").read_bytes()[:8], "little")
    assert header_len % 8 == 0
    assert (8 + header_len) % PAGE == (8 + src_header_len) % PAGE  # the kernel copies whole pages
    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"format": "pt"}
    new, old = load_file(str(path)), load_file(str(src / "model.safetensors"))
    layer = prefix + ("layers.0." if layout == "speculators" else "midlayer.")
    np.testing.assert_array_equal(new["midlayer.self_attn.q_proj.weight"], old[layer + "self_attn.q_proj.weight"])
    np.testing.assert_array_equal(new["d2t"], old[prefix + "d2t"])


def test_other_files_are_copied_and_stale_weights_are_not(draft, tmp_path):
    src = draft("speculators")
    (src / "tokenizer.json").write_text('{"model": {}}')
    (src / "generation_config.json").write_text("{}")
    (src / "pytorch_model.bin").write_bytes(b"pickle")
    (src / "runs").mkdir()
    plan = plan_fix(src, "sglang==0.5.10")
    assert {f.name: f.copy for f in plan.files} == {"generation_config.json": True, "pytorch_model.bin": False,
                                                    "runs": False, "tokenizer.json": True}
    result = apply_fix(plan, tmp_path / "out")
    assert result.files_copied == 2
    assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"model": {}}'
    assert not (tmp_path / "out" / "pytorch_model.bin").exists() and not (tmp_path / "out" / "runs").exists()


def test_multi_layer_draft_keeps_layers_for_new_sglang_and_is_refused_for_old(draft, tmp_path):
    src = draft("speculators", shape=DraftShape(num_layers=2))
    result = apply_fix(plan_fix(src, "sglang==0.5.23"), tmp_path / "new")
    assert result.ok and result.tensors_renamed == 0
    assert {"layers.0.mlp.up_proj.weight", "layers.1.mlp.up_proj.weight"} <= set(tensor_bytes(tmp_path / "new"))
    old = plan_fix(src, "sglang==0.5.10")
    assert "loader-crash" in {f.code for f in old.blocking}
    with pytest.raises(FixError, match="only supports 1 layer"):
        apply_fix(old, tmp_path / "old")
    assert not (tmp_path / "old").exists()


def test_sglang_0_4_8_is_refused_because_no_rename_supplies_its_fc_bias(draft, tmp_path):
    plan = plan_fix(draft("speculators"), "sglang==0.4.8")
    assert plan.renamed  # the layer rename is found ...
    assert [p.name for p in plan.predicted.uninitialized] == ["model.fc.bias"]  # ... but the bias is not in the draft
    with pytest.raises(FixError, match="model.fc.bias"):
        apply_fix(plan, tmp_path / "out")


def test_training_only_tensors_are_kept_where_ignored_and_left_out_where_fatal(draft, tmp_path):
    src = draft("speculators", extra={"verifier_norm.weight": ("F16", (64,))})
    sglang = plan_fix(src, "sglang==0.5.10")
    assert {t.old: t.action for t in sglang.tensors}["verifier_norm.weight"] == "keep"
    vllm = plan_fix(src, "vllm")
    assert {t.old: t.action for t in vllm.tensors}["verifier_norm.weight"] == "omit"
    result = apply_fix(vllm, tmp_path / "out")
    assert result.ok and result.tensors_omitted == 1 and "verifier_norm.weight" not in tensor_bytes(tmp_path / "out")


def test_an_identity_d2t_is_left_out_where_vllm_has_no_map_for_an_equal_vocabulary(draft, tmp_path):
    """A full-vocabulary draft saved with a d2t: vLLM >= 0.30 builds no draft_id_to_target_id for it
    and fails on the key, 0.25-0.29 load it. All offsets 0 (the identity) can go; any other d2t
    (here arange, which sends draft id i to target id 2i) must not be dropped silently."""
    from safetensors.numpy import load_file, save_file

    def full_vocabulary_draft(offsets):
        folder = draft("speculators", DraftShape(draft_vocab=None))
        tensors = load_file(str(folder / "model.safetensors")) | {"d2t": offsets}
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder

    identity = full_vocabulary_draft(np.zeros(256, dtype=np.int64))
    plan = plan_fix(identity, "vllm==0.30.0")
    assert {t.old: t.action for t in plan.tensors}["d2t"] == "omit" and plan.can_apply()
    assert apply_fix(plan, tmp_path / "out").ok and "d2t" not in tensor_bytes(tmp_path / "out")
    assert {t.old: t.action for t in plan_fix(identity, "vllm==0.29.0").tensors}["d2t"] == "keep"
    shifted = plan_fix(full_vocabulary_draft(np.arange(256, dtype=np.int64)), "vllm==0.30.0")
    assert {t.old: t.action for t in shifted.tensors}["d2t"] == "keep" and not shifted.can_apply()
    assert "loader-crash" in {f.code for f in shifted.blocking}


@pytest.mark.parametrize("layout, config", [("speculators", "speculators"), ("midlayer", "flat")])
def test_a_draft_with_four_aux_states_gets_its_fc_width_stated_for_vllm(draft, tmp_path, layout, config):
    """vLLM sizes fc by num_aux_hidden_states, else eagle_config's ids, else for 3; speculators'
    config has its ids at the top level, so fix states the count where vLLM's reader looks."""
    src = draft(layout, DraftShape(aux_layer_ids=(1, 3, 5, 6)), config=config)
    result = apply_fix(plan_fix(src, "vllm"), tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert result.ok and written["transformer_layer_config"]["num_aux_hidden_states"] == 4
    assert not check(tmp_path / "out", "vllm").errors


def test_fc_norm_is_written_where_vllm_up_to_0_24_reads_it(draft, tmp_path):
    """vLLM 0.22-0.24's reader of speculators' config does not pass fc_norm on, but starts from
    transformer_layer_config: fix writes the option there too, and the draft loads whole."""
    src = draft("speculators", extra={f"fc_norm.{i}.weight": ("F16", (64,)) for i in range(3)})
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(config | {"fc_norm": True}))
    plan = plan_fix(src, "vllm==0.24.0")
    assert not plan.lossy and "transformer_layer_config.fc_norm" in {c.field for c in plan.config.changes}
    assert apply_fix(plan, tmp_path / "out").ok
    report = check(tmp_path / "out", "vllm==0.24.0")
    assert not report.errors and {p.name: p.status for p in report.params}["model.fc_norm.2.weight"] == "written"


# --- config rewrites -----------------------------------------------------------------------------


def test_norm_before_residual_is_lossy_for_sglang_and_refused_unless_allowed(draft, tmp_path):
    src = with_config(draft("speculators"), norm_before_residual=True)
    plan = plan_fix(src, "sglang==0.5.10")
    # the config cannot say it (lossy-config) and check on the result says what that costs
    assert {f.code for f in plan.lossy} == {"lossy-config", "norm-before-residual"}
    assert all("norm_before_residual" in f.message for f in plan.lossy)
    assert not plan.blocking and not plan.can_apply() and plan.can_apply(allow_lossy=True)
    with pytest.raises(FixBlocked, match="--allow-lossy"):
        apply_fix(plan, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    result = apply_fix(plan, tmp_path / "out", allow_lossy=True)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert result.ok and "norm_before_residual" not in written
    assert written[RECORD_KEY]["fields"]["norm_before_residual"] is True  # recorded, not dropped silently
    back = apply_fix(plan_fix(tmp_path / "out", "vllm"), tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["norm_before_residual"] is True
    assert not plan_fix(src, "vllm").lossy


@pytest.mark.parametrize("option,engine,lossy", [("fc_norm", "sglang==0.5.10", True), ("norm_output", "sglang==0.5.10", True),
                                                  ("norm_output", "sglang==0.5.23", False), ("norm_output", "vllm", False)])
def test_options_an_engine_lacks_are_lossy(option, engine, lossy):
    config = speculators_config(DraftShape()) | {option: True}
    rewrite = rewrite_config(config, resolve_engine(engine).profile)
    assert bool(rewrite.lossy) is lossy
    if not lossy and rewrite.format == "flat":
        assert rewrite.config[option] is True


def test_null_target_hidden_size_is_left_out_of_the_flat_config():
    config = speculators_config(DraftShape()) | {"target_hidden_size": None}
    flat = rewrite_config(config, resolve_engine("sglang==0.5.10").profile).config
    assert "target_hidden_size" not in flat
    back = rewrite_config(flat, resolve_engine("vllm").profile).config
    assert back == config


def test_llama3_rope_is_restated_for_old_transformers_and_restored_on_the_way_back():
    config = speculators_config(DraftShape())
    config["transformer_layer_config"]["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
    flat = rewrite_config(config, resolve_engine("sglang==0.5.10").profile).config
    assert flat["rope_theta"] == 500000.0 and flat["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0}
    assert flat["rope_parameters"]["rope_theta"] == 500000.0
    assert rewrite_config(flat, resolve_engine("vllm").profile).config == config


def test_flat_config_from_sglang_becomes_speculators_with_ids_plus_one_and_explicit_options(draft):
    plan = plan_fix(draft("midlayer", config="flat"), "vllm")
    written = plan.config.config
    assert written["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]  # flat [0, 2, 4] in SGLang's convention
    assert written["norm_before_residual"] is False  # vLLM would default it to true
    assert written["transformer_layer_config"]["hidden_size"] == 64
    assert written["speculators_config"]["verifier"]["name_or_path"] is None
    assert {f.code for f in plan.findings if f.severity != "info"} == {"config-defaulted"}


def test_flat_config_with_top_level_ids_gets_them_in_eagle_config(draft):
    src = draft("midlayer", config="flat")
    config = json.loads((src / "config.json").read_text())
    del config["eagle_config"]
    config["eagle_aux_hidden_state_layer_ids"] = [1, 3, 5]
    (src / "config.json").write_text(json.dumps(config))
    written = plan_fix(src, "sglang==0.5.10").config.config
    assert written["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    assert "eagle_aux_hidden_state_layer_ids" not in written


def test_plan_frame_lists_renames_and_config_changes(draft):
    frame = plan_fix(draft("speculators"), "sglang==0.5.10").frame()
    tensors = frame[frame.kind == "tensor"]
    assert (tensors.set_index("old").loc["layers.0.mlp.up_proj.weight", "new"]) == "midlayer.mlp.up_proj.weight"
    config = frame[frame.kind == "config"]
    assert any("eagle_config.eagle_aux_hidden_state_layer_ids = [0, 2, 4]" in (n or "") for n in config.new)


# --- the command line ------------------------------------------------------------------------------


def test_cli_plan_writes_nothing_and_fix_writes_a_verified_copy(draft, tmp_path):
    src = draft("speculators")
    before = snapshot(tmp_path)
    code, out, err = run("fix", src, "--engine", "sglang==0.5.10", "--out", tmp_path / "out", "--plan")
    assert code == 0 and "layers.0.mlp.up_proj.weight" in out and "midlayer.mlp.up_proj.weight" in out
    assert snapshot(tmp_path) == before
    code, out, err = run("fix", src, "--engine", "sglang==0.5.10", "--out", tmp_path / "out")
    assert code == 0, err
    assert "10 tensors renamed" in out and "verified" in out and "loads cleanly" in out
    code, out, _ = run("check", tmp_path / "out", "--engine", "sglang==0.5.10")
    assert code == 0


def test_cli_json_result(draft, tmp_path):
    code, out, _ = run("fix", draft("midlayer"), "--engine", "vllm", "--out", tmp_path / "out", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["verification"]["tensors_checked"] == 15
    assert doc["tensors_renamed"] == 10 and doc["copy_method"] in ("copy_file_range", "sendfile", "buffered")


def test_cli_lossy_plan_exits_1_and_allow_lossy_writes(draft, tmp_path):
    src = with_config(draft("speculators"), norm_before_residual=True)
    code, out, _ = run("fix", src, "--engine", "sglang==0.5.10", "--plan")
    assert code == 1 and "lossy-config" in out
    code, out, err = run("fix", src, "--engine", "sglang==0.5.10", "--out", tmp_path / "out")
    assert code == 1 and out.startswith("refused: nothing written") and "--allow-lossy" in out and not err
    assert "what you can do: serve with an engine that implements it" in out and not (tmp_path / "out").exists()
    code, out, _ = run("fix", src, "--engine", "sglang==0.5.10", "--out", tmp_path / "out", "--allow-lossy")
    # written, and its last line is check's verdict on it: the loss stays visible
    assert code == 0 and "accepted with --allow-lossy: norm-before-residual" in out
    assert out.splitlines()[-1].startswith("verdict: every parameter is written, but norm-before-residual")


# --- bad inputs and unsafe destinations ----------------------------------------------------------------


def one_line_error(code, err, *words):
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for w in words:
        assert w in err


def test_missing_shard_is_refused(draft, tmp_path):
    src = draft("speculators", shards=2)
    (src / "model-00002-of-00002.safetensors").unlink()
    code, _, err = run("fix", src, "--engine", "sglang==0.5.10", "--out", tmp_path / "out")
    one_line_error(code, err, "model-00002-of-00002.safetensors", "does not exist")


def test_missing_config_is_refused(draft, tmp_path):
    code, _, err = run("fix", draft("midlayer", config="none"), "--engine", "sglang==0.5.10", "--out", tmp_path / "o")
    one_line_error(code, err, "config.json")


def test_destination_inside_source_or_holding_it_is_refused(draft, tmp_path):
    src = draft("speculators")
    before = snapshot(src)
    code, _, err = run("fix", src, "--engine", "vllm", "--out", src / "fixed")
    one_line_error(code, err, "inside the source")
    code, _, err = run("fix", src, "--engine", "vllm", "--out", src.parent, "--force")
    one_line_error(code, err, "contains the source")
    code, _, err = run("fix", src, "--engine", "vllm", "--out", src, "--force")
    one_line_error(code, err, "inside the source")
    assert snapshot(src) == before


def test_existing_destination_needs_force_and_is_replaced_only_after_verification(draft, tmp_path, monkeypatch):
    src = draft("speculators")
    dst = tmp_path / "out"
    assert apply_fix(plan_fix(src, "vllm"), dst).ok  # an earlier fix's output: --force may replace it
    before = (dst / "config.json").read_text()
    code, _, err = run("fix", src, "--engine", "sglang==0.5.10", "--out", dst)
    one_line_error(code, err, "already exists", "--force")
    # a verification failure leaves the old DST as it was
    monkeypatch.setattr(fixmod, "_verify", lambda *a: fixmod.Verification(1, 0, ["x"], [], None))
    result = apply_fix(plan_fix(src, "sglang==0.5.10"), dst, force=True)
    assert not result.ok and (dst / "config.json").read_text() == before and not leftovers(tmp_path)
    monkeypatch.undo()
    result = apply_fix(plan_fix(src, "sglang==0.5.10"), dst, force=True)
    assert result.ok and json.loads((dst / "config.json").read_text())["model_type"] == "llama"
    assert not leftovers(tmp_path)


def test_temporary_folders_of_killed_runs_are_swept_and_others_kept(draft, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dst = tmp_path / "out"
    killed = tmp_path / (rewriter.temp_prefix(dst, int(dead.stdout)) + "abc")
    running = tmp_path / (rewriter.temp_prefix(dst, os.getpid()) + "def")  # a live process's
    elsewhere = tmp_path / f".out.draftdoctor-{int(dead.stdout)}-otherhost-ghi"  # another host, same folder
    forced = tmp_path / ".out.draftdoctor-old-jkl"  # may hold a previous DST mid-replacement
    other = tmp_path / (rewriter.temp_prefix(tmp_path / "other", int(dead.stdout)) + "mno")  # another DST's
    for folder in (killed, running, elsewhere, forced, other):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
    assert apply_fix(plan_fix(draft("speculators"), "vllm"), dst).ok
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == sorted(
        p.name for p in (running, elsewhere, forced, other))


def test_force_does_not_replace_a_folder_that_is_not_a_checkpoint(draft, tmp_path):
    dst = tmp_path / "home"
    (dst / "projects").mkdir(parents=True)
    (dst / "notes.txt").write_text("keep me")
    with pytest.raises(FixError, match="replaces only"):
        apply_fix(plan_fix(draft("speculators"), "vllm"), dst, force=True)
    assert (dst / "notes.txt").read_text() == "keep me"


def test_unwritable_destination_folder_fails_cleanly(draft, tmp_path):
    """/sys refuses new folders even to root: a real failure, not an injected one."""
    if not Path("/sys").is_dir():
        pytest.skip("no /sys")
    code, _, err = run("fix", draft("speculators"), "--engine", "vllm", "--out", "/sys/draftdoctor-test")
    one_line_error(code, err, "/sys", "cannot create a folder")


def test_read_only_destination_folder_fails_cleanly(draft, tmp_path):
    """A read-only bind mount (root only); the injected variant below runs everywhere."""
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(ro), str(ro)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        code, _, err = run("fix", draft("speculators"), "--engine", "vllm", "--out", ro / "out")
        one_line_error(code, err, "Read-only file system")
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert list(ro.iterdir()) == []


def test_os_error_creating_the_temporary_folder_is_one_line(draft, tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(rewriter, "new_folder", refuse)
    with pytest.raises(FixError, match="Permission denied"):
        apply_fix(plan_fix(draft("speculators"), "vllm"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_failure_midway_leaves_no_destination_and_source_untouched(draft, tmp_path, monkeypatch, failure):
    src = draft("speculators", shards=2)
    before = snapshot(src)
    monkeypatch.setattr(rewriter, "CHUNK", 4096)  # many copy calls per shard
    real_copy, calls = rewriter.Copier.copy, []

    def copy_then_fail(self, *args):
        calls.append(args)
        if len(calls) > 1:
            raise failure
        return real_copy(self, *args)

    monkeypatch.setattr(rewriter.Copier, "copy", copy_then_fail)
    plan = plan_fix(src, "sglang==0.5.10")
    with pytest.raises(type(failure) if isinstance(failure, KeyboardInterrupt) else FixError):
        apply_fix(plan, tmp_path / "out")
    assert len(calls) == 2
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)
    assert snapshot(src) == before


def test_corrupted_copy_is_caught_by_verification_and_not_put_in_place(draft, tmp_path, monkeypatch):
    src = draft("speculators")
    real_copy = rewriter.Copier.copy

    def copy_and_flip_a_byte(self, src_fd, dst_fd, src_off, dst_off, count, path):
        real_copy(self, src_fd, dst_fd, src_off, dst_off, count, path)
        byte = os.pread(src_fd, 1, src_off + count - 1)
        os.pwrite(dst_fd, bytes([byte[0] ^ 0xFF]), dst_off + count - 1)

    monkeypatch.setattr(rewriter.Copier, "copy", copy_and_flip_a_byte)
    result = apply_fix(plan_fix(src, "sglang==0.5.10"), tmp_path / "out")
    assert not result.ok and not result.written
    assert result.verification.mismatched == ["t2d"]  # the last tensor in the file holds the flipped byte
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


@pytest.mark.parametrize("broken", [["copy_file_range"], ["copy_file_range", "sendfile"]])
def test_copy_falls_back_when_the_kernel_cannot_copy(draft, tmp_path, monkeypatch, broken):
    def unsupported(*a, **k):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    for name in broken:
        monkeypatch.setattr(rewriter.os, name, unsupported)
    src = draft("speculators", shards=2)
    result = apply_fix(plan_fix(src, "vllm"), tmp_path / "out")
    assert result.ok and result.copy_method == ("sendfile" if len(broken) == 1 else "buffered")
    assert tensor_bytes(tmp_path / "out") == tensor_bytes(src)


def test_source_that_changed_after_planning_is_caught(draft, tmp_path):
    src = draft("speculators")
    plan = plan_fix(src, "sglang==0.5.10")
    with open(src / "model.safetensors", "r+b") as f:
        f.truncate(os.path.getsize(src / "model.safetensors") - 100)
    with pytest.raises(FixError, match="before the data its header describes"):
        apply_fix(plan, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


def test_failure_reading_back_is_reported_and_cleaned_up(draft, tmp_path, monkeypatch):
    def unreadable(*a):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(rewriter, "_read_exactly", unreadable)
    with pytest.raises(FixError, match="Input/output error"):
        apply_fix(plan_fix(draft("speculators"), "vllm"), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


def test_cli_exits_1_when_verification_fails(draft, tmp_path, monkeypatch, capsys):
    from draftdoctor import cli

    monkeypatch.setattr(fixmod, "_verify", lambda *a: fixmod.Verification(15, 0, ["fc.weight"], [], None))
    code = cli.main(["fix", str(draft("speculators")), "--engine", "vllm", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 1 and "verification failed" in out and "fc.weight: bytes in DST differ" in out
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


@pytest.mark.parametrize("change", [{"eagle_aux_hidden_state_layer_ids": ["one", "two"]},
                                    {"transformer_layer_config": "llama"}])
def test_malformed_config_is_refused_in_one_line(draft, tmp_path, change):
    src = with_config(draft("speculators"), **change)
    code, _, err = run("fix", src, "--engine", "sglang==0.5.10", "--out", tmp_path / "out")
    one_line_error(code, err, "config.json")


def test_small_chunks_and_a_short_comparison_lag_copy_every_byte_and_report_progress(draft, tmp_path, monkeypatch):
    monkeypatch.setattr(rewriter, "VERIFY_LAG", 1)
    monkeypatch.setattr(rewriter, "CHUNK", 4096)
    monkeypatch.setattr(rewriter, "COMPARE_PIECE", 1000)  # pieces that do not divide a chunk
    src = draft("speculators", shards=2)
    seen = []
    plan = plan_fix(src, "sglang==0.5.10")
    result = apply_fix(plan, tmp_path / "out", progress=seen.append)
    assert result.ok and sum(seen) == plan.bytes_to_copy == result.bytes_copied
    renamed = {m.new: m.old for m in plan.tensors}
    copied = tensor_bytes(tmp_path / "out")
    assert {renamed[k]: v for k, v in copied.items()} == tensor_bytes(src)


def test_every_copy_call_but_a_run_s_first_starts_on_a_chunk_boundary_of_the_source(draft, tmp_path, monkeypatch):
    """The copy is split at SRC's multiples of CHUNK, not in CHUNK steps from where the data starts: a
    data section starting 4 kB or more into the file, copied in steps from there, took 1.4x as long."""
    monkeypatch.setattr(rewriter, "CHUNK", 4096)
    src = draft("speculators", shards=2)
    real_copy, calls = rewriter.Copier.copy, []

    def copy(self, src_fd, dst_fd, src_off, dst_off, count, path):
        calls.append((path.name, src_off, count))
        return real_copy(self, src_fd, dst_fd, src_off, dst_off, count, path)

    monkeypatch.setattr(rewriter.Copier, "copy", copy)
    plan = plan_fix(src, "sglang==0.5.10")
    result = apply_fix(plan, tmp_path / "out")
    assert result.ok and sum(count for _, _, count in calls) == plan.bytes_to_copy
    firsts = {name: min(off for n, off, _ in calls if n == name) for name, _, _ in calls}
    assert len(firsts) == 2 and all(off % 4096 for off in firsts.values())  # the data starts inside a page
    assert all(off % 4096 == 0 for name, off, _ in calls if off != firsts[name])
    renamed = {m.new: m.old for m in plan.tensors}
    assert {renamed[k]: v for k, v in tensor_bytes(tmp_path / "out").items()} == tensor_bytes(src)


@pytest.mark.parametrize("chunk,piece", [(rewriter.CHUNK, rewriter.COMPARE_PIECE), (4096, 1000)])
def test_a_corrupted_byte_is_pinned_to_its_tensor(draft, tmp_path, monkeypatch, chunk, piece):
    monkeypatch.setattr(rewriter, "CHUNK", chunk)
    monkeypatch.setattr(rewriter, "COMPARE_PIECE", piece)
    src = draft("speculators")
    fc = open_checkpoint(src).tensors["fc.weight"]
    real_copy = rewriter.Copier.copy

    def copy_and_flip_inside_fc(self, src_fd, dst_fd, src_off, dst_off, count, path):
        real_copy(self, src_fd, dst_fd, src_off, dst_off, count, path)
        if src_off <= fc.begin + 10 < src_off + count:
            at = fc.begin + 10 - src_off
            os.pwrite(dst_fd, bytes([os.pread(src_fd, 1, src_off + at)[0] ^ 1]), dst_off + at)

    monkeypatch.setattr(rewriter.Copier, "copy", copy_and_flip_inside_fc)
    result = apply_fix(plan_fix(src, "vllm"), tmp_path / "out")
    assert result.verification.mismatched == ["fc.weight"] and not result.written


@pytest.mark.parametrize("release", ["0.5.9", "0.5.10", "0.5.23"])
def test_sglang_own_loader_writes_every_parameter_of_the_fixed_draft(draft, tmp_path, release):
    """The proof beyond the replay: SGLang's real load_weights (on CPU, `make sglang-loaders`) over
    fix's output, from speculators' layout and nested config, and from `model.`-prefixed keys."""
    from conftest import require_release
    from draftdoctor.realcheck import real_checks

    require_release(release)
    engine = f"sglang=={release}"
    sources = [draft("speculators"), draft("prefixed"), draft("midlayer", config="speculators")]
    outputs = [apply_fix(plan_fix(src, engine), tmp_path / f"out-{i}").dst for i, src in enumerate(sources)]
    before, *after = real_checks([sources[0], *outputs], resolve_engine(engine))  # one child process: SGLang imported once
    assert before.errors  # the story's draft: layer dropped (<= 0.5.11) or config unreadable (0.5.23)
    for report in after:
        assert report.loader == "real"
        assert not report.errors, [f.message for f in report.errors]
        assert not report.uninitialized and not report.dropped
        assert {p.status for p in report.params} <= {"written", "from-target"}


def _headless(tmp_path, draft_vocab_size):
    """The demo's draft in SGLang's names without its head (and without a vocabulary map), declaring
    `draft_vocab_size`: a trainer that froze the target's head and did not save it."""
    import json

    import numpy as np

    from draftdoctor.checkpoint import open_checkpoint
    from draftdoctor.synthwrite import NUMPY_DTYPES, write_safetensors

    src = open_checkpoint(DEMO / "draft-story")
    tensors = {("midlayer." + n[len("layers.0."):] if n.startswith("layers.0.") else n):
               np.frombuffer(t.read(), dtype=NUMPY_DTYPES[t.dtype]).reshape(t.shape)
               for n, t in src.tensors.items() if n not in ("lm_head.weight", "d2t", "t2d")}
    folder = tmp_path / f"headless-{draft_vocab_size}"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", tensors)
    (folder / "config.json").write_text(json.dumps(src.config | {"draft_vocab_size": draft_vocab_size}))
    return folder


def test_head_from_target_is_applied_only_where_it_can_be_right(tmp_path):
    """A draft with no lm_head declaring the target's vocabulary: fix refuses and names the remedy; with
    --head-from-target it writes draft_vocab_size: null and the engine takes the target's head. Where the
    vocabularies differ, or the release cannot build a null draft vocabulary, the option is refused."""
    import json

    from draftdoctor.diagnose import check
    from draftdoctor.fix import FixBlocked, FixError

    draft = _headless(tmp_path, 114)
    plan = plan_fix(draft, "sglang==0.5.10", target=DEMO / "target")
    refused = plan.refusal()
    assert refused and "lm-head-missing" in {f.code for f in refused.findings}
    assert "--head-from-target" in str(refused)
    with pytest.raises(FixBlocked):
        apply_fix(plan, tmp_path / "refused")
    fixed = apply_fix(plan_fix(draft, "sglang==0.5.10", target=DEMO / "target", head_from_target=True),
                      tmp_path / "fixed")
    assert json.loads((fixed.dst / "config.json").read_text())["draft_vocab_size"] is None
    report = check(fixed.dst, "sglang==0.5.10", target=DEMO / "target")
    assert not report.errors and {p.name: p.status for p in report.params}["lm_head.weight"] == "from-target"
    with pytest.raises(FixError, match="draft_vocab_size 96 is not the target's vocabulary"):
        plan_fix(_headless(tmp_path, 96), "sglang==0.5.10", target=DEMO / "target", head_from_target=True)
    with pytest.raises(FixError, match="fails to build a draft whose draft_vocab_size is null"):
        plan_fix(draft, "sglang==0.4.8.post1", target=DEMO / "target", head_from_target=True)
    with pytest.raises(FixError, match="takes the target's head for a draft without one already"):
        plan_fix(draft, "vllm==0.32.0", target=DEMO / "target", head_from_target=True)


def test_a_fix_that_changes_nothing_says_so_and_what_it_means(draft, tmp_path):
    """A draft already in the engine's names and config: fix writes the copy asked for, and says that to the
    engine it is the draft itself, so no acceptance it lacks can come from this rewrite."""
    import json
    import subprocess
    import sys

    src = draft("midlayer")
    plan = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "fix", str(src), "--engine", "sglang==0.5.10",
                           "--plan", "--loader", "replay", "--format", "json"], capture_output=True, text=True)
    assert json.loads(plan.stdout)["changes_nothing"] is True
    done = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "fix", str(src), "--engine", "sglang==0.5.10",
                           "--out", str(tmp_path / "out"), "--loader", "replay"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "nothing to change: every tensor already has the name sglang==0.5.10 reads" in done.stdout
    assert "the cause is not in names or config" in done.stdout
    renamed = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "fix", str(draft("speculators")), "--engine",
                              "sglang==0.5.10", "--plan", "--loader", "replay"], capture_output=True, text=True)
    assert "nothing to change" not in renamed.stdout
