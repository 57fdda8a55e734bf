"""SGLang's `LlamaForCausalLMEagle3`, one profile per release range (docs/engine-facts.md: "SGLang's EAGLE-3 loader"), and what its
server spells and reports per release range (`SERVING`, docs/engine-facts.md: "Acceptance", "Launching SGLang").

Read from the released wheels: 0.4.8 (`load_weights` delegates to the Llama loader), 0.5.10 and
0.5.11 (`midlayer`, silent skip), 0.5.15, 0.5.23 (`layers` ModuleList, legacy renames). The ranges'
edges were then checked by running the last release of every minor version from 0.4.4 to 0.5.23 (and
0.5.0rc2: there is no final 0.5.0) through its own loader over the differential corpus (the release
sweep, docs/releases/sglang.md): `draft_vocab_size: null` crashes the build until 0.5.1; a too-narrow
down_proj/o_proj is padded silently from 0.5.3 (an error before); `input_norm` (norm_before_fc) is
built from 0.5.17; the MLA class from 0.5.12; up to 0.5.9 (transformers 4.x) a speculators config is
read as whatever model type its folder's path names, and the build fails later instead.
EAGLE 3.1 (docs/engine-facts.md: "EAGLE 3.1"): up to 0.5.11 no release builds fc_norm or honours
norm_output, and the loader skips the norms' keys without a word; from 0.5.12 `fc_norm` (or the older
`use_aux_norm`) builds one norm per aux state, `aux_norm_low/mid/high` are renamed to `fc_norm.0/1/2`,
and `norm_output` feeds the post-norm state back; input_norm from 0.5.17.
"""

from .profile import CRASH, SKIP, STACKED, WARN, Profile, ServingFacts, WeightsMapper

ONE_LAYER = "EAGLE3 currently only supports 1 layer"
_SILENT = (SKIP, "")
# read in 0.5.10 (layers/linear.py) and seen on 0.5.10/0.5.23's real loaders for down_proj
_PAD_OR_NARROW = ((".o_proj.weight", 1, "either"), (".down_proj.weight", 1, "either"),
                  (".gate_up_proj.weight", 0, "either"))
# model_loader/utils.py resolve_transformers_arch (0.5.10, 0.5.11, 0.5.23's own loaders)
_NO_MODULE = ("Cannot find model module. '{first}' is not a registered model in the Transformers library (only "
              "relevant if the model is meant to be in Transformers) and 'AutoModel' is not present in the model "
              "config's 'auto_map' (relevant if the model is custom)")

_COMMON = dict(
    engine_name="sglang",
    architectures=("LlamaForCausalLMEagle3",),
    derived_keys=(("d2t", "hot_token_id"),),
    renamed_keys=(),
    vocab_map_param=None,
    embed_from_target=True,
    config_formats=("flat",),
    # the registry builds the target class for them; the load then fails (Llama: at lm_head; Qwen3: at k_proj;
    # DeepSeek-V2: while building) (0.5.10, 0.5.11 and 0.5.23's own loaders, tests/test_differential.py)
    plain_architectures=("LlamaForCausalLM", "Qwen3ForCausalLM", "DeepseekV2ForCausalLM"),
    reads_use_aux_norm=True,  # from 0.5.12, where fc_norm is built at all (llama_eagle3.py, 0.5.12.post1 :166-178)
    unknown_architecture=_NO_MODULE,
    # llama.py's attention: `attention_bias or bias` (every release of the sweep)
    o_proj_bias_from_config=True,
)

# The rope position of draft chain step j >= 1 (P = seq_lens, the committed length): up to 0.5.11 P + j,
# eagle_worker.py and eagle_worker_v2.py call `forward_batch.positions.add_(1)` *before* each draft forward
# (0.5.10: eagle_worker.py line ~675); from 0.5.12 P + j - 1, as vLLM and the trainers (SGLang PR #25015,
# "Fix Eagle draft decode positions", moved the increment after the forward; 0.5.23's eagle_worker_v2.py
# increments after the argmax). The load rows split at 0.5.12 too, so the fact rides on them.
_CHAIN_BEFORE_FORWARD, _CHAIN_AFTER_FORWARD = dict(chain_position_offset=1), dict(chain_position_offset=0)
# no fc_norm, input_norm or norm_output: their keys match no parameter and are skipped like any other
# (docs/engine-facts.md: "EAGLE 3.1")
_T2D = ("t2d",)  # skipped by design
_MIDLAYER = dict(layer_prefix="model.midlayer.", single_layer_error=ONE_LAYER, renames=WeightsMapper.of(drop=_T2D),
                 supports_fc_norm=False, supports_input_norm=False, fc_aux_count_from=(), **_CHAIN_BEFORE_FORWARD)
_SILENT_FALLBACK = dict(prefix_rule="fallback", on_unmatched=_SILENT, on_unmatched_stacked=_SILENT, fc_bias="config")
_TRANSFORMERS_4 = dict(model_type_from_path=True)  # the releases pinning transformers 4.x (up to 0.5.9)
# fc_norm (one RMSNorm of the target's width per aux state) and norm_output from 0.5.12; a norm's key without
# its flag is skipped silently, a built norm without its key stays at ones (docs/engine-facts.md: "EAGLE 3.1")
_LAYERS = dict(layer_prefix="model.layers.{i}.", single_layer_error=None,
               renames=WeightsMapper.of("legacy names", substr=(
                   ("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"), ("aux_norm_mid", "fc_norm.1"),
                   ("aux_norm_high", "fc_norm.2")), drop=_T2D),
               fc_aux_count_from=("num_aux_hidden_states", "eagle_config"), supports_fc_norm=True,
               supports_norm_output=True, resized_silently=_PAD_OR_NARROW, **_SILENT_FALLBACK, **_CHAIN_AFTER_FORWARD)
