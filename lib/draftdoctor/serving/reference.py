"""The reference backend: the kit's CPU EAGLE-3 server (`draftdoctor.reference.server`), emulating an
engine release from its profile row, started with SGLang's flags. The default of `serve` and `bench`;
the same functions as every backend module (see serving.sglang).
"""

from __future__ import annotations

import sys
from dataclasses import replace

from ..engines import resolve_engine
from .backends import BACKENDS
from .client import run_bench  # noqa: F401  (it answers SGLang's /generate and /server_info)
from . import sglang
from .sglang import launch_args

ROW = BACKENDS["reference"]
LISTEN_FD_FLAG = "--listen-fd"  # reference.server's: the listening socket it inherits
DEFAULT_ENGINE = ROW.default_spec  # the release it emulates unless told


def command(config, engine=None, loader: str | None = None, python: str | None = None) -> list[str]:
    extra = (["--engine", engine.spec] if engine else []) + (["--loader", loader] if loader else [])
    return [python or sys.executable, "-m", "draftdoctor.reference.server",
            *launch_args(config, engine.release if engine else None), *extra]


def launch(config, engine=None, loader: str | None = None):
    """SGLang's readiness: the reference server answers its health path and prints its ready line. It
    serves on a listening socket the launcher holds and passes (`--listen-fd`), never a port of its own."""
    return (lambda port: command(replace(config, port=port), engine, loader)), {
        "health_path": sglang.HEALTH_PATH, "ready_line": sglang.READY_LINE, "listen_fd_flag": LISTEN_FD_FLAG}


def refusal(config, engine=None, loader: str | None = None) -> str | None:
    return None  # the server refuses a draft its emulated release would, with that release's message


def not_serving(base_url: str) -> str | None:
    return None


def backend_label(engine=None) -> str:
    from ..realload.registry import REAL_LOADERS

    emulated = engine or resolve(None)
    return (f"reference backend emulating {emulated.spec} "
            f"(CPU; not {REAL_LOADERS[emulated.name].display if emulated.name in REAL_LOADERS else emulated.name} itself)")


def sent_prompts(target, prompts: list[str]) -> list[str]:
    return prompts


def cannot_serve_as(engine) -> str | None:
    return None  # it emulates any engine release with a profile row


def served_draft(draft: str, engine, folder) -> str:
    """The draft as it is: the server itself loads it as the emulated release does."""
    return draft


def resolve(spec: str | None):
    """The release `--engine` names (the CLI's words), else the one emulated by default."""
    return resolve_engine(spec or DEFAULT_ENGINE)
