"""The real loader: SGLang's own code, per release, on tiny checkpoints written here.

Each release's checks run in one child process (`run_real_loaders`), cached per module. A missing
release environment skips these tests locally and fails them in CI (CI=true), where `make test` has
run `make sglang-loaders` first.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_release, releases_under_test
from safetensors.numpy import save_file

from draftdoctor import realload
from draftdoctor.realload import childenv
from draftdoctor.realload import (
    REAL_LOADERS,
    RealLoaderCrashed,
    RealLoaderTimeout,
    ReleaseNotInstalled,
    release_env,
    run_real_loader,
    run_real_loaders,
)

H, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, DRAFT_VOCAB, TARGET_H = 64, 4, 2, 16, 128, 256, 128, 64
DECODER = ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight",
           "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
           "hidden_norm.weight")
OUTSIDE = ("model.embed_tokens.weight", "model.fc.weight", "model.norm.weight", "lm_head.weight")
# SGLang fuses these checkpoint tensors, in this order, into one parameter.
FUSED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}

FLAT_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": INTER,
    "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB, "target_hidden_size": TARGET_H, "num_hidden_layers": 1,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 2048, "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4], "use_aux_hidden_state": True},
}
# speculators' nested config (docs/engine-facts.md: "Config formats and who writes which layout"): no top-level model_type.
NESTED_CONFIG = {
    "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
    "draft_vocab_size": DRAFT_VOCAB, "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": [1, 3, 5],
    "norm_before_residual": True, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
    "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                           "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                           "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
                                        "architectures": ["LlamaForCausalLM"]}},
    "transformer_layer_config": {key: FLAT_CONFIG[key] for key in (
        "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
        "vocab_size", "num_hidden_layers", "rms_norm_eps", "hidden_act", "max_position_embeddings")},
}


def draft_tensors(layer_prefixes, seed=0):
    """Random float16 draft tensors; layer i is written under layer_prefixes[i] (e.g. "layers.0.")."""
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float16)

    tensors = {"embed_tokens.weight": rand(VOCAB, H), "fc.weight": rand(H, 3 * TARGET_H), "norm.weight": rand(H),
               "lm_head.weight": rand(DRAFT_VOCAB, H), "d2t": np.arange(DRAFT_VOCAB, dtype=np.int64),
               "t2d": np.ones(VOCAB, dtype=bool)}
    for i, prefix in enumerate(layer_prefixes):
        width = 2 * H if i == 0 else H  # only the first layer sees embedding ++ hidden state
        tensors |= {f"{prefix}{name}": rand(*shape) for name, shape in {
            "hidden_norm.weight": (H,), "input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
            "self_attn.q_proj.weight": (HEADS * HEAD_DIM, width), "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, width),
            "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, width), "self_attn.o_proj.weight": (H, HEADS * HEAD_DIM),
            "mlp.gate_proj.weight": (INTER, H), "mlp.up_proj.weight": (INTER, H), "mlp.down_proj.weight": (H, INTER),
        }.items()}
    return tensors


def write_checkpoint(folder, tensors, config):
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


CORPUS = {  # name -> (layer prefixes, config)
    "speculators": (["layers.0."], FLAT_CONFIG),
    "midlayer": (["midlayer."], FLAT_CONFIG),
    "nested-config": (["layers.0."], NESTED_CONFIG),
    "two-layers": (["layers.0.", "layers.1."], dict(FLAT_CONFIG, num_hidden_layers=2)),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """{name: (checkpoint folder, its tensors)}"""
    root = tmp_path_factory.mktemp("realload")
    built = {}
    for name, (prefixes, config) in CORPUS.items():
        tensors = draft_tensors(prefixes)
        built[name] = (write_checkpoint(root / name, tensors, config), tensors)
    return built


require = require_release


@pytest.fixture(scope="module")
def reports(corpus):
    """reports(release) -> {corpus name: report}; one child process per release."""
    cache = {}

    def get(release):
        require(release)
        if release not in cache:
            found = run_real_loaders([folder for folder, _ in corpus.values()], release)
            cache[release] = dict(zip(corpus, found))
        return cache[release]

    return get


def params(report):
    return {p["name"]: p for p in report["parameters"]}


def digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def expected_digest(name, tensors, layer_prefix):
    """sha256 of what parameter `name` must hold if SGLang loaded `tensors` completely and exactly."""
    for suffix in DECODER:
        if name.endswith(suffix):
            parts = FUSED.get(suffix, (suffix,))
            return digest(np.concatenate([tensors[layer_prefix + part] for part in parts]))
    return digest(tensors[name.removeprefix("model.")])


def assert_bit_exact(report, tensors, layer_prefix, names):
    got = params(report)
    for name in names:
        assert got[name]["sha256"] == expected_digest(name, tensors, layer_prefix), name


def decoder_params(layer):
    return [f"model.{layer}.{suffix}" for suffix in DECODER]


# -- 0.5.9 (the last on transformers 4.x) and 0.5.10 (the story's release): the layer is `midlayer` ----

MIDLAYER_ERA = ("0.5.9", "0.5.10")


@pytest.mark.parametrize("release", MIDLAYER_ERA)
def test_speculators_layout_silently_drops_the_decoder_layer(reports, corpus, release):
    report = reports(release)["speculators"]
    got = params(report)
    assert report["error"] is None and report["model_class"].endswith("LlamaForCausalLMEagle3")
    assert {n for n, p in got.items() if p["status"] == "written"} == set(OUTSIDE)
    assert {n for n, p in got.items() if p["status"] == "untouched"} == set(decoder_params("midlayer"))
    assert all(p["writes"] == [] and p["elements_written"] == 0 for n, p in got.items() if "midlayer" in n)
    assert_bit_exact(report, corpus["speculators"][1], "layers.0.", OUTSIDE)
    keys = {k["key"]: k for k in report["keys"]}
    assert not any(k["consumed"] for name, k in keys.items() if name.startswith("layers.0."))
    assert keys["d2t"]["consumed_as"] == "attribute" and keys["d2t"]["attributes"] == ["hot_token_id"]
    assert report["attributes"]["hot_token_id"]["shape"] == [DRAFT_VOCAB]
    assert [r for r in report["logs"] if r["stage"] in ("build", "load")] == []  # the drop is silent


@pytest.mark.parametrize("release", MIDLAYER_ERA)
def test_midlayer_layout_loads_all_eleven_parameters_bit_exactly(reports, corpus, release):
    report = reports(release)["midlayer"]
    got = params(report)
    names = set(OUTSIDE) | set(decoder_params("midlayer"))
    assert report["error"] is None and set(got) == names
    assert all(p["status"] == "written" and p["elements_written"] == p["numel"] for p in got.values())
    assert got["model.midlayer.self_attn.qkv_proj.weight"]["shards_written"] == ["k", "q", "v"]
    assert got["model.midlayer.mlp.gate_up_proj.weight"]["shards_written"] == ["0", "1"]
    assert_bit_exact(report, corpus["midlayer"][1], "midlayer.", names)
    assert [k["key"] for k in report["keys"] if not k["consumed"]] == ["t2d"]


@pytest.mark.parametrize("release", MIDLAYER_ERA)
def test_two_decoder_layers_crash_while_building(reports, release):
    error = reports(release)["two-layers"]["error"]
    assert (error["stage"], error["type"], error["message"]) == ("build", "ValueError",
                                                                  "EAGLE3 currently only supports 1 layer")
    assert error["origin"].startswith("sglang/srt/models/llama_eagle3.py")


# -- 0.5.23: newest release -----------------------------------------------------------------------------


@pytest.mark.parametrize("layout, prefix", [("speculators", "layers.0."), ("midlayer", "midlayer.")])
def test_0_5_23_loads_both_layouts_fully(reports, corpus, layout, prefix):
    report = reports("0.5.23")[layout]
    got = params(report)
    names = set(OUTSIDE) | set(decoder_params("layers.0"))
    assert report["error"] is None and set(got) == names
    assert all(p["status"] == "written" for p in got.values())
    assert_bit_exact(report, corpus[layout][1], prefix, names)


def test_0_5_23_loads_two_decoder_layers(reports):
    got = params(reports("0.5.23")["two-layers"])
    assert set(decoder_params("layers.1")) <= set(got)
    assert all(p["status"] == "written" for p in got.values())


# -- both releases ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("release", releases_under_test())
def test_speculators_nested_config_fails_in_sglangs_config_reader(reports, release):
    report = reports(release)["nested-config"]
    error = report["error"]
    assert error["stage"] == "config" and error["type"] == "ValueError"
    assert "Should have a `model_type` key in its config.json" in error["message"]
    assert report["config"] is None and report["parameters"] == [] and report["keys"] == []


@pytest.mark.parametrize("release", releases_under_test())
def test_adapter_fits_its_release(release):
    require(release)
    realload.self_check(release)


@pytest.mark.parametrize("engine, release", [("sglang", "0.5.10"), ("vllm", "0.29.0")])
def test_a_release_sees_its_folder_the_kit_and_torch_and_nothing_else_of_the_venv(engine, release):
    """As a user's install: torch first, then the release's pins. The venv's other packages (the kit's
    own dependencies, Jupyter's) are not the release's: vLLM 0.29 imported pandas, pyarrow and xxhash
    from the venv because they were there."""
    require_release(release, engine)
    command, env = childenv._child(engine, release, [])
    python = command[:command.index("-m")]
    probe = ("import importlib.util, json, sys; print(json.dumps({m: getattr(importlib.util.find_spec(m), 'origin', None) "
             "for m in sys.argv[1:]}))")
    names = [engine, "draftdoctor", "torch", "sympy", "mpmath", "papermill", "ipykernel", "pandas", "pyarrow"]
    proc = subprocess.run([*python, "-c", probe, *names], env=env, capture_output=True, text=True, timeout=60)
    found = json.loads(proc.stdout)
    assert found[engine].startswith(str(realload.release_env(release, engine)))
    assert found["draftdoctor"].startswith(str(Path(realload.__file__).parents[1]))
    assert all(found[m] for m in ("torch", "sympy", "mpmath")), found  # torch's own requirements, from the venv
    assert not any(found[m] for m in ("papermill", "ipykernel", "pandas", "pyarrow")), found


def test_the_torch_view_is_torchs_requirement_closure_linked_from_the_venv(tmp_path):
    import importlib.metadata

    from draftdoctor.realload.torchview import closure, torch_view

    names = {d.metadata["Name"].lower() for d in closure()}
    assert {"torch", "sympy", "mpmath", "jinja2", "markupsafe", "filelock"} <= names  # mpmath, markupsafe: transitive
    assert not names & {"optree", "opt-einsum", "pyyaml", "numpy", "pandas"}  # torch's extras, the venv's others
    view = torch_view(tmp_path)
    torch_dir = Path(importlib.metadata.distribution("torch").locate_file("torch"))
    assert (view / "torch").is_symlink() and (view / "torch").resolve() == torch_dir.resolve()
    assert any(p.name.startswith("torch-") and p.name.endswith(".dist-info") for p in view.iterdir())
    assert torch_view(tmp_path) == view and [p.name for p in tmp_path.iterdir()] == [view.name]


@pytest.mark.parametrize("engine, release, status", [("sglang", "0.5.10", 3), ("vllm", "0.32.0", 3), ("vllm", "0.9.1", 0)])
def test_the_self_check_fails_a_modelled_release_whose_tiny_draft_raises(engine, release, status, capsys):
    """Every release a profile row covers loads the EAGLE-layout self-check draft (docs/releases/): one
    that raises is a broken install; a release no row covers (vLLM 0.9.1: another draft class) may."""
    import io

    from draftdoctor.checkpoint import open_checkpoint
    from draftdoctor.realload.common import self_check

    def raising(paths, device, target_config):
        assert any(k.startswith("midlayer.") for k in open_checkpoint(paths[0]).keys())
        return [{"engine_name": engine, "release": release,
                 "error": {"stage": "load", "type": "KeyError", "message": "'midlayer.mlp.gate_proj.weight'"}}]

    out = io.StringIO()
    assert self_check(out, raising) == status
    assert f"{engine} {release}'s self-check draft did not load (load: KeyError" in capsys.readouterr().err
    assert (out.getvalue() != "") == (status == 0)


def test_adapter_check_fails_loudly_on_a_release_it_does_not_fit():
    """The 0.5.23 adapter run against 0.5.10 must name what is missing, not load anything."""
    require("0.5.10")
    command, env = childenv._child("sglang", "0.5.23", [], folder=release_env("0.5.10"))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and proc.stdout == ""
    assert "adapter for sglang 0.5.23 does not fit" in proc.stderr
    assert "installed sglang is 0.5.10" in proc.stderr
    assert "sglang.srt.runtime_context" in proc.stderr


# -- parent side (no SGLang needed) ----------------------------------------------------------------------


def test_missing_release_names_the_install_command(monkeypatch, tmp_path, corpus):
    monkeypatch.setenv("DRAFTDOCTOR_SGLANG_DIR", str(tmp_path))
    with pytest.raises(ReleaseNotInstalled, match="make sglang-loaders"):
        run_real_loader(corpus["midlayer"][0], "0.5.10")
    with pytest.raises(ValueError, match="has no real loader"):
        run_real_loader(corpus["midlayer"][0], "0.4.1")


@pytest.fixture
def empty_release(monkeypatch, tmp_path):
    """A release folder marked installed but holding nothing (no sglang, no transformers)."""
    (tmp_path / "0.5.10").mkdir()
    (tmp_path / "0.5.10" / realload.READY_MARKER).touch()
    monkeypatch.setenv("DRAFTDOCTOR_SGLANG_DIR", str(tmp_path))


def test_broken_release_environment_is_a_clear_error(empty_release, corpus):
    with pytest.raises(RealLoaderCrashed, match="environment or adapter is broken"):
        run_real_loader(corpus["midlayer"][0], "0.5.10")


def test_timeout_is_a_clear_error(empty_release, corpus):
    with pytest.raises(RealLoaderTimeout, match="within 0.2 s"):
        run_real_loader(corpus["midlayer"][0], "0.5.10", timeout=0.2)


def test_parent_imports_neither_torch_nor_sglang():
    code = "import sys, draftdoctor.realload; print(sorted(m for m in ('torch', 'sglang') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_each_release_has_pins_and_an_adapter_and_ci_covers_every_profile_range():
    from draftdoctor.engines import all_profiles, parse_version
    from draftdoctor.realload import adapters
    from draftdoctor.realload.adapters.releases import RANGES

    here = Path(realload.__file__).parent
    releases, ci = REAL_LOADERS["sglang"].releases, REAL_LOADERS["sglang"].ci_releases
    assert set(ci) <= set(releases) and set(REAL_LOADERS["vllm"].ci_releases) <= set(REAL_LOADERS["vllm"].releases)
    for engine in REAL_LOADERS:  # CI runs at least one release of every profile row (every class) of every engine
        for row in all_profiles():
            if row.engine == engine:
                assert any(row.contains(r) for r in REAL_LOADERS[engine].ci_releases), (row.spec, row.build.draft_class)
    for release in releases:
        rows = [row for row in RANGES if parse_version(row[0]) <= parse_version(release) <= parse_version(row[1])]
        assert len(rows) == 1 and adapters.get(release).release == release, (release, rows)
        lines = [line.split("#")[0].strip() for line in (here / f"requirements-{release}.txt").read_text().splitlines()]
        pins = [line for line in lines if line]
        assert f"sglang=={release}" in pins
        assert all("==" in pin for pin in pins), "every dependency is pinned exactly"
        forbidden = ("torch", "triton", "nvidia", "sgl-kernel", "sgl_kernel", "sglang-kernel", "sglang_kernel", "cuda")
        assert not [pin for pin in pins if pin.lower().startswith(forbidden)]
    with pytest.raises(adapters.AdapterMismatch, match="no adapter for sglang 0.5.0rc1"):
        adapters.get("0.5.0rc1")  # inside a row, but no pin list
