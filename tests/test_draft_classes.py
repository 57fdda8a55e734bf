"""Every EAGLE-3 draft class the supported releases register (issue 20): the replay's parameter list and
key-by-key fate for MLA drafts (SGLang 0.5.23 `Eagle3DeepseekV2ForCausalLM`; vLLM's, also registered as
`...V3...`) and vLLM's Qwen3 class (q/k norms) equal what the engines' own classes and loaders do, case
by case. Needs `make sglang-loaders vllm-loaders` (run by `make test`); fails in CI without them."""

import numpy as np
import pytest
from conftest import require_release

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.coverage import replay
from draftdoctor.engines import parameters, resolve_engine
from draftdoctor.coverage import draft_dims
from draftdoctor.realcheck import real_checks
from draftdoctor.synth import REMOVE, DraftShape, edit_config, write_draft, write_mla_draft

L = "layers.0.self_attn."
MLA = {
    "complete": {},
    "no-kv-a-proj": dict(drop=(f"{L}kv_a_proj_with_mqa.weight",)),
    "no-q-a-proj": dict(drop=(f"{L}q_a_proj.weight",)),
    "no-kv-b-proj": dict(drop=(f"{L}kv_b_proj.weight",)),
    # Vd == V declared, no head: SGLang keeps a random head (its issue #27829), vLLM shares the target's
    "no-lm-head": dict(shape=DraftShape(draft_vocab=256), drop=("lm_head.weight",)),
    "vocab-null-no-head": dict(shape=DraftShape(draft_vocab=None), drop=("lm_head.weight",)),
    "unknown-key": dict(extra={f"{L}foo.weight": ("F16", (4, 64))}),
    "midlayer-keys": dict(layer="midlayer."),
    "model-prefixed": dict(key_prefix="model."),
    "fc-norm": dict(extra={f"fc_norm.{i}.weight": ("F16", (64,)) for i in range(3)}, config={"fc_norm": True}),
    "q-lora-null": dict(q_lora_rank=None),
    "two-layers": dict(config={"num_hidden_layers": 2}),
    "target-hidden-null": dict(config={"target_hidden_size": None}),
    "kv-a-wrong-width": dict(extra={f"{L}kv_a_proj_with_mqa.weight": ("F16", (48, 64))}),
    "kv-b-fewer-rows": dict(extra={f"{L}kv_b_proj.weight": ("F16", (240, 32))}),
    "o-proj-wider": dict(extra={f"{L}o_proj.weight": ("F16", (64, 160))}),
    "four-aux-ids-in-eagle-config": dict(extra={"fc.weight": ("F16", (64, 256))},
                                         config={"eagle_aux_hidden_state_layer_ids": REMOVE,
                                                 "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5, 7],
                                                                  "use_aux_hidden_state": True}}),
    "deepseek-v3-model-type": dict(config={"model_type": "deepseek_v3"}),
    "kimi-k2-model-type": dict(config={"model_type": "kimi_k2"}),
}
QWEN3_SHAPE = DraftShape(head_dim=32)  # head_dim is not hidden / heads, as in published Qwen3 drafts
QWEN3 = {
    "flat": {},
    "no-qk-norms": dict(drop=(f"{L}q_norm.weight", f"{L}k_norm.weight")),
    "plain-qwen3-architecture": dict(config={"architectures": ["Qwen3ForCausalLM"]}),
    "speculators-config": dict(speculators=True),
    "unknown-key": dict(extra={f"{L}foo.weight": np.zeros((4, 64), dtype=np.float16)}),
    "flat-without-head-dim": dict(config={"head_dim": REMOVE}),  # Qwen3Config's default: 128, not 16
    "four-aux-ids-top-level": dict(extra={"fc.weight": np.zeros((64, 256), dtype=np.float16)},
                                   config={"eagle_aux_hidden_state_layer_ids": [1, 3, 5, 7], "eagle_config": REMOVE}),
}


