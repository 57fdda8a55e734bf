"""Prose that states a per-release fact says what the rows say: each sentence below is read from its doc with
a pattern whose groups are the releases it names, and compared with the same fact read from the engine rows
through the kit's own lookups (`releases_where`, the serving rows). A doc or a row changed alone fails here."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from draftdoctor import engines
from draftdoctor.engines import parse_version, releases_where, sglang

ROOT = Path(__file__).resolve().parents[1]


def _range(held) -> tuple[str, ...]:
    """The one release range whose rows hold `held`, as (first, last)."""
    ranges = releases_where(held)
    assert len(ranges) == 1, ranges
    first, _, last = ranges[0].partition(" ")[2].partition("–")
    return (first, last or first)


def accept_rate_first() -> tuple[str, ...]:
    """The first SGLang release whose "Decode batch" line logs an accept rate (serving rows)."""
    rows = [r for r in engines.all_serving() if r.engine == "sglang" and r.accept_rate_formula != "none"]
    return (min(rows, key=lambda r: parse_version(r.first)).first,)


def one_layer() -> tuple[str, ...]:
    """The SGLang releases that refuse more than one decoder layer (ONE_LAYER)."""
    return _range(lambda p: p.engine == "sglang" and p.build.single_layer_error == sglang.ONE_LAYER)


def identity_vocab_map() -> tuple[str, ...]:
    """The vLLM releases that always build the vocabulary map (zeros: the identity without a d2t)."""
    return _range(lambda p: p.engine == "vllm" and p.build.vocab_map_always)


def vllm_first_row() -> tuple[str, ...]:
    """The oldest vLLM release any row covers."""
    return (_range(lambda p: p.engine == "vllm")[0],)


def demo_fixed() -> tuple[str, ...]:
    """The demo's fixed draft's accept length as the README's measured demo prints it."""
    return (re.search(r"after the fix: accept length (\d\.\d\d)", (ROOT / "README.md").read_text()).group(1),)


# (file, pattern whose groups name the fact, the fact as the rows give it)
FACTS = [
    ("docs/engine-facts.md", r"`accept rate: \{:\.2f\}` from (\S+), with", accept_rate_first),
    ("docs/engine-facts.md", r"\n\| (\S+) – 0\.5\.10 \| L / k", accept_rate_first),
    ("docs/engine-facts.md", r"accept rate 0\.20\" means nothing was accepted, on (\S+)–0\.5\.10", accept_rate_first),
    ("docs/serving.md", r"SGLang (\S+)–0\.5\.10 log the accept rate as L/k", accept_rate_first),
    ("lib/draftdoctor/serving/logs.py", r"from (\S+), `accept rate`", accept_rate_first),
    ("lib/draftdoctor/serving/logs.py", r"\): (\S+)–0\.5\.10 log L / k", accept_rate_first),
    ("lib/draftdoctor/notebooks/05-relaunch-and-chart.ipynb", r"SGLang (\S+)–0\.5\.10 \*log\* L/k", accept_rate_first),
    ("docs/engine-facts.md", r"\n- (\S+)–(\S+) refuse `num_hidden_layers != 1`", one_layer),
    ("docs/architecture.md", r"\(vLLM (\S+)–(\S+)'s vocabulary map", identity_vocab_map),
    ("docs/real-loaders.md", r"\(vLLM (\S+)–(\S+)'s `draft_id_to_target_id`", identity_vocab_map),
    ("lib/draftdoctor/notebooks/03-load-coverage.ipynb", r"vLLM (\S+)–(\S+)'s vocabulary map", identity_vocab_map),
    ("docs/engine-facts.md", r"`draft_id_to_target_id` \(rows\): up to (\S+) it always exists",
     lambda: identity_vocab_map()[1:]),
    ("docs/research/vllm-eagle3-by-release.md", r"encodes releases from (\d[\w.]*\d)", vllm_first_row),
    ("docs/research/vllm-eagle3-by-release.md", r"Releases before (\d[\w.]*\d) have no row", vllm_first_row),
    ("lib/draftdoctor/explain.py", r"the demo's draft fixed for SGLang 0\.5\.10: (\d\.\d\d)", demo_fixed),
    ("docs/serving.md", r"fixed for SGLang 0\.5\.10: (\d\.\d\d)", demo_fixed),
    ("lib/draftdoctor/notebooks/05-relaunch-and-chart.ipynb", r"the demo's fixed draft: (\d\.\d\d)", demo_fixed),
]


def _text(name: str) -> str:
    """A file's prose: a notebook's cells joined, any other file as it is."""
    path = ROOT / name
    if path.suffix == ".ipynb":
        return "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"])
    return path.read_text()


def stated(text: str, pattern: str) -> list[tuple[str, ...]]:
    """What each sentence matching `pattern` states (its groups); none found is an error of the pattern."""
    found = [m.groups() for m in re.finditer(pattern, text)]
    assert found, f"no sentence matches {pattern!r}: the doc was reworded; update FACTS with it"
    return found


@pytest.mark.parametrize("name, pattern, fact", FACTS, ids=[f"{f[0]}:{f[2].__name__}" for f in FACTS])
def test_the_docs_state_what_the_rows_say(name, pattern, fact):
    expected, found = tuple(fact()), stated(_text(name), pattern)
    assert all(expected) and found == [expected] * len(found), (name, found, expected)


def test_a_doc_changed_alone_fails():
    """The patterns bind the stated release: another release in the sentence no longer equals the rows."""
    for name, pattern, fact in FACTS:
        text, expected = _text(name), tuple(fact())
        m = re.search(pattern, text)
        other = "9.99" if re.fullmatch(r"\d\.\d\d", m.group(1)) else "9.9.9"
        changed = text[:m.start(1)] + other + text[m.end(1):]
        assert stated(changed, pattern) != [expected] * len(stated(changed, pattern)), (name, pattern)


