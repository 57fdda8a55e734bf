"""What each serving backend can take in one measurement, one row per backend: the context it is
served with, the new tokens one request may ask for, and the requests it holds at once. `bench`
checks its arguments against the row (and the target's own context) before anything is launched, so
an impossible request is one line and exit 2, not "Broken pipe" minutes later.

The kit's launch flags are the source of the contexts: vLLM and llama-server are started with
`--max-model-len` / `-c` at `served_context` (serving.vllm, serving.llamacpp); SGLang and the
reference backend serve the target's whole `max_position_embeddings`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    """One backend's request limits."""

    name: str
    display: str
    context_flag: str | None = None  # the launch flag that sets the served context (a user's extra flag wins)
    served_context: int | None = None  # tokens per sequence the kit launches it with (None: the target's)
    max_new_tokens: int | None = None  # the server's own cap on one request's new tokens (None: the context's)
    max_requests: int | None = None  # requests it holds at once before refusing more (None: it queues them)


BACKENDS = {
    # reference.server: greedy, one request at a time; MAX_NEW_TOKENS and MAX_REQUESTS are these
    "reference": Backend("reference", "the reference backend", max_new_tokens=4096, max_requests=64),
    "sglang": Backend("sglang", "SGLang"),
    # vLLM on CPU: a 1 GB KV cache is enough for 512-token sequences (field notes §12)
    "vllm": Backend("vllm", "vLLM", context_flag="--max-model-len", served_context=512),
    # llama-server: one slot (-np 1) of 512 tokens
    "llamacpp": Backend("llamacpp", "llama.cpp", context_flag="-c", served_context=512),
}
# the client's own bound: one thread and one connection per request in flight
MAX_CONCURRENCY = 256
