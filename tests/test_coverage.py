"""Replay coverage: the story's expected verdicts (README) and each profile's resolution rules."""

import re

import pytest

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.diagnose import check
from draftdoctor.engines import EngineSpecError, resolve_engine
from draftdoctor.layouts import detect_layout
from draftdoctor.statuses import ParamFate
from draftdoctor.synth import LLAMA_8B, DraftShape, write_draft

DECODER = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "input_layernorm", "post_attention_layernorm",
           "hidden_norm"}


def statuses(report):
    return {p.name: p.status for p in report.params}


def codes(report, severity="error"):
    return {f.code for f in report.findings if f.severity == severity}


def test_speculators_layout_under_0_5_10_drops_the_decoder_layer(draft):
    report = check(draft("speculators", config="flat"), "sglang==0.5.10")
    uninitialized = {p.name.split(".")[-2] for p in report.uninitialized}
    assert uninitialized == DECODER and len(report.params) == 11
    assert statuses(report)["model.fc.weight"] == "written"
    assert {k.key.split(".")[0] for k in report.dropped} == {"layers"} and len(report.dropped) == 10
    assert codes(report) == {"dropped-keys", "uninitialized-params"}
    assert "decoder layer left at initial values (7 of 11 parameters" in report.verdict
    assert "expect accept length near 1.00" in report.verdict
    keys = {k.key: k.status for k in report.keys}
    assert keys["d2t"] == "derived" and keys["t2d"] == "ignored"


def test_story_numbers_on_an_8b_shaped_draft(tmp_path):
    """The story's numbers (README): 7 of 11 parameters, about 486 MB of 850 MB, sized from headers alone."""
    folder = write_draft(tmp_path / "d", LLAMA_8B, layout="speculators", config="flat", fill="sparse")
    report = check(folder, "sglang==0.5.10")
    assert re.search(r"7 of 11 parameters, 48[67] MB of 8[45]\d MB", report.verdict), report.verdict
    assert 845e6 < report.bytes_needed < 855e6


def test_speculators_config_under_newest_sglang_loads_weights_but_config_is_unreadable(draft):
    report = check(draft("speculators"), "sglang==0.5.23")
    assert not report.uninitialized and not report.dropped
    assert codes(report) == {"config-unreadable"}
    assert "model_type" in report.findings[0].message


def test_midlayer_layout_is_clean_under_0_5_10(draft):
    report = check(draft("midlayer"), "sglang==0.5.10")
    assert codes(report) == set() and report.verdict.startswith("loads cleanly")
    assert statuses(report)["model.embed_tokens.weight"] == "from-target"


@pytest.mark.parametrize("layout", ["speculators", "midlayer"])
def test_vllm_loads_both_layouts(draft, layout):
    report = check(draft(layout), "vllm")
    assert not report.errors, report.findings
    assert statuses(report)["draft_id_to_target_id"] == "written"


