"""Hostile and careless inputs: each gets one line naming the file or argument and the
problem, exit 2; nothing hangs, nothing prints a traceback, nothing outside the test's folder changes.

The inputs are made in the test (special files, large or deep JSON), one class each of: special
files where a file is expected, hostile JSON and YAML, impossible config values, bad command-line
values, names used as paths.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from draftdoctor.synth import DraftShape, draft_tensors, write_draft
from draftdoctor.synthwrite import write_safetensors

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"


def edit_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def layer(key, value):
    return lambda c: c["transformer_layer_config"].__setitem__(key, value)


def build(kind: str, root: Path) -> tuple[list, str]:
    """(CLI arguments, a text the one error line must contain) for attack `kind`, made under `root`."""
    good = write_draft(root / "draft", layout="speculators")
    if kind == "fifo-weights":
        folder = root / "fifo"
        folder.mkdir()
        os.mkfifo(folder / "model.safetensors")
        return ["check", folder, "--engine", "sglang==0.5.10"], "not a regular file"
    if kind == "fifo-config":
        os.remove(good / "config.json")
        os.mkfifo(good / "config.json")
        return ["inspect", good], "config.json"
    if kind == "fifo-index":
        shutil.rmtree(good)
        good = write_draft(root / "draft", layout="speculators", shards=2)
        os.remove(good / "model.safetensors.index.json")
        os.mkfifo(good / "model.safetensors.index.json")
        return ["inspect", good], "not a regular file"
    if kind == "huge-integer":
        (good / "config.json").write_text('{"hidden_size": ' + "9" * 5000 + "}")
        return ["check", good, "--engine", "sglang==0.5.10"], "config.json: not valid JSON"
    if kind == "deep-nesting":
        (good / "config.json").write_text("[" * 100_000 + "]" * 100_000)
        return ["check", good, "--engine", "vllm"], "nested too deeply"
    if kind == "huge-config":
        with open(good / "config.json", "wb") as f:
            f.truncate(64 << 20)  # sparse: no disk
        return ["check", good, "--engine", "vllm"], "larger than"
    if kind == "params-dev-zero":
        return ["investigate", "--params", "/dev/zero", "--out", root / "run"], "not a regular file"
    if kind == "deep-params":
        (root / "p.yaml").write_text("[" * 100_000)
        return ["investigate", "--params", root / "p.yaml", "--out", root / "run"], "p.yaml"
    if kind == "zero-heads":
        edit_config(good, layer("num_attention_heads", 0))
        return ["check", good, "--engine", "sglang==0.5.10"], "num_attention_heads must be"
    if kind == "infinite-hidden":
        (good / "config.json").write_text((good / "config.json").read_text().replace('"hidden_size": 64', '"hidden_size": 1e999'))
        return ["check", good, "--engine", "sglang==0.5.10"], "hidden_size must be"
    if kind == "string-aux-ids":
        edit_config(good, lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", ["a", "b", "c"]))
        return ["check", good, "--engine", "sglang==0.5.10", "--target", DEMO / "target"], "layer numbers"
    if kind == "eagle-config-list":
        edit_config(good, lambda c: c.__setitem__("eagle_config", [1, 2]))
        return ["check", good, "--engine", "vllm"], "eagle_config must be an object"
    if kind == "port-out-of-range":
        return ["serve", "--model-path", DEMO / "target", "--speculative-draft-model-path", good, "--port", "99999"], "--port"
    if kind == "unresolvable-host":
        return ["serve", "--model-path", DEMO / "target", "--speculative-draft-model-path", good,
                "--host", "no-such-host.invalid"], "cannot resolve host"
    if kind == "log-is-a-folder":
        return ["serve", "--model-path", DEMO / "target", "--speculative-draft-model-path", good, "--log", root], "is a folder"
    if kind == "zero-steps":
        return ["bench", "--target", DEMO / "target", "--draft", f"a={good}", "--out", root / "b", "--num-steps", "0"], \
            "--num-steps"
    if kind == "run-name-escapes":
        (root / "p.yaml").write_text(f"checkpoint: {good}\nname: ../../escaped\n")
        return ["investigate", "--params", root / "p.yaml", "--out", root / "run"], "run name"
    if kind == "draft-name-escapes":
        return ["bench", "--target", DEMO / "target", "--draft", f"../../escaped={good}", "--out", root / "b"], "--draft NAME"
    if kind == "prompts-dev-zero":
        return ["bench", "--target", DEMO / "target", "--draft", f"a={good}", "--out", root / "b", "--prompts",
                "/dev/zero"], "cannot read prompts"
    if kind in ("prompts-a-fifo", "prompts-not-utf8", "prompts-a-folder"):  # the problem said, not "(CheckpointError)"
        prompts = root / "p.jsonl"
        said = {"prompts-a-fifo": "not a regular file", "prompts-not-utf8": "not valid UTF-8 at byte 2",
                "prompts-a-folder": "Is a directory"}[kind]
        if kind == "prompts-a-fifo":
            os.mkfifo(prompts)
        elif kind == "prompts-a-folder":
            prompts.mkdir()
        else:
            prompts.write_bytes(b'{"\xff": 1}\n')
        return ["check", DEMO / "draft-speculators", "--engine", "vllm==0.32.0", "--loader", "replay", "--target",
                DEMO / "target", "--prompts", prompts], f"p.jsonl: cannot read prompts ({said}"
    if kind == "deep-prompt":
        (root / "p.jsonl").write_text("[" * 100_000 + "\n")
        return ["bench", "--target", DEMO / "target", "--draft", f"a={good}", "--out", root / "b", "--prompts",
                root / "p.jsonl"], "p.jsonl:1"
    if kind == "params-alias-bomb":  # nine levels of aliases: 10^9 strings once expanded
        lines = ['a0: &a0 ["x"]'] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
        (root / "p.yaml").write_text("\n".join(lines) + f"\ncheckpoint: {good}\nengine: *a9\n")
        return ["investigate", "--params", root / "p.yaml", "--out", root / "run"], "aliases"
    if kind.startswith("params-wrong-"):
        field, value = {"params-wrong-checkpoint": ("checkpoint", "[1, 2]"), "params-wrong-target": ("target", "{a: 1}"),
                        "params-wrong-engine": ("engine", "[x]")}[kind]
        body = {"checkpoint": str(good), "target": str(DEMO / "target"), "engine": "sglang"} | {field: None}
        (root / "p.yaml").write_text("".join(f"{k}: {value if k == field else v}\n" for k, v in body.items()))
        return ["investigate", "--params", root / "p.yaml", "--out", root / "run"], f"`{field}` must be a str"
    if kind == "params-negative-count":  # the command line refuses --num-prompts -5; the notebooks had taken it
        (root / "p.yaml").write_text(f"checkpoint: {good}\nnum_prompts: -5\n")
        return ["investigate", "--params", root / "p.yaml", "--out", root / "run"], "`num_prompts` must be a whole number >= 1"
    if kind in ("params-unknown-engine", "params-unknown-release"):  # notebook 01 had run, then 02 failed: exit 1
        field = "engine_name: bogus" if kind.endswith("engine") else "release: 9.9.9"
        (root / "p.yaml").write_text(f"checkpoint: {good}\n{field}\n")
        return ["investigate", "--params", root / "p.yaml", "--out", root / "run"], \
            "p.yaml: unknown engine 'bogus'" if kind.endswith("engine") else "p.yaml: sglang==9.9.9 is newer than"
    if kind == "params-key-twice":  # YAML keeps the last: this had investigated the second checkpoint alone
        (root / "p.yaml").write_text(f"checkpoint: {good}\ntarget: {DEMO / 'target'}\ncheckpoint: {root}\n")
        return ["investigate", "--params", root / "p.yaml", "--out", root / "run"], "`checkpoint` is given twice"
    if kind in ("bench-out-under-a-file", "investigate-out-under-a-file", "serve-log-under-a-file"):
        (root / "a-file").write_text("x")
        if kind.startswith("bench"):
            return ["bench", "--target", DEMO / "target", "--draft", f"a={good}", "--out", root / "a-file" / "b"], "--out"
        if kind.startswith("investigate"):
            (root / "p.yaml").write_text(f"checkpoint: {good}\n")
            return ["investigate", "--params", root / "p.yaml", "--out", root / "a-file" / "run"], "--out"
        return ["serve", "--model-path", DEMO / "target", "--speculative-draft-model-path", good, "--log",
                root / "a-file" / "s.log"], "--log"
    if kind == "bench-out-in-the-draft":  # results.json, charts and server logs had been written among its files
        return ["bench", "--target", DEMO / "target", "--draft", f"a={good}", "--out", good / "results", "--num-prompts",
                "1"], "is inside the draft a"
    if kind == "investigate-out-is-the-checkpoint":  # the notebooks and the fixed copy had gone into it
        (root / "p.yaml").write_text(f"checkpoint: {good}\n")
        return ["investigate", "--params", root / "p.yaml", "--out", good], "is inside the checkpoint"
    if kind == "bench-out-read-only":  # /proc takes no new folders, not even root's
        return ["bench", "--target", DEMO / "target", "--draft", f"a={good}", "--out", "/proc/draftdoctor-out"], \
            "cannot write there"
    if kind == "architectures-a-number":  # every reader takes it for a list of names: one line, not a traceback
        edit_config(good, lambda c: c.__setitem__("architectures", 5))
        return ["fix", good, "--engine", "vllm", "--plan"], "architectures must be a list of class names"
    if kind == "model-type-a-list":
        edit_config(good, layer("model_type", ["llama"]))
        return ["check", good, "--engine", "vllm"], "transformer_layer_config.model_type must be a name"
    if kind == "compare-a-device":  # a device is no folder: not "no .safetensors file in this folder"
        return ["compare", "/dev/zero", good], "neither a regular file nor a folder"
    if kind == "inspect-a-fifo":
        os.mkfifo(root / "pipe")
        return ["inspect", root / "pipe"], "neither a regular file nor a folder"
    if kind == "draft-a-million-layers":  # vLLM builds every layer: the replay had run past a minute
        edit_config(good, layer("num_hidden_layers", 10**6))
        return ["check", good, "--engine", "vllm==0.32.0", "--loader", "replay"], "num_hidden_layers must be"
    if kind in ("target-layers-a-string", "target-a-million-layers", "target-zero-heads"):
        target = root / "target"
        shutil.copytree(DEMO / "target", target)
        field, value = {"target-layers-a-string": ("num_hidden_layers", "6"),
                        "target-a-million-layers": ("num_hidden_layers", 10**6),
                        "target-zero-heads": ("num_attention_heads", 0)}[kind]
        edit_config(target, lambda c: c.__setitem__(field, value))
        return ["check", good, "--engine", "sglang==0.5.10", "--loader", "replay", "--target", target], \
            f"target/config.json: {field} must be"
    if kind == "fix-aux-ids-a-string":  # said as check says it, not as the rewrite trips ("invalid literal for int()")
        edit_config(good, lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", "1,2,3"))
        return ["fix", good, "--engine", "sglang==0.5.10", "--plan"], \
            'config.json: eagle_aux_hidden_state_layer_ids must be a list of layer numbers, not "1,2,3"'
    if kind == "fix-layer-config-a-list":
        edit_config(good, lambda c: c.__setitem__("transformer_layer_config", [1]))
        return ["fix", good, "--engine", "vllm", "--plan"], "config.json: transformer_layer_config must be an object"
    if kind == "weights-link-loop":
        folder = root / "loop"
        folder.mkdir()
        (folder / "model.safetensors").symlink_to("model.safetensors")
        return ["inspect", folder], "Too many levels of symbolic links"
    raise AssertionError(kind)


KINDS = ["fifo-weights", "fifo-config", "fifo-index", "huge-integer", "deep-nesting", "huge-config", "params-dev-zero",
         "deep-params", "zero-heads", "infinite-hidden", "string-aux-ids", "eagle-config-list", "port-out-of-range",
         "unresolvable-host", "log-is-a-folder", "zero-steps", "run-name-escapes", "draft-name-escapes",
         "prompts-dev-zero", "deep-prompt", "weights-link-loop", "params-alias-bomb", "params-wrong-checkpoint",
         "params-wrong-target", "params-wrong-engine", "bench-out-under-a-file", "investigate-out-under-a-file",
         "serve-log-under-a-file", "bench-out-read-only", "compare-a-device", "inspect-a-fifo",
         "architectures-a-number", "model-type-a-list", "draft-a-million-layers", "target-layers-a-string",
         "target-a-million-layers", "target-zero-heads", "fix-aux-ids-a-string", "fix-layer-config-a-list",
         "params-negative-count", "params-key-twice", "prompts-a-fifo", "prompts-not-utf8", "prompts-a-folder",
         "bench-out-in-the-draft", "investigate-out-is-the-checkpoint", "params-unknown-engine",
         "params-unknown-release"]


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_input_gets_one_line_and_exit_2(kind, tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    args, expected = build(kind, root)
    outside_before, draft_before = sorted(os.listdir(tmp_path)), sorted(os.listdir(root / "draft"))
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=root)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and expected in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == outside_before  # nothing written beside the test's folder
    assert sorted(os.listdir(root / "draft")) == draft_before  # nor in the draft
    assert not list(tmp_path.parent.glob("escaped*"))


FORGED = "layers.0.x\nERROR   forged-code: trust me\nverdict: loads cleanly\x1b[2J\x1b[31m"


def test_names_cannot_forge_lines_or_drive_the_terminal(tmp_path):
    folder = write_draft(tmp_path / "draft", layout="speculators")
    tensors = draft_tensors(DraftShape(), layout="speculators")
    tensors[FORGED] = ("F16", (4,))
    write_safetensors(folder / "model.safetensors", tensors)
    for args in (["inspect", folder], ["check", folder, "--engine", "sglang==0.5.10"],
                 ["fix", folder, "--engine", "sglang==0.5.10", "--plan"],
                 ["fix", folder, "--engine", "vllm", "--out", tmp_path / "out"]):
        proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", *map(str, args)], capture_output=True,
                              text=True, timeout=120)
        assert "Traceback" not in proc.stderr
        text = proc.stdout + proc.stderr
        assert "\x1b" not in text and "forged-code" in text.replace("\\n", "\n"), args  # shown, escaped
        assert not any(line.startswith(("ERROR   forged", "verdict: loads cleanly\\x1b")) for line in text.splitlines())


# Names a terminal would obey (clear screen, window title, OSC 52 clipboard write), a spreadsheet would run
# as a formula, or an editor would reorder or hide (right-to-left override, zero-width space, NUL).
TERMINAL_AND_SHEET = ["\x1b[2J\x1b]0;owned\x07a", "\x1b]52;c;aGVsbG8=\x07b", '=HYPERLINK("http://x.invalid","c")',
                      "+cmd|' /C calc'!A0", "@SUM(1+1)", "-2+3", "d\u202eexe.txt", "e\u200bf", "g\x00h", "i\u2028j"]


@pytest.mark.parametrize("fmt", ["csv", "json", "text"])
def test_every_format_of_inspect_shows_names_as_inert_text(tmp_path, fmt):
    """Text output escaped control characters already; CSV and JSON wrote them raw, and CSV's cells
    started with formulas."""
    import csv
    import io
    import json

    folder = write_draft(tmp_path / "draft", layout="speculators")
    tensors = draft_tensors(DraftShape(), layout="speculators") | {n: ("F16", (4,)) for n in TERMINAL_AND_SHEET}
    write_safetensors(folder / "model.safetensors", tensors)
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "inspect", str(folder), "--format", fmt],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert all(line.isprintable() for line in proc.stdout.splitlines()), "a character a terminal obeys or hides"
    if fmt == "json":  # the same names to a JSON reader
        names = {t["name"] for t in json.loads(proc.stdout)["tensors"]}
        assert set(TERMINAL_AND_SHEET) <= names
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(proc.stdout)))
        cells = [c for row in rows for c in row.values()]
        assert not [c for c in cells if c.startswith(("=", "+", "-", "@", "|"))], "a cell a spreadsheet evaluates"
        names = {row["name"] for row in rows}
        assert {"'=HYPERLINK(\"http://x.invalid\",\"c\")", "'@SUM(1+1)", "d\\u202eexe.txt", "g\\x00h"} <= names


SWAPPED = """
import os, sys
from pathlib import Path
from draftdoctor.checkpoint import CheckpointError, open_checkpoint

