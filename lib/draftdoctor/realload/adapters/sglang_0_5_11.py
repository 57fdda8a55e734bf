"""SGLang 0.5.11 (last release with `LlamaForCausalLMEagle3.midlayer`): same internals as 0.5.10."""

import dataclasses

from .sglang_0_5_10 import ADAPTER as _ADAPTER_0_5_10

ADAPTER = dataclasses.replace(_ADAPTER_0_5_10, release="0.5.11")
