"""Real vLLM as a serving backend on the CPU: the story's failure measured on a real
engine, with acceptance read from vLLM's own counters. Needs `make vllm-loaders` (run by `make test`)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_release

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.serving.vllm import parse_counters

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"


def test_counters_are_read_from_prometheus_text():
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 12.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="t"} 1.79e+09',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 48.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 16.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="1"} 2.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 10.0'])
    assert parse_counters(text) == {"drafts": 12.0, "draft_tokens": 48.0, "accepted": 16.0, "per_position": [10.0, 2.0]}


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    """`bench --backend vllm --engine sglang==0.5.10`: the story's draft and its fix, each served on real
    vLLM as SGLang 0.5.10's loader leaves it."""
    from draftdoctor.fix import apply_fix, plan_fix

    require_release("0.32.0", "vllm")
    out = tmp_path_factory.mktemp("vllm-story")
    fixed = apply_fix(plan_fix(DEMO / "draft-story", "sglang==0.5.10", target=DEMO / "target"), out / "fixed").dst
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "bench", "--backend", "vllm", "--engine",
                           "sglang==0.5.10", "--target", str(DEMO / "target"), "--draft", f"before={DEMO / 'draft-story'}",
                           "--draft", f"after={fixed}", "--out", str(out / "bench"), "--num-prompts", "8"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out / "bench"


def test_the_story_on_a_real_engine(story):
    proc, out = story
    runs = {r["name"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert runs["before"]["accept_length"] <= 1.05 and runs["after"]["accept_length"] >= 2.0
    assert all(r["backend"] == "vllm" and r["requests"] == 8 for r in runs.values())
    assert "vLLM 0.32.0 (real engine, CPU), each draft as sglang==0.5.10 loads it" in proc.stdout


def test_what_was_served_stands_for_sglangs_load(story):
    """The before draft was served without the tensors SGLang 0.5.10 drops (speculators' layers.0.*),
    with ids restated so vLLM captures the layers SGLang captures."""
    _, out = story
    served = open_checkpoint(out / "served-before")
    assert not any(k.startswith("layers.0.") for k in served.tensors) and "fc.weight" in served.tensors
    config = json.loads((out / "served-before" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang's eagle_config [0, 2, 3], plus one
    # the fixed draft loses nothing but t2d, which SGLang skips by design
    assert set(open_checkpoint(out.parent / "fixed").tensors) - set(open_checkpoint(out / "served-after").tensors) == {"t2d"}


def test_speculation_does_not_change_greedy_output(story):
    """Lossless: with a dead draft and with a good one, vLLM returns the target's greedy text."""
    _, out = story
    runs = {r["name"]: r for r in json.loads((out / "requests.json").read_text())}
    before = [r["text"] for r in runs["before"]["request_log"]]
    after = [r["text"] for r in runs["after"]["request_log"]]
    assert before == after and all(before)


def test_investigate_on_real_vllm_with_the_reference_backend_beside_it(tmp_path):
    """`make demo-vllm` (investigate-vllm.yaml, fewer prompts): the whole arc measured on real vLLM, the
    report labelled with the real engine and the two backends charted side by side."""
    import yaml

    from draftdoctor.investigate import investigate

    require_release("0.32.0", "vllm")
    params = yaml.safe_load((DEMO / "investigate-vllm.yaml").read_text()) | {"num_prompts": 6}
    for key in ("checkpoint", "target", "prompts"):
        params[key] = str(DEMO / params[key])
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    [result] = investigate(tmp_path / "p.yaml", tmp_path / "out", cell_timeout=600)
    assert result.error is None, result.error
    report = result.report
    assert report["before"]["accept_length"] <= 1.05 and report["after"]["accept_length"] >= 2.0
    assert report["before"]["backend_label"] == "vLLM 0.32.0 (real engine, CPU), each draft as sglang==0.5.10 loads it"
    reference_before, reference_after = report["compared"]
    assert reference_before["backend_label"].startswith("reference backend emulating sglang==0.5.10")
    assert reference_before["accept_length"] <= 1.05 and reference_after["accept_length"] >= 2.0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Measured on vLLM 0.32.0 (real engine, CPU)" in text and "## Backends compared" in text
    assert (tmp_path / "out" / "backends.png").stat().st_size > 10_000
    # notebook 05 teaches the guard: the story's draft refused inside vLLM, beside check's verdict
    [executed] = (tmp_path / "out").rglob("05-relaunch-and-chart.ipynb")
    said = "".join(text for cell in json.loads(executed.read_text())["cells"] for output in cell.get("outputs", [])
                   for text in output.get("text", []))
    assert "check, before serving: decoder layer left at initial values" in said
    assert "the guard, while serving: does not start: draftdoctor guard: refusing to serve" in said
    assert "ERROR   uninitialized-params: 7 of 12 parameters" in said and "model.layers.0.self_attn.qkv_proj.weight" in said


def test_the_served_vllm_release_is_chosen_by_name(tmp_path):
    """`--engine vllm==X` picks the release that serves (the drafts served as they are); one not installed
    is refused by name with what installs it, never swapped for whatever is on disk."""
    import os

    require_release("0.32.0", "vllm")
    base = [sys.executable, "-m", "draftdoctor.cli", "bench", "--backend", "vllm", "--target", str(DEMO / "target"),
            "--draft", f"d={DEMO / 'draft-speculators'}", "--num-prompts", "3", "--max-new-tokens", "16"]
    proc = subprocess.run(base + ["--engine", "vllm==0.32.0", "--out", str(tmp_path / "a")], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = json.loads((tmp_path / "a" / "results.json").read_text())["runs"]
    assert run["backend_label"] == "vLLM 0.32.0 (real engine, CPU)" and run["accept_length"] >= 2.0
    assert not (tmp_path / "a" / "served-d").exists()  # served as it is
    empty = tmp_path / "no-releases"
    empty.mkdir()
    proc = subprocess.run(base + ["--engine", "vllm==0.32.0", "--out", str(tmp_path / "b")], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, DRAFTDOCTOR_VLLM_DIR=str(empty)))
    assert proc.returncode == 2 and "vLLM 0.32.0" in proc.stderr and "make vllm-loaders" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
