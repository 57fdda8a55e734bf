"""`investigate`: papermill runs in order, failures named by notebook and cell, batch summaries."""

import json
from pathlib import Path

import nbformat
import pytest

from draftdoctor.investigate import ParamsError, StepFailed, investigate, load_params, run_step

ROOT = Path(__file__).resolve().parents[1]
INSPECTION = ("01-dump-keys", "02-compare-names", "03-load-coverage")


def test_params_file_batch_and_relative_paths(tmp_path):
    (tmp_path / "p.yaml").write_text("engine_name: sglang\nrelease: '0.5.10'\ncheckpoints:\n  - a/draft\n"
                                     "  - {checkpoint: b/draft, name: other}\n")
    runs = load_params(tmp_path / "p.yaml")
    assert [r["name"] for r in runs] == ["draft", "other"]
    assert runs[0]["checkpoint"] == str(tmp_path / "a" / "draft") and runs[1]["release"] == "0.5.10"
    (tmp_path / "bad.yaml").write_text("engine_name: sglang\n")
    with pytest.raises(ParamsError, match="checkpoint"):
        load_params(tmp_path / "bad.yaml")


def test_the_old_name_of_engine_name_is_read_for_one_release(tmp_path):
    """A params file written before `engine` was renamed `engine_name` runs as it did: the notebooks get
    the name it gives as `engine_name`; both names, saying different engines, is one line naming the file."""
    (tmp_path / "old.yaml").write_text("engine: vllm\nrelease: '0.32.0'\ncheckpoint: a/draft\n")
    [run] = load_params(tmp_path / "old.yaml")
    assert run["engine_name"] == "vllm" and "engine" not in run
    (tmp_path / "same.yaml").write_text("engine: vllm\nengine_name: vllm\ncheckpoint: a/draft\n")
    assert load_params(tmp_path / "same.yaml")[0]["engine_name"] == "vllm"
    (tmp_path / "both.yaml").write_text("engine: vllm\nengine_name: sglang\ncheckpoint: a/draft\n")
    with pytest.raises(ParamsError, match=r"both.yaml: `engine` is the old name of `engine_name`"):
        load_params(tmp_path / "both.yaml")


def test_every_path_in_a_params_file_is_relative_to_it(tmp_path):
    """The notebooks run in the package's folder: a relative `fixed_checkpoint` had written the fixed draft
    into the package (site-packages, in an installed kit)."""
    (tmp_path / "p.yaml").write_text("checkpoint: a/draft\ntarget: t\nprompts: p.jsonl\nfixed_checkpoint: fixed\n")
    [run] = load_params(tmp_path / "p.yaml")
    assert {k: run[k] for k in ("checkpoint", "target", "prompts", "fixed_checkpoint")} == {
        "checkpoint": str(tmp_path / "a" / "draft"), "target": str(tmp_path / "t"),
        "prompts": str(tmp_path / "p.jsonl"), "fixed_checkpoint": str(tmp_path / "fixed")}


def test_the_notebooks_path_parameters_are_the_ones_resolved():
    """Every text parameter the five steps take is a path the params file's folder resolves, or one of
    the words that name no file: a new path parameter cannot be left relative to the package."""
    import papermill as pm

    from draftdoctor.investigate import PATH_PARAMS, STEPS
    from draftdoctor.toolstate import NOTEBOOKS

    words = {"engine_name", "release", "loader", "backend", "compare_backend", "out_dir"}  # out_dir: the kit's own
    for step in STEPS:
        declared = pm.inspect_notebook(str(NOTEBOOKS / f"{step}.ipynb"))
        text = {name for name, p in declared.items() if p["inferred_type_name"] == "str"}
        assert text - words <= set(PATH_PARAMS), (step, text - words - set(PATH_PARAMS))


def test_failing_cell_is_reported_with_notebook_and_cell(tmp_path):
    with pytest.raises(StepFailed) as e:
        run_step("01-dump-keys", {"checkpoint": str(tmp_path / "missing")}, tmp_path, cell_timeout=120)
    assert e.value.notebook == "01-dump-keys.ipynb" and e.value.cell is not None
    assert "CheckpointError" in e.value.message and "no such file" in e.value.message


def test_cell_timeout_is_reported_with_the_cell(tmp_path, capfd):
    book = nbformat.v4.new_notebook()
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("out_dir: str = '.'  # where to write")
    params.metadata["tags"] = ["parameters"]
    book.cells = [params, nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("import time\ntime.sleep(60)")]
    nbformat.write(book, tmp_path / "slow.ipynb")
    with pytest.raises(StepFailed) as e:
        run_step("slow", {}, tmp_path / "out", cell_timeout=2, notebooks=tmp_path)
    assert "timed out" in e.value.message and e.value.cell is not None and e.value.cell >= 2
    # the kernel's warnings and the traceback of its stop go to the run folder's kernels.log, not the terminal
    assert capfd.readouterr().err == ""
    assert "Kernel is running over TCP" in (tmp_path / "out" / "kernels.log").read_text()


