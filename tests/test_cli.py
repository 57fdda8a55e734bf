"""The command line as a user runs it: output formats, exit statuses, one-line errors."""

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args):
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", *map(str, args)], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def test_inspect_text_groups_by_module_with_totals(draft):
    code, out, err = run("inspect", draft("speculators"))
    assert code == 0 and not err
    assert "[layers.0]" in out and "10 tensors" in out and "16 tensors" in out
    assert "layout: speculators" in out


def test_inspect_json_and_csv(draft):
    folder = draft("midlayer", shards=2)
    code, out, _ = run("inspect", folder, "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["layout"]["name"] == "midlayer" and len(doc["files"]) == 2
    assert {"name", "dtype", "shape", "bytes", "file", "module"} <= set(doc["tensors"][0])
    code, out, _ = run("inspect", folder, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == len(doc["tensors"]) and rows[0]["shape"]


def test_check_exit_statuses_and_json(draft):
    code, out, _ = run("check", draft("speculators", config="flat"), "--engine", "sglang==0.5.10", "--format", "json",
                      "--loader", "replay")
    doc = json.loads(out)
    assert code == 1
    assert doc["engine"] == "sglang==0.5.10" and doc["loader"] == "replay" and doc["format"] == "flat"
    cov = doc["coverage"]
    assert cov["params_total"] == 11 and cov["params_uninitialized"] == 7 and cov["keys_dropped"] == 10
    assert cov["bytes_uninitialized"] > 0 and len(cov["params"]) == 11 and len(cov["keys"]) == 16
    assert {f["code"] for f in doc["findings"]} == {"dropped-keys", "uninitialized-params", "not-checked"}  # no --target
    assert all(set(f) == {"code", "severity", "message"} for f in doc["findings"])
    code, out, _ = run("check", draft("midlayer"), "--engine", "sglang==0.5.10")
    assert code == 0 and "verdict: loads cleanly" in out


@pytest.mark.parametrize("args, message", [
    (("inspect", "/nonexistent/x"), "no such file"),
    (("check", "{ok}", "--engine", "sglang==9.9.9"), "is newer than every release the kit knows"),
    (("check", "{ok}", "--engine", "tgi"), "unknown engine"),
    (("inspect",), "required"),
    (("fx", "{ok}"), "invalid choice: 'fx' (choose from 'inspect', 'check', 'fix', 'compare', 'serve', 'bench', 'investigate', 'loaders', 'demo')"),
])
def test_unusable_input_exits_2_with_one_line(draft, args, message):
    """Unusable arguments (a malformed file, given to each command: tests/test_robustness.py)."""
    code, out, err = run(*[a.format(ok=draft("midlayer")) for a in args])
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_console_script_and_sub_command_help(draft):
    """The installed `draftdoctor` script passes the exit status on; a sub-command's help is its own."""
    script = str(Path(sys.executable).with_name("draftdoctor"))
    proc = subprocess.run([script, "check", draft("speculators"), "--engine", "sglang==0.5.10"], capture_output=True)
    assert proc.returncode == 1
    proc = subprocess.run([script, "fix", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: draftdoctor fix") and "--allow-lossy" in proc.stdout
    proc = subprocess.run([script, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and all(name in proc.stdout for name in ("inspect", "fix", "investigate"))


def test_inspect_imports_no_heavy_modules(draft):
    folder = draft("speculators")
    code = (
        "import sys; from draftdoctor.cli import main; main(['inspect', %r]); "
        "main(['check', %r, '--engine', 'sglang==0.5.10']); "
        "heavy = [m for m in ('torch', 'transformers', 'sglang', 'pandas') if m in sys.modules]; "
        "sys.stderr.write(repr(heavy))" % (str(folder), str(folder))
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stderr.strip().splitlines()[-1] == "[]"


def test_real_loader_error_names_the_engine_asked_for(draft):
    code, _, err = run("check", draft("speculators"), "--engine", "vllm==0.22.1", "--loader", "real")  # no pin list
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "vllm==0.22.1 has no real loader" in err and "0.5.10" in err and "installed:" in err


def test_check_says_what_it_could_not_check_and_strict_fails_on_warnings(tmp_path):
    from draftdoctor.synth import write_draft

    demo = Path(__file__).resolve().parents[1] / "data" / "demo"
    code, out, _ = run("check", demo / "draft-speculators", "--engine", "vllm==0.32.0")
    assert "not-checked" in out and "no --target" in out
    code, out, _ = run("check", demo / "draft-speculators", "--engine", "vllm==0.32.0", "--target", demo / "target")
    assert code == 0 and "not-checked" not in out
    # a warning (aux ids where SGLang does not read them; harmless or not depends on the target) passes,
    # and fails with --strict
    folder = write_draft(tmp_path / "d", layout="midlayer", config="flat")
    config = json.loads((folder / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [1, 3, 5]
    del config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    (folder / "config.json").write_text(json.dumps(config))
    code, out, _ = run("check", folder, "--engine", "sglang==0.5.10")
    warned = "WARNING" in out
    strict, _, _ = run("check", folder, "--engine", "sglang==0.5.10", "--strict")
    assert warned and code == 0 and strict == 1, out


def test_top_level_help_says_what_the_kit_is_for():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "gets no acceptance once served" in proc.stdout and "fix DRAFT --engine E --target T" in proc.stdout
    assert "only module" not in proc.stdout  # not how the module is built


def test_every_loader_default_is_checks_or_says_why_not():
    """One word per idea: `--loader` means the same choice everywhere; a command whose default is not
    `check`'s (auto) says why in its help, and docs/cli.md says it too."""
    from draftdoctor.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    defaults = {}
    for name, sub in commands.items():
        for action in sub._actions:
            if action.dest == "loader":
                defaults[name] = action.default
                assert action.default == "auto" or "not auto as for check, so that" in action.help, name
    assert defaults == {"check": "auto", "fix": "auto", "serve": "replay", "bench": "replay"}
    docs = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    assert "`replay` by default, not `auto` as for `check`, so that" in docs
