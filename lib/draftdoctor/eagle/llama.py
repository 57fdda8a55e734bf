"""Plain-torch Llama pieces shared by the reference target and the EAGLE-3 draft.

Math follows transformers' LlamaForCausalLM and SGLang's Llama layers (RMSNorm computed in float32,
neox-style rotary embedding with the default rope, grouped-query attention, SiLU-gated MLP). The
target is loaded from a transformers checkpoint folder (config.json + *.safetensors), so the same
weights run in transformers for the correctness tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LayerShape:
    """Sizes of one Llama decoder layer (attention input may be wider than `hidden`)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope_theta: float


def layer_shape(cfg: dict) -> LayerShape:
    """LayerShape from a flat Llama config dict (transformers field names)."""
    heads = cfg["num_attention_heads"]
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("attention/MLP biases are not supported by the reference engine")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope type {rope.get('rope_type')!r} is not supported by the reference engine")
    return LayerShape(
        hidden=cfg["hidden_size"],
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate=cfg["intermediate_size"],
        eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # float32 for every input dtype, float64 included, exactly as transformers' LlamaRMSNorm: the
    # float64 tests then compare against it with both sides rounding here identically
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply the default (neox-style) rotary embedding; x is [T, heads, head_dim]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    freqs = positions[:, None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype)[:, None, :], emb.sin().to(x.dtype)[:, None, :]
    half = dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@dataclass
class LayerCache:
    """Keys/values of one attention layer: [kv_heads, T, head_dim] each, rotary already applied."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    def truncate(self, n: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :n], self.v[:, :n]


@dataclass
class KVCache:
    """One LayerCache per decoder layer; all layers always have the same length."""

    layers: list[LayerCache] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int) -> "KVCache":
        return cls([LayerCache() for _ in range(n_layers)])

    def __len__(self) -> int:
        return len(self.layers[0])

    def truncate(self, n: int) -> None:
        for layer in self.layers:
            layer.truncate(n)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
    shape: LayerShape, cache: LayerCache,
) -> torch.Tensor:
    """Causal attention of T new tokens over the cache plus themselves; appends their k/v.

    q: [T, heads*head_dim], k/v: [T, kv_heads*head_dim]. Returns [T, heads*head_dim].
    """
    t = q.shape[0]
    q = rotate(q.view(t, shape.heads, shape.head_dim), positions, shape.rope_theta)
    k = rotate(k.view(t, shape.kv_heads, shape.head_dim), positions, shape.rope_theta)
    v = v.view(t, shape.kv_heads, shape.head_dim)
    k, v = k.transpose(0, 1), v.transpose(0, 1)
    if cache.k is not None:
        k, v = torch.cat([cache.k, k], dim=1), torch.cat([cache.v, v], dim=1)
    cache.k, cache.v = k, v
    past = k.shape[1] - t
    mask = torch.ones(t, k.shape[1], dtype=torch.bool).tril(diagonal=past)
    rep = shape.heads // shape.kv_heads
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0),
        attn_mask=mask,
    )
    return out.transpose(0, 1).reshape(t, shape.heads * shape.head_dim)


def mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder (single file or shards listed in the index)."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


class TargetModel:
    """A Llama target that returns logits and the aux hidden states an engine captures.

    `capture` lists decoder-layer indices i whose *input* (the residual stream before layer i,
    i.e. transformers' hidden_states[i]) is returned, which is what SGLang's and vLLM's Llama
    record as aux hidden states; index N (number of layers) is the final state before the norm.
    """

    def __init__(self, config: dict, weights: dict[str, torch.Tensor], dtype=torch.float32):
        self.config = config
        self.shape = layer_shape(config)
        self.n_layers = config["num_hidden_layers"]
        self.vocab_size = config["vocab_size"]
        self.dtype = dtype  # the draft runs in it too, as an engine runs the draft in the target's dtype
        self.w = {k: v.to(dtype) for k, v in weights.items()}
        if "lm_head.weight" not in self.w:  # tied embeddings
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]

    @classmethod
    def from_dir(cls, path: str | Path, dtype=torch.float32) -> "TargetModel":
        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        return cls(config, load_safetensors_dir(path), dtype)

    @property
    def embed(self) -> torch.Tensor:
        return self.w["model.embed_tokens.weight"]

    @property
    def head(self) -> torch.Tensor:
        return self.w["lm_head.weight"]

    def forward_bytes(self, tokens: int) -> int:
        """An upper bound on the memory one `forward` of `tokens` new tokens allocates: per layer, the
        causal mask (built as t x t bools, then a float copy) and the attention scores and their softmax
        (heads x t x t each, float32, when the kernel materialises them: 8 to 12 bytes per head and
        pair, with the masks 22-24 bytes a pair at 2 heads, measured on these CPUs), q/k/v repeated to
        every head, the MLP's three activations; the KV cache of every layer; the logits (t x
        vocabulary). Quadratic in `tokens`: what bounds the longest request (`reference.server`)."""
        s, t, size = self.shape, tokens, torch.finfo(self.dtype).bits // 8
        per_layer = t * t * (8 + 12 * s.heads) + size * t * (3 * s.heads * s.head_dim + 3 * s.intermediate + 4 * s.hidden)
        cache = self.n_layers * 2 * t * s.kv_heads * s.head_dim * size
        return per_layer + cache + size * t * self.vocab_size

    def new_cache(self) -> KVCache:
        return KVCache.empty(self.n_layers)

    @torch.no_grad()
    def forward(
        self, ids: torch.Tensor, cache: KVCache, capture: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run ids (1-D) after what the cache holds. Returns logits [T, V] and captured states."""
        positions = torch.arange(len(cache), len(cache) + ids.shape[0])
        x = self.w["model.embed_tokens.weight"][ids]
        aux = []
        for i in range(self.n_layers):
            if i in capture:
                aux.append(x)
            p = f"model.layers.{i}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.shape.eps)
            a = attention(
                F.linear(h, self.w[p + "self_attn.q_proj.weight"]),
                F.linear(h, self.w[p + "self_attn.k_proj.weight"]),
                F.linear(h, self.w[p + "self_attn.v_proj.weight"]),
                positions, self.shape, cache.layers[i],
            )
            x = x + F.linear(a, self.w[p + "self_attn.o_proj.weight"])
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.shape.eps)
            x = x + mlp(h, self.w[p + "mlp.gate_proj.weight"], self.w[p + "mlp.up_proj.weight"],
                        self.w[p + "mlp.down_proj.weight"])
        if self.n_layers in capture:
            aux.append(x)
        x = rms_norm(x, self.w["model.norm.weight"], self.shape.eps)
        return F.linear(x, self.w["lm_head.weight"]), aux
