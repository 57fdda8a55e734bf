"""Predicted acceptance: the draft as the engine loads it, run on the target's own greedy continuations.

What holds it to something it does not contain:
- the target runs in transformers; its states and argmax are the reference Llama's (float64);
- the predicted counts are the reference engine's measurement of the same prompts and budget, verify step
  for verify step (float64), for engines with different chain positions, aux layers and vocabulary maps;
- held-out value defects that every rule passes (a transposed projection, a head whose rows no longer match
  the vocabulary map, a layer re-drawn by an initialiser, one NaN) fail `check --target` by the prediction
  alone; trained drafts pass, with norms at exactly 1.0 too.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from draftdoctor.diagnose import check
from draftdoctor.predict import NOTHING_BELOW, PredictionSpec

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
TARGET = DEMO / "target"
CLI = Path(sys.executable).with_name("draftdoctor")


def test_transformers_runs_the_target_as_the_reference_llama_does():
    """Every state an engine captures (the input of each layer, the last layer's output before the final
    norm) and every argmax, from transformers and from the reference engine's own Llama, in float64."""
    from draftdoctor.eagle import teacher
    from draftdoctor.eagle.llama import TargetModel

    model = teacher.load_target(TARGET, torch.float64, "cpu", 64)
    ours = TargetModel.from_dir(TARGET, torch.float64)
    prompt = teacher.tokenize(TARGET, ["the capital of"])[0]
    [sequence] = teacher.continuations(model, [prompt], 24)
    everything = tuple(range(ours.n_layers + 1))
    recorded = teacher.record(model, prompt, sequence, everything)
    logits, states = ours.forward(torch.tensor(recorded.sequence), ours.new_cache(), everything)
    assert len(recorded.sequence) == len(sequence), "the full forward continues as the token-by-token one did"
    assert torch.equal(recorded.argmax, logits.argmax(-1))
    for layer, state in zip(everything, states):
        scale = state.abs().max().item()
        assert torch.allclose(recorded.states[layer].double(), state, rtol=0, atol=1e-6 * scale), layer


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """The story's draft fixed for SGLang 0.5.10 (its trained values under the names every release reads)."""
    from draftdoctor.fix import apply_fix, plan_fix

    return apply_fix(plan_fix(DEMO / "draft-story", "sglang==0.5.10", predict=False),
                     tmp_path_factory.mktemp("fixed") / "draft").dst


@pytest.mark.parametrize("engine, draft", [("sglang==0.5.10", "story"), ("sglang==0.5.10", "fixed"),
                                           ("sglang==0.5.23", "fixed"), ("vllm==0.32.0", "speculators")])
def test_the_prediction_is_what_the_reference_engine_measures(engine, draft, fixed):
    """Replaying greedy verification over the recorded target gives the reference engine's own counts on
    the same prompts and token budget: the same verify steps, the same drafts accepted."""
    from draftdoctor.reference.acceptance import one_thread, run_prompts, tokenized_prompts
    from draftdoctor.eagle.llama import TargetModel
    from draftdoctor.eagle.loading import place

    path = {"story": DEMO / "draft-story", "fixed": fixed, "speculators": DEMO / "draft-speculators"}[draft]
    spec = PredictionSpec(TARGET, num_prompts=12, new_tokens=32, num_steps=4, dtype="float64")
    report = check(path, engine, target=TARGET, predict=spec)
    predicted = report.prediction
    target = TargetModel.from_dir(TARGET, torch.float64)
    with one_thread():
        measured = run_prompts(target, place(check(path, engine), target), tokenized_prompts(DEMO, 12), 32, 4)
    how = {"before_stop": measured.accept_length_before_stop, "emitted": measured.step_accept_length}
    assert predicted.verify_steps == measured.spec_verify_ct
    assert predicted.accept_length == pytest.approx(how[predicted.counted], abs=1e-12)
    assert (predicted.accept_length < 1.1) == (draft == "story")


