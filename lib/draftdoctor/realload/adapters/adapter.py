"""An adapter: how to stand up one SGLang release's model-building context on CPU.

An adapter is data plus one function: how the release publishes its server arguments, which module
flags must say "CPU" before a model is built, and every symbol the child relies on. `verify()` checks
each of them against the installed release before anything runs, so an adapter that no longer fits
its release fails loudly with the missing names instead of producing a wrong coverage report.
`releases.py` holds the few adapter definitions and the table of release ranges `get(release)` reads.
"""

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import Callable

# Symbols the shared child code (child.py) uses in every release: module -> dotted attribute paths.
SHARED_SYMBOLS = {
    "sglang.srt.server_args": ("ServerArgs",),
    "sglang.srt.configs.model_config": ("ModelConfig",),
    "sglang.srt.configs.load_config": ("LoadConfig",),
    "sglang.srt.configs.device_config": ("DeviceConfig",),
    "sglang.srt.model_loader": ("get_model",),
    "sglang.srt.model_loader.loader": ("DefaultModelLoader",),
    "sglang.srt.distributed": ("init_distributed_environment", "initialize_model_parallel"),
    "sglang.srt.layers.linear": ("QKVParallelLinear", "MergedColumnParallelLinear"),
    "sglang.srt.models.registry": ("ModelRegistry",),
    "sglang.srt.models.llama_eagle3": ("LlamaForCausalLMEagle3.load_weights",),
}


# SGLang up to 0.5.7 ends layernorm.py and activation.py with "not on CUDA: take vLLM's RMSNorm /
# SiluAndMul instead"; a GPU host builds with SGLang's own classes, so the CPU child does too.
VLLM_FALLBACKS = {"vllm.model_executor.layers.layernorm": "sglang.srt.layers.layernorm",
                  "vllm.model_executor.layers.activation": "sglang.srt.layers.activation"}


def _amx_tile_supported():
    import torch

    return torch.cpu._is_amx_tile_supported()


# 0.4.7 to 0.5.12 ask torch._C._cpu._is_amx_tile_supported() at import; torch 2.13 has it as
# torch.cpu._is_amx_tile_supported() (SGLang 0.5.13 moved there). Same answer, so the same branch.
AMX_PROBE = {"torch._C._cpu._is_amx_tile_supported": _amx_tile_supported}


class AdapterMismatch(RuntimeError):
    """No adapter fits: the release has none, or the installed release lacks what its adapter relies on."""


@dataclass(frozen=True)
class Adapter:
    release: str
    publish_server_args: Callable  # (ServerArgs) -> None, the release's own way of making them global
    symbols: dict  # release-specific symbols used by publish_server_args: module -> attribute paths
    # Module-level flags SGLang computes at import from the platform; set so the layers take their CPU
    # path (e.g. rotary embedding would otherwise import a CUDA op). module -> {name: value}.
    cpu_flags: dict = field(default_factory=dict)
    # Packages the release imports on the loader's path though they only run on a GPU (e.g.
    # `sgl_kernel`): served by a stand-in whose functions raise if called (stubs.install(strict=...)).
    stubbed: tuple = ()
    # Fallback imports a GPU host never makes (`from vllm... import RMSNorm` on "not CUDA"), answered
    # with SGLang's own module: {module imported: module it stands for} (stubs.install(aliases=...)).
    aliases: dict = field(default_factory=dict)
    # How the draft worker reads the draft's config: (ServerArgs, path) -> ModelConfig; None: the
    # release's own `ModelConfig.from_server_args(..., is_draft_model=True)` (0.4.6 and later).
    read_config: Callable | None = None
    # The DefaultModelLoader method the child wraps to see the model and its weights iterator just
    # before `load_weights`: "load_weights_and_postprocess" (model, weights, device), a staticmethod
    # from 0.4.6; "_get_all_weights" (self, model_config, model) -> iterator, before that.
    load_hook: str = "load_weights_and_postprocess"
    # Names the release calls on torch that torch 2.13 dropped or moved: {dotted name: stand-in},
    # set before SGLang is imported (see `torch_compat`).
    torch_compat: dict = field(default_factory=dict)
    # transformers 5.4-5.17 (the pins of 0.5.13.post1-0.5.21): export the real AutoImageProcessor, not the
    # torchvision-gated dummy (stubs.real_auto_image_processor)
    real_auto_image_processor: bool = False
    # ServerArgs fields the release cannot derive on a machine without a GPU (0.4.5 compares the GPU's
    # memory, None here, to pick mem_fraction_static): given explicitly, with no bearing on loading
    server_args_extra: dict = field(default_factory=dict)

    def apply_torch_compat(self):
        import torch

        for dotted, value in self.torch_compat.items():
            owner_path, _, name = dotted.rpartition(".")
            owner = torch
            for part in owner_path.split(".")[1:]:
                owner = getattr(owner, part)
            if not hasattr(owner, name):
                setattr(owner, name, value)

    def model_config(self, server_args, path):
        if self.read_config is not None:
            return self.read_config(server_args, path)
        from sglang.srt.configs.model_config import ModelConfig

        return ModelConfig.from_server_args(server_args, model_path=path, is_draft_model=True)

    def verify(self):
        """Raise AdapterMismatch listing every missing symbol or a release mismatch."""
        problems = []
        installed = importlib.metadata.version("sglang")
        if installed != self.release:
            problems.append(f"installed sglang is {installed}, adapter is for {self.release}")
        wanted = {**SHARED_SYMBOLS}
        hooks = {"sglang.srt.model_loader.loader": (f"DefaultModelLoader.{self.load_hook}",)}
        if self.read_config is None:
            hooks["sglang.srt.configs.model_config"] = ("ModelConfig.from_server_args",)
        for module, names in hooks.items():
            wanted[module] = wanted[module] + names
        for module, names in self.symbols.items():
            wanted[module] = wanted.get(module, ()) + tuple(names)
        for module, flags in self.cpu_flags.items():
            wanted[module] = wanted.get(module, ()) + tuple(flags)
        for module_name, names in wanted.items():
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                problems.append(f"cannot import {module_name}: {exc}")
                continue
            for dotted in names:
                obj = module
                for part in dotted.split("."):
                    obj = getattr(obj, part, _MISSING)
                    if obj is _MISSING:
                        problems.append(f"{module_name}.{dotted} does not exist")
                        break
        if problems:
            raise AdapterMismatch(f"adapter for sglang {self.release} does not fit: " + "; ".join(problems))

    def apply_cpu_flags(self):
        for module_name, flags in self.cpu_flags.items():
            module = importlib.import_module(module_name)
            for name, value in flags.items():
                setattr(module, name, value)


_MISSING = object()
