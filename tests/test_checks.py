"""Beyond names: one fixture per way a draft loads and silently misbehaves, for each code the checks beyond names give."""

import json

import numpy as np
import pytest

from draftdoctor.diagnose import check
from draftdoctor.synth import DraftShape


def codes(report, severity=None):
    return {f.code for f in report.findings if severity is None or f.severity == severity}


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def target(tmp_path):
    def make(layers=8, hidden=64, vocab=256, context=2048):
        folder = tmp_path / f"target-{layers}-{hidden}-{vocab}-{context}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers,
            "hidden_size": hidden, "vocab_size": vocab, "max_position_embeddings": context}))
        return folder
    return make


def test_clean_draft_has_no_error_findings(draft, target):
    assert codes(check(draft("midlayer"), "sglang==0.5.10", target=target()), "error") == set()


def test_aux_ids_at_top_level_are_ignored_by_sglang(draft, target):
    folder = draft("midlayer")
    edit_config(folder, eagle_config={"use_aux_hidden_state": True}, eagle_aux_hidden_state_layer_ids=[1, 3, 5])
    report = check(folder, "sglang==0.5.10", target=target(layers=8))  # its default: the inputs of 2, 4, 5
    assert "aux-layer-ids" in codes(report, "error")
    assert "only from eagle_config" in next(f.message for f in report.findings if f.code == "aux-layer-ids")
    report = check(folder, "sglang==0.5.10")  # no target: whether the default layers differ is unknown
    assert "aux-layer-ids" in codes(report, "warning") and "--target" in str(report.findings)


def test_vllm_ignores_eagle_config_ids_which_is_harmless_only_if_its_default_layers_are_the_trained_ones(draft, target):
    """vLLM's default runner (Model Runner V2) reads only top-level ids; eagle_config's, in SGLang's
    convention (the input of layer id + 1), are ignored, at no cost when they name the inputs of
    vLLM's default layers (2, N // 2, N - 3)."""
    folder, eight = draft("midlayer"), target(layers=8)  # eagle_config ids [0, 2, 4]: the inputs of 1, 3, 5
    assert "aux-layer-ids" in codes(check(folder, "vllm", target=eight), "error")  # default: 2, 4, 5
    assert "aux-layer-ids" in codes(check(folder, "vllm"), "warning")  # no target: default layers unknown
    config = json.loads((folder / "config.json").read_text())
    edit_config(folder, eagle_config=config["eagle_config"] | {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]})
    report = check(folder, "vllm", target=eight)
    assert "aux-layer-ids" in codes(report, "info") and not report.errors


def test_vllm_0_22_reads_eagle_config_ids_as_is_and_0_23_ignores_them(draft, target):
    """0.22's default runner for a Llama target is V1, which falls back to eagle_config's ids and
    uses them as-is (one layer below SGLang's reading); from 0.23.0 it is Model Runner V2."""
    folder, eight = draft("midlayer"), target(layers=8)  # eagle_config ids [0, 2, 4]
    report = check(folder, "vllm==0.22.0", target=eight)
    found = next(f for f in report.findings if f.code == "aux-layer-ids")
    assert found.severity == "warning" and "1 below" in found.message
    assert "aux-layer-ids" in codes(check(folder, "vllm==0.23.0", target=eight), "error")


def test_vllm_up_to_0_24_does_not_read_fc_norm_from_speculators_config(draft):
    """vLLM 0.22.0-0.24.0 implement fc_norm but their speculators reader does not pass it on, so a
    speculators draft trained with it builds no fc_norm and fails on its weights; a flat one loads."""
    norms = {f"fc_norm.{i}.weight": ("F16", (64,)) for i in range(3)}
    nested = edit_config(draft("speculators", extra=norms), fc_norm=True)
    report = check(nested, "vllm==0.24.0")
    assert {"fc-norm-unsupported", "loader-crash"} <= codes(report, "error")
    assert "does not read from speculators' config" in str(report.findings)
    assert not check(nested, "vllm==0.25.0").errors
    config = json.loads((nested / "config.json").read_text())
    edit_config(nested, transformer_layer_config=config["transformer_layer_config"] | {"fc_norm": True})
    assert not check(nested, "vllm==0.24.0").errors  # where the reader starts: the model sees it
    flat = edit_config(draft("midlayer", extra=norms), fc_norm=True)
    report = check(flat, "vllm==0.24.0")
    assert not report.errors and {p.name: p.status for p in report.params}["model.fc_norm.0.weight"] == "written"


