"""Benchmark several drafts in turn: launch a server per draft, send the prompts, record, chart.

The same code drives real SGLang on a GPU host (`backend="sglang"`) and the CPU reference backend
(`backend="reference"`). Each run records what the client measured (accept length, strict accept
rate, per-position acceptance, tokens/s), the server's own `/server_info` accept length and its
"Decode batch" log lines, so a user can see all three sources agree.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .client import BenchResult, ClientError, avg_spec_accept_length
from .launcher import GuardStopped, LaunchRefused, ServeConfig, ServerCrashed, backend_module, cause, serve, tail
from .backends import BACKENDS, MAX_CONCURRENCY
from .logs import parse_sglang_lines
from ..engines import EngineRelease, expect_release, resolve_engine
from ..prompts import DEMO_PROMPTS, MAX_PROMPTS_BYTES, PromptsError, load_prompts  # noqa: F401 (re-exported)


class BenchFailed(RuntimeError):
    """A measurement that failed midway (its server died or stopped answering): exit 1, not 2."""


class DraftMisfit(BenchFailed):
    """A draft that does not fit the target on the engine served or emulated, found before any
    server started (`preflight`): exit 1."""


def preflight(target, drafts: list[tuple[str, str]], engine: EngineRelease, prediction=True,
              loader: str = "replay") -> dict:
    """Stop before launching anything when a draft does not fit the target (vocabulary, hidden sizes,
    aux layers the engine can capture): `diagnose.MISFIT_CODES`, the same diagnosis as `check --target`,
    with its prediction of acceptance (`prediction`: a `predict.PredictionSpec`, or True for the default
    one, False for none), each draft placed as `loader` says the engine loads it (the one serving it).
    Returns {name: that diagnosis} for the drafts it could read (what a measured
    accept length is read against). A target or draft that is not a local folder (a hub id on a GPU host)
    is checked as far as it can be."""
    from ..checkpoint import CheckpointError
    from ..diagnose import MISFIT_CODES, check

    expect_release(engine)
    local_target = target if (Path(target) / "config.json").is_file() else None
    reports = {}
    for name, draft in drafts:
        if not Path(draft).exists():
            continue
        try:
            reports[name] = report = check(draft, engine, loader=loader, target=local_target, predict=prediction)
        except CheckpointError:
            continue  # unreadable here; the server says why
        found = [f for f in report.errors if f.code in MISFIT_CODES]
        if found:
            raise DraftMisfit(f"{name} ({draft}) does not fit {'the target ' + str(target) if local_target else 'its target'} "
                              f"on {engine}; nothing was launched: "
                              + "; ".join(f.brief() for f in found))
    return reports


# prompts a bench predicts before serving: the standard error over 40 demo prompts is about 0.1 of an accept
# length; past this, more prompts cost the prediction more than they tell
PREDICTED_PROMPTS = 64


class BenchInputError(PromptsError):
    """A prompts file or draft list that cannot be used."""


def draft_pairs(values) -> list[tuple[str, str]]:
    """`--draft NAME=PATH` values as (name, path) pairs; BenchInputError for a malformed one, a name that
    cannot name a file in the output folder (it names the server log there), or a name given twice."""
    from ..runs import safe_name

    pairs = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise BenchInputError(f"--draft expects NAME=PATH, got {value!r}")
        if not safe_name(name):
            raise BenchInputError(f"--draft NAME {name!r} must be a plain file name (letters, digits, . _ -; not . "
                                  "or ..): it names the server log under --out")
        pairs.append((name, path))
    if len({n for n, _ in pairs}) != len(pairs):
        raise BenchInputError("--draft names must differ")
    return pairs


def missing_input(backend: str, paths) -> str | None:
    """The first of `paths` (the target, the drafts) that does not exist, as "PATH: no such file or folder",
    where `backend` runs here (a GPU host's SGLang may name a hub id); else None."""
    if BACKENDS[backend].runs_here:
        for path in paths:
            if not Path(path).exists():
                return f"{path}: no such file or folder"
    return None


MAX_TOKENIZER_BYTES = 64 << 20  # a tokenizer.json larger than this is not read to count prompt tokens


def check_requests(backend: str, target, prompts: list[str], max_new_tokens: int, concurrency: int,
                   extra_args=(), prompts_file=None) -> None:
    """Refuse, before anything is launched, a measurement no server could answer: more new tokens than
    the backend takes, or than the context it serves leaves room for beside a prompt (the target's
    `max_position_embeddings`, or the backend's own `served_context`); a prompt too long for that context
    (counted with the target's tokenizer.json where there is one); more requests at once than the
    backend holds or the client runs. A target that is not a local folder is checked as far as it can be."""
    from ..checkpoint import CheckpointError, open_regular

    row, source = BACKENDS[backend], prompts_file or "the prompts"
    if row.max_new_tokens is not None and max_new_tokens > row.max_new_tokens:
        raise BenchInputError(f"--max-new-tokens {max_new_tokens}: {row.display} generates at most "
                              f"{row.max_new_tokens} tokens a request")
    limit = min(MAX_CONCURRENCY, row.max_requests or MAX_CONCURRENCY)
    if concurrency > limit:
        raise BenchInputError(f"--concurrency {concurrency}: at most {limit} requests at once on {row.display}"
                              + ("" if limit == MAX_CONCURRENCY else f" (the client runs at most {MAX_CONCURRENCY})"))
    context, why = _target_context(target), f"max_position_embeddings in {Path(target) / 'config.json'}"
    extra = list(extra_args)
    served = row.served_context
    if row.context_flag in extra and extra.index(row.context_flag) + 1 < len(extra):
        served = _int(extra[extra.index(row.context_flag) + 1])  # the user's own flag is what the server gets
    if served is not None and (context is None or served < context):
        context, why = served, f"{row.display} is served with {row.context_flag} {served}"
    if context is None:
        return
    if max_new_tokens >= context:
        raise BenchInputError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in a context of {context} "
                              f"tokens: {why}")
    tokenizer_file = Path(target) / "tokenizer.json"
    try:
        with open_regular(tokenizer_file) as f:
            text = f.read(MAX_TOKENIZER_BYTES + 1)
    except (OSError, CheckpointError):
        text = None
    for number, prompt in enumerate(prompts, 1):  # a prompt over 64 bytes a token is too long before counting
        if len(prompt.encode()) > 64 * context:
            raise BenchInputError(f"{source}: prompt {number} ({len(prompt)} characters) cannot fit a context of "
                                  f"{context} tokens ({why})")
    if text is None or len(text) > MAX_TOKENIZER_BYTES:
        return
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(text.decode("utf-8"))
    except Exception:  # noqa: BLE001 - a tokenizer the kit cannot read is the server's to refuse, with its own words
        return
    for number, prompt in enumerate(prompts, 1):
        tokens = len(tokenizer.encode(prompt).ids)
        if tokens + max_new_tokens > context:
            raise BenchInputError(f"{source}: prompt {number} is {tokens} tokens; with --max-new-tokens {max_new_tokens} "
                                  f"it exceeds the context of {context} tokens ({why})")