def _variant(src: Path, dst: Path, edit) -> Path:
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    [file] = dst.glob("*.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file)
    return dst


def _transpose_o_proj(t):
    key = "midlayer.self_attn.o_proj.weight"
    t[key] = np.ascontiguousarray(t[key].T)


def _misalign_head(t):  # a regenerated d2t whose lm_head rows no longer match (SpecForge's reported failure)
    t["lm_head.weight"] = np.ascontiguousarray(t["lm_head.weight"][np.random.default_rng(1).permutation(96)])


def _glorot_layer(t):
    rng = np.random.default_rng(2)
    for key in [k for k in t if k.startswith("midlayer.") and k.endswith("proj.weight")]:
        bound = np.sqrt(6.0 / sum(t[key].shape))
        t[key] = rng.uniform(-bound, bound, t[key].shape).astype(t[key].dtype)


def _one_nan(t):
    t["fc.weight"][3, 5] = np.nan


def _norms_at_one(t):
    for key in [k for k in t if k.endswith("norm.weight")]:
        t[key] = np.ones_like(t[key])


@pytest.mark.parametrize("defect, only_the_prediction", [(_transpose_o_proj, True), (_misalign_head, True),
                                                         (_glorot_layer, False), (_one_nan, False)],
                         ids=["transposed", "head-misaligned", "glorot-layer", "one-nan"])
def test_a_draft_that_loads_cleanly_and_predicts_nothing_fails_check(defect, only_the_prediction, fixed, tmp_path):
    variant = _variant(fixed, tmp_path / "draft", defect)
    report = check(variant, "sglang==0.5.10", target=TARGET)
    errors = {f.code for f in report.errors}
    assert "no-acceptance-predicted" in errors and report.prediction.accept_length < NOTHING_BELOW
    if only_the_prediction:  # every rule about it passes: names, shapes, config, values
        assert errors == {"no-acceptance-predicted"}
        assert check(variant, "sglang==0.5.10", target=TARGET, predict=False).errors == []
    assert report.verdict.startswith("names load, but")


def test_trained_drafts_pass_and_norms_at_one_are_no_error(fixed, tmp_path):
    """A trained draft with its norms at exactly 1.0 (never trained, or frozen) works: the prediction says so,
    and what the value rules say of the norms is a warning beside it, not an error."""
    for path in (fixed, _variant(fixed, tmp_path / "norms", _norms_at_one)):
        report = check(path, "sglang==0.5.10", target=TARGET)
        assert report.errors == [], [f.line() for f in report.errors]
        assert report.prediction.accept_length > 2.5 and not report.prediction.predicts_nothing
        assert report.verdict.startswith("loads cleanly") and "predicted accept length" in report.verdict


def _d2t_absolute(t):  # target ids saved where offsets (target id - draft id) belong
    t["d2t"] = t["d2t"] + np.arange(len(t["d2t"]))


def test_a_vocabulary_map_beyond_the_target_is_said_not_raised(fixed, tmp_path):
    """A d2t that maps draft ids past the target's vocabulary: the engine indexes its embedding with them at
    the next draft step. The prediction says it cannot run it, beside the rule's error, and raises nothing."""
    report = check(_variant(fixed, tmp_path / "draft", _d2t_absolute), "sglang==0.5.10", target=TARGET)
    assert {f.code for f in report.errors} == {"vocab-map-invalid"} and report.prediction is None
    [said] = [f.message for f in report.findings if f.code == "not-checked"]
    assert "outside the target's vocabulary 0..113" in said, said


@pytest.mark.parametrize("change", [{"tie_word_embeddings": True},
                                    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}}],
                         ids=["tied", "llama3-rope"])
