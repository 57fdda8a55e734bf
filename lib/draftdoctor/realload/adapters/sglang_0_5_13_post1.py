"""SGLang 0.5.13.post1 (`layers` ModuleList, legacy `midlayer` renamed on load): server args published with
`set_global_server_args_for_scheduler` (a shim over `runtime_context` from 0.5.16), as 0.5.10. Its
transformers pin exports AutoImageProcessor as a torchvision-gated dummy: the real class is exported."""

import dataclasses

from .sglang_0_5_10 import ADAPTER as _ADAPTER_0_5_10

ADAPTER = dataclasses.replace(_ADAPTER_0_5_10, release="0.5.13.post1", real_auto_image_processor=True)
