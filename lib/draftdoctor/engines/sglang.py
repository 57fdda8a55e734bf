"""SGLang's `LlamaForCausalLMEagle3`, one profile per release range (field notes §3), and what its
server spells and reports per release range (`SERVING`, field notes §5, §6).

Read from the released wheels: 0.4.8 (`load_weights` delegates to the Llama loader), 0.5.10 and
0.5.11 (`midlayer`, silent skip), 0.5.15, 0.5.23 (`layers` ModuleList, legacy renames). The ranges'
edges were then checked by running the last release of every minor version from 0.4.4 to 0.5.23 (and
0.5.0rc2: there is no final 0.5.0) through its own loader over the differential corpus (the
`sglang-sweep` branch): `draft_vocab_size: null` crashes the build until 0.5.1; a too-narrow
down_proj/o_proj is padded silently from 0.5.3 (an error before); `input_norm` (norm_before_fc) is
built from 0.5.17; the MLA class from 0.5.12.
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
    # llama.py's attention: `attention_bias or bias` (every release of the sweep)
    o_proj_bias_from_config=True,
)

PROFILES = [
    Profile(
        first="0.4.4.post2", last="0.4.8.post1",
        layer_prefix="model.midlayer.", single_layer_error=ONE_LAYER,
        legacy_renames=(),
        prefix_rule="always",
        on_unmatched=(WARN, "Parameter {name} not found in params_dict"),
        on_unmatched_stacked=(CRASH, "KeyError: '{name}'"),
        fc_bias="always", fc_aux_from_ids=False, supports_fc_norm=False, supports_input_norm=False,
        null_draft_vocab_error="unsupported operand type(s) for -: 'NoneType' and 'NoneType'", key_order="offset",
        **_COMMON,
    ),
    # 0.4.9 to 0.5.1: ParallelLMHead(config.draft_vocab_size) with a null size fails; the row-parallel
    # loader asserts shapes (no padding yet)
    Profile(
        first="0.4.9", last="0.5.1.post3",
        layer_prefix="model.midlayer.", single_layer_error=ONE_LAYER,
        legacy_renames=(),
        prefix_rule="fallback", on_unmatched=_SILENT, on_unmatched_stacked=_SILENT,
        fc_bias="config", fc_aux_from_ids=False, supports_fc_norm=False, supports_input_norm=False,
        null_draft_vocab_error="unsupported operand type(s) for -: 'NoneType' and 'NoneType'",
        **_COMMON,
    ),
    # 0.5.2 takes lm_head from the target when draft_vocab_size is null (load_lm_head_from_target)
    Profile(
        first="0.5.2", last="0.5.2",
        layer_prefix="model.midlayer.", single_layer_error=ONE_LAYER,
        legacy_renames=(),
        prefix_rule="fallback", on_unmatched=_SILENT, on_unmatched_stacked=_SILENT,
        fc_bias="config", fc_aux_from_ids=False, supports_fc_norm=False, supports_input_norm=False,
        **_COMMON,
    ),
    # 0.5.3: the GPU path of the row-/column-parallel loaders pads or narrows (pad_or_narrow_weight)
    Profile(
        first="0.5.3", last="0.5.11",
        layer_prefix="model.midlayer.", single_layer_error=ONE_LAYER,
        legacy_renames=(),
        prefix_rule="fallback", on_unmatched=_SILENT, on_unmatched_stacked=_SILENT,
        fc_bias="config", fc_aux_from_ids=False, supports_fc_norm=False, supports_input_norm=False,
        resized_silently=_PAD_OR_NARROW,
        **_COMMON,
    ),
    # 0.5.12 (`layers` ModuleList, legacy renames, fc_norm, MLA class); no input_norm before 0.5.17
    Profile(
        first="0.5.12", last="0.5.16",
        layer_prefix="model.layers.{i}.", single_layer_error=None,
        legacy_renames=(("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"),
                        ("aux_norm_mid", "fc_norm.1"), ("aux_norm_high", "fc_norm.2")),
        prefix_rule="fallback", on_unmatched=_SILENT, on_unmatched_stacked=_SILENT,
        fc_bias="config", fc_aux_from_ids=True, supports_fc_norm=True, supports_input_norm=False,
        supports_norm_output=True, resized_silently=_PAD_OR_NARROW,
        # kimi_k25_eagle3.py: from 0.5.12 (0.5.12's wheel; every release's own loader from 0.5.12.post1)
        unmodelled_classes=("Eagle3DeepseekV2ForCausalLM",),
        **_COMMON,
    ),
    Profile(
        first="0.5.17", last="0.5.23",
        layer_prefix="model.layers.{i}.", single_layer_error=None,
        legacy_renames=(("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"),
                        ("aux_norm_mid", "fc_norm.1"), ("aux_norm_high", "fc_norm.2")),
        prefix_rule="fallback", on_unmatched=_SILENT, on_unmatched_stacked=_SILENT,
        fc_bias="config", fc_aux_from_ids=True, supports_fc_norm=True, supports_input_norm=True,
        supports_norm_output=True, resized_silently=_PAD_OR_NARROW,
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
