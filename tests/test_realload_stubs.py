"""The real-loader child's import stand-ins (realload/stubs.py), on a fake `sglang` package in a
subprocess: strict stand-ins import but raise when called, aliases answer a vLLM fallback import with
SGLang's own module, nothing else under `vllm` appears, and code outside `sglang` sees none of it."""

import subprocess
import sys
import textwrap
from pathlib import Path

FAKE_SGLANG = {
    "__init__.py": "",
    "ln.py": "class RMSNorm:\n    pass\n",
    "uses.py": textwrap.dedent("""
        import triton
        from sgl_kernel import silu_and_mul
        from sgl_kernel.flash_attn import flash_attn_varlen_func
        from vllm._custom_ops import rotary_embedding
        from vllm.model_executor.layers.layernorm import RMSNorm

        @triton.jit
        def kernel(x):
            return x + 1

        try:
            from vllm.model_executor.layers.quantization.aqlm import AQLMConfig  # noqa: F401
            VLLM_QUANT = True
        except ImportError:
            VLLM_QUANT = False
        """),
}

PROGRAM = textwrap.dedent("""
    import importlib, sys
    from draftdoctor.realload import stubs
    stubs.install(strict=("sgl_kernel", "vllm._custom_ops"),
                  aliases={"vllm.model_executor.layers.layernorm": "sglang.ln"})
    uses = importlib.import_module("sglang.uses")
    import sglang.ln
    assert uses.RMSNorm is sglang.ln.RMSNorm, "alias answers with SGLang's own class"
    assert not uses.VLLM_QUANT, "other vllm modules stay missing"
    for fn in (uses.silu_and_mul, uses.flash_attn_varlen_func, uses.rotary_embedding):
        try:
            fn(1)
        except NotImplementedError as e:
            assert "stand-in" in str(e)
        else:
            raise AssertionError(f"{fn!r} ran")
    import triton
    assert isinstance(uses.kernel, triton.runtime.jit.JITFunction) and uses.kernel.fn(1) == 2
    try:
        uses.kernel[(1,)]
    except NotImplementedError:
        pass
    else:
        raise AssertionError("a triton kernel launched")
    for name in ("sgl_kernel", "vllm.model_executor.layers.layernorm"):
        sys.modules.pop(name, None)
    try:
        importlib.import_module("sgl_kernel")  # imported from here, not from sglang
    except ImportError:
        pass
    else:
        raise AssertionError("stand-in leaked outside sglang")
    print("ok")
    """)


def test_stand_ins_are_scoped_strict_and_aliased(tmp_path):
    package = tmp_path / "sglang"
    package.mkdir()
    for name, text in FAKE_SGLANG.items():
        (package / name).write_text(text)
    from draftdoctor import realload

    lib = str(Path(realload.__file__).resolve().parents[2])
    env = {"PYTHONPATH": f"{tmp_path}:{lib}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
