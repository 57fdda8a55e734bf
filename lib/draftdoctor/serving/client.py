"""Benchmark client: send prompts to a server's `/generate`, and compute acceptance from what it says.

Works against real SGLang and the reference backend alike (same endpoints, same fields). Per request
it records completion tokens, verify steps (`meta_info.spec_verify_ct`), latency and, where the
server reports them, accepted-draft counts and the acceptance histogram.

Accept length L is tokens per verify step, bonus token included (minimum 1.00). With accepted-draft
counts (SGLang >= 0.5.5) it is 1 + accepted / verify steps, the formula of SGLang's log line and
`/server_info`; without them, completion tokens / verify steps, the formula of `meta_info`, which also
counts the prefill token (so a dead draft reads 1 + 1/steps). The strict accept rate is accepted /
proposed drafts, or (L − 1) / (k − 1) for k draft tokens per step (docs/engine-facts.md: "Acceptance"). Per-position
acceptance is the share of verify steps accepting at least i drafts.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from ..engines import all_serving, serving_facts
from ..errors import UserError


# every name a release writes its accepted-draft count under (engines.sglang.SERVING)
ACCEPTED_FIELDS = tuple(dict.fromkeys(row.spec_count_fields[0] for row in all_serving() if row.spec_count_fields))


def spec_count_fields(release: str) -> tuple[str, str] | None:
    """The (accepted, proposed) meta_info field names `release` writes, or None before 0.5.5; a
    release newer than any row is assumed to write the newest row's."""
    facts = serving_facts(release) or all_serving()[-1]
    return facts.spec_count_fields


class ClientError(UserError, RuntimeError):
    pass


@dataclass
class RequestResult:
    prompt: str
    completion_tokens: int
    verify_ct: int | None
    latency_s: float
    accept_histogram: list[int] | None = None
    accepted_drafts: int | None = None  # meta_info's accepted-draft count, under its release's name
    text: str = ""
    output_ids: list[int] | None = None  # the generated token ids, where the server returns them


@dataclass
class BenchResult:
    """One draft's run: per-request records plus the aggregates a chart needs."""

    name: str
    requests: list[RequestResult]
    wall_s: float
    num_draft_tokens: int | None
    server_info: dict = field(default_factory=dict)
    # the engine's own counters over the run, where it keeps them per server, not per request (vLLM's
    # /metrics): {"drafts" (verify steps), "draft_tokens", "accepted", "per_position": [...]}
    spec_counts: dict | None = None

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.requests)

    @property
    def verify_steps(self) -> int | None:
        if self.spec_counts is not None:
            return int(self.spec_counts["drafts"])
        if any(r.verify_ct is None for r in self.requests):
            return None
        return sum(r.verify_ct for r in self.requests)

    @property
    def accepted_drafts(self) -> int | None:
        if self.spec_counts is not None:
            return int(self.spec_counts["accepted"])
        if any(r.accepted_drafts is None for r in self.requests):
            return None
        return sum(r.accepted_drafts for r in self.requests)

    @property
    def accept_length(self) -> float | None:
        steps, accepted = self.verify_steps, self.accepted_drafts
        if not steps:
            return None
        return 1 + accepted / steps if accepted is not None else self.completion_tokens / steps

    @property
    def accept_rate(self) -> float | None:
        """Strict: accepted drafts / proposed drafts."""
        L, k = self.accept_length, self.num_draft_tokens
        return None if L is None or not k or k < 2 else (L - 1) / (k - 1)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def per_position(self) -> list[float] | None:
        """Acceptance at draft position i (1-based): share of verify steps accepting >= i drafts."""
        if self.spec_counts is not None:
            steps = self.spec_counts["drafts"]
            return [c / steps for c in self.spec_counts["per_position"]] if steps else None
        hists = [r.accept_histogram for r in self.requests if r.accept_histogram]
        if not hists:
            return None
        width = max(len(h) for h in hists)
        total = [sum(h[j] if j < len(h) else 0 for h in hists) for j in range(width)]
        steps = sum(total)
        if not steps:
            return None
        return [sum(total[j:]) / steps for j in range(1, width)]

    def summary(self) -> dict:
        return {"name": self.name, "accept_length": self.accept_length, "accept_rate": self.accept_rate,
                "tokens_per_s": self.tokens_per_s, "requests": len(self.requests),
                "completion_tokens": self.completion_tokens, "verify_steps": self.verify_steps,
                "accepted_drafts": self.accepted_drafts,
                "per_position": self.per_position, "num_draft_tokens": self.num_draft_tokens,
                "wall_s": self.wall_s}

    def to_dict(self) -> dict:
        return self.summary() | {"server_info": self.server_info, "spec_counts": self.spec_counts,
                                 "request_log": [asdict(r) for r in self.requests]}


