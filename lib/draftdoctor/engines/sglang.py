"""SGLang's `LlamaForCausalLMEagle3`, one profile per release range (field notes §3), and what its
server spells and reports per release range (`SERVING`, field notes §5, §6).

Read from the released wheels: 0.4.8 (`load_weights` delegates to the Llama loader), 0.5.10 and
0.5.11 (`midlayer`, silent skip), 0.5.15, 0.5.23 (`layers` ModuleList, legacy renames). Releases
between two that were read are assumed to match the earlier one.
"""

from .profile import CRASH, SKIP, WARN, Profile, ServingFacts

ONE_LAYER = "EAGLE3 currently only supports 1 layer"
_SILENT = (SKIP, "")
# read in 0.5.10 (layers/linear.py) and seen on 0.5.10/0.5.23's real loaders for down_proj
_PAD_OR_NARROW = ((".o_proj.weight", 1), (".down_proj.weight", 1), (".gate_up_proj.weight", 0))

_COMMON = dict(
    engine="sglang",
    architectures=("LlamaForCausalLMEagle3",),
    derived_keys=(("d2t", "hot_token_id"),),
    renamed_keys=(),
    ignored_keys=("t2d",),
    vocab_map_param=None,
    embed_from_target=True,
    config_formats=("flat",),
    # the registry builds the target class for it; the load then fails at lm_head (0.5.10, 0.5.11 and
    # 0.5.23's own loaders, tests/test_differential.py)
    plain_architectures=("LlamaForCausalLM",),
    chain_position_offset=1,  # eagle_worker.py: positions = seq_lens, then add_(1) before each chain step
)

PROFILES = [
    Profile(
        first="0.4.4.post2", last="0.4.8",
        layer_prefix="model.midlayer.", single_layer_error=ONE_LAYER,
        legacy_renames=(),
        prefix_rule="always",
        on_unmatched=(WARN, "Parameter {name} not found in params_dict"),
        on_unmatched_stacked=(CRASH, "KeyError: '{name}'"),
        fc_bias="always", fc_aux_from_ids=False, supports_fc_norm=False, supports_input_norm=False,
        **_COMMON,
    ),
    Profile(
        first="0.4.9", last="0.5.11",
        layer_prefix="model.midlayer.", single_layer_error=ONE_LAYER,
        legacy_renames=(),
        prefix_rule="fallback", on_unmatched=_SILENT, on_unmatched_stacked=_SILENT,
        fc_bias="config", fc_aux_from_ids=False, supports_fc_norm=False, supports_input_norm=False,
        resized_silently=_PAD_OR_NARROW,
        **_COMMON,
    ),
    Profile(
        first="0.5.12", last="0.5.23",
        layer_prefix="model.layers.{i}.", single_layer_error=None,
        legacy_renames=(("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"),
                        ("aux_norm_mid", "fc_norm.1"), ("aux_norm_high", "fc_norm.2")),
        prefix_rule="fallback", on_unmatched=_SILENT, on_unmatched_stacked=_SILENT,
        fc_bias="config", fc_aux_from_ids=True, supports_fc_norm=True, supports_input_norm=True,
        supports_norm_output=True, resized_silently=_PAD_OR_NARROW,
        # kimi_k25_eagle3.py: in 0.5.23, not in 0.5.11 (their own loaders); 0.5.12-0.5.22 not read yet
        unmodelled_classes=("Eagle3DeepseekV2ForCausalLM",),
        **_COMMON,
    ),
]

_OLD_GRAPH_FLAGS = dict(disable_cuda_graph=("--disable-cuda-graph",), cuda_graph_max_bs="--cuda-graph-max-bs")
# 0.5.15 deprecates --disable-cuda-graph for per-phase backends; 0.5.23 drops --cuda-graph-max-bs
_PHASE_GRAPH_FLAGS = dict(disable_cuda_graph=("--cuda-graph-backend-decode", "disabled",
                                              "--cuda-graph-backend-prefill", "disabled"),
                          cuda_graph_max_bs="--cuda-graph-max-bs-decode")
_COMMA = "Decode batch,"
_COUNTS_0_5_11 = ("spec_accepted_drafts", "spec_proposed_drafts")

SERVING = [
    ServingFacts("sglang", "0.0.0", "0.4.10.post2", spec_count_fields=None, accept_rate_formula="none",
                 decode_line_head="Decode batch.", **_OLD_GRAPH_FLAGS),
    ServingFacts("sglang", "0.5.1", "0.5.3.post3", spec_count_fields=None, accept_rate_formula="none",
                 decode_line_head=_COMMA, **_OLD_GRAPH_FLAGS),
    ServingFacts("sglang", "0.5.4", "0.5.4.post3", spec_count_fields=None, accept_rate_formula="unknown",
                 decode_line_head=_COMMA, **_OLD_GRAPH_FLAGS),
    ServingFacts("sglang", "0.5.5", "0.5.10.post1", spec_count_fields=("spec_accept_token_num", "spec_draft_token_num"),
                 accept_rate_formula="bonus", decode_line_head=_COMMA, **_OLD_GRAPH_FLAGS),
    ServingFacts("sglang", "0.5.11", "0.5.14", spec_count_fields=_COUNTS_0_5_11, accept_rate_formula="strict",
                 decode_line_head=_COMMA, **_OLD_GRAPH_FLAGS),
    ServingFacts("sglang", "0.5.15", "0.5.22", spec_count_fields=_COUNTS_0_5_11, accept_rate_formula="strict",
                 decode_line_head=_COMMA, **_PHASE_GRAPH_FLAGS),
    ServingFacts("sglang", "0.5.23", "0.5.23", spec_count_fields=("spec_num_correct_drafts", "spec_num_proposed_drafts"),
                 accept_rate_formula="strict", decode_line_head=_COMMA, **_PHASE_GRAPH_FLAGS),
]
