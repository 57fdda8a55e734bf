"""SGLang 0.5.8.post1 (`midlayer`, unknown keys dropped): as 0.5.9, but its MoE runner imports
`sgl_kernel` on the loader's import path (a stand-in whose kernels raise if called)."""

import dataclasses

from .sglang_0_5_9 import ADAPTER as _ADAPTER_0_5_9

ADAPTER = dataclasses.replace(_ADAPTER_0_5_9, release="0.5.8.post1", stubbed=("sgl_kernel",))
