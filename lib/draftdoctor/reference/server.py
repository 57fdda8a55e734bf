"""The reference backend's HTTP server: SGLang's endpoints, flags and log lines, served on CPU.

`python -m draftdoctor.reference.server --model-path TARGET --speculative-algorithm EAGLE3
--speculative-draft-model-path DRAFT --speculative-num-steps 4 --speculative-eagle-topk 1
--speculative-num-draft-tokens 5 --port 30000 --engine sglang==0.5.10 --loader replay`

It takes the SGLang launch flags that apply (others are accepted, logged and ignored), loads the
draft the way the emulated release's loader leaves it (draftdoctor.eagle.loading; a load that
release would refuse makes the server exit with SGLang's message), and answers `/health`,
`/health_generate`, `/generate`, `/server_info` (and the older `/get_server_info`). Generation is
greedy, one request at a time (others wait). "Decode batch" lines follow the emulated release's
format and accept-rate formula; per-request `meta_info` carries that release's fields. Everything a
user sees says it is the reference backend. It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..engines import resolve_engine
from ..resources import BUDGET_VARIABLE, human, memory_budget
from ..serving.backends import BACKENDS
from ..serving.client import spec_count_fields
from ..serving.launcher import READY_LINE, REFERENCE_DEFAULT_ENGINE
from ..serving.logs import format_decode_line

MAX_BODY = 1 << 20  # bytes; larger requests get 413
MAX_NEW_TOKENS = BACKENDS["reference"].max_new_tokens
# requests held at once (one generates, the rest wait with their bodies read): more get 503 at once,
# so a flood of connections cannot make the server hold a thread and a body for each
MAX_REQUESTS = BACKENDS["reference"].max_requests
BACKEND = "reference (CPU) backend"

def log(message: str) -> None:
    print(f"[{datetime.now():%Y-%m-%d %H:%M:%S}] {message}", flush=True)


class ReferenceEngine:
    """Target + draft + tokenizer, generating one request at a time, with SGLang's counters."""

    def __init__(self, args):
        import torch
        from tokenizers import Tokenizer

        from ..eagle.llama import TargetModel
        from ..diagnose import check
        from ..eagle.loading import place

        torch.set_num_threads(1)  # tiny ops: more threads only add overhead
        self.emulated = resolve_engine(args.engine)
        self.release = self.emulated.release
        self.args = args
        self.target = TargetModel.from_dir(args.model_path)
        self.tokenizer = Tokenizer.from_file(str(Path(args.model_path) / "tokenizer.json"))
        self.eos = self.target.config.get("eos_token_id")
        self.context = int(self.target.config.get("max_position_embeddings") or 2048)
        # the longest request (prompt + new tokens) whose prefill fits the machine's memory budget: the
        # target's forward over it, and the draft's over the same tokens (one layer of no larger sizes,
        # logits over no larger a vocabulary: at most as much again)
        self.budget = memory_budget()
        self.longest = longest_request(lambda t: 2 * self.target.forward_bytes(t), self.context, self.budget)
        self.loaded = place(check(args.speculative_draft_model_path, self.emulated, loader=args.loader), self.target)
        self.lock = threading.Lock()
        self.num_steps = args.speculative_num_steps
        self.k = args.speculative_num_draft_tokens
        self.total_verify = self.total_accepted = 0  # cumulative, for /server_info
        self.window_verify = self.window_accepted = self.window_tokens = 0  # since the last log line
        self.window_start = time.perf_counter()

    def prompt_ids(self, prompt: str, max_new_tokens: int) -> tuple[list[int], str | None]:
        """The prompt's token ids, and why the request cannot run within the target's context (None: it
        can). Bounds every request's work, so one long prompt cannot hold the engine (one request at a
        time) for minutes."""
        limit = min(self.context, self.longest)
        why = (f"the context of {self.context} tokens" if limit == self.context else
               f"the {limit} tokens this server's memory budget of {human(self.budget)} allows in one request")
        if len(prompt) > 64 * limit:  # over 64 characters a token: too long before tokenizing
            return [], f"prompt of {len(prompt)} characters exceeds {why}"
        ids = self.tokenizer.encode(prompt).ids
        if len(ids) + max_new_tokens > limit:
            return ids, f"prompt of {len(ids)} tokens plus max_new_tokens {max_new_tokens} exceeds {why}"
        return ids, None

    def generate(self, ids: list[int], max_new_tokens: int) -> dict:
        with self.lock:
            result = self.loaded.speculate(self.target, ids, max_new_tokens, self.num_steps, self.eos)
            self._count(result)
        meta = {"prompt_tokens": len(ids), "completion_tokens": result.completion_tokens,
                "spec_verify_ct": result.spec_verify_ct, "finish_reason": {"type": "length"},
                "backend": "reference"}
        counts = spec_count_fields(self.release)
        if counts and result.spec_verify_ct:
            # SGLang counts a request's accepted drafts from the verify row before the finish cut
            # (eagle_info.py `accepted_draft_tokens`, 0.5.10); its log line counts what was emitted
            accepted, proposed = result.accepted_drafts_before_stop, result.spec_verify_ct * (self.k - 1)
            meta |= {"spec_accept_rate": accepted / proposed, "spec_accept_length": result.accept_length,
                     counts[0]: accepted, counts[1]: proposed, "spec_accept_histogram": _histogram(result)}
        return {"text": self.tokenizer.decode(result.output_ids), "output_ids": result.output_ids, "meta_info": meta}

    def _count(self, result) -> None:
        self.total_verify += result.spec_verify_ct
        self.total_accepted += result.accepted_drafts
        self.window_verify += result.spec_verify_ct
        self.window_accepted += result.accepted_drafts
        self.window_tokens += result.completion_tokens
        if self.window_verify >= self.args.decode_log_interval:
            elapsed = max(time.perf_counter() - self.window_start, 1e-9)
            length = (self.window_accepted + self.window_verify) / self.window_verify
            log(format_decode_line(self.release, 1, self.window_tokens, 0.0, length, self.k,
                                   self.window_tokens / elapsed))
            self.window_verify = self.window_accepted = self.window_tokens = 0
            self.window_start = time.perf_counter()

    @property
    def avg_spec_accept_length(self) -> float | None:
        return (self.total_accepted + self.total_verify) / self.total_verify if self.total_verify else None

    def server_info(self) -> dict:
        return {"backend": "reference", "emulated_engine": self.emulated.spec, "loader": self.args.loader,
                "model_path": self.args.model_path, "speculative_algorithm": "EAGLE3",
                "speculative_draft_model_path": self.args.speculative_draft_model_path,
                "speculative_num_steps": self.num_steps, "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": self.k,
                "internal_states": [{"avg_spec_accept_length": self.avg_spec_accept_length}]}


