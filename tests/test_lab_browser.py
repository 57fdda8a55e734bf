"""JupyterLab in a real browser: the five notebooks run in Lab on the demo data with their
widgets on, driven in Debian's Chromium by Playwright, as a user would: open, Run All, type, pick.

Lab serves a temporary root holding copies of the notebooks with `interactive = True` (the committed
ones are never touched) beside a link to the repository's data/, so the notebooks' own relative
paths (../data/demo/..., ../runs/scratch) work unchanged. The tests run in file order: step 5
measures the draft that step 4 fixed. Screenshots: build/test-artifacts/lab/<notebook>.png.

Then every notebook again, its widgets on, on drafts whose tensor and folder names carry HTML that
would run a script and send a request, and a `$...$` MathJax would typeset: nothing of it may run,
load or be typeset; each name is shown as the text it is.

Without Chromium (or Playwright) the tests skip, saying how to get it; in CI (CI=true) they fail.
"""

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the browser fixture skips (or fails in CI), saying how to get it
    expect = sync_playwright = None

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.replay import replay
from draftdoctor.diagnose import check
from draftdoctor.lab import Lab
from draftdoctor.tables import tensor_frame
from draftdoctor.engines import resolve_engine

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "build" / "test-artifacts" / "lab"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Chromium on a closed network, as root: no sandbox, no background connections, a fresh profile.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DEMO_DRAFT = ROOT / "data" / "demo" / "draft-story"
RELEASE = "sglang==0.5.10"  # the notebooks' default engine release
KERNEL_TIMEOUT = 60  # seconds for a notebook's kernel to start
RUN_TIMEOUT = 120  # seconds for Run All (step 5 starts the reference server twice: ~15 s)
SAVE_TIMEOUT = 30  # seconds for Lab to save a notebook
WIDGET_TIMEOUT = 30  # seconds for a widget (or any expect) to show the kernel's answer to an input
# Lab's user settings for the test: no "get Jupyter news?" prompt over the screenshots, and no
# autosave: the test saves once, when the run is over, then reads the file.
SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
            "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False}}

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def _missing() -> str | None:
    if not os.access(CHROMIUM, os.X_OK):
        return f"Chromium not found at {CHROMIUM}: `make browser` installs Debian's chromium (apt-get, as root)"
    if sync_playwright is None:
        return "Playwright is not installed: `make setup` installs it"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    expect.set_options(timeout=WIDGET_TIMEOUT * 1000)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, browser):
    root = tmp_path_factory.mktemp("lab")
    (root / "notebooks").mkdir()
    (root / "data").symlink_to(ROOT / "data")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nbformat.write(_interactive(nbformat.read(path, as_version=4)), root / "notebooks" / path.name)
    state = root.parent / f"{root.name}-state"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(state / "config"), JUPYTER_DATA_DIR=str(state / "data"),
               JUPYTER_RUNTIME_DIR=str(state / "runtime"))
    for name, values in SETTINGS.items():
        target = state / "config" / "lab" / "user-settings" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in [*ARTIFACTS.glob("*.png"), ARTIFACTS / "jupyter.log"]:  # this run's only
        old.unlink(missing_ok=True)
    with Lab(root, ARTIFACTS / "jupyter.log", env=env) as server:
        yield server


def _interactive(book):
    """The notebook with `interactive = True` in its parameters cell, where it declares one."""
    [cell] = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
    cell.source = re.sub(r"^(interactive: bool = )False", r"\1True", cell.source, flags=re.M)
    return book


@pytest.fixture
def page(browser, lab, request):
    """A fresh browser tab; its screenshot is saved at the end (also when the test fails), then the
    notebook's kernel is shut down."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    crashes = []  # uncaught exceptions in Lab's front end (a widget that fails to render, say)
    tab.on("pageerror", lambda error: crashes.append(str(error)))
    yield tab
    number = next(part for part in request.node.name.split("_") if part.isdigit())  # test_03_... -> 03-*.ipynb
    stem = next(p.stem for p in (ROOT / "notebooks").glob(f"{number}-*.ipynb"))
    tab.screenshot(path=ARTIFACTS / f"{'hostile-' if 'hostile' in request.node.name else ''}{stem}.png")
    context.close()
    for session in _api(lab, "GET", "/api/sessions"):  # one kernel at a time on 2 cores
        _api(lab, "DELETE", f"/api/sessions/{session['id']}")
    assert not crashes, f"errors in the page: {crashes}"


def _api(lab, method, path):
    request = urllib.request.Request(lab.base_url + path, method=method,
                                     headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else None


def _wait(condition, timeout, message, poll=0.25):
    """condition()'s first true value; on timeout fail with message (a string, or a function giving one)."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"{message() if callable(message) else message} (after {timeout} s)")
        time.sleep(poll)
    return result