def test_aux_ids_outside_target_layers(draft, target):
    folder = draft("midlayer")  # eagle_config ids [0, 2, 4]: SGLang captures 1, 3, 5
    assert "aux-layer-ids" not in codes(check(folder, "sglang==0.5.10", target=target(layers=8)))
    report = check(folder, "sglang==0.5.10", target=target(layers=5))
    assert "aux-layer-uncapturable" in codes(report, "error") and "[4]" in report.verdict + str(report.findings)


def test_fewer_distinct_captured_layers_than_fc_takes(draft, target):
    """SGLang and vLLM capture each layer once: ids that name one layer twice, or no ids on a target whose
    default layers (2, N // 2, N - 3) coincide, give fc two aux states for three; llama.cpp repeats them."""
    folder, eight = draft("midlayer"), target(layers=8)
    edit_config(folder, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 2], "use_aux_hidden_state": True})
    for t in (None, eight):
        assert "aux-layer-uncapturable" in codes(check(folder, "sglang==0.5.10", target=t), "error")
    edit_config(folder, eagle_config=None)  # no ids: the defaults, the inputs of 2, 3, 3 on 6 layers
    report = check(folder, "sglang==0.5.10", target=target(layers=6))
    assert "aux-layer-uncapturable" in codes(report, "error") and "[2, 3, 3]" in report.verdict
    assert "aux-layer-uncapturable" not in codes(check(folder, "sglang==0.5.10", target=eight))
    assert "aux-layer-uncapturable" not in codes(check(folder, "sglang==0.5.10"))  # no target: layers unknown


def test_a_norm_epsilon_or_rope_base_other_than_the_targets_is_a_warning(draft, target):
    """The engine computes the draft's layer with the draft's rms_norm_eps and rope_theta; drafts are trained with
    their target's, so another value is said (a warning: the prediction says what it costs)."""
    folder, t = draft("midlayer"), target()
    config = json.loads((t / "config.json").read_text())
    (t / "config.json").write_text(json.dumps(config | {"rms_norm_eps": 1e-5, "rope_parameters": {
        "rope_type": "default", "rope_theta": 500000.0}}))
    edit_config(folder, rms_norm_eps=1e-5, rope_theta=500000.0)
    assert "target-mismatch" not in codes(check(folder, "sglang==0.5.10", target=t))
    edit_config(folder, rms_norm_eps=0.1, rope_theta=10000.0)
    said = [f for f in check(folder, "sglang==0.5.10", target=t).findings if f.code == "target-mismatch"]
    assert {f.severity for f in said} == {"warning"} and len(said) == 2
    assert "rms_norm_eps 0.1 but the target's is 1e-05" in said[0].message
    assert "rope_theta 10000 but the target's is 500000" in said[1].message


def test_the_input_of_layer_0_is_capturable_by_vllm_only(draft, target):
    """Trained on the input of layer 0 (top-level id 0): SGLang's capture (id + 1, at the start of
    layers 1..N-1) cannot reach it, with or without --target; vLLM captures the embedding too."""
    folder = edit_config(draft("speculators"), eagle_aux_hidden_state_layer_ids=[0, 1, 2])
    sglang_style = edit_config(draft("midlayer"), eagle_config={"eagle_aux_hidden_state_layer_ids": [-1, 0, 1],
                                                                "use_aux_hidden_state": True})
    eight = target(layers=8)
    for t in (None, eight):
        report = check(sglang_style, "sglang==0.5.10", target=t)
        assert "aux-layer-uncapturable" in codes(report, "error"), report.findings
        assert "target layer(s) [0]" in str(report.findings)
        assert "aux-layer-uncapturable" not in codes(check(folder, "vllm", target=t))
    # and the other end: vLLM captures up to the last layer's output (layer N's input), SGLang to N - 1
    last = edit_config(draft("speculators"), eagle_aux_hidden_state_layer_ids=[1, 3, 8])
    assert "aux-layer-uncapturable" not in codes(check(last, "vllm", target=eight))
    assert "aux-layer-uncapturable" in codes(check(last, "vllm", target=target(layers=7)), "error")


def test_norm_before_residual_under_sglang(draft):
    folder = edit_config(draft("midlayer"), norm_before_residual=True)
    assert "norm-before-residual" in codes(check(folder, "sglang==0.5.23"), "error")
    assert "norm-before-residual" not in codes(check(folder, "vllm"))


