"""The sglang backend: real `sglang.launch_server` (GPU hosts only: it is not run here), its launch
flags spelled for each release (the engines' `ServingFacts` rows), and SGLang's own verdict on a
command, from that release's parser and argument checks run on this CPU (`realload.parse_launch`).

Every backend module offers the same functions, which the launcher and `bench` call through the
backend's row (`serving.backends`): `command`, `launch`, `refusal`, `not_serving`, `label`, `run_bench`,
`sent_prompts`, `served_draft`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace

from ..engines import all_serving, resolve_engine, serving_facts
from ..errors import UserError
from .backends import BACKENDS
from .client import run_bench  # noqa: F401  (SGLang's /generate: the kit's own client)

ROW = BACKENDS["sglang"]
READY_LINE = "The server is fired up and ready to roll!"  # launch_server's log line once it serves
HEALTH_PATH = "/health_generate"  # answers 200 only once a generation went through
DEFAULT_PORT = 30000  # SGLang's own default: what its parser is shown for a port the launcher picks later


@dataclass
class ServeConfig:
    """What to serve and how; the fields map one to one onto SGLang's launch flags."""

    target: str
    draft: str | None = None
    algorithm: str = "EAGLE3"
    num_steps: int | None = 4
    topk: int | None = 1
    num_draft_tokens: int | None = 5
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port, chosen at launch (and chosen again if another process takes it first)
    tp_size: int | None = None
    dp_size: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    dist_init_addr: str | None = None
    mem_fraction_static: float | None = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    extra_args: list[str] = field(default_factory=list)  # passed through unchanged
    guard: bool = False  # the guard in the server's own process (draftdoctor.guard; the row says how)


class LaunchUnchecked(UserError):
    """A command the kit was asked to check with an engine's own parser that is not installed here."""


def cuda_graph_flags(release: str | None) -> tuple[tuple[str, ...], str]:
    """(disable flags, max-bs flag) valid for `release` (engines.sglang.SERVING; the newest row's
    when None or newer than any row)."""
    facts = (serving_facts(release) if release is not None else None) or all_serving()[-1]
    return facts.disable_cuda_graph, facts.cuda_graph_max_bs


def launch_args(config: ServeConfig, release: str | None = None) -> list[str]:
    """SGLang launch_server flags for `config`, spelled for `release`."""
    args = ["--model-path", config.target]
    if config.draft is not None:
        args += ["--speculative-algorithm", config.algorithm, "--speculative-draft-model-path", config.draft]
        spec = (config.num_steps, config.topk, config.num_draft_tokens)
        if any(v is not None for v in spec):
            if any(v is None for v in spec):
                # SGLang requires all three or none (it then picks them from the target).
                raise ValueError("give num_steps, topk and num_draft_tokens together, or none of them")
            args += ["--speculative-num-steps", str(config.num_steps), "--speculative-eagle-topk", str(config.topk),
                     "--speculative-num-draft-tokens", str(config.num_draft_tokens)]
    args += ["--host", config.host, "--port", str(config.port)]
    for flag, value in (("--tp-size", config.tp_size), ("--dp-size", config.dp_size), ("--nnodes", config.nnodes),
                        ("--node-rank", config.node_rank), ("--dist-init-addr", config.dist_init_addr),
                        ("--mem-fraction-static", config.mem_fraction_static)):
        if value is not None:
            args += [flag, str(value)]
    disable, max_bs = cuda_graph_flags(release)
    if config.disable_cuda_graph:
        args += list(disable)
    if config.cuda_graph_max_bs is not None:
        args += [max_bs, str(config.cuda_graph_max_bs)]
    return args + list(config.extra_args)


def command(config: ServeConfig, engine=None, loader: str | None = None, python: str | None = None) -> list[str]:
    """`python -m sglang.launch_server` with the flags of `engine`'s release (None: the newest known); with
    `config.guard`, behind the guard's launcher (SGLang has no plugin entry point)."""
    python = python or sys.executable
    guard = [python, "-m", "draftdoctor.guard", "--"] if config.guard else []
    return [*guard, python, "-m", "sglang.launch_server",
            *launch_args(config, engine.release if engine else None)]


def launch(config: ServeConfig, engine=None, loader: str | None = None):
    """(argv as a function of the port, the Server's keyword arguments)."""
    return (lambda port: command(replace(config, port=port), engine, loader)), {
        "health_path": HEALTH_PATH, "ready_line": READY_LINE}


def verdict(config: ServeConfig, engine) -> dict:
    """SGLang's own parser and checks on the command for `config` (see realload.parse_launch); raises
    LaunchUnchecked when `engine`'s release is not installed here."""
    from ..realload import parse_launch
    from ..realload.registry import REAL_LOADERS, ReleaseNotInstalled

    argv = command(replace(config, port=config.port or DEFAULT_PORT), engine)
    try:
        return parse_launch(engine.release, [argv[argv.index("sglang.launch_server") + 1:]])[0]
    except ReleaseNotInstalled:
        raise LaunchUnchecked(f"SGLang {engine.release}'s parser is not installed here: "
                              f"{REAL_LOADERS['sglang'].install_hint(engine.release)} installs it "
                              "(on CPU, without serving)") from None


def refusal(config: ServeConfig, engine=None, loader: str | None = None) -> str | None:
    """SGLang's refusal of the command, where its release's parser is installed here (a GPU host
    serves its own SGLang, which says the same when it starts)."""
    if engine is None:
        return None
    try:
        said = verdict(config, engine)
    except LaunchUnchecked:
        return None
    return None if said["accepted"] else f"SGLang {engine.release} refused the command at its {said['stage']}: " \
                                         f"{said['message']}"


def not_serving(base_url: str) -> str | None:
    """Why a ready server would not speculate (None: SGLang says so itself when it starts)."""
    return None


def installed_release(python: str = sys.executable) -> str | None:
    """The SGLang release installed for `python`, without importing it here."""
    import subprocess

    probe = "import importlib.metadata as m; print(m.version('sglang'))"
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def backend_label(engine=None) -> str:
    return f"SGLang {engine.release if engine else installed_release()}"


def sent_prompts(target, prompts: list[str]) -> list[str]:
    return prompts


def cannot_serve_as(engine) -> str | None:
    return None  # `engine` is the SGLang release served


def served_draft(draft: str, engine, folder) -> str:
    """SGLang serves the draft as it is (`engine` is the release served)."""
    return draft


def resolve(spec: str | None):
    """The engine served: `--engine`, else the installed SGLang (a release newer than the kit's rows
    is served with the newest flags the kit knows); None when neither is known."""
    from ..engines import EngineRelease, EngineSpecError

    if spec:
        return resolve_engine(spec)
    installed = installed_release()
    try:
        return EngineRelease.of("sglang", installed) if installed else None
    except EngineSpecError:
        return None
