"""What a real loader's child process sees and runs in, and the cold run of one.

`CHILD_ENV` (no hub, no code from the folder it starts in), `_child` (the command and environment of a
child running one release: the release's folder, the kit's own lib folder via `kit_path`, and for a
pinned release nothing else of the venv but torch's view), the private state folder the workers and
children keep their files in (`worker_state`, `_private`, `WorkerPlaceUnsafe`), scratch folders for
temporary files (`scratch_folder`, `scratch`), and `_run_child`: a fresh child for one batch.
"""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from ..toolstate import STATE, trusted
from .common import EXIT_ENVIRONMENT
from .registry import REAL_LOADERS, RealLoaderCrashed, RealLoaderError, RealLoaderTimeout, release_env

# Every child that reads model folders with third-party code: no hub, and nothing imported from the
# folder it was started in (PYTHONSAFEPATH: `python -m` would put it first on sys.path, so a draft folder
# holding `json.py` would run it); Hugging Face's modules cache (where transformers copies a folder's
# own code before running it, which `nocode` refuses) kept under the kit's state, not the home directory.
CHILD_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1",
             "DO_NOT_TRACK": "1", "PYTHONSAFEPATH": "1",
             "HF_MODULES_CACHE": str(STATE / "hf-modules")}


def _child(engine_name, release, args, folder=None) -> tuple[list[str], dict]:
    """The command and environment of a child running `engine` `release` (installed in `folder`, default
    its release folder): the release's folder, then the kit's own lib folder (the child runs this very
    draftdoctor, not whichever one the venv's editable install names). A pinned release sees nothing
    else of the venv but torch and torch's requirements (`python -S` and `torchview`); a build
    (llama.cpp's converter) runs with the venv."""
    loaders = REAL_LOADERS[engine_name]
    path = [str(folder or release_env(release, engine_name)), str(kit_path())]
    python = [sys.executable]
    if loaders.pin_prefix is not None:
        from .torchview import torch_view

        python.append("-S")
        path.append(str(torch_view(trusted(STATE))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **CHILD_ENV)
    return [*python, "-m", loaders.child_module, "--release", release, *args], env


def kit_path() -> Path:
    """The folder whose `draftdoctor` is this kit, for a child's PYTHONPATH: the checkout's lib/; for an
    installed kit a folder holding one link to the package (its site-packages holds the whole venv, which
    a pinned release must not see). Made aside and renamed into place, once per install location."""
    from ..toolstate import CHECKOUT, PACKAGE

    if CHECKOUT is not None:
        return PACKAGE.parent
    parent = trusted(STATE / "kit-view")
    view = parent / hashlib.sha1(str(PACKAGE).encode()).hexdigest()[:12]
    if not (view / "draftdoctor").exists():
        parent.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(dir=parent, prefix=".making-"))
        (aside / "draftdoctor").symlink_to(PACKAGE, target_is_directory=True)
        try:
            os.rename(aside, view)
        except OSError:  # another process made it first
            shutil.rmtree(aside, ignore_errors=True)
    return view


def _broken(engine_name, release, tail) -> "RealLoaderCrashed":
    return RealLoaderCrashed(f"{engine_name} {release} environment or adapter is broken (reinstall with "
                             f"{REAL_LOADERS[engine_name].install_hint(release)}; if it persists the adapter needs updating):\n{tail}")


# The state folder the warm workers (pool.py) and the scratch folders below live in: this user's alone, or unused.
class WorkerPlaceUnsafe(RealLoaderError):
    """A worker's folder or socket that another user could have made or could write in: no worker is
    used there (the check runs cold)."""


def _private(folder: Path) -> Path:
    """`folder`, made if missing, once it is a real folder (not a link) of this user that no one else
    can enter: another local user who made it first, or a link planted there, could read or forge a
    worker's answers, so such a folder is refused (WorkerPlaceUnsafe). One of ours with looser
    permissions is tightened to 0700."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = os.lstat(folder)
    except OSError as e:
        raise WorkerPlaceUnsafe(f"{folder}: cannot be the real-loader workers' folder ({e.strerror})") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise WorkerPlaceUnsafe(f"{folder}: not a folder of this user (a link, or another user's): "
                                "no real-loader worker is started there")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return folder


def worker_state() -> Path:
    """Where the warm workers' sockets, pid files and logs live: build/state/realload, or
    $DRAFTDOCTOR_REALLOAD_STATE (a test session keeps its workers apart from everyone else's)."""
    return Path(os.environ.get("DRAFTDOCTOR_REALLOAD_STATE") or STATE / "realload")


def scratch_folder(kind: str = "cold") -> Path:
    """A private folder for one caller's temporary files, under the workers' state folder: a cold
    child's TMPDIR (converted GGUFs, stand-in targets, its gloo store), a real check's converted configs,
    a server's TMPDIR (vLLM leaves IPC folders there). The caller removes it; folders of `kind` left by
    callers that were killed (their pid in the name no longer runs) are removed first. Raises
    WorkerPlaceUnsafe where the state folder is not the user's own."""
    state = _private(worker_state())
    for stale in state.glob(f"{kind}-*"):
        pid = stale.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    folder = state / f"{kind}-{os.getpid()}-{os.urandom(4).hex()}"
    folder.mkdir(mode=0o700)
    return folder


@contextlib.contextmanager
def scratch(kind: str):
    """`scratch_folder(kind)`, removed on exit; the system's temporary folder where the state folder is
    not private."""
    try:
        folder = scratch_folder(kind)
    except WorkerPlaceUnsafe:
        with tempfile.TemporaryDirectory(prefix=f"draftdoctor-{kind}-") as fallback:
            yield Path(fallback)
        return
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_child(release, args, timeout, engine_name: str = "sglang"):
    """A fresh child process for one batch (the cold path): it dies with its caller, whatever kills that,
    and its temporary files are removed with it."""
    from .common import die_with_parent

    command, env = _child(engine_name, release, args)
    try:
        scratch = scratch_folder()
    except WorkerPlaceUnsafe:
        scratch = None  # the state folder is not private: the system's temporary folder, cleaned by the child
    try:
        proc = subprocess.Popen(command, env=dict(env, **({"TMPDIR": str(scratch)} if scratch else {})),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True, preexec_fn=die_with_parent)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: gloo may have helpers
            proc.communicate()
            raise RealLoaderTimeout(f"{engine_name} {release} real loader did not finish within {timeout:g} s") from None
        except BaseException:  # Ctrl-C, SIGTERM: the child and its group go first
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    tail = "\n".join(stderr.strip().splitlines()[-20:])
    if proc.returncode == EXIT_ENVIRONMENT:
        raise _broken(engine_name, release, tail)
    if proc.returncode != 0:
        raise RealLoaderCrashed(f"{engine_name} {release} real loader died (exit status {proc.returncode}):\n{tail}")
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        raise RealLoaderCrashed(f"{engine_name} {release} real loader printed no report:\n{tail}") from None
