"""Log parsing on lines of each SGLang era and of vLLM, built from the engines' own format strings."""

import math

import pytest

from draftdoctor.serving.logs import parse_sglang_lines, parse_vllm_lines, sglang_rate_formula

# Format strings as the releases write them (0.4.8 scheduler.py; 0.5.10 scheduler_metrics_mixin.py;
# 0.5.23 metrics_reporter.py).
SGLANG_048 = ("[2025-06-01 10:00:00] Decode batch. #running-req: 1, #token: 90, token usage: 0.00, "
              "accept len: {L:.2f}, cuda graph: False, gen throughput (token/s): 24.80, #queue-req: 0")
SGLANG_0510 = ("[2026-01-10 10:00:00 TP0] Decode batch, #running-req: 1, #token: 90, token usage: 0.00, "
               "accept len: {L:.2f}, accept rate: {R:.2f}, cuda graph: False, gen throughput (token/s): 24.80, "
               "#queue-req: 0, ")
SGLANG_0523 = ("[2026-11-01 10:00:00 DP0 TP0] Decode batch [812], #running-req: 4, #token: 512, token usage: 0.01, "
               "accept len: {L:.2f}, accept rate: {R:.2f}, cuda graph: True, gen throughput (token/s): 310.55, "
               "#queue-req: 0, ")


def test_release_formulas():
    assert sglang_rate_formula("0.4.8") == "none"
    assert sglang_rate_formula("0.5.10") == "bonus"
    assert sglang_rate_formula("0.5.11") == "strict"
    assert sglang_rate_formula("0.5.4") == "bonus"  # read from 0.5.4.post3's scheduler_metrics_mixin.py


def test_the_story_line_is_zero_acceptance_on_0_5_10():
    """'accept len: 1.00, accept rate: 0.20' with 5 draft tokens: L/k = 0.20, strict 0.00."""
    df = parse_sglang_lines([SGLANG_0510.format(L=1.0, R=0.2)], release="0.5.10", num_draft_tokens=5)
    row = df.iloc[0]
    assert row.accept_length == 1.0 and row.accept_rate_logged == 0.2
    assert row.accept_rate_formula == "bonus" and row.accept_rate_strict == 0.0


@pytest.mark.parametrize("fmt, release, L, k, logged", [
    (SGLANG_048, "0.4.8", 3.2, 5, None),
    (SGLANG_0510, "0.5.10", 3.2, 5, 3.2 / 5),
    (SGLANG_0523, "0.5.23", 3.2, 5, (3.2 - 1) / 4),
])
def test_each_era(fmt, release, L, k, logged):
    lines = ["[2026-01-10 10:00:00] Prefill batch, #new-seq: 1", fmt.format(L=L, R=logged or 0), "noise"]
    df = parse_sglang_lines(lines, release=release, num_draft_tokens=k)
    assert len(df) == 1
    assert df.iloc[0].accept_length == pytest.approx(L)
    assert math.isclose(df.iloc[0].accept_rate_strict, (L - 1) / (k - 1), abs_tol=0.01)
    if logged is None:
        assert df.iloc[0].accept_rate_logged is None or math.isnan(df.iloc[0].accept_rate_logged)
    assert df.iloc[0].gen_throughput > 0


def test_strict_rate_taken_from_strict_release_without_k():
    df = parse_sglang_lines([SGLANG_0523.format(L=2.0, R=0.25)], release="0.5.23")
    assert df.iloc[0].accept_rate_strict == 0.25


@pytest.mark.parametrize("line", [
    # vLLM 0.33 order
    "INFO 11-01 10:00:00 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: "
    "30.00 tokens/s, Drafted throughput: 60.00 tokens/s, Accepted: 300 tokens, Drafted: 600 tokens, Per-position "
    "acceptance rate: 0.800, 0.500, 0.200, Avg Draft acceptance rate: 50.0%",
    # a fork's order: rate first, per-position last
    "SpecDecoding metrics: Avg Draft acceptance rate: 50.0%, Drafted: 600 tokens, Accepted: 300 tokens, "
    "Mean acceptance length: 2.50, Per-position acceptance rate: 0.800, 0.500, 0.200",
])
def test_vllm_lines_by_field_name(line):
    df = parse_vllm_lines([line, "INFO something else"])
    row = df.iloc[0]
    assert len(df) == 1 and row.accept_length == 2.5 and row.accepted == 300 and row.drafted == 600
    assert row.per_position == [0.8, 0.5, 0.2] and row.accept_rate_strict == 0.5
    assert row.draft_acceptance_pct == 50.0