def test_a_draft_the_reference_does_not_compute_is_said_not_raised(fixed, tmp_path, change):
    """A config the reference draft does not compute (a Llama 3.1 draft's llama3 rope scaling, tied embeddings):
    the prediction says why it is not made, and raises nothing."""
    variant = _variant(fixed, tmp_path / "draft", lambda t: None)
    config = json.loads((variant / "config.json").read_text())
    (variant / "config.json").write_text(json.dumps(config | change))
    report = check(variant, "sglang==0.5.10", target=TARGET)
    assert report.prediction is None
    [said] = [f.message for f in report.findings if f.code == "not-checked"]
    assert "not supported by the reference engine" in said, said


def test_a_prediction_within_its_error_of_nothing_is_a_warning(fixed, tmp_path):
    """q_proj's rows permuted keeps every statistic and predicts 1.29 +- 0.02 on 16 prompts (measured the same on
    the reference backend): not sure to be below the bound, not sure to be above it. The verdict says so."""
    def permute(t):
        key = "midlayer.self_attn.q_proj.weight"
        t[key] = np.ascontiguousarray(t[key][np.random.default_rng(0).permutation(t[key].shape[0])])

    report = check(_variant(fixed, tmp_path / "draft", permute), "sglang==0.5.10", target=TARGET)
    assert not report.prediction.works and not report.prediction.predicts_nothing, report.prediction.text()
    [said] = [f for f in report.findings if f.code == "predicted-acceptance"]
    assert said.severity == "warning" and "not sure the draft accepts anything" in said.message
    assert "warning" in report.verdict


def test_the_verdict_of_a_draft_predicting_nothing_names_the_error_that_says_why(fixed, tmp_path):
    """d2t shifted down by one id: in range and increasing, but t2d no longer agrees, and the draft predicts
    nothing. The verdict names the vocabulary map, not 'its values carry no training'; with no other error it
    still says that (a transposed o_proj)."""
    report = check(_variant(fixed, tmp_path / "d2t", lambda t: t.update(d2t=t["d2t"] - 1)), "sglang==0.5.10",
                   target=TARGET)
    assert {f.code for f in report.errors} == {"vocab-map-invalid", "no-acceptance-predicted"}
    assert report.verdict.startswith("names load, but the draft as loaded predicts nothing: predicted accept length")
    assert "(vocab-map-invalid: t2d does not mark exactly" in report.verdict, report.verdict
    report = check(_variant(fixed, tmp_path / "o_proj", _transpose_o_proj), "sglang==0.5.10", target=TARGET)
    assert report.verdict.endswith("(its values carry no training the engine can use)"), report.verdict


def test_a_non_finite_value_stays_an_error_beside_a_prediction_that_works(fixed, tmp_path):
    """One inf in the head (an fp16 overflow) costs the demo draft a third of its acceptance on these prompts,
    yet the prediction says it works: the value is certainly wrong, so it is not outranked as a guess is."""
    variant = _variant(fixed, tmp_path / "draft", lambda t: t["lm_head.weight"].__setitem__((7, 3), np.inf))
    report = check(variant, "sglang==0.5.10", target=TARGET)
    assert report.prediction.works and report.prediction.accept_length < 2.5
    assert [f.code for f in report.errors] == ["nan-weights"] and "lm_head.weight" in report.errors[0].message


def test_a_t2d_no_engine_reads_is_outranked_by_a_prediction_that_works(fixed, tmp_path):
    """A t2d at odds with a well-formed d2t: every engine skips t2d, so without a target it is an error (d2t may
    be the wrong one), and beside a prediction that the draft as loaded works, a warning."""
    variant = _variant(fixed, tmp_path / "draft", lambda t: t.update(t2d=~t["t2d"]))
    assert "vocab-map-invalid" in {f.code for f in check(variant, "sglang==0.5.10", predict=False).errors}
    report = check(variant, "sglang==0.5.10", target=TARGET)
    assert report.errors == [] and report.prediction.works, [f.line() for f in report.errors]
    [said] = [f for f in report.findings if f.code == "vocab-map-invalid"]
    assert said.severity == "warning" and "yet the draft as loaded is predicted to work" in said.message


