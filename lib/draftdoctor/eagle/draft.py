"""The EAGLE-3 draft as SGLang's LlamaForCausalLMEagle3 and vLLM's Eagle3LlamaForCausalLM compute it,
on plain torch (the two compute alike but for norm_before_residual, which only vLLM implements).

Weights come as a dict in SGLang's *parameter* naming (after its loader fused q/k/v into
`qkv_proj` and gate/up into `gate_up_proj`), plus the set of names a loader actually wrote.
Parameters never written keep a deterministic stand-in for SGLang's initial value:

- RMSNorm weights: ones (SGLang creates them with torch.ones).
- Every other parameter: SGLang allocates it with torch.empty, whose content is whatever was in
  memory. The stand-in is a standard normal draw seeded from the parameter name (zlib.crc32), so
  runs are reproducible and the values bear no relation to a trained scale, as stale memory doesn't.

Forward semantics (SGLang 0.4.9+ llama_eagle3.py): fc projects the concatenated aux hidden states
only when their width differs from the embedding width (i.e. on target states, not on the draft's
own); residual = the un-normalised hidden; attention over cat(input_layernorm(embed),
hidden_norm(hidden)) (2H wide); post_attention_layernorm with fused residual add; MLP; final norm
with fused residual add; lm_head over the draft vocabulary. The hidden state handed to the next
draft step is the pre-norm residual stream. speculators' `norm_before_residual: true` (residual =
hidden_norm(hidden)) has no equivalent in SGLang: the draft computes it when the emulated engine
does (vLLM, `build_draft(norm_before_residual=...)`); for SGLang `EagleDraft.with_norm_before_residual`
computes it only as a control, to show what such a draft does when computed as it was trained.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftdoctor.configs import DraftDims, layer_config
from draftdoctor.engines import EngineRelease, expect_release, parameters
from draftdoctor.eagle.llama import KVCache, LayerShape, attention, layer_shape, rms_norm

MIDLAYER = "model.midlayer."  # the decoder layer's prefix in SGLang 0.4.4 - 0.5.11


@dataclass(frozen=True)
class DraftShape:
    """Sizes of an EAGLE-3 draft, read from a flat (SGLang/EAGLE-style) Llama config."""

    layer: LayerShape
    vocab: int  # rows of embed_tokens: the target vocabulary
    draft_vocab: int  # rows of lm_head
    fc_in: int  # 3 * target hidden size
    fc_bias: bool


def draft_shape(config: dict) -> DraftShape:
    """DraftShape from a flat or speculators draft config (`DraftDims` reads both; the engines refuse
    the combinations they cannot build before this is asked: `check`'s findings)."""
    dims = DraftDims.from_config(config)
    if dims.tie_word_embeddings:
        raise ValueError("tie_word_embeddings drafts are not supported by the reference engine")
    return DraftShape(
        layer=layer_shape(layer_config(config)),
        vocab=dims.vocab_size,
        draft_vocab=dims.draft_vocab_size or dims.vocab_size,
        fc_in=dims.fc_in,
        fc_bias=dims.fc_bias,
    )


def initial_value(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The deterministic stand-in for a parameter no loader wrote (see module docstring)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g)


class EagleDraft:
    """One-layer EAGLE-3 draft with SGLang's forward. Use `build_draft` to make one."""

    def __init__(self, shape: DraftShape, params: dict[str, torch.Tensor], layer_prefix: str,
                 hot_token_id: torch.Tensor | None, norm_before_residual: bool = False):
        self.shape = shape
        self.params = params
        self.prefix = layer_prefix
        self.hot_token_id = hot_token_id
        self.norm_before_residual = norm_before_residual

    def new_cache(self) -> KVCache:
        return KVCache.empty(1)

    def with_norm_before_residual(self) -> "EagleDraft":
        """The same weights computed with speculators' norm_before_residual: true (residual =
        hidden_norm(hidden)); no SGLang release computes this, so it serves only as a control."""
        return EagleDraft(self.shape, self.params, self.prefix, self.hot_token_id, norm_before_residual=True)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids to target ids (SGLang's hot_token_id; identity without d2t)."""
        return draft_ids if self.hot_token_id is None else self.hot_token_id[draft_ids]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [T] (target vocab), hidden [T, 3*Ht] (target aux) or [T, H] (draft's own).

        Returns draft-vocab logits [T, Vd] and the hidden state for the next step [T, H].
        """
        w, p, s = self.params, self.prefix, self.shape.layer
        embeds = w["model.embed_tokens.weight"][ids]
        if hidden.shape[-1] != embeds.shape[-1]:
            if hidden.shape[-1] != self.shape.fc_in:
                raise ValueError(f"draft fc expects {self.shape.fc_in} input features, got "
                                 f"{hidden.shape[-1]} (aux hidden states captured from the wrong "
                                 "number of layers)")
            hidden = F.linear(hidden, w["model.fc.weight"], w.get("model.fc.bias"))
        normed = rms_norm(hidden, w[p + "hidden_norm.weight"], s.eps)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([rms_norm(embeds, w[p + "input_layernorm.weight"], s.eps), normed], dim=-1)
        q, k, v = F.linear(x, w[p + "self_attn.qkv_proj.weight"]).split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
        a = attention(q, k, v, positions, s, cache.layers[0])
        residual = F.linear(a, w[p + "self_attn.o_proj.weight"]) + residual
        h = rms_norm(residual, w[p + "post_attention_layernorm.weight"], s.eps)
        gate, up = F.linear(h, w[p + "mlp.gate_up_proj.weight"]).chunk(2, dim=-1)
        residual = F.linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"]) + residual
        logits = F.linear(rms_norm(residual, w["model.norm.weight"], s.eps), w["lm_head.weight"])
        return logits, residual


def build_draft(config: dict, state: dict[str, torch.Tensor], written: set[str],
                hot_token_id: torch.Tensor | None = None, engine: EngineRelease | None = None,
                dtype=torch.float32, norm_before_residual: bool = False) -> EagleDraft:
    """The draft an engine release runs after its loader wrote `written`, a subset of the
    parameters that release's draft class creates (`engines.parameters`, the names `check` uses).

    `state[name]` supplies each written parameter; the rest get `initial_value`. `hot_token_id`
    is the draft->target id map (d2t + arange(Vd): SGLang's hot_token_id, vLLM's
    draft_id_to_target_id plus the ids), or None when no d2t was loaded. `engine`: the release whose
    draft class it is (None: SGLang 0.5.10's).
    """
    shape = draft_shape(config)
    engine = EngineRelease.of("sglang", "0.5.10") if engine is None else expect_release(engine)
    profile = engine.profile
    expected = {p.name: p.shape for p in parameters(profile, DraftDims.from_config(config)) if p.role != "vocab-map"}
    unknown = written - expected.keys()
    if unknown:
        raise ValueError(f"written names that are not parameters of the draft: {sorted(unknown)}")
    params = {}
    for name, want in expected.items():
        t = state[name] if name in written else initial_value(name, want)
        if tuple(t.shape) != want:
            raise ValueError(f"{name}: shape {tuple(t.shape)}, the draft needs {want}")
        params[name] = t.to(dtype)
    if hot_token_id is not None and hot_token_id.shape != (shape.draft_vocab,):
        raise ValueError(f"hot_token_id has shape {tuple(hot_token_id.shape)}, "
                         f"expected ({shape.draft_vocab},)")
    return EagleDraft(shape, params, profile.build.layer_name(0), hot_token_id, norm_before_residual)
