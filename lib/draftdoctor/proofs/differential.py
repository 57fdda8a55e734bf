"""The differential corpus: drafts whose fate differs by engine, release and draft class, and the one
comparison of the replay with an engine's own loader on them.

Each case is one rule of some loader (a layout, a missing or extra tensor, a config option, a class's
quirk); together they tell every profile row apart. `write_cases` writes them with `synth` (tiny,
real data), `write_public` rebuilds tests/corpus/public (published layouts, sparse), and `disagreements`
says where a replayed report and a real one differ. `tests/test_differential.py` and
`tests/test_draft_classes.py` require none; `proofs.sweep` tabulates them for every release.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..configs import FLAT, config_format
from ..engines import EngineRelease, expect_release
from ..synth import REMOVE, DraftShape, edit_config, write_draft, write_mla_draft
from ..synthwrite import write_header_only

H, I = 64, 128
F16 = np.float16
# EAGLE 3.1 (docs/engine-facts.md: "EAGLE 3.1"): one norm per aux state, [Ht] each, and the switches as
# SpecForge's template sets them; a flat config's eagle_config as synth writes it (SGLang's ids for 1, 3, 5)
FC_NORM = {f"fc_norm.{i}.weight": np.ones(H, dtype=F16) for i in range(3)}
EAGLE31 = {"fc_norm": True, "norm_output": True}
EAGLE_CONFIG = {"eagle_aux_hidden_state_layer_ids": [0, 2, 4], "use_aux_hidden_state": True}
LLAMA = {
    "speculators-layout": dict(layout="speculators", config="flat"),
    "midlayer-layout": dict(layout="midlayer"),
    "model-prefixed": dict(layout="prefixed"),
    "missing-lm-head": dict(layout="midlayer", drop=("lm_head.weight",)),
    "extra-fc-bias": dict(layout="midlayer", extra={"fc.bias": np.zeros(H, dtype=F16)}),
    "two-decoder-layers": dict(layout="speculators", config="flat", shape=DraftShape(num_layers=2)),
    "wrong-fc-shape": dict(layout="midlayer", extra={"fc.weight": np.zeros((H, 2 * H), dtype=F16)}),
    "narrow-down-proj": dict(layout="midlayer", extra={"midlayer.mlp.down_proj.weight": np.zeros((H, I - 32), dtype=F16)}),
    "speculators-nested-config": dict(layout="speculators"),
    # the EAGLE repo's published drafts: a flat config naming the target's class
    "eagle-repo-llama-arch": dict(layout="midlayer", config_update={"architectures": ["LlamaForCausalLM"]}),
    # a draft MLP with another activation than the target's silu: SGLang's and vLLM's MLPs refuse it while building
    "gelu-activation": dict(layout="midlayer", config_update={"hidden_act": "gelu"}),
    # EAGLE 3.1: the switches without the norms' weights (speculators' converter leaves them out): a release
    # that builds the norms keeps them at ones; NeMo Automodel's `model.`-prefixed norms (SGLang >= 0.5.12 finds
    # them, vLLM reads model.model.); norm_before_fc inside eagle_config (llama.cpp reads the top level only)
    "fc-norm-flag-without-keys": dict(layout="midlayer", config_update=EAGLE31),
    "fc-norm-model-prefixed": dict(layout="midlayer", config_update=EAGLE31,
                                   extra={f"model.{k}": v for k, v in FC_NORM.items()}),
    "norm-before-fc-in-eagle-config": dict(layout="midlayer", config_update={"eagle_config": EAGLE_CONFIG | {
        "norm_before_fc": True}}, extra={"input_norm.weight": np.ones(3 * H, dtype=F16)}),
}
LLAMA_VLLM = {
    "no-decoder-layer": dict(layout="speculators", drop=tuple(f"layers.0.{m}" for m in (
        "hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
        "mlp.up_proj.weight", "mlp.down_proj.weight"))),
    "no-embedding-no-head": dict(layout="speculators", drop=("embed_tokens.weight", "lm_head.weight"),
                                 shape=DraftShape(draft_vocab=None)),
    "full-vocab-with-d2t": dict(layout="speculators", shape=DraftShape(draft_vocab=None),
                                extra={"d2t": np.zeros(256, dtype=np.int64)}),
    "unknown-key": dict(layout="speculators", extra={"extra_head.weight": np.zeros((4, H), dtype=F16)}),
    "fc-norm": dict(layout="speculators", extra=FC_NORM),  # the norms' keys without the switch
    # the draft options and tensors vLLM's Llama class gained release by release (0.16, 0.18, 0.19, 0.22)
    "norm-before-fc": dict(layout="midlayer", config_update={"norm_before_fc": True},
                           extra={"input_norm.weight": np.ones(3 * H, dtype=F16)}),
    "norm-before-fc-speculators-config": dict(layout="speculators", config_update={"norm_before_fc": True},
                                              extra={"input_norm.weight": np.ones(3 * H, dtype=F16)}),
    "fc-norm-flag": dict(layout="midlayer", config_update=EAGLE31, extra=FC_NORM),  # SpecForge's EAGLE 3.1 export
    # EAGLE 3.1 in speculators' config: its reader passes fc_norm on from 0.25.0 only
    "fc-norm-speculators-config": dict(layout="speculators", config_update=EAGLE31, extra=FC_NORM),
    # SGLang's legacy names, which vLLM does not rename
    "aux-norm-legacy-names": dict(layout="midlayer", config_update={"fc_norm": True}, extra={
        f"aux_norm_{n}.weight": np.ones(H, dtype=F16) for n in ("low", "mid", "high")}),
    "attention-bias": dict(layout="midlayer", config_update={"attention_bias": True}, extra={
        f"midlayer.self_attn.{m}_proj.bias": np.zeros(n, dtype=F16) for m, n in (("q", 64), ("k", 32), ("v", 32), ("o", H))}),
    "mask-hidden": dict(layout="speculators", config="flat", extra={"mask_hidden": np.zeros((1, 3 * H), dtype=F16)}),
    "four-aux-ids-in-eagle-config": dict(layout="midlayer", extra={"fc.weight": np.zeros((H, 4 * H), dtype=F16)},
                                         config_update={"eagle_aux_hidden_state_layer_ids": REMOVE,
                                                        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5, 7],
                                                                         "use_aux_hidden_state": True}}),
    # P-EAGLE's speculators type (read from 0.22.0, refused from 0.34.0), with its mask token and mask_hidden
    "peagle-speculators-config": dict(layout="speculators", extra={"mask_hidden": np.zeros((1, 3 * H), dtype=F16)},
                                      config_update={"speculators_model_type": "peagle", "mask_token_id": 0}),
    "peagle-without-mask-token": dict(layout="speculators", config_update={"speculators_model_type": "peagle"}),
}
# cases whose outcome changes between SGLang releases (the release sweep): each tells two rows apart
LLAMA_SGLANG = {
    "no-embedding-no-head": dict(layout="midlayer", drop=("lm_head.weight",), shape=DraftShape(draft_vocab=None)),
    "fc-bias-config": dict(layout="midlayer", config_update={"bias": True}, extra={"fc.bias": np.zeros(H, dtype=F16)}),
    "norm-before-fc": dict(layout="midlayer", config_update={"norm_before_fc": True},
                           extra={"input_norm.weight": np.ones(3 * H, dtype=F16)}),
    "fc-norm-flag": dict(layout="midlayer", config_update=EAGLE31, extra=FC_NORM),  # SpecForge's EAGLE 3.1 export
    "fc-norm-keys-without-flag": dict(layout="midlayer", extra=FC_NORM),  # skipped without a word, even from 0.5.12
    "legacy-aux-norm-flag": dict(layout="midlayer", config_update={"use_aux_norm": True},
                                 extra={f"aux_norm_{n}.weight": np.ones(H, dtype=F16) for n in ("low", "mid", "high")}),
}

L = "layers.0.self_attn."
MLA = {
    "complete": {},
    "no-kv-a-proj": dict(drop=(f"{L}kv_a_proj_with_mqa.weight",)),
    "no-q-a-proj": dict(drop=(f"{L}q_a_proj.weight",)),
    "no-kv-b-proj": dict(drop=(f"{L}kv_b_proj.weight",)),
    # Vd == V declared, no head: SGLang keeps a random head (SGLang issue #27829), vLLM shares the target's
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
    "unknown-key": dict(extra={f"{L}foo.weight": np.zeros((4, 64), dtype=F16)}),
    "flat-without-head-dim": dict(config={"head_dim": REMOVE}),  # Qwen3Config's default: 128, not 16
    "four-aux-ids-top-level": dict(extra={"fc.weight": np.zeros((64, 256), dtype=F16)},
                                   config={"eagle_aux_hidden_state_layer_ids": [1, 3, 5, 7], "eagle_config": REMOVE}),
}
WONT_START = {"loader-crash", "shape-mismatch", "config-unreadable"}
PUBLIC = Path(__file__).resolve().parents[3] / "tests" / "corpus" / "public"


def write_qwen3_draft(folder, speculators: bool = False, config: dict | None = None, **kwargs) -> Path:
    """A Qwen3-style draft (q/k norms) with a flat `Eagle3Qwen3ForCausalLM` config, or speculators'."""
    folder = write_draft(folder, QWEN3_SHAPE, layout="speculators", config="speculators" if speculators else "flat",
                         qk_norm=True, embed=False, **kwargs)
    if speculators:
        path = folder / "config.json"
        body = json.loads(path.read_text())
        body["transformer_layer_config"]["model_type"] = "qwen3"
        path.write_text(json.dumps(body))
        return folder
    return edit_config(folder, **({"architectures": ["Eagle3Qwen3ForCausalLM"], "model_type": "qwen3"} | (config or {})))