def _post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise ClientError(f"{url} answered {e.code}: {e.read()[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ClientError(f"{url}: {e}") from None


def _get(url: str, timeout: float) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def generate(base_url: str, prompt: str, max_new_tokens: int = 64, timeout: float = 600.0) -> RequestResult:
    """One greedy /generate request, as SGLang's native API takes it."""
    start = time.perf_counter()
    body = {"text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens}}
    answer = _post(base_url + "/generate", body, timeout)
    meta = answer.get("meta_info") or {}
    if "completion_tokens" not in meta:
        raise ClientError(f"{base_url}/generate: no meta_info.completion_tokens in the answer")
    accepted = next((meta[name] for name in ACCEPTED_FIELDS if name in meta), None)
    return RequestResult(prompt=prompt, completion_tokens=int(meta["completion_tokens"]),
                         verify_ct=meta.get("spec_verify_ct"), latency_s=time.perf_counter() - start,
                         accept_histogram=meta.get("spec_accept_histogram"), accepted_drafts=accepted,
                         text=answer.get("text", ""), output_ids=answer.get("output_ids"))


def server_info(base_url: str, timeout: float = 10.0) -> dict:
    """`/server_info` (SGLang >= 0.5) or `/get_server_info` (older); {} if neither answers."""
    for path in ("/server_info", "/get_server_info"):
        try:
            return _get(base_url + path, timeout)
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return {}


def avg_spec_accept_length(info: dict) -> float | None:
    """The server's own cumulative accept length from `/server_info`."""
    states = info.get("internal_states") or []
    return states[0].get("avg_spec_accept_length") if states else None


def run_bench(base_url: str, prompts: list[str], name: str = "draft", max_new_tokens: int = 64,
              concurrency: int = 1, num_draft_tokens: int | None = None, progress=None,
              timeout: float = 600.0) -> BenchResult:
    """Send every prompt (`concurrency` at a time) and collect a BenchResult.

    `progress`, if given, is called with (done, total) after each request.
    """
    results: list[RequestResult | None] = [None] * len(prompts)
    start = time.perf_counter()
    if concurrency <= 1:  # in this thread: Ctrl-C or SIGTERM interrupts the request in flight at once
        for done, prompt in enumerate(prompts, 1):
            results[done - 1] = generate(base_url, prompt, max_new_tokens, timeout)
            if progress:
                progress(done, len(prompts))
    else:
        # Not `with ThreadPoolExecutor`: on an interrupt it would wait for the requests in flight and then
        # run every queued one. Queued requests are cancelled and the caller stops the server at once,
        # which ends the ones in flight.
        pool = ThreadPoolExecutor(max_workers=concurrency)
        try:
            futures = {pool.submit(generate, base_url, p, max_new_tokens, timeout): i for i, p in enumerate(prompts)}
            for done, future in enumerate(futures, 1):
                results[futures[future]] = future.result()
                if progress:
                    progress(done, len(prompts))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
    wall = time.perf_counter() - start
    return BenchResult(name=name, requests=results, wall_s=wall, num_draft_tokens=num_draft_tokens,
                       server_info=server_info(base_url))
