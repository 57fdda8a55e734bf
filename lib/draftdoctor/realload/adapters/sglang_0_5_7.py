"""SGLang 0.5.7 (`midlayer`, unknown keys dropped). Up to this release, off CUDA its layernorm and
activation modules import vLLM's classes (answered with SGLang's own, as on a GPU host) and the
distributed setup imports `sgl_kernel` and the rotary embedding, for head sizes its CUDA kernel lacks,
`vllm._custom_ops` (stand-ins whose kernels raise if called)."""

import dataclasses

from . import VLLM_FALLBACKS
from .sglang_0_5_9 import ADAPTER as _ADAPTER_0_5_9

ADAPTER = dataclasses.replace(_ADAPTER_0_5_9, release="0.5.7", stubbed=("sgl_kernel", "vllm._custom_ops"), aliases=VLLM_FALLBACKS)
