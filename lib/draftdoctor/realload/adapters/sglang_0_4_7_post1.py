"""SGLang 0.4.7.post1 (`midlayer`; `load_weights` hands keys to the Llama loader): as 0.5.2, but its
rotary embedding has no CPU flag yet."""

import dataclasses

from .sglang_0_5_2 import ADAPTER as _ADAPTER_0_5_2

ADAPTER = dataclasses.replace(_ADAPTER_0_5_2, release="0.4.7.post1", cpu_flags={})
