"""ipywidgets views for exploring in JupyterLab, built on the same library functions as the
static outputs. Imported only when a notebook runs with `interactive=True` (widgets render
nothing headless).

What a checkpoint, a config or an engine's message puts in a view is shown as text: tables are the
kit's DataFrames (`frames.frame`), and the one HTML widget holds only escaped text (`_as_text`).
"""

from __future__ import annotations

import html

import ipywidgets as w
from IPython.display import display

from .frames import frame

# MathJax (run over widgets and HTML outputs by JupyterLab) skips elements of these classes
NO_MATH = "tex2jax_ignore mathjax_ignore"


def _as_text(label: str, text: str) -> str:
    """HTML showing `label` in bold and `text` as it is: no tag, entity or `$...$` of it is interpreted."""
    return f'<b>{html.escape(label)}</b> <span class="{NO_MATH}">{html.escape(str(text))}</span>'


def key_filter(table, column: str = "name"):
    """A text box that narrows a table to rows whose `column` contains the typed text."""
    box = w.Text(placeholder="filter keys, e.g. layers.0 or proj", description="filter")
    count = w.Label()
    out = w.Output()

    def refresh(_=None):
        shown = table[table[column].str.contains(box.value, regex=False)] if box.value else table
        count.value = f"{len(shown)} of {len(table)} rows"
        out.clear_output(wait=True)
        with out:
            display(shown)

    box.observe(refresh, names="value")
    refresh()
    return w.VBox([w.HBox([box, count]), out])


def engine_picker(checkpoint, specs: list[str], initial: str | None = None):
    """A release picker that re-runs the one verdict (`diagnose`, the replayed loader) for the picked release
    and shows it with its loading report."""
    from .diagnose import diagnose
    from .engines import resolve_engine
    from .tables import loading_report

    picker = w.Dropdown(options=specs, value=initial or specs[0], description="engine")
    verdict = w.HTML()
    out = w.Output()

    def refresh(_=None):
        report = diagnose(checkpoint, resolve_engine(picker.value))  # the picked spec, resolved here
        verdict.value = _as_text("verdict:", report.verdict)  # the verdict quotes tensor names
        out.clear_output(wait=True)
        with out:
            display(loading_report(report))

    picker.observe(refresh, names="value")
    refresh()
    return w.VBox([picker, verdict, out])


def run_toggle(runs: list[dict]):
    """Toggle between benchmark runs (e.g. before / after the fix) to compare their numbers."""
    toggle = w.ToggleButtons(options=[r["name"] for r in runs], description="run")
    out = w.Output()

    def refresh(_=None):
        run = next(r for r in runs if r["name"] == toggle.value)
        out.clear_output(wait=True)
        with out:
            display(frame({run["name"]: {k: v for k, v in run.items() if k != "request_log"}}))

    toggle.observe(refresh, names="value")
    refresh()
    return w.VBox([toggle, out])
