"""The serving backends, one row each: what `serve` and `bench` launch, and what each can take in one
measurement. The launcher, `bench` and the CLI read rows, never a backend's name; what a backend does
lives in its module (`serving.<name>`: `command`, `launch`, `refusal`, `not_serving`, `backend_label`,
`run_bench`, `sent_prompts`, `served_draft`, `resolve`). A fifth engine is a row here and its module.

Request limits: the context each is served with, the new tokens one request may ask for, the requests
it holds at once. `bench` checks its arguments against the row (and the target's own context) before
anything is launched, so an impossible request is one line and exit 2, not "Broken pipe" minutes later.
The kit's launch flags are the source of the contexts: vLLM and llama-server are started with
`--max-model-len` / `-c` at `served_context`; SGLang and the reference backend serve the target's whole
`max_position_embeddings`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    """One backend."""

    name: str
    display: str
    # the spec of the engine release `--engine` defaults to: emulated (reference), served (vllm); None:
    # chosen by the backend's module (`resolve`: the installed SGLang), or none
    default_spec: str | None
    # the engine a draft is diagnosed as before launching when no --engine is given (`bench`'s preflight)
    checked_as: str
    runs_here: bool = True  # False: GPU hosts only; the kit checks its command here but never serves it
    authenticated: bool = True  # False: anyone who reaches its port can use it (`serve --host` warns)
    own_counters: bool = False  # acceptance from the engine's own counters, else from SGLang's /server_info and log
    retries_without_cuda_graph: bool = False  # a start-up hang is retried once with CUDA graphs off
    context_flag: str | None = None  # the launch flag that sets the served context (a user's extra flag wins)
    served_context: int | None = None  # tokens per sequence the kit launches it with (None: the target's)
    max_new_tokens: int | None = None  # the server's own cap on one request's new tokens (None: the context's)
    max_requests: int | None = None  # requests it holds at once before refusing more (None: it queues them)
    # how `--guard` puts draftdoctor.guard in the server's process: "plugin" (the engine loads the kit's
    # entry point; the environment turns it on), "launcher" (`python -m draftdoctor.guard --` in front of
    # the command); None: not offered (the reference backend replays the loader itself; llama.cpp's
    # loader is the kit's own run of its converter, checked by `check --loader real`)
    guard: str | None = None


BACKENDS = {
    # reference.server: greedy, one request at a time; its MAX_NEW_TOKENS and MAX_REQUESTS are these
    "reference": Backend("reference", "the reference backend", "sglang==0.5.10", "sglang==0.5.10",
                         authenticated=False, max_new_tokens=4096, max_requests=64),
    "sglang": Backend("sglang", "SGLang", None, "sglang", runs_here=False, retries_without_cuda_graph=True,
                      guard="launcher"),
    # vLLM on CPU: a 1 GB KV cache is enough for 512-token sequences (docs/engine-facts.md: "Real engines on these CPUs"); 0.32.0 is the
    # release its serving tests run, never whichever is newest on disk
    "vllm": Backend("vllm", "vLLM", "vllm==0.32.0", "vllm==0.32.0", authenticated=False, own_counters=True,
                    context_flag="--max-model-len", served_context=512, guard="plugin"),
    # llama-server: one slot (-np 1) of 512 tokens
    "llamacpp": Backend("llamacpp", "llama.cpp", None, "llamacpp", authenticated=False, own_counters=True,
                        context_flag="-c", served_context=512),
}
# the client's own bound: one thread and one connection per request in flight
MAX_CONCURRENCY = 256


def guard_refusal(backend: str) -> str | None:
    """Why `--guard` cannot run with `backend` (the guard runs inside an engine's own server process),
    or None where it can."""
    if BACKENDS[backend].guard is not None:
        return None
    offered = ", ".join(name for name, row in BACKENDS.items() if row.guard)
    return (f"--guard: the guard runs inside an engine's own server process (--backend {offered}); "
            f"{BACKENDS[backend].display} is not one")


def exposure_warning(backend: str, host: str) -> str | None:
    """What serving `backend` on `host` exposes, when it listens beyond loopback: who can send it
    requests, and whether it asks them for authentication; None on loopback."""
    from ..listeners import reachable_from

    exposed = reachable_from(host)
    if not exposed:
        return None
    row = BACKENDS[backend]
    return (f"--host {host} listens on {exposed}: anyone who can reach this machine there can send the server "
            "requests" + ("" if row.authenticated else f" ({row.display} asks for no authentication)")
            + "; the kit's default is 127.0.0.1")
