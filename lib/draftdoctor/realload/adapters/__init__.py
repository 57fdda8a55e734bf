"""Per-release adapters: how to stand up one SGLang release's model-building context on CPU.

An adapter is data plus one function: how the release publishes its server arguments, which module
flags must say "CPU" before a model is built, and every symbol the child relies on. `verify()` checks
each of them against the installed release before anything runs, so an adapter that no longer fits
its release fails loudly with the missing names instead of producing a wrong coverage report.
"""

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import Callable

# Symbols the shared child code (child.py) uses in every release: module -> dotted attribute paths.
SHARED_SYMBOLS = {
    "sglang.srt.server_args": ("ServerArgs",),
    "sglang.srt.configs.model_config": ("ModelConfig.from_server_args",),
    "sglang.srt.configs.load_config": ("LoadConfig",),
    "sglang.srt.configs.device_config": ("DeviceConfig",),
    "sglang.srt.model_loader": ("get_model",),
    "sglang.srt.model_loader.loader": ("DefaultModelLoader.load_weights_and_postprocess",),
    "sglang.srt.distributed": ("init_distributed_environment", "initialize_model_parallel"),
    "sglang.srt.layers.linear": ("QKVParallelLinear", "MergedColumnParallelLinear"),
    "sglang.srt.models.registry": ("ModelRegistry",),
    "sglang.srt.models.llama_eagle3": ("LlamaForCausalLMEagle3.load_weights",),
}


class AdapterMismatch(RuntimeError):
    """The installed SGLang release no longer has what its adapter relies on."""


@dataclass(frozen=True)
class Adapter:
    release: str
    publish_server_args: Callable  # (ServerArgs) -> None, the release's own way of making them global
    symbols: dict  # release-specific symbols used by publish_server_args: module -> attribute paths
    # Module-level flags SGLang computes at import from the platform; set so the layers take their CPU
    # path (e.g. rotary embedding would otherwise import a CUDA op). module -> {name: value}.
    cpu_flags: dict = field(default_factory=dict)

    def verify(self):
        """Raise AdapterMismatch listing every missing symbol or a release mismatch."""
        problems = []
        installed = importlib.metadata.version("sglang")
        if installed != self.release:
            problems.append(f"installed sglang is {installed}, adapter is for {self.release}")
        wanted = {**SHARED_SYMBOLS}
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


def module_name(release):
    """Adapters live in `adapters/sglang_<release with underscores>.py`."""
    return f"{__name__}.sglang_{release.replace('.', '_')}"


def get(release):
    """The adapter for `release` (imported lazily: adapters may import SGLang)."""
    return importlib.import_module(module_name(release)).ADAPTER
