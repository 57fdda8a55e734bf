"""Where the kit's own files are, and where it keeps what it builds and installs.

The kit's files (the notebooks, the demo) are package data, found beside this module in a checkout
and in an installed kit alike. What it builds and installs (releases' real loaders, llama.cpp) and
tool state (Jupyter, IPython, matplotlib, vLLM; in tests also Hugging Face and XDG caches and config)
go in one folder, BUILD: $DRAFTDOCTOR_STATE when set; else, run from its checkout, the checkout's
`build/`; else the platform's user cache folder ($XDG_CACHE_HOME, or ~/.cache, then `draftdoctor`).
Tool state is its `state/`, never scattered in the home directory: for every command (the CLI calls
`keep_out_of_home` first) and every test (conftest calls it with `isolate=True`), not only under make,
which exports the same variables.

A variable the user already set is kept; processes the kit starts (kernels, servers, the browser)
inherit the environment. Commands leave the Hugging Face and XDG locations alone: a real SGLang
launched on a GPU host must find the user's model cache where it is.

The build area is trusted: the kit imports releases from it, runs llama.cpp from it, and starts
kernels that read IPython's startup folder in it. So it is held to one rule (`trusted`), checked
before anything in it is used: every folder from the file system's root down to the one used is a
folder of this user's (or root's) that no other user can write in. A shared folder another local
user made (`DRAFTDOCTOR_STATE=/tmp/shared/...`) is refused in one line naming it and its owner.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import UserError

PACKAGE = Path(__file__).resolve().parent
NOTEBOOKS = PACKAGE / "notebooks"  # the five steps and the beyond-names notebook
DEMO = PACKAGE / "data" / "demo"  # the bundled demo: target, drafts, prompts, investigate.yaml
STATE_VARIABLE = "DRAFTDOCTOR_STATE"


def _checkout() -> Path | None:
    """The source checkout this kit runs from (its pyproject.toml names the kit), None when installed."""
    root = PACKAGE.parents[1]
    try:
        return root if 'name = "draftdoctor"' in (root / "pyproject.toml").read_text() else None
    except OSError:
        return None


CHECKOUT = _checkout()  # read once: every child the kit starts asks


def build_area() -> Path:
    """The folder the kit builds and installs into, and keeps tool state under (see the module's text)."""
    if os.environ.get(STATE_VARIABLE):
        return Path(os.environ[STATE_VARIABLE]).absolute()
    if CHECKOUT is not None:
        return CHECKOUT / "build"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache).absolute() / "draftdoctor"


BUILD = build_area()
STATE = BUILD / "state"
KIT_TOOLS = (("JUPYTER_CONFIG_DIR", "jupyter/config"), ("JUPYTER_DATA_DIR", "jupyter/data"),
             ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"), ("IPYTHONDIR", "ipython"), ("MPLCONFIGDIR", "matplotlib"),
             # the vLLM the kit installs under build/ and runs (real loader, --backend vllm): its model-info
             # cache and config would otherwise land in ~/.cache/vllm and ~/.config/vllm
             ("VLLM_CACHE_ROOT", "vllm/cache"), ("VLLM_CONFIG_ROOT", "vllm/config"),
             # torch's compiled-kernel cache (what the engines compile on CPU), else /tmp/torchinductor_USER
             ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"))
CACHES = (("HF_HOME", "hf"), ("XDG_CACHE_HOME", "cache"), ("XDG_CONFIG_HOME", "config"))


class UntrustedFolder(UserError):
    """A folder the kit would import, run or trust files from that another user made or can write in."""


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _own_group(gid: int) -> bool:
    """Whether `gid` is this user's private group (Debian's user groups: a group named as the user, whose
    only member the user is), so that a group-writable folder of it is writable by no one else."""
    import grp
    import pwd

    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(os.getuid())
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _untrusted(info: os.stat_result, last: bool) -> str | None:
    """Why a folder (or link) with this stat may hold what another user put there, else None. A folder
    above the one used may be writable by all with the sticky bit (/tmp): others can add names there but
    cannot replace ours; the folder used itself may not."""
    if info.st_uid not in (os.getuid(), 0):
        return f"owned by {_owner(info.st_uid)}, not by you"
    if stat.S_ISLNK(info.st_mode):
        return None
    others = info.st_mode & 0o002 or (info.st_mode & 0o020 and not _own_group(info.st_gid))
    if others and (last or not info.st_mode & stat.S_ISVTX):
        return f"writable by other users (mode {stat.filemode(info.st_mode)})"
    return None


def trusted(folder, what: str = "the kit's build area", variable: str = STATE_VARIABLE) -> Path:
    """`folder` (absolute), once nothing in it can be another user's: it and every folder above it, as
    named and as its links resolve, exist only as folders (or links) of this user or root that no other
    user can write in (see the module's text). Parts not made yet are not judged; whoever makes them
    makes them ours. Else UntrustedFolder, one line naming the folder, its owner and what to do (set
    `variable`, the one that chose the place, to a folder of one's own)."""
    folder = Path(folder).absolute()
    real = Path(os.path.realpath(folder))
    for chain in ((folder, os.lstat), (real, os.stat)):
        path, look = chain
        parts = [*reversed(path.parents), path]
        for i, part in enumerate(parts):
            try:
                info = look(part)
            except FileNotFoundError:
                break
            except OSError as e:
                raise UntrustedFolder(f"{part}: cannot be read ({e.strerror}): {what} must be a folder of yours") from None
            why = _untrusted(info, last=i == len(parts) - 1)
            if why:
                raise UntrustedFolder(f"{part}: {why}; {what} ({folder}) must be yours alone, so nothing in it "
                                      f"is imported or run: set {variable} to a folder of your own")
    return folder


def keep_out_of_home(isolate: bool = False) -> None:
    """Point every kit tool's state variable not already set at a folder under STATE (created); with
    `isolate` (tests) the caches and config folders too, and no model hub. Each of those folders, and the
    build area, must be `trusted` first (IPython runs its startup folder, Jupyter its config, torch loads
    compiled kernels from its cache): else UntrustedFolder, and nothing is made."""
    trusted(BUILD)
    for var, sub in KIT_TOOLS + (CACHES if isolate else ()):
        os.environ.setdefault(var, str(STATE / sub))
        what = f"{var}, a tool's state folder,"
        trusted(os.environ[var], what, var)
        Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
        trusted(os.environ[var], what, var)  # another user may have made it between the check and ours
    if isolate:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
