"""`draftdoctor fix`: the plan (`--plan`), or the rewritten checkpoint, verified; or the refusal, with
what the user can do."""

from __future__ import annotations

import sys
from dataclasses import asdict

from ..errors import UserError
from ..exits import EXIT_FINDINGS, status
from ..findings import CODES
from ..fix import NOTHING_TO_CHANGE, FixBlocked, apply_fix, plan_fix
from ..tables import human_bytes
from .arguments import loader_argument, prediction, prediction_arguments, releases
from .render import safe, short, table, write_json

PROGRESS_MIN_BYTES = 256 << 20


def arguments(p) -> None:
    p.add_argument("path", metavar="SRC")
    p.add_argument("--engine", required=True, help="e.g. sglang==0.5.10, sglang (newest known), vllm")
    p.add_argument("--out", metavar="DST", help="new checkpoint folder (must not exist unless --force)")
    p.add_argument("--target", help="the target model's folder (or config.json): refuse a result that does not fit it "
                                    "(hidden size, vocabulary, aux layers the engine can capture)")
    p.add_argument("--plan", action="store_true", help="show what would change; write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing DST, once the new one is verified")
    p.add_argument("--allow-lossy", action="store_true",
                   help="write even if the engine cannot compute an option or norm the draft was trained with "
                        "(reported; such a draft serves, with lower acceptance)")
    p.add_argument("--head-from-target", action="store_true",
                   help="for a draft with no lm_head whose draft_vocab_size is the target's vocabulary: assume it was "
                        "trained with the target's head (frozen, so not saved) and write draft_vocab_size: null, so "
                        "the engine takes the target's head; refused where that cannot be right or the release "
                        "cannot do it")
    loader_argument(p, "which loader verifies the written draft, as `check --loader` (the plan is always "
                       "replayed: it exists only as headers until written)")
    prediction_arguments(p)
    p.add_argument("--format", choices=["text", "json"], default="text")


def run(args, out) -> int:
    # writing, the plan is judged (`check` on the result: values, replay, prediction) while the copy is written
    plan = plan_fix(args.path, releases(args.engine), target=args.target, loader=args.loader,
                    head_from_target=args.head_from_target, predict=prediction(args),
                    judge=args.plan or args.out is None)
    if args.plan:
        refused = plan.refusal(args.allow_lossy)
        if args.format == "json":
            write_json(plan.to_dict() | {"refused": [f.code for f in refused.findings] if refused else []}, out)
        else:
            _print_plan(plan, out, skip=refused.findings if refused else ())
            if refused:
                _print_refusal(refused, out)
        return status(bool(refused))
    if args.out is None:
        raise UserError("fix needs --out DST (or --plan to only show the plan)")
    bar = None
    if plan.bytes_to_copy >= PROGRESS_MIN_BYTES and sys.stderr.isatty():  # tqdm's own rule; its import costs 60 ms
        from tqdm import tqdm

        bar = tqdm(total=plan.bytes_to_copy, unit="B", unit_scale=True, desc="copying", file=sys.stderr, leave=False)
    try:
        result = apply_fix(plan, args.out, force=args.force, allow_lossy=args.allow_lossy,
                           progress=bar.update if bar else None)
    except FixBlocked as e:
        if args.format == "json":
            write_json({"src": str(plan.src), "engine": plan.engine.spec, "ok": False, "written": False,
                        "refused": [asdict(f) | {"remedy": CODES[f.code].remedy} for f in e.findings],
                        "verdict": plan.predicted.verdict}, out)
        else:
            _print_refusal(e, out)
        return EXIT_FINDINGS
    finally:
        if bar:
            bar.close()
    if args.format == "json":
        write_json(result.to_dict(), out)
        return status(not result.ok)
    v = result.verification
    if not result.ok:
        out.write(f"verification failed; nothing written to {safe(result.dst)}:\n")
        for problem in v.problems:
            out.write(f"  {safe(problem)}\n")
        return status(True)
    out.write(f"wrote {safe(result.dst)} for {plan.engine}: {result.tensors_renamed} tensors renamed, "
              f"{result.tensors_copied} copied ({human_bytes(result.bytes_copied)}, {result.copy_method}), "
              f"{len(plan.config.changes)} config changes, {result.files_copied} other files, "
              f"{result.seconds:.2f} s\n")
    out.write(f"verified: headers re-read, {v.tensors_checked} tensors' bytes compared equal to the source, "
              f"then checked as `draftdoctor check --engine {plan.engine.spec}"
              f"{' --target ' + safe(args.target) if args.target else ''}` would\n")
    shown = [f for f in plan.findings if f.code in ("config-defaulted", "lossy-config")] + v.coverage.findings
    for f in shown:
        if f.severity != "info" or f.code == "not-checked":
            out.write(f.line(safe) + "\n")
    if v.accepted_losses and v.coverage.errors:
        out.write(f"accepted with --allow-lossy: {', '.join(sorted({f.code for f in v.coverage.errors}))}\n")
    if plan.changes_nothing:
        out.write(NOTHING_TO_CHANGE.format(engine=plan.engine) + "\n")
    out.write(f"verdict: {safe(v.coverage.verdict)}\n")
    return status(False)


def _print_refusal(refused, out) -> None:
    """Why fix writes nothing: each error finding the result would carry, and what the user can do."""
    out.write(f"refused: nothing written. The fixed checkpoint would still carry {len(refused.findings)} "
              f"finding(s) for {refused.plan.engine} that stop it:\n")
    for f in refused.findings:
        out.write(f"{f.line(safe)}\n        what you can do: {CODES[f.code].remedy}\n")
    if refused.plan.lossy and not refused.plan.blocking:
        out.write("pass --allow-lossy to write it anyway (the loss is then yours to accept)\n")
    out.write(f"verdict (check on the result): {safe(refused.plan.predicted.verdict)}\n")


def _print_plan(plan, out, skip=()) -> None:
    out.write(f"fix plan: {safe(plan.src)} for {plan.engine}\n")
    out.write(f"layout: {plan.layout.name}; rule: {plan.rule}\n\n")
    table([(t.old, t.new if t.new is not None else "(left out)", t.reason) for t in plan.tensors],
          ["tensor", "becomes", "why"], out)
    out.write(f"\nconfig.json ({plan.config.format}):\n")
    for c in plan.config.changes:
        moved = f" (now {c.moved_to})" if c.moved_to else ""
        out.write(safe(f"  {c.field}: {short(c.before)} -> {short(c.after)}{moved}: {c.reason}") + "\n")
    if not plan.config.changes:
        out.write("  unchanged\n")
    for f in plan.files:
        out.write(f"file {safe(f.name)}: {f.reason}\n")
    out.write(f"\n{len(plan.renamed)} renamed, {len(plan.tensors) - len(plan.renamed) - len(plan.omitted)} kept, "
              f"{len(plan.omitted)} left out; {plan.bytes_to_copy:,} bytes to copy\n")
    for f in plan.findings:
        if f not in skip:
            out.write(f.line(safe) + "\n")
    if not skip:
        out.write(f"predicted: {safe(plan.predicted.verdict)}\n")
    if plan.changes_nothing:
        out.write(NOTHING_TO_CHANGE.format(engine=plan.engine) + "\n")
