"""SGLang 0.5.9 (`midlayer`, unknown keys dropped; rotary embedding still one module)."""

import dataclasses

from .sglang_0_5_10 import ADAPTER as _ADAPTER_0_5_10

ADAPTER = dataclasses.replace(_ADAPTER_0_5_10, release="0.5.9",
                              cpu_flags={"sglang.srt.layers.rotary_embedding": {"_is_cpu": True}})
