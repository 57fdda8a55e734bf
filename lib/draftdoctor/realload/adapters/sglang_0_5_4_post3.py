"""SGLang 0.5.4.post3: same internals as 0.5.7."""

import dataclasses

from .sglang_0_5_7 import ADAPTER as _ADAPTER_0_5_7

ADAPTER = dataclasses.replace(_ADAPTER_0_5_7, release="0.5.4.post3")
