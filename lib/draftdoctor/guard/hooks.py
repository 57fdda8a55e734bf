"""Run a function right after a module is imported, in whatever order the engine imports its modules.

The guard patches an engine's loader class; importing that module itself, early, could change the
engine's import order (and some engine modules fail when imported before their platform is chosen).
So the patch waits for the engine's own import of the module.
"""

from __future__ import annotations

import importlib.abc
import sys

_WAITING: dict[str, list] = {}


def after_import(module_name: str, callback) -> None:
    """Call `callback(module)` once `module_name` is imported (now, if it already is)."""
    module = sys.modules.get(module_name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        callback(module)
        return
    _WAITING.setdefault(module_name, []).append(callback)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a waited-for module, asks the other finders and wraps the loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _WAITING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenCall(spec.loader, _WAITING.pop(fullname))
                return spec
        return None


class _ThenCall(importlib.abc.Loader):
    def __init__(self, loader, callbacks):
        self.loader, self.callbacks = loader, callbacks

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        for callback in self.callbacks:
            callback(module)

    def __getattr__(self, name):  # get_source, is_package, ... of the real loader
        return getattr(self.loader, name)
