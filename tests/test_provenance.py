"""`inspect` names the draft architecture and the trainer it recognises, with evidence (issue 20)."""

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