def test_vllm_drops_an_unexpected_bias_silently_and_crashes_on_other_unknown_keys(draft, tmp_path):
    """vLLM's AutoWeightsLoader ignores unexpected `.bias` weights (0.33.0 utils.py, "Ignore
    unexpected biases"): a trained fc bias is lost without a word, which check reports."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    def with_tensor(name):
        folder = draft("speculators")
        tensors = load_file(str(folder / "model.safetensors"))
        tensors[name] = np.zeros(64, dtype=np.float16)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder

    report = check(with_tensor("fc.bias"), "vllm")
    assert codes(report) == {"dropped-keys"} and not report.uninitialized
    assert {k.key: k.status for k in report.keys}["fc.bias"] == "dropped"
    assert "skipped silently" in report.dropped[0].reason
    report = check(with_tensor("fc.scale"), "vllm")
    assert "loader-crash" in codes(report)  # only a .bias is let through


def test_vllm_vocab_map_by_release(draft):
    """vLLM 0.25.0-0.29.0 always build draft_id_to_target_id; from 0.30.0 only for a smaller draft
    vocabulary (llama_eagle3.py, Eagle3LlamaForCausalLM.__init__)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    full = draft("speculators", DraftShape(draft_vocab=None))  # no d2t: the target's vocabulary
    old, new = check(full, "vllm==0.29.0"), check(full, "vllm==0.30.0")
    assert codes(old) == codes(new) == set()
    assert statuses(old)["draft_id_to_target_id"] == "identity"  # zeros: draft id i is target id i
    assert "identity vocabulary map" in old.verdict and "draft_id_to_target_id" not in statuses(new)

    tensors = load_file(str(full / "model.safetensors"))
    tensors["d2t"] = np.zeros(256, dtype=np.int64)  # a d2t beside an equal vocabulary
    save_file(tensors, str(full / "model.safetensors"), metadata={"format": "pt"})
    assert statuses(check(full, "vllm==0.29.0"))["draft_id_to_target_id"] == "written"
    assert "loader-crash" in codes(check(full, "vllm==0.30.0"))

    smaller = draft("speculators")  # a 128-token draft vocabulary, its d2t removed
    tensors = load_file(str(smaller / "model.safetensors"))
    del tensors["d2t"]
    save_file(tensors, str(smaller / "model.safetensors"), metadata={"format": "pt"})
    for engine in ("vllm==0.29.0", "vllm==0.30.0"):  # zeros would map the 128 draft ids to target ids 0..127
        assert statuses(check(smaller, engine))["draft_id_to_target_id"] == "uninitialized"