def write_cases(root, engine_name: str, classes: bool = True) -> dict[str, Path]:
    """Every case for `engine_name` ("sglang" or "vllm"), written under `root`: {"llama/...", "mla/...", "qwen3/..."}."""
    root = Path(root)
    llama = LLAMA | (LLAMA_VLLM if engine_name == "vllm" else LLAMA_SGLANG)
    out = {}
    for name, spec in llama.items():
        spec = dict(spec)
        update = spec.pop("config_update", {})
        layout = spec.pop("layout")
        out[f"llama/{name}"] = edit_config(write_draft(root / f"llama-{name}", layout=layout, **spec), **update)
    if classes:
        out |= {f"mla/{name}": write_mla_draft(root / f"mla-{name}", **spec) for name, spec in MLA.items()}
        out |= {f"qwen3/{name}": write_qwen3_draft(root / f"qwen3-{name}", **spec) for name, spec in QWEN3.items()}
    return out


def write_public(root) -> dict[str, Path]:
    """tests/corpus/public, rebuilt as sparse safetensors (no data, no disk) under `root`."""
    root = Path(root)
    return {d.name: write_header_only(root / d.name, json.loads((d / "tensors.json").read_text()),
                                      json.loads((d / "config.json").read_text()))
            for d in sorted(PUBLIC.iterdir()) if d.is_dir()}


