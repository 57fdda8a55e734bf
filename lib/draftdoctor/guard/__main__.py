"""`python -m draftdoctor.guard -- COMMAND [ARG...]`: run a server command with the guard on in every
Python process it starts, and fail when the guard never reported from a process that loaded a draft
(docs/guard.md).

For SGLang, which has no plugin entry point: `python -m draftdoctor.guard -- python -m
sglang.launch_server --model-path ... --speculative-algorithm EAGLE3 ...`. The command's environment
gets DRAFTDOCTOR_GUARD=1 and, first on PYTHONPATH, the guard's start-up hook (`startup/sitecustomize.py`)
and this kit; DRAFTDOCTOR_GUARD_REPORTS names a private folder where each process the hook runs in
says so, and says what it did with each draft it saw loaded. The launcher stays the command's parent:
it passes on the signals it is sent, and when the command ends it reads that folder. A command that
ended without the guard having judged (or declined to judge) a draft in the process that loaded it ran
blind: when it ended with status 0 or was stopped by a signal, one line says why, exit 2. Otherwise the
exit status is the command's (128 + N for a command ended by signal N). `draftdoctor serve/bench --guard` read the same
folder the moment the server is ready, and stop it there.

vLLM needs none of this when the kit is installed beside it (its plugin entry point):
`DRAFTDOCTOR_GUARD=1 vllm serve ...`.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from . import ENV, PREFIX, REPORTS, reports, unguarded

USAGE = "usage: python -m draftdoctor.guard -- COMMAND [ARG...]"
STARTUP = Path(__file__).resolve().parent / "startup"
# interpreter options that stop Python from running the start-up hook: -S (no `site`), -I (isolated:
# no PYTHONPATH, no site-packages), -E (no PYTHON* variables). Refused at once, before a server starts;
# any other way of keeping the hook out is caught by the reports (`unguarded`).
_BLIND = set("SIE")
_TAKES_ARGUMENT = ("--check-hash-based-pycs",)  # the interpreter's long options that take a value
# the signals passed on to the command: those that ask a server to stop or to report
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_FROM_THE_TERMINAL = 0x80  # SI_KERNEL: a terminal's ^C or hang-up, which its whole foreground group got


def environment(base: dict | None = None, reports_folder: str | None = None) -> dict:
    """`base` (this process's environment) with the guard on, its start-up hook first on the path and,
    given, the folder its processes report to."""
    from ..realload.childenv import kit_path

    env = dict(os.environ if base is None else base)
    path = [str(STARTUP), str(kit_path()), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[ENV] = "1"
    if reports_folder is not None:
        env[REPORTS] = str(reports_folder)
    return env


def blind_option(command: list[str]) -> str | None:
    """The interpreter option of a `python ...` command that would keep the hook out, if any."""
    if not Path(command[0]).name.startswith("python"):
        return None
    args = iter(command[1:])
    for arg in args:
        if arg in _TAKES_ARGUMENT:
            next(args, None)
            continue
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


def private_folder(path: str) -> bool:
    """A real folder (not a link) of this user's that no one else can read or write: where the caller
    (`serve --guard`) wants the reports."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def run(command: list[str], reports_folder: str) -> tuple[int, bool]:
    """Run `command` as this process's child with the guard's environment, passing on the signals this
    process is sent (not a terminal's, which the command got itself); it dies with this process.
    Returns (its exit status, whether it was asked to stop by a signal)."""
    from ..realload.common import die_with_parent

    blocked = set(FORWARDED) | {signal.SIGCHLD}
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an inherited SIG_IGN would reap it before we could

    def in_the_child():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        die_with_parent()

    signal.pthread_sigmask(signal.SIG_BLOCK, blocked)  # from here on, each arrives at sigwaitinfo
    try:
        # a server reads no input: never the terminal's (a background job would be stopped reading it)
        child = subprocess.Popen(command, env=environment(reports_folder=reports_folder), preexec_fn=in_the_child,
                                 stdin=subprocess.DEVNULL)
        stopped = False
        while (code := child.poll()) is None:
            info = signal.sigwaitinfo(blocked)
            if info.si_signo == signal.SIGCHLD:
                continue
            stopped = True
            if info.si_code != _FROM_THE_TERMINAL:
                try:
                    child.send_signal(info.si_signo)
                except ProcessLookupError:
                    pass
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    return (128 - code if code < 0 else code), stopped


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["--"] or len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    command = argv[1:]
    blind = blind_option(command)
    if blind:
        print(f"{PREFIX}: {command[0]} {blind} would not run the guard's start-up hook; drop the option",
              file=sys.stderr)
        return 2
    given = os.environ.get(REPORTS)
    owned = not (given and private_folder(given))  # `serve --guard`'s folder, which it reads when the server is ready
    folder = tempfile.mkdtemp(prefix="draftdoctor-guard-") if owned else given  # this user's alone (0700)
    try:
        try:
            code, stopped = run(command, folder)
        except OSError as exc:
            print(f"{PREFIX}: cannot run {command[0]}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        why = unguarded(reports(folder))
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
    # a command that failed on its own before any draft was loaded keeps its status: nothing ran blind
    if why and (code == 0 or stopped):
        print(f"{PREFIX}: {Path(command[0]).name} ended (status {code}) unguarded: {why}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