def _prompts(page):
    return page.locator(f"{PANEL} .jp-CodeCell .jp-InputPrompt").all_inner_texts()


def run_notebook(page, lab, name):
    """Open notebooks/<name> in Lab, Run All, save; return the saved notebook (nbformat).

    Fails with the cell, exception and message if a cell raised, or with the cells still running on
    a timeout. Waits on Lab's kernel state (the server's session, and the page's kernel indicator).
    """
    path = f"notebooks/{name}"
    page.goto(lab.url(path) + "&reset")  # reset: a fresh workspace, not the previous test's tabs

    def kernel_idle():
        sessions = [s for s in _api(lab, "GET", "/api/sessions") if s["path"] == path]
        return (sessions and sessions[0]["kernel"]["connections"] > 0 and sessions[0]["kernel"]["execution_state"] == "idle"
                and page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status=idle]").count() == 1
                and "| Idle" in page.locator("#jp-main-statusbar").inner_text())

    _wait(kernel_idle, KERNEL_TIMEOUT, f"{name}: the kernel did not start and go idle in Lab")
    page.keyboard.press("Control+b")  # hide the file browser: more notebook in the screenshot
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()

    def finished():  # no cell queued or running, every rendered one done, the kernel indicator idle
        # (Lab renders only the cells near the view: one scrolled far away has an empty prompt)
        prompts = [p for p in _prompts(page) if p]
        return (prompts and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts)
                and page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status=idle]").count() == 1)

    _wait(finished, RUN_TIMEOUT, lambda: f"{name}: Run All did not finish; code cells still queued or running: "
          f"{[i for i, p in enumerate(_prompts(page)) if p == '[*]:']} (prompts {_prompts(page)}, idle indicators "
          f"{page.locator(f'{PANEL} .jp-Notebook-ExecutionIndicator[data-status=idle]').count()})")

    # Read the notebook only after Lab's save answered: a read during the save can catch the file mid-write.
    with page.expect_response(lambda r: r.request.method == "PUT" and r.url.split("?")[0].endswith(path),
                              timeout=SAVE_TIMEOUT * 1000) as response:
        page.keyboard.press("Control+s")
    assert response.value.ok, f"{name}: Lab could not save the notebook: {response.value.status}"
    saved = nbformat.reads(json.dumps(_api(lab, "GET", f"/api/contents/{path}")["content"]), as_version=4)
    code = [c for c in saved.cells if c.cell_type == "code"]
    errors = [f"In [{c.execution_count}]: {o.ename}: {o.evalue}" for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{name}: " + "; ".join(errors)
    assert all(c.execution_count for c in code), f"{name}: not every code cell ran"
    return saved


def cell(page, index):
    """The index-th cell (markdown included) of the open notebook, scrolled into view: Lab draws only
    the cells in view (a cell scrolled away is an empty placeholder)."""
    located = page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(index)
    located.scroll_into_view_if_needed()
    return located


def show(locator):
    """Scroll the notebook so that `locator` is in the middle of the screenshot."""
    locator.evaluate("e => e.scrollIntoView({block: 'center'})")


def assert_widgets_rendered(page):
    """ipywidgets views drawn in the notebook, none left as a placeholder or an error."""
    text = page.locator(PANEL).inner_text()
    assert "Loading widget" not in text and "Error displaying widget" not in text, "a widget did not render"
    assert page.locator(f"{PANEL} .jupyter-widgets").count(), "no widget drawn: is the Lab extension (jupyterlab_widgets) there?"


def test_01_dump_keys_filter_narrows_the_key_table(page, lab):
    keys = tensor_frame(open_checkpoint(DEMO_DRAFT))
    layer = keys[keys["name"].str.contains("layers.0", regex=False)]
    assert 0 < len(layer) < len(keys)
    run_notebook(page, lab, "01-dump-keys.ipynb")

    table = cell(page, 2).locator(".jp-OutputArea-output table.dataframe tbody tr")
    assert table.count() == len(keys), "the key table lists every tensor"
    assert_widgets_rendered(page)
    box = page.get_by_placeholder("filter keys, e.g. layers.0 or proj")
    view = page.locator(f"{PANEL} .widget-vbox").filter(has=box)
    count = view.locator(".widget-label", has_text=re.compile(r"^\d+ of \d+ rows$"))
    rows = view.locator("table.dataframe tbody tr")
    expect(count).to_have_text(f"{len(keys)} of {len(keys)} rows")
    expect(rows).to_have_count(len(keys))
    box.press_sequentially("layers.0")
    # the label and the table update one after the other, once per keystroke: wait for both
    expect(count).to_have_text(f"{len(layer)} of {len(keys)} rows")
    expect(rows).to_have_count(len(layer))
    assert all("layers.0" in row for row in rows.all_inner_texts())
    show(view)


def test_02_compare_names_engine_picker_changes_the_verdict(page, lab):
    ckpt = open_checkpoint(DEMO_DRAFT)
    before, after = replay(ckpt, resolve_engine(RELEASE)).verdict, replay(ckpt, resolve_engine("sglang==0.5.23")).verdict
    assert before != after
    run_notebook(page, lab, "02-compare-names.ipynb")

    assert cell(page, 2).locator(".jp-OutputArea-output table.dataframe tbody tr").count() == len(ckpt.tensors)
    assert_widgets_rendered(page)
    view = page.locator(f"{PANEL} .widget-vbox").filter(has=page.locator(".widget-dropdown select"))
    picker = view.locator(".widget-dropdown select")
    verdict = view.locator(".widget-html")
    expect(picker).to_have_value(RELEASE)
    expect(verdict).to_have_text(f"verdict: {before}")
    picker.select_option("sglang==0.5.23")
    expect(verdict).to_have_text(f"verdict: {after}")
    show(view)


def test_03_load_coverage_shows_the_chart_and_verdict(page, lab):
    from draftdoctor.predict import PredictionSpec

    # the notebook's defaults: the replay, the demo's target, its prediction on 16 prompts x 48 tokens
    expected = check(str(DEMO_DRAFT), RELEASE, loader="replay", target=DEMO_DRAFT.parent / "target",
                     predict=PredictionSpec(DEMO_DRAFT.parent / "target", num_prompts=16, new_tokens=48))
    saved = run_notebook(page, lab, "03-load-coverage.ipynb")

    rows = cell(page, 2).locator(".jp-OutputArea-output table.dataframe tbody tr")
    assert rows.count() == len(expected.params_frame())
    chart = cell(page, 3).locator(".jp-OutputArea-output img")
    assert chart.evaluate("img => img.complete && img.naturalWidth") > 0, "the coverage chart is drawn"
    assert f"verdict: {expected.verdict}" in cell(page, 5).locator(".jp-OutputArea").inner_text()
    assert any("image/png" in o.get("data", {}) for c in saved.cells if c.cell_type == "code" for o in c.outputs)
    show(chart)


def test_04_apply_fix_verifies_the_fixed_draft(page, lab):
    run_notebook(page, lab, "04-apply-fix.ipynb")

    text = cell(page, 4).locator(".jp-OutputArea").inner_text()
    assert "problems: none" in text and "check on the written draft: loads cleanly" in text
    fixed = json.loads((lab.root / "runs" / "scratch" / "fix.json").read_text())
    fixed_report = replay(open_checkpoint(lab.root / "notebooks" / fixed["dst"]), resolve_engine(RELEASE))
    assert fixed_report.verdict.startswith("loads cleanly")
    show(cell(page, 4))


def test_05_relaunch_charts_acceptance_and_toggles_runs(page, lab):
    saved = run_notebook(page, lab, "05-relaunch-and-chart.ipynb")

    summary = cell(page, 2).locator(".jp-OutputArea-output table.dataframe tbody tr")
    expect(summary).to_have_count(2)
    # textContent, not innerText: Lab skips drawing cells out of view, and innerText of an undrawn row is ""
    rows = summary.evaluate_all("rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))")
    assert [row[1] for row in rows] == ["before", "after"], rows
    acceptance = next(i for i, c in enumerate(saved.cells) if c.source.startswith("acceptance_figure("))
    chart = cell(page, acceptance).locator(".jp-OutputArea-output img")
    expect(chart).to_have_count(1)
    assert chart.evaluate("img => img.complete && img.naturalWidth") > 0, "the acceptance chart is drawn"
    assert "image/png" in saved.cells[acceptance].outputs[0].data
    assert_widgets_rendered(page)
    view = page.locator(f"{PANEL} .widget-vbox").filter(has=page.locator(".widget-toggle-buttons"))
    toggle, shown = view.locator(".widget-toggle-buttons"), view.locator("table")
    expect(shown.locator("thead")).to_contain_text("before")
    toggle.get_by_role("button", name="after").click()
    expect(shown.locator("thead")).to_contain_text("after")
    show(chart)


# --- hostile names: shown as text, never run ------------------------------------------------------

BEACON = "ddbcn"  # in every URL a hostile name would make the page request
# A tensor name and a folder name (at most 50 characters: pandas shortens longer cells): an image whose
# failed load runs a script and whose address is a request, and math MathJax would typeset.
HOSTILE_TENSOR = f"<img src={BEACON}1 onerror=__dd=1>$x^2$"
HOSTILE_TRAINING = f"verifier_norm.<img src={BEACON}2 onerror=__dd=2>$x$"  # a training-only tensor: fix leaves it out
HOSTILE_FOLDER = f"<img src={BEACON}3 onerror=__dd=3>$y$"
# The same three dangers from a cell of the test's own, run last: proof that the page would show each
# (a script run, a request, a typeset formula) if a name carried it to the page as markup.
CONTROL = ("from IPython.display import HTML\n"
           f"HTML('<img src={BEACON}-control onerror=__ddcontrol=1><span id=dd-control>$z$</span>')")


def _add_tensor(folder: Path, name: str) -> Path:
    from safetensors.numpy import load_file

    from draftdoctor.synthwrite import write_safetensors

    [file] = folder.glob("*.safetensors")
    tensors = load_file(file)
    write_safetensors(file, {**tensors, name: tensors["norm.weight"].copy()})
    return folder


def _hostile_drafts(root: Path) -> dict:
    """The issue's attack (the story's draft fixed for SGLang 0.5.10, plus a tensor named as HTML), and the
    story's draft plus a hostile training-only tensor (fix writes it, so steps 4-6 run to the end), each in
    a folder named as HTML."""
    import shutil

    from draftdoctor.fix import apply_fix, plan_fix

    (root / "fixed").mkdir(parents=True)
    fixed = apply_fix(plan_fix(DEMO_DRAFT, RELEASE), root / "fixed" / HOSTILE_FOLDER).dst
    story = root / "data" / HOSTILE_FOLDER
    story.parent.mkdir()
    shutil.copytree(DEMO_DRAFT, story)
    for name in ("target", "prompts.jsonl", "draft-speculators", "draft-speculators-nbr"):
        (root / "data" / name).symlink_to(DEMO_DRAFT.parent / name)
    (root / "data" / "draft-story").symlink_to(story)
    return {"names": _add_tensor(Path(fixed), HOSTILE_TENSOR), "story": _add_tensor(story, HOSTILE_TRAINING),
            "data": root / "data"}


def _set_parameters(book, **values):
    [cell] = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
    for name, value in values.items():
        cell.source, found = re.subn(rf"^({name}: \w+ = ).*?(  #)", lambda m: f"{m[1]}{value!r}{m[2]}", cell.source,
                                     flags=re.M)
        assert found == 1, name
    return book


@pytest.fixture(scope="module")
def hostile_lab(tmp_path_factory, browser):
    root = tmp_path_factory.mktemp("hostile-lab")
    drafts = _hostile_drafts(root / "drafts")
    (root / "notebooks").mkdir()
    (root / "data").symlink_to(ROOT / "data")
    parameters = {"01": {"checkpoint": drafts["names"]}, "02": {"checkpoint": drafts["names"]},
                  "03": {"checkpoint": drafts["names"]}, "04": {"checkpoint": drafts["story"]},
                  "05": {"checkpoint": drafts["story"], "num_prompts": 4},
                  "06": {"data_dir": drafts["data"], "num_prompts": 4},
                  "07": {"data_dir": drafts["data"], "num_prompts": 4}}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        book = _interactive(nbformat.read(path, as_version=4))
        _set_parameters(book, **{k: str(v) if isinstance(v, Path) else v for k, v in parameters[path.name[:2]].items()})
        book.cells.append(nbformat.v4.new_code_cell(CONTROL))
        nbformat.write(book, root / "notebooks" / path.name)
    state = root.parent / f"{root.name}-state"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(state / "config"), JUPYTER_DATA_DIR=str(state / "data"),
               JUPYTER_RUNTIME_DIR=str(state / "runtime"))
    for name, values in SETTINGS.items():
        target = state / "config" / "lab" / "user-settings" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    with Lab(root, ARTIFACTS / "jupyter-hostile.log", env=env) as server:
        yield server


