"""SGLang 0.5.2 (`midlayer`, unknown keys dropped). Up to this release the server arguments the model
code reads live in `schedule_batch.global_server_args_dict`, which the model runner fills from its
ServerArgs; off CUDA, layernorm/activation import vLLM's classes (answered with SGLang's own, as on a
GPU host); the distributed setup imports `sgl_kernel` and fp8 quantization `vllm._custom_ops` (stand-ins
whose kernels raise if called); torch 2.13 moved the AMX probe it calls at import."""

from . import AMX_PROBE, VLLM_FALLBACKS, Adapter


def _publish(server_args):
    # what ModelRunner.__init__ does: the dict's keys are the server arguments the model code reads
    from sglang.srt.managers.schedule_batch import global_server_args_dict

    for key in list(global_server_args_dict):
        if hasattr(server_args, key):
            global_server_args_dict[key] = getattr(server_args, key)


ADAPTER = Adapter(
    release="0.5.2",
    publish_server_args=_publish,
    symbols={"sglang.srt.managers.schedule_batch": ("global_server_args_dict",)},
    cpu_flags={"sglang.srt.layers.rotary_embedding": {"_is_cpu": True}},
    stubbed=("sgl_kernel", "vllm._custom_ops"),
    aliases=VLLM_FALLBACKS,
    torch_compat=AMX_PROBE,
)
