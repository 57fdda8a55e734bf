"""draftdoctor: find why an EAGLE-3 draft gets no acceptance once served, fix it, and prove it.

Header-only modules (checkpoint, layouts, configs, engines, coverage, findings) import no torch.
"""

import os as _os
import signal as _signal
import sys as _sys

__version__ = "0.1.0"


def _interrupted_early(signum, frame):
    """Ctrl-C while the `draftdoctor` command imports and parses its arguments: one line, exit 130, no
    traceback. `cli.main` puts the usual handling back before a command runs (servers are stopped then)."""
    _sys.stderr.write("draftdoctor: interrupted\n")
    _os._exit(130)


# The console script imports this package first: from here on (only Python's own start-up comes before)
if _os.path.basename(_sys.argv[0] or "") == "draftdoctor":
    _signal.signal(_signal.SIGINT, _interrupted_early)
