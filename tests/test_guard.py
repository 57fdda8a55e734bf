"""The guard in the serving process: the engine's own loader, recorded in the process that
loads the draft, refuses a draft it leaves unwritten before the server is ready.

- the launcher and its start-up hook (no engine): usage, what keeps the hook out, every spawned process;
  a command in which the guard never reported from a draft load fails (exit 2), however the hook was
  kept out; the launcher passes signals on; `serve --guard` stops a server that became ready unguarded;
- SGLang: its build-and-load path (`realload.child --load-only`, what the scheduler calls) behind the
  launcher, over CI's releases; the guard's findings are `check --loader real`'s, word for word; a good
  draft named by a hub id is served; a draft class the kit does not model is said to be not judged;
- vLLM: the plugin entry point over CI's releases; the worker's draft load (`realload.vllm_child
  --load-only`: EagleProposer.load_model) of a good draft named by a hub id, and of a DeepSeek target's
  MTP head; judged from the keys alone, the verdict is the real check's; and live on 0.32.0: `serve
  --guard` refuses the story's draft without its decoder layer, `bench --guard` measures a good draft as
  without the guard.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import releases_under_test, require_release

from draftdoctor.guard import ENV
from draftdoctor.guard.__main__ import STARTUP, blind_option
from draftdoctor.engines import resolve_engine

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
    through the environment; a sitecustomize the user had still runs. Each says so to the launcher, which
    counts them; none loaded a draft, so the launcher fails, in one line."""
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
                          env=_env(PYTHONPATH=os.pathsep.join([str(mine), str(ROOT / "lib")])), cwd=tmp_path,
                          timeout=120)
    seen = eval(proc.stdout.strip().splitlines()[-1])
    assert len({pid for pid, *_ in seen}) == 2 and all(rest == [True, True, "1"] for _, *rest in seen), seen
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    counted = re.search(r"unguarded: the guard was present in (\d+) of its processes, but no draft was loaded",
                        proc.stderr)
    assert counted and int(counted[1]) >= 2, proc.stderr  # the two above (and multiprocessing's resource tracker)


