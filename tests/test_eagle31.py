"""EAGLE 3.1 drafts (per-aux norms before fc, the output norm) per engine release (docs/engine-facts.md:
"EAGLE 3.1"): what each release does with them, said by `check` (skipped without a word: the draft computes
without its norms; refused: the server does not start; the flag ignored), and what `fix` does: writes the
switch a release needs, the one name every release reads, and refuses, saying why, where a release cannot
compute them. The engines' own loaders are held to the replay on the same layouts by
tests/test_differential.py and tests/test_llamacpp.py (the differential corpus's EAGLE 3.1 cases)."""

import json
import re

import numpy as np
import pytest
from conftest import require_release

from draftdoctor.cli import main
from draftdoctor.diagnose import check
from draftdoctor.synth import edit_config

H = 64
EAGLE31 = {"fc_norm": True, "norm_output": True}  # as SpecForge's EAGLE 3.1 template sets them


def norms(names) -> dict:
    """Trained-looking norm weights (around 1, not the constant a fresh norm holds)."""
    rng = np.random.default_rng(0)
    return {n: (1 + 0.1 * rng.standard_normal(H)).astype(np.float16) for n in names}


FC_NORM = [f"fc_norm.{i}.weight" for i in range(3)]


def specforge_31(draft, names=FC_NORM, **config):
    """SpecForge's EAGLE 3.1 export: flat config, midlayer.*, fc_norm.{0,1,2} [Ht], the two switches."""
    return edit_config(draft("midlayer", extra=norms(names)), **({**EAGLE31, **config}))


def codes(report, severity="error"):
    return {f.code for f in report.findings if f.severity == severity}


def said(report, code):
    return next(f.message for f in report.findings if f.code == code)


def cli(capsys, *args):
    code = main([str(a) for a in args])
    return code, capsys.readouterr().out


# what each release does with SpecForge's EAGLE 3.1 export, from its own source (docs/engine-facts.md)
FATES = {
    "sglang==0.4.8.post1": "fc_norm.2.weight with a warning: the draft computes without its per-aux norms",
    "sglang==0.5.10": "skips fc_norm.0.weight, fc_norm.1.weight, fc_norm.2.weight without a word: the draft computes "
                      "without its per-aux norms",
    "sglang==0.5.12.post1": None, "sglang==0.5.23": None,
    "vllm==0.21.0": "loading fails on fc_norm.0.weight, which matches no parameter there: the server does not start",
    "vllm==0.22.0": None, "vllm==0.32.0": None,
    "llamacpp==0.3.36": "loading fails on fc_norm.0.weight, which matches no parameter there: the server does not start",
}
# the first release of each engine that computes them (FATES), to whichever newest release the rows know
COMPUTE = re.compile(r"releases that compute it: sglang 0\.5\.12–[0-9.]+, vllm 0\.22\.0–[0-9.]+")


@pytest.mark.parametrize("engine", FATES)
def test_check_says_what_each_release_does_with_the_norms(draft, engine):
    src = specforge_31(draft)
    report = check(src, engine, loader="replay")
    fate, computes = FATES[engine], FATES[engine] is None
    assert ("fc-norm-unsupported" in codes(report)) != computes, report.verdict
    assert ("norm-output-unsupported" in codes(report)) != computes
    if not computes:
        assert fate in said(report, "fc-norm-unsupported")
        assert COMPUTE.search(said(report, "fc-norm-unsupported")), said(report, "fc-norm-unsupported")
        assert "feeds the pre-norm state back" in said(report, "norm-output-unsupported")
    # SpecForge changed what norm_output means; nothing in the checkpoint says which it was trained with
    assert "norm-output-ambiguous" in codes(report, "warning")
    assert ("feeds the post-norm state back" in said(report, "norm-output-ambiguous")) == computes


