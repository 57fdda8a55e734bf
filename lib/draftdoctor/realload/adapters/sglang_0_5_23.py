"""SGLang 0.5.23 (newest read: `LlamaForCausalLMEagle3.layers`, legacy `midlayer` renamed on load)."""

from . import Adapter


def _publish(server_args):
    # 0.5.23 replaced the global ServerArgs with a runtime context; the scheduler publishes its rank.
    from sglang.srt import runtime_context

    runtime_context.publish(server_args, role="scheduler", ranks=runtime_context.SpawnRanks(world_rank=0))


ADAPTER = Adapter(
    release="0.5.23",
    publish_server_args=_publish,
    symbols={"sglang.srt.runtime_context": ("publish", "SpawnRanks")},
    cpu_flags={"sglang.srt.layers.rotary_embedding.base": {"_is_cpu": True}},
)