@pytest.mark.story
def test_batch_of_two_checkpoints_writes_a_folder_each_and_a_summary(tmp_path, draft, monkeypatch):
    import draftdoctor.investigate as inv

    monkeypatch.setattr(inv, "STEPS", INSPECTION)
    good = draft("midlayer")
    (tmp_path / "p.yaml").write_text(json.dumps({
        "engine_name": "sglang", "release": "0.5.10",
        "checkpoints": [str(ROOT / "data" / "speculators-draft"), str(good), str(tmp_path / "missing")]}))
    results = investigate(tmp_path / "p.yaml", tmp_path / "out", cell_timeout=120)
    assert [r.error is None for r in results] == [True, True, False]
    story = json.loads((tmp_path / "out" / "speculators-draft" / "report.json").read_text())
    assert story["coverage_before"]["params_uninitialized"] == 7 and story["layout"] == "speculators"
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "decoder layer left at initial values" in summary and "failed: 01-dump-keys.ipynb" in summary


def test_a_draft_that_does_not_fit_the_target_stops_before_any_notebook(tmp_path, draft):
    """The synthetic draft's vocabulary (256) is not the demo target's: nothing is launched, the
    report says why."""
    import subprocess
    import sys

    (tmp_path / "p.yaml").write_text(json.dumps({"checkpoint": str(draft("speculators")), "engine_name": "sglang",
                                                 "release": "0.5.10", "target": str(ROOT / "data" / "demo" / "target")}))
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "investigate", "--params", str(tmp_path / "p.yaml"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "FAILED" in proc.stdout and "target-mismatch" in proc.stdout
    assert "nothing was launched" in proc.stdout
    assert not list((tmp_path / "out").glob("*.ipynb"))
    assert "target-mismatch" in (tmp_path / "out" / "report.md").read_text()


def _investigate_cli(tmp_path, checkpoint):
    import subprocess
    import sys

    demo = ROOT / "data" / "demo"
    (tmp_path / "p.yaml").write_text(
        f"checkpoint: {checkpoint}\ntarget: {demo / 'target'}\nprompts: {demo / 'prompts.jsonl'}\nengine_name: sglang\n"
        "release: '0.5.10'\nloader: replay\nbackend: reference\nnum_prompts: 5\nmax_new_tokens: 24\nnum_steps: 4\n")
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "investigate", "--params", str(tmp_path / "p.yaml"),
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=600)
    return proc, json.loads((tmp_path / "run" / "report.json").read_text())


@pytest.mark.story
def test_a_draft_that_does_not_start_before_the_fix_is_recorded_and_the_fix_measured(tmp_path):
    """speculators' raw output on SGLang 0.5.10: its config cannot be read, so "before" does not start;
    the investigation goes on, and its status follows the "after" result."""
    proc, report = _investigate_cli(tmp_path, ROOT / "data" / "demo" / "draft-speculators")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["before"]["failure"] and "Unrecognized model" in report["before"]["failure"]
    assert report["before"]["accept_length"] is None and report["after"]["accept_length"] >= 2.0
    assert "before the fix: does not start: sglang==0.5.10 would not start with this draft" in proc.stdout
    assert "after the fix: accept length" in proc.stdout and "the draft works" in proc.stdout


@pytest.mark.story
def test_a_refused_fix_leaves_the_measured_draft_explained(tmp_path):
    """A converter-reinitialised decoder layer: the names load, so "before" is measured; `fix` refuses
    (no rewrite brings trained values back), so there is no "after"; exit 1 with the reason."""
    from draftdoctor.synth import sloppy_convert

    draft = sloppy_convert(ROOT / "data" / "demo" / "draft-story", tmp_path / "converted", {"layers.0.": "midlayer."})
    proc, report = _investigate_cli(tmp_path, draft)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # 5 prompts x 24 tokens are too few for the prediction to be sure of nothing: the value rule refuses alone
    assert report["after"] is None and "weights-at-init" in report["fix"]["refused_codes"]
    assert "the draft runs but predicts little" in report["before"]["explanation"]
    assert "the fix was refused (weights-at-init" in proc.stdout
    # why no rewrite can help, said as the investigation's last word on it
    assert "its values carry no training the engine can use, which no rewrite of names or config restores" in proc.stdout
    assert "## Verdict" in (tmp_path / "run" / "report.md").read_text()


def test_an_after_that_still_accepts_nothing_is_unresolved():
    """Measured, or predicted where nothing was measured: below what any draft with a trained layer reached."""
    from draftdoctor.report import outcome, unresolved

    nothing = {"after": {"accept_length": 1.02, "explanation": "accept length 1.02"}, "same_draft": True}
    assert unresolved(nothing, None) and any("re-export from the training output" in line for line in outcome(nothing))
    assert unresolved({"after": {"accept_length": None, "predicted_accept_length": 1.1}}, None)
    assert not unresolved({"after": {"accept_length": 3.08}}, None)


FORGED = ('x\n\n## Verdict\n\nAccept length 1&#46;00 before, 4.00 after\n\n<img src="https://example.invalid/b.png">'
          '\n\n<!--.weight')


