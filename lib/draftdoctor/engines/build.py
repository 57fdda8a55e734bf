"""Building the parameters: the parameter list a release's draft class creates for a draft's
dimensions (`parameters`, the interpreter of a row's `Build` record), and what becomes of one no key
writes (`from_target`, `identity_by_default`, reading its `Unwritten` record)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import auxids
from ..configs import SPECULATORS, DraftDims

if TYPE_CHECKING:
    from .profile import Profile


@dataclass(frozen=True)
class ParamSpec:
    """One parameter the engine creates; `shards` maps a shard id to its (row offset, rows)."""

    name: str
    shape: tuple[int, ...]
    role: str  # embed | fc | layer | norm | lm_head | vocab-map
    shards: dict = field(default_factory=dict)

    def shard_range(self, shard) -> tuple[int, int]:
        """(row offset, rows) of a shard, given by its id or its id as a string ("q", "0")."""
        return next(v for s, v in self.shards.items() if str(s) == str(shard))

    def shard_shape(self, shard) -> tuple[int, ...]:
        """The shape a checkpoint tensor must have to load into `shard` (None: the whole parameter)."""
        return self.shape if shard is None else (self.shard_range(shard)[1], *self.shape[1:])



def fc_aux_count(profile: Profile, dims: DraftDims) -> int:
    """How many aux hidden states the engine builds fc for (`Build.fc_aux_count_from`)."""
    found = {"num_aux_layers": dims.num_aux_layers, "num_aux_hidden_states": dims.num_aux_hidden_states,
             auxids.EAGLE_CONFIG: len(dims.aux_ids_eagle or ()), auxids.TOP_LEVEL: len(dims.aux_ids_top or ())}
    return next((found[place] for place in profile.build.fc_aux_count_from if found[place]), 3)


def builds_input_norm(profile: Profile, dims: DraftDims) -> bool:
    """Whether the release builds input_norm (norm_before_fc) for this draft, reading the flag where it does
    (`ConfigReading.norm_before_fc_from`)."""
    flag = dict(dims.norm_before_fc_at)
    at = next((where for where in profile.config.norm_before_fc_from if where in flag), None)
    return profile.build.supports_input_norm and at is not None and flag[at]


def _llama_layer(profile: Profile, L: str, width: int, dims: DraftDims) -> list[ParamSpec]:
    H, hd = dims.hidden_size, dims.head_dim
    q, kv = dims.num_heads * hd, dims.num_kv_heads * hd
    qkv_shards = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}
    params = [ParamSpec(f"{L}self_attn.qkv_proj.weight", (q + 2 * kv, width), "layer", qkv_shards)]
    if profile.build.qkv_bias_from_config and dims.attention_bias:
        params.append(ParamSpec(f"{L}self_attn.qkv_proj.bias", (q + 2 * kv,), "layer", qkv_shards))
    if profile.build.draft_class == "qwen3":
        params += [ParamSpec(f"{L}self_attn.q_norm.weight", (hd,), "layer"),
                   ParamSpec(f"{L}self_attn.k_norm.weight", (hd,), "layer")]
    params.append(ParamSpec(f"{L}self_attn.o_proj.weight", (H, q), "layer"))
    # llama.py: attention_bias or bias
    if profile.build.o_proj_bias_from_config and (dims.attention_bias or dims.fc_bias):
        params.append(ParamSpec(f"{L}self_attn.o_proj.bias", (H,), "layer"))
    return params + _mlp_and_norms(L, dims)


def _mla_layer(profile: Profile, L: str, width: int, dims: DraftDims) -> list[ParamSpec]:
    """DeepSeek-V2 attention (q through a low-rank q_a/q_b pair, or q_proj when q_lora_rank is null;
    keys and values through the kv_a latent and kv_b) with the draft's 2H-wide first input."""
    H, heads, qL, kvL = dims.hidden_size, dims.num_heads, dims.q_lora_rank, dims.kv_lora_rank
    nope, rope, v = dims.qk_nope_head_dim, dims.qk_rope_head_dim, dims.v_head_dim
    A = f"{L}self_attn."
    params = []
    if qL is None:
        params += [ParamSpec(f"{A}kv_a_proj_with_mqa.weight", (kvL + rope, width), "layer"),
                   ParamSpec(f"{A}q_proj.weight", (heads * (nope + rope), width), "layer")]
    else:
        paired = profile.keys.paired_keys  # SGLang caches the two halves and writes them at once: no shards
        fused = paired[0][2] if paired else "fused_qkv_a_proj"
        shards = {} if paired else {0: (0, qL), 1: (qL, kvL + rope)}
        params += [ParamSpec(f"{A}{fused}.weight", (qL + kvL + rope, width), "layer", shards),
                   ParamSpec(f"{A}q_a_layernorm.weight", (qL,), "layer"),
                   ParamSpec(f"{A}q_b_proj.weight", (heads * (nope + rope), qL), "layer")]
    params += [ParamSpec(f"{A}kv_a_layernorm.weight", (kvL,), "layer"),
               ParamSpec(f"{A}kv_b_proj.weight", (heads * (nope + v), kvL), "layer"),
               ParamSpec(f"{A}o_proj.weight", (H, heads * v), "layer")]
    return params + _mlp_and_norms(L, dims)