def test_norm_before_residual_kept_by_a_lossy_fix_is_still_flagged(draft, tmp_path):
    from draftdoctor.fix import apply_fix, plan_fix

    src = edit_config(draft("speculators"), norm_before_residual=True)
    fixed = apply_fix(plan_fix(src, "sglang==0.5.10"), tmp_path / "fixed", allow_lossy=True).dst
    assert "norm_before_residual" not in json.loads((fixed / "config.json").read_text())
    report = check(fixed, "sglang==0.5.10")
    assert "norm-before-residual" in codes(report, "error") and "lossy fix" in report.verdict
    # vLLM implements the option but reads it from the top level, not from draftdoctor's record
    report = check(fixed, "vllm")
    assert "fix --engine vllm" in next(f.message for f in report.errors if f.code == "norm-before-residual")


def test_fc_norm_and_input_norm_per_release(draft):
    extra = {f"fc_norm.{i}.weight": np.ones(64, dtype=np.float16) for i in range(3)}
    folder = edit_config(draft("midlayer", extra=extra), fc_norm=True)
    assert "fc-norm-unsupported" in codes(check(folder, "sglang==0.5.10"))
    assert "fc-norm-unsupported" not in codes(check(folder, "sglang==0.5.23"))
    folder = draft("midlayer", extra={"input_norm.weight": np.ones(192, dtype=np.float16)})
    assert "input-norm-unsupported" in codes(check(folder, "sglang==0.5.10"))


def test_qk_norm_unsupported(draft):
    assert "qk-norm-unsupported" in codes(check(draft("midlayer", qk_norm=True), "sglang==0.5.23"))


def message(report, code):
    return next(f.message for f in report.findings if f.code == code)


def test_the_releases_a_finding_names_are_read_from_the_rows(draft, monkeypatch):
    """Where a finding says which releases compute an option, the names come from the profile rows: the
    rows' own ranges, and a release added as one row is named with no other change (the registry once
    said "SGLang >= 0.5.12" for input norms, which SGLang computes only from 0.5.17)."""
    import dataclasses

    from draftdoctor.engines import sglang

    folder = draft("midlayer", extra={"input_norm.weight": np.ones(192, dtype=np.float16)})
    said = message(check(folder, "sglang==0.5.10"), "input-norm-unsupported")
    assert "sglang 0.5.17–0.5.23" in said and "0.5.12" not in said and "vllm " in said
    newest = next(p for p in sglang.PROFILES if p.last == "0.5.23" and p.build.draft_class == "llama")
    monkeypatch.setattr(sglang, "PROFILES", [*sglang.PROFILES, dataclasses.replace(newest, first="0.6.0", last="0.6.2")])
    assert "sglang 0.5.17–0.6.2" in message(check(folder, "sglang==0.5.10"), "input-norm-unsupported")
    qk = message(check(draft("midlayer", qk_norm=True), "sglang==0.5.23"), "qk-norm-unsupported")
    assert "sglang" not in qk.partition("releases that compute it:")[2] and "vllm 0.24.0–" in qk


def test_the_registry_names_no_release():
    """Release names live in rows; the registry's fixed texts say what, and the finding says where."""
    import re

    from draftdoctor.findings import CODES

    for code, entry in CODES.items():
        assert not re.search(r"\d+\.\d+\.\d+", entry.meaning + entry.remedy), code


def test_vocab_map_missing(draft):
    report = check(draft("midlayer", drop=("d2t", "t2d")), "sglang==0.5.10")
    assert "vocab-map-missing" in codes(report, "error")


@pytest.mark.parametrize("d2t, t2d, problem", [
    (np.zeros(100, dtype=np.int64), None, "entries but draft_vocab_size"),
    (np.full(128, 500, dtype=np.int64), None, "outside 0..255"),
    (-np.arange(128, dtype=np.int64), None, "not strictly increasing"),
    (np.arange(128, dtype=np.int64), np.zeros(256, dtype=np.bool_), "t2d does not mark"),
])
def test_vocab_map_invalid(draft, d2t, t2d, problem):
    extra = {"d2t": d2t} | ({"t2d": t2d} if t2d is not None else {})
    report = check(draft("midlayer", extra=extra), "sglang==0.5.10")
    assert "vocab-map-invalid" in codes(report, "error")
    assert problem in " ".join(f.message for f in report.findings)


