"""One verdict: `fix` writes only what `check` then passes, and refuses the rest with the reason.

The invariant is checked over a corpus of layouts, configs and defects, for one release of every
engine profile row, with a target: whenever `fix` exits 0, `check --target` on its output exits 0.
"""

import json

import numpy as np
import pytest

from draftdoctor.cli import main
from draftdoctor.engines import all_profiles
from draftdoctor.synth import DraftShape

H = 64


def cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def target(tmp_path):
    """A target config that the synthetic drafts fit (8 layers, hidden 64, vocabulary 256)."""
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
        "hidden_size": H, "vocab_size": 256, "max_position_embeddings": 2048}))
    return folder


def test_a_draft_trained_on_layer_0s_input_is_refused_for_sglang_and_fixed_for_vllm(draft, target, tmp_path, capsys):
    """speculators' top-level ids [0, 1, 2]: the input of layers 0, 1, 2. SGLang captures id + 1 at the
    start of layers 1..N-1, so no id can name layer 0's input; vLLM captures it."""
    src = edit_config(draft("speculators", shards=2), eagle_aux_hidden_state_layer_ids=[0, 1, 2])
    out_dir = tmp_path / "fixed-sglang"
    code, out, err = cli(capsys, "fix", src, "--engine", "sglang==0.5.10", "--target", target, "--out", out_dir)
    assert code == 1 and not err and not out_dir.exists()
    assert out.startswith("refused: nothing written") and "aux-layer-uncapturable" in out
    assert "target layer(s) [0]" in out and "retrain with other aux layer ids" in out
    assert "(vLLM captures layer 0's input)" in out
    assert not any(p.name.startswith(".fixed-sglang") for p in tmp_path.iterdir())  # no temporary left either
    code, out, _ = cli(capsys, "fix", src, "--engine", "sglang==0.5.10", "--out", out_dir)  # no target: the same
    assert code == 1 and "aux-layer-uncapturable" in out and not out_dir.exists()

    code, out, _ = cli(capsys, "fix", src, "--engine", "vllm==0.32.0", "--target", target, "--out", tmp_path / "fixed-vllm")
    assert code == 0, out
    verdict = out.splitlines()[-1]
    code, checked, _ = cli(capsys, "check", tmp_path / "fixed-vllm", "--engine", "vllm==0.32.0", "--target", target)
    assert code == 0 and verdict == checked.splitlines()[-1] and verdict.startswith("verdict: loads cleanly")


def test_garbage_vocab_map_is_refused(draft, target, tmp_path, capsys):
    garbage = np.random.default_rng(0).integers(-10**6, 10**6, size=128).astype(np.int64)
    src = draft("speculators", extra={"d2t": garbage})
    code, out, _ = cli(capsys, "fix", src, "--engine", "sglang==0.5.10", "--target", target, "--out", tmp_path / "out")
    assert code == 1 and "vocab-map-invalid" in out and "rebuild the vocabulary map" in out
    assert not (tmp_path / "out").exists()
    code, out, _ = cli(capsys, "fix", src, "--engine", "sglang==0.5.10", "--plan")
    assert code == 1 and "refused: nothing written" in out


def test_fix_without_target_says_what_it_could_not_check(draft, tmp_path, capsys):
    code, out, _ = cli(capsys, "fix", draft("speculators"), "--engine", "sglang==0.5.10", "--out", tmp_path / "out")
    assert code == 0 and "INFO    not-checked: no --target" in out
    assert out.splitlines()[-1].startswith("verdict: loads cleanly")


CORPUS = {
    "speculators": dict(layout="speculators"),
    "speculators-flat": dict(layout="speculators", config="flat"),
    "midlayer": dict(layout="midlayer"),
    "midlayer-speculators-config": dict(layout="midlayer", config="speculators"),
    "model-prefixed": dict(layout="prefixed"),
    "sharded": dict(layout="speculators", shards=3),
    "no-lm-head": dict(layout="midlayer", drop=("lm_head.weight",)),
    "no-vocab-map": dict(layout="midlayer", drop=("d2t", "t2d")),
    "full-vocab": dict(layout="speculators", shape=DraftShape(draft_vocab=None)),
    "extra-fc-bias": dict(layout="midlayer", extra={"fc.bias": np.zeros(H, dtype=np.float16)}),
    "two-layers": dict(layout="speculators", config="flat", shape=DraftShape(num_layers=2)),
    "wrong-fc-shape": dict(layout="midlayer", extra={"fc.weight": np.zeros((H, 2 * H), dtype=np.float16)}),
    "qk-norms": dict(layout="speculators", qk_norm=True),
    "nan-weights": dict(layout="speculators", fill="nan"),
    "other-target": dict(layout="speculators", shape=DraftShape(hidden=32, target_hidden=32, head_dim=8)),
    "garbage-d2t": dict(layout="speculators", extra={"d2t": np.full(128, 10**6, dtype=np.int64)}),
    # EAGLE 3.1's per-aux norms without their switch: fix writes it where the release builds them, else refuses
    "fc-norm-keys": dict(layout="midlayer", extra={f"fc_norm.{i}.weight": (1 + np.random.default_rng(i).standard_normal(
        H) / 10).astype(np.float16) for i in range(3)}),
}
CONFIG_EDITS = {
    "ids-0-1-2": dict(eagle_aux_hidden_state_layer_ids=[0, 1, 2]),
    "ids-past-the-end": dict(eagle_aux_hidden_state_layer_ids=[2, 4, 8]),
    "norm-before-residual": dict(norm_before_residual=True),
    "fc-norm": dict(fc_norm=True),
    "norm-output": dict(norm_output=True),
}


