"""Which adapter each SGLang release gets: three adapter definitions and one table of release ranges.

The definitions are named after how the release makes its server arguments global (the one thing
that needs code per release); `RANGES` maps each run of releases onto one of them, with the fields
that differ inside the run. `adapters.get(release)` looks a release up here. Each row says what
differs and where in SGLang it was read; `Adapter.verify()` re-checks every symbol named here against
the installed release before anything runs. Adding a release: extend a row's last release, or add a row.
"""

import dataclasses

from .adapter import AMX_PROBE, VLLM_FALLBACKS, Adapter, AdapterMismatch

# Up to 0.5.9 the rotary embedding is one module; from 0.5.10 a package whose `base` holds the flag.
ROTARY_ONE_MODULE = {"sglang.srt.layers.rotary_embedding": {"_is_cpu": True}}
ROTARY_PACKAGE = {"sglang.srt.layers.rotary_embedding.base": {"_is_cpu": True}}


def _publish_global_dict(server_args):
    # what ModelRunner.__init__ does: the dict's keys are the server arguments the model code reads
    from sglang.srt.managers.schedule_batch import global_server_args_dict

    for key in list(global_server_args_dict):
        if hasattr(server_args, key):
            global_server_args_dict[key] = getattr(server_args, key)


def _publish_for_scheduler(server_args):
    # 0.5.10 keeps one module-global ServerArgs; the scheduler process sets it like this.
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(server_args)


def _publish_runtime_context(server_args):
    # 0.5.23 replaced the global ServerArgs with a runtime context; the scheduler publishes its rank.
    from sglang.srt import runtime_context

    runtime_context.publish(server_args, role="scheduler", ranks=runtime_context.SpawnRanks(world_rank=0))


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


# Read in 0.5.2. Up to 0.5.2 the server arguments the model code reads live in
# `sglang.srt.managers.schedule_batch.global_server_args_dict`, which the model runner fills from its
# ServerArgs; off CUDA, `sglang.srt.layers.layernorm` / `.activation` import vLLM's classes (answered
# with SGLang's own, as on a GPU host); the distributed setup imports `sgl_kernel` and fp8 quantization
# `vllm._custom_ops` (stand-ins whose kernels raise if called); torch 2.13 moved the AMX probe it
# calls at import.
GLOBAL_DICT = Adapter(
    release="0.5.2",
    publish_server_args=_publish_global_dict,
    symbols={"sglang.srt.managers.schedule_batch": ("global_server_args_dict",)},
    cpu_flags=ROTARY_ONE_MODULE,
    stubbed=("sgl_kernel", "vllm._custom_ops"),
    aliases=VLLM_FALLBACKS,
    torch_compat=AMX_PROBE,
)

# Read in 0.5.10: one module-global ServerArgs, set with
# `sglang.srt.server_args.set_global_server_args_for_scheduler` (a shim over `runtime_context` from
# 0.5.16); the rotary embedding's CPU flag is in the `rotary_embedding` package's `base`.
SCHEDULER_ARGS = Adapter(
    release="0.5.10",
    publish_server_args=_publish_for_scheduler,
    symbols={"sglang.srt.server_args": ("set_global_server_args_for_scheduler",)},
    cpu_flags=ROTARY_PACKAGE,
)

# Read in 0.5.23: the global ServerArgs replaced by `sglang.srt.runtime_context`; the scheduler
# publishes its rank with `runtime_context.publish(..., ranks=SpawnRanks(...))`.
RUNTIME_CONTEXT = Adapter(
    release="0.5.23",
    publish_server_args=_publish_runtime_context,
    symbols={"sglang.srt.runtime_context": ("publish", "SpawnRanks")},
    cpu_flags=ROTARY_PACKAGE,
)

