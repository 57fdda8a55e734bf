"""The `draftdoctor` command line: the only package (besides notebooks) that prints. One module per
command (`arguments(parser)` and `run(args, out)`), `render` for what their text output shares,
`arguments` for the argument types and groups several commands take; here the parser and `main`.

What a command decides (its exit status, a refusal, a warning, whether a place can be written) is the
library's, as values (`exits`, `serving.backends`, `runs`, ...); a command module renders them. Exit
status: 0 no error findings, 1 error findings (a refused fix, a failed measurement), 2 unusable input
or arguments.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from importlib import import_module

from ..errors import UserError
from ..exits import EXIT_OK, EXIT_UNUSABLE
from .render import safe

DESCRIPTION = """\
Find out why a speculative-decoding draft model (EAGLE-3) gets no acceptance once served, fix its
checkpoint, and prove the fix by measuring acceptance before and after. The usual order:
  inspect DRAFT                        what the checkpoint holds (headers only, any size)
  check DRAFT --engine E --target T    what engine release E's loader writes, skips or leaves at
                                       init, and whether the draft fits target T
  fix DRAFT --engine E --target T --out FIXED
                                       rename tensors and rewrite the config for E; verified, and
                                       refused when the result would still fail `check`
  compare TRAINED DRAFT                how two checkpoints differ: tensor by tensor, and their configs
                                       by what each engine release does with them
  bench --target T --draft before=DRAFT --draft after=FIXED --out DIR
                                       serve each draft, measure acceptance, chart it
  investigate --params P.yaml --out runs/NAME
                                       all of it as notebooks, with a report
  demo [--out runs/demo]               the bundled demo draft, investigated end to end
  loaders list | install E==R          the engines' own loaders (check --loader real): list, install
E is e.g. sglang==0.5.10 or vllm==0.32.0. Exit status: 0 no error findings; 1 error findings, a
refused fix or a failed measurement; 2 unusable input or arguments. Each command's --help says more.
What the kit builds and installs (real loaders, llama.cpp) and tool state (Jupyter, matplotlib, ...)
go under $DRAFTDOCTOR_STATE; unset, the checkout's build/ when run from a checkout, else the user
cache folder ($XDG_CACHE_HOME or ~/.cache, then draftdoctor)."""

# name: help; the command's module is draftdoctor.cli.<name>, imported only when its parser is built
COMMANDS = {
    "inspect": "list a checkpoint's tensors from its headers alone",
    "check": "what an engine's loader would write, skip, or leave at init",
    "fix": "rewrite a draft so an engine loads every tensor, verified; SRC is never modified",
    "compare": "pair two checkpoints' tensors by name, parts or content, say how each pair differs, and compare "
               "the configs by meaning; exit 1 if they differ",
    "serve": "start a speculative-decoding server and wait until it is ready",
    "bench": "serve each draft in turn, measure acceptance, write results.json and charts",
    "investigate": "run the five notebooks with papermill and write report.md/report.json",
    "loaders": "list the engine releases whose real loader the kit runs, or install some (pinned, self-checked)",
    "demo": "investigate the bundled demo draft end to end (what `make demo` runs), from any folder",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 as well; keep the message to one line
        self.exit(EXIT_UNUSABLE, f"draftdoctor: error: {message}\n")


def build_parser(command: str | None = None, summary: bool = False) -> argparse.ArgumentParser:
    """The command line's parser; with `command`, only that sub-command's (all of them take 5 ms to
    build, a tenth of a short command's run, and each imports its command's module). With `summary`,
    the sub-commands without their arguments: all `draftdoctor --help` and a misspelt command need."""
    parser = _Parser(prog="draftdoctor", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, help_text in COMMANDS.items():
        if command in (None, name):
            p = sub.add_parser(name, help=help_text)
            if not summary:
                module = import_module(f"{__name__}.{name}")
                module.arguments(p)
                p.set_defaults(run=module.run)
    return parser


def _parser_for(argv: list[str]) -> argparse.ArgumentParser:
    """The parser `argv` needs: its command's alone; every command's when a command is named further on;
    else (help, no command, a misspelt one) the summary, which answers the same without importing any."""
    if argv and argv[0] in COMMANDS:
        return build_parser(argv[0])
    return build_parser(summary=not any(arg in COMMANDS for arg in argv))


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so every server started is stopped on the way out."""


def _terminate(signum, frame):
    raise _Terminated(signum)


def _handle_signals() -> None:
    """SIGTERM and SIGHUP unwind as Ctrl-C (SIGINT) does: servers stopped, temporary folders removed. A
    signal the process started with ignored stays ignored (`nohup` ignores SIGHUP; a shell without job
    control starts `cmd &` with SIGINT ignored), so a terminal's hang-up or Ctrl-C does not end work put
    in the background. SIGTTOU and SIGTTIN are ignored here and, inherited, in every child: work run
    outside its terminal's foreground group (under `timeout`, with `&`, by a job system) that writes to
    or sets the terminal goes on instead of stopping (it had stopped for good: timeout's SIGTERM and
    SIGCONT woke it only for it to stop again writing that it was interrupted). The kit never reads the
    terminal, and its children get no terminal as their input."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _terminate)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here, Ctrl-C unwinds (servers stopped)
    for signum in (signal.SIGTTOU, signal.SIGTTIN):
        signal.signal(signum, signal.SIG_IGN)


def main(argv=None) -> int:
    from ..toolstate import keep_out_of_home  # not needed for --help or a usage error

    argv = sys.argv[1:] if argv is None else argv
    args = _parser_for(argv).parse_args(argv)
    try:
        _handle_signals()
        keep_out_of_home()  # the build area checked before any command uses it (toolstate.trusted)
        return args.run(args, sys.stdout)
    except UserError as e:
        sys.stderr.write(f"draftdoctor: error: {safe(e)}\n")
        return EXIT_UNUSABLE
    except KeyboardInterrupt as e:
        signum = e.args[0] if isinstance(e, _Terminated) else signal.SIGINT
        sys.stderr.write(f"draftdoctor: interrupted by {signal.Signals(signum).name} "
                         "(anything half-written was removed)\n")
        return 128 + signum
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:  # the file system refused something not caught where it happened: still one line
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"draftdoctor: error: {safe(where)}{safe(e.strerror or e)}\n")
        return EXIT_UNUSABLE


def entry() -> None:
    """The `draftdoctor` console script. Freezes the heap before exiting: the interpreter's final
    collections would otherwise rescan every object (5 ms of a 60 ms command, measured)."""
    status = main()
    gc.freeze()
    sys.exit(status)
