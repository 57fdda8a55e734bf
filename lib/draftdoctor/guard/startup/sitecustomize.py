"""draftdoctor guard's start-up hook. `python -m draftdoctor.guard -- <command>` puts this folder first
on PYTHONPATH, so Python's `site` runs this in every process the command starts, the subprocesses
SGLang spawns for its schedulers included. It installs the guard's hooks (they wait for the engine's
own imports), then runs the `sitecustomize` this one hides, if there is one.
"""

import os
import sys


def _install():
    if os.environ.get("DRAFTDOCTOR_GUARD", "") in ("", "0"):
        return
    try:
        from draftdoctor.guard import sglang, vllm
    except Exception as exc:  # noqa: BLE001 - a process of the command that cannot see the kit
        print(f"draftdoctor guard: not installed in {sys.executable} (pid {os.getpid()}): {exc}", file=sys.stderr)
        return
    sglang.install()
    vllm.register()


def _chain():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_install()
_chain()