@pytest.mark.parametrize("release", ["0.4.8", "0.5.10", "0.5.11", "0.5.23"])
def test_reference_lines_round_trip_through_the_parser(release):
    from draftdoctor.serving.logs import format_decode_line

    line = "[2026-11-30 10:00:00] " + format_decode_line(release, 1, 90, 0.0, 1.0, 5, 24.8)
    row = parse_sglang_lines([line], release=release, num_draft_tokens=5).iloc[0]
    assert row.accept_length == 1.0 and row.accept_rate_strict == 0.0
    if release == "0.5.10":
        assert "accept rate: 0.20" in line  # the story's line
    if release == "0.5.23":
        assert "accept rate: 0.00" in line


# -- against each installed release's own code ------------------------------------------------------------

from conftest import releases_under_test, require_release  # noqa: E402


def _decode_line_written_by(folder) -> str:
    """The "Decode batch" line a release's scheduler writes, read from its own source on CPU (SGLang does not
    serve here): the f-string pieces that build `msg`, from `Decode batch` to `#queue-req`, each `{...:.2f}`
    given 2.50, each other field 3."""
    import re

    writers = [p for p in (folder / "sglang" / "srt").rglob("*.py") if 'f"Decode batch' in p.read_text(errors="replace")]
    assert len(writers) == 1, writers
    lines = writers[0].read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if 'f"Decode batch' in line)
    pieces = []
    for line in lines[start:start + 80]:
        text = line.strip()
        if text.startswith('f"') or text.startswith(("msg = f", "msg += f")):
            pieces += re.findall(r'f"((?:[^"\\]|\\.)*)"', text)
        if "#queue-req" in text:
            break
    line = "".join(pieces).replace("{iter_msg}", "")  # the forward counter is logged only when asked for
    return re.sub(r"\{[^{}]*\}", lambda m: "2.50" if m.group().endswith(":.2f}") else "3", line)


@pytest.mark.parametrize("release", releases_under_test("sglang"))
def test_the_parser_reads_the_decode_line_each_release_writes(release):
    """What the kit parses and what its reference backend writes for a release match that release's own
    code: the line's head, accept len, and accept rate exactly where the row says the release logs one."""
    from draftdoctor.engines import serving_facts
    from draftdoctor.realload import release_env

    require_release(release)
    line = _decode_line_written_by(release_env(release))
    facts = serving_facts(release)
    assert line.startswith(facts.decode_line_head), line
    row = parse_sglang_lines([line], release=release, num_draft_tokens=4).iloc[0]
    assert row["accept_length"] == 2.5 and row["running_req"] == 3 and row["gen_throughput"] == 2.5, line
    logs_rate = "accept rate:" in line
    assert logs_rate == (facts.accept_rate_formula != "none"), (release, facts.accept_rate_formula, line)
    if logs_rate:
        assert row["accept_rate_logged"] == 2.5


@pytest.mark.parametrize("release", releases_under_test("sglang"))
def test_the_meta_info_counts_the_kit_reads_are_those_each_release_writes(release):
    """`/generate`'s meta_info draft counts (ServingFacts.spec_count_fields), read from the release's own
    tokenizer manager, which writes `meta_info["<field>"] = ...`; a release the row gives none writes neither."""
    import re

    from draftdoctor.engines import serving_facts
    from draftdoctor.realload import release_env

    require_release(release)
    source = (release_env(release) / "sglang" / "srt" / "managers" / "tokenizer_manager.py").read_text()
    written = set(re.findall(r'meta_info\["(spec_[a-z_]+)"\]\s*=', source))
    fields = serving_facts(release).spec_count_fields
    if fields is None:
        assert not written & {"spec_accept_token_num", "spec_draft_token_num", "spec_accepted_drafts",
                              "spec_proposed_drafts", "spec_num_correct_drafts", "spec_num_proposed_drafts"}, written
    else:
        assert set(fields) <= written, (release, fields, written)
