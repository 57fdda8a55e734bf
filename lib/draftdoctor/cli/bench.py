"""`draftdoctor bench`: serve each draft in turn, measure acceptance, write results.json and charts, and
say what each number means beside `check`'s verdict on the same draft."""

from __future__ import annotations

import sys

from ..errors import UserError
from ..exits import EXIT_FINDINGS, EXIT_OK
from ..runs import among_inputs
from ..serving.bench import (DEMO_PROMPTS, BenchFailed, DraftMisfit, bench_drafts, draft_pairs, load_prompts,
                             missing_input)
from ..serving.launcher import ServerError
from .arguments import extra_flags, positive_int, serving_arguments, serving_engine, writable_folder
from .render import number, safe, table


def arguments(p) -> None:
    p.add_argument("--target", required=True, help="the target model")
    p.add_argument("--draft", action="append", required=True, metavar="NAME=PATH", help="a draft to measure (repeat)")
    p.add_argument("--out", required=True, help="folder for results.json, charts and server logs")
    p.add_argument("--prompts", default=None, help=".jsonl ({\"prompt\": ...}) or text lines (default: the demo's prompts)")
    p.add_argument("--num-prompts", type=positive_int, default=None)
    p.add_argument("--max-new-tokens", type=positive_int, default=48)
    p.add_argument("--concurrency", type=positive_int, default=1)
    serving_arguments(p)


def run(args, out) -> int:
    drafts = draft_pairs(args.draft)
    inside = among_inputs(args.out, [("the target", args.target), *((f"the draft {n}", p) for n, p in drafts)])
    if inside:
        raise UserError(f"--out {args.out}: {inside}")
    writable_folder(args.out, "--out")
    missing = missing_input(args.backend, [args.target] + [p for _, p in drafts])
    if missing:
        raise UserError(missing)
    engine, label = serving_engine(args)
    prompts = load_prompts(args.prompts or DEMO_PROMPTS, limit=args.num_prompts)

    requests = RequestProgress(label, sys.stderr)

    def progress(message):
        requests.close()
        sys.stderr.write(f"[{label}] {message}\n")

    try:
        runs = bench_drafts(args.backend, args.target, drafts, args.out, prompts, engine=engine, loader=args.loader,
                            num_steps=args.num_steps, max_new_tokens=args.max_new_tokens, concurrency=args.concurrency,
                            extra_args=extra_flags(args), progress=progress,
                            ready_timeout=args.ready_timeout, hang_timeout=args.hang_timeout,
                            prompts_file=args.prompts or DEMO_PROMPTS, on_request=requests, guard=args.guard)
    except DraftMisfit as e:
        sys.stderr.write(f"draftdoctor: not launched: {safe(e)}\n")
        return EXIT_FINDINGS
    except BenchFailed as e:
        sys.stderr.write(f"draftdoctor: measurement failed: {safe(e)}\n")
        return EXIT_FINDINGS
    except ServerError as e:  # a server that did not come up: a failed measurement, its log's last lines as lines
        sys.stderr.write(f"draftdoctor: measurement failed: {safe(str(e).splitlines()[0])}\n")
        for line in e.log_tail[-12:]:
            sys.stderr.write(f"    {safe(line)}\n")
        return EXIT_FINDINGS
    table([(r.result.name, number(r.result.accept_length),
            number(r.predicted.accept_length) if r.predicted else "-", number(r.result.accept_rate),
            number(r.result.tokens_per_s, 1), len(r.result.requests)) for r in runs],
          ["draft", "accept length", "predicted", "strict accept rate", "tokens/s", "requests"], out)
    out.write("\n")
    notes = []
    for r in runs:  # what each number means, read with check's verdict on the same draft; a shared remark once
        line, note = r.explained()
        out.write(f"{safe(r.result.name)}: {safe(line)}\n")
        if note and note not in notes:
            notes.append(note)
    out.write("".join(f"\n{safe(note)}\n" for note in notes))
    out.write(f"\n{label}; results: {args.out}/results.json, charts: acceptance.png, per_position.png, throughput.png\n")
    return EXIT_OK


class RequestProgress:
    """Each draft's answered requests: a progress bar on a terminal (tqdm); off one, a few lines (the
    first request, each quarter, the last) instead of one per request."""

    def __init__(self, label: str, stream):
        self.label, self.stream, self.bar, self.name = label, stream, None, None

    def __call__(self, name: str, done: int, total: int) -> None:
        if self.stream.isatty():
            if self.bar is None or self.name != name:
                from tqdm import tqdm

                self.close()
                self.bar = tqdm(total=total, desc=f"[{self.label}] {name}", unit="request", file=self.stream,
                                leave=False)
                self.name = name
            self.bar.update(done - self.bar.n)
            if done >= total:
                self.close()
        elif done in (1, total) or done * 4 // total > (done - 1) * 4 // total:
            self.stream.write(f"[{self.label}] {name}: {done}/{total} requests\n")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar = self.name = None
