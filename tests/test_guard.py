"""The guard in the serving process (issue 34): the engine's own loader, recorded in the process that
loads the draft, refuses a draft it leaves unwritten before the server is ready.

- the launcher and its start-up hook (no engine): usage, what keeps the hook out, every spawned process;
- SGLang: its build-and-load path (`realload.child --load-only`, what the scheduler calls) behind the
  launcher, over CI's releases; the guard's findings are `check --loader real`'s, word for word;
- vLLM: the plugin entry point over CI's releases, and live on 0.32.0: `serve --guard` refuses the
  story's draft without its decoder layer, `bench --guard` measures a good draft as without the guard.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import releases_under_test, require_release

from draftdoctor.guard import ENV
from draftdoctor.guard.__main__ import STARTUP, blind_option

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
STORY = (DEMO / "draft-story").resolve()  # as the engine names it (data/demo is a link)
GUARD = [sys.executable, "-m", "draftdoctor.guard", "--"]
REFUSING = ("uninitialized-params", "dropped-keys")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != ENV}
    return {**env, "PYTHONPATH": str(ROOT / "lib"), **extra}


# -- the launcher -------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    ([], "usage: python -m draftdoctor.guard -- COMMAND"),
    (["python"], "usage: python -m draftdoctor.guard -- COMMAND"),
    (["--", "/nonexistent/python3"], "draftdoctor guard: cannot run /nonexistent/python3"),
    (["--", sys.executable, "-S", "-m", "sglang.launch_server"], "-S would not run the guard's start-up hook"),
    (["--", sys.executable, "-u", "-I", "-c", "pass"], "-I would not run the guard's start-up hook"),
])
def test_the_launcher_refuses_in_one_line(argv, says):
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.guard", *argv], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


def test_options_that_keep_the_hook_out_are_told_from_others():
    assert blind_option(["python3", "-X", "importtime", "-m", "x"]) is None
    assert blind_option(["python3", "-W", "ignore", "-uSB", "-m", "x"]) == "-uSB"
    assert blind_option(["python3", "-m", "x", "-S"]) is None  # the module's own option
    assert blind_option(["torchrun", "-S"]) is None


def test_the_hook_is_in_every_process_the_command_spawns_and_keeps_the_users_sitecustomize(tmp_path):
    """SGLang starts its schedulers with multiprocessing's spawn: fresh interpreters, which see the hook
    through the environment; a sitecustomize the user had still runs."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    script = textwrap.dedent("""
        import multiprocessing as mp, os, sys

        def report(queue):
            from draftdoctor.guard import sglang, vllm
            queue.put((os.getpid(), sglang._STATE["installed"], vllm._STATE["registered"],
                       os.environ.get("USER_SITECUSTOMIZE_RAN")))

        if __name__ == "__main__":
            mp.set_start_method("spawn")
            queue = mp.Queue()
            child = mp.Process(target=report, args=(queue,))
            child.start()
            child.join()
            report(queue)
            print(sorted(queue.get() for _ in range(2)))
    """)
    (tmp_path / "spawns.py").write_text(script)
    proc = subprocess.run([*GUARD, sys.executable, str(tmp_path / "spawns.py")], capture_output=True, text=True,
                          env=_env(PYTHONPATH=str(mine)), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = eval(proc.stdout.strip().splitlines()[-1])
    assert len({pid for pid, *_ in seen}) == 2 and all(rest == [True, True, "1"] for _, *rest in seen), seen


def test_off_unless_asked_for(tmp_path):
    """Without the variable the plugin vLLM loads in every process changes nothing."""
    code = ("import sys; from draftdoctor.guard import vllm, sglang; vllm.register(); sglang.install(); "
            "print(vllm._STATE['registered'], sglang._STATE['installed'], "
            "any(type(f).__module__ == 'draftdoctor.guard.hooks' for f in sys.meta_path))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.stdout.split() == ["False", "False", "False"], proc.stderr
    assert STARTUP.is_dir() and [p.name for p in STARTUP.iterdir() if p.suffix == ".py"] == ["sitecustomize.py"]


# -- SGLang, through the launcher, over CI's releases --------------------------------------------------

def _guarded_sglang_load(release, drafts, tmp_path):
    """SGLang's own config reader, model build and default loader on each draft, in a process started
    behind the launcher (the release seen as a server sees it: its folder first, then the kit)."""
    from draftdoctor.realload import kit_path, release_env

    path = os.pathsep.join([str(release_env(release, "sglang")), str(kit_path())])
    return subprocess.run([*GUARD, sys.executable, "-m", "draftdoctor.realload.child", "--release", release,
                           "--load-only", *map(str, drafts)], capture_output=True, text=True, cwd=tmp_path,
                          env=_env(PYTHONPATH=path, HF_HUB_OFFLINE="1", PYTHONSAFEPATH="1"), timeout=600)


def _refusal_lines(report):
    return [f.line() for f in report.findings if f.severity == "error" and f.code in REFUSING]


def _guard_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("draftdoctor guard")]


@pytest.mark.parametrize("release", releases_under_test("sglang"))
def test_sglang_guard_says_what_the_real_check_says(release, tmp_path):
    """The story's draft as the story served it, and its fix for the release: a fixed draft passes with
    one line, the story's is refused (exit 1) exactly where the real check finds parameters unwritten
    or tensors dropped, with the real check's own finding lines. (A release no rewrite makes serve the
    draft, where `fix` refuses, has the story's draft only.)"""
    from draftdoctor.fix import FixBlocked, apply_fix, plan_fix
    from draftdoctor.realcheck import real_checks

    require_release(release)
    engine = f"sglang=={release}"
    try:
        fixed = [apply_fix(plan_fix(DEMO / "draft-story", engine, target=DEMO / "target"), tmp_path / "fixed").dst]
    except FixBlocked:
        fixed = []
    *checked_fixed, checked_story = real_checks([*fixed, DEMO / "draft-story"], engine)
    proc = _guarded_sglang_load(release, [*fixed, DEMO / "draft-story"], tmp_path)
    said = _guard_lines(proc.stderr)
    for checked in checked_fixed:
        assert not (checked.uninitialized or checked.dropped), checked.findings
        n = len(checked.params)
        assert said.pop(0) == f"draftdoctor guard: {n} of {n} draft parameters written", proc.stderr[-3000:]
    said.insert(0, None)  # the story's line is said[1] from here
    if any(f.code in ("loader-crash", "shape-mismatch") and f.severity == "error" for f in checked_story.findings):
        # SGLang's loader raises on it: the server does not start, in SGLang's words; nothing for the guard to judge
        assert proc.returncode == 1 and len(said) == 1 and "Traceback" in proc.stderr, proc.stderr[-3000:]
    elif checked_story.uninitialized or checked_story.dropped:
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert said[1].startswith(f"draftdoctor guard: refusing to serve {STORY} with {engine}")
        refusal = proc.stderr[proc.stderr.index(said[1]):].splitlines()
        assert [line.strip() for line in refusal[1:] if line.startswith("  ERROR")] == _refusal_lines(checked_story)
        assert "never in a serving GPU server" in proc.stderr  # what was not run live, said
    else:
        assert proc.returncode == 0 and said[1].startswith("draftdoctor guard: "), proc.stderr[-3000:]


