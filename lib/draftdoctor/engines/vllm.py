"""vLLM's `Eagle3LlamaForCausalLM` (field notes §4; read from vLLM 0.30.0-0.33.0, whose
`llama_eagle3.py` is identical and whose loader and config code differ only in ways it ignores).

vLLM renames `midlayer.` to `layers.0.`, turns `d2t` into the `draft_id_to_target_id` parameter,
prefixes every key but `lm_head` with `model.`, and fails loudly on a key it cannot place, except a
`.bias` one (e.g. `fc.bias`: vLLM's fc has none), which it drops silently. It reads speculators'
nested config directly. `docs/research/vllm-eagle3-by-release.md` has notes for older releases.
"""

from . import CRASH, Profile

_UNKNOWN = (CRASH, "ValueError: There is no module or parameter named {name!r} in Eagle3LlamaForCausalLM")

PROFILES = [
    Profile(
        engine="vllm", first="0.30.0", last="0.33.0",  # older releases: docs/research, not encoded yet
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
        aux_ids_from=("top-level", "eagle_config"), aux_capture_offset=0,
        supports_norm_output=True, supports_norm_before_residual=True,
        unmatched_skipped_suffixes=(".bias",),  # AutoWeightsLoader.load_weights: "Ignore unexpected biases"
    ),
]
