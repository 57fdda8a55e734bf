"""vLLM's `Eagle3LlamaForCausalLM` (field notes §4; read from vLLM 0.25.0-0.33.0's released source).

vLLM renames `midlayer.` to `layers.0.`, turns `d2t` into the `draft_id_to_target_id` parameter,
prefixes every key but `lm_head` with `model.`, and fails loudly on a key it cannot place, except a
`.bias` one (e.g. `fc.bias`: vLLM's fc has none), which it drops silently. It reads speculators'
nested config directly. The two rows differ in one thing: up to 0.29.0 the `draft_id_to_target_id`
parameter always exists (zeros, the identity map, when the checkpoint has no d2t); from 0.30.0 it
exists only when the draft's vocabulary differs from the target's, so a d2t beside an equal
vocabulary is a key with nowhere to go. Within each row `llama_eagle3.py` differs only in typing and
in a pipeline-parallel layer count; the loader and speculators config code differ in ways an
EAGLE-3 draft does not reach. `docs/research/vllm-eagle3-by-release.md` has notes for 0.8.5-0.24.0.

Aux layer ids are those of Model Runner V2, which these releases use by default for a dense target
(`VllmConfig.use_v2_model_runner`; from 0.29.0 for MoE targets too): it reads only the top-level
`eagle_aux_hidden_state_layer_ids` (`get_eagle3_aux_layers_from_config`), as-is. The V1 runner (with
`VLLM_USE_V2_MODEL_RUNNER=0`, or for EAGLE-3 with pipeline parallelism) also reads
`eagle_config.eagle_aux_hidden_state_layer_ids`, as-is; `draftdoctor fix` writes top-level ids,
which both read.
"""

from . import CRASH, Profile

_UNKNOWN = (CRASH, "ValueError: There is no module or parameter named {name!r} in Eagle3LlamaForCausalLM")

_COMMON = dict(
    engine="vllm",
    architectures=("Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3Speculator", "Eagle3DraftModel"),
    layer_prefix="model.layers.{i}.", single_layer_error=None,
    legacy_renames=(("midlayer.", "layers.0."),),
    derived_keys=(),
    renamed_keys=(("d2t", "draft_id_to_target_id"),),
    ignored_keys=("t2d",),
    prefix_rule="always", on_unmatched=_UNKNOWN, on_unmatched_stacked=_UNKNOWN,
    fc_bias="never", fc_aux_from_ids=True, supports_fc_norm=True, supports_input_norm=True,
    vocab_map_param="draft_id_to_target_id",
    embed_from_target=True,
    config_formats=("flat", "speculators"),
    aux_ids_from=("top-level",), aux_capture_offset=0,
    supports_norm_output=True, supports_norm_before_residual=True,
    unmatched_skipped_suffixes=(".bias",),  # AutoWeightsLoader.load_weights: "Ignore unexpected biases"
)

PROFILES = [
    # Eagle3LlamaForCausalLM.__init__ builds draft_id_to_target_id unconditionally
    Profile(first="0.25.0", last="0.29.0", vocab_map_always=True, **_COMMON),
    # ... and from 0.30.0 only `if self.config.draft_vocab_size != target_vocab_size`
    Profile(first="0.30.0", last="0.33.0", **_COMMON),
]
