"""Reference engine: exactness against greedy decoding, transformers and speculators; acceptance.

Portability (these tests run on Intel AVX-512 and AMD AVX2 machines, whose float32 kernels round
differently): every comparison of two implementations runs both in float64 (`assert_same_computation`),
token-for-token equalities run in float64 too, and the float32 numbers users see (the demo's
acceptance) are asserted to be exactly the float64 ones, so no threshold rests on one CPU's rounding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from draftdoctor.reference import acceptance  # noqa: E402
from draftdoctor.eagle.draft import (  # noqa: E402
    MIDLAYER, build_draft, initial_value,
)
from draftdoctor.eagle.engine import (  # noqa: E402
    CaptureMismatch, greedy_generate, speculative_generate,
)
from draftdoctor.engines import resolve_engine  # noqa: E402
from draftdoctor.eagle.llama import KVCache, TargetModel, load_safetensors_dir  # noqa: E402
from draftdoctor.diagnose import check  # noqa: E402
from draftdoctor.eagle.loading import LoadRefused, place  # noqa: E402


def load_for_engine(draft, engine, target, loader="replay"):
    """The draft `engine` serves from `draft`, as `check` diagnoses it and the reference places it."""
    return place(check(draft, engine, loader=loader), target)


DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
F64 = torch.float64
sglang_capture_layers = resolve_engine("sglang==0.5.10").profile.aux.captured_layers


def assert_same_computation(actual, expected):
    """Two float64 implementations of one computation agree far inside 1e-9 of the values' scale:
    float64 rounding differs by about 1e-13 of it (sums of at most a few hundred products, eps
    2.2e-16), and where both round through float32 (RMSNorm, the rotary tables, as transformers
    and SGLang do) they do so at inputs equal to about 1e-16, so identically. A computation that
    differs (a misplaced norm, a wrong position) shows at 1e-3 and more. The float32 bound this
    replaces (1e-5) held on one CPU's kernels and not on another's."""
    assert actual.dtype == expected.dtype == F64
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-9 * scale)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add overhead
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    return TargetModel.from_dir(DEMO / "target")


@pytest.fixture(scope="module")
def target64():
    return TargetModel.from_dir(DEMO / "target", F64)


@pytest.fixture(scope="module")
def raw_draft():
    return load_safetensors_dir(DEMO / "draft-speculators")


@pytest.fixture(scope="module")
def story_config():
    """The flat config the story served (SGLang's, aux ids converted)."""
    return json.loads((DEMO / "draft-story" / "config.json").read_text())


@pytest.fixture(scope="module")
def fixed_draft(tmp_path_factory):
    """draft-story after `draftdoctor fix --engine sglang==0.5.10` (midlayer names)."""
    from draftdoctor.fix import apply_fix, plan_fix

    out = tmp_path_factory.mktemp("fixed") / "draft"
    return apply_fix(plan_fix(DEMO / "draft-story", "sglang==0.5.10"), out).dst


@pytest.fixture(scope="module")
def prompts():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(DEMO / "target" / "tokenizer.json"))
    lines = (DEMO / "prompts.jsonl").read_text().splitlines()
    return [tok.encode(json.loads(line)["prompt"]).ids for line in lines]


def test_target_matches_transformers(target64, prompts):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(str(DEMO / "target")).eval().to(F64)
    ids = torch.tensor(prompts[0])
    with torch.no_grad():
        ref = hf(ids[None], output_hidden_states=True)
    logits, aux = target64.forward(ids, target64.new_cache(), capture=(1, 3, 4))
    assert_same_computation(logits, ref.logits[0])
    for layer, state in zip((1, 3, 4), aux):
        assert_same_computation(state, ref.hidden_states[layer][0])
    # incremental decoding with the KV cache gives the same logits as one pass
    cache = target64.new_cache()
    first, _ = target64.forward(ids[:-3], cache)
    rest, _ = target64.forward(ids[-3:], cache)
    assert_same_computation(torch.cat([first, rest]), logits)


