"""Notebooks: committed clean, documented parameters, and each one run headless with papermill."""

import json
import re
from pathlib import Path

import nbformat
import papermill as pm
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_clean_with_documented_parameters(path):
    book = nbformat.read(path, as_version=4)
    assert book.metadata.kernelspec.name == "python3"
    for cell in book.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"
    ids = [c.get("id") for c in book.cells]
    assert all(ids) and len(set(ids)) == len(ids), f"{path.name}: every cell needs its own id: {ids}"
    import warnings

    with warnings.catch_warnings():  # nbformat warns (MissingIDFieldWarning) in every run of a notebook lacking one
        warnings.simplefilter("error")
        nbformat.validate(nbformat.reads(path.read_text(), as_version=4))
    tagged = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    params = pm.inspect_notebook(str(path))
    assert params and all(p["help"] for p in params.values()), "every parameter needs a help comment"


def _run(name, out_dir, **params):
    pm.execute_notebook(str(ROOT / "notebooks" / name), str(out_dir / name), kernel_name="python3",
                        parameters={"out_dir": str(out_dir), **params}, cwd=str(ROOT / "notebooks"),
                        progress_bar=False)


def test_inspection_steps_on_the_story_draft(tmp_path):
    draft = str(ROOT / "data" / "speculators-draft")
    _run("01-dump-keys.ipynb", tmp_path, checkpoint=draft)
    _run("02-compare-names.ipynb", tmp_path, checkpoint=draft, engine_name="sglang", release="0.5.10")
    _run("03-load-coverage.ipynb", tmp_path, checkpoint=draft, engine_name="sglang", release="0.5.10")
    keys = json.loads((tmp_path / "keys.json").read_text())
    assert keys["layout"] == "speculators" and keys["tensors"] == 16
    names = json.loads((tmp_path / "names.json").read_text())
    statuses = [r["status"] for r in names["rows"]]
    assert statuses.count("MISSING") == 7 and statuses.count("UNEXPECTED") == 10
    coverage = json.loads((tmp_path / "coverage.json").read_text())
    assert coverage["coverage"]["params_uninitialized"] == 7
    assert (tmp_path / "coverage.png").stat().st_size > 1000
    executed = nbformat.read(tmp_path / "03-load-coverage.ipynb", as_version=4)
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the coverage chart is shown inline"


def test_a_notebook_reads_engine_its_old_name_for_engine_name(tmp_path):
    """`papermill -p engine vllm`, as a notebook run before the rename was written, still names the engine:
    the default `engine_name` (sglang) does not win over it."""
    _run("02-compare-names.ipynb", tmp_path, checkpoint=str(ROOT / "data" / "speculators-draft"), engine="vllm",
         release="0.32.0")
    assert json.loads((tmp_path / "names.json").read_text())["engine"] == "vllm==0.32.0"


@pytest.mark.story
def test_investigate_the_demo_end_to_end(tmp_path, capfd):
    """What `make demo` runs: all five notebooks on the demo data, reference backend."""
    from draftdoctor.investigate import investigate

    out = tmp_path / "demo"
    [result] = investigate(ROOT / "data" / "demo" / "investigate.yaml", out, cell_timeout=300)
    assert result.error is None, result.error
    noise = capfd.readouterr().err  # the kernels' own stderr too (file descriptor 2)
    assert "Kernel is running over TCP" not in noise and "KeyboardInterrupt" not in noise, noise
    report = json.loads((out / "report.json").read_text())
    assert report["coverage_before"]["params_uninitialized"] == 7
    assert report["coverage_after"]["params_uninitialized"] == 0 and report["coverage_after"]["keys_dropped"] == 0
    assert report["before"]["accept_length"] <= 1.05 and report["after"]["accept_length"] >= 2.0
    assert report["before"]["backend"] == "reference" and report["fix"]["ok"]
    md = (out / "report.md").read_text()
    assert re.search(r"before the fix: accept length 1\.0[0-5] \(strict rate 0\.0\d\): no draft token", md)
    assert re.search(r"after the fix: accept length [23]\.\d\d \(strict rate 0\.\d\d\): the draft works", md)
    assert "acceptance.png" in md
    for name in ("acceptance.png", "per_position.png", "throughput.png", "coverage.png"):
        assert (out / name).stat().st_size > 1000
    executed = nbformat.read(out / "05-relaunch-and-chart.ipynb", as_version=4)
    pngs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) >= 3, "charts are shown inline, not only saved"


@pytest.mark.story
def test_beyond_names_measures_what_check_flags(tmp_path):
    """Step 6 on the demo data: each case labelled with check's code and its measured acceptance."""
    _run("06-beyond-names.ipynb", tmp_path, num_prompts=8)
    doc = json.loads((tmp_path / "beyond_names.json").read_text())
    cases = {c["name"]: c for c in doc["cases"]}
    top, nbr, fixed = cases["aux ids at top level"], cases["nbr draft"], cases["fixed draft"]
    assert fixed["flagged"] == "nothing" and fixed["accept_length"] >= 3.0
    assert top["flagged"] == "aux-layer-uncapturable" and top["accept_length"] is None and "distinct aux states" in top["error"]
    assert nbr["flagged"] == "norm-before-residual" and nbr["accept_length"] <= fixed["accept_length"] - 0.8
    assert (tmp_path / "beyond_names.png").stat().st_size > 1000
    executed = nbformat.read(tmp_path / "06-beyond-names.ipynb", as_version=4)
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the chart is shown inline"
    text = "".join(o.get("text", "") for o in outputs)
    assert "sglang==0.5.10: fix refuses: aux-layer-uncapturable" in text and "vllm: fix writes it: loads cleanly" in text
    # section 3: right names, initial values: check flags the values, compare lists the tensors, and
    # the measured acceptance is explained
    assert "parameters never written: 0 of 11" in text and "ERROR   weights-at-init: the decoder layer" in text
    assert "'different values': 10" in text and "how they differ: {'fresh initialisation': 10}" in text
    assert "fixed names: accept length" in text and "the draft works" in text
    assert "converted: accept length" in text and "the draft runs but predicts little" in text


def test_predicting_acceptance_walks_a_converter_no_rule_knows(tmp_path):
    """Notebook 07: a layer re-drawn from a law no rule lists; the prediction says it predicts nothing,
    compare says every changed tensor is a fresh initialisation, and the re-export is predicted and
    measured to work (the two agree: the reference backend computes what the prediction replays)."""
    _run("07-predict-acceptance.ipynb", tmp_path, num_prompts=8)
    rows = {r["draft"]: r for r in json.loads((tmp_path / "predict" / "predict.json").read_text())["runs"]}
    assert rows["converted"]["predicted"] < 1.3 and rows["re-export"]["predicted"] > 2.5
    for row in rows.values():
        assert abs(row["predicted"] - row["measured"]) < 1e-9
    executed = nbformat.read(tmp_path / "07-predict-acceptance.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    assert "ERROR   no-acceptance-predicted: predicted accept length 1." in text
    assert "how they differ: {'fresh initialisation': 10}" in text
    assert (tmp_path / "predict" / "predict.png").stat().st_size > 1000