def test_the_switch_without_its_tensors_is_ignored_or_left_at_ones(draft):
    """speculators' converter keeps fc_norm: true and drops the weights: releases without fc_norm ignore the
    switch; those with it build the norms and serve them at their initial ones."""
    src = edit_config(draft("midlayer"), fc_norm=True)
    assert "it ignores the flag: the draft computes without its per-aux norms" in said(
        check(src, "sglang==0.5.10", loader="replay"), "fc-norm-unsupported")
    for engine in ("sglang==0.5.23", "vllm==0.32.0"):
        report = check(src, engine, loader="replay")
        assert "model.fc_norm.0.weight" in said(report, "uninitialized-params")
        assert "fc-norm-unsupported" not in codes(report)


@pytest.mark.parametrize("engine", ["sglang==0.5.23", "vllm==0.32.0", "vllm==0.22.0"])
def test_the_tensors_without_their_switch_are_flagged_and_fix_writes_it(draft, tmp_path, capsys, engine):
    """A release that builds fc_norm only with its switch: SGLang skips the keys without a word, vLLM refuses
    them. `fix` sets the switch where the release reads it (vLLM 0.22: inside transformer_layer_config) and the
    fixed draft loads every norm (with the release's own loader where it is installed)."""
    src = draft("midlayer", extra=norms(FC_NORM))
    report = check(src, engine, loader="replay")
    assert "norm-flag-missing" in codes(report)
    assert ("skips fc_norm.0.weight" in said(report, "norm-flag-missing")) == engine.startswith("sglang")
    assert ("the server does not start" in said(report, "norm-flag-missing")) == engine.startswith("vllm")
    code, planned = cli(capsys, "fix", src, "--engine", engine, "--plan", "--loader", "replay")
    assert code == 0 and "fc_norm: <absent> -> true" in planned, planned
    out_dir = tmp_path / "fixed"
    code, out = cli(capsys, "fix", src, "--engine", engine, "--out", out_dir, "--loader", "replay")
    assert code == 0, out
    written = json.loads((out_dir / "config.json").read_text())
    assert written.get("fc_norm") is True or written["transformer_layer_config"].get("fc_norm") is True
    name, release = engine.split("==")
    loader = "replay"
    if release in ("0.5.23", "0.32.0"):
        require_release(release, name)
        loader = "real"
    fixed = check(out_dir, engine, loader=loader)
    assert fixed.verdict.startswith("loads cleanly"), fixed.verdict
    assert all(p.status == "written" for p in fixed.params if "fc_norm" in p.name)


@pytest.mark.parametrize("names", [[f"model.fc_norm.{i}.weight" for i in range(3)],
                                   [f"aux_norm_{n}.weight" for n in ("low", "mid", "high")]])
def test_fix_gives_the_norms_the_name_every_release_reads(draft, tmp_path, capsys, names):
    """NeMo Automodel's `model.fc_norm.N` and SGLang's legacy `aux_norm_*`: vLLM refuses both (it reads
    model.model.fc_norm, and renames no aux_norm); fix names them fc_norm.N, which vLLM's own loader loads."""
    src = specforge_31(draft, names)
    assert "loader-crash" in codes(check(src, "vllm==0.32.0", loader="replay"))
    code, planned = cli(capsys, "fix", src, "--engine", "vllm==0.32.0", "--plan", "--loader", "replay")
    assert code == 0 and f"{names[0]:<42}fc_norm.0.weight" in planned, planned
    out_dir = tmp_path / "fixed"
    code, out = cli(capsys, "fix", src, "--engine", "vllm==0.32.0", "--out", out_dir, "--loader", "replay")
    assert code == 0, out
    require_release("0.32.0", "vllm")
    fixed = check(out_dir, "vllm==0.32.0", loader="real")
    assert fixed.verdict.startswith("loads cleanly"), fixed.verdict
    assert {p.name for p in fixed.params if p.status == "written"} >= {f"model.fc_norm.{i}.weight" for i in range(3)}


