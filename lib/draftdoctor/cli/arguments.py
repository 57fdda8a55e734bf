"""The argument types and groups more than one command takes: whole numbers, seconds, ports and hosts
checked as argparse parses them, the serving flags of `serve` and `bench`, the loader choice, and the
prediction flags of `check` and `fix`; and output folders checked before any work."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from ..errors import UserError
from ..runs import unwritable_folder
from ..serving.backends import BACKENDS, guard_refusal


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def positive_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < 1e7:
        raise ValueError(text)
    return value


def port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise ValueError(text)
    return value


def host(text: str) -> str:
    try:
        socket.getaddrinfo(text, None)
    except (socket.gaierror, UnicodeError):
        raise argparse.ArgumentTypeError(f"cannot resolve host {text!r}") from None
    return text


for _type, _name in ((positive_int, "whole number (>= 1)"), (positive_seconds, "seconds (> 0)"),
                     (port, "port (1-65535)")):
    _type.__name__ = _name  # argparse names the type in its one-line error: "invalid <name> value"


def loader_argument(p, help_text: str) -> None:
    # diagnose.LOADERS, spelled out: importing diagnose here would slow every command's start
    p.add_argument("--loader", choices=["auto", "replay", "real"], default="auto", help=help_text)


def prediction_arguments(p) -> None:
    """The prediction of acceptance (`predict.PredictionSpec`): with a --target folder holding weights."""
    p.add_argument("--no-predict", action="store_true", help="names, configs and values only: do not run the draft "
                                                               "on the target (the prediction takes seconds)")
    p.add_argument("--prompts", help="prompts for the prediction (.jsonl of {\"prompt\": ...}; default: the demo's)")
    p.add_argument("--num-prompts", type=positive_int, default=None, help="prompts the prediction runs (default 16)")
    p.add_argument("--new-tokens", type=positive_int, default=None,
                   help="tokens of the target's continuation per prompt (default 64)")
    p.add_argument("--num-steps", type=positive_int, default=None, help="draft tokens per verify step (default 4)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the target runs for the prediction (cuda: over the GPUs torch sees, by "
                        "transformers' device_map=auto; needs accelerate)")


def prediction(args):
    """What the command's --target and prediction flags ask for: a PredictionSpec, or False."""
    if args.no_predict or not args.target:
        return False
    from ..diagnose import prediction_spec  # check's and fix's: every parser imports this module

    spec = prediction_spec(args.target, prompts=args.prompts, num_prompts=args.num_prompts,
                           new_tokens=args.new_tokens, num_steps=args.num_steps, device=args.device)
    return spec or True


def serving_arguments(p) -> None:
    p.add_argument("--backend", choices=list(BACKENDS), default="reference",
                   help="reference: CPU EAGLE-3 server emulating an SGLang release; sglang: the real "
                        "sglang.launch_server (GPU host; not run here); vllm: real vLLM on the CPU "
                        "(`make vllm-loaders` installs it); llamacpp: llama.cpp's llama-server on the CPU, the "
                        "target and drafts converted to GGUF by its own converter (`make llamacpp` builds it)")
    p.add_argument("--engine", help="an engine release: to emulate (reference; e.g. sglang==0.5.10), whose flags to "
                                    "use (sglang; default: the installed release); with --backend vllm, vllm==X.Y.Z "
                                    "picks the vLLM release that serves (default: the tested one, 0.32.0), another "
                                    "engine's release serves each draft as that release's loader leaves it")
    p.add_argument("--loader", choices=["replay", "real"], default="replay",
                   help="reference backend: how the emulated release's loader is reproduced; replay by default, "
                        "not auto as for check, so that a measurement loads a draft the same way on every machine, "
                        "whichever real loaders are installed there")
    p.add_argument("--num-steps", type=positive_int, default=4, help="--speculative-num-steps")
    p.add_argument("--guard", action="store_true",
                   help="the guard in the server's own process: it stops the server before it is ready (exit "
                        "status 1, naming the parameters) when the engine's loader leaves a draft parameter "
                        "unwritten or drops a tensor (vllm: the kit's plugin; sglang: python -m draftdoctor.guard; "
                        "docs/guard.md)")
    p.add_argument("--ready-timeout", type=positive_seconds, default=900.0, help="seconds to wait for readiness")
    p.add_argument("--hang-timeout", type=positive_seconds, default=300.0,
                   help="seconds without log output during start-up that count as a hang")
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="after --: SGLang flags passed through unchanged (e.g. -- --tp-size 8 --enable-metrics)")


def extra_flags(args) -> list[str]:
    """The flags after `--`, passed through to the server unchanged."""
    return args.extra[1:] if args.extra[:1] == ["--"] else args.extra


def releases(specs):
    """--engine's words as EngineRelease values, resolved once here, where they enter (one spec, a list of
    them, or None); the serving commands resolve theirs with their backend's default (`serving_engine`)."""
    from ..engines import resolve_engine

    if specs is None:
        return None
    return [resolve_engine(s) for s in specs] if isinstance(specs, list) else resolve_engine(specs)


def serving_engine(args):
    """(EngineRelease or None, label): the release served (sglang: --engine, else the installed one; vllm:
    --engine, else the tested one) or emulated (reference: --engine, else the default), decided here
    once for serve and bench, by the backend's module."""
    from ..serving.launcher import backend_module  # the serving modules' imports: only for serve and bench

    refusal = guard_refusal(args.backend) if args.guard else None
    if refusal:
        raise UserError(refusal)
    module = backend_module(args.backend)
    engine = module.resolve(args.engine)
    return engine, module.backend_label(engine)


def writable_folder(folder, flag: str) -> None:
    """`folder` can be written in (`runs.unwritable_folder`), before any work; else one line naming the
    flag and the place (exit 2), not a traceback later."""
    problem = unwritable_folder(folder)
    if problem:
        raise UserError(f"{flag} {Path(folder)}: {problem}")
