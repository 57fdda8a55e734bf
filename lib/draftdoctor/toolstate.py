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
"""

from __future__ import annotations

import os
from pathlib import Path

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


def keep_out_of_home(isolate: bool = False) -> None:
    """Point every kit tool's state variable not already set at a folder under STATE (created); with
    `isolate` (tests) the caches and config folders too, and no model hub."""
    for var, sub in KIT_TOOLS + (CACHES if isolate else ()):
        os.environ.setdefault(var, str(STATE / sub))
        Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
    if isolate:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