def test_vllm_up_to_0_24_looks_names_up_in_a_dict_and_lets_no_bias_through(draft):
    """0.22.0-0.24.0: the draft model's own load_weights (`params_dict[name]`, a KeyError); from
    0.25.0 AutoWeightsLoader, which drops an unexpected bias silently."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    folder = draft("speculators")
    tensors = load_file(str(folder / "model.safetensors")) | {"fc.bias": np.zeros(64, dtype=np.float16)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    old = check(folder, "vllm==0.24.0")
    assert "loader-crash" in codes(old) and "KeyError: 'fc.bias'" in old.verdict
    assert codes(check(folder, "vllm==0.25.0")) == {"dropped-keys"}


def test_vllm_drops_an_input_norm_its_config_does_not_build(draft):
    """`input_norm.` keys are mapped to nothing unless the config sets norm_before_fc: the trained
    norm is lost without a word (every release 0.22.0-0.33.0)."""
    folder = draft("speculators", extra={"input_norm.weight": ("F16", (192,))})
    report = check(folder, "vllm==0.30.0")
    assert {k.key: k.status for k in report.keys}["input_norm.weight"] == "dropped"
    assert "dropped-keys" in codes(report) and "loader-crash" not in codes(report)


def test_fc_width_follows_eagle_config_ids_only(draft):
    """SGLang 0.5.23 and vLLM size fc by `eagle_config`'s aux ids, else for 3: four top-level ids
    (speculators' place) give a 3-state fc that a 4-state fc weight cannot load into."""
    four = DraftShape(aux_layer_ids=(1, 3, 5, 6))
    flat = check(draft("midlayer", four, config="flat"), "vllm")  # ids in eagle_config
    assert "shape-mismatch" not in codes(flat) and statuses(flat)["model.fc.weight"] == "written"
    nested = check(draft("speculators", four), "vllm")  # ids at the top level
    assert "shape-mismatch" in codes(nested) and "model.fc.weight" in nested.verdict


def test_newest_sglang_renames_legacy_midlayer(draft):
    report = check(draft("midlayer"), "sglang")
    assert report.engine.spec == "sglang==0.5.23" and codes(report) == set()
    assert all(p.name.startswith(("model.layers.0.", "model.", "lm_head")) for p in report.params)


def test_prefixed_keys(draft):
    folder = draft("prefixed")
    assert detect_layout(open_checkpoint(folder).keys(), None).name == "prefixed"
    assert codes(check(folder, "sglang==0.5.10")) == set()
    crash = check(folder, "sglang==0.4.8")
    assert "loader-crash" in codes(crash) and "KeyError" in crash.verdict


def test_crash_era_keyerror_on_layers_0(draft):
    report = check(draft("speculators", config="flat"), "sglang==0.4.8")
    assert "loader-crash" in codes(report)
    assert any(k.status == "not-reached" for k in report.keys)
    assert report.verdict.startswith("the server will not start")


def test_two_layers_crash_midlayer_era_and_load_on_newest(draft):
    folder = draft("speculators", shape=DraftShape(num_layers=2), config="flat")
    old = check(folder, "sglang==0.5.10")
    assert "loader-crash" in codes(old) and "only supports 1 layer" in old.verdict
    new = check(folder, "sglang==0.5.23")
    assert codes(new) == set() and sum(p.role == "layer" for p in new.params) == 14
    layer1 = next(p for p in new.params if p.name == "model.layers.1.self_attn.qkv_proj.weight")
    assert layer1.shape[1] == 64  # layers after the first take H, not 2H


def test_partly_written_fused_parameter(draft):
    report = check(draft("midlayer", drop=("midlayer.self_attn.v_proj.weight",)), "sglang==0.5.10")
    qkv = next(p for p in report.params if p.name.endswith("qkv_proj.weight"))
    assert qkv.status == "partial" and qkv.shards_missing == ["v"] and sorted(qkv.shards_written) == ["k", "q"]
    assert "uninitialized-params" in codes(report) and "shards v missing" in report.findings[0].message


def test_shape_mismatch(draft):
    import numpy as np

    bad = {"fc.weight": np.zeros((64, 128), dtype=np.float16)}  # two aux layers' width, config says three
    report = check(draft("midlayer", extra=bad), "sglang==0.5.10")
    assert "shape-mismatch" in codes(report)
    assert "Attempted to load weight" in report.verdict
    # a parameter's status is a parameter's word (the same string as the key's, in JSON)
    assert all(type(p.status) is ParamFate for p in report.params)
    assert [p.name for p in report.params if p.status == ParamFate.MISMATCH] == ["model.fc.weight"]


def test_missing_lm_head_and_fc_bias(draft):
    import numpy as np

    report = check(draft("midlayer", drop=("lm_head.weight",)), "sglang==0.5.10")
    assert statuses(report)["lm_head.weight"] == "uninitialized"
    extra = check(draft("midlayer", extra={"fc.bias": np.zeros(64, dtype=np.float16)}), "sglang==0.5.10")
    assert {k.key for k in extra.dropped} == {"fc.bias"}
    assert "model.fc.bias" in statuses(check(draft("midlayer"), "sglang==0.4.8"))


def test_training_only_keys_are_info(draft):
    import numpy as np

    report = check(draft("midlayer", extra={"verifier_norm.weight": np.ones(64, dtype=np.float16)}), "sglang==0.5.10")
    assert codes(report) == set() and "dropped-keys" in codes(report, "info")


def test_config_missing_or_wrong_architecture(draft):
    assert "config-unreadable" in codes(check(draft("midlayer", config="none"), "sglang==0.5.10"))
    import json

    folder = draft("midlayer")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["MistralForCausalLMEagle"]  # an EAGLE-2 class 0.5.10 does not register
    (folder / "config.json").write_text(json.dumps(config))
    report = check(folder, "sglang==0.5.10")
    assert "config-unreadable" in codes(report)
    assert "Cannot find model module. 'MistralForCausalLMEagle' is not a registered model" in report.verdict
    # a target's class is built, then fails to load (SGLang's own loaders: tests/test_differential.py)
    (folder / "config.json").write_text(json.dumps(config | {"architectures": ["LlamaForCausalLM"]}))
    report = check(folder, "sglang==0.5.10")
    assert "loader-crash" in codes(report) and report.verdict.startswith("the server will not start")


def test_null_target_hidden_size_crashes(draft):
    import json

    folder = draft("midlayer")
    config = json.loads((folder / "config.json").read_text())
    config["target_hidden_size"] = None
    (folder / "config.json").write_text(json.dumps(config))
    assert "loader-crash" in codes(check(folder, "sglang==0.5.10"))


def test_an_activation_other_than_silu_crashes_the_build(draft):
    """SGLang's and vLLM's draft MLP refuses any hidden_act but silu (seen with SGLang 0.5.10's own loader), in a
    flat config or in speculators' transformer_layer_config; the engines' message is said."""
    import json

    flat, nested = draft("midlayer"), draft("speculators")
    config = json.loads((flat / "config.json").read_text())
    (flat / "config.json").write_text(json.dumps(config | {"hidden_act": "gelu"}))
    config = json.loads((nested / "config.json").read_text())
    config["transformer_layer_config"]["hidden_act"] = "gelu"
    (nested / "config.json").write_text(json.dumps(config))
    for folder, engines in ((flat, ("sglang==0.5.10", "sglang==0.4.8", "vllm==0.32.0")), (nested, ("vllm==0.32.0",))):
        for engine in engines:
            report = check(folder, engine)
            assert "loader-crash" in codes(report) and report.verdict.startswith("the server will not start"), engine
            assert "Unsupported activation: gelu. Only silu is supported for now." in report.verdict
    assert "loader-crash" not in codes(check(draft("midlayer"), "sglang==0.5.10"))  # silu


@pytest.mark.parametrize("spec, expected", [
    ("sglang==0.5.10", "0.5.10"), ("sglang==0.4.4.post2", "0.4.4.post2"), ("sglang==0.5.11", "0.5.10"),
    ("sglang==0.5.9", "0.5.3"),
    ("sglang==0.4.8.post1", "0.4.4.post2"), ("sglang==0.4.9", "0.4.9"), ("sglang==0.5.0rc2", "0.4.9"),
    ("sglang==0.5.2", "0.5.2"), ("sglang==0.5.16", "0.5.12"), ("sglang==0.5.17", "0.5.17"),
    ("sglang==0.5.12", "0.5.12"), ("sglang", "0.5.17"), ("vllm", "0.34.0"), ("vllm==0.31.0", "0.30.0"),
    ("vllm==0.33.0", "0.30.0"), ("vllm==0.34.0", "0.34.0"),
    ("vllm==0.25.0", "0.25.0"), ("vllm==0.29.0", "0.25.0"), ("vllm==0.22.1", "0.22.0"), ("vllm==0.15.1", "0.12.0"),
    ("vllm==0.16.0", "0.16.0"), ("vllm==0.18.1", "0.18.0"), ("vllm==0.20.2", "0.19.0"), ("vllm==0.24.0", "0.24.0"),
    ("vllm==0.23.0", "0.23.0"),
])
def test_engine_specs(spec, expected):
    assert resolve_engine(spec).profile.first == expected


@pytest.mark.parametrize("spec", ["sglang==0.4.3", "tgi", "sglang==latest", "vllm==0.11.0"])
def test_unknown_engine_specs_list_known_ranges(spec):
    with pytest.raises(EngineSpecError) as e:
        resolve_engine(spec)
    assert "0.5.10–0.5.11" in str(e.value) or "expected e.g." in str(e.value)


@pytest.mark.parametrize("spec, newest, row", [("vllm==0.35.0", "0.34.0", "vllm==0.34.0"),
                                               ("sglang==0.6.0", "0.5.23", "sglang 0.5.17–0.5.23"),
                                               ("llamacpp==0.4.0", "0.3.36", "llamacpp==0.3.36")])
def test_a_release_newer_than_every_row_says_what_the_nearest_row_would_assume(spec, newest, row):
    """A user on a release the kit has not read gets the newest release it knows, what the nearest row
    assumes (drawn from the row itself), and where the docs say how to add one."""
    from pathlib import Path

    with pytest.raises(EngineSpecError) as e:
        resolve_engine(spec)
    said = str(e.value)
    engine = spec.split("==")[0]
    assert f"{spec} is newer than every release the kit knows (newest: {newest})" in said
    assert f"the nearest row, {row}, would assume {resolve_engine(f'{engine}=={newest}').profile.assumptions()}" in said
    assert f"`--engine {engine}=={newest}`" in said and "docs/adding-a-release.md" in said
    assert (Path(__file__).resolve().parents[1] / "docs" / "adding-a-release.md").is_file()


def test_vllm_reads_peagles_speculators_config_from_0_22_until_0_34_refuses_it(draft, tmp_path):
    """P-EAGLE's speculators type: refused before 0.22.0 ("Expected one of"), read as an EAGLE-3 draft from
    0.22.0 to 0.33.0 (only with its `mask_token_id`), refused by 0.34.0 in its own words."""
    from draftdoctor.synth import edit_config

    peagle = edit_config(draft("speculators"), speculators_model_type="peagle", mask_token_id=0)
    unmasked = edit_config(draft("speculators"), speculators_model_type="peagle")
    for release in ("0.21.0", "0.34.0"):
        report = check(peagle, f"vllm=={release}")
        assert codes(report) == {"config-unreadable"} and not report.params, release
    assert "P-EAGLE (parallel drafting EAGLE-3) is not supported." in check(peagle, "vllm==0.34.0").errors[0].message
    assert "Expected one of" in check(peagle, "vllm==0.21.0").errors[0].message
    for release in ("0.22.0", "0.29.0", "0.33.0"):
        report = check(peagle, f"vllm=={release}")
        assert codes(report) == set() and set(statuses(report).values()) == {"written"}, release
        assert "KeyError: 'mask_token_id'" in check(unmasked, f"vllm=={release}").errors[0].message
    assert codes(check(draft("speculators"), "vllm==0.34.0")) == set()  # eagle3's own type: read as ever


def test_layout_detection_evidence(draft):
    spec = detect_layout(open_checkpoint(draft("speculators")).keys(), open_checkpoint(draft("speculators")).config)
    assert spec.name == "speculators" and any("layers.0." in e for e in spec.evidence)
    mid = open_checkpoint(draft("midlayer"))
    assert detect_layout(mid.keys(), mid.config).name == "midlayer"


def test_sharded_checkpoint_coverage_matches_single_file(draft):
    one = check(draft("speculators", config="flat"), "sglang==0.5.10")
    many = check(draft("speculators", config="flat", shards=4), "sglang==0.5.10")
    assert statuses(one) == statuses(many)
    assert {k.key: k.status for k in one.keys} == {k.key: k.status for k in many.keys}


# --- a config the kit cannot read: said, never guessed in silence --------------------------------------------

def _edit_config(folder, edit):
    import json

    path = folder / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    return folder


def test_a_missing_config_field_is_said_with_the_dims_taken_from_the_tensors(draft):
    """Without num_attention_heads the dims come from the tensors, and the report names the field, the value
    assumed for it and the others; heads of 128 are the guess's own, so the draft loads as before (exit 0)."""
    shape = DraftShape(hidden=256, heads=2, kv_heads=1, head_dim=128, target_hidden=256)
    folder = _edit_config(draft("midlayer", shape=shape, config="flat"), lambda c: c.pop("num_attention_heads"))
    report = check(folder, "sglang==0.5.10", predict=False)
    [unread] = [f for f in report.findings if f.code == "dims-from-tensors"]
    assert unread.severity == "warning" and not report.errors
    assert unread.message.startswith(f"{folder / 'config.json'}: num_attention_heads is missing, so the draft's "
                                     "dimensions were taken from its tensors' shapes instead: assumed num_attention_heads 2; "
                                     "also hidden_size 256, intermediate_size 128, vocab_size 256, num_hidden_layers 1, "
                                     "num_key_value_heads 1, head_dim 128 (a guess: 128 when it divides q_proj's 256 rows, "
                                     "else 64)"), unread.message
    assert unread.message.endswith("write num_attention_heads into config.json")


@pytest.mark.parametrize("field, where", [("hidden_size", "transformer_layer_config."), ("vocab_size", "transformer_layer_config."),
                                          ("num_hidden_layers", "transformer_layer_config.")])
def test_a_null_config_field_is_said_where_it_sits(draft, field, where):
    """A null field of a speculators config is named inside transformer_layer_config, with the value assumed."""
    def null(config):
        config["transformer_layer_config"][field] = None

    folder = _edit_config(draft("speculators"), null)
    report = check(folder, "vllm==0.32.0", predict=False)
    [unread] = [f for f in report.findings if f.code == "dims-from-tensors"]
    assumed = {"hidden_size": "hidden_size 64", "vocab_size": "vocab_size 256", "num_hidden_layers": "num_hidden_layers 1"}
    assert f"config.json: {where}{field} is null, so" in unread.message and f"assumed {assumed[field]};" in unread.message
    assert "head_dim 64 (a guess" in unread.message  # the demo-sized draft's 16 is not what the guess gives: said


def test_a_readable_config_gets_no_dims_finding_and_an_impossible_value_is_exit_2(draft, tmp_path):
    from draftdoctor.checkpoint import CheckpointError

    assert "dims-from-tensors" not in {f.code for f in check(draft("midlayer", config="flat"), "sglang==0.5.10",
                                                               predict=False).findings}
    folder = _edit_config(draft("midlayer", config="flat"), lambda c: c.update(hidden_size="abc"))
    with pytest.raises(CheckpointError, match="hidden_size must be a whole number"):
        check(folder, "sglang==0.5.10", predict=False)


@pytest.mark.parametrize("change, said", [
    (lambda c: c.update(rms_norm_eps="1e-5"), "rms_norm_eps must be a number, not \"1e-5\""),
    (lambda c: c.update(rope_theta=True), "rope_theta must be a number, not true"),
    (lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": "x"}),
     "rope_parameters.rope_theta must be a number, not \"x\""),
])
def test_a_norm_epsilon_or_rope_base_that_is_no_number_is_exit_2(draft, change, said):
    """The draft's layer is computed with them (the prediction raised a TypeError on a string): one line, exit 2."""
    from draftdoctor.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=re.escape(said)):
        check(_edit_config(draft("midlayer", config="flat"), change), "sglang==0.5.10", predict=False)