def test_fix_refuses_what_predicts_nothing_and_says_the_prediction(fixed, tmp_path):
    glorot = _variant(fixed, tmp_path / "glorot", _glorot_layer)
    done = subprocess.run([str(CLI), "fix", str(glorot), "--engine", "sglang==0.5.23", "--target", str(TARGET),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and not (tmp_path / "out").exists(), done.stdout + done.stderr
    assert "no-acceptance-predicted" in done.stdout and "predicted accept length 1." in done.stdout


def test_check_json_carries_the_prediction_and_no_target_means_no_torch(tmp_path):
    done = subprocess.run([str(CLI), "check", str(DEMO / "draft-speculators"), "--engine", "vllm==0.32.0", "--target",
                           str(TARGET), "--format", "json", "--loader", "replay", "--num-prompts", "4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    prediction = json.loads(done.stdout)["prediction"]
    assert {"accept_length", "per_position", "prompts", "tokens", "loader", "seconds"} <= set(prediction)
    assert prediction["prompts"] == 4 and prediction["loader"] == "replay" and len(prediction["per_position"]) == 4
    quiet = subprocess.run([sys.executable, "-c", "import sys; from draftdoctor.diagnose import check; "
                            f"check({str(DEMO / 'draft-speculators')!r}, 'vllm==0.32.0', target={str(TARGET)!r}, "
                            "predict=False); check(" + repr(str(DEMO / "draft-speculators")) + ", 'vllm==0.32.0'); "
                            "print('torch' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert quiet.stdout.strip() == "False", quiet.stderr  # without a prediction, headers and samples only


def test_a_target_over_the_memory_budget_is_not_run(tmp_path):
    done = subprocess.run([str(CLI), "check", str(DEMO / "draft-speculators"), "--engine", "vllm==0.32.0", "--target",
                           str(TARGET), "--loader", "replay"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, DRAFTDOCTOR_MEMORY_BUDGET="100K"))
    assert done.returncode == 0, done.stderr
    assert "INFO    not-checked: no prediction of acceptance: " in done.stdout
    assert "takes about" in done.stdout and "more than the memory budget of 102.4 kB" in done.stdout


def _break_target(kind: str, target: Path) -> str:
    """Spoil the copy of the demo target at `target` as `kind` says; what the finding must name."""
    config = json.loads((target / "config.json").read_text())
    if kind == "generation-config-nested":
        (target / "generation_config.json").write_text("[" * 100_000)
        return f"{target}: transformers cannot load this target"
    if kind == "tokenizer-nested":
        (target / "tokenizer.json").write_text("[" * 100_000)
        return f"{target / 'tokenizer.json'}: tokenizers cannot read it"
    if kind == "tokenizer-huge":  # sparse: no disk; tokenizers had read all of it
        with open(target / "tokenizer.json", "r+b") as f:
            f.truncate(1 << 30)
        return f"{target / 'tokenizer.json'}: larger than 128 MB"
    config |= {"dtype-unknown": {"dtype": "float8"}, "bos-a-word": {"bos_token_id": "x"}}[kind]
    (target / "config.json").write_text(json.dumps(config))
    return f"{target}: transformers cannot build this target"


@pytest.mark.parametrize("kind", ["generation-config-nested", "tokenizer-nested", "tokenizer-huge", "dtype-unknown",
                                  "bos-a-word"])
def test_a_target_transformers_or_tokenizers_cannot_read_is_not_run_and_named(kind, tmp_path):
    """What transformers' config validators, its JSON reader and tokenizers raise had escaped as tracebacks."""
    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    said = _break_target(kind, target)
    done = subprocess.run([str(CLI), "check", str(DEMO / "draft-speculators"), "--engine", "vllm==0.32.0", "--target",
                           str(target), "--loader", "replay", "--num-prompts", "2"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"INFO    not-checked: no prediction of acceptance: {said}" in done.stdout, done.stdout