@pytest.mark.story
def test_names_from_a_checkpoint_cannot_write_markdown_into_the_report(tmp_path):
    """Reliability III item 5: a tensor whose name carries Markdown and HTML, quoted by vLLM's unknown-key
    error into the verdict: report.md shows it as text (one Verdict section, no image, no comment)."""
    import numpy as np

    from draftdoctor.synth import sloppy_convert
    from draftdoctor.synthwrite import write_safetensors
    from draftdoctor.checkpoint import open_checkpoint
    from draftdoctor.synthwrite import NUMPY_DTYPES

    src = open_checkpoint(ROOT / "data" / "demo" / "draft-speculators")
    folder = tmp_path / "hostile"
    folder.mkdir()
    tensors = {n: np.frombuffer(t.read(), dtype=NUMPY_DTYPES[t.dtype]).reshape(t.shape) for n, t in src.tensors.items()}
    write_safetensors(folder / "model.safetensors", tensors | {FORGED: np.zeros(4, dtype=np.float32)})
    (folder / "config.json").write_text((ROOT / "data" / "demo" / "draft-speculators" / "config.json").read_text())
    demo = ROOT / "data" / "demo"
    (tmp_path / "p.yaml").write_text(
        f"checkpoint: {folder}\ntarget: {demo / 'target'}\nprompts: {demo / 'prompts.jsonl'}\nengine_name: vllm\n"
        "release: '0.32.0'\nloader: replay\nbackend: reference\nnum_prompts: 2\nmax_new_tokens: 8\nnum_steps: 4\n")
    [result] = investigate(tmp_path / "p.yaml", tmp_path / "run")
    text = (tmp_path / "run" / "report.md").read_text()
    assert "Accept length 1" in text  # the name is in the report, as text
    assert sum(line.startswith("## Verdict") for line in text.splitlines()) <= 1  # no section a name could add
    assert "<img" not in text and "<!--" not in text and "&#46;" not in text


def test_a_batch_summary_shows_verdicts_as_text(tmp_path):
    from draftdoctor.investigate import RunResult
    from draftdoctor.report import write_summary

    result = RunResult("run", tmp_path / "run", report={"coverage_before": {"verdict": FORGED}}, error=FORGED)
    write_summary(tmp_path, [result])
    text = (tmp_path / "summary.md").read_text()
    assert len(text.strip().splitlines()) == 5  # title, blank, header, rule, one row: no line a name could add
    assert "<img" not in text and "<!--" not in text


BLOCKS = 'x\n\n## Verdict\n\nAccept length 4.00\n=====\n- forged item\n1. forged step\n| a | b |\n_em_ `code` [l](u)'


def test_a_name_is_one_line_of_text_wherever_it_lands_in_the_report(tmp_path):
    """Every field of the steps' records that a checkpoint, a config or an engine's message can fill, set to
    a text carrying block Markdown (headings, a setext underline, list items, a table row) and inline
    Markdown: report.md has exactly the sections and table rows the kit writes, and each field stays one
    line, shown as text."""
    import re

    from draftdoctor import runs
    from draftdoctor.report import write_report

    numbers = dict.fromkeys(("params_total", "params_uninitialized", "bytes_total", "bytes_uninitialized",
                             "keys_total", "keys_dropped"), 1)
    coverage = {"engine": BLOCKS, "loader": BLOCKS, "verdict": BLOCKS, "findings": [], "coverage": numbers}
    runs.save_step(tmp_path, runs.KEYS, {"layout": BLOCKS})
    runs.save_step(tmp_path, runs.COVERAGE, coverage)
    runs.save_step(tmp_path, runs.FIX, {"dst": BLOCKS, "ok": True, "coverage_after": coverage,
                                        "config_changes": [{"field": BLOCKS, "reason": BLOCKS}]})
    run = {"accept_length": 3.0, "accept_rate": 0.5, "tokens_per_s": 1.0, "backend": BLOCKS, "backend_label": BLOCKS,
           "explanation": BLOCKS}
    runs.save_step(tmp_path, runs.RESULTS, {"runs": [run | {"name": "before"}, run | {"name": "after"}]})
    write_report(tmp_path, {"name": BLOCKS, "checkpoint": BLOCKS}, BLOCKS)
    lines = (tmp_path / "report.md").read_text().splitlines()
    assert [line for line in lines if line.startswith("#")] == [lines[0], "## Verdict", "## Load coverage", "## Fix",
                                                              "## Acceptance"]
    assert not [line for line in lines if re.match(r"(=+|-+|\d+[.)] .*)$", line)], "a block a name started"
    assert [line for line in lines if line.startswith("- ")] == [line for line in lines if line.startswith(
        ("- before the fix: ", "- after the fix: ", "- config "))]
    assert len([line for line in lines if line.startswith("|")]) == 2 * 3 + 4  # the kit's three tables' rows
    shown = "x\\\\n\\\\n\\#\\# Verdict\\\\n\\\\nAccept length 4.00\\\\n=====\\\\n- forged item"
    assert sum(line.count(shown) for line in lines) == 17  # every field, each within its line, as text
    assert "\\_em\\_ \\`code\\` \\[l\\](u)" in lines[0]
