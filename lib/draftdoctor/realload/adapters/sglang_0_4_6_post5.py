"""SGLang 0.4.6.post5: same internals as 0.4.7.post1."""

import dataclasses

from .sglang_0_4_7_post1 import ADAPTER as _ADAPTER_0_4_7_POST1

ADAPTER = dataclasses.replace(_ADAPTER_0_4_7_POST1, release="0.4.6.post5")