def test_demo_greedy_choices_do_not_depend_on_rounding(target, target64, prompts):
    """The demo target's greedy choices, which every equality and acceptance test rests on, are the
    same in float32 as in float64, and at every choice over the demo prompts the top-1/top-2 gap is
    over 10x float32's largest logit deviation from float64 there. Turning a choice takes an error
    of half the gap on one of two logits, so a CPU whose float32 kernels round otherwise (same eps,
    another order of sums) would need errors 5x this machine's. Measured on Intel AVX-512: the
    narrowest choice has gap 5.5e-5 against a deviation of 2.3e-6 (24x)."""
    for ids in prompts:
        out = greedy_generate(target64, ids, 48)
        assert greedy_generate(target, ids, 48) == out
        seq = torch.tensor(ids + out[:-1])
        logits64, _ = target64.forward(seq, target64.new_cache())
        logits32, _ = target.forward(seq, target.new_cache())
        choices64, choices32 = logits64[len(ids) - 1:], logits32[len(ids) - 1:].to(F64)
        top2 = choices64.topk(2, dim=-1).values
        gap = top2[:, 0] - top2[:, 1]
        deviation = (choices32 - choices64).abs().amax(dim=-1)
        assert (gap > 10 * deviation).all(), (gap / deviation).min()


@pytest.mark.parametrize("draft_kind", ["trained", "random"])
@pytest.mark.parametrize("num_steps,chain_offset", [(1, 1), (4, 1), (4, 0)])  # SGLang's chain positions, vLLM's
def test_speculative_output_equals_greedy(target64, story_config, fixed_draft, prompts, draft_kind, num_steps,
                                          chain_offset):
    """Exact in float64: verification batches tokens that greedy decoding runs one at a time, and
    only float64 makes both round alike on every CPU (the float32 demo is covered by the test above)."""
    if draft_kind == "trained":
        draft = load_for_engine(fixed_draft, "sglang==0.5.10", target64).draft
    else:  # every parameter at its initial value, no d2t
        draft = build_draft(story_config, {}, set(), dtype=F64)
    capture = sglang_capture_layers(story_config, target64.n_layers)
    for ids in prompts[:6]:
        want = greedy_generate(target64, ids, 40)
        got = speculative_generate(target64, draft, capture, ids, 40, num_steps, chain_offset=chain_offset)
        assert got.output_ids == want
        assert got.completion_tokens == 40
        assert got.spec_verify_ct >= 1


def test_budget_cuts_accepted_tokens(target64, fixed_draft, prompts):
    loaded = load_for_engine(fixed_draft, "sglang==0.5.10", target64)
    draft, capture = loaded.draft, loaded.capture
    for budget in (1, 2, 5, 7):
        r = speculative_generate(target64, draft, capture, prompts[1], budget, 4, chain_offset=1)
        assert r.output_ids == greedy_generate(target64, prompts[1], budget)
        assert r.completion_tokens == budget
        # after the prefill token each verify step adds its accepted drafts plus a bonus token,
        # except that the last one may be cut before its bonus
        bonus = r.completion_tokens - 1 - r.accepted_drafts
        assert bonus in (r.spec_verify_ct - 1, r.spec_verify_ct)
        # counted before the cut (vLLM's counters), the last step keeps every draft the target accepted
        assert all(b >= a for a, b in zip(r.accepted_per_position, r.accepted_before_stop))
        cut = r.accepted_drafts_before_stop - r.accepted_drafts
        assert 0 <= cut < 4 and (cut == 0 or bonus == r.spec_verify_ct - 1)
    assert speculative_generate(target64, draft, capture, prompts[1], 1, 4, chain_offset=1).spec_verify_ct == 0