def test_the_one_rename_type_keeps_order_anchors_and_drops():
    """`WeightsMapper` applies its steps in order, a prefix step only at the start, and a step to None
    drops the name (the first drop met is what the loader skips it for)."""
    from draftdoctor.engines.mapper import PREFIX, SUBSTR, WeightsMapper

    gguf = WeightsMapper("", ((PREFIX, "layers.", "blk."), (SUBSTR, "self_attn.q_proj", "attn_q"),
                              (PREFIX, "norm.", "output_norm."), (SUBSTR, "t2d", None)))
    assert gguf.map("layers.0.self_attn.q_proj.weight") == "blk.0.attn_q.weight"
    assert gguf.map("model.layers.0.input_layernorm.weight") == "model.layers.0.input_layernorm.weight"
    assert gguf.map("norm.weight") == "output_norm.weight" and gguf.map("hidden_norm.weight") == "hidden_norm.weight"
    assert gguf.map("t2d") is None and gguf.apply("t2d") == ("t2d", "t2d") and gguf.drops == ("t2d",)
    assert gguf.drops_only().map("layers.0.x") == "layers.0.x" and gguf.drops_only().map("t2d") is None
    vllm_style = WeightsMapper.of("", substr=(("midlayer.", "layers.0."),), prefix=(("layers.", "model.layers."),))
    assert vllm_style.map("midlayer.fc") == "model.layers.0.fc"  # substring maps first, then prefixes
    assert (vllm_style + gguf).map("midlayer.self_attn.q_proj") == "model.layers.0.attn_q"


def test_an_inner_function_refuses_a_spec_string_naming_the_parameter(draft):
    """Below the edges an engine release is an EngineRelease: a spec string is refused loudly (a TypeError
    naming the parameter), never resolved a second time; the edge (`check`) still takes the spec."""
    from draftdoctor.replay import replay

    ckpt = open_checkpoint(draft("midlayer"))
    with pytest.raises(TypeError, match=r"^engine must be an EngineRelease .* not str 'sglang==0.5.10'"):
        replay(ckpt, "sglang==0.5.10")
    engine = resolve_engine("sglang==0.5.10")
    assert replay(ckpt, engine).engine is engine
    assert check(draft("midlayer"), "sglang==0.5.10", predict=False).engine == engine
