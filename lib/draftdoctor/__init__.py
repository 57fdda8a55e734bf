"""draftdoctor: find why an EAGLE-3 draft gets no acceptance once served, fix it, and prove it.

Header-only modules (checkpoint, layouts, configs, engines, coverage, findings) import no torch.
"""

import os as _os
import signal as _signal
import sys as _sys

__version__ = "0.1.0"


def _interrupted_early(signum, frame):
    """Ctrl-C while the `draftdoctor` command imports and parses its arguments: one line naming the
    signal, exit 130, no traceback. `cli.main` puts the usual handling back before a command runs
    (servers are stopped then)."""
    _sys.stderr.write(f"draftdoctor: interrupted by {_signal.Signals(signum).name}\n")
    _os._exit(128 + signum)


def _arm_early_interrupt() -> None:
    """`_interrupted_early` for SIGINT, unless the process started with SIGINT ignored: a shell without job
    control starts `draftdoctor ... &` so, that the terminal's Ctrl-C does not reach it; it stays so."""
    if _signal.getsignal(_signal.SIGINT) is not _signal.SIG_IGN:
        _signal.signal(_signal.SIGINT, _interrupted_early)


# The console script imports this package first: from here on (only Python's own start-up comes before)
if _os.path.basename(_sys.argv[0] or "") == "draftdoctor":
    _arm_early_interrupt()
