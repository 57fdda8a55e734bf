"""The stage records a profile row is made of, one per step of an engine's draft loading, in order:
reading the config (`ConfigReading`), building the parameters (`Build`), resolving each checkpoint key
to a parameter (`KeyResolution`), what stays unwritten (`Unwritten`), which target states feed the draft
(`AuxCapture`) and how the served engine runs it (`ServedDraft`).

Each record is data with the few methods that read it; its interpreter is one function elsewhere:
`draftdoctor.configrules` (the config), `engines.build.parameters`, `engines.keys.resolve_key`,
`engines.build.from_target`, `auxids.captured_layers`, the reference backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import auxids
from .mapper import WeightsMapper

SKIP, WARN, CRASH = "skip", "warn", "crash"

# (checkpoint substring, fused parameter substring, shard id): the same in every engine read.
STACKED = (
    (".q_proj", ".qkv_proj", "q"),
    (".k_proj", ".qkv_proj", "k"),
    (".v_proj", ".qkv_proj", "v"),
    (".gate_proj", ".gate_up_proj", 0),
    (".up_proj", ".gate_up_proj", 1),
)


@dataclass(frozen=True)
class ConfigReading:
    """How the release reads a draft's config.json and chooses the class it builds."""

    architectures: tuple[str, ...]  # config `architectures` the engine maps to its draft class
    config_formats: tuple[str, ...]  # flat and/or speculators
    # how the engine rewrites a draft config's `architectures` before the registry lookup: a name that
    # neither starts nor ends with this gets it prefixed (vLLM for method eagle3: LlamaForCausalLM ->
    # Eagle3LlamaForCausalLM, `transformers_utils/configs/eagle.py`); None: names are looked up as written
    architecture_prefix: str | None = None
    # target-model classes the registry builds when a draft config names them (the EAGLE repo's
    # published drafts say LlamaForCausalLM): not a draft, so the draft's load fails
    plain_architectures: tuple[str, ...] = ()
    # the engine's words for an `architectures` its registry does not have, `{architectures}` and
    # `{first}` formatted
    unknown_architecture: str = "Model architectures {architectures} are not supported"
    # other EAGLE-3 draft classes the release registers whose loading the replay does not model: it
    # says so instead of guessing; the real loader runs them
    unmodelled_classes: tuple[str, ...] = ()
    # a config without `model_type` (speculators' format) is not refused at once: transformers < 5's AutoConfig
    # takes the first model type named in the folder's path ("llama", "qwen3": the pattern fallback), and
    # the build then fails (SGLang 0.4.x to 0.5.9, which pin transformers 4.x): the server does not start
    # either way, the failure and its message depend on the path
    model_type_from_path: bool = False
    # a speculators config's class, by transformer_layer_config's model_type (vLLM's update_eagle3);
    # other model types are refused ("Unsupported model_type ... for Eagle3 speculator")
    speculators_classes: tuple[tuple[str, str], ...] = ()
    # (speculators_model_type, top-level keys its reader requires): the types the release reads as an
    # EAGLE-3 draft (vLLM: `update_eagle3`; P-EAGLE's `update_peagle` builds the same classes and needs
    # `mask_token_id`); another type is refused, in `speculators_refusals`' words where the release has its
    # own, else its reader's "Expected one of: ..."; None: the type is not read
    speculators_types: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    speculators_refusals: tuple[tuple[str, str], ...] = ()  # (speculators_model_type, the engine's message)
    # draft options the engine implements but whose reader of speculators' config does not pass
    # them on: set only at that config's top level, they are off (inside transformer_layer_config,
    # where the reader starts, they reach the model)
    speculators_drops: tuple[str, ...] = ()
    # draft options speculators' config reader sets when the config does not (vLLM's
    # `update_eagle3`: norm_before_residual defaults to true on that path)
    speculators_option_defaults: tuple[tuple[str, bool], ...] = ()
    # (model_type, architecture): flat configs the engine turns into another model before its registry
    # (vLLM: DeepSeek-V3 model types become its MTP module, which is no EAGLE-3 draft)
    rewritten_model_types: tuple[tuple[str, str], ...] = ()
    # the flat config `model_type`s the class is read with; `fix` keeps one of them, else writes the first
    model_types: tuple[str, ...] = ("llama",)
    # (llama.cpp) the converter treats a config as an EAGLE-3 draft only when it has draft_vocab_size:
    # the failure otherwise; None: no such condition
    needs_draft_vocab_size: str | None = None
    # where the engine reads `norm_before_fc` (which builds input_norm), the first place holding it winning:
    # eagle_config's, else the top level's (SGLang from 0.5.17, vLLM); llama.cpp's converter reads the top
    # level only, so a flag nested in eagle_config is off there (docs/engine-facts.md: "EAGLE 3.1")
    norm_before_fc_from: tuple[str, ...] = (auxids.EAGLE_CONFIG, auxids.TOP_LEVEL)
    reads_use_aux_norm: bool = False  # `use_aux_norm` (SGLang's older name) turns fc_norm on too

    def registry_names(self, architectures) -> list[str]:
        """The `architectures` of a flat draft config as the engine looks them up in its registry."""
        p = self.architecture_prefix
        return [a if not p or a.startswith(p) or a.endswith(p) else p + a for a in architectures]

    def builds_a_target_model(self, architectures) -> bool:
        """A flat config's `architectures` name only target-model classes (`plain_architectures`), no
        EAGLE-3 draft class: the registry builds that target model, and its build or load fails."""
        looked_up = set(self.registry_names(architectures))
        return bool(looked_up & set(self.plain_architectures)) and not looked_up & set(self.architectures)