def run_hostile(page, lab, name) -> list[str]:
    """Run notebooks/<name> in Lab as `run_notebook` does, recording every request the page makes; then
    draw each cell (Lab draws only those in view) and wait until MathJax typeset the control cell's
    formula, so that whatever it would typeset has been. Returns the page's text and the requests."""
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    saved = run_notebook(page, lab, name)
    for index in range(len(saved.cells)):
        cell(page, index)
    control = page.locator(f"{PANEL} #dd-control")
    expect(control.locator("mjx-container")).to_have_count(1)
    return requests


def assert_shown_as_text(page, requests, name, *shown):
    """Nothing a hostile name carries ran, loaded or was typeset; the control cell's did all three, and
    each of `shown` is in the page as text."""
    assert page.evaluate("window.__ddcontrol") == 1 and any(f"{BEACON}-control" in u for u in requests), \
        "the control cell's markup did not run: the checks below would prove nothing"
    assert page.evaluate("typeof window.__dd") == "undefined", f"{name}: a script from a name ran"
    assert not [u for u in requests if BEACON in u and "control" not in u], f"{name}: a name sent a request"
    outputs = page.locator(f"{PANEL} .jp-OutputArea-output")
    typeset = outputs.locator("mjx-container").count() - 1  # the control's
    assert typeset == 0, f"{name}: {typeset} formula(s) from names were typeset as math"
    assert outputs.locator(f"img[src*={BEACON}]").count() == 1, f"{name}: a name became an image"
    text = page.locator(PANEL).text_content()
    for literal in shown:
        assert literal in text, f"{name}: {literal!r} is not shown as text"


