"""Nothing from a checkpoint or target folder runs: the guard every process the kit starts to read a
model folder with third-party Python installs first (the real-loader children; llama.cpp's converter,
which loads tokenizers with `trust_remote_code=True`).

A model folder can carry code: `auto_map` in its config or tokenizer_config names a `.py` beside the
weights, and transformers imports it when its caller trusts remote code (after copying it into its
modules cache). Two layers stop that, whatever the caller asks:

1. transformers never trusts remote code: once `transformers.dynamic_module_utils` is imported, its
   `resolve_trust_remote_code` answers False and refuses a folder that has only its own code (with
   the folder's name), and the functions that fetch and import such code raise.
2. Python itself refuses to run code compiled from a file outside the folders trusted when the guard
   went in (an audit hook on `exec`): the interpreter's, the installed packages', the kit's and the
   release's, plus any the caller names. A `.py` in a model folder, or a copy of one, never runs,
   whichever loader would import it. The current folder is not trusted (nor on `sys.path`).

`python -m draftdoctor.realload.nocode [--trust DIR]... SCRIPT ARGS...` runs a script under the guard.
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import sys

REFUSAL = "draftdoctor never runs code from a model folder"


class CodeRefused(ImportError):
    """Code a model folder carries, refused."""


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _refuse_remote(*args, **kwargs):
    """transformers' `resolve_trust_remote_code`, answering False: a folder that can be read without
    its own code is read so; one that cannot is refused by name."""
    names = ("trust_remote_code", "model_name", "has_local_code", "has_remote_code")
    given = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
    if given.get("has_remote_code") and not given.get("has_local_code"):
        raise CodeRefused(f"{given.get('model_name')} asks to run its own code (auto_map); {REFUSAL}")
    return False


def _refuse_module(*args, **kwargs):
    raise CodeRefused(f"{args[0] if args else 'a model folder'}: dynamic module refused; {REFUSAL}")


def _patch_transformers(module) -> None:
    module.resolve_trust_remote_code = _refuse_remote
    for name in ("get_class_from_dynamic_module", "get_cached_module_file", "get_class_in_module"):
        if hasattr(module, name):
            setattr(module, name, _refuse_module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches transformers' dynamic-module helpers as they are imported (not before: importing
    transformers early would change the order the real-loader adapters rely on)."""

    TARGET = "transformers.dynamic_module_utils"

    def find_spec(self, name, path, target=None):
        if name != self.TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    _patch_transformers(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


_INSTALLED = []


def install(trust=()) -> None:
    """Put both layers in place for this process (idempotent). `trust`: folders whose code may run
    besides those on `sys.path` now (e.g. a converter that puts its own folder on the path)."""
    if _INSTALLED:
        return
    here = os.getcwd()
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != here]  # `python -m` puts the current folder first
    roots = set()
    for folder in [*sys.path, *map(str, trust)]:
        if folder and os.path.abspath(folder) != here:
            roots.update({os.path.abspath(folder), os.path.realpath(folder)})
    trusted = tuple(sorted(roots))
    seen = set()

    def hook(event, args):
        if event != "exec":
            return
        filename = getattr(args[0], "co_filename", "") if args else ""
        if not filename or filename.startswith("<") or filename in seen:
            return
        if _under(os.path.abspath(filename), trusted) or _under(os.path.realpath(filename), trusted):
            seen.add(filename)
            return
        raise CodeRefused(f"{filename}: code outside the installed software; {REFUSAL}")

    sys.addaudithook(hook)
    if "transformers.dynamic_module_utils" in sys.modules:
        _patch_transformers(sys.modules["transformers.dynamic_module_utils"])
    sys.meta_path.insert(0, _AfterImport())
    _INSTALLED.append(trusted)


def main(argv: list[str]) -> None:
    trust = []
    while argv[:1] == ["--trust"]:
        trust.append(argv[1])
        argv = argv[2:]
    script = os.path.abspath(argv[0])
    sys.path.insert(0, os.path.dirname(script))  # as `python SCRIPT` would: the script's own folder first
    install(trust=trust)
    sys.argv = [script, *argv[1:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
