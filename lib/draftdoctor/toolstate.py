"""Tool state (Jupyter, IPython, matplotlib, vLLM; in tests also Hugging Face and XDG caches and config) under
the kit's `build/state`, never in the home directory: for every command (the CLI calls
`keep_out_of_home` first) and every test (conftest calls it with `isolate=True`), not only under make,
which exports the same variables.

A variable the user already set is kept; processes the kit starts (kernels, servers, the browser)
inherit the environment. Commands leave the Hugging Face and XDG locations alone: a real SGLang
launched on a GPU host must find the user's model cache where it is.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE = Path(__file__).resolve().parents[2] / "build" / "state"
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