def test_hostile_01_dump_keys(page, hostile_lab):
    requests = run_hostile(page, hostile_lab, "01-dump-keys.ipynb")
    box = page.get_by_placeholder("filter keys, e.g. layers.0 or proj")
    view = page.locator(f"{PANEL} .widget-vbox").filter(has=box)
    box.press_sequentially(BEACON)
    expect(view.locator("table.dataframe tbody tr")).to_have_count(1)
    expect(view.locator("table.dataframe tbody tr td").nth(1)).to_have_text(HOSTILE_TENSOR)
    assert_shown_as_text(page, requests, "01", HOSTILE_TENSOR, HOSTILE_FOLDER)


def test_hostile_02_compare_names(page, hostile_lab):
    requests = run_hostile(page, hostile_lab, "02-compare-names.ipynb")
    view = page.locator(f"{PANEL} .widget-vbox").filter(has=page.locator(".widget-dropdown select"))
    verdict = view.locator(".widget-html")
    expect(verdict).to_contain_text(HOSTILE_TENSOR)  # the verdict quotes the tensor the engine drops
    view.locator(".widget-dropdown select").select_option("sglang==0.5.23")
    expect(verdict).to_contain_text(HOSTILE_TENSOR)
    assert_shown_as_text(page, requests, "02", HOSTILE_TENSOR)


