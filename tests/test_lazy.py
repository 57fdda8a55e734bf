"""What the kit loads on first use (draftdoctor.lazy): nbformat's import no longer builds a grammar it never
uses, and the one checker that would use it answers as the real module does."""

import json
import subprocess
import sys

IRIS = ["http://example.com/ä", "ht tp://x", "urn:isbn:0451450523", "//no-scheme", "http://[::1]:80/ü?q#f", ""]
CHECK = ("import json, sys; from jsonschema import FormatChecker; c = FormatChecker(); "
         f"print(json.dumps([c.conforms(i, 'iri') for i in {IRIS!r}] + [type(sys.modules['rfc3987_syntax']).__doc__]))")


def _run(code: str):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_reading_notebooks_builds_no_grammar_and_checks_iris_as_before():
    deferred = _run("import draftdoctor.investigate, nbformat, sys; "
                    "print(__import__('json').dumps(sys.modules['rfc3987_syntax'].__doc__))")
    assert "stand-in" in deferred, "nbformat's import loaded the grammar"
    real = _run(CHECK)
    lazy = _run("import draftdoctor.investigate; " + CHECK)
    assert real[:-1] == lazy[:-1] and True in real and False in real  # the same answers, both kinds among them
    assert "stand-in" not in (lazy[-1] or "")  # the first check loaded the real module in its place


def test_the_suite_says_its_time_per_tier(tmp_path):
    """`make test` prints, at each tier's end, what each marker cost: the 30-minute budget, visible."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_auxids.py"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stdout[-2000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("time per tier")]
    assert "the rest" in line and line.endswith(" s")