def test_drafts_within_budget_as_llama_cpp(target64, fixed_draft, prompts):
    """llama.cpp drafts at most the budget left minus one (`ServedDraft.drafts_within_budget`): the same tokens,
    never a draft the budget cannot take, and no verify step when there is no room for one."""
    loaded = load_for_engine(fixed_draft, "sglang==0.5.10", target64)
    for budget in (1, 2, 3, 6, 9, 20):
        r = speculative_generate(target64, loaded.draft, loaded.capture, prompts[1], budget, 4, chain_offset=0,
                                 drafts_within_budget=True)
        assert r.output_ids == greedy_generate(target64, prompts[1], budget)
        assert r.accepted_before_stop == r.accepted_per_position  # nothing drafted past the budget to cut
        assert r.completion_tokens - 1 - r.accepted_drafts >= r.spec_verify_ct  # every verify step keeps its bonus
    assert speculative_generate(target64, loaded.draft, loaded.capture, prompts[1], 2, 4, chain_offset=0,
                                drafts_within_budget=True).spec_verify_ct == 0
    # the rule this test tells apart: drafting num_steps regardless, some budget cuts accepted drafts
    free = [speculative_generate(target64, loaded.draft, loaded.capture, prompts[1], b, 4, chain_offset=0)
            for b in range(2, 24)]
    assert any(r.accepted_drafts_before_stop > r.accepted_drafts for r in free)


def test_eos_stops_generation(target, prompts):
    out = greedy_generate(target, prompts[2], 30)
    eos = out[5]
    cut = greedy_generate(target, prompts[2], 30, eos_token_id=eos)
    assert cut == out[:out.index(eos) + 1]


def test_sglang_capture_layers():
    assert sglang_capture_layers({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}},
                                 6) == (1, 3, 4)
    assert sglang_capture_layers({}, 32) == (2, 16, 29)
    # a top-level field is not what SGLang reads
    assert sglang_capture_layers({"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}, 32) == (2, 16, 29)


def test_story_load_leaves_the_decoder_layer_at_init(target, raw_draft, fixed_draft):
    broken = load_for_engine(DEMO / "draft-story", "sglang==0.5.10", target)
    assert broken.written == {"model.embed_tokens.weight", "model.fc.weight", "model.norm.weight", "lm_head.weight"}
    hot = broken.draft.hot_token_id
    assert hot is not None and torch.equal(hot, raw_draft["d2t"] + torch.arange(len(hot)))
    layer = broken.draft.params[MIDLAYER + "mlp.down_proj.weight"]
    assert torch.equal(layer, initial_value(MIDLAYER + "mlp.down_proj.weight", tuple(layer.shape)))
    # the target's embedding replaces the draft's, as SGLang's set_embed does
    assert broken.draft.params["model.embed_tokens.weight"] is target.embed
    fixed = load_for_engine(fixed_draft, "sglang==0.5.10", target)
    assert len(fixed.written) == 11
    qkv = fixed.draft.params[MIDLAYER + "self_attn.qkv_proj.weight"]
    assert torch.equal(qkv, torch.cat([raw_draft["layers.0.self_attn.q_proj.weight"],
                                       raw_draft["layers.0.self_attn.k_proj.weight"],
                                       raw_draft["layers.0.self_attn.v_proj.weight"]]))


def test_refused_loads_carry_the_engine_message(target, fixed_draft, tmp_path):
    with pytest.raises(LoadRefused, match="Should have a `model_type` key"):
        load_for_engine(DEMO / "draft-speculators", "sglang==0.5.23", target)
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(fixed_draft, bad)
    config = json.loads((bad / "config.json").read_text())
    config["intermediate_size"] = 100  # gate/up no longer fit
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadRefused, match="shape-mismatch"):
        load_for_engine(bad, "sglang==0.5.10", target)


def test_wrong_layer_count_is_a_clear_error(target, fixed_draft, prompts):
    draft = load_for_engine(fixed_draft, "sglang==0.5.10", target).draft
    with pytest.raises(CaptureMismatch, match="2 distinct aux states"):
        speculative_generate(target, draft, (2, 4, 6), prompts[0], 8, 4, chain_offset=1)  # layer 6 does not exist
    # SGLang's default for a 6-layer target names layer 3 twice; it is captured once
    with pytest.raises(CaptureMismatch, match=r"\[2, 3, 3\] gives 2 distinct aux states"):
        speculative_generate(target, draft, sglang_capture_layers({}, 6), prompts[0], 8, 4, chain_offset=1)


def test_initial_values_are_deterministic():
    a = initial_value("model.midlayer.mlp.down_proj.weight", (4, 3))
    assert torch.equal(a, initial_value("model.midlayer.mlp.down_proj.weight", (4, 3)))
    assert not torch.equal(a, initial_value("model.midlayer.self_attn.o_proj.weight", (4, 3)))
    assert torch.equal(initial_value("model.norm.weight", (5,)), torch.ones(5))


# --- the draft forward against speculators' own Eagle3DraftModel --------------------------------

def speculators_model(norm_before_residual: bool):
    """speculators' own draft with random weights, in float64 (see assert_same_computation)."""
    from speculators.models import Eagle3DraftModel, Eagle3SpeculatorConfig
    from transformers import LlamaConfig

    torch.manual_seed(0)
    layer = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                        max_position_embeddings=128)
    layer._attn_implementation = "sdpa"
    model = Eagle3DraftModel(Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=50,
        norm_before_residual=norm_before_residual, eagle_aux_hidden_state_layer_ids=[1, 2, 3]))
    with torch.no_grad():  # random everything, norms included, so each norm's place matters
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape) * (0.3 if "norm" not in name else 1.0)
                    + (1.0 if "norm" in name else 0.0))
    return model.eval().to(F64)


