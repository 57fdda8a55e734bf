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
Each row names its record for each loading stage (`engines.stages`): the records are written once, in
release order, each the one before with what changed, so a row shows which stage its releases changed.
"""

from dataclasses import replace

from ..auxids import EAGLE_CONFIG
from .profile import (CRASH, SKIP, STACKED, WARN, AuxCapture, Build, ConfigReading, KeyResolution, Profile, ServedDraft,
                      ServingFacts, Unwritten, WeightsMapper)

ONE_LAYER = "EAGLE3 currently only supports 1 layer"
_SILENT = (SKIP, "")
# read in 0.5.10 (layers/linear.py) and seen on 0.5.10/0.5.23's real loaders for down_proj
_PAD_OR_NARROW = ((".o_proj.weight", 1, "either"), (".down_proj.weight", 1, "either"),
                  (".gate_up_proj.weight", 0, "either"))
# model_loader/utils.py resolve_transformers_arch (0.5.10, 0.5.11, 0.5.23's own loaders)
_NO_MODULE = ("Cannot find model module. '{first}' is not a registered model in the Transformers library (only "
              "relevant if the model is meant to be in Transformers) and 'AutoModel' is not present in the model "
              "config's 'auto_map' (relevant if the model is custom)")
_NULL_DRAFT_VOCAB = "unsupported operand type(s) for -: 'NoneType' and 'NoneType'"
_T2D = ("t2d",)  # skipped by design

# Each stage's records, in release order; a row names the record of each stage its releases use.

# Reading the config. The releases pinning transformers 4.x (up to 0.5.9) read a config without model_type
# as the model type its folder's path names; from 0.5.10 (transformers 5) AutoConfig refuses it, whatever the path.
_TRANSFORMERS_4 = ConfigReading(
    architectures=("LlamaForCausalLMEagle3",), config_formats=("flat",), model_type_from_path=True,
    # the registry builds the target class for them; the load then fails (Llama: at lm_head; Qwen3: at k_proj;
    # DeepSeek-V2: while building) (0.5.10, 0.5.11 and 0.5.23's own loaders, tests/test_differential.py)
    plain_architectures=("LlamaForCausalLM", "Qwen3ForCausalLM", "DeepseekV2ForCausalLM"),
    reads_use_aux_norm=True,  # from 0.5.12, where fc_norm is built at all (llama_eagle3.py, 0.5.12.post1 :166-178)
    unknown_architecture=_NO_MODULE)
_TRANSFORMERS_5 = replace(_TRANSFORMERS_4, model_type_from_path=False)

# llama.py's and deepseek_v2.py's MLPs refuse any hidden_act but silu, in every release read (docs/engine-facts.md:
# "SGLang's EAGLE-3 loader, release by release")
UNSUPPORTED_ACTIVATION = "Unsupported activation: {act}. Only silu is supported for now."
# Building the parameters. Up to 0.5.11: one decoder layer, `midlayer`; no fc_norm, input_norm or norm_output,
# whose keys match no parameter and are skipped like any other (docs/engine-facts.md: "EAGLE 3.1"); llama.py's
# attention: o_proj's bias from `attention_bias or bias` (every release of the sweep). Up to 0.5.1
# ParallelLMHead(config.draft_vocab_size) fails with a null size; 0.5.2 takes lm_head from the target then
# (load_lm_head_from_target).
_MIDLAYER = Build(layer_prefix="model.midlayer.", single_layer_error=ONE_LAYER, fc_bias="config", fc_aux_count_from=(),
                  supports_fc_norm=False, supports_input_norm=False, vocab_map_param=None, o_proj_bias_from_config=True,
                  activation_error=UNSUPPORTED_ACTIVATION)
_MIDLAYER_NULL_VOCAB_FAILS = replace(_MIDLAYER, null_draft_vocab_error=_NULL_DRAFT_VOCAB)
# 0.5.12: the `layers` ModuleList, fc_norm (one RMSNorm of the target's width per aux state) and norm_output; a
# norm's key without its flag is skipped silently, a built norm without its key stays at ones
# (docs/engine-facts.md: "EAGLE 3.1"); input_norm (norm_before_fc) from 0.5.17
_LAYERS = replace(_MIDLAYER, layer_prefix="model.layers.{i}.", single_layer_error=None,
                  fc_aux_count_from=("num_aux_hidden_states", "eagle_config"), supports_fc_norm=True,
                  supports_norm_output=True)
_LAYERS_INPUT_NORM = replace(_LAYERS, supports_input_norm=True)

# Resolving keys. Up to 0.4.8 `load_weights` delegates to the Llama loader: `model.` before every name but the
# head, an unknown name skipped with a warning, an unknown q/k/v/gate/up a KeyError, keys in data-offset order
# (safetensors.torch.load_file). From 0.4.9 an unknown name is tried as it is, then with `model.`, and skipped
# silently (keys in name order: safe_open().keys()); the row-parallel loader asserts shapes (no padding yet)
_LLAMA_LOADER = KeyResolution(
    renames=WeightsMapper.of(drop=_T2D), derived_keys=(("d2t", "hot_token_id"),), renamed_keys=(), prefix_rule="always",
    on_unmatched=(WARN, "Parameter {name} not found in params_dict"),
    on_unmatched_stacked=(CRASH, "KeyError: '{name}'"),
    key_order="offset")
_SILENT_FALLBACK = replace(_LLAMA_LOADER, prefix_rule="fallback", on_unmatched=_SILENT, on_unmatched_stacked=_SILENT,
                           key_order="sorted")
# 0.5.3: the GPU path of the row-/column-parallel loaders pads or narrows (pad_or_narrow_weight)
_PADDED = replace(_SILENT_FALLBACK, resized_silently=_PAD_OR_NARROW)
# 0.5.12: the legacy names
_LEGACY_NAMES = replace(_PADDED, renames=WeightsMapper.of("legacy names", substr=(
    ("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"), ("aux_norm_mid", "fc_norm.1"),
    ("aux_norm_high", "fc_norm.2")), drop=_T2D))

# What stays unwritten, and the aux capture: the same in every release
_EMBED_FROM_TARGET = Unwritten(embed_from_target=True)
_AUX = AuxCapture(aux_ids_from=(EAGLE_CONFIG,), aux_capture_offset=1, aux_capturable=(1, -1))

# Serving: the rope position of draft chain step j >= 1 (P = seq_lens, the committed length): up to 0.5.11 P + j,
# eagle_worker.py and eagle_worker_v2.py call `forward_batch.positions.add_(1)` *before* each draft forward
# (0.5.10: eagle_worker.py line ~675); from 0.5.12 P + j - 1, as vLLM and the trainers (SGLang PR #25015,
# "Fix Eagle draft decode positions", moved the increment after the forward; 0.5.23's eagle_worker_v2.py
# increments after the argmax). The load rows split at 0.5.12 too, so the fact rides on them.
_CHAIN_BEFORE_FORWARD, _CHAIN_AFTER_FORWARD = ServedDraft(chain_position_offset=1), ServedDraft(chain_position_offset=0)

# The MLA draft for Kimi-K2.5/K2.6 and DeepSeek targets (kimi_k25_eagle3.py, from 0.5.12; its rules read in 0.5.23,
# and each release's own loader agrees case by case: docs/releases/sglang.md), fc_norm from 0.5.13
_MLA_CONFIG = replace(_TRANSFORMERS_5, architectures=("Eagle3DeepseekV2ForCausalLM",),
                      # kimi_k2: a DeepseekV3Config alias "for kimi_k25_eagle3"
                      model_types=("deepseek_v2", "deepseek_v3", "kimi_k2"))
_MLA_BUILD = replace(_MIDLAYER, draft_class="mla", fc_aux_count_from=("eagle_config", "top-level"),
                     supports_norm_output=True, null_target_hidden_crashes=False,  # target_hidden_size or hidden_size
                     q_lora_required="Eagle3 MLA layer requires q_lora_rank in the draft config")
_MLA_KEYS = replace(
    _PADDED,
    # re.sub(r"^layers\.0\.", "midlayer.", name): anchored
    renames=WeightsMapper.of("layers.0. -> midlayer.", prefix=(("layers.0.", "midlayer."),), drop=_T2D),
    prefix_rule="always",
    on_unmatched=(WARN, "Eagle3 MLA: skipping unexpected weight {key}"),
    on_unmatched_stacked=(WARN, "Eagle3 MLA: skipping unexpected weight {key}"),
    resized_silently=_PAD_OR_NARROW + ((".kv_b_proj.weight", 0, "larger"), (".q_b_proj.weight", 0, "larger")),
    stacked=STACKED[3:],  # gate/up only: no q/k/v
    paired_keys=(("q_a_proj", "kv_a_proj_with_mqa", "fused_qkv_a_proj_with_mqa"),))

PROFILES = [
    Profile(engine_name="sglang", first="0.4.4.post2", last="0.4.8.post1", config=_TRANSFORMERS_4,
            build=replace(_MIDLAYER_NULL_VOCAB_FAILS, fc_bias="always"), keys=_LLAMA_LOADER,
            unwritten=_EMBED_FROM_TARGET, aux=_AUX, serving=_CHAIN_BEFORE_FORWARD),
    Profile(engine_name="sglang", first="0.4.9", last="0.5.1.post3", config=_TRANSFORMERS_4,
            build=_MIDLAYER_NULL_VOCAB_FAILS, keys=_SILENT_FALLBACK,
            unwritten=_EMBED_FROM_TARGET, aux=_AUX, serving=_CHAIN_BEFORE_FORWARD),
    Profile(engine_name="sglang", first="0.5.2", last="0.5.2", config=_TRANSFORMERS_4,
            build=_MIDLAYER, keys=_SILENT_FALLBACK,
            unwritten=_EMBED_FROM_TARGET, aux=_AUX, serving=_CHAIN_BEFORE_FORWARD),
    Profile(engine_name="sglang", first="0.5.3", last="0.5.9", config=_TRANSFORMERS_4,
            build=_MIDLAYER, keys=_PADDED,
            unwritten=_EMBED_FROM_TARGET, aux=_AUX, serving=_CHAIN_BEFORE_FORWARD),
    Profile(engine_name="sglang", first="0.5.10", last="0.5.11", config=_TRANSFORMERS_5,
            build=_MIDLAYER, keys=_PADDED,
            unwritten=_EMBED_FROM_TARGET, aux=_AUX, serving=_CHAIN_BEFORE_FORWARD),
    Profile(engine_name="sglang", first="0.5.12", last="0.5.16", config=_TRANSFORMERS_5,
            build=_LAYERS, keys=_LEGACY_NAMES,
            unwritten=_EMBED_FROM_TARGET, aux=_AUX, serving=_CHAIN_AFTER_FORWARD),
    Profile(engine_name="sglang", first="0.5.17", last="0.5.23", config=_TRANSFORMERS_5,
            build=_LAYERS_INPUT_NORM, keys=_LEGACY_NAMES,
            unwritten=_EMBED_FROM_TARGET, aux=_AUX, serving=_CHAIN_AFTER_FORWARD),
    Profile(engine_name="sglang", first="0.5.12", last="0.5.12.post1", config=_MLA_CONFIG,
            build=_MLA_BUILD, keys=_MLA_KEYS,
            unwritten=_EMBED_FROM_TARGET, aux=_AUX, serving=_CHAIN_AFTER_FORWARD),
    Profile(engine_name="sglang", first="0.5.13", last="0.5.23", config=_MLA_CONFIG,
            build=replace(_MLA_BUILD, supports_fc_norm=True), keys=_MLA_KEYS,
            unwritten=_EMBED_FROM_TARGET, aux=_AUX, serving=_CHAIN_AFTER_FORWARD),
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
