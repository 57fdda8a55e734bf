"""Write synthetic EAGLE-3 draft checkpoints in each producer's layout, for tests and benchmarks.

No torch: tensors are numpy arrays (or, for size-only benchmarks, sparse zero-filled regions), and
the safetensors file is written directly (`synthwrite.py`), so a multi-GB checkpoint costs no memory
and a sparse one no disk. Also a tiny MLA draft and MTP target, and what a converter that loads into a
fresh model without strict name matching writes (`sloppy_convert`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import auxids
from .synthwrite import NUMPY_DTYPES, write_safetensors, write_shards


@dataclass(frozen=True)
class DraftShape:
    """Sizes of a synthetic draft (defaults: tiny)."""

    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 128
    vocab: int = 256
    draft_vocab: int | None = 128
    target_hidden: int = 64
    aux_layer_ids: tuple[int, ...] = (1, 3, 5)  # top-level convention: the inputs of these target layers
    num_layers: int = 1


LLAMA_8B = DraftShape(4096, 32, 8, 128, 14336, 128256, 32000, 4096, (2, 16, 29))
# a draft for Llama-3.2-1B (16 layers, hidden 2048, 32 x 64 heads, 8 kv heads; its vocabulary)
LLAMA_1B = DraftShape(2048, 32, 8, 64, 8192, 128256, 32000, 2048, (2, 8, 13))


def write_target_and_draft(folder, shape: DraftShape = LLAMA_1B, layers: int = 16) -> tuple[Path, Path]:
    """A Llama target of `shape`'s sizes with `layers` layers and an EAGLE-3 draft for it (speculators'
    layout, top-level aux ids), both in bfloat16 with their data as sparse holes (no disk; they read as
    zeros: the sizes, not the values, are what this is for), the target with the demo's tokenizer.
    Written once under `folder` (`target/`, `draft/`) and reused."""
    folder = Path(folder)
    target, draft = folder / "target", folder / "draft"
    if (target / "config.json").exists() and (draft / "config.json").exists():
        return target, draft
    from .toolstate import DEMO

    s = shape
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    tensors = {"model.embed_tokens.weight": ("BF16", (s.vocab, s.target_hidden)),
               "model.norm.weight": ("BF16", (s.target_hidden,))}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {p + "input_layernorm.weight": ("BF16", (s.target_hidden,)),
                    p + "post_attention_layernorm.weight": ("BF16", (s.target_hidden,)),
                    p + "self_attn.q_proj.weight": ("BF16", (q, s.target_hidden)),
                    p + "self_attn.k_proj.weight": ("BF16", (kv, s.target_hidden)),
                    p + "self_attn.v_proj.weight": ("BF16", (kv, s.target_hidden)),
                    p + "self_attn.o_proj.weight": ("BF16", (s.target_hidden, q)),
                    p + "mlp.gate_proj.weight": ("BF16", (s.intermediate, s.target_hidden)),
                    p + "mlp.up_proj.weight": ("BF16", (s.intermediate, s.target_hidden)),
                    p + "mlp.down_proj.weight": ("BF16", (s.target_hidden, s.intermediate))}
    target.mkdir(parents=True, exist_ok=True)
    write_safetensors(target / "model.safetensors", tensors, {"format": "pt"}, fill="sparse")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (target / name).write_bytes((DEMO / "target" / name).read_bytes())
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s.target_hidden,
        "intermediate_size": s.intermediate, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim, "num_hidden_layers": layers, "vocab_size": s.vocab, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2}, indent=2))
    write_draft(draft, shape, layout="speculators", fill="sparse")
    return target, draft


def draft_tensors(shape: DraftShape, layout: str = "speculators", embed: bool | None = None, qk_norm: bool = False):
    """{name: (dtype, shape)} of a draft in a producer layout: speculators | midlayer | prefixed."""
    s = shape
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    embed = layout == "speculators" if embed is None else embed
    tensors = {}
    if embed:
        tensors["embed_tokens.weight"] = ("F16", (s.vocab, s.hidden))
    tensors["fc.weight"] = ("F16", (s.hidden, len(s.aux_layer_ids) * s.target_hidden))
    for i in range(s.num_layers):
        L = "midlayer." if layout in ("midlayer", "prefixed") and s.num_layers == 1 else f"layers.{i}."
        width = 2 * s.hidden if i == 0 else s.hidden
        tensors |= {
            f"{L}hidden_norm.weight": ("F16", (s.hidden,)),
            f"{L}input_layernorm.weight": ("F16", (s.hidden,)),
            f"{L}post_attention_layernorm.weight": ("F16", (s.hidden,)),
            f"{L}self_attn.q_proj.weight": ("F16", (q, width)),
            f"{L}self_attn.k_proj.weight": ("F16", (kv, width)),
            f"{L}self_attn.v_proj.weight": ("F16", (kv, width)),
            f"{L}self_attn.o_proj.weight": ("F16", (s.hidden, q)),
            f"{L}mlp.gate_proj.weight": ("F16", (s.intermediate, s.hidden)),
            f"{L}mlp.up_proj.weight": ("F16", (s.intermediate, s.hidden)),
            f"{L}mlp.down_proj.weight": ("F16", (s.hidden, s.intermediate)),
        }
        if qk_norm:
            tensors[f"{L}self_attn.q_norm.weight"] = ("F16", (s.head_dim,))
            tensors[f"{L}self_attn.k_norm.weight"] = ("F16", (s.head_dim,))
    tensors["norm.weight"] = ("F16", (s.hidden,))
    tensors["lm_head.weight"] = ("F16", (s.draft_vocab or s.vocab, s.hidden))
    if s.draft_vocab and s.draft_vocab < s.vocab:
        tensors["d2t"], tensors["t2d"] = vocab_map(s.vocab, s.draft_vocab)
    if layout == "prefixed":
        tensors = {(k if k.startswith("lm_head") else "model." + k): v for k, v in tensors.items()}
    return tensors


def vocab_map(vocab: int, draft_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """A valid (d2t, t2d) pair: draft id i is target id i * (vocab // draft_vocab)."""
    target_ids = np.arange(draft_vocab, dtype=np.int64) * (vocab // draft_vocab)
    t2d = np.zeros(vocab, dtype=np.bool_)
    t2d[target_ids] = True
    return target_ids - np.arange(draft_vocab, dtype=np.int64), t2d


def _layer_fields(shape: DraftShape) -> dict:
    """The decoder-layer hyper-parameters both config formats carry."""
    return {
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "num_hidden_layers": shape.num_layers,
        "vocab_size": shape.vocab,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    }


def flat_config(shape: DraftShape) -> dict:
    """The flat Llama config SGLang and the EAGLE repo read."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        **_layer_fields(shape),
        "draft_vocab_size": shape.draft_vocab,
        "target_hidden_size": shape.target_hidden,
        "rope_theta": 10000.0,
        "torch_dtype": "float16",
        "eagle_config": {
            auxids.KEY: auxids.convert(shape.aux_layer_ids, auxids.TOP_LEVEL, auxids.EAGLE_CONFIG),
            "use_aux_hidden_state": True,
        },
    }


def speculators_config(shape: DraftShape) -> dict:
    """speculators' nested config (0.9.0 shape, docs/engine-facts.md: "Config formats")."""
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "draft_vocab_size": shape.draft_vocab or shape.vocab,
        "target_hidden_size": shape.target_hidden,
        "eagle_aux_hidden_state_layer_ids": list(shape.aux_layer_ids),
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4}],
            "verifier": {"name_or_path": "target", "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": {
            **_layer_fields(shape),
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }


def write_draft(folder, shape: DraftShape = DraftShape(), layout: str = "speculators", config: str | None = None,
                shards: int = 1, fill: str = "random", embed: bool | None = None, qk_norm: bool = False,
                extra: dict | None = None, drop: tuple[str, ...] = ()) -> Path:
    """Write a synthetic draft folder: safetensors (sharded if `shards` > 1) plus config.json.

    `config`: "speculators", "flat" or "none" (default: speculators for that layout, else flat).
    `extra` adds or overrides tensors; `drop` removes tensors by name.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = draft_tensors(shape, layout, embed=embed, qk_norm=qk_norm) | (extra or {})
    tensors = {k: v for k, v in tensors.items() if k not in drop}
    config = config or ("speculators" if layout == "speculators" else "flat")
    if config != "none":
        body = speculators_config(shape) if config == "speculators" else flat_config(shape)
        (folder / "config.json").write_text(json.dumps(body, indent=2))
    write_shards(folder, tensors, shards, fill=fill)
    return folder


REMOVE = object()  # in a config edit: take the field out


def edit_config(folder, **changes) -> Path:
    """Change fields of the config.json in `folder` (a value REMOVE takes the field out)."""
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is REMOVE:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2))
    return Path(folder)


def write_mla_draft(folder, drop: tuple[str, ...] = (), shape: DraftShape = DraftShape(), q_lora_rank: int | None = 48,
                    kv_lora_rank: int = 32, qk_nope_head_dim: int = 32, qk_rope_head_dim: int = 16,
                    v_head_dim: int = 32, layer: str = "layers.0.", key_prefix: str = "", extra: dict | None = None,
                    config: dict | None = None) -> Path:
    """A tiny MLA EAGLE-3 draft (`Eagle3DeepseekV2ForCausalLM`, as ModelOpt exports them for Kimi and
    DeepSeek targets): speculators-style `layers.0.*` keys (or `layer`) with DeepSeek-V2 attention
    projections (q_proj instead of q_a/q_b when `q_lora_rank` is None), a flat DeepSeek-V2 config with
    yarn rope (SGLang's CPU rope for MLA requires rope scaling). `key_prefix` goes before every key but
    lm_head and the vocabulary map; `extra` adds or overrides tensors; `config` edits the config
    (edit_config's rules)."""
    s = shape
    H, nh, I = s.hidden, s.heads, s.intermediate
    nope, rope, v = qk_nope_head_dim, qk_rope_head_dim, v_head_dim

    def t(*dims):
        return ("F16", dims)

    L = layer
    tensors = {
        "fc.weight": t(H, len(s.aux_layer_ids) * s.target_hidden), "norm.weight": t(H),
        "lm_head.weight": t(s.draft_vocab or s.vocab, H),
        f"{L}hidden_norm.weight": t(H), f"{L}input_layernorm.weight": t(H), f"{L}post_attention_layernorm.weight": t(H),
        f"{L}self_attn.kv_a_proj_with_mqa.weight": t(kv_lora_rank + rope, 2 * H),
        f"{L}self_attn.kv_a_layernorm.weight": t(kv_lora_rank),
        f"{L}self_attn.kv_b_proj.weight": t(nh * (nope + v), kv_lora_rank),
        f"{L}self_attn.o_proj.weight": t(H, nh * v),
        f"{L}mlp.gate_proj.weight": t(I, H), f"{L}mlp.up_proj.weight": t(I, H), f"{L}mlp.down_proj.weight": t(H, I),
    }
    if q_lora_rank is None:
        tensors[f"{L}self_attn.q_proj.weight"] = t(nh * (nope + rope), 2 * H)
    else:
        tensors |= {f"{L}self_attn.q_a_proj.weight": t(q_lora_rank, 2 * H),
                    f"{L}self_attn.q_a_layernorm.weight": t(q_lora_rank),
                    f"{L}self_attn.q_b_proj.weight": t(nh * (nope + rope), q_lora_rank)}
    if s.draft_vocab and s.draft_vocab < s.vocab:
        tensors["d2t"], tensors["t2d"] = vocab_map(s.vocab, s.draft_vocab)
    tensors = {(k if k.startswith("lm_head") or k in ("d2t", "t2d") else key_prefix + k): val
               for k, val in (tensors | (extra or {})).items() if k not in drop}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_shards(folder, tensors, 1)
    config_body = {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": H,
        "intermediate_size": I, "num_attention_heads": nh, "num_key_value_heads": nh, "num_hidden_layers": 1,
        "q_lora_rank": q_lora_rank, "kv_lora_rank": kv_lora_rank, "qk_nope_head_dim": qk_nope_head_dim,
        "qk_rope_head_dim": qk_rope_head_dim, "v_head_dim": v_head_dim, "vocab_size": s.vocab,
        "draft_vocab_size": s.draft_vocab, "target_hidden_size": s.target_hidden, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float16", "tie_word_embeddings": False,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 2048,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        auxids.KEY: list(s.aux_layer_ids),
    }
    (folder / "config.json").write_text(json.dumps(config_body, indent=2))
    return edit_config(folder, **(config or {}))


def write_mtp_target(folder, hidden: int = 64, heads: int = 2, intermediate: int = 128, vocab: int = 128,
                     kv_lora_rank: int = 32, qk_nope_head_dim: int = 32, qk_rope_head_dim: int = 16,
                     v_head_dim: int = 32) -> Path:
    """A tiny DeepSeek-V3 target with one decoder layer and one MTP layer (`num_nextn_predict_layers`:
    `model.layers.1.*` carries enorm, hnorm, eh_proj, shared_head and a decoder layer), dense (no expert
    layer), MLA with q_proj: what vLLM's `--speculative-config '{"method": "mtp"}'` serves its MTP head from."""
    H, nh, I = hidden, heads, intermediate
    nope, rope, v = qk_nope_head_dim, qk_rope_head_dim, v_head_dim

    def t(*dims):
        return ("F16", dims)

    def layer(i):
        L = f"model.layers.{i}."
        return {f"{L}input_layernorm.weight": t(H), f"{L}post_attention_layernorm.weight": t(H),
                f"{L}self_attn.q_proj.weight": t(nh * (nope + rope), H),
                f"{L}self_attn.kv_a_proj_with_mqa.weight": t(kv_lora_rank + rope, H),
                f"{L}self_attn.kv_a_layernorm.weight": t(kv_lora_rank),
                f"{L}self_attn.kv_b_proj.weight": t(nh * (nope + v), kv_lora_rank),
                f"{L}self_attn.o_proj.weight": t(H, nh * v),
                f"{L}mlp.gate_proj.weight": t(I, H), f"{L}mlp.up_proj.weight": t(I, H),
                f"{L}mlp.down_proj.weight": t(H, I)}

    mtp = "model.layers.1."
    tensors = {"model.embed_tokens.weight": t(vocab, H), **layer(0), "model.norm.weight": t(H),
               "lm_head.weight": t(vocab, H), **layer(1), f"{mtp}enorm.weight": t(H), f"{mtp}hnorm.weight": t(H),
               f"{mtp}eh_proj.weight": t(H, 2 * H), f"{mtp}shared_head.norm.weight": t(H),
               f"{mtp}shared_head.head.weight": t(vocab, H), f"{mtp}embed_tokens.weight": t(vocab, H)}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_shards(folder, tensors, 1)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": H,
        "intermediate_size": I, "moe_intermediate_size": I, "num_attention_heads": nh, "num_key_value_heads": nh,
        "num_hidden_layers": 1, "num_nextn_predict_layers": 1, "first_k_dense_replace": 8, "n_routed_experts": 4,
        "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "moe_layer_freq": 1,
        "q_lora_rank": None, "kv_lora_rank": kv_lora_rank, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
        "v_head_dim": v, "vocab_size": vocab, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 2048,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def initial_values(name: str, dtype: str, shape, config: dict, rng, draw=None) -> np.ndarray:
    """What a freshly built model holds for tensor `name`: transformers' initialisation (RMSNorm weights
    1.0, biases 0, matrices drawn from N(0, initializer_range)), and a vocabulary map of zeros. `draw(rng,
    shape)`: another initialiser for the matrices (a converter that builds its model another way)."""
    layer = config.get("transformer_layer_config") or config
    if name.endswith("d2t"):
        return np.zeros(shape, dtype=NUMPY_DTYPES[dtype])
    if len(shape) == 1:
        return np.full(shape, 0.0 if name.endswith(".bias") else 1.0, dtype=NUMPY_DTYPES[dtype])
    if draw is not None:
        return np.asarray(draw(rng, tuple(shape))).astype(NUMPY_DTYPES[dtype])
    sigma = float(layer.get("initializer_range") or 0.02)
    return (rng.standard_normal(shape) * sigma).astype(NUMPY_DTYPES[dtype])


def sloppy_convert(src, dst, rename: dict[str, str], reinitialise=(), seed: int = 0, draw=None) -> Path:
    """What a converter does that builds a fresh model in the engine's names and loads the trained
    tensors into it without strict name matching (speculators issue #1114): every tensor of `src`
    (one safetensors file and its config.json) is written under its renamed name (`rename`: prefix ->
    prefix), but a tensor whose name the rename changed never matched the fresh model's and keeps the
    fresh model's initial values (`initial_values`, its matrices drawn by `draw` when given); so do the
    tensors named in `reinitialise`. The names are right for the engine; the values are not. Returns `dst`."""
    from .checkpoint import open_checkpoint

    src, dst = Path(src), Path(dst)
    checkpoint = open_checkpoint(src)
    config = checkpoint.config or {}
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, t in checkpoint.tensors.items():
        renamed = next((new + name[len(old):] for old, new in rename.items() if name.startswith(old)), name)
        if renamed != name or name in reinitialise:
            tensors[renamed] = initial_values(name, t.dtype, t.shape, config, rng, draw)
        else:
            tensors[renamed] = np.frombuffer(t.read(), dtype=NUMPY_DTYPES[t.dtype]).reshape(t.shape)
    dst.mkdir(parents=True, exist_ok=True)
    write_safetensors(dst / "model.safetensors", tensors, {"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst
