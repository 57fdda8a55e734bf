"""SGLang 0.5.21: server args published with `runtime_context.publish(..., ranks=SpawnRanks(...))`, as
0.5.23. Its transformers pin exports AutoImageProcessor as a torchvision-gated dummy: the real class is
exported."""

import dataclasses

from .sglang_0_5_23 import ADAPTER as _ADAPTER_0_5_23

ADAPTER = dataclasses.replace(_ADAPTER_0_5_23, release="0.5.21", real_auto_image_processor=True)
