"""What a command decides is the library's, as values (the CLI only renders them): exit statuses,
refusals, exposure warnings, whether an output place can be written, the demo's loader."""

import pytest

from draftdoctor import exits, investigate, listeners, runs
from draftdoctor.findings import ERROR, INFO, WARNING, Finding
from draftdoctor.realload import registry
from draftdoctor.serving import backends
from draftdoctor.serving.bench import BenchInputError, draft_pairs, missing_input


def findings(*severities):
    return [Finding("not-checked", severity, "a message") for severity in severities]


def test_check_fails_on_an_error_and_with_strict_on_a_warning():
    assert exits.check_status(findings(INFO, WARNING)) == exits.EXIT_OK
    assert exits.check_status(findings(INFO, WARNING), strict=True) == exits.EXIT_FINDINGS
    assert exits.check_status(findings(ERROR)) == exits.EXIT_FINDINGS
    assert exits.check_status(findings(INFO), strict=True) == exits.EXIT_OK
    assert (exits.status(True), exits.status(False), exits.EXIT_UNUSABLE) == (1, 0, 2)


def test_exposure_is_said_only_beyond_loopback():
    assert listeners.reachable_from("127.0.0.1") is None and listeners.reachable_from("localhost") is None
    assert listeners.reachable_from("0.0.0.0") == "every network interface"
    assert backends.exposure_warning("reference", "127.0.0.1") is None
    warning = backends.exposure_warning("reference", "0.0.0.0")
    assert warning.startswith("--host 0.0.0.0 listens on every network interface: anyone who can reach")
    assert "(the reference backend asks for no authentication)" in warning and warning.endswith("default is 127.0.0.1")
    assert "authentication" not in backends.exposure_warning("sglang", "0.0.0.0")  # SGLang's row asks for it


def test_guard_is_refused_where_it_cannot_run():
    assert backends.guard_refusal("vllm") is None and backends.guard_refusal("sglang") is None
    assert backends.guard_refusal("reference") == ("--guard: the guard runs inside an engine's own server process "
                                                   "(--backend sglang, vllm); the reference backend is not one")
    assert backends.guard_refusal("llamacpp").endswith("llama.cpp is not one")


def test_an_unwritable_folder_is_said_and_the_probe_leaves_nothing(tmp_path):
    assert runs.unwritable_folder(tmp_path / "new" / "run") is None
    assert not (tmp_path / "new").exists()  # made to be probed, then removed
    (tmp_path / "file").write_text("mine")
    assert runs.unwritable_folder(tmp_path / "file" / "run") == "cannot write there (Not a directory)"
    assert runs.unwritable_folder(tmp_path / "file") == "cannot write there (File exists)"
    assert (tmp_path / "file").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_unwritable_log_is_said(tmp_path):
    assert runs.unwritable_file(tmp_path) == "is a folder; give a file name"
    (tmp_path / "file").write_text("mine")
    assert runs.unwritable_file(tmp_path / "file" / "serve.log") == "cannot write there (File exists)"
    assert runs.unwritable_file(tmp_path / "logs" / "serve.log") is None and (tmp_path / "logs" / "serve.log").is_file()


@pytest.mark.parametrize("values, message", [
    (["x"], "--draft expects NAME=PATH, got 'x'"),
    (["=/d"], "--draft expects NAME=PATH, got '=/d'"),
    (["../a=/d"], "--draft NAME '../a' must be a plain file name"),
    (["a=/d", "a=/e"], "--draft names must differ"),
])
def test_draft_lists_that_cannot_be_used(values, message):
    with pytest.raises(BenchInputError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        draft_pairs(values)


def test_draft_pairs_and_missing_inputs(tmp_path):
    assert draft_pairs(["before=/a=b", "after.1=/c"]) == [("before", "/a=b"), ("after.1", "/c")]
    assert missing_input("reference", [tmp_path, tmp_path / "gone"]) == f"{tmp_path / 'gone'}: no such file or folder"
    assert missing_input("sglang", [tmp_path / "gone"]) is None  # a GPU host's SGLang may name a hub id


def test_the_demo_replays_a_loader_not_installed_here(monkeypatch):
    monkeypatch.setattr(registry, "installed_releases", lambda engine: [])
    demo = investigate.demo_run()
    assert demo.params.name == "investigate.yaml" and demo.override == {"loader": "replay"}
    assert demo.note.startswith("sglang==0.5.10's own loader is not installed here (")
    assert demo.note.endswith("installs it, about a minute): the drafts are loaded as the kit's replay of it says")
    monkeypatch.setattr(registry, "installed_releases", lambda engine: ["0.5.10"])
    assert investigate.demo_run() == investigate.DemoRun(demo.params)