def test_synthetic_vocab_map_is_valid(draft):
    assert "vocab-map-invalid" not in codes(check(draft("speculators", config="flat"), "sglang==0.5.10"))


def test_lm_head_missing_and_embed_missing(draft):
    report = check(draft("midlayer", drop=("lm_head.weight",)), "sglang==0.5.10")
    assert "lm-head-missing" in codes(report, "error")
    assert "embed-missing" in codes(check(draft("midlayer"), "sglang==0.5.10"), "info")


def test_vllm_takes_the_targets_head_and_embedding_for_missing_ones(draft):
    """vLLM's proposer shares the target's lm_head / embed_tokens when the checkpoint has none
    (`has_own_lm_head`, `has_own_embed_tokens`): right for the target's vocabulary, a failure at the
    first draft step for a smaller one; a draft's own embedding is kept (SGLang replaces it)."""
    full = check(draft("speculators", DraftShape(draft_vocab=None), drop=("lm_head.weight",)), "vllm")
    assert not full.errors and {p.name: p.status for p in full.params}["lm_head.weight"] == "from-target"
    assert "lm-head-missing" in codes(full, "info")
    smaller = check(draft("speculators", drop=("lm_head.weight",)), "vllm")  # 128 of 256 tokens
    assert "lm-head-missing" in codes(smaller, "error") and "first draft step" in str(smaller.findings)
    own = draft("speculators", embed=True)
    embed = {p.name: p for p in check(own, "vllm").params}["model.embed_tokens.weight"]
    assert embed.status == "written" and not embed.replaced_by_target
    assert {p.name: p for p in check(own, "sglang==0.5.23").params}["model.embed_tokens.weight"].replaced_by_target


def test_target_mismatch(draft, target):
    folder = draft("midlayer")
    report = check(folder, "sglang==0.5.10", target=target(hidden=32, vocab=300, context=4096))
    messages = " ".join(f.message for f in report.findings if f.code == "target-mismatch")
    assert "fc.weight takes 192 inputs" in messages and "vocab" in messages and "max_position_embeddings" in messages


def test_nan_and_zero_weights(draft):
    """A NaN embedding is an error where the engine serves with it (vLLM), information where the engine
    replaces it with the target's (SGLang)."""
    nan_embed = np.full((256, 64), np.nan, dtype=np.float16)
    folder = draft("speculators", config="flat", extra={"embed_tokens.weight": nan_embed})
    report = check(folder, "vllm==0.32.0")
    assert "nan-weights" in codes(report, "error") and "embed_tokens.weight" in str(report.findings)
    replaced = check(folder, "sglang==0.5.10")
    assert "nan-weights" in codes(replaced, "info") and "nan-weights" not in codes(replaced, "error")
    zero = check(draft("midlayer", extra={"norm.weight": np.zeros(64, dtype=np.float16)}), "sglang==0.5.10")
    assert "nan-weights" in codes(zero, "warning")


def test_nan_sampling_reads_only_a_few_bytes(tmp_path):
    """A multi-GB sparse tensor is sampled, not read: it reads as zeros, flagged, instantly."""
    from draftdoctor.synth import LLAMA_8B, write_draft

    folder = write_draft(tmp_path / "big", LLAMA_8B, layout="midlayer", fill="sparse")
    report = check(folder, "sglang==0.5.10")
    assert "nan-weights" in codes(report, "warning")


def test_target_option_in_cli(draft, target, capsys):
    from draftdoctor.cli import main

    code = main(["check", str(draft("midlayer")), "--engine", "sglang==0.5.10", "--target", str(target(layers=5))])
    assert code == 1 and "aux-layer-uncapturable" in capsys.readouterr().out
    assert main(["check", str(draft("midlayer")), "--engine", "sglang==0.5.10", "--target", "/nonexistent"]) == 2


def test_eagle_algorithm_with_an_eagle3_draft_is_refused_before_launch(draft, tmp_path):
    from draftdoctor.serving.launcher import LaunchRefused, ServeConfig, serve

    folder = draft("midlayer")
    config = ServeConfig(target=str(tmp_path), draft=str(folder), algorithm="EAGLE", port=1)
    with pytest.raises(LaunchRefused, match="algorithm-mismatch"):
        serve("sglang", config, tmp_path / "server.log")
    assert not (tmp_path / "server.log").exists()