@dataclass(frozen=True)
class Build:
    """What the release builds for a draft: its parameters (`engines.build.parameters`), and the builds
    that fail."""

    layer_prefix: str  # parameter prefix of decoder layer i, `{i}` formatted
    single_layer_error: str | None  # raised at build when num_layers != 1; None: any count
    fc_bias: str  # "config" (config `bias`), "always", "never"
    # where fc's count of aux states comes from, the first place that has one winning (`fc_aux_count`):
    # num_aux_layers, num_aux_hidden_states, eagle_config (its ids), top-level (its ids); none: 3
    fc_aux_count_from: tuple[str, ...]
    supports_fc_norm: bool
    supports_input_norm: bool
    vocab_map_param: str | None  # a parameter for d2t (vLLM) instead of an attribute
    # the draft class this row describes, i.e. its parameter builder: "llama"; "qwen3" (Llama with
    # per-head q/k norms, a qkv bias with attention_bias); "mla" (DeepSeek-V2 multi-head latent attention)
    draft_class: str = "llama"
    # how the engine names parameters: "hf" (model.layers.N.self_attn.qkv_proj, fused as the engines fuse)
    # or "gguf" (llama.cpp: blk.N.attn_q, unfused; its converter renames keys to these names)
    naming: str = "hf"
    # speculators' draft options the engine implements beyond fc_norm / norm_before_fc (above)
    supports_norm_output: bool = False
    supports_norm_before_residual: bool = False
    supports_qk_norm: bool = False  # q_norm/k_norm in the draft's attention (qwen3-style drafts)
    # the vocab-map parameter is built even when the draft's vocabulary is the target's (else only
    # when they differ); unwritten, its zeros map draft id i to target id i
    vocab_map_always: bool = False
    lm_head_when_tied: bool = False  # lm_head is built even with tie_word_embeddings (vLLM)
    # the draft layer's attention is the target Llama's, whose o_proj has a bias when the config says
    # `attention_bias` or `bias` (SGLang: qkv_proj is rebuilt without one, o_proj keeps it)
    o_proj_bias_from_config: bool = False
    # the draft layer's rebuilt qkv_proj has a bias when the config says `attention_bias` (vLLM from 0.16:
    # "Parallel drafting checkpoints may have attention bias"; its Qwen3 class); else it has none
    qkv_bias_from_config: bool = False
    # what the engine raises while building a draft whose config has `draft_vocab_size: null`
    # (lm_head sized from None); None: the head is taken from the target
    null_draft_vocab_error: str | None = None
    null_target_hidden_crashes: bool = True  # a flat config's `target_hidden_size: null` fails the build
    q_lora_required: str | None = None  # MLA: the build error when q_lora_rank is null (None: q_proj is built)
    # what the release raises while building the draft's MLP for a config whose hidden_act is not silu (its
    # Llama, Qwen2 and DeepSeek-V2 MLPs alike), `{act}` formatted; None: not modelled
    activation_error: str | None = None

    def layer_name(self, i: int) -> str:
        return self.layer_prefix.format(i=i)


