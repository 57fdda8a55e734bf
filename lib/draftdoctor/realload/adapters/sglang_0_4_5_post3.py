"""SGLang 0.4.5.post3: no `ModelConfig.from_server_args` and no `load_weights_and_postprocess` yet.
The draft's config is read the way its TpModelWorker does, and the child sees the model and its
weights where `load_model` asks for them (`_get_all_weights`). ServerArgs picks mem_fraction_static
from the GPU's memory (None without one): it is given."""

import dataclasses

from .sglang_0_4_7_post1 import ADAPTER as _ADAPTER_0_4_7_POST1


def _read_config(server_args, path):
    # TpModelWorker.__init__ for the draft worker (is_draft_worker: the draft's path); 0.4.5 added
    # enable_multimodal, 0.4.4 has not got it
    import inspect

    from sglang.srt.configs.model_config import ModelConfig

    extra = {}
    if "enable_multimodal" in inspect.signature(ModelConfig.__init__).parameters:
        extra["enable_multimodal"] = server_args.enable_multimodal
    return ModelConfig(path, trust_remote_code=server_args.trust_remote_code, revision=server_args.revision,
                       context_length=server_args.context_length,
                       model_override_args=server_args.json_model_override_args,
                       is_embedding=server_args.is_embedding, dtype=server_args.dtype,
                       quantization=server_args.quantization, **extra)


ADAPTER = dataclasses.replace(_ADAPTER_0_4_7_POST1, release="0.4.5.post3", read_config=_read_config,
                              load_hook="_get_all_weights",
                              server_args_extra={"mem_fraction_static": 0.88})  # its default for tp 1 on a GPU
