"""SGLang 0.5.10.post1: same internals as 0.5.10."""

import dataclasses

from .sglang_0_5_10 import ADAPTER as _ADAPTER_0_5_10

ADAPTER = dataclasses.replace(_ADAPTER_0_5_10, release="0.5.10.post1")
