"""What the machine can spare, and what a draft's config asks an engine to build: the bound every
build and every request is held to, so that no input (a 335 kB draft whose config claims a
200000 x 8192 vocabulary, a 4M-word vocabulary, a 900 kB prompt) can exhaust the machine.

`memory_budget()` is half of the memory available now (the kernel's MemAvailable, or the cgroup's
room when that is smaller): a check runs beside other work (a second test worker, a browser), and a
load holds the model and the checkpoint's tensors at once. $DRAFTDOCTOR_MEMORY_BUDGET (bytes, or with
K, M, G) sets it instead. Reads /proc and /sys only; no torch.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from .errors import UserError

BUDGET_VARIABLE = "DRAFTDOCTOR_MEMORY_BUDGET"
# bytes per element of a config's torch_dtype (a build without one is in float32, the engines' CPU default)
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8, "double": 8,
               "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1}


class OverBudget(UserError):
    """Work refused before it started: what it would take is more than the machine can spare."""


def human(n: float) -> str:
    """Bytes in a short human form: 8.2 GB, 512 MB, 4 kB."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise UserError(f"${BUDGET_VARIABLE}={text!r}: expected bytes, e.g. 2000000000 or 2G")
    return int(float(m.group(1)) * 1024 ** " KMG".index(m.group(2).upper() or " "))


def available_memory() -> int:
    """Bytes the kernel says can be had now without swapping: MemAvailable, or the cgroup's room
    (memory.max - memory.current) when that is smaller."""
    available = math.inf
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            available = min(available, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return int(available) if available != math.inf else 4 << 30  # no /proc: assume a small machine


def memory_budget() -> int:
    """The bytes one build or one request may take (see the module docstring)."""
    said = os.environ.get(BUDGET_VARIABLE)
    return _parse_size(said) if said else max(available_memory() // 2, 0)


def dtype_bytes(config: dict | None) -> int:
    """Bytes per parameter of a build from `config` (its torch_dtype, or `dtype` in newer configs)."""
    layer = (config or {}).get("transformer_layer_config") or {}
    for source in (config or {}, layer):
        for key in ("torch_dtype", "dtype"):
            value = source.get(key)
            if isinstance(value, str) and value.removeprefix("torch.") in DTYPE_BYTES:
                return DTYPE_BYTES[value.removeprefix("torch.")]
    return 4


def build_bytes(shapes, per_element: int) -> int:
    """Bytes of parameters of these shapes."""
    return sum(math.prod(shape) for shape in shapes) * per_element
