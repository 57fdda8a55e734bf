"""JupyterLab from the kit's environment on loopback, with a known token: `make lab` for interactive
use, and the browser test (tests/test_lab_browser.py) that proves the notebooks work in it.

Lab runs as the launcher's `Server` (own process group, log in a file, crash detection, group stop);
it is ready when its REST API answers to the token. Its flags keep it quiet on a closed network: no
news feed, no update check.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from .serving.launcher import Server, ServerError

HOST = "127.0.0.1"


class Lab(Server):
    """A JupyterLab server serving `root`; use as a context manager (start, wait ready, stop)."""

    def __init__(self, root, log_path, port: int | None = None, token: str | None = None,
                 env: dict | None = None, ready_timeout: float = 120.0):
        self.root = Path(root).resolve()
        self.token = token or secrets.token_hex(24)
        root = self.root

        def argv(port):
            return [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ip={HOST}", f"--port={port}",
                    "--port-retries=0", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={self.token}",
                    "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                    # containers run as root; Lab refuses that without the flag
                    *(["--allow-root"] if os.geteuid() == 0 else [])]

        # port 0: a free one, chosen again if another process takes it first (the launcher's Server)
        super().__init__(argv, log_path, HOST, port or 0, env=env, ready_timeout=ready_timeout,
                         hang_timeout=ready_timeout)

    def url(self, path: str = "") -> str:
        """The address of `path` (relative to root) in Lab, with the token."""
        return f"{self.base_url}/lab/tree/{path}?token={self.token}"

    def _healthy(self) -> bool:
        request = urllib.request.Request(self.base_url + "/api/status", headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftdoctor.lab", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="the folder Lab serves (default: here)")
    parser.add_argument("--port", type=int, default=None, help="the port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--log", default="build/lab.log", help="Lab's log file (default: build/lab.log)")
    parser.add_argument("--open", default="notebooks", help="the folder or notebook the printed address opens")
    args = parser.parse_args(argv)
    from .errors import UserError
    from .toolstate import keep_out_of_home

    try:
        keep_out_of_home()  # Lab runs its config (Python) from the build area: trusted first
    except UserError as e:
        print(f"python -m draftdoctor.lab: {e}", file=sys.stderr)
        return 2
    lab = Lab(args.root, args.log, port=args.port)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop Lab (and its kernels) when we are stopped
    try:
        with lab:
            print(f"JupyterLab is running (log: {args.log}; Ctrl-C stops it):\n\n    {lab.url(args.open)}\n", flush=True)
            code = lab.process.wait()
            print(f"JupyterLab exited with status {code} (log: {args.log})", file=sys.stderr)
            return 1
    except ServerError as e:
        print(f"JupyterLab did not start: {e}", file=sys.stderr)  # the message carries the log tail
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