@pytest.mark.parametrize("command", [
    ["env", sys.executable, "-I", "-c", "pass"],
    ["sh", "-c", f"{sys.executable} -S -c pass"],
    [sys.executable, "--check-hash-based-pycs", "default", "-I", "-c", "pass"],
    [sys.executable, "-c", "import os, sys; os.execv(sys.executable, [sys.executable, '-E', '-c', 'pass'])"],
])
def test_a_command_the_hook_never_reached_fails(command):
    """However the start-up hook is kept out of the process that would load the draft (an option behind
    `env` or a shell, an option the launcher's own parse does not know, a process that re-executes
    itself), that process never reports to the launcher: the command ends with status 0, the launcher
    fails in one line."""
    proc = subprocess.run([*GUARD, *command], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("draftdoctor guard: ")
    assert "unguarded" in proc.stderr or "would not run the guard's start-up hook" in proc.stderr


def test_a_command_that_fails_on_its_own_keeps_its_status():
    """Nothing ran blind when the command failed before loading anything: its status, no word of the guard's."""
    proc = subprocess.run([*GUARD, sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert proc.returncode == 3 and "draftdoctor guard" not in proc.stderr, proc.stderr


def test_the_launcher_passes_signals_on_and_fails_a_server_stopped_unguarded(tmp_path):
    """The launcher stays the command's parent: a SIGTERM sent to it alone reaches the command. A server
    stopped that way without the guard having judged a draft ran unguarded: exit 2."""
    script = tmp_path / "server.py"
    script.write_text("import signal, sys\n"
                      "signal.signal(signal.SIGTERM, lambda *_: (print('stopped by', _[0], flush=True), sys.exit(0)))\n"
                      "print('serving', flush=True)\n"
                      "signal.pause()\n")
    proc = subprocess.Popen([*GUARD, sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    assert proc.stdout.readline() == "serving\n"  # its handler is in place
    proc.send_signal(signal.SIGTERM)  # to the launcher only
    out, err = proc.communicate(timeout=60)
    assert out == f"stopped by {int(signal.SIGTERM)}\n", (out, err)
    assert proc.returncode == 2 and "python ended (status 0) unguarded" in err, err


def test_off_unless_asked_for(tmp_path):
    """Without the variable the plugin vLLM loads in every process changes nothing."""
    code = ("import sys; from draftdoctor.guard import vllm, sglang; vllm.register(); sglang.install(); "
            "print(vllm._STATE['registered'], sglang._STATE['installed'], "
            "any(type(f).__module__ == 'draftdoctor.guard.hooks' for f in sys.meta_path))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.stdout.split() == ["False", "False", "False"], proc.stderr
    assert STARTUP.is_dir() and [p.name for p in STARTUP.iterdir() if p.suffix == ".py"] == ["sitecustomize.py"]


FAKE_SERVER = textwrap.dedent("""
    import socket, sys
    listening = socket.socket()
    listening.bind(("127.0.0.1", int(sys.argv[1])))
    listening.listen()
    if sys.argv[2] == "judged":  # what the guard's hook does once it has judged a draft in this process
        from draftdoctor.guard import DRAFT, SERVED, report
        report(DRAFT, outcome=SERVED, line="draftdoctor guard: 1 of 1 draft parameters written")
    from draftdoctor.serving.sglang import READY_LINE
    print(READY_LINE, flush=True)
    while True:  # until stopped: the launcher may knock (its health check) before the ready line is printed
        listening.accept()[0].close()
""")


@pytest.mark.parametrize("judged", [False, True])
def test_serve_guard_stops_a_server_that_became_ready_unguarded(judged, tmp_path):
    """`serve/bench --guard` read the guard's reports the moment the server is ready (behind the launcher,
    as for SGLang): a server in which no process judged a draft is stopped, GuardAbsent, one line; one
    whose draft was judged is served."""
    from draftdoctor.serving.launcher import GuardAbsent, Server

    (tmp_path / "server.py").write_text(FAKE_SERVER)
    argv = lambda port: [*GUARD, sys.executable, str(tmp_path / "server.py"), str(port),  # noqa: E731
                         "judged" if judged else "blind"]
    server = Server(argv, tmp_path / "server.log", "127.0.0.1", 0, env=_env(), guarded=True)
    if judged:
        with server:
            assert server.process.poll() is None
        return
    with pytest.raises(GuardAbsent) as raised:
        with server:
            pass
    assert "--guard: the server became ready, but the guard was present in" in str(raised.value)
    assert len(str(raised.value).splitlines()) == 1 and server.process is None  # stopped


def _hub_cache(hf_home: Path, repo: str, folder: Path) -> str:
    """`folder` as the Hugging Face hub cache keeps a download of `repo` (blobs, a snapshot of links to
    them, refs/main): with HF_HUB_OFFLINE the engines resolve `repo` to that snapshot themselves."""
    import hashlib
    import shutil

    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    (root / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(snapshot.name)
    for file in folder.iterdir():
        blob = root / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return repo


def _eagle1_draft(folder: Path) -> Path:
    """A tiny EAGLE-1 draft (SGLang's LlamaForCausalLMEagle: fc over two states, no input norm in layer 0):
    a draft class the kit does not model, at the demo target's sizes."""
    from draftdoctor.synthwrite import write_shards

    folder.mkdir()
    H, I, V, L = 64, 192, 114, "layers.0."
    t = lambda *dims: ("F32", dims)  # noqa: E731
    write_shards(folder, {"embed_tokens.weight": t(V, H), "fc.weight": t(H, 2 * H), "fc.bias": t(H),
                          f"{L}self_attn.q_proj.weight": t(64, H), f"{L}self_attn.k_proj.weight": t(32, H),
                          f"{L}self_attn.v_proj.weight": t(32, H), f"{L}self_attn.o_proj.weight": t(H, 64),
                          f"{L}post_attention_layernorm.weight": t(H), f"{L}mlp.gate_proj.weight": t(I, H),
                          f"{L}mlp.up_proj.weight": t(I, H), f"{L}mlp.down_proj.weight": t(H, I)}, 1)
    config = json.loads((DEMO / "draft-story" / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in ("draft_vocab_size", "eagle_config")}
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLMEagle"]}))
    return folder


# -- SGLang, through the launcher, over CI's releases --------------------------------------------------

def _guarded_sglang_load(release, drafts, tmp_path, **env):
    """SGLang's own config reader, model build and default loader on each draft, in a process started
    behind the launcher (the release seen as a server sees it: its folder first, then the kit)."""
    from draftdoctor.realload import kit_path, release_env

    path = os.pathsep.join([str(release_env(release, "sglang")), str(kit_path())])
    return subprocess.run([*GUARD, sys.executable, "-m", "draftdoctor.realload.child", "--release", release,
                           "--load-only", *map(str, drafts)], capture_output=True, text=True, cwd=tmp_path,
                          env=_env(PYTHONPATH=path, HF_HUB_OFFLINE="1", PYTHONSAFEPATH="1", TMPDIR=_scratch(tmp_path),
                                   **env), timeout=600)


def _scratch(tmp_path) -> str:
    """The engine's TMPDIR, as a server has its own (the engines leave lock files there for a hub id)."""
    (tmp_path / "engine-tmp").mkdir(exist_ok=True)
    return str(tmp_path / "engine-tmp")


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
    *checked_fixed, checked_story = real_checks([*fixed, DEMO / "draft-story"], resolve_engine(engine))
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
    checked = real_checks([complete, headless], resolve_engine("sglang==0.5.23"))
    assert checked[1].uninitialized and not checked[0].uninitialized
    proc = _guarded_sglang_load("0.5.23", [complete, headless], tmp_path)
    said = _guard_lines(proc.stderr)
    assert proc.returncode == 1 and said[0].endswith("draft parameters written"), proc.stderr[-3000:]
    assert "lm_head.weight" in proc.stderr[proc.stderr.index(said[1]):]
    assert [line.strip() for line in proc.stderr.splitlines() if line.startswith("  ERROR")] == \
        _refusal_lines(checked[1])


@pytest.mark.parametrize("release", ["0.4.8.post1", "0.5.10"])  # a ModelConfig that keeps is_draft_model from 0.5.9
def test_sglang_guard_serves_a_good_draft_named_by_a_hub_id_and_says_what_it_does_not_judge(release, tmp_path):
    """A good draft served as `org/name`: SGLang resolves it to the hub cache's snapshot itself, and the
    guard judges what its loader opened there (the real check's rules: its t2d is skipped by design), so
    it is served, not refused. An EAGLE-1 draft (a class the kit does not model) is loaded untouched and
    said to be not judged, in one line, never passed off as a verdict. (No rewrite makes the story's draft
    serve on 0.4.8, whose fc needs a bias: the EAGLE-1 draft alone there.)"""
    from draftdoctor.checkpoint import open_checkpoint
    from draftdoctor.fix import FixBlocked, apply_fix, plan_fix

    require_release(release)
    try:
        good = [apply_fix(plan_fix(DEMO / "draft-story", f"sglang=={release}", target=DEMO / "target"),
                          tmp_path / "fixed").dst]
    except FixBlocked:
        good = []
    assert good or release == "0.4.8.post1"
    assert all("t2d" in open_checkpoint(g).tensors for g in good)  # which SGLang skips by design
    hub = [_hub_cache(tmp_path / "hf", "org/good-draft", g) for g in good]
    proc = _guarded_sglang_load(release, [*hub, _eagle1_draft(tmp_path / "eagle1")], tmp_path,
                                HF_HOME=str(tmp_path / "hf"))
    said = _guard_lines(proc.stderr)
    assert proc.returncode == 0 and len(said) == len(good) + 1, proc.stderr[-3000:]
    assert all(re.fullmatch(r"draftdoctor guard: (\d+) of \1 draft parameters written", line) for line in said[:-1])
    assert said[-1].startswith(f"draftdoctor guard: not judged: {tmp_path / 'eagle1'} is loaded by sglang=={release} "
                               "as LlamaForCausalLMEagle, not an EAGLE-3 draft class the kit models"), said


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


# vLLM 0.34.0 loads drafts only through Model Runner V2's speculators (its V1 `EagleProposer` is gone), which
# the guard does not wrap: a guarded 0.34.0 server is stopped as unguarded (docs/guard.md)
V1_PROPOSER_RELEASES = [r for r in releases_under_test("vllm") if r != "0.34.0"]


@pytest.mark.parametrize("release", V1_PROPOSER_RELEASES)
def test_vllm_loads_the_plugin_and_it_hooks_the_draft_load(release, tmp_path):
    """vLLM's own plugin loader finds the kit's entry point (the installed package's metadata) and, with
    the guard on, the two methods it wraps exist in the release and are wrapped."""
    from draftdoctor.realload import release_env

    require_release(release, "vllm")
    env = _env(PYTHONPATH=os.pathsep.join([str(release_env(release, "vllm")), str(ROOT / "lib")]), **{ENV: "1"})
    proc = subprocess.run([sys.executable, "-c", HOOKED, release], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["draftdoctor.guard.vllm", "draftdoctor.guard.vllm"], proc.stderr[-3000:]


# -- vLLM: the worker's draft load, with the plugin, on the CPU --------------------------------------

def _vllm_worker_load(target, drafts, tmp_path, method="eagle3", **env):
    """vLLM 0.32.0 builds `target` and loads each draft through the proposer a server's worker uses
    (`EagleProposer.load_model`), with its plugins loaded as a server's processes load them and the guard on."""
    from draftdoctor.realload import release_env

    path = os.pathsep.join([str(release_env("0.32.0", "vllm")), str(ROOT / "lib")])
    return subprocess.run([sys.executable, "-m", "draftdoctor.realload.vllm_child", "--release", "0.32.0",
                           "--load-only", str(target), "--method", method, *map(str, drafts)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env=_env(PYTHONPATH=path, HF_HUB_OFFLINE="1", PYTHONSAFEPATH="1", TMPDIR=_scratch(tmp_path),
                                   **{ENV: "1"}, **env))


def test_vllm_guard_serves_a_good_draft_named_by_a_hub_id(tmp_path):
    """`--speculative-config '{"model": "org/name", ...}'`: vLLM resolves the hub id to the cache's
    snapshot; the guard judges what its loader opened there, by the real check's rules (the draft's t2d
    is skipped by design), and serves it."""
    from draftdoctor.fix import apply_fix, plan_fix

    require_release("0.32.0", "vllm")
    good = apply_fix(plan_fix(DEMO / "draft-story", "vllm==0.32.0", target=DEMO / "target"), tmp_path / "fixed").dst
    repo = _hub_cache(tmp_path / "hf", "org/good-draft", good)
    proc = _vllm_worker_load(DEMO / "target", [repo], tmp_path, HF_HOME=str(tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _guard_lines(proc.stderr) == ["draftdoctor guard: 12 of 12 draft parameters written"], proc.stderr[-3000:]
    assert "loaded org/good-draft as Eagle3LlamaForCausalLM" in proc.stderr


def test_vllm_guard_leaves_an_mtp_head_alone_and_says_so(tmp_path):
    """vLLM's `mtp` method goes through the same EagleProposer as eagle3. A DeepSeek-V3 target's MTP head
    (vLLM's DeepSeekMTP, whose load_weights skips every key of the target that is not MTP, by design) is
    not a draft class the kit models: loaded untouched, served, and said to be not judged."""
    from draftdoctor.synth import write_mtp_target

    require_release("0.32.0", "vllm")
    target = write_mtp_target(tmp_path / "deepseek-v3-mtp")
    proc = _vllm_worker_load(target, [], tmp_path, method="mtp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = _guard_lines(proc.stderr)
    assert len(said) == 1 and said[0].startswith(
        f"draftdoctor guard: not judged: {target} is loaded by vllm==0.32.0 as DeepSeekMTP, not an EAGLE-3 draft "
        "class the kit models (Eagle3DeepseekV2ForCausalLM, Eagle3LlamaForCausalLM, Eagle3Qwen3ForCausalLM)"), said
    assert f"loaded {target} as DeepSeekMTP" in proc.stderr


def test_judged_from_the_keys_alone_the_verdict_is_the_real_checks(tmp_path):
    """When the folder the loader opened is not seen, the guard judges the keys the loader read (names,
    shapes, dtypes) with the real check's own rules: the same statuses and findings as from the folder,
    t2d skipped by design, a draft without its decoder layer refused in the same words."""
    from draftdoctor.checkpoint import open_checkpoint, read_config
    from draftdoctor.coverage import IGNORED
    from draftdoctor.engines import resolve_engine
    from draftdoctor.fix import apply_fix, plan_fix
    from draftdoctor.guard import judge, recorded_checkpoint
    from draftdoctor.realcheck import coverage_from
    from draftdoctor.realload import run_real_loaders
    from draftdoctor.serving.vllm import as_loaded_by

    require_release("0.32.0", "vllm")
    engine = resolve_engine("vllm==0.32.0")
    good = apply_fix(plan_fix(DEMO / "draft-story", engine, target=DEMO / "target"), tmp_path / "fixed").dst
    no_layer = as_loaded_by(DEMO / "draft-story", resolve_engine("sglang==0.5.10"), tmp_path / "no-layer")
    raws = run_real_loaders([good, no_layer], "0.32.0", engine_name="vllm")
    for folder, raw in zip((good, no_layer), raws):
        config = read_config(folder)
        on_disk = coverage_from(raw, open_checkpoint(folder), engine)
        from_keys = coverage_from(raw, recorded_checkpoint(raw["keys"], config), engine)
        assert [(p.name, p.status, p.shape, p.nbytes) for p in from_keys.params] == \
            [(p.name, p.status, p.shape, p.nbytes) for p in on_disk.params]
        assert [(k.key, k.status, k.reason) for k in from_keys.keys] == \
            [(k.key, k.status, k.reason) for k in on_disk.keys]
        assert [f.line() for f in from_keys.findings] == [f.line() for f in on_disk.findings]
        seen = judge(raw, folder, engine.spec, opened=[folder])
        unseen = judge(raw, "org/draft", engine.spec, config=config)
        assert (seen.refused, seen.written, seen.total, seen.findings) == \
            (unseen.refused, unseen.written, unseen.total, unseen.findings)
        assert unseen.notes == [f"the folder its loader opened was not seen: judged from the {len(raw['keys'])} keys "
                                "the loader read"]
    assert not judge(raws[0], "org/draft", engine.spec).refused  # not even a config: still the check's rules
    assert next(k for k in coverage_from(raws[0], recorded_checkpoint(raws[0]["keys"], None), engine).keys
                if k.key == "t2d").status == IGNORED
    assert judge(raws[1], "org/draft", engine.spec, config=read_config(no_layer)).refused


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
    checked = real_check(no_layer, resolve_engine("vllm==0.32.0"), target_config=json.loads((DEMO / "target" / "config.json").read_text()))
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