def _mlp_and_norms(L: str, dims: DraftDims) -> list[ParamSpec]:
    H, inter = dims.hidden_size, dims.intermediate_size
    return [ParamSpec(f"{L}mlp.gate_up_proj.weight", (2 * inter, H), "layer", {0: (0, inter), 1: (inter, inter)}),
            ParamSpec(f"{L}mlp.down_proj.weight", (H, inter), "layer"),
            ParamSpec(f"{L}input_layernorm.weight", (H,), "layer"),
            ParamSpec(f"{L}post_attention_layernorm.weight", (H,), "layer"),
            ParamSpec(f"{L}hidden_norm.weight", (H,), "layer")]


LAYER_BUILDERS = {"llama": _llama_layer, "qwen3": _llama_layer, "mla": _mla_layer}


def _gguf_parameters(profile: Profile, dims: DraftDims) -> list[ParamSpec]:
    """llama.cpp's EAGLE-3 tensors (src/models/eagle3.cpp), unfused, by their GGUF names."""
    H, hd, inter = dims.hidden_size, dims.head_dim, dims.intermediate_size
    q, kv, Ht = dims.num_heads * hd, dims.num_kv_heads * hd, dims.target_hidden_size or H
    params = [ParamSpec("token_embd.weight", (dims.vocab_size, H), "embed")]
    if builds_input_norm(profile, dims):
        params.append(ParamSpec("enc.output_norm.weight", (3 * Ht,), "norm"))
    params.append(ParamSpec("fc.weight", (H, 3 * Ht), "fc"))
    for name, shape in (("attn_norm", (H,)), ("attn_norm_2", (H,)), ("attn_q", (q, 2 * H)), ("attn_k", (kv, 2 * H)),
                        ("attn_v", (kv, 2 * H)), ("attn_output", (H, q)), ("ffn_norm", (H,)), ("ffn_gate", (inter, H)),
                        ("ffn_up", (inter, H)), ("ffn_down", (H, inter))):
        params.append(ParamSpec(f"blk.0.{name}.weight", shape, "layer"))
    params += [ParamSpec("output_norm.weight", (H,), "norm"),
               ParamSpec("output.weight", (dims.draft_vocab_size or dims.vocab_size, H), "lm_head")]
    if vocab_map := profile.build.vocab_map_param:
        params.append(ParamSpec(vocab_map, (dims.draft_vocab_size or dims.vocab_size,), "vocab-map"))
    return params


def parameters(profile: Profile, dims: DraftDims) -> list[ParamSpec]:
    """The parameters `profile`'s draft class creates for a draft of `dims` (its `Build` record, and what its
    `ConfigReading` passes on)."""
    build, config = profile.build, profile.config
    if build.naming == "gguf":
        return _gguf_parameters(profile, dims)
    H = dims.hidden_size
    Ht = dims.target_hidden_size or H
    aux = fc_aux_count(profile, dims)
    params = [ParamSpec("model.embed_tokens.weight", (dims.vocab_size, H), "embed")]
    dropped = ([o for o in config.speculators_drops if o not in dims.layer_options]
               if dims.config_format == SPECULATORS else ())
    if builds_input_norm(profile, dims) and "norm_before_fc" not in dropped:
        params.append(ParamSpec("model.input_norm.weight", (aux * Ht,), "norm"))
    if (dims.fc_norm or dims.use_aux_norm and config.reads_use_aux_norm) and build.supports_fc_norm \
            and "fc_norm" not in dropped:
        params += [ParamSpec(f"model.fc_norm.{i}.weight", (Ht,), "norm") for i in range(aux)]
    params.append(ParamSpec("model.fc.weight", (H, aux * Ht), "fc"))
    if build.fc_bias == "always" or build.fc_bias == "config" and dims.fc_bias:
        params.append(ParamSpec("model.fc.bias", (H,), "fc"))
    build_layer = LAYER_BUILDERS[build.draft_class]
    for i in range(dims.num_layers if build.single_layer_error is None else 1):
        params += build_layer(profile, build.layer_name(i), 2 * H if i == 0 else H, dims)
    params.append(ParamSpec("model.norm.weight", (H,), "norm"))
    if not dims.tie_word_embeddings or build.lm_head_when_tied:
        params.append(ParamSpec("lm_head.weight", (dims.draft_vocab_size or dims.vocab_size, H), "lm_head"))
    if build.vocab_map_param and (build.vocab_map_always or not _same_vocabulary(dims)):
        params.append(ParamSpec(build.vocab_map_param, (dims.draft_vocab_size or dims.vocab_size,), "vocab-map"))
    return params


def _same_vocabulary(dims: DraftDims) -> bool:
    return dims.draft_vocab_size in (None, dims.vocab_size)


def from_target(profile: Profile, dims: DraftDims, param: ParamSpec) -> bool:
    """Whether the engine replaces this parameter with the target's at serve time."""
    if param.role == "embed":
        return profile.unwritten.embed_from_target and (dims.target_hidden_size in (None, dims.hidden_size))
    return param.role == "lm_head" and dims.draft_vocab_size is None


def identity_by_default(dims: DraftDims, param: ParamSpec) -> bool:
    """Whether the parameter's initial value is already right for this draft: a vocab map's zeros
    map each draft id to the same target id, which is right when the two vocabularies are one."""
    return param.role == "vocab-map" and _same_vocabulary(dims)
