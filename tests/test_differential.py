"""The replay against the engines' own loaders: on the differential corpus (draftdoctor.proofs.differential:
every rule of every loader, every draft class) and on the public corpus of published layouts, they must
agree on every parameter's status and every finding code, for each release whose real loader is
installed. Where they disagree, the profile is wrong. Needs `make sglang-loaders vllm-loaders` (run by
`make test`); CI's releases (realload/ci_releases.txt) fail, not skip, when missing."""

import pytest
from conftest import require_release, releases_under_test

from draftdoctor.proofs import differential
from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.replay import replay
from draftdoctor.engines import EngineSpecError, resolve_engine
from draftdoctor.realcheck import real_checks


def _has_profile(engine: str, release: str) -> bool:
    try:
        return bool(resolve_engine(f"{engine}=={release}"))
    except EngineSpecError:  # a real loader the sweep runs, older than any profile row (vLLM 0.9-0.11)
        return False


RELEASES = [(e, r) for e in ("sglang", "vllm") for r in releases_under_test(e) if _has_profile(e, r)]
# the public corpus (24 drafts, several GB each, built on the meta device): the story's release, the newest;
# vLLM's newest CPU build and its newest release (0.34.0: an overlay on that build)
PUBLIC_RELEASES = [("sglang", "0.5.10"), ("sglang", "0.5.23"), ("vllm", "0.32.0"), ("vllm", "0.34.0")]


def assert_agree(folders: dict, spec: str, timeout=None):
    engine = resolve_engine(spec)
    # a class the replay does not model for the release is no claim (the sweep still tabulates it)
    folders = {name: f for name, f in folders.items() if not differential.not_modelled(replay(open_checkpoint(f), engine))}
    reals = real_checks(list(folders.values()), engine, timeout=timeout)
    found = []
    for (name, folder), real in zip(folders.items(), reals):
        found += differential.disagreements(name, replay(open_checkpoint(folder), engine), real, engine, folder)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("engine_name,release", RELEASES)
def test_replay_and_real_loader_agree(tmp_path, engine_name, release):
    require_release(release, engine_name)
    assert_agree(differential.write_cases(tmp_path, engine_name), f"{engine_name}=={release}")


@pytest.fixture(scope="session")
def public_corpus(tmp_path_factory):
    return differential.write_public(tmp_path_factory.mktemp("public"))


def test_the_public_corpus_is_what_its_readme_promises(public_corpus):
    """At least 15 published drafts, both trainer layouts, the architectures (Llama, Qwen3, MLA) and their targets,
    each with a SOURCE.md."""
    from draftdoctor.provenance import recognise

    assert len(public_corpus) >= 15
    assert all((differential.PUBLIC / name / "SOURCE.md").stat().st_size > 200 for name in public_corpus)
    kinds = {recognise(open_checkpoint(f).keys(), open_checkpoint(f).config).draft_class for f in public_corpus.values()}
    assert kinds == {"llama", "qwen3", "mla"}
    keys = {k for f in public_corpus.values() for k in open_checkpoint(f).keys()}
    assert any(k.startswith("midlayer.") for k in keys) and any(k.startswith("layers.0.") for k in keys)
    for target in ("llama3.1", "llama3.3", "llama4", "qwen3-8b", "qwen3-30b-a3b", "kimi", "deepseek", "gpt-oss", "gemma"):
        assert any(target in name for name in public_corpus), target


@pytest.mark.parametrize("engine_name,release", PUBLIC_RELEASES)
def test_replay_and_real_loader_agree_on_the_public_corpus(public_corpus, engine_name, release):
    """Every published layout, every installed real loader (big drafts built on the meta device)."""
    require_release(release, engine_name)
    assert_agree(public_corpus, f"{engine_name}=={release}", timeout=1800)


def test_the_comparison_does_not_depend_on_the_memory_free(public_corpus, monkeypatch):
    """Whether the real loader builds a draft in memory or on the meta device depends on the memory free at that
    moment (the budget); its `not-checked` note says so and is no claim of the loader: with every draft over the
    budget, replay and real loader agree as they do with room to spare."""
    require_release("0.5.10")
    monkeypatch.setenv("DRAFTDOCTOR_MEMORY_BUDGET", "1")
    some = dict(sorted(public_corpus.items())[:3])
    reals = real_checks(list(some.values()), resolve_engine("sglang==0.5.10"))
    assert all(any("meta device" in f.message for f in real.findings) for real in reals)
    assert_agree(some, "sglang==0.5.10")


def test_transformers_4_reads_a_speculators_config_by_its_folders_name(tmp_path):
    """SGLang up to 0.5.9 pins transformers 4.x, whose AutoConfig takes a model type named in the path for a
    config without one: a speculators draft under a folder named "...llama..." gets past config reading and
    fails at build instead. The replay cannot know every model type's name, so it claims only that the
    server does not start, and says why the failure may look different; the real loader must agree."""
    from draftdoctor.synth import write_draft

    require_release("0.5.1.post3")
    engine = resolve_engine("sglang==0.5.1.post3")
    named = write_draft(tmp_path / "llama-speculator", layout="speculators")
    plain = write_draft(tmp_path / "draft", layout="speculators")
    real_named, real_plain = real_checks([named, plain], engine)
    said = {folder: " ".join(f.message for f in real.errors) for folder, real in ((named, real_named), (plain, real_plain))}
    assert "Cannot find model module" in said[named] and "Unrecognized model" not in said[named]  # read as Llama's
    assert "Unrecognized model" in said[plain]
    for folder, real in ((named, real_named), (plain, real_plain)):
        played = replay(open_checkpoint(folder), engine)
        assert differential.only_wont_start(folder, engine)
        assert "folder's path" in next(f.message for f in played.errors if f.code == "config-unreadable")
        assert not differential.disagreements(folder.name, played, real, engine, folder)
    assert not differential.only_wont_start(plain, resolve_engine("sglang==0.5.10"))  # transformers 5: refused by format only


def test_reference_backend_weights_are_the_same_with_the_real_loader():
    """`--loader real` and `--loader replay` hand the reference engine the very same draft."""
    from pathlib import Path

    torch = pytest.importorskip("torch")
    from draftdoctor.eagle.llama import TargetModel
    from draftdoctor.diagnose import check
    from draftdoctor.eagle.loading import place

    require_release("0.5.10")
    demo = Path(__file__).resolve().parents[1] / "data" / "demo"
    target = TargetModel.from_dir(demo / "target")
    real = place(check(demo / "draft-story", "sglang==0.5.10", loader="real"), target)
    played = place(check(demo / "draft-story", "sglang==0.5.10", loader="replay"), target)
    assert real.written == played.written and len(real.written) == 4
    assert all(torch.equal(real.draft.params[k], played.draft.params[k]) for k in played.draft.params)
