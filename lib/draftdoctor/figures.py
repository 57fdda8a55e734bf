"""Figures for notebooks and reports: load coverage and acceptance before/after.

Functions return matplotlib Figures and never show them; callers save or display. The Agg canvas
is used directly so that no GUI backend is ever needed.
"""

from __future__ import annotations

from .statuses import ParamFate

STATUS_COLORS = {
    ParamFate.WRITTEN: "#2a9d8f", ParamFate.FROM_TARGET: "#8ab17d", ParamFate.IDENTITY: "#a8dadc",
    ParamFate.PARTIAL: "#e9c46a", ParamFate.UNINITIALIZED: "#e76f51", ParamFate.MISMATCH: "#9b2226",
}


def _plain(text) -> str:
    """`text` drawn as it is: matplotlib reads a `$...$` in a label as mathtext (and fails to draw a
    malformed one), so every `$` of a name is escaped."""
    return str(text).replace("$", r"\$")


def _figure(width: float, height: float, ncols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


def coverage_figure(report):
    """One bar per engine parameter (size in bytes, log scale), coloured by what the loader did."""
    params = list(report.params)
    fig, ax = _figure(8, 0.3 * len(params) + 1.4)
    names = [_plain(p.name) for p in params][::-1]
    sizes = [max(p.nbytes, 1) for p in params][::-1]
    colors = [STATUS_COLORS.get(p.status, "grey") for p in params][::-1]
    ax.barh(names, sizes, color=colors)
    ax.set_xscale("log")
    ax.set_xlabel("bytes")
    ax.set_title(f"{report.engine} ({report.loader}): {len(report.uninitialized)} of {len(params)} parameters "
                 "left at initial values", fontsize=9)
    from matplotlib.patches import Patch

    present = [s for s in STATUS_COLORS if any(p.status == s for p in params)]
    fig.legend(handles=[Patch(color=STATUS_COLORS[s], label=s) for s in present], loc="outside lower center",
               ncols=len(present), fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    return fig


def acceptance_figure(runs: list[dict]):
    """Accept length and strict accept rate per run (e.g. before / after the fix)."""
    fig, (ax_len, ax_rate) = _figure(8, 3.2, ncols=2)
    names = [_plain(r["name"]) for r in runs]
    lengths = [r.get("accept_length") or 0 for r in runs]
    rates = [r.get("accept_rate") or 0 for r in runs]
    palette = ["#e76f51", "#2a9d8f", "#264653", "#e9c46a"]
    colors = [palette[i % len(palette)] for i in range(len(runs))]
    ax_len.bar(names, lengths, color=colors)
    ax_len.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax_len.set_ylabel("accept length (tokens / verify step)")
    ax_len.set_ylim(0, max(lengths + [1.0]) * 1.25)
    for i, (v, run) in enumerate(zip(lengths, runs)):
        ax_len.text(i, v, "did not start" if run.get("failure") else f"{v:.2f}", ha="center", va="bottom")
    ax_rate.bar(names, rates, color=colors)
    ax_rate.set_ylabel("strict accept rate (accepted / drafted)")
    ax_rate.set_ylim(0, 1.05)
    for i, v in enumerate(rates):
        ax_rate.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    fig.suptitle("acceptance per draft (dashed: no draft token accepted)", fontsize=10)
    return fig


def per_position_figure(runs: list[dict]):
    """Acceptance at each draft position, one line per run (runs without the data are skipped)."""
    fig, ax = _figure(6, 3.2)
    for r in runs:
        rates = r.get("per_position")
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=_plain(r["name"]))
    ax.set_xlabel("draft position")
    ax.set_ylabel("share of verify steps accepting it")
    ax.set_ylim(0, 1.05)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    return fig


def beyond_names_figure(rows: list[dict]):
    """Accept length per case, labelled with what `check` flags, and acceptance per draft position.

    Rows: {name, flagged, accept_length, per_position, error}; a case with an error and no accept
    length is marked as not running rather than drawn as zero."""
    fig, (ax_len, ax_pos) = _figure(11, 0.45 * len(rows) + 2.2, ncols=2)
    palette = ["#2a9d8f", "#e76f51", "#e9c46a", "#264653", "#8ab17d"]
    top = max([r.get("accept_length") or 0 for r in rows] + [1.0]) * 1.3
    for i, r in enumerate(rows):
        y, color = len(rows) - 1 - i, palette[i % len(palette)]
        if r.get("accept_length") is None:
            ax_len.text(0.05, y, "cannot run", va="center", color="#9b2226")
            continue
        ax_len.barh(y, r["accept_length"], color=color)
        ax_len.text(r["accept_length"], y, f" {r['accept_length']:.2f}", va="center")
        positions = range(1, len(r["per_position"]) + 1)
        ax_pos.plot(positions, r["per_position"], marker="o", color=color, label=_plain(r["name"]))
        ax_pos.set_xticks(list(positions))
    ax_len.set_yticks(range(len(rows))[::-1], [_plain(f"{r['name']}\ncheck: {r['flagged']}") for r in rows], fontsize=8)
    ax_len.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax_len.set_xlim(0, top)
    ax_len.set_xlabel("accept length (tokens / verify step; dashed: nothing accepted)")
    ax_pos.set_xlabel("draft position")
    ax_pos.set_ylabel("share of verify steps accepting it")
    ax_pos.set_ylim(0, 1.05)
    ax_pos.legend(fontsize=7)
    fig.suptitle("names right, every parameter loaded: what check flags, and what it costs", fontsize=10)
    return fig


def throughput_figure(runs: list[dict]):
    """Output tokens per second per run."""
    fig, ax = _figure(5, 3.2)
    names = [_plain(r["name"]) for r in runs]
    values = [r.get("tokens_per_s") or 0 for r in runs]
    ax.bar(names, values, color="#264653")
    ax.set_ylabel("output tokens / s")
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom")
    return fig


def predicted_figure(rows: list[dict]):
    """Accept length predicted before serving (with its standard error) beside the one measured, per
    draft. Rows: {draft, predicted, "predicted ±", measured}."""
    fig, ax = _figure(6, 3.2)
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["predicted"] for r in rows], 0.4, yerr=[r["predicted ±"] for r in rows],
           color="#8ab17d", label="predicted (before serving)", capsize=3)
    ax.bar([x + 0.2 for x in xs], [r["measured"] or 0 for r in rows], 0.4, color="#264653", label="measured (served)")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(list(xs), [_plain(r["draft"]) for r in rows])
    ax.set_ylabel("accept length (tokens / verify step)")
    ax.set_ylim(0, max([r["predicted"] for r in rows] + [r["measured"] or 0 for r in rows] + [1.0]) * 1.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("the draft as the engine loads it: predicted, then measured", fontsize=10)
    return fig


def backends_figure(runs: list[dict]):
    """The same drafts on several backends: accept length per draft, one bar per backend, and
    per-position acceptance (one line per backend and draft). Runs are bench summaries; a backend is
    told apart by its `backend_label`."""
    fig, (ax_len, ax_pos) = _figure(11, 3.4, ncols=2)
    backends = list(dict.fromkeys(r.get("backend_label") or r["backend"] for r in runs))
    names = list(dict.fromkeys(r["name"] for r in runs))
    palette = ["#2a9d8f", "#e76f51", "#264653", "#e9c46a"]
    width = 0.8 / len(backends)
    for b, backend in enumerate(backends):
        mine = {r["name"]: r for r in runs if (r.get("backend_label") or r["backend"]) == backend}
        xs = [i + (b - (len(backends) - 1) / 2) * width for i in range(len(names))]
        values = [(mine.get(n) or {}).get("accept_length") or 0 for n in names]
        ax_len.bar(xs, values, width, color=palette[b % len(palette)], label=_plain(backend))
        for x, v in zip(xs, values):
            ax_len.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        for n, style in zip(names, ("--", "-", ":", "-.")):
            rates = (mine.get(n) or {}).get("per_position")
            if rates:
                ax_pos.plot(range(1, len(rates) + 1), rates, style, marker="o", color=palette[b % len(palette)],
                            label=_plain(f"{n}: {backend}"))
                ax_pos.set_xticks(range(1, len(rates) + 1))
    ax_len.set_xticks(range(len(names)), list(map(_plain, names)))
    ax_len.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax_len.set_ylabel("accept length (tokens / verify step)")
    ax_len.set_ylim(0, max([r.get("accept_length") or 0 for r in runs] + [1.0]) * 1.3)
    ax_len.legend(fontsize=7, loc="upper left")
    ax_pos.set_xlabel("draft position")
    ax_pos.set_ylabel("share of verify steps accepting it")
    ax_pos.set_ylim(0, 1.05)
    ax_pos.legend(fontsize=6)
    fig.suptitle("the same drafts, prompts and steps on each backend", fontsize=10)
    return fig


def save(fig, path) -> None:
    """Write `fig` as a PNG at `path`, whole or not at all: written beside it, then renamed (a full disk
    had left a 0-byte chart)."""
    import os
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # a notebook run alone, before the step that makes its folder
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        fig.savefig(partial, dpi=110, format="png")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
