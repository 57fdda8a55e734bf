"""llama.cpp, the third engine: its converter and loader as a real loader, its server as a
backend that refuses to run a draft without speculation, its silent failures caught from headers and
config before serving, and the reference backend emulating it giving its own counters. Needs `make
llamacpp` (run by `make test`)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_release

from draftdoctor.diagnose import check
from draftdoctor.synth import write_draft
from draftdoctor.engines import resolve_engine

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
ENGINE = "llamacpp==0.3.36"
PROMPTS = [json.loads(line)["prompt"] for line in (DEMO / "prompts.jsonl").read_text().splitlines()][:16]


@pytest.fixture(scope="module")
def built():
    require_release("0.3.36", "llamacpp")


def test_aux_ids_only_in_eagle_config_are_flagged_before_serving():
    """SpecForge writes the ids only under eagle_config (SGLang's place): llama.cpp's converter ignores them
    and captures its defaults, silently; `check` says so, with the layers it will capture instead."""
    report = check(DEMO / "draft-story", ENGINE, target=DEMO / "target")
    [finding] = [f for f in report.findings if f.code == "aux-layer-ids"]
    assert finding.severity == "error" and "[2, 3, 3]" in finding.message and "eagle_config" in finding.message
    assert check(DEMO / "draft-speculators", ENGINE, target=DEMO / "target").verdict.startswith("loads cleanly")


def test_the_replay_knows_what_fails_loudly_and_when(tmp_path):
    """fc.bias converts, then the load fails; a missing hidden_norm likewise; an unknown key stops the converter."""
    h = 64
    cases = {"fc-bias": dict(extra={"fc.bias": np.zeros(h, dtype=np.float16)}),
             "no-hidden-norm": dict(drop=("layers.0.hidden_norm.weight",)),
             "q-norm": dict(qk_norm=True)}
    for name, spec in cases.items():
        report = check(write_draft(tmp_path / name, layout="speculators", **spec), ENGINE, loader="replay")
        assert "loader-crash" in {f.code for f in report.errors}, (name, report.verdict)
    missing = check(write_draft(tmp_path / "m", layout="speculators", drop=("layers.0.hidden_norm.weight",)), ENGINE,
                    loader="replay")
    assert "blk.0.attn_norm_2.weight" in missing.verdict


def test_the_real_converter_and_loader_agree_with_the_replay(built, tmp_path):
    from draftdoctor.proofs import differential
    from draftdoctor.checkpoint import open_checkpoint
    from draftdoctor.replay import replay
    from draftdoctor.realcheck import real_checks

    cases = differential.write_cases(tmp_path, "llamacpp")
    reals = real_checks(list(cases.values()), resolve_engine(ENGINE), timeout=1800)
    found = []
    for (name, folder), real in zip(cases.items(), reals):
        found += differential.disagreements(name, replay(open_checkpoint(folder), resolve_engine(ENGINE)), real,
                                            resolve_engine(ENGINE), folder)
    assert not found, "\n".join(found)


def test_a_draft_launch_without_speculation_is_refused(built, tmp_path):
    """`-md` without `--spec-type draft-eagle3`: llama-server would load the draft and not speculate."""
    from draftdoctor.serving.launcher import LaunchRefused, ServeConfig, serve

    config = ServeConfig(target=str(DEMO / "target"), draft=str(DEMO / "draft-speculators"),
                         extra_args=["--spec-type", "none"])
    with pytest.raises(LaunchRefused, match="would load the draft and not speculate"):
        serve("llamacpp", config, tmp_path / "server.log")
    assert not (tmp_path / "server.log").exists()


def test_bench_on_llamacpp_measures_the_fixed_draft(built, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "bench", "--backend", "llamacpp", "--target",
                           str(DEMO / "target"), "--draft", f"after={DEMO / 'draft-speculators'}", "--out",
                           str(tmp_path / "bench"), "--num-prompts", "16"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run] = json.loads((tmp_path / "bench" / "results.json").read_text())["runs"]
    assert run["accept_length"] >= 2.0 and run["backend"] == "llamacpp" and run["requests"] == 16
    assert "llama.cpp 0c1e570" in proc.stdout and "real engine, CPU" in proc.stdout


def test_reference_backend_agrees_with_llamacpp(built, tmp_path):
    from draftdoctor.proofs.agreement import compare_with_llamacpp, prompt_ids

    ids = prompt_ids(DEMO / "target", PROMPTS)
    agreement = compare_with_llamacpp(DEMO / "target", DEMO / "draft-speculators", ids, tmp_path)
    assert agreement.real.accept_length > 2.0
    assert agreement.length_gap <= 0.1 and agreement.position_gap <= 0.05, (agreement.reference, agreement.real)
    assert agreement.same_outputs == len(PROMPTS)
    # 5 new tokens: llama.cpp drafts at most the budget left minus one, so never a fourth draft here
    short = compare_with_llamacpp(DEMO / "target", DEMO / "draft-speculators", ids, tmp_path, max_new_tokens=5)
    assert short.real.per_position[3] == short.reference.per_position[3] == 0.0 and short.real.per_position[2] > 0
    assert short.length_gap <= 0.1 and short.position_gap <= 0.05, (short.reference, short.real)


def test_a_target_passed_as_the_draft_is_refused_in_seconds(built):
    """Reliability III item 8: llama.cpp's converter reads a full Llama model as a model of its own, and
    llama-server would serve it (the check ran until its 120 s time-out, then printed a squashed
    traceback): it is refused at once, as the replay refuses it, one verdict."""
    import time

    from draftdoctor.diagnose import check

    started = time.monotonic()
    real = check(DEMO / "target", "llamacpp==0.3.36", loader="real")
    assert time.monotonic() - started < 60
    assert real.loader == "real" and "not an EAGLE-3 draft" in real.verdict
    assert {f.code for f in real.errors} & {f.code for f in check(DEMO / "target", "llamacpp==0.3.36").errors} \
        >= {"loader-crash"}
