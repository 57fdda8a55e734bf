"""`python -m draftdoctor.realload.vllm_shim MODULE`: run MODULE as `__main__` after the child's torch
compatibility bindings (`vllm_compat.restore_torch_cpu_bindings`). vLLM inspects a model class in a
subprocess of its own (`models/registry.py`, `_SUBPROCESS_COMMAND`); a release that needs the bindings
needs them there too, so the child points that command here."""

import runpy
import sys

from .vllm_compat import restore_torch_cpu_bindings

if __name__ == "__main__":
    restore_torch_cpu_bindings()
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
