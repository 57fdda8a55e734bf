"""Per-release adapters: how to stand up one SGLang release's model-building context on CPU.

`adapter.py` holds the `Adapter` value (data plus the checks `verify()` runs against the installed
release); `releases.py` the few adapter definitions, the table of release ranges and `get(release)`.
"""

from .adapter import AMX_PROBE, SHARED_SYMBOLS, VLLM_FALLBACKS, Adapter, AdapterMismatch  # noqa: F401
from .releases import get  # noqa: F401