def test_a_row_changed_alone_fails(monkeypatch):
    """The facts are read from the rows: a row edited (the 0.5.4 serving row logging no rate; the first ONE_LAYER
    row refusing nothing; the 0.12.0 vLLM row without the vocabulary map) changes what the docs must say."""
    stated_before = {f.__name__: f() for f in (accept_rate_first, one_layer, identity_vocab_map)}
    serving = [dataclasses.replace(r, accept_rate_formula="none") if r.first == "0.5.4" else r for r in sglang.SERVING]
    monkeypatch.setattr(sglang, "SERVING", serving)
    first = sglang.PROFILES[0]
    monkeypatch.setattr(sglang, "PROFILES", [dataclasses.replace(first, single_layer_error=None), *sglang.PROFILES[1:]])
    from draftdoctor.engines import vllm
    monkeypatch.setattr(vllm, "PROFILES", [dataclasses.replace(p, vocab_map_always=False) if p.first == "0.12.0" else p
                                           for p in vllm.PROFILES])
    after = {f.__name__: f() for f in (accept_rate_first, one_layer, identity_vocab_map)}
    assert after == {"accept_rate_first": ("0.5.5",), "one_layer": ("0.4.9", "0.5.11"),
                     "identity_vocab_map": ("0.16.0", "0.29.0")}
    assert all(after[k] != stated_before[k] for k in after)


def test_every_finding_code_is_in_the_readme():
    """Codes are the kit's interface: each registered code has its row in README's "Finding codes" table."""
    from draftdoctor.findings import CODES

    table = (ROOT / "README.md").read_text().split("## Finding codes")[1].split("\n## ")[0]
    listed = {code for row in re.findall(r"^\| ([^|]+) \|", table, re.MULTILINE) for code in re.findall(r"`([a-z0-9-]+)`", row)}
    assert set(CODES) - listed == set()


# (file, the table's header line as it begins, engine when the first column names none, one line per row)
RELEASE_TABLES = [
    ("docs/engine-facts.md", "| releases (rows) | decoder module |", "sglang", False),
    ("docs/engine-facts.md", "| releases (rows) | builds |", None, False),
    ("docs/real-loaders.md", "| profile row (Llama class) |", None, True),
]


def table_ranges(text: str, header: str, engine: str | None) -> list[tuple[str, str, str]]:
    """The (engine, first, last) of each line of the table that begins with `header`."""
    lines = text[text.index(header):].splitlines()[2:]
    out = []
    for line in lines:
        if not line.startswith("|"):
            break
        cell = line.strip("|").split("|")[0].strip()
        name, _, span = cell.partition(" ") if engine is None else (engine, "", cell)
        first, _, last = (part.strip() for part in span.partition("–"))
        out.append((name, first, last or first))
    return out


@pytest.mark.parametrize("name, header, engine, exact", RELEASE_TABLES, ids=[t[1][2:30] for t in RELEASE_TABLES])
def test_every_release_range_in_a_docs_table_is_a_run_of_rows(name, header, engine, exact):
    """A table of release ranges splits where the rows split: each range begins at a row's first release and ends
    at a row's last, the ranges of one engine follow one another with no gap and cover its every row (one line per
    row where the table says it lists rows). A row added, or split, without its line in the docs fails here."""
    stated_ranges = table_ranges(_text(name), header, engine)
    assert stated_ranges, (name, header)
    for eng in dict.fromkeys(e for e, _, _ in stated_ranges):
        rows = sorted(((p.first, p.last) for p in engines.all_profiles()
                       if p.engine == eng and p.build.draft_class == "llama"), key=lambda r: parse_version(r[0]))
        spans = [(first, last) for e, first, last in stated_ranges if e == eng]
        if exact:
            assert spans == rows, (name, eng, spans, rows)
            continue
        firsts, lasts = [r[0] for r in rows], [r[1] for r in rows]
        assert spans[0][0] == firsts[0] and spans[-1][1] == lasts[-1], (name, eng, spans, rows)
        for (first, last), (following, _) in zip(spans, spans[1:] + [(None, None)]):
            assert first in firsts and last in lasts, (name, eng, first, last, rows)
            if following is not None:
                assert firsts.index(following) == lasts.index(last) + 1, (name, eng, last, following, rows)


def test_every_config_rule_cites_an_engine_facts_heading():
    """Each rule of `configrules.RULES` names the docs/engine-facts.md heading its fact comes from."""
    from draftdoctor.configrules import RULES

    headings = re.findall(r"^## (.+)$", (Path(__file__).resolve().parents[1] / "docs" / "engine-facts.md").read_text(),
                          re.MULTILINE)
    assert RULES and all(any(h.startswith(rule.cites) for h in headings) for rule in RULES)


def test_a_row_fact_lives_in_one_stage():
    """A row's fact given by its own name goes to the one stage record holding it and is read there, the row
    having no attribute of its own for it (a reader names the stage it depends on); a fact no stage holds is
    refused, so a misspelt fact cannot be dropped silently."""
    row = sglang.PROFILES[0]
    assert not hasattr(row, "single_layer_error") and not hasattr(row, "on_unmatched")
    changed = dataclasses.replace(row, single_layer_error=None, aux_capture_offset=0)
    assert (changed.build.single_layer_error, changed.aux.aux_capture_offset) == (None, 0)
    assert changed.keys == row.keys and changed.config == row.config
    with pytest.raises(TypeError, match="single_layer_eror"):
        dataclasses.replace(row, single_layer_eror=None)
    facts = [f.name for stage in engines.profile.STAGES.values() for f in dataclasses.fields(stage)]
    assert len(facts) == len(set(facts))  # no fact in two stages