@dataclass(frozen=True)
class KeyResolution:
    """How the release's `load_weights` places each checkpoint key (`engines.keys.resolve_key`), in the
    order it applies its steps: renames and drops, derived keys, keys dropped unless their module is
    built, renamed keys, the stacked (fused) parameters, cached pairs, then the name as it is."""

    # the loader's own renames, applied first (SGLang's legacy names, llama.cpp's GGUF names), and the keys
    # it skips by design (its drops: t2d)
    renames: WeightsMapper
    derived_keys: tuple[tuple[str, str], ...]  # (substring, attribute): key becomes an attribute
    renamed_keys: tuple[tuple[str, str], ...]  # (substring, parameter): key loads into that parameter
    prefix_rule: str  # "fallback": as-is, then "model."+name | "always": "model."+name except `unprefixed` | "asis"
    # (policy, engine's message) for a key matching no parameter; policy: skip | warn | crash;
    # the message is formatted with the parameter name last looked up
    on_unmatched: tuple[str, str]
    on_unmatched_stacked: tuple[str, str]  # the same for q/k/v/gate/up keys
    # substrings of keys for optional modules the loader drops silently when the config does not
    # build the module (vLLM maps `input_norm.` to nothing unless norm_before_fc)
    dropped_unless_built: tuple[str, ...] = ()
    # (checkpoint substring, fused parameter substring, shard id) renames of load_weights, tried in order
    stacked: tuple[tuple[str, str, object], ...] = STACKED
    # (first, second, fused) substrings of keys the loader caches and concatenates into one parameter
    # only once both have arrived (SGLang's MLA q_a_proj + kv_a_proj_with_mqa): one alone, or a pair
    # whose fused name is no parameter, is dropped silently; different widths fail the concatenation
    paired_keys: tuple[tuple[str, str, str], ...] = ()
    # substrings of names the "always" prefix rule looks up as they are (the head lives outside `model.`)
    unprefixed: tuple[str, ...] = ("lm_head",)
    # key endings that, matching no parameter, are skipped silently whatever `on_unmatched` says
    # (vLLM's AutoWeightsLoader ignores unexpected `.bias` weights)
    unmatched_skipped_suffixes: tuple[str, ...] = ()
    # (outer class, inner model): the modules vLLM's unmatched-key message names
    module_names: tuple[str, str] = ("", "")
    # (parameter suffix, dim, side): weights the loader pads with zeros or cuts to fit along that dim
    # instead of failing; side "either" (SGLang's row- and merged-column-parallel loaders,
    # `pad_or_narrow_weight`) or "larger" (only cut: vLLM's `narrow`, SGLang's MLA projections)
    resized_silently: tuple[tuple[str, int, str], ...] = ()
    # the order the production weights iterator yields a file's tensors in (it decides what was written
    # before a crash): "sorted" by name (safe_open().keys(), SGLang 0.4.9+), or "offset", by data
    # offset (safetensors.torch.load_file, SGLang up to 0.4.8)
    key_order: str = "sorted"

    def lookup_names(self, name: str) -> list[str]:
        """The parameter names `load_weights` tries for a (renamed) key, in order."""
        if self.prefix_rule == "asis":
            return [name]
        if self.prefix_rule == "always":
            return [name] if any(s in name for s in self.unprefixed) else ["model." + name]
        return [name, "model." + name]