def only_wont_start(folder: Path, engine: EngineRelease) -> bool:
    """The replay claims no more than that the server does not start: the config names a target's class
    (the engine builds that model, which fails wherever its code happens to), or the release reads a config
    without `model_type` as whatever model type the folder's path names (`ConfigReading.model_type_from_path`)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    profile = expect_release(engine).profile_for(config)
    fmt = config_format(config)
    if fmt != FLAT:
        return fmt not in profile.config.config_formats and profile.config.model_type_from_path
    return profile.config.builds_a_target_model(config.get("architectures") or [])


def not_modelled(played) -> bool:
    """The replay says it does not model the draft's class for this release."""
    return any(f.code == "replay-not-modelled" for f in played.findings)


def disagreements(name: str, played, real, engine: EngineRelease, folder: Path) -> list[str]:
    """Where the replay's report of the draft in `folder` differs from the real loader's: parameter statuses
    and finding codes; where the replay claims only that the server does not start (`only_wont_start`),
    both must say just that. After a crash the server does not start whatever was written before; which
    parameters vLLM had written by then depends on the order it places keys in, not modelled. A draft
    class the replay does not model for the release (`replay-not-modelled`: its verdict is "not checked")
    is no claim to compare."""
    if not_modelled(played):
        return []
    if only_wont_start(folder, engine):
        if not (WONT_START & {f.code for f in real.errors} and WONT_START & {f.code for f in played.errors}):
            return [f"{name}: replay {played.verdict!r} vs real {real.verdict!r}"]
        return []
    out = []
    want = {p.name: p.status for p in played.params}
    got = {p.name: p.status for p in real.params}
    crashed = all({"loader-crash", "shape-mismatch"} & {f.code for f in r.errors} for r in (played, real))
    if want != got and not (crashed and engine.name == "vllm"):
        diff = {n: (want.get(n), got.get(n)) for n in want.keys() | got.keys() if want.get(n) != got.get(n)}
        out.append(f"{name}: parameter statuses (replay, real) differ: {diff}")
    # `not-checked` says what the kit did not check here (a draft above this machine's memory budget is built on
    # the meta device), which depends on the memory free at that moment, not on the loader: no claim to compare
    codes_want = sorted({(f.code, f.severity) for f in played.findings if f.code != "not-checked"})
    codes_got = sorted({(f.code, f.severity) for f in real.findings if f.code != "not-checked"})
    if codes_want != codes_got:
        out.append(f"{name}: findings replay {codes_want} != real {codes_got}\n"
                   f"  real says: {[f.message[:200] for f in real.findings]}")
    return out
