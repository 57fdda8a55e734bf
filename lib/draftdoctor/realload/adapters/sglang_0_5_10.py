"""SGLang 0.5.10 (the story's release: `LlamaForCausalLMEagle3.midlayer`, unknown keys dropped)."""

from . import Adapter


def _publish(server_args):
    # 0.5.10 keeps one module-global ServerArgs; the scheduler process sets it like this.
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(server_args)


ADAPTER = Adapter(
    release="0.5.10",
    publish_server_args=_publish,
    symbols={"sglang.srt.server_args": ("set_global_server_args_for_scheduler",)},
    cpu_flags={"sglang.srt.layers.rotary_embedding.base": {"_is_cpu": True}},
)
