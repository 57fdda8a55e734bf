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
def arc(tmp_path_factory):
    """`make demo-vllm` (investigate-vllm.yaml, fewer prompts): the whole arc measured on real vLLM, the
    story's draft and its fix each served as SGLang 0.5.10's loader leaves it, with the reference backend
    beside it. One run for every test below: a real vLLM server per draft is the suite's dearest step."""
    import yaml

    from draftdoctor.investigate import investigate

    require_release("0.32.0", "vllm")
    out = tmp_path_factory.mktemp("vllm-arc")
    params = yaml.safe_load((DEMO / "investigate-vllm.yaml").read_text()) | {"num_prompts": PROMPTS}
    for key in ("checkpoint", "target", "prompts"):
        params[key] = str(DEMO / params[key])
    (out / "p.yaml").write_text(yaml.safe_dump(params))
    [result] = investigate(out / "p.yaml", out / "run", cell_timeout=600)
    assert result.error is None, result.error
    return result, out / "run"  # notebook 05 benches into the run's own folder (results.json, served-*)


PROMPTS = 6


def test_the_story_on_a_real_engine(arc):
    _, bench = arc
    runs = {r["name"]: r for r in json.loads((bench / "results.json").read_text())["runs"]}
    assert runs["before"]["accept_length"] <= 1.05 and runs["after"]["accept_length"] >= 2.0
    assert all(r["backend"] == "vllm" and r["requests"] == PROMPTS for r in runs.values())
    assert all(r["backend_label"] == "vLLM 0.32.0 (real engine, CPU), each draft as sglang==0.5.10 loads it"
               for r in runs.values())


def test_what_was_served_stands_for_sglangs_load(arc):
    """The before draft was served without the tensors SGLang 0.5.10 drops (speculators' layers.0.*),
    with ids restated so vLLM captures the layers SGLang captures."""
    from draftdoctor.runs import fixed_checkpoint

    _, bench = arc
    served = open_checkpoint(bench / "served-before")
    assert not any(k.startswith("layers.0.") for k in served.tensors) and "fc.weight" in served.tensors
    config = json.loads((bench / "served-before" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang's eagle_config [0, 2, 3], plus one
    # the fixed draft loses nothing but t2d, which SGLang skips by design
    fixed = open_checkpoint(fixed_checkpoint(bench))
    assert set(fixed.tensors) - set(open_checkpoint(bench / "served-after").tensors) == {"t2d"}


def test_speculation_does_not_change_greedy_output(arc):
    """Lossless: with a dead draft and with a good one, vLLM returns the target's greedy text."""
    _, bench = arc
    runs = {r["name"]: r for r in json.loads((bench / "requests.json").read_text())}
    before = [r["text"] for r in runs["before"]["request_log"]]
    after = [r["text"] for r in runs["after"]["request_log"]]
    assert before == after and all(before)


def test_investigate_on_real_vllm_with_the_reference_backend_beside_it(arc):
    """The report labelled with the real engine and the two backends charted side by side."""
    result, run = arc
    report = result.report
    assert report["before"]["accept_length"] <= 1.05 and report["after"]["accept_length"] >= 2.0
    assert report["before"]["backend_label"] == "vLLM 0.32.0 (real engine, CPU), each draft as sglang==0.5.10 loads it"
    reference_before, reference_after = report["compared"]
    assert reference_before["backend_label"].startswith("reference backend emulating sglang==0.5.10")
    assert reference_before["accept_length"] <= 1.05 and reference_after["accept_length"] >= 2.0
    text = (run / "report.md").read_text()
    assert "Measured on vLLM 0.32.0 (real engine, CPU)" in text and "## Backends compared" in text
    assert (run / "backends.png").stat().st_size > 10_000
    # notebook 05 teaches the guard: the story's draft refused inside vLLM, beside check's verdict
    [executed] = run.rglob("05-relaunch-and-chart.ipynb")
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
