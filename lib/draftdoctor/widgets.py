"""ipywidgets views for exploring in JupyterLab, built on the same library functions as the
static outputs. Imported only when a notebook runs with `interactive=True` (widgets render
nothing headless)."""

from __future__ import annotations

import ipywidgets as w
from IPython.display import display


def key_filter(frame, column: str = "name"):
    """A text box that narrows a table to rows whose `column` contains the typed text."""
    box = w.Text(placeholder="filter keys, e.g. layers.0 or proj", description="filter")
    count = w.Label()
    out = w.Output()

    def refresh(_=None):
        shown = frame[frame[column].str.contains(box.value, regex=False)] if box.value else frame
        count.value = f"{len(shown)} of {len(frame)} rows"
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
    from .tables import loading_report

    picker = w.Dropdown(options=specs, value=initial or specs[0], description="engine")
    verdict = w.HTML()
    out = w.Output()

    def refresh(_=None):
        report = diagnose(checkpoint, picker.value)
        verdict.value = f"<b>verdict:</b> {report.verdict}"
        out.clear_output(wait=True)
        with out:
            display(loading_report(report))

    picker.observe(refresh, names="value")
    refresh()
    return w.VBox([picker, verdict, out])


def run_toggle(runs: list[dict]):
    """Toggle between benchmark runs (e.g. before / after the fix) to compare their numbers."""
    import pandas as pd

    toggle = w.ToggleButtons(options=[r["name"] for r in runs], description="run")
    out = w.Output()

    def refresh(_=None):
        run = next(r for r in runs if r["name"] == toggle.value)
        out.clear_output(wait=True)
        with out:
            display(pd.Series({k: v for k, v in run.items() if k != "request_log"}, name=run["name"]).to_frame())

    toggle.observe(refresh, names="value")
    refresh()
    return w.VBox([toggle, out])
