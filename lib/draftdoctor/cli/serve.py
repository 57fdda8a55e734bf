"""`draftdoctor serve`: start a speculative-decoding server and wait until it is ready (Ctrl-C stops it);
`--dry-run` shows the command, checked by SGLang's own parser for `--backend sglang`."""

from __future__ import annotations

import shlex
import sys
import time

from ..errors import UserError
from ..exits import EXIT_FINDINGS, EXIT_OK
from ..runs import unwritable_file
from ..serving.backends import exposure_warning
from ..serving.launcher import GuardStopped, ServeConfig, dry_run, serve
from .arguments import extra_flags, host, port, positive_int, serving_arguments, serving_engine
from .render import safe


def arguments(p) -> None:
    p.add_argument("--model-path", dest="target", required=True, help="the target model")
    p.add_argument("--speculative-draft-model-path", dest="draft", required=True, help="the draft")
    p.add_argument("--speculative-algorithm", default="EAGLE3")
    p.add_argument("--speculative-eagle-topk", dest="topk", type=positive_int, default=1)
    p.add_argument("--speculative-num-draft-tokens", dest="num_draft_tokens", type=positive_int, default=None)
    p.add_argument("--host", type=host, default="127.0.0.1")
    p.add_argument("--port", type=port, default=None, help="default: a free port")
    for flag in ("--tp-size", "--dp-size", "--nnodes", "--node-rank"):
        p.add_argument(flag, type=int, default=None, help="passed to SGLang")
    p.add_argument("--dist-init-addr", default=None, help="passed to SGLang")
    p.add_argument("--disable-cuda-graph", action="store_true", help="spelled for the SGLang release in use")
    p.add_argument("--log", default="build/serve.log", help="the server's log file")
    p.add_argument("--dry-run", action="store_true",
                   help="print the command instead of running it; with --backend sglang, checked by that SGLang "
                        "release's own parser and argument checks, on this CPU (exit 1 if refused)")
    serving_arguments(p)


def _serve_config(args) -> ServeConfig:
    return ServeConfig(target=args.target, draft=args.draft, algorithm=args.speculative_algorithm,
                       num_steps=args.num_steps, topk=args.topk,
                       num_draft_tokens=args.num_draft_tokens or args.num_steps + 1,
                       host=args.host, port=args.port or 0, tp_size=args.tp_size,
                       dp_size=args.dp_size, nnodes=args.nnodes, node_rank=args.node_rank,
                       dist_init_addr=args.dist_init_addr, disable_cuda_graph=args.disable_cuda_graph,
                       extra_args=extra_flags(args), guard=args.guard)


def run(args, out) -> int:
    if args.dry_run:
        return _dry_run(args, out)
    problem = unwritable_file(args.log)
    if problem:
        raise UserError(f"--log {args.log}: {problem}")
    config = _serve_config(args)
    engine, label = serving_engine(args)
    warning = exposure_warning(args.backend, args.host)
    if warning:
        sys.stderr.write(f"draftdoctor: warning: {safe(warning)}\n")
    sys.stderr.write(f"starting {label}; log: {args.log}\n")
    try:
        server = serve(args.backend, config, args.log, engine=engine, loader=args.loader,
                       ready_timeout=args.ready_timeout, hang_timeout=args.hang_timeout)
    except GuardStopped as e:  # a finding about the draft, not a usage error
        sys.stderr.write("".join(f"draftdoctor: {safe(line)}\n" if i == 0 else f"{safe(line)}\n"
                                 for i, line in enumerate(str(e).splitlines())))
        return EXIT_FINDINGS
    try:
        out.write(f"{label} ready at {server.base_url} (Ctrl-C stops it)\n")
        out.flush()
        while server.process.poll() is None:
            time.sleep(0.5)
        sys.stderr.write(f"draftdoctor: the server exited (status {server.process.returncode}); see {args.log}\n")
        return EXIT_FINDINGS
    finally:
        server.stop()


def _dry_run(args, out) -> int:
    """The command `serve` would run; for real SGLang, that release's own parser and checks on it:
    exit 0 accepted, 1 refused (SGLang's words)."""
    engine, label = serving_engine(args)
    checked = dry_run(args.backend, _serve_config(args), engine=engine, loader=args.loader)
    out.write(f"{label}: {safe(shlex.join(checked.command))}\n")
    if args.port is None:
        out.write(f"(serve picks a free port in place of {checked.command[checked.command.index('--port') + 1]})\n"
                  if "--port" in checked.command else "")
    verdict = checked.verdict
    if verdict is None:
        out.write("not checked by an engine's parser: only --backend sglang's command is (SGLang's own, on CPU)\n")
        return EXIT_OK
    for note in verdict["notes"]:
        out.write(f"  SGLang {checked.release} says: {safe(note.strip())}\n")
    if verdict["accepted"]:
        out.write(f"accepted by SGLang {checked.release}'s own parser and argument checks (device {verdict['device']}; "
                  "what needs a GPU, its memory and CUDA graphs, is not checked here)\n")
        return EXIT_OK
    out.write(f"refused by SGLang {checked.release}'s own {verdict['stage']}: {safe(verdict['message'])}\n")
    return EXIT_FINDINGS
