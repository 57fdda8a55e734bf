"""`inspect` names the draft architecture and the trainer it recognises, with evidence."""

import json

import pytest

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.provenance import LLAMA, MLA, QWEN3, recognise


def edit(folder, **changes):
    config = json.loads((folder / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("make,architecture,trainer", [
    (lambda d: d("speculators"), LLAMA, "speculators"),
    (lambda d: d("speculators", config="flat"), LLAMA, "a converter"),
    (lambda d: d("midlayer"), LLAMA, "the EAGLE repo, SpecForge or a converter"),  # nothing tells them apart
    (lambda d: edit(d("midlayer"), architectures=["LlamaForCausalLM"]), LLAMA, "the EAGLE repo"),
    (lambda d: edit(d("midlayer"), architectures=["Eagle3LlamaForCausalLM"]), LLAMA, "AngelSlim"),
    (lambda d: edit(d("midlayer"), architectures=["Eagle3DeepseekV2ForCausalLM"]), MLA, "ModelOpt"),
    (lambda d: d("speculators", qk_norm=True), QWEN3, "speculators"),
])
def test_architecture_and_trainer_are_recognised(draft, make, architecture, trainer):
    ckpt = open_checkpoint(make(draft))
    found = recognise(ckpt.tensors, ckpt.config)
    assert (found.architecture, found.trainer) == (architecture, trainer), found.evidence
    assert len(found.evidence) == 2 and all(found.evidence)


def test_inspect_shows_them(draft, capsys):
    from draftdoctor.cli import main

    folder = edit(draft("midlayer"), architectures=["LlamaForCausalLM"])
    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "draft: Llama EAGLE-3, written by the EAGLE repo, as far as this evidence shows" in out
    assert "midlayer.* keys" in out
    assert main(["inspect", str(folder), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["trainer"] == "the EAGLE repo" and doc["architecture"] == LLAMA


def _modelopt_corpus_draft(tmp_path):
    from draftdoctor.proofs.differential import PUBLIC
    from draftdoctor.synthwrite import write_header_only

    case = PUBLIC / "template-modelopt-llama3.1-8b"
    config = json.loads((case / "config.json").read_text())
    return write_header_only(tmp_path / "modelopt", json.loads((case / "tensors.json").read_text()), config), config


def test_a_modelopt_export_is_recognised_by_what_its_header_and_config_show(tmp_path, capsys):
    """ModelOpt 0.47's unquantized export names no producer: its eagle_config switches and layers.N.* keys say
    ModelOpt >= 0.43 (it wrote midlayer.* up to 0.42), with d2t without t2d, no embed_tokens and no
    __metadata__ as further evidence; only a quantized export names the release (docs/engine-facts.md)."""
    from draftdoctor.cli import main

    folder, config = _modelopt_corpus_draft(tmp_path)
    ckpt = open_checkpoint(folder)
    assert all(s.metadata is None for s in ckpt.shards)
    found = recognise(ckpt.tensors, ckpt.config, metadata_absent=True)
    assert (found.architecture, found.trainer) == (LLAMA, "ModelOpt ≥ 0.43")
    for fact in ("'next_layer_regular'", "layers.N.* keys without model.", "d2t without t2d", "no embed_tokens",
                 "aux ids only in eagle_config", "no __metadata__", "nothing in an unquantized export names its release"):
        assert fact in found.evidence[1], fact
    assert "no __metadata__" not in recognise(ckpt.tensors, ckpt.config).evidence[1]  # not known: not said
    quantized = config | {"quantization_config": {"producer": {"name": "modelopt", "version": "0.47.0"},
                                                  "quantization": {"quant_algo": "FP8"}}}
    assert recognise(ckpt.tensors, quantized).trainer == "ModelOpt 0.47.0"
    older = [k.replace("layers.0.", "midlayer.") for k in ckpt.tensors]
    assert recognise(older, config).trainer == "ModelOpt ≤ 0.42"
    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "written by ModelOpt ≥ 0.43, as far as this evidence shows" in out and "no __metadata__" in out


@pytest.mark.parametrize("engine,renamed,moved", [
    ("sglang==0.5.10", True, False), ("sglang==0.5.23", False, False),
    ("vllm==0.32.0", False, True), ("llamacpp==0.3.36", False, True)])
def test_what_check_and_fix_say_for_a_modelopt_export(draft, tmp_path, capsys, engine, renamed, moved):
    """Its layout on each engine: SGLang up to 0.5.11 drops the layers.0.* keys silently (fix renames them);
    vLLM and llama.cpp ignore eagle_config's ids (ModelOpt's convention, SGLang's), harmlessly here since their
    default layers are the trained ones for this target, and fix moves them to the top level, plus 1."""
    from draftdoctor.cli import main
    from draftdoctor.diagnose import check

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 256,
                                                    "max_position_embeddings": 2048}))
    src = draft("speculators", config="flat", embed=False, drop=("t2d",))
    edit(src, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 4],  # ModelOpt's defaults for 8 layers
                            "use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True,
                            "use_last_layernorm": True, "use_mtp_layernorm": False, "next_layer_regular": True,
                            "parallel_draft_step": 1, "parallel_draft_heads_num_layers": 1})
    ckpt = open_checkpoint(src)
    assert recognise(ckpt.tensors, ckpt.config).trainer == "ModelOpt ≥ 0.43"
    report = check(src, engine, loader="replay", target=target)
    assert ("dropped-keys" in {f.code for f in report.errors}) == renamed, report.verdict
    ids = [f for f in report.findings if f.code == "aux-layer-ids"]
    assert bool(ids) == moved and all(f.severity == "info" and "no harm" in f.message for f in ids)
    assert main(["fix", str(src), "--engine", engine, "--target", str(target), "--loader", "replay", "--plan"]) == 0
    out = capsys.readouterr().out
    assert ("rule: layers.0. -> midlayer." in out) == renamed
    assert ("[1, 3, 4] -> [2, 4, 5] (now eagle_aux_hidden_state_layer_ids)" in out) == moved
    assert "predicted: loads cleanly" in out or engine == "sglang==0.5.23" and "nothing to change" in out, out
