"""Every EAGLE-3 draft class the supported releases register: the parameter list of MLA drafts
(SGLang's `Eagle3DeepseekV2ForCausalLM`; vLLM's, also registered as `...V3...`) and of vLLM's Qwen3 class
(q/k norms) is the engines' own; their case-by-case fates are in the differential corpus
(draftdoctor.proofs.differential, tests/test_differential.py). Needs `make sglang-loaders vllm-loaders`."""

import pytest
from conftest import require_release

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.proofs import differential
from draftdoctor.coverage import draft_dims
from draftdoctor.replay import replay
from draftdoctor.engines import parameters, resolve_engine
from draftdoctor.synth import write_mla_draft

L = differential.L


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("classes")
    return {name: folder for name, folder in differential.write_cases(root, "vllm").items() if not name.startswith("llama/")}


@pytest.mark.parametrize("engine,draft_class", [("sglang==0.5.23", "mla"), ("vllm==0.32.0", "mla"),
                                                ("vllm==0.32.0", "qwen3")])
def test_each_class_parameter_list_is_the_engines_own(drafts, engine, draft_class):
    """Names and shapes of every parameter, from `engines.parameters`, against the engine's own model class
    built by its real loader (the child reports `named_parameters()`)."""
    name, release = engine.split("==")
    require_release(release, name)
    folder = drafts["mla/complete" if draft_class == "mla" else "qwen3/flat"]
    checkpoint = open_checkpoint(folder)
    profile = resolve_engine(engine).profile_for(checkpoint.config)
    assert profile.build.draft_class == draft_class
    from draftdoctor.realload import run_real_loader

    raw = run_real_loader(folder, release, engine_name=name)
    theirs = {p["name"]: tuple(p["shape"]) for p in raw["parameters"]}
    ours = {p.name: tuple(p.shape) for p in parameters(profile, draft_dims(checkpoint))}
    assert ours == theirs


def test_mla_fused_pair_one_without_the_other():
    """The replay alone (no engine needed): SGLang holds q_a_proj until kv_a_proj_with_mqa arrives and
    never loads it alone, silently; vLLM writes its half of the fused parameter."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_mla_draft(Path(tmp) / "d", drop=(f"{L}kv_a_proj_with_mqa.weight",))
        sglang = replay(open_checkpoint(folder), resolve_engine("sglang==0.5.23"))
        fused = {p.name: p.status for p in sglang.params}["model.midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"]
        assert fused == "uninitialized" and [k.key for k in sglang.dropped] == [f"{L}q_a_proj.weight"]
        assert "never loads it, and says nothing" in sglang.dropped[0].reason
        vllm = replay(open_checkpoint(folder), resolve_engine("vllm==0.32.0"))
        half = next(p for p in vllm.params if p.name.endswith("fused_qkv_a_proj.weight"))
        assert half.status == "partial" and half.shards_missing == ["1"]


@pytest.mark.parametrize("name,engine", [("mla/complete", "sglang==0.5.23"), ("mla/complete", "vllm==0.32.0"),
                                         ("qwen3/flat", "vllm==0.32.0")])
def test_the_reference_backend_says_it_computes_only_the_llama_class(drafts, name, engine):
    from pathlib import Path

    from draftdoctor.eagle.llama import TargetModel
    from draftdoctor.diagnose import check
    from draftdoctor.eagle.loading import LoadRefused, place

    target = TargetModel.from_dir(Path(__file__).resolve().parents[1] / "data" / "demo" / "target")
    with pytest.raises(LoadRefused, match="computes the Llama EAGLE-3 draft only"):
        place(check(drafts[name], engine), target)
