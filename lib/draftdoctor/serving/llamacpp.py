"""llama.cpp as a serving backend on the CPU (`--backend llamacpp`; docs/engine-facts.md: "Real engines on these CPUs").

`make llamacpp` builds `llama-server` from the llama.cpp that the pinned llama-cpp-python sdist vendors;
its converter (`convert_hf_to_gguf.py`, from the same source) turns the target and each draft into GGUF
files (the draft with `--target-model-dir`, which EAGLE-3 requires), cached by content under the build
area. The server runs on 127.0.0.1 with `--spec-type draft-eagle3` always: with `-md` but without it,
llama-server loads the draft and does no speculation at all, silently, so the launcher refuses such a
launch and checks after start-up that every slot of the server's /slots says it speculates.
Prompts go as token ids (the target's tokenizer.json), so every backend sees the same tokens; acceptance
comes from llama.cpp's own `/metrics` counters, read around a run: verify steps (`spec_decode_num_drafts`),
draft tokens, accepted tokens, accepted per position.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..realload.childenv import CHILD_ENV
from ..toolstate import BUILD, STATE, trusted
from ..realload.common import die_with_parent
from .backends import BACKENDS
from .client import BenchResult, RequestResult
from .engine_http import counters_delta, get_text, post_json, spec_counters

HOME = BUILD / "llamacpp"
PACKAGE = "llama-cpp-python 0.3.36"  # mk/llamacpp.mk's LLAMACPP_PY; its vendored llama.cpp is what runs
SERVER = HOME / "build" / "bin" / "llama-server"
CONVERTER = HOME / "src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
GGUF_CACHE = STATE / "llamacpp" / "gguf"
HEALTH_PATH = "/health"
READY_LINE = "server is listening on"
SPEC_TYPE = "draft-eagle3"
# one thread: the kit's models are tiny, and two spinning threads on 2 shared cores stall (measured 3-5x)
ROW = BACKENDS["llamacpp"]
SERVER_FLAGS = ("-t", "1", "-tb", "1", ROW.context_flag, str(ROW.served_context), "-np", "1", "--metrics", "--no-webui", "--temp", "0",
                "--top-k", "1", "--seed", "0")
COUNTERS = {"drafts": "llamacpp:spec_decode_num_drafts_total",
            "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
            "accepted": "llamacpp:spec_decode_num_accepted_tokens_total"}
PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"


class LlamacppNotInstalled(UserError):
    pass


class ConversionFailed(UserError):
    """llama.cpp's converter refused a checkpoint (its own last words in the message)."""


def require() -> None:
    trusted(HOME, "llama.cpp's build")
    trusted(GGUF_CACHE, "the converted drafts' cache")
    if not SERVER.exists() or not CONVERTER.exists():
        raise LlamacppNotInstalled(f"--backend llamacpp needs llama.cpp built under {HOME}: run `make llamacpp`")


def version() -> str:
    """The build's own version line, e.g. 'version: 0.5.0-dev (build 1, commit 0c1e570)'."""
    out = subprocess.run([str(SERVER), "--version"], capture_output=True, text=True, timeout=30,
                         stdin=subprocess.DEVNULL)
    return next((line for line in (out.stdout + out.stderr).splitlines() if line.startswith("version")), "unknown")


def label() -> str:
    commit = re.search(r"commit (\w+)", version())
    return f"llama.cpp {commit.group(1) if commit else '?'} ({PACKAGE} sdist; real engine, CPU)"