_NULL_DRAFT_VOCAB = "unsupported operand type(s) for -: 'NoneType' and 'NoneType'"

PROFILES = [
    Profile(
        first="0.4.4.post2", last="0.4.8.post1",
        prefix_rule="always",
        on_unmatched=(WARN, "Parameter {name} not found in params_dict"),
        on_unmatched_stacked=(CRASH, "KeyError: '{name}'"),
        fc_bias="always", null_draft_vocab_error=_NULL_DRAFT_VOCAB, key_order="offset",
        **_MIDLAYER, **_TRANSFORMERS_4, **_COMMON,
    ),
    # 0.4.9 to 0.5.1: ParallelLMHead(config.draft_vocab_size) with a null size fails; the row-parallel
    # loader asserts shapes (no padding yet)
    Profile(first="0.4.9", last="0.5.1.post3", null_draft_vocab_error=_NULL_DRAFT_VOCAB,
            **_MIDLAYER, **_SILENT_FALLBACK, **_TRANSFORMERS_4, **_COMMON),
    # 0.5.2 takes lm_head from the target when draft_vocab_size is null (load_lm_head_from_target)
    Profile(first="0.5.2", last="0.5.2", **_MIDLAYER, **_SILENT_FALLBACK, **_TRANSFORMERS_4, **_COMMON),
    # 0.5.3: the GPU path of the row-/column-parallel loaders pads or narrows (pad_or_narrow_weight)
    Profile(first="0.5.3", last="0.5.9", resized_silently=_PAD_OR_NARROW, **_MIDLAYER, **_SILENT_FALLBACK,
            **_TRANSFORMERS_4, **_COMMON),
    # 0.5.10 pins transformers 5, whose AutoConfig refuses a config without model_type whatever the path
    Profile(first="0.5.10", last="0.5.11", resized_silently=_PAD_OR_NARROW, **_MIDLAYER, **_SILENT_FALLBACK, **_COMMON),
    # 0.5.12: the `layers` ModuleList, legacy renames, fc_norm, the MLA class; no input_norm before 0.5.17
    Profile(first="0.5.12", last="0.5.16", supports_input_norm=False, **_LAYERS, **_COMMON),
    Profile(first="0.5.17", last="0.5.23", supports_input_norm=True, **_LAYERS, **_COMMON),
    # the MLA draft for Kimi-K2.5/K2.6 and DeepSeek targets (kimi_k25_eagle3.py, from 0.5.12; its rules read
    # in 0.5.23, and each release's own loader agrees case by case: docs/releases/sglang.md), fc_norm from 0.5.13
    *(Profile(
        first=first, last=last, draft_class="mla",
        layer_prefix="model.midlayer.", single_layer_error=ONE_LAYER,
        # re.sub(r"^layers\.0\.", "midlayer.", name): anchored
        renames=WeightsMapper.of("layers.0. -> midlayer.", prefix=(("layers.0.", "midlayer."),), drop=_T2D),
        prefix_rule="always",
        on_unmatched=(WARN, "Eagle3 MLA: skipping unexpected weight {key}"),
        on_unmatched_stacked=(WARN, "Eagle3 MLA: skipping unexpected weight {key}"),
        fc_bias="config", fc_aux_count_from=("eagle_config", "top-level"), supports_fc_norm=fc_norm,
        supports_input_norm=False, supports_norm_output=True,
        resized_silently=_PAD_OR_NARROW + ((".kv_b_proj.weight", 0, "larger"), (".q_b_proj.weight", 0, "larger")),
        stacked=STACKED[3:],  # gate/up only: no q/k/v
        paired_keys=(("q_a_proj", "kv_a_proj_with_mqa", "fused_qkv_a_proj_with_mqa"),),
        null_target_hidden_crashes=False,  # target_hidden_size or hidden_size
        q_lora_required="Eagle3 MLA layer requires q_lora_rank in the draft config",
        model_types=("deepseek_v2", "deepseek_v3", "kimi_k2"),  # kimi_k2: a DeepseekV3Config alias "for kimi_k25_eagle3"
        **_CHAIN_AFTER_FORWARD, **(_COMMON | {"architectures": ("Eagle3DeepseekV2ForCausalLM",)}),
    ) for first, last, fc_norm in (("0.5.12", "0.5.12.post1", False), ("0.5.13", "0.5.23", True))),
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
    # scheduler_metrics_mixin.py still writes "Decode batch. #running-req" up to 0.5.3.post3; 0.5.4 adds the
    # optional forward counter and the comma (read from each release's source: tests/test_logs.py)
    ServingFacts("sglang", "0.5.1", "0.5.3.post3", spec_count_fields=None, accept_rate_formula="none",
                 decode_line_head="Decode batch.", **_OLD_GRAPH_FLAGS),
    # 0.5.4.post3's scheduler_metrics_mixin.py logs accepted tokens / (forwards x (num_steps + 1)): L / k
    ServingFacts("sglang", "0.5.4", "0.5.4.post3", spec_count_fields=None, accept_rate_formula="bonus",
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