def test_sglang_guard_refuses_an_mla_draft_without_its_head(tmp_path):
    """SGLang 0.5.23's Eagle3DeepseekV2ForCausalLM (Kimi/DeepSeek targets): a draft that declares its own
    vocabulary but ships no lm_head is refused; the complete one is served."""
    from draftdoctor.realcheck import real_checks
    from draftdoctor.synth import DraftShape, write_mla_draft

    require_release("0.5.23")
    complete = write_mla_draft(tmp_path / "complete")
    headless = write_mla_draft(tmp_path / "no-lm-head", shape=DraftShape(draft_vocab=256), drop=("lm_head.weight",))
    checked = real_checks([complete, headless], "sglang==0.5.23")
    assert checked[1].uninitialized and not checked[0].uninitialized
    proc = _guarded_sglang_load("0.5.23", [complete, headless], tmp_path)
    said = _guard_lines(proc.stderr)
    assert proc.returncode == 1 and said[0].endswith("draft parameters written"), proc.stderr[-3000:]
    assert "lm_head.weight" in proc.stderr[proc.stderr.index(said[1]):]
    assert [line.strip() for line in proc.stderr.splitlines() if line.startswith("  ERROR")] == \
        _refusal_lines(checked[1])


# -- vLLM: the plugin entry point ----------------------------------------------------------------------

HOOKED = textwrap.dedent("""
    import sys
    from draftdoctor.realload.vllm_child import set_up
    set_up(sys.argv[1])  # what the kit's vLLM child needs around an older release on this torch
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    import vllm.model_executor.model_loader.default_loader as loader, vllm.v1.spec_decode.eagle as eagle
    print(loader.DefaultModelLoader.load_weights.__module__, eagle.EagleProposer.load_model.__module__)
""")


