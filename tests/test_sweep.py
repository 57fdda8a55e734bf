"""The release sweep's table (draftdoctor.proofs.sweep): the committed docs/releases/*.md are read by
people deciding which profile row to trust, so what a cell and a mark say must be exactly what ran."""

from types import SimpleNamespace

from draftdoctor import findings as F
from draftdoctor.proofs.sweep import ReleaseRow, letters, markdown


def report(*found):
    return SimpleNamespace(findings=list(found))


def test_letters_say_errors_in_upper_case_warnings_in_lower_and_ignore_info():
    assert letters(report()) == "ok"
    assert letters(report(F.finding("dropped-keys", "x"), F.finding("uninitialized-params", "y"))) == "DU"
    assert letters(report(F.finding("shape-mismatch", "z", severity="warning"))) == "s"
    assert letters(report(F.finding("dropped-keys", "x", severity="info"))) == "ok"


def test_the_table_has_one_row_per_release_run_and_marks_every_disagreement():
    rows = [
        ReleaseRow("0.5.9", "sglang 0.5.3–0.5.9", 7.1, {"llama/a": "DU", "public/b": "X"}, disagreements=["public/b"]),
        ReleaseRow("0.5.23", "sglang 0.5.17–0.5.23", 12.0, {"llama/a": "ok", "public/b": "C"}, not_modelled=["public/b"]),
        ReleaseRow("0.3.0", None, 1.0, error="ImportError: no module named sglang.srt"),
    ]
    text = markdown("sglang", rows, "today, some CPU")
    lines = [line for line in text.splitlines() if line.startswith("| 0.")]
    assert [line.split(" | ")[0] for line in lines] == ["| 0.5.9", "| 0.5.23", "| 0.3.0"]
    assert "| DU | X ≠ |" in lines[0] and "| ok | C ∅ |" in lines[1]
    assert "could not run: ImportError" in lines[2]
    assert "| release | profile row | s | llama/a | public/b |" in text
    assert "3 releases; 1 case(s) where the replay disagrees" in text and "today, some CPU" in text


def test_a_sweep_of_some_releases_puts_their_rows_into_the_table_and_keeps_the_others():
    """`--releases`: the table read back is the table written (cells, marks, errors); the releases run again
    replace their rows, a new one joins in release order, and a case the older rows never ran shows `–`."""
    from draftdoctor.proofs.sweep import merged, read_table

    old = [ReleaseRow("0.9.1", None, 1.0, {"llama/a": "X"}),
           ReleaseRow("0.32.0", "vllm 0.30.0–0.33.0", 5.0, {"llama/a": "ok"}, disagreements=["llama/a"]),
           ReleaseRow("0.10.0", None, 1.0, error="ImportError: x")]
    machine, back = read_table(markdown("vllm", old, "2026-12-03, a CPU"))
    assert machine == "2026-12-03, a CPU" and back == old
    new = [ReleaseRow("0.34.0", "vllm==0.34.0", 6.0, {"llama/a": "ok", "llama/peagle": "X"}),
           ReleaseRow("0.32.0", "vllm 0.30.0–0.33.0", 5.5, {"llama/a": "ok", "llama/peagle": "ok"})]
    rows = merged(back, new)
    assert [r.release for r in rows] == ["0.9.1", "0.10.0", "0.32.0", "0.34.0"] and rows[2] is new[1]
    lines = [line for line in markdown("vllm", rows, machine).splitlines() if line.startswith("| ")]
    assert lines[0] == "| release | profile row | s | llama/a | llama/peagle |"
    assert lines[1] == "| 0.9.1 | none (older) | 1.0 | X | – |" and lines[4] == "| 0.34.0 | vllm==0.34.0 | 6.0 | ok | X |"
