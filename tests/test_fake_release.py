"""One profile row and one serving row are all a new engine release needs: with a fake SGLang 0.6.x
added that way (and nothing else), the whole command line works with it.

The rows are added at interpreter start-up (a `sitecustomize` on PYTHONPATH), so every process the
CLI starts, the reference server included, sees the same profiles.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
ADD_ROWS = '''
import dataclasses
from draftdoctor.engines import sglang
silent = next(p for p in sglang.PROFILES if p.first == "0.4.9")  # midlayer, unknown keys skipped silently
sglang.PROFILES.append(dataclasses.replace(silent, first="0.6.0", last="0.6.2"))
sglang.SERVING.append(dataclasses.replace(sglang.SERVING[-1], first="0.6.0", last="0.6.2",
                                          spec_count_fields=("fake_accepted_drafts", "fake_proposed_drafts")))
'''


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    site = tmp_path_factory.mktemp("fake-release")
    (site / "sitecustomize.py").write_text(ADD_ROWS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "draftdoctor.cli", *map(str, args)], capture_output=True,
                              text=True, env=env, timeout=600)
    return run


def test_the_whole_cli_with_a_new_release(cli, tmp_path):
    unknown = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "check", DEMO / "draft-story", "--engine",
                              "sglang==0.6.1"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "newer than every release the kit knows" in unknown.stderr  # without the rows

    broken = cli("check", DEMO / "draft-story", "--engine", "sglang==0.6.1", "--target", DEMO / "target",
                 "--format", "json")
    assert broken.returncode == 1, broken.stderr
    report = json.loads(broken.stdout)
    # the new release's row places the draft; run on the target, it predicts what the dropped layer gives
    assert report["engine"] == "sglang==0.6.1" and "decoder layer left at initial values" in report["verdict"]
    assert report["prediction"]["predicts_nothing"] and report["prediction"]["accept_length"] < 1.1

    fixed = tmp_path / "fixed"
    done = cli("fix", DEMO / "draft-story", "--engine", "sglang==0.6.1", "--out", fixed)
    assert done.returncode == 0, done.stderr
    assert "for sglang==0.6.1" in done.stdout
    assert cli("check", fixed, "--engine", "sglang==0.6.1", "--target", DEMO / "target").returncode == 0

    out = tmp_path / "bench"
    bench = cli("bench", "--backend", "reference", "--engine", "sglang==0.6.1", "--target", DEMO / "target",
                "--draft", f"before={DEMO / 'draft-story'}", "--draft", f"after={fixed}",
                "--prompts", DEMO / "prompts.jsonl", "--num-prompts", 4, "--out", out)
    assert bench.returncode == 0, bench.stderr
    runs = {r["name"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert runs["before"]["accept_length"] <= 1.05 and runs["after"]["accept_length"] >= 2.0
    # the reference server wrote its counts under the new row's meta_info names, and the client read them
    assert runs["after"]["accepted_drafts"] > 0