@pytest.mark.parametrize("engine", ["sglang==0.5.10", "vllm==0.21.0", "llamacpp==0.3.36"])
def test_fix_refuses_a_release_that_cannot_compute_them_saying_why(draft, tmp_path, capsys, engine):
    """The release builds no fc_norm: fix refuses with fc-norm-unsupported (naming the releases that compute
    it), writing nothing; with --allow-lossy it leaves out the keys the release skips or refuses and keeps the
    switch in the config, so the written draft starts and its check still says what was lost."""
    src = specforge_31(draft)
    out_dir = tmp_path / "fixed"
    code, out = cli(capsys, "fix", src, "--engine", engine, "--out", out_dir, "--loader", "replay")
    assert code == 1 and not out_dir.exists(), out
    refusal = out[out.index("refused: nothing written"):]
    assert "ERROR   fc-norm-unsupported" in refusal and "norm-output-unsupported" in refusal
    assert COMPUTE.search(refusal), refusal
    assert "pass --allow-lossy" in refusal
    code, planned = cli(capsys, "fix", src, "--engine", engine, "--plan", "--loader", "replay")
    assert code == 1 and "fc_norm.0.weight                          (left out)" in planned
    code, out = cli(capsys, "fix", src, "--engine", engine, "--out", out_dir, "--loader", "replay", "--allow-lossy")
    assert code == 0, out
    name, release = engine.split("==")
    require_release(release, name)
    written = check(out_dir, engine, loader="real")
    assert not {"loader-crash", "dropped-keys", "uninitialized-params"} & codes(written), written.verdict
    assert {"fc-norm-unsupported", "norm-output-unsupported"} <= codes(written)


def test_llamacpp_reads_norm_before_fc_only_at_the_top_level(draft, tmp_path, capsys):
    """A flat config with norm_before_fc inside eagle_config (SGLang and vLLM >= 0.22 read it there): llama.cpp's
    converter reads only the top level, so input_norm converts and the load fails ("wrong number of tensors");
    fix writes the switch at the top level and the fixed draft loads (llama.cpp's own converter and loader)."""
    src = draft("midlayer", extra={"input_norm.weight": (1 + 0.1 * np.random.default_rng(1).standard_normal(3 * H))
                                   .astype(np.float16)})
    config = json.loads((src / "config.json").read_text())
    edit_config(src, eagle_config=config["eagle_config"] | {"norm_before_fc": True})
    assert "input-norm-unsupported" not in codes(check(src, "sglang==0.5.23", loader="replay"))
    report = check(src, "llamacpp==0.3.36", loader="replay")
    assert "loader-crash" in codes(report)
    assert "reads the config's top level only" in said(report, "input-norm-unsupported")
    # vLLM before 0.22 likewise (getattr(config, "norm_before_fc")): the key is dropped, the norm never built
    assert "dropped-keys" in codes(check(src, "vllm==0.21.0", loader="replay"))
    out_dir = tmp_path / "fixed"
    code, out = cli(capsys, "fix", src, "--engine", "llamacpp==0.3.36", "--out", out_dir, "--loader", "replay")
    assert code == 0, out
    assert json.loads((out_dir / "config.json").read_text())["norm_before_fc"] is True
    require_release("0.3.36", "llamacpp")
    fixed = check(out_dir, "llamacpp==0.3.36", loader="real")
    assert "enc.output_norm.weight" in {p.name for p in fixed.params if p.status == "written"}, fixed.verdict


def test_norm_output_is_ambiguous_only_in_specforges_export(draft):
    """speculators' nested config and layers.0.* keys: its norm_output has one meaning, no warning."""
    src = edit_config(draft("speculators", extra=norms(FC_NORM)), **EAGLE31)
    report = check(src, "vllm==0.32.0", loader="replay")
    assert "norm-output-ambiguous" not in codes(report, "warning") and not codes(report)
