"""SGLang 0.4.4.post4: same internals as 0.4.5.post3."""

import dataclasses

from .sglang_0_4_5_post3 import ADAPTER as _ADAPTER_0_4_5_POST3

ADAPTER = dataclasses.replace(_ADAPTER_0_4_5_POST3, release="0.4.4.post4")