def _fingerprint(folder: Path) -> str:
    """What a conversion depends on: the files' names, sizes and modification times."""
    h = hashlib.sha256(str(folder.resolve()).encode())
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def convert(model_dir, target_dir=None, timeout: float = 600.0) -> Path:
    """The GGUF (float32) of `model_dir`, converted by llama.cpp's own converter, a draft with
    `--target-model-dir target_dir`; cached by content. Raises ConversionFailed with its last words."""
    require()
    model_dir = Path(model_dir)
    key = _fingerprint(model_dir) + (f"-{_fingerprint(Path(target_dir))}" if target_dir else "")
    out = GGUF_CACHE / f"{model_dir.name}-{key}.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob("*.partial-*"):  # left by a conversion whose process was killed
        pid = stale.suffix.removeprefix(".partial-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.unlink(missing_ok=True)
    partial = out.with_suffix(f".partial-{os.getpid()}")
    # under the guard that keeps a folder's own code from running (the converter trusts remote code)
    command = [sys.executable, "-m", "draftdoctor.realload.nocode", str(CONVERTER), str(model_dir), "--outtype", "f32",
               "--outfile", str(partial)]
    if target_dir:
        command += ["--target-model-dir", str(target_dir)]
    env = dict(os.environ, **CHILD_ENV)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        if proc.returncode != 0:
            said = [line for line in proc.stderr.strip().splitlines() if line.strip()]
            raise ConversionFailed(f"llama.cpp's converter refused {model_dir}: {said[-1] if said else proc.returncode}")
        partial.rename(out)
    finally:
        partial.unlink(missing_ok=True)  # a refusal, a time-out, Ctrl-C: nothing half-written stays in the cache
    return out


def server_command(config, draft_gguf: Path | None, target_gguf: Path) -> list[str]:
    """argv of llama-server for `config` (a launcher.ServeConfig): EAGLE-3 with `num_steps` draft tokens."""
    argv = [str(SERVER), "-m", str(target_gguf), "--host", config.host, "--port", str(config.port), *SERVER_FLAGS]
    if draft_gguf is not None:
        argv += ["-md", str(draft_gguf), "-td", "1", "--spec-draft-n-max", str(config.num_steps or 4),
                 "--spec-type", SPEC_TYPE]
    return argv + list(config.extra_args)


def command(config, engine=None, loader: str | None = None, python: str | None = None) -> list[str]:
    """llama-server serves GGUF files: the command names the converted target and draft (`launch`
    converts them first; this converts too, from the cache when it can)."""
    return server_command(config, convert(config.draft, config.target) if config.draft else None,
                          convert(config.target))


def launch(config, engine=None, loader: str | None = None):
    """(argv as a function of the port, the Server's keyword arguments), the GGUFs converted first."""
    from dataclasses import replace

    ggufs = (convert(config.draft, config.target) if config.draft else None, convert(config.target))
    return (lambda port: server_command(replace(config, port=port), *ggufs)), {
        "health_path": HEALTH_PATH, "ready_line": READY_LINE}


def refusal(config, engine=None, loader: str | None = None) -> str | None:
    return speculation_refused(config.extra_args) if config.draft else None


def not_serving(base_url: str) -> str | None:
    """Why a ready llama-server that loaded a draft does not speculate, or None."""
    return None if speculating(base_url) else "llama-server loaded the draft but does not speculate (its /slots say so)"


def backend_label(engine=None) -> str:
    return label()


def sent_prompts(target, prompts: list[str]) -> list[list[int]]:
    """llama.cpp gets token ids (the target's tokenizer.json), as the agreement tests send them."""
    return token_ids(target, prompts)


def cannot_serve_as(engine) -> str | None:
    """Why a draft cannot be served as `engine`'s loader leaves it, or None."""
    if engine is not None and engine.name != "llamacpp":
        return (f"--backend llamacpp cannot serve a draft as {engine} loads it: llama.cpp refuses a checkpoint "
                "with tensors missing, so it cannot stand for a load that leaves parameters unset; measure that on "
                "--backend reference or vllm")
    return None


def served_draft(draft: str, engine, folder) -> str:
    return draft


def resolve(spec: str | None):
    """The release `--engine` names (the CLI's words), or None."""
    from ..engines import resolve_engine

    return resolve_engine(spec) if spec else None


def speculation_refused(extra_args) -> str | None:
    """Why a draft launch would do no speculation (a `--spec-type` without draft-eagle3 among the extra
    arguments), or None."""
    args = list(extra_args)
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--spec-type=") else (args[i + 1] if arg == "--spec-type"
                                                                              and i + 1 < len(args) else None)
        if value is not None and SPEC_TYPE not in value.split(","):
            return (f"--spec-type {value} with a draft: llama-server would load the draft and not speculate "
                    f"(EAGLE-3 needs {SPEC_TYPE})")
    return None


def speculating(base_url: str) -> bool:
    """Whether the running server drafts: every slot of its /slots says `speculative` (its /props'
    `speculative.types` reads "none" whatever --spec-type was)."""
    slots = json.loads(get_text(base_url + "/slots"))
    return bool(slots) and all(slot.get("speculative") for slot in slots)


def parse_counters(text: str) -> dict:
    """{"drafts", "draft_tokens", "accepted", "per_position": [...]} from llama.cpp's Prometheus text."""
    return spec_counters(text, COUNTERS, PER_POSITION)


def complete(base_url: str, prompt_ids: list[int], max_tokens: int, timeout: float = 600.0) -> dict:
    """One greedy /completion for a token-id prompt: {"output_ids", "completion_tokens", "latency_s", "timings"}."""
    answer, latency = post_json(base_url + "/completion", {"prompt": prompt_ids, "n_predict": max_tokens, "temperature": 0,
                                                           "top_k": 1, "seed": 0, "cache_prompt": False,
                                                           "return_tokens": True}, timeout)
    timings = answer.get("timings") or {}
    return {"output_ids": answer.get("tokens"), "completion_tokens": timings.get("predicted_n", len(answer.get("tokens") or [])),
            "latency_s": latency, "timings": timings}


def run_bench(base_url: str, prompts: list[list[int]], name: str = "draft", max_new_tokens: int = 64,
              concurrency: int = 1, num_draft_tokens: int | None = None, progress=None,
              timeout: float = 600.0) -> BenchResult:
    """Send every prompt (token ids; one at a time) and read llama.cpp's counters around the run."""
    before = parse_counters(get_text(base_url + "/metrics"))
    start = time.perf_counter()
    requests = []
    for done, ids in enumerate(prompts, 1):
        answer = complete(base_url, ids, max_new_tokens, timeout)
        requests.append(RequestResult(str(ids), answer["completion_tokens"], None, answer["latency_s"],
                                      output_ids=answer["output_ids"]))
        if progress:
            progress(done, len(prompts))
    wall = time.perf_counter() - start
    after = parse_counters(get_text(base_url + "/metrics"))  # updated as each request ends
    counts = counters_delta(before, after)
    return BenchResult(name=name, requests=requests, wall_s=wall, num_draft_tokens=num_draft_tokens,
                       server_info={"backend": "llamacpp", "counters_before": before, "counters_after": after},
                       spec_counts=counts)


def token_ids(target_dir, prompts: list[str]) -> list[list[int]]:
    """The prompts as the target's tokenizer.json encodes them (llama.cpp gets ids, not text)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json"))
    return [tokenizer.encode(p).ids for p in prompts]
