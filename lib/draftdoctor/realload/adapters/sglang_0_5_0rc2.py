"""SGLang 0.5.0rc2: same internals as 0.5.2."""

import dataclasses

from .sglang_0_5_2 import ADAPTER as _ADAPTER_0_5_2

ADAPTER = dataclasses.replace(_ADAPTER_0_5_2, release="0.5.0rc2")