def corpus(draft):
    cases = {name: draft(**spec) for name, spec in CORPUS.items()}
    cases |= {name: edit_config(draft("speculators"), **edit) for name, edit in CONFIG_EDITS.items()}
    cases["sglang-ids-only"] = draft("midlayer")  # flat, ids in eagle_config only
    return cases


def fix_then_check(capsys, src, engine, target, dst, loader):
    """fix's exit status; when it wrote, check on its output must pass with fix's last line as its verdict."""
    code, out, err = cli(capsys, "fix", src, "--engine", engine, "--target", target, "--out", dst, "--loader", loader)
    assert code in (0, 1), (src.name, engine, err)
    if code != 0:
        assert not dst.exists(), (src.name, engine)
        return code
    checked, report, _ = cli(capsys, "check", dst, "--engine", engine, "--target", target, "--loader", loader)
    assert checked == 0, f"{src.name} fixed for {engine} exits 0, but check says:\n{report}"
    assert out.splitlines()[-1] == report.splitlines()[-1]  # fix's last line is check's verdict
    return code


def test_whenever_fix_succeeds_check_on_its_output_passes(draft, target, tmp_path, capsys):
    """Every profile row, the whole corpus, the replay loader (the real loaders are held to the replay
    by tests/test_differential.py; the next test runs this invariant on them)."""
    engines = list(dict.fromkeys(f"{row.engine}=={row.last}" for row in all_profiles()))
    (tmp_path / "out").mkdir()
    cases = corpus(draft)
    outcomes = {(name, engine): fix_then_check(capsys, src, engine, target, tmp_path / "out" / f"{name}-{engine}", "replay")
                for engine in engines for name, src in cases.items()}
    # the corpus exercises both sides of the invariant, for every engine
    for engine in engines:
        codes = {outcomes[name, engine] for name in corpus_names()}
        assert {0, 1} <= codes, (engine, codes)
    assert outcomes["ids-0-1-2", "vllm==0.33.0"] == 0 and outcomes["ids-0-1-2", "sglang==0.5.23"] == 1
    assert all(outcomes["garbage-d2t", e] == 1 and outcomes["other-target", e] == 1 for e in engines)
    # the norms' switch written where the release builds them; refused where it cannot compute them
    assert {e: outcomes["fc-norm-keys", e] for e in ("sglang==0.5.11", "sglang==0.5.23", "vllm==0.21.0",
                                                      "vllm==0.33.0", "llamacpp==0.3.36")} == {
        "sglang==0.5.11": 1, "sglang==0.5.23": 0, "vllm==0.21.0": 1, "vllm==0.33.0": 0, "llamacpp==0.3.36": 1}


@pytest.mark.parametrize("engine", ["sglang==0.5.10", "sglang==0.5.23", "vllm==0.32.0", "llamacpp==0.3.36"])
def test_with_the_default_loader_fix_and_check_give_one_verdict(draft, target, tmp_path, capsys, engine):
    """The default loader (`auto`: the release's own loader, installed by `make test`) plans, verifies
    and checks: the same invariant on the cases that tell the outcomes apart."""
    from conftest import require_release

    require_release(engine.split("==")[1], engine.split("==")[0])
    cases = corpus(draft)
    codes = {name: fix_then_check(capsys, cases[name], engine, target, tmp_path / name, "auto")
             for name in ("speculators", "midlayer-speculators-config", "no-vocab-map", "two-layers", "ids-0-1-2")}
    assert {0, 1} <= set(codes.values()), codes
    code, out, _ = cli(capsys, "check", cases["speculators"], "--engine", engine, "--format", "json")
    assert json.loads(out)["loader"] == "real"


