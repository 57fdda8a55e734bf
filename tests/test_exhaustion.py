"""No input exhausts the machine: what a draft's config claims is estimated
before it is built, and built on meta or refused when it is more than the machine can spare; the
reference server caps each request by what its prefill allocates; `bench` refuses, before anything is
launched, arguments no server could answer."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from draftdoctor import resources
from draftdoctor.synth import DraftShape, write_draft
from draftdoctor.engines import resolve_engine

from conftest import require_release

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
CLI = Path(sys.executable).with_name("draftdoctor")
# a 16 MB draft (t2d holds a byte a word) whose config claims a 16M-word vocabulary: its embedding alone is 4 GB in float32
HUGE_VOCAB = DraftShape(vocab=16_000_000, draft_vocab=128)


def test_memory_budget_reads_sizes_and_the_environment(monkeypatch):
    monkeypatch.setenv(resources.BUDGET_VARIABLE, "2G")
    assert resources.memory_budget() == 2 << 30
    monkeypatch.setenv(resources.BUDGET_VARIABLE, "1500000")
    assert resources.memory_budget() == 1_500_000
    monkeypatch.setenv(resources.BUDGET_VARIABLE, "512 MiB")
    assert resources.memory_budget() == 512 << 20
    monkeypatch.setenv(resources.BUDGET_VARIABLE, "lots")
    with pytest.raises(resources.UserError, match=resources.BUDGET_VARIABLE):
        resources.memory_budget()
    monkeypatch.delenv(resources.BUDGET_VARIABLE)
    # half of what the kernel says is available now, never more than the machine has
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < resources.memory_budget() <= total // 2


def test_build_bytes_follow_the_configs_dtype():
    assert resources.dtype_bytes({"torch_dtype": "bfloat16"}) == 2
    assert resources.dtype_bytes({"dtype": "torch.float16"}) == 2
    assert resources.dtype_bytes({"transformer_layer_config": {"torch_dtype": "float32"}}) == 4
    assert resources.dtype_bytes({}) == 4 and resources.dtype_bytes(None) == 4
    assert resources.build_bytes([(3, 4), (5,)], 2) == 34


def test_the_claim_is_the_configs_not_the_files(tmp_path):
    from draftdoctor.checkpoint import open_checkpoint
    from draftdoctor.realcheck import claimed_bytes

    folder = write_draft(tmp_path / "huge", HUGE_VOCAB, layout="midlayer")
    assert sum(f.stat().st_size for f in folder.iterdir()) < 32 << 20  # t2d: one byte a word
    checkpoint = open_checkpoint(folder)
    claimed = claimed_bytes(checkpoint, resolve_engine("sglang==0.5.10"))
    # the embedding SGLang builds at the claimed vocabulary, in the config's dtype
    assert claimed >= 16_000_000 * 64 * resources.dtype_bytes(checkpoint.config)
    # llama.cpp's check also builds a stand-in vocabulary of the target's size
    assert claimed_bytes(open_checkpoint(folder), resolve_engine("llamacpp")) > claimed + 16_000_000 * 1000


def _peak_child_rss(argv, env) -> tuple[subprocess.CompletedProcess, int]:
    """Run `argv` under a small Python parent; return its result and the largest resident size (bytes)
    of any process it waited for (the CLI and the real loader's child it starts)."""
    probe = ("import resource, subprocess, sys, json\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "print(json.dumps([p.returncode, p.stdout, p.stderr, "
             "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024]))\n")
    run = subprocess.run([sys.executable, "-c", probe, *map(str, argv)], capture_output=True, text=True, env=env,
                         timeout=600)
    code, out, err, peak = json.loads(run.stdout)
    return subprocess.CompletedProcess(argv, code, out, err), peak


def claiming(folder: Path) -> Path:
    """A 100 kB draft whose config claims a 200000-word vocabulary over a hidden size of 8192 (the
    issue's attack): without the estimate SGLang 0.5.10's check reached 5.6 GB, 0.47 GB with it."""
    folder = write_draft(folder, DraftShape(), layout="midlayer")
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=8192, vocab_size=200_000, intermediate_size=28672, num_attention_heads=64,
                  num_key_value_heads=8, head_dim=128)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("engine, release", [("sglang", "0.5.10"), ("vllm", "0.32.0")])
def test_a_draft_claiming_more_than_the_machine_has_is_built_on_meta(engine, release, tmp_path):
    require_release(release, engine)
    folder = claiming(tmp_path / "claims")
    env = dict(os.environ, DRAFTDOCTOR_REALLOAD_WORKER="0", **{resources.BUDGET_VARIABLE: "1G"})
    result, peak = _peak_child_rss([CLI, "check", folder, "--engine", f"{engine}=={release}", "--loader", "real",
                                    "--format", "json"], env)
    assert result.returncode in (0, 1), result.stderr
    assert peak < 3 << 30, f"a child reached {peak / 1e9:.1f} GB"
    report = json.loads(result.stdout)
    said = [f["message"] for f in report["findings"] if f["code"] == "not-checked"]
    assert any("meta device" in m and "GB" in m for m in said), said
    assert report["loader"] == "real"


def test_llamacpp_refuses_a_vocabulary_it_cannot_stand_in_for(tmp_path):
    require_release("0.3.36", "llamacpp")
    folder = write_draft(tmp_path / "huge", HUGE_VOCAB, layout="midlayer")
    env = dict(os.environ, **{resources.BUDGET_VARIABLE: "1G"})
    real = subprocess.run([CLI, "check", folder, "--engine", "llamacpp", "--loader", "real"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert real.returncode == 2, real.stderr
    lines = real.stderr.strip().splitlines()
    assert len(lines) == 1 and str(folder) in lines[0] and "refused before building anything" in lines[0], lines
    # the default loader answers with the replay instead, and says the real check did not run
    auto = subprocess.run([CLI, "check", folder, "--engine", "llamacpp", "--format", "json"], capture_output=True,
                          text=True, env=env, timeout=120)
    report = json.loads(auto.stdout)
    assert report["loader"] == "replay"
    assert any(f["code"] == "not-checked" and "more than the 1.1 GB" in f["message"] for f in report["findings"])


# --- the reference server: a request's prefill is bounded by the budget ---

def _forward_within(tokens: int, share: float) -> str:
    """In a fresh process: a demo-target forward of `tokens` with its address space held to what it
    had after a warm-up plus `share` of forward_bytes(tokens). "ok", or the allocator's refusal."""
    probe = ("import resource, torch\n"
             "from draftdoctor.eagle.llama import TargetModel\n"
             f"m = TargetModel.from_dir({str(DEMO / 'target')!r})\n"
             "torch.set_num_threads(1)\n"
             "m.forward(torch.zeros(8, dtype=torch.long), m.new_cache())\n"  # one-time set-up first
             "mapped = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
             f"limit = mapped + int({share} * m.forward_bytes({tokens}))\n"
             "resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))\n"
             "try:\n"
             f"    m.forward(torch.randint(0, m.vocab_size, ({tokens},)), m.new_cache())\n"
             "    print('ok')\n"
             "except (RuntimeError, MemoryError) as e:\n"
             "    print('refused', str(e)[:200])\n")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300).stdout.strip()


def test_the_prefill_estimate_bounds_what_a_forward_allocates():
    """The server's limit rests on forward_bytes being an upper bound: a 4000-token forward runs within
    the address space it allows, and not within a third of it (so the bound is not vacuous)."""
    assert _forward_within(4000, 1.0) == "ok"
    assert _forward_within(4000, 0.3).startswith("refused")


def test_longest_request_is_the_largest_within_the_budget():
    from draftdoctor.reference.server import longest_request

    cost = lambda t: t * t  # noqa: E731
    assert longest_request(cost, 10_000, 1_000_000) == 1000
    assert longest_request(cost, 500, 1_000_000) == 500
    assert longest_request(cost, 500, 0) == 0


def test_a_long_context_target_caps_requests_by_memory(tmp_path, monkeypatch):
    """The issue's attack: a target claiming a long context, and a 900 kB prompt."""
    import argparse

    from draftdoctor.reference.server import ReferenceEngine

    target = tmp_path / "target"
    shutil.copytree(DEMO / "target", target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 1_000_000}))
    monkeypatch.setenv(resources.BUDGET_VARIABLE, "200M")
    args = argparse.Namespace(engine="sglang==0.5.10", model_path=str(target), loader="replay",
                              speculative_draft_model_path=str(DEMO / "draft-story"), speculative_num_steps=4,
                              speculative_num_draft_tokens=5, decode_log_interval=40)
    engine = ReferenceEngine(args)
    assert 100 < engine.longest < 1_000_000
    assert 2 * engine.target.forward_bytes(engine.longest) <= 200 << 20
    ids, problem = engine.prompt_ids("w " * 450_000, 16)
    assert ids == [] and "memory budget" in problem and str(engine.longest) in problem
    words = " ".join(["the"] * engine.longest)
    _, problem = engine.prompt_ids(words, 16)
    assert problem and "memory budget" in problem
    _, problem = engine.prompt_ids("the cat", 16)
    assert problem is None


# --- bench: arguments no server could answer are refused before launching ---

def _bench(tmp_path, *argv, target=DEMO / "target"):
    out = tmp_path / "out"
    run = subprocess.run([CLI, "bench", "--target", target, "--draft", f"a={DEMO / 'draft-story'}", "--out", out,
                          *map(str, argv)], capture_output=True, text=True, timeout=120)
    return run, out


@pytest.mark.parametrize("argv, said", [
    (["--max-new-tokens", "1000000000"], "at most 4096"),
    (["--max-new-tokens", "512"], "no room for a prompt in a context of 512 tokens"),
    (["--concurrency", "100000"], "at most 64 requests at once"),
    (["--prompts", "LONG"], "prompt 2 is 601 tokens"),
    (["--prompts", "HUGE"], "prompt 1 (2400000 characters) cannot fit"),
])
def test_bench_refuses_what_no_server_could_answer_before_launching(argv, said, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    if "LONG" in argv:
        prompts.write_text(json.dumps({"prompt": "hello"}) + "\n" + json.dumps({"prompt": "word " * 600}) + "\n")
    if "HUGE" in argv:
        prompts.write_text(json.dumps({"prompt": "w" * 2_400_000}) + "\n")
    argv = [str(prompts) if a in ("LONG", "HUGE") else a for a in argv]
    run, out = _bench(tmp_path, *argv)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], lines
    if "--prompts" in argv:
        assert str(prompts) in lines[0]
    assert not out.exists(), "nothing is launched or written"


def test_the_served_context_is_the_backends_row(tmp_path):
    """vLLM and llama-server are launched with a 512-token context: a target of a longer one does not
    make room for more there; a user's own flag does."""
    from draftdoctor.serving.bench import BenchInputError, check_requests
    from draftdoctor.serving.vllm import SERVER_FLAGS

    target = tmp_path / "target"
    shutil.copytree(DEMO / "target", target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 8192}))
    assert "512" in SERVER_FLAGS
    check_requests("reference", target, ["hello"], 600, 1)
    for backend, flag in (("vllm", "--max-model-len"), ("llamacpp", "-c")):
        with pytest.raises(BenchInputError, match=f"served with {flag} 512"):
            check_requests(backend, target, ["hello"], 600, 1)
        check_requests(backend, target, ["hello"], 600, 1, extra_args=[flag, "2048"])
