"""llama.cpp's EAGLE-3 path (docs/engine-facts.md: "Real engines on these CPUs"): its converter (`convert_hf_to_gguf.py --target-model-dir`)
and its loader (`src/models/eagle3.cpp`), as vendored by the llama-cpp-python sdist the kit builds
(0.3.36: llama.cpp commit 0c1e570). The release is the sdist's version.

Read from that source and proven with the converter and llama-server themselves (tests/test_llamacpp.py):
- names: `layers.0.`, `midlayer.` and `model.layers.0.` all convert (`model.fc`, `model.d2t` do not), then the Llama tensor map gives
  GGUF names (blk.0.attn_q, ...; q/k/v and gate/up stay separate); `t2d` is dropped by design; `d2t`
  becomes absolute target ids;
- a key the converter cannot map stops it ("Can not map tensor"); `fc.bias`, a name GGUF knows, converts,
  then the load fails ("wrong number of tensors"); a decoder-layer tensor that is missing (hidden_norm
  included) converts, then the load fails ("tensor ... not found"); a missing embedding or head is the
  target's;
- a config is an EAGLE-3 draft only with `draft_vocab_size` and one decoder layer;
- aux layer ids: the top-level list only, as-is (the input of target layer k); eagle_config's are
  ignored, silently, and the defaults [2, N//2, N-3] used; fc always takes three;
- norm_before_residual and norm_before_fc are computed, each read from the config's top level only (a
  norm_before_fc inside eagle_config is off: its input_norm converts, then the load fails, "wrong number of
  tensors"); fc_norm stops the converter, norm_output is ignored (the pre-norm state is fed back), q/k norms
  and multi-layer drafts are not computed (docs/engine-facts.md: "EAGLE 3.1");
- draft chain positions as vLLM's; an accepted EOS draft ends the step as the target's own token (as
  an accepted draft when it is the step's last); a step
  drafts no more than the budget has room for (tools/server/server-context.cpp `get_n_draft_max`).
"""

from ..auxids import TOP_LEVEL
from .mapper import PREFIX, SUBSTR, WeightsMapper
from .profile import CRASH, AuxCapture, Build, ConfigReading, KeyResolution, Profile, ServedDraft, Unwritten

# HF names to GGUF names, in order (the converter's midlayer/layers.0 rename, then its Llama tensor map)
_P, _S = PREFIX, SUBSTR
_TO_GGUF = WeightsMapper("HF names -> GGUF names", (
    # the tensor map knows model.layers/embed_tokens/norm/lm_head with or without `model.`; the EAGLE-3
    # tensors (fc, d2t, input_norm) only by their bare names
    (_P, "model.layers.", "layers."), (_P, "model.embed_tokens.", "embed_tokens."), (_P, "model.norm.", "norm."),
    (_P, "model.lm_head.", "lm_head."), (_P, "midlayer.", "layers.0."), (_P, "layers.", "blk."),
    (_S, "self_attn.q_proj", "attn_q"), (_S, "self_attn.k_proj", "attn_k"), (_S, "self_attn.v_proj", "attn_v"),
    (_S, "self_attn.o_proj", "attn_output"), (_S, "mlp.gate_proj", "ffn_gate"), (_S, "mlp.up_proj", "ffn_up"),
    (_S, "mlp.down_proj", "ffn_down"), (_S, "post_attention_layernorm", "ffn_norm"),
    (_S, "input_layernorm", "attn_norm"), (_S, "hidden_norm", "attn_norm_2"), (_P, "embed_tokens.", "token_embd."),
    (_P, "norm.", "output_norm."), (_P, "lm_head.", "output."), (_P, "input_norm.", "enc.output_norm."),
    (_S, "t2d", None),  # dropped by design
))
_UNMAPPED = (CRASH, "convert_hf_to_gguf.py cannot map {key!r} (\"Can not map tensor\"), or, for a name GGUF knows "
                    "such as fc.bias, llama-server's load fails (\"wrong number of tensors\")")

_NOT_A_DRAFT = "the converter does not treat it as an EAGLE-3 draft (Can not map tensor 'fc.weight')"

PROFILES = [
    Profile(
        engine_name="llamacpp", first="0.3.36", last="0.3.36",
        config=ConfigReading(
            architectures=("Eagle3DraftModel", "Eagle3Speculator", "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3",
                           "LlamaForCausalLM"),
            config_formats=("flat", "speculators"),
            unknown_architecture="the converter has no EAGLE-3 path for {architectures}",
            needs_draft_vocab_size=f"without draft_vocab_size {_NOT_A_DRAFT}",
            norm_before_fc_from=(TOP_LEVEL,)),  # conversion/llama.py: the raw config.json's own key
        build=Build(
            naming="gguf", layer_prefix="blk.{i}.", single_layer_error=f"num_hidden_layers != 1: {_NOT_A_DRAFT}",
            fc_bias="never", fc_aux_count_from=(), supports_fc_norm=False, supports_input_norm=True,
            supports_norm_before_residual=True, vocab_map_param="d2t", vocab_map_always=True,
            null_target_hidden_crashes=False),  # the target's hidden_size then
        keys=KeyResolution(
            renames=_TO_GGUF, derived_keys=(), renamed_keys=(("d2t", "d2t"),), prefix_rule="asis", stacked=(),
            on_unmatched=_UNMAPPED, on_unmatched_stacked=_UNMAPPED),
        unwritten=Unwritten(
            embed_from_target=False, from_target_when_absent=("embed", "lm_head"), loads_all_or_nothing=True,
            unwritten_fails="llama-server: check_tensor_dims: tensor '{name}' not found"),
        aux=AuxCapture(aux_ids_from=(TOP_LEVEL,), aux_capture_offset=0, aux_capturable=(0, 0), aux_repeats=True),
        serving=ServedDraft(chain_position_offset=0, counts_accepted="before_eos", drafts_within_budget=True),
    ),
]