def _target_context(target) -> int | None:
    """The target's max_position_embeddings (that of its text model for a multimodal config), if readable."""
    from ..checkpoint import CheckpointError, read_json_file

    try:
        config = read_json_file(Path(target) / "config.json")
    except (OSError, CheckpointError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    for source in (config, config.get("text_config")):
        if isinstance(source, dict) and _int(source.get("max_position_embeddings")):
            return _int(source["max_position_embeddings"])
    return None


def _int(value) -> int | None:
    """A positive integer, or None."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 and not isinstance(value, bool) else None


def backend_label(backend: str, engine: EngineRelease | None = None) -> str:
    """What a user is told ran: e.g. "vLLM 0.32.0 (real engine, CPU), each draft as sglang==0.5.10 loads
    it", "reference backend emulating sglang==0.5.10 (CPU; not SGLang itself)", "SGLang 0.5.23"."""
    return backend_module(backend).backend_label(engine if engine is None else expect_release(engine))


@dataclass
class BenchRun:
    """One draft's measured run (or why its server did not start) and where its server log is, with
    the diagnosis of the draft on the engine served or emulated (what the accept length is read against)."""

    result: BenchResult
    backend: str
    log_path: Path
    server_accept_length: float | None
    log_accept_length: float | None
    label: str = ""  # backend_label: what ran, as the user is told
    verdict: str | None = None  # check's verdict on the draft for that engine
    errors: tuple[str, ...] = ()  # its error finding codes
    failure: str | None = None  # the server did not start: the engine's reason (then nothing was measured)
    predicted: object = None  # the diagnosis' `predict.Prediction`, on the same prompts and budget

    @property
    def explanation(self) -> str:
        line, note = self.explained()
        return line + (f". {note}" if note else "")

    def explained(self) -> tuple[str, str | None]:
        """(what this draft's number means, a remark that may hold for other drafts too: said once)."""
        from ..explain import explain_parts

        if self.failure:
            return f"does not start: {self.failure}", None
        return explain_parts(self.result.accept_length, self.result.accept_rate, self.verdict, self.errors,
                             self.predicted)

    def summary(self) -> dict:
        predicted = self.predicted
        return self.result.summary() | {"backend": self.backend, "backend_label": self.label,
                                        "server_accept_length": self.server_accept_length,
                                        "log_accept_length": self.log_accept_length, "log": str(self.log_path),
                                        "verdict": self.verdict, "errors": list(self.errors),
                                        "failure": self.failure, "explanation": self.explanation,
                                        "predicted_accept_length": predicted.accept_length if predicted else None,
                                        "predicted_accept_length_se": predicted.accept_length_se if predicted else None}


def _request_progress(name, progress, on_request):
    if on_request:
        return lambda done, total: on_request(name, done, total)
    return (lambda done, total: progress(f"{name}: {done}/{total} requests")) if progress else None


def bench_drafts(backend: str, target: str, drafts: list[tuple[str, str]], out_dir, prompts: list[str],
                 engine: "str | EngineRelease | None" = None, loader: str | None = None,
                 num_steps: int = 4, topk: int = 1, num_draft_tokens: int | None = None,
                 max_new_tokens: int = 64, concurrency: int = 1, extra_args: list[str] | None = None,
                 host: str = "127.0.0.1", progress=None, keep_going: bool = False, prompts_file=None,
                 on_request=None, guard: bool = False, predict: bool = True, **server_kwargs) -> list[BenchRun]:
    """Serve and measure each (name, draft path) in turn; write results.json and the charts. `engine`
    (an EngineRelease or a spec): the SGLang release served, or emulated by the reference backend. With
    `keep_going`, a draft whose server does not start is recorded as such (its reason from the log)
    and the next draft is measured (an investigation's "before" that never starts). Arguments no server
    could answer are refused first (`check_requests`; `prompts_file` is named in its message).
    `progress(message)` hears each draft's milestones; `on_request(name, done, total)`, if given, each
    answered request (else `progress` hears those too, one message each). `guard`: each server runs
    with the guard in its process (draftdoctor.guard), which stops it before it is ready when the
    engine's loader leaves a draft parameter unwritten. `predict`: each draft's diagnosis predicts its
    acceptance on the same prompts and budget first (a target folder with weights), said beside the
    measurement. An edge: a notebook calls it with a spec, resolved here once."""
    engine = resolve_engine(engine) if engine is not None else None
    check_requests(backend, target, prompts, max_new_tokens, concurrency, extra_args or (), prompts_file)
    row, module = BACKENDS[backend], backend_module(backend)
    why = module.cannot_serve_as(engine)
    if why:
        raise BenchInputError(why)
    k = num_draft_tokens or num_steps + 1
    from ..diagnose import prediction_spec

    # the prediction runs what the measurement sends: the same prompts (the first PREDICTED_PROMPTS of them:
    # its cost grows with each), token budget and draft tokens a step
    spec = prediction_spec(target, prompts=tuple(prompts[:PREDICTED_PROMPTS]), num_prompts=PREDICTED_PROMPTS,
                           new_tokens=max_new_tokens, num_steps=k - 1) if predict else False
    reports = preflight(target, drafts, engine or resolve_engine(row.checked_as), prediction=spec or predict,
                        loader=loader or "replay")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    label = backend_label(backend, engine)
    runs = []
    for name, draft in drafts:
        draft = module.served_draft(draft, engine, out_dir / f"served-{name}")  # vLLM: as `engine`'s loader leaves it
        config = ServeConfig(target=target, draft=draft, num_steps=num_steps, topk=topk, num_draft_tokens=k,
                             host=host, port=0, extra_args=list(extra_args or []), guard=guard)
        log_path = out_dir / f"server-{name}.log"
        if progress:
            progress(f"{name}: starting the {backend} server")
        report = reports.get(name)
        diagnosis = {"verdict": report.verdict if report else None,
                     "errors": tuple(f.code for f in report.errors) if report else (),
                     "predicted": report.prediction if report else None}
        try:
            server = serve(backend, config, log_path, engine=engine, loader=loader, **server_kwargs)
        except (ServerCrashed, LaunchRefused) as e:
            if not keep_going:
                raise
            why = re.sub(r"^\[[^\]]*\]\s*(error:\s*)?", "", cause(e.log_tail) if e.log_tail else str(e))[:500]
            if isinstance(e, GuardStopped):  # the guard's refusal, whole: which parameters, in check's words
                why = e.refusal
            runs.append(BenchRun(BenchResult(name, [], 0.0, k), backend, log_path, None, None, label,
                                 failure=why, **diagnosis))
            continue
        with server:
            try:
                result = module.run_bench(server.base_url, module.sent_prompts(target, prompts), name=name,
                                          max_new_tokens=max_new_tokens,
                                 concurrency=concurrency, num_draft_tokens=k,
                                 progress=_request_progress(name, progress, on_request))
            except ClientError as e:
                write_results(out_dir, runs)  # the drafts measured before this one are kept
                code = server.process.poll()
                why = cause(tail(log_path, 200, offset=server.log_offset))
                raise BenchFailed(f"{name}: the {backend} server " + (f"exited with status {code}" if code is not None
                                  else "failed requests") + f" while measured ({e}); its log {log_path} says: "
                                  f"{why[:300]}" + (f"; {len(runs)} earlier draft(s) kept in {out_dir}/results.json"
                                                    if runs else "")) from None
            if not server.still_ours():  # it died, and whatever answered on its port is not what was measured
                write_results(out_dir, runs)
                raise BenchFailed(f"{name}: the {backend} server the kit started no longer holds port {server.port} "
                                  f"(it exited or another process took the port): this draft's answers are "
                                  f"discarded; its log: {log_path}")
        if row.own_counters:  # the engine's counters are its own figure
            runs.append(BenchRun(result, backend, log_path, result.accept_length, None, label, **diagnosis))
            continue
        lines = parse_sglang_lines(log_path.read_text(errors="replace").splitlines(),
                                   release=engine.release if engine else None, num_draft_tokens=k)
        runs.append(BenchRun(result, backend, log_path, avg_spec_accept_length(result.server_info),
                             float(lines.accept_length.iloc[-1]) if len(lines) else None, label, **diagnosis))
    write_results(out_dir, runs)
    return runs


def write_results(out_dir: Path, runs: list[BenchRun]) -> None:
    """results.json ({"runs": [...]}) and the PNG charts."""
    from ..figures import acceptance_figure, per_position_figure, save, throughput_figure

    from ..runs import write_atomically

    summaries = [r.summary() for r in runs]
    write_atomically(out_dir / "results.json", json.dumps({"runs": summaries}, indent=1))
    write_atomically(out_dir / "requests.json", json.dumps([r.result.to_dict() for r in runs], indent=1))
    save(acceptance_figure(summaries), out_dir / "acceptance.png")
    save(per_position_figure(summaries), out_dir / "per_position.png")
    save(throughput_figure(summaries), out_dir / "throughput.png")