def qwen3_draft(folder, speculators=False, config=None, **kwargs):
    """A Qwen3-style draft (q/k norms) with a flat `Eagle3Qwen3ForCausalLM` config, or speculators'."""
    write_draft(folder, QWEN3_SHAPE, layout="speculators", config="speculators" if speculators else "flat",
                qk_norm=True, embed=False, **kwargs)
    if speculators:
        import json

        path = folder / "config.json"
        body = json.loads(path.read_text())
        body["transformer_layer_config"]["model_type"] = "qwen3"
        path.write_text(json.dumps(body))
        return folder
    return edit_config(folder, **({"architectures": ["Eagle3Qwen3ForCausalLM"], "model_type": "qwen3"} | (config or {})))


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("classes")
    out = {f"mla/{name}": write_mla_draft(root / f"mla-{name}", **spec) for name, spec in MLA.items()}
    out |= {f"qwen3/{name}": qwen3_draft(root / f"qwen3-{name}", **spec) for name, spec in QWEN3.items()}
    return out


ENGINES = ["sglang==0.5.10", "sglang==0.5.23", "vllm==0.32.0"]
WONT_START = {"loader-crash", "shape-mismatch", "config-unreadable"}


@pytest.fixture(scope="module", params=ENGINES)
def real(request, drafts):
    engine = request.param
    name, release = engine.split("==")
    require_release(release, name)
    return engine, dict(zip(drafts, real_checks(list(drafts.values()), engine)))


def test_replay_and_real_loader_agree_on_every_class(real, drafts):
    engine, reals = real
    disagreements = []
    for name, folder in drafts.items():
        played, got = replay(open_checkpoint(folder), engine), reals[name]
        want_status = {p.name: p.status for p in played.params}
        got_status = {p.name: p.status for p in got.params}
        if name == "qwen3/plain-qwen3-architecture" and engine.startswith("sglang"):
            # SGLang builds the Qwen3 *target* class, another model's parameters, and fails (0.5.23); 0.5.10 on
            # this CPU cannot import its Qwen3 module and refuses the name: either way it does not start
            if not WONT_START & {f.code for f in got.errors} or "loader-crash" not in {f.code for f in played.errors}:
                disagreements.append(f"{name}: replay {played.verdict!r} vs real {got.verdict!r}")
            continue
        if want_status != got_status:
            diff = {n: (want_status.get(n), got_status.get(n)) for n in want_status.keys() | got_status.keys()
                    if want_status.get(n) != got_status.get(n)}
            disagreements.append(f"{name}: parameter statuses (replay, real) differ: {diff}")
        want_codes = sorted({(f.code, f.severity) for f in played.findings})
        got_codes = sorted({(f.code, f.severity) for f in got.findings})
        if want_codes != got_codes:
            disagreements.append(f"{name}: findings replay {want_codes} != real {got_codes}\n"
                                 f"  real says: {[f.message[:200] for f in got.findings]}")
    assert not disagreements, "\n".join(disagreements)


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
    assert profile.draft_class == draft_class
    from draftdoctor.realload import run_real_loader

    raw = run_real_loader(folder, release, engine=name)
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
        sglang = replay(open_checkpoint(folder), "sglang==0.5.23")
        fused = {p.name: p.status for p in sglang.params}["model.midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"]
        assert fused == "uninitialized" and [k.key for k in sglang.dropped] == [f"{L}q_a_proj.weight"]
        assert "never loads it, and says nothing" in sglang.dropped[0].reason
        vllm = replay(open_checkpoint(folder), "vllm==0.32.0")
        half = next(p for p in vllm.params if p.name.endswith("fused_qkv_a_proj.weight"))
        assert half.status == "partial" and half.shards_missing == ["1"]


@pytest.mark.parametrize("name,engine", [("mla/complete", "sglang==0.5.23"), ("mla/complete", "vllm==0.32.0"),
                                         ("qwen3/flat", "vllm==0.32.0")])
def test_the_reference_backend_says_it_computes_only_the_llama_class(drafts, name, engine):
    from pathlib import Path

    from draftdoctor.reference.llama import TargetModel
    from draftdoctor.reference.loading import LoadRefused, load_for_engine

    target = TargetModel.from_dir(Path(__file__).resolve().parents[1] / "data" / "demo" / "target")
    with pytest.raises(LoadRefused, match="computes the Llama EAGLE-3 draft only"):
        load_for_engine(drafts[name], engine, target)