def test_hostile_03_load_coverage(page, hostile_lab):
    requests = run_hostile(page, hostile_lab, "03-load-coverage.ipynb")
    assert_shown_as_text(page, requests, "03", HOSTILE_TENSOR, HOSTILE_FOLDER)


def test_hostile_04_apply_fix(page, hostile_lab):
    requests = run_hostile(page, hostile_lab, "04-apply-fix.ipynb")
    assert_shown_as_text(page, requests, "04", HOSTILE_TRAINING, HOSTILE_FOLDER)


def test_hostile_05_relaunch_and_chart(page, hostile_lab):
    requests = run_hostile(page, hostile_lab, "05-relaunch-and-chart.ipynb")
    view = page.locator(f"{PANEL} .widget-vbox").filter(has=page.locator(".widget-toggle-buttons"))
    view.locator(".widget-toggle-buttons").get_by_role("button", name="after").click()
    expect(view.locator("table thead")).to_contain_text("after")
    assert_shown_as_text(page, requests, "05", HOSTILE_FOLDER)


def test_hostile_07_predict_acceptance(page, hostile_lab):
    """Its tables name the tensors that differ: the hostile training-only tensor is the same on both sides."""
    requests = run_hostile(page, hostile_lab, "07-predict-acceptance.ipynb")
    assert_shown_as_text(page, requests, "07")


def test_hostile_06_beyond_names(page, hostile_lab):
    """Its tables list what differs and what is flagged; the hostile tensor is neither, so no name is
    asserted shown: what it shows must still carry nothing that runs, loads or is typeset."""
    requests = run_hostile(page, hostile_lab, "06-beyond-names.ipynb")
    assert_shown_as_text(page, requests, "06")