@dataclass(frozen=True)
class Unwritten:
    """What becomes of a parameter no key wrote (`engines.build.from_target`, `coverage.settle_unwritten`)."""

    embed_from_target: bool  # the draft's embedding is replaced by the target's at serve time
    # parameter roles the engine takes from the target when the checkpoint has no tensor for them
    # (vLLM's `has_own_embed_tokens` / `has_own_lm_head`), whatever the draft's sizes
    from_target_when_absent: tuple[str, ...] = ()
    # (llama.cpp) the load fails on a parameter no tensor writes instead of leaving it at initial values:
    # its message, `{name}` formatted; None: left at initial values, silently
    unwritten_fails: str | None = None
    # (llama.cpp) a failed load writes nothing: the converter stopped before any file, or the loader
    # refused the file whole; False: what was written before the failure stays written
    loads_all_or_nothing: bool = False


@dataclass(frozen=True)
class AuxCapture:
    """Which target hidden states the engine captures for the draft's fc (`auxids.captured_layers`)."""

    # aux hidden-state layer ids: where the engine reads them (in order) and what it captures:
    # the input of target layer id + offset (SGLang adds 1; vLLM and speculators use ids as-is)
    aux_ids_from: tuple[str, ...] = (auxids.EAGLE_CONFIG,)
    aux_capture_offset: int = 1
    # (first, last - N): the target layers whose input the engine can capture, for an N-layer target.
    # SGLang captures at the start of decoder layers 1..N-1 (at layer 0 there is no residual yet: its
    # `hidden_states + residual` fails); vLLM also at 0 (the embedding) and N (the last layer's output)
    aux_capturable: tuple[int, int] = (1, -1)
    # a layer named twice is captured twice (llama.cpp: one state per id); SGLang and vLLM capture each
    # layer once, so [2, 3, 3] gives fc two states where it takes three
    aux_repeats: bool = False

    def captured_layers(self, config: dict, n_layers: int) -> tuple[int, ...]:
        """Target layers whose input the engine captures as aux states for this draft config."""
        return auxids.captured_layers(config, n_layers, self.aux_ids_from, self.aux_capture_offset)

    def capturable(self, n_layers: int | None) -> tuple[int, int | None]:
        """(first, last) target layers whose input the engine can capture (last None: no target known)."""
        first, from_end = self.aux_capturable
        return first, (n_layers + from_end if n_layers else None)


@dataclass(frozen=True)
class ServedDraft:
    """How the served engine runs the draft (the reference backend emulates it; proven against real vLLM in
    tests/test_vllm_agreement.py)."""

    # draft chain step i (the second draft token onwards) runs at rope position seq_len + offset + i,
    # seq_len being the committed tokens. SGLang: `positions = seq_lens`, then `positions.add_(1)` before
    # every step (eagle_worker.py, 0.5.10-0.5.23) -> 1; vLLM: the last sampled position + 1 per step
    # (llm_base_proposer.py, 0.32.0) -> 0, the spacing speculators trains with
    chain_position_offset: int = 1
    # a step drafts at most the tokens left in the request's budget minus one, none when that is 0
    # (llama.cpp's server, `get_n_draft_max`: min(n_max, n_remaining - 1)); SGLang and vLLM draft
    # num_steps every step and cut what the budget does not take
    drafts_within_budget: bool = False
    # which accepted drafts the engine's counters count (the reference engine counts the same way):
    # "before_stop" every draft the target accepted, also past a stop (vLLM, SGLang's meta_info);
    # "before_eos": those before an accepted EOS, which ends the step as the target's own token unless it
    # was the step's last draft (llama.cpp's common_sampler_sample_and_accept_n)
    counts_accepted: str = "before_stop"


# the stages of a row, by its attribute name, in loading order
STAGES = {"config": ConfigReading, "build": Build, "keys": KeyResolution, "unwritten": Unwritten,
          "aux": AuxCapture, "serving": ServedDraft}