def _both_layer_names(draft):
    """A vLLM-ready draft (`layers.0.*`) that also holds the decoder layer as `midlayer.*`, other values."""
    from draftdoctor.synth import draft_tensors

    copies = {k: v for k, v in draft_tensors(DraftShape(), "midlayer").items() if k.startswith("midlayer.")}
    return draft("speculators", extra=copies)


@pytest.mark.parametrize("engine", ["vllm==0.32.0", "sglang==0.5.23", "sglang==0.5.10"])
@pytest.mark.parametrize("loader", ["replay", "auto"])
def test_two_keys_writing_one_parameter_is_one_error_everywhere(draft, target, tmp_path, capsys, engine, loader):
    """Both names load where the engine reads both (vLLM renames midlayer. to layers.0.; SGLang 0.5.12+
    too), and whichever the engine reads last is served: `check` and `fix` both say written-twice and
    exit 1. SGLang 0.5.10 reads only midlayer.*: the other copy is dropped, an error of its own."""
    from conftest import require_release

    if loader == "auto":
        require_release(engine.split("==")[1], engine.split("==")[0])
    src = _both_layer_names(draft)
    code, out, _ = cli(capsys, "check", src, "--engine", engine, "--target", target, "--loader", loader)
    assert code == 1, out
    both = engine != "sglang==0.5.10"
    assert ("ERROR   written-twice: layers.0.mlp.down_proj.weight, midlayer.mlp.down_proj.weight all load into "
            in out) == both, out
    assert ("dropped-keys" in out) != both
    code, planned, _ = cli(capsys, "fix", src, "--engine", engine, "--target", target, "--loader", loader, "--plan")
    assert code == 1 and "refused: nothing written" in planned
    # where both load, the plan keeps both names and its check says what check said; for 0.5.10 it would
    # rename layers.0. to midlayer., giving the two copies one name
    assert "written-twice" in planned and ("rename-collision" in planned) != both


def corpus_names():
    return [*CORPUS, *CONFIG_EDITS, "sglang-ids-only"]


def test_the_eagle_repos_plain_llama_architecture(draft, target, tmp_path, capsys):
    """The EAGLE repo publishes drafts with `architectures: ["LlamaForCausalLM"]`: vLLM rewrites the
    name to Eagle3LlamaForCausalLM for method eagle3 and loads it; SGLang builds a plain Llama and
    fails; fix writes SGLang's class name. (tests/test_differential.py proves both with the real loaders.)"""
    src = edit_config(draft("midlayer"), architectures=["LlamaForCausalLM"])
    code, out, _ = cli(capsys, "check", src, "--engine", "vllm==0.32.0", "--target", target)
    # readable; what is left is that vLLM >= 0.23 reads no ids from eagle_config (fix moves them)
    assert "config-unreadable" not in out and "loads cleanly" not in out and "aux-layer-ids" in out
    code, out, _ = cli(capsys, "fix", src, "--engine", "vllm==0.32.0", "--target", target, "--out", tmp_path / "v")
    assert code == 0, out
    code, out, _ = cli(capsys, "check", src, "--engine", "sglang==0.5.10", "--target", target, "--loader", "replay")
    assert code == 1 and "loader-crash" in out and "builds a plain LlamaForCausalLM" in out
    code, out, _ = cli(capsys, "fix", src, "--engine", "sglang==0.5.10", "--target", target, "--out", tmp_path / "f")
    assert code == 0 and json.loads((tmp_path / "f" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]


def test_a_verdict_reads_the_draft_class_row_and_the_dims_once(draft, monkeypatch):
    """`diagnose` reads the checkpoint's dims and its draft-class row (`EngineRelease.profile_for`) once and
    hands them on (the replay, the checks beyond names), instead of each recomputing them."""
    from draftdoctor import coverage, diagnose as verdict
    from draftdoctor.checkpoint import open_checkpoint
    from draftdoctor.engines import EngineRelease, resolve_engine

    calls = {"profile_for": 0, "read_dims": 0}
    profile_for, read_dims = EngineRelease.profile_for, coverage.read_dims

    def counted_profile_for(self, config):
        calls["profile_for"] += 1
        return profile_for(self, config)

    def counted_read_dims(checkpoint):
        calls["read_dims"] += 1
        return read_dims(checkpoint)

    monkeypatch.setattr(EngineRelease, "profile_for", counted_profile_for)
    monkeypatch.setattr(coverage, "read_dims", counted_read_dims)
    monkeypatch.setattr(verdict, "read_dims", counted_read_dims)
    report = verdict.diagnose(open_checkpoint(draft("speculators", config="flat")), resolve_engine("sglang==0.5.10"),
                              values=[])
    assert report.verdict and calls == {"profile_for": 1, "read_dims": 1}