draft, other, out, case = map(Path, sys.argv[1:5])

def swap():  # the weights replaced by a FIFO no one writes, after their header was read
    os.mkfifo(draft / "pipe")
    os.replace(draft / "pipe", draft / "model.safetensors")

try:
    if str(case) == "check":
        from draftdoctor.diagnose import diagnose
        from draftdoctor.engines import resolve_engine
        checkpoint = open_checkpoint(draft)
        swap()
        diagnose(checkpoint, resolve_engine("sglang==0.5.10"))
    elif str(case) == "compare":
        import draftdoctor.compare as compare
        def opened(path, read=compare.open_checkpoint):
            checkpoint = read(path)
            if Path(path) == other:
                swap()
            return checkpoint
        compare.open_checkpoint = opened
        compare.compare(draft, other)
    else:
        from draftdoctor.fix import apply_fix, plan_fix
        plan = plan_fix(draft, "vllm==0.32.0", predict=False)
        swap()
        apply_fix(plan, out)
except CheckpointError as e:
    print(e)
"""


@pytest.mark.parametrize("case", ["check", "compare", "fix"])
def test_weights_swapped_for_a_fifo_after_their_header_was_read_are_refused_not_waited_on(case, tmp_path):
    """The value checks, compare's reader and fix's copy opened the weights again by name, blocking: a FIFO
    put in their place after the header was read had hung each for good."""
    draft = write_draft(tmp_path / "draft", layout="speculators")
    other = write_draft(tmp_path / "other", layout="speculators")
    proc = subprocess.run([sys.executable, "-c", SWAPPED, str(draft), str(other), str(tmp_path / "out"), case],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == f"{draft / 'model.safetensors'}: not a regular file (a FIFO, device or socket?)", \
        proc.stdout + proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()