@pytest.mark.parametrize("release", releases_under_test("vllm"))
def test_vllm_loads_the_plugin_and_it_hooks_the_draft_load(release, tmp_path):
    """vLLM's own plugin loader finds the kit's entry point (the installed package's metadata) and, with
    the guard on, the two methods it wraps exist in the release and are wrapped."""
    from draftdoctor.realload import release_env

    require_release(release, "vllm")
    env = _env(PYTHONPATH=str(release_env(release, "vllm")), **{ENV: "1"})
    proc = subprocess.run([sys.executable, "-c", HOOKED, release], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["draftdoctor.guard.vllm", "draftdoctor.guard.vllm"], proc.stderr[-3000:]


# -- vLLM live, on the CPU ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """The story's draft as SGLang 0.5.10 leaves it (no decoder layer: `layers.0.*` dropped) and its fix."""
    from draftdoctor.engines import resolve_engine
    from draftdoctor.fix import apply_fix, plan_fix
    from draftdoctor.serving.vllm import as_loaded_by

    require_release("0.32.0", "vllm")
    root = tmp_path_factory.mktemp("guard-vllm")
    no_layer = as_loaded_by(DEMO / "draft-story", resolve_engine("sglang==0.5.10"), root / "no-layer")
    fixed = apply_fix(plan_fix(DEMO / "draft-story", "vllm==0.32.0", target=DEMO / "target"), root / "fixed").dst
    return root, no_layer, fixed


def test_serve_guard_refuses_a_draft_without_its_decoder_layer(drafts):
    from draftdoctor.realcheck import real_check

    root, no_layer, _ = drafts
    log = root / "serve-no-layer.log"
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "serve", "--backend", "vllm", "--guard",
                           "--model-path", str(DEMO / "target"), "--speculative-draft-model-path", str(no_layer),
                           "--log", str(log), "--ready-timeout", "300"],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 1, proc.stderr[-3000:]
    text = log.read_text()
    assert "Application startup complete." not in text  # stopped before it was ready
    # with the target's config, as the server has it: which parameters the proposer takes from the target
    checked = real_check(no_layer, "vllm==0.32.0", target_config=json.loads((DEMO / "target" / "config.json").read_text()))
    layer = [p.name for p in checked.uninitialized]
    assert layer and all(name in text for name in layer)
    said = [line.strip() for line in text.splitlines() if line.startswith("  ERROR")]
    expected = _refusal_lines(checked)
    # word for word up to the bytes the draft must supply: vLLM 0.32 also shares a draft embedding equal to
    # the target's (which the guard sees on the real target; the real check, on a stand-in, cannot)
    assert [line.split(" of ", 2)[:2] + line.split(": ", 2)[2:] for line in said] == \
        [line.split(" of ", 2)[:2] + line.split(": ", 2)[2:] for line in expected], (said, expected)
    assert "draftdoctor guard: refusing to serve" in proc.stderr  # serve names why the server exited


def _bench(root, name, draft, guard):
    out = root / f"bench-{name}"
    proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", "bench", "--backend", "vllm",
                           *(["--guard"] if guard else []), "--target", str(DEMO / "target"),
                           "--draft", f"{name}={draft}", "--out", str(out), "--num-prompts", "6"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((out / "results.json").read_text())["runs"][0]
    texts = [r["text"] for r in json.loads((out / "requests.json").read_text())[0]["request_log"]]
    return run, texts, (out / f"server-{name}.log").read_text()


def test_bench_guard_measures_a_good_draft_as_without_it(drafts):
    """The guard changes nothing the engine computes: same greedy texts, same acceptance counters."""
    root, _, fixed = drafts
    plain, plain_texts, plain_log = _bench(root, "plain", fixed, guard=False)
    guarded, guarded_texts, guarded_log = _bench(root, "guarded", fixed, guard=True)
    assert "draftdoctor guard" not in plain_log
    said = [line for line in guarded_log.splitlines() if line.startswith("draftdoctor guard: ")]
    assert len(said) == 1 and said[0].split(" draft parameters written")[0].split(": ")[1].split(" of ")[0] == \
        said[0].split(" of ")[1].split(" ")[0], said
    assert guarded_texts == plain_texts and all(plain_texts)
    assert guarded["accept_length"] == plain["accept_length"] and plain["accept_length"] >= 2.0
