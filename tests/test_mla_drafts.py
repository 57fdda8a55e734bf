"""MLA EAGLE-3 drafts for Kimi/DeepSeek targets (issue 20): SGLang 0.5.23 and vLLM 0.32.0 build
`Eagle3DeepseekV2ForCausalLM`; their own loaders say what happens, and the replay says plainly that it
does not model the class instead of inventing findings. Needs `make sglang-loaders vllm-loaders`."""

import pytest
from conftest import require_release

from draftdoctor.cli import main
from draftdoctor.diagnose import check
from draftdoctor.realcheck import real_checks
from draftdoctor.synth import DraftShape, write_mla_draft

CASES = {
    "complete": dict(),
    "no-kv-a-proj": dict(drop=("layers.0.self_attn.kv_a_proj_with_mqa.weight",)),
    "no-lm-head": dict(drop=("lm_head.weight",)),  # draft_vocab_size still declared: SGLang issue #27829
}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("mla")
    return {name: write_mla_draft(root / name, shape=DraftShape(), **spec) for name, spec in CASES.items()}


@pytest.fixture(scope="module", params=["sglang==0.5.23", "vllm==0.32.0"])
def real(request, drafts):
    engine = request.param
    name, release = engine.split("==")
    require_release(release, name)
    return engine, dict(zip(drafts, real_checks(list(drafts.values()), engine)))


def statuses(report):
    return {p.name: p.status for p in report.params}


def test_a_complete_mla_draft_loads_cleanly_in_both_engines(real):
    engine, reports = real
    report = reports["complete"]
    assert not report.errors, report.findings
    fused = next(p for p in report.params if "fused_qkv_a_proj" in p.name)
    # one parameter built from two keys is attributed to both (SGLang concatenates them before writing)
    assert fused.status == "written" and len(fused.keys) == 2


def test_one_of_the_fused_pair_without_the_other(real):
    """SGLang caches q_a_proj until kv_a_proj_with_mqa arrives: alone, it is never loaded, silently."""
    engine, reports = real
    got = statuses(reports["no-kv-a-proj"])
    fused = next(n for n in got if "fused_qkv_a_proj" in n)
    if engine.startswith("sglang"):
        assert got[fused] == "uninitialized"
        assert "layers.0.self_attn.q_a_proj.weight" in {k.key for k in reports["no-kv-a-proj"].dropped}
        assert not any(f.code == "loader-crash" for f in reports["no-kv-a-proj"].findings)
    else:
        assert got[fused] in ("partial", "uninitialized")


def test_no_head_with_a_declared_draft_vocabulary(real):
    """SGLang 0.5.23 keeps a random head (accept length 1.00, its issue #27829); vLLM takes the target's."""
    engine, reports = real
    head = statuses(reports["no-lm-head"])["lm_head.weight"]
    assert head == ("uninitialized" if engine.startswith("sglang") else "from-target")


def test_the_replay_says_it_does_not_model_mla_and_fix_refuses(drafts, tmp_path, capsys):
    for engine in ("sglang==0.5.23", "vllm==0.32.0"):
        report = check(drafts["complete"], engine)
        assert [f.code for f in report.findings][0] == "replay-not-modelled" and not report.params
        assert report.verdict.startswith("not checked:") and not report.errors
        code = main(["fix", str(drafts["complete"]), "--engine", engine, "--out", str(tmp_path / "out")])
        out = capsys.readouterr().out
        assert code == 1 and "replay-not-modelled" in out and not (tmp_path / "out").exists()