def longest_request(cost, context: int, budget: int) -> int:
    """The most tokens (at most `context`) whose `cost(tokens)` in bytes, rising with tokens, is within
    `budget` (0: not even one)."""
    low, high = 0, context
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if cost(middle) <= budget else (low, middle - 1)
    return low


def _histogram(result) -> list[int]:
    """Verify steps by number of accepted drafts (0..num_steps), from per-position counts (before the
    finish cut, as SGLang's `update_spec_acceptance_histogram` gets them)."""
    per_position = result.accepted_before_stop + [0]
    at_least = [result.spec_verify_ct] + per_position[:-1]
    return [at_least[i] - per_position[i] for i in range(len(at_least))]


class Handler(BaseHTTPRequestHandler):
    timeout = 60  # seconds a client may take to send its request: a stalled one does not hold a thread
    engine: ReferenceEngine  # set on the subclass built in main()
    held = threading.BoundedSemaphore(MAX_REQUESTS)
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # one line per request, SGLang style
        log(f'{self.client_address[0]} "{self.requestline}" {args[1] if len(args) > 1 else ""}')

    def _send(self, status: int, body) -> None:
        data = (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Backend", "draftdoctor-reference")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"message": message, "code": status}})

    def do_GET(self):
        if self.path == "/health":
            self._send(200, "OK")
        elif self.path == "/health_generate":
            if self._generate(self.engine.prompt_ids("health", 1)[0], 1) is not None:
                self._send(200, "OK")
        elif self.path in ("/server_info", "/get_server_info"):
            self._send(200, self.engine.server_info())
        elif self.path in ("/model_info", "/get_model_info"):
            self._send(200, {"model_path": self.engine.args.model_path, "is_generation": True, "backend": "reference"})
        else:
            self._error(404, f"no endpoint {self.path}")

    def do_POST(self):
        if self.path != "/generate":
            self._error(404, f"no endpoint {self.path}")
            return
        if not self.held.acquire(blocking=False):
            self.close_connection = True
            self._error(503, f"more than {MAX_REQUESTS} requests at once: the reference backend generates one at a time")
            return
        try:
            self._post_generate()
        finally:
            self.held.release()

    def _post_generate(self):
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            self._error(400, "bad Content-Length")
            return
        if length < 0:
            self.close_connection = True
            self._error(400, "negative Content-Length")
            return
        if length > MAX_BODY:
            self.close_connection = True
            self._error(413, f"request body over {MAX_BODY} bytes")
            return
        try:
            request = json.loads(self.rfile.read(length) or b"null")
        except (ValueError, RecursionError):  # bad JSON or UTF-8, huge integers, deep nesting
            self._error(400, "request body is not valid JSON")
            return
        problem, prompt, max_new = _parse_generate(request)
        if not problem:
            ids, problem = self.engine.prompt_ids(prompt, max_new)
        if problem:
            self._error(400, problem)
            return
        result = self._generate(ids, max_new)
        if result is not None:
            self._send(200, result)

    def _generate(self, ids, max_new: int):
        """The engine's answer, or None after a 500 naming what failed (a draft the target cannot feed),
        logged on one line so that a client's error and the log both name the cause."""
        try:
            return self.engine.generate(ids, max_new)
        except Exception as e:  # noqa: BLE001 - any engine failure is the server's answer, not a dropped socket
            log(f"generate failed: {type(e).__name__}: {e}")
            self._error(500, f"{type(e).__name__}: {e}")
            return None


def _parse_generate(request) -> tuple[str | None, str, int]:
    """(problem or None, prompt, max_new_tokens) of a /generate body."""
    if not isinstance(request, dict) or not isinstance(request.get("text"), str):
        return "expected a JSON object with a string `text` (batched or input_ids requests are not supported)", "", 0
    params = request.get("sampling_params") or {}
    if not isinstance(params, dict):
        return "`sampling_params` must be an object", "", 0
    max_new = params.get("max_new_tokens", 128)
    if type(max_new) is not int or not 1 <= max_new <= MAX_NEW_TOKENS:
        return f"`max_new_tokens` must be an integer in 1..{MAX_NEW_TOKENS}", "", 0
    if params.get("temperature", 0) not in (0, 0.0):
        return "the reference backend decodes greedily: set temperature 0", "", 0
    return None, request["text"], max_new


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="draftdoctor.reference.server", description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--speculative-algorithm", default="EAGLE3")
    p.add_argument("--speculative-draft-model-path", required=True)
    p.add_argument("--speculative-num-steps", type=int, default=4)
    p.add_argument("--speculative-eagle-topk", type=int, default=1)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--engine", default=REFERENCE_DEFAULT_ENGINE, help="the SGLang release to emulate")
    p.add_argument("--loader", choices=["replay", "real"], default="replay")
    p.add_argument("--listen-fd", type=int, default=None,
                   help="serve on this inherited listening socket (the launcher's, bound to --port) instead of binding")
    return p


def _http_server(args, handler) -> ThreadingHTTPServer:
    """The HTTP server on `--listen-fd`'s socket (the port the launcher holds for it), else bound here."""
    if args.listen_fd is None:
        return ThreadingHTTPServer((args.host, args.port), handler)
    import socket

    server = ThreadingHTTPServer((args.host, args.port), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = socket.socket(fileno=args.listen_fd)
    server.server_address = server.socket.getsockname()[:2]
    args.port = server.server_address[1]
    server.server_activate()  # listen() again, with the server's own queue length
    return server


def main(argv=None) -> int:
    args, ignored = build_parser().parse_known_args(argv)
    from ..realload.registry import REAL_LOADERS

    name = args.engine.split("==")[0]
    log(f"draftdoctor {BACKEND}: emulating {args.engine} with the {args.loader} loader "
        f"(not {REAL_LOADERS[name].display if name in REAL_LOADERS else name} itself)")
    if ignored:
        log(f"ignored by the reference backend (no GPU, one process): {' '.join(ignored)}")
    if args.speculative_num_steps < 1:
        log("error: --speculative-num-steps must be at least 1")
        return 2
    if args.speculative_num_draft_tokens is None:
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1
    if args.speculative_algorithm.upper() != "EAGLE3":
        log(f"error: the reference backend serves EAGLE3 drafts only, not {args.speculative_algorithm}")
        return 1
    if args.speculative_eagle_topk != 1 or args.speculative_num_draft_tokens != args.speculative_num_steps + 1:
        log("error: the reference backend drafts a chain: --speculative-eagle-topk 1 and "
            "--speculative-num-draft-tokens = --speculative-num-steps + 1")
        return 1
    from ..checkpoint import CheckpointError
    from ..engines import EngineSpecError
    from ..eagle.loading import LoadRefused

    try:
        engine = ReferenceEngine(args)
    except LoadRefused as e:
        log(f"error: {args.engine} would not start with this draft: {e}")
        return 1
    except (CheckpointError, EngineSpecError, OSError) as e:
        log(f"error: {e}")
        return 1
    report = engine.loaded.report
    log(f"draft loaded: {report.verdict}")
    if engine.longest < engine.context:
        log(f"requests are limited to {engine.longest} tokens (prompt + max_new_tokens), fewer than the context of "
            f"{engine.context}: the memory budget is {human(engine.budget)} (${BUDGET_VARIABLE})")
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    try:
        server = _http_server(args, handler)
    except OSError as e:
        log(f"error: cannot bind {args.host}:{args.port}: {e}")
        return 1
    server.daemon_threads = True
    log(f"{BACKEND} listening on http://{args.host}:{args.port}")
    log(READY_LINE)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
