"""MLA EAGLE-3 drafts for Kimi/DeepSeek targets: SGLang 0.5.23 and vLLM 0.32.0 build
`Eagle3DeepseekV2ForCausalLM`; their own loaders say what happens, the replay agrees, and `fix` writes
what each loads (or refuses a release without the class). Needs `make sglang-loaders vllm-loaders`."""

import pytest
from conftest import require_release

from draftdoctor.cli import main
from draftdoctor.diagnose import check
from draftdoctor.realcheck import real_checks
from draftdoctor.synth import DraftShape, write_mla_draft
from draftdoctor.engines import resolve_engine

CASES = {
    "complete": dict(),
    "no-kv-a-proj": dict(drop=("layers.0.self_attn.kv_a_proj_with_mqa.weight",)),
    # draft_vocab_size (== the vocabulary, as nvidia/Kimi-K2.6-Eagle3) still declared: SGLang issue #27829
    "no-lm-head": dict(shape=DraftShape(draft_vocab=256), drop=("lm_head.weight",)),
}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("mla")
    return {name: write_mla_draft(root / name, **spec) for name, spec in CASES.items()}


@pytest.fixture(scope="module", params=["sglang==0.5.23", "vllm==0.32.0"])
def real(request, drafts):
    engine = request.param
    name, release = engine.split("==")
    require_release(release, name)
    return engine, dict(zip(drafts, real_checks(list(drafts.values()), resolve_engine(engine))))


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
    """SGLang 0.5.23 keeps a random head (accept length 1.00, SGLang issue #27829); vLLM takes the target's."""
    engine, reports = real
    head = statuses(reports["no-lm-head"])["lm_head.weight"]
    assert head == ("uninitialized" if engine.startswith("sglang") else "from-target")


def test_the_replay_agrees_and_fix_writes_what_each_engine_loads(real, drafts, tmp_path, capsys):
    """The replay models the MLA class (its parameters, SGLang's cached pair, vLLM's sharded fusion):
    on these drafts it says what the engine's own loader says, and `fix` writes a checkpoint the
    engine loads cleanly, verified by the same check."""
    engine, reports = real
    for name, folder in drafts.items():
        played = check(folder, engine)
        assert {p.name: p.status for p in played.params} == statuses(reports[name]), name
    out = tmp_path / "fixed"
    code = main(["fix", str(drafts["complete"]), "--engine", engine, "--out", str(out)])
    assert code == 0, capsys.readouterr().out
    assert check(out, engine).verdict.startswith("loads cleanly")
    assert not {f.code for f in real_checks([out], resolve_engine(engine))[0].errors}


def test_fix_refuses_an_mla_draft_for_a_release_without_the_class(drafts, tmp_path, capsys):
    code = main(["fix", str(drafts["complete"]), "--engine", "sglang==0.5.10", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 1 and "class-unregistered" in out and "sglang 0.5.12–0.5.23" in out and not (tmp_path / "out").exists()
