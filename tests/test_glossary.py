"""Every field name the JSON outputs use is a word the glossary (docs/architecture.md) lists: the names
are collected from real runs of the commands, so a new field without its line fails here."""

import json
import re
from pathlib import Path

import pytest

from draftdoctor import report, runs
from draftdoctor.cli import main
from draftdoctor.diagnose import check
from draftdoctor.fix import apply_fix, plan_fix
from draftdoctor.toolstate import DEMO

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "sglang==0.5.10"
# values that are documents of another's words, not the kit's fields: the config.json an engine reads (as
# written, and a change's values), and compare's counts, keyed by each pair's status
FOREIGN = ("config/written", "config/changes[]/before", "config/changes[]/after", "counts")


def glossary_words() -> tuple[set[str], list[str]]:
    """The words docs/architecture.md's glossary lists (`code` or **bold**), and its patterns (`*_se`)."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
    words = set(re.findall(r"`([^`\s]+)`", text)) | set(re.findall(r"\*\*([^*]+)\*\*", text))
    return {w for w in words if "*" not in w}, [w for w in words if re.fullmatch(r"\*_[a-z]+|[a-z]+_\*", w)]


def field_names(doc, path="", found=None) -> dict[str, str]:
    """{field name: a path where it occurs} over a JSON document, FOREIGN values left out."""
    found = {} if found is None else found
    if isinstance(doc, dict):
        for key, value in doc.items():
            where = f"{path}/{key}".lstrip("/")
            found.setdefault(key, where)
            if not where.endswith(FOREIGN):
                field_names(value, where, found)
    elif isinstance(doc, list):
        for value in doc:
            field_names(value, f"{path}[]", found)
    return found


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Each JSON output of a real run: check, inspect, fix (plan, written, refused), compare, bench's
    results.json and an investigation's report.json (its steps' records made by the same functions)."""
    tmp = tmp_path_factory.mktemp("outputs")
    docs = {}

    def cli(name, *argv):
        out = tmp / f"{name}.txt"
        import contextlib
        import io

        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            main([str(a) for a in argv])
        out.write_text(buffer.getvalue())
        docs[name] = json.loads(buffer.getvalue())

    story, speculators, target = DEMO / "draft-story", DEMO / "draft-speculators", DEMO / "target"
    cli("inspect", "inspect", story, "--format", "json")
    cli("check", "check", story, "--engine", ENGINE, "--target", target, "--loader", "replay", "--num-prompts", 2,
        "--new-tokens", 8, "--format", "json")
    cli("fix --plan", "fix", story, "--engine", ENGINE, "--plan", "--format", "json")
    cli("fix", "fix", story, "--engine", ENGINE, "--target", target, "--no-predict", "--loader", "replay",
        "--out", tmp / "fixed", "--format", "json")
    cli("fix, refused", "fix", speculators, "--engine", "vllm==0.20.0", "--loader", "replay", "--out", tmp / "lossy",
        "--format", "json")
    cli("compare", "compare", story, speculators, "--target", target, "--format", "json")
    # bench into the run folder: its results.json is the investigation's step 05 record (runs.RESULTS)
    assert main(["bench", "--target", str(target), "--draft", f"before={story}", "--draft", f"after={tmp / 'fixed'}",
                 "--out", str(tmp / "run"), "--num-prompts", "2", "--max-new-tokens", "8"]) == 0
    docs["results.json"] = json.loads((tmp / "run" / "results.json").read_text())
    runs.record_coverage(tmp / "run", check(story, ENGINE, loader="replay", target=target, predict=False))
    plan = plan_fix(story, ENGINE, target=target, loader="replay", predict=False)
    runs.record_fix(tmp / "run", apply_fix(plan, tmp / "run" / "fixed"))
    docs["report.json"] = report.write_report(tmp / "run", {"name": "story", "checkpoint": str(story)}, None)
    return docs


def test_every_json_field_is_a_glossary_word(outputs):
    words, patterns = glossary_words()
    missing = {}
    for output, doc in outputs.items():
        for name, where in field_names(doc).items():
            if name not in words and not any(re.fullmatch(p.replace("*", "[a-z0-9]+(_[a-z0-9]+)*"), name) for p in patterns):
                missing.setdefault(name, f"{output}: {where}")
    assert not missing, "JSON fields the glossary does not list:\n" + "\n".join(
        f"  {name} ({where})" for name, where in sorted(missing.items()))


def test_the_collector_finds_nested_fields_and_leaves_foreign_ones_out():
    doc = {"a": [{"b": 1}], "config": {"written": {"hidden_size": 8}, "format": "flat"}, "counts": {"same bytes": 1}}
    assert set(field_names(doc)) == {"a", "b", "config", "written", "format", "counts"}
    words, patterns = glossary_words()
    assert "loader" in words and "made_up_field" not in words
    assert "*_se" in patterns and not any(re.fullmatch(p.replace("*", "[a-z0-9_]+"), "made_up_field") for p in patterns)
