"""Serving as rows: every backend is a row (serving.backends) and a module with
the same functions; the launcher, bench and the CLI read rows, never a backend's name, so a fifth
backend is a row and its module."""

import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftdoctor.serving import backends, launcher, reference
from draftdoctor.serving.bench import BenchInputError, bench_drafts

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
INTERFACE = ("ROW", "command", "launch", "refusal", "not_serving", "backend_label", "run_bench", "sent_prompts",
             "cannot_serve_as", "served_draft", "resolve")


def test_every_row_has_a_module_with_the_whole_interface():
    assert set(launcher.MODULES) == set(backends.BACKENDS)
    for name, module in launcher.MODULES.items():
        assert module.ROW is backends.BACKENDS[name]
        assert [f for f in INTERFACE if not hasattr(module, f)] == [], name


def test_no_code_asks_which_backend_it_is():
    """What differs by backend is in its row or its module, nowhere else."""
    asked = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in (ROOT / "lib").rglob("*.py")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bbackend\s*(==|!=|in\s*\(|not in\s*\()", line)]
    assert asked == []


def test_a_fifth_backend_is_a_row_and_its_module(tmp_path, monkeypatch):
    """A made-up backend (the reference server under another row) is launched, measured and labelled
    by bench from its row and module alone."""
    row = replace(reference.ROW, name="fifth", display="a fifth backend", max_requests=2)
    module = SimpleNamespace(**{name: getattr(reference, name) for name in INTERFACE})
    module.ROW, module.backend_label = row, (lambda engine=None: "a fifth backend (the reference server)")
    monkeypatch.setitem(backends.BACKENDS, "fifth", row)
    monkeypatch.setitem(launcher.MODULES, "fifth", module)
    prompts = ["Once upon a time", "The little dog"]
    runs = bench_drafts("fifth", str(DEMO / "target"), [("story", str(DEMO / "draft-story"))], tmp_path, prompts,
                        max_new_tokens=16)
    assert runs[0].backend == "fifth" and runs[0].label == "a fifth backend (the reference server)"
    assert len(runs[0].result.requests) == 2 and runs[0].result.accept_length >= 1.0
    with pytest.raises(BenchInputError, match="at most 2 requests at once on a fifth backend"):
        bench_drafts("fifth", str(DEMO / "target"), [("story", str(DEMO / "draft-story"))], tmp_path / "x", prompts,
                     concurrency=3)
