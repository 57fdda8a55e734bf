"""Replay profiles against SGLang's own loaders: on a corpus of checkpoints they must agree on every
parameter's status and every finding code, for each supported release. Where they disagree, the
profile is wrong (issue 4). Needs `make sglang-loaders` (run by `make test`); fails in CI without it."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import require_release

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.coverage import replay
from draftdoctor.synth import DraftShape

realload = pytest.importorskip("draftdoctor.realload")
from draftdoctor.realcheck import real_checks  # noqa: E402

H, I = 64, 128
CORPUS = {
    "speculators-layout": dict(layout="speculators", config="flat"),
    "midlayer-layout": dict(layout="midlayer"),
    "model-prefixed": dict(layout="prefixed"),
    "missing-lm-head": dict(layout="midlayer", drop=("lm_head.weight",)),
    "extra-fc-bias": dict(layout="midlayer", extra={"fc.bias": np.zeros(H, dtype=np.float16)}),
    "two-decoder-layers": dict(layout="speculators", config="flat", shape=DraftShape(num_layers=2)),
    "wrong-fc-shape": dict(layout="midlayer", extra={"fc.weight": np.zeros((H, 2 * H), dtype=np.float16)}),
    "narrow-down-proj": dict(layout="midlayer", extra={"midlayer.mlp.down_proj.weight": np.zeros((H, I - 32), dtype=np.float16)}),
    "speculators-nested-config": dict(layout="speculators"),
}


VLLM_CORPUS = {
    **CORPUS,
    "no-decoder-layer": dict(layout="speculators", drop=tuple(f"layers.0.{m}" for m in (
        "hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
        "mlp.up_proj.weight", "mlp.down_proj.weight"))),
    "no-embedding-no-head": dict(layout="speculators", drop=("embed_tokens.weight", "lm_head.weight"),
                                 shape=DraftShape(draft_vocab=None)),
    "full-vocab-with-d2t": dict(layout="speculators", shape=DraftShape(draft_vocab=None),
                                extra={"d2t": np.zeros(256, dtype=np.int64)}),
    "unknown-key": dict(layout="speculators", extra={"extra_head.weight": np.zeros((4, H), dtype=np.float16)}),
    "fc-norm": dict(layout="speculators", extra={f"fc_norm.{i}.weight": np.ones(H, dtype=np.float16) for i in range(3)}),
}
# cases whose outcome changes between SGLang releases (the release sweep): each tells two profile rows apart
SGLANG_CORPUS = {
    **CORPUS,
    "no-embedding-no-head": dict(layout="midlayer", drop=("lm_head.weight",), shape=DraftShape(draft_vocab=None)),
    "fc-bias-config": dict(layout="midlayer", config_update={"bias": True}, extra={"fc.bias": np.zeros(H, dtype=np.float16)}),
    "norm-before-fc": dict(layout="midlayer", config_update={"norm_before_fc": True},
                           extra={"input_norm.weight": np.ones(3 * H, dtype=np.float16)}),
    "fc-norm-flag": dict(layout="midlayer", config_update={"fc_norm": True},
                         extra={f"fc_norm.{i}.weight": np.ones(H, dtype=np.float16) for i in range(3)}),
    "legacy-aux-norm-flag": dict(layout="midlayer", config_update={"use_aux_norm": True},
                                 extra={f"aux_norm_{n}.weight": np.ones(H, dtype=np.float16) for n in ("low", "mid", "high")}),
}
RELEASES = [("sglang", r) for r in realload.SUPPORTED_RELEASES] + [("vllm", r) for r in realload.VLLM_RELEASES]


@pytest.mark.parametrize("engine_name,release", RELEASES)
def test_replay_and_real_loader_agree(draft, engine_name, release):
    require_release(release, engine_name)
    corpus = VLLM_CORPUS if engine_name == "vllm" else SGLANG_CORPUS
    folders = {}
    for name, spec in corpus.items():
        spec = dict(spec)
        update = spec.pop("config_update", {})
        folders[name] = draft(**spec)
        if update:
            config = json.loads((folders[name] / "config.json").read_text())
            (folders[name] / "config.json").write_text(json.dumps(config | update))
    # the EAGLE repo's published drafts: a flat config that names the target's class
    folders["eagle-repo-llama-arch"] = draft("midlayer")
    config = json.loads((folders["eagle-repo-llama-arch"] / "config.json").read_text())
    (folders["eagle-repo-llama-arch"] / "config.json").write_text(json.dumps(config | {"architectures": ["LlamaForCausalLM"]}))
    engine = f"{engine_name}=={release}"
    reals = real_checks(list(folders.values()), engine)
    disagreements = []
    for (name, folder), real in zip(folders.items(), reals):
        played = replay(open_checkpoint(folder), engine)
        want = {p.name: p.status for p in played.params}
        got = {p.name: p.status for p in real.params}
        # after a crash the server does not start whatever was written before it; which parameters
        # vLLM had written by then depends on the order it places keys in, which the replay does not model
        crashed = all({"loader-crash", "shape-mismatch"} & {f.code for f in r.errors} for r in (played, real))
        if name == "eagle-repo-llama-arch" and engine_name == "sglang":
            # SGLang builds a plain Llama, another model's parameters: the claim is that it will not start
            if not crashed:
                disagreements.append(f"{name}: replay {played.verdict!r} vs real {real.verdict!r}")
            continue
        if want != got and not (crashed and engine_name == "vllm"):
            diff = {n: (want.get(n), got.get(n)) for n in want.keys() | got.keys() if want.get(n) != got.get(n)}
            disagreements.append(f"{name}: parameter statuses (replay, real) differ: {diff}")
        codes_want = sorted({(f.code, f.severity) for f in played.findings})
        codes_got = sorted({(f.code, f.severity) for f in real.findings})
        if codes_want != codes_got:
            disagreements.append(f"{name}: findings replay {codes_want} != real {codes_got}\n"
                                 f"  real says: {[f.message for f in real.findings]}")
    assert not disagreements, "\n".join(disagreements)


PUBLIC = Path(__file__).resolve().parent / "corpus" / "public"


@pytest.fixture(scope="session")
def public_corpus(tmp_path_factory):
    """The published layouts of tests/corpus/public, rebuilt as sparse safetensors (no data, no disk)."""
    from draftdoctor.synth import write_header_only

    root = tmp_path_factory.mktemp("public")
    return {d.name: write_header_only(root / d.name, json.loads((d / "tensors.json").read_text()),
                                      json.loads((d / "config.json").read_text()))
            for d in sorted(PUBLIC.iterdir()) if d.is_dir()}


def test_the_public_corpus_is_what_its_readme_promises(public_corpus):
    """At least 15 published drafts, both trainer layouts, the architectures and targets issue 20 names,
    each with a SOURCE.md."""
    from draftdoctor.provenance import recognise

    assert len(public_corpus) >= 15
    assert all((PUBLIC / name / "SOURCE.md").stat().st_size > 200 for name in public_corpus)
    kinds = {recognise(open_checkpoint(f).keys(), open_checkpoint(f).config).draft_class for f in public_corpus.values()}
    assert kinds == {"llama", "qwen3", "mla"}
    keys = {k for f in public_corpus.values() for k in open_checkpoint(f).keys()}
    assert any(k.startswith("midlayer.") for k in keys) and any(k.startswith("layers.0.") for k in keys)
    for target in ("llama3.1", "llama3.3", "llama4", "qwen3-8b", "qwen3-30b-a3b", "kimi", "deepseek", "gpt-oss", "gemma"):
        assert any(target in name for name in public_corpus), target


@pytest.mark.parametrize("engine_name,release", RELEASES)
def test_replay_and_real_loader_agree_on_the_public_corpus(public_corpus, engine_name, release):
    """Every published layout, every installed real loader (big drafts built on the meta device)."""
    require_release(release, engine_name)
    engine = f"{engine_name}=={release}"
    reals = real_checks(list(public_corpus.values()), engine, timeout=1800)
    disagreements = []
    for (name, folder), real in zip(public_corpus.items(), reals):
        played = replay(open_checkpoint(folder), engine)
        if engine_name == "sglang" and json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]:
            # SGLang builds a plain Llama (the EAGLE repo's drafts), another model's parameters: both must say it fails
            if not ({"loader-crash", "shape-mismatch"} & {f.code for f in real.errors} and played.errors):
                disagreements.append(f"{name}: replay {played.verdict!r} vs real {real.verdict!r}")
            continue
        want = {p.name: p.status for p in played.params}
        got = {p.name: p.status for p in real.params}
        if want != got:
            diff = {n: (want.get(n), got.get(n)) for n in want.keys() | got.keys() if want.get(n) != got.get(n)}
            disagreements.append(f"{name}: parameter statuses (replay, real) differ: {diff}")
        codes_want = sorted({(f.code, f.severity) for f in played.findings})
        codes_got = sorted({(f.code, f.severity) for f in real.findings})
        if codes_want != codes_got:
            disagreements.append(f"{name}: findings replay {codes_want} != real {codes_got}\n"
                                 f"  real says: {[f.message[:200] for f in real.findings]}")
    assert not disagreements, "\n".join(disagreements)


def test_reference_backend_weights_are_the_same_with_the_real_loader():
    """`--loader real` and `--loader replay` hand the reference engine the very same draft."""
    from pathlib import Path

    torch = pytest.importorskip("torch")
    from draftdoctor.reference.llama import TargetModel
    from draftdoctor.reference.loading import load_for_engine

    require_release("0.5.10")
    demo = Path(__file__).resolve().parents[1] / "data" / "demo"
    target = TargetModel.from_dir(demo / "target")
    real = load_for_engine(demo / "draft-story", "sglang==0.5.10", target, loader="real")
    played = load_for_engine(demo / "draft-story", "sglang==0.5.10", target, loader="replay")
    assert real.written == played.written and len(real.written) == 4
    assert all(torch.equal(real.draft.params[k], played.draft.params[k]) for k in played.draft.params)
