"""`python -m draftdoctor.guard -- COMMAND [ARG...]`: run a server command with the guard on in every
Python process it starts (docs/guard.md).

For SGLang, which has no plugin entry point: `python -m draftdoctor.guard -- python -m
sglang.launch_server --model-path ... --speculative-algorithm EAGLE3 ...`. The command replaces this
process (its exit status is the command's); its environment gets DRAFTDOCTOR_GUARD=1 and, first on
PYTHONPATH, the guard's start-up hook (`startup/sitecustomize.py`) and this kit. vLLM needs none of
this when the kit is installed beside it (its plugin entry point): `DRAFTDOCTOR_GUARD=1 vllm serve ...`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import ENV

USAGE = "usage: python -m draftdoctor.guard -- COMMAND [ARG...]"
STARTUP = Path(__file__).resolve().parent / "startup"
# interpreter options that stop Python from running the start-up hook: -S (no `site`), -I (isolated:
# no PYTHONPATH, no site-packages), -E (no PYTHON* variables)
_BLIND = set("SIE")


def environment(base: dict | None = None) -> dict:
    """`base` (this process's environment) with the guard on and its start-up hook first on the path."""
    from ..realload import kit_path

    env = dict(os.environ if base is None else base)
    path = [str(STARTUP), str(kit_path()), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[ENV] = "1"
    return env


def blind_option(command: list[str]) -> str | None:
    """The interpreter option of a `python ...` command that would keep the hook out, if any."""
    if not Path(command[0]).name.startswith("python"):
        return None
    args = iter(command[1:])
    for arg in args:
        if arg in ("-m", "-c") or not arg.startswith("-") or arg.startswith("--"):
            return None
        if arg in ("-X", "-W"):
            next(args, None)
            continue
        if arg[1] in "XW":
            continue
        if _BLIND & set(arg[1:]):
            return arg
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["--"] or len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    command = argv[1:]
    blind = blind_option(command)
    if blind:
        print(f"draftdoctor guard: {command[0]} {blind} would not run the guard's start-up hook; "
              "drop the option", file=sys.stderr)
        return 2
    try:
        os.execvpe(command[0], command, environment())
    except OSError as exc:
        print(f"draftdoctor guard: cannot run {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
