"""`python -m draftdoctor.realload ENGINE RELEASE FOLDER`: the install's self-check (`common.self_check`)
of a release just installed in FOLDER, before its ready marker is written (`make sglang-loaders`,
`make vllm-loaders`), in the environment every later check of it gets. The child's report goes to
stdout, its messages to stderr; the exit status is the child's (3: the environment is broken)."""

import subprocess
import sys
from pathlib import Path

from .childenv import _child

if __name__ == "__main__":
    engine, release, folder = sys.argv[1:]
    command, env = _child(engine, release, [], folder=Path(folder).resolve())
    sys.exit(subprocess.run(command, env=env, stdin=subprocess.DEVNULL).returncode)