def speculators_run(model, hidden, ids, positions, ttt_steps):
    """speculators' forward; returns (logits, decoder-layer output) per TTT step via hooks."""
    logits, states = [], []
    h1 = model.lm_head.register_forward_hook(lambda m, i, o: logits.append(o[0]))
    h2 = model.layers[0].register_forward_hook(lambda m, i, o: states.append(o[0]))
    try:
        with torch.no_grad():
            model(hidden_states=hidden[None], input_ids=ids[None],
                  document_ids=torch.zeros_like(ids)[None], position_ids=positions[None],
                  ttt_steps=ttt_steps)
    finally:
        h1.remove()
        h2.remove()
    return logits, states


def ours_from(model, layer_config: dict):
    """Our draft with the speculators model's weights, fused the way SGLang's loader fuses them."""
    sd = model.state_dict()
    p, L = MIDLAYER, "layers.0."
    state = {"model.embed_tokens.weight": sd["embed_tokens.weight"], "model.fc.weight": sd["fc.weight"],
             "model.norm.weight": sd["norm.weight"], "lm_head.weight": sd["lm_head.weight"],
             p + "self_attn.qkv_proj.weight": torch.cat([sd[L + f"self_attn.{x}_proj.weight"] for x in "qkv"]),
             p + "mlp.gate_up_proj.weight": torch.cat([sd[L + "mlp.gate_proj.weight"], sd[L + "mlp.up_proj.weight"]])}
    for name in ("self_attn.o_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm", "hidden_norm"):
        state[p + name + ".weight"] = sd[L + name + ".weight"]
    config = dict(layer_config, draft_vocab_size=50)
    draft = build_draft(config, state, set(state), dtype=F64)
    assert set(draft.params) == set(state)  # every parameter comes from the speculators model
    return draft