# (first release, last release, adapter definition, fields that differ from it), oldest first; the
# releases themselves are the pin lists (requirements-<release>.txt). The decoder module each range
# loads (`midlayer`, `layers`) is docs/engine-facts.md, "SGLang's EAGLE-3 loader, release by release".
RANGES = [
    # 0.4.4.post4-0.4.5.post3: no `ModelConfig.from_server_args` and no
    # `DefaultModelLoader.load_weights_and_postprocess` yet. The draft's config is read the way its
    # `TpModelWorker.__init__` does (`_read_config`), and the child sees the model and its weights where
    # `load_model` asks for them (`_get_all_weights`). `ServerArgs` picks mem_fraction_static from the
    # GPU's memory (None without one): it is given, 0.88, its default for tp 1 on a GPU. The rotary
    # embedding has no CPU flag yet (as 0.4.6-0.4.7).
    ("0.4.4.post4", "0.4.5.post3", GLOBAL_DICT,
     dict(cpu_flags={}, read_config=_read_config, load_hook="_get_all_weights",
          server_args_extra={"mem_fraction_static": 0.88})),
    # 0.4.6.post5-0.4.7.post1 (`midlayer`; `load_weights` hands keys to the Llama loader): as 0.5.2, but
    # `sglang.srt.layers.rotary_embedding` has no `_is_cpu` flag yet.
    ("0.4.6.post5", "0.4.7.post1", GLOBAL_DICT, dict(cpu_flags={})),
    # 0.4.8.post1-0.5.2: same internals as 0.5.2 (`global_server_args_dict`).
    ("0.4.8.post1", "0.5.2", GLOBAL_DICT, {}),
    # 0.5.3.post3-0.5.7 (`midlayer`, unknown keys dropped): server args published as 0.5.10
    # (`set_global_server_args_for_scheduler`), the rotary embedding still one module. Up to 0.5.7, off
    # CUDA `sglang.srt.layers.layernorm` and `.activation` import vLLM's classes (answered with SGLang's
    # own, as on a GPU host) and the distributed setup imports `sgl_kernel` and the rotary embedding, for
    # head sizes its CUDA kernel lacks, `vllm._custom_ops` (stand-ins whose kernels raise if called).
    ("0.5.3.post3", "0.5.7", SCHEDULER_ARGS,
     dict(cpu_flags=ROTARY_ONE_MODULE, stubbed=("sgl_kernel", "vllm._custom_ops"), aliases=VLLM_FALLBACKS)),
    # 0.5.8.post1 (`midlayer`, unknown keys dropped): as 0.5.9, but its MoE runner imports `sgl_kernel`
    # on the loader's import path (a stand-in whose kernels raise if called).
    ("0.5.8.post1", "0.5.8.post1", SCHEDULER_ARGS, dict(cpu_flags=ROTARY_ONE_MODULE, stubbed=("sgl_kernel",))),
    # 0.5.9 (`midlayer`, unknown keys dropped): as 0.5.10, but `sglang.srt.layers.rotary_embedding` is
    # still one module.
    ("0.5.9", "0.5.9", SCHEDULER_ARGS, dict(cpu_flags=ROTARY_ONE_MODULE)),
    # 0.5.10-0.5.12.post1: same internals as 0.5.10 (0.5.11 is the last release with
    # `LlamaForCausalLMEagle3.midlayer`; 0.5.12 has the `layers` ModuleList, legacy `midlayer` renamed on
    # load).
    ("0.5.10", "0.5.12.post1", SCHEDULER_ARGS, {}),
    # 0.5.13.post1-0.5.20: as 0.5.10, but the transformers they pin (5.8.1, 5.12.1) export
    # AutoImageProcessor as a torchvision-gated dummy: the real class is exported.
    ("0.5.13.post1", "0.5.20", SCHEDULER_ARGS, dict(real_auto_image_processor=True)),
    # 0.5.21: server args published with `runtime_context.publish(..., ranks=SpawnRanks(...))`, as
    # 0.5.23; its transformers pin (5.12.1) exports AutoImageProcessor as the dummy: the real class is exported.
    ("0.5.21", "0.5.21", RUNTIME_CONTEXT, dict(real_auto_image_processor=True)),
    # 0.5.22-0.5.23 (newest read: `LlamaForCausalLMEagle3.layers`, legacy `midlayer` renamed on load):
    # same internals as 0.5.23.
    ("0.5.22", "0.5.23", RUNTIME_CONTEXT, {}),
]


def get(release):
    """The adapter for `release`, from its row of `releases.RANGES`; AdapterMismatch for a release
    without a pin list (requirements-<release>.txt) or outside every row."""
    from .. import REAL_LOADERS
    from ...engines import parse_version

    known = REAL_LOADERS["sglang"].releases
    if release in known:
        for first, last, adapter, overrides in RANGES:
            if parse_version(first) <= parse_version(release) <= parse_version(last):
                return dataclasses.replace(adapter, release=release, **overrides)
    raise AdapterMismatch(f"no adapter for sglang {release}: known releases are {', '.join(known)}")