def test_draft_forward_matches_speculators():
    model = speculators_model(norm_before_residual=False)
    ours = ours_from(model, model.config.transformer_layer_config.to_dict())
    g = torch.Generator().manual_seed(1)
    t = 9
    ids = torch.randint(0, 50, (t,), generator=g)
    hidden = torch.randn(t, 96, generator=g, dtype=F64)
    positions = 1 + torch.arange(t)  # speculators' default
    logits, states = speculators_run(model, hidden, ids, positions, ttt_steps=2)

    # TTT step 0 = an extend over all positions (fc applied to the aux states)
    cache = KVCache.empty(1)
    our_logits, our_hidden = ours.forward(ids, hidden, positions, cache)
    assert_same_computation(our_logits, logits[0])
    assert_same_computation(our_hidden, states[0])

    # TTT step 1 at index i = a decode step after an extend over 0..i: input token i + 1, the
    # draft's own hidden from step 0 (no fc), position + 1, attending to keys 0..i and itself
    i = t - 2
    cache = KVCache.empty(1)
    _, h0 = ours.forward(ids[:i + 1], hidden[:i + 1], positions[:i + 1], cache)
    step_logits, step_hidden = ours.forward(ids[i + 1:i + 2], h0[-1:], positions[i:i + 1] + 1, cache)
    assert_same_computation(step_logits[0], logits[1][i])
    assert_same_computation(step_hidden[0], states[1][i])


def test_norm_before_residual_is_not_what_sglang_computes():
    """speculators' training default (norm_before_residual: true) puts hidden_norm(hidden) on the
    residual path; SGLang keeps the raw hidden. Same weights, different outputs."""
    model = speculators_model(norm_before_residual=True)
    ours = ours_from(model, model.config.transformer_layer_config.to_dict())
    g = torch.Generator().manual_seed(1)
    ids, hidden = torch.randint(0, 50, (6,), generator=g), torch.randn(6, 96, generator=g, dtype=F64)
    positions = 1 + torch.arange(6)
    logits, states = speculators_run(model, hidden, ids, positions, ttt_steps=1)
    our_logits, _ = ours.forward(ids, hidden, positions, KVCache.empty(1))
    assert (our_logits - logits[0]).abs().max() > 1e-2
    # the control computation (what vLLM does with the option) is speculators' own
    as_trained, as_trained_hidden = ours.with_norm_before_residual().forward(ids, hidden, positions, KVCache.empty(1))
    assert_same_computation(as_trained, logits[0])
    assert_same_computation(as_trained_hidden, states[0])


# --- the story on the demo data ---------------------------------------------------------------

def test_demo_acceptance_broken_vs_fixed(tmp_path):
    """What the story must show: its draft under 0.5.10 <= 1.05, after fix >= 2.0 (4 steps);
    speculators' own checkpoint refused by 0.5.23 as SGLang refuses it, >= 2.0 once converted.
    Measured (float32 and float64 alike), as `bench` counts: 1.01 before, 3.24 and 3.34 after."""
    cases = acceptance.demo_cases(DEMO, tmp_path, n_prompts=16, max_new_tokens=48, num_steps=4)
    # the float32 counts are the float64 ones: no draft or target choice sits on a rounding tie
    (tmp_path / "f64").mkdir()
    assert cases == acceptance.demo_cases(DEMO, tmp_path / "f64", n_prompts=16, max_new_tokens=48, num_steps=4,
                                          dtype=F64)
    written, broken = cases["story draft, sglang==0.5.10"]
    assert written == 4 and broken.served_accept_length <= 1.05 and broken.step_accept_length <= 1.05
    # meta_info's formula counts each request's prefill token too: at most one token per request more
    assert broken.accept_length <= broken.step_accept_length + broken.requests / broken.spec_verify_ct
    for case in ("story draft fixed, sglang==0.5.10", "speculators draft fixed, sglang==0.5.23"):
        written, fixed = cases[case]
        assert written == 11 and fixed.served_accept_length >= 2.0 and fixed.accept_length >= 2.0
    assert cases["speculators draft, sglang==0.5.23"].startswith("refused: config-unreadable")
