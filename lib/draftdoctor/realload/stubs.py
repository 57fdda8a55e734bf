"""Import stand-ins for `triton` and `torchvision`, visible only to imports made by SGLang's own modules.

SGLang imports triton and torchvision at module level even for code paths that never run on CPU; PyPI's
triton is about 1 GB and its torchvision does not load beside a CPU torch. The stand-ins are scoped to
importers inside the `sglang` package so that torch and transformers keep seeing "not installed".
Child-process only: never import this into a notebook kernel or the parent.
"""

import importlib.abc
import importlib.machinery
import sys
import types

_TRITON_VERSION = "3.0.0"  # compared by some SGLang modules at import time; any 3.x works


def _cdiv(a, b):
    return -(a // -b)


def _next_power_of_2(n):
    return 1 << (n - 1).bit_length() if n > 0 else 1


class _StubClass(Exception):
    """Base of every capitalised stub name: instantiable with any arguments, subclassable, and valid in
    `except` clauses (triton exceptions are caught by name)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args)
        self.kwargs = kwargs


class _StubModule(types.ModuleType):
    """A package whose lowercase attributes are sub-stubs and whose capitalised ones are classes.

    Calling it acts as a pass-through decorator, so `@triton.jit` and `@triton.autotune(...)` leave
    the kernel definitions importable (they are never launched on CPU)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if name[:1].isupper():
            value = type(name, (_StubClass,), {"__module__": self.__name__})
        else:
            value = sys.modules.get(full) or _new_module(full)
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())


def _new_module(name):
    module = _StubModule(name)
    module.__path__ = []
    module.__spec__ = importlib.machinery.ModuleSpec(name, _FINDER, is_package=True)
    sys.modules[name] = module
    if name == "triton":
        module.__version__ = _TRITON_VERSION
        module.cdiv = _cdiv
        module.next_power_of_2 = _next_power_of_2
    return module


class _ScopedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stub packages, but only when the import statement runs in a module of `importer`."""

    roots = ("triton", "torchvision")
    importer = "sglang"

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.roots or not self._imported_by_importer():
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def _imported_by_importer(self):
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if not (name.startswith(("importlib", "_frozen_importlib")) or name == __name__):
                return name == self.importer or name.startswith(self.importer + ".")
            frame = frame.f_back
        return False

    def create_module(self, spec):
        return sys.modules.get(spec.name) or _new_module(spec.name)

    def exec_module(self, module):
        pass


_FINDER = _ScopedFinder()


def install():
    """Install the scoped stubs. Call after torch and transformers have cached their own
    triton/torchvision availability checks (see `freeze_availability_checks`)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def freeze_availability_checks():
    """Make torch and transformers decide now, before any stub exists, that triton and torchvision are
    absent. Both cache the answer; an import-time `torch.compile` in SGLang would otherwise make Inductor
    load triton internals from the stub."""
    import torch._inductor.runtime.triton_compat  # noqa: F401  (caches HAS_TRITON = False)
    from torch.utils._triton import has_triton_package
    from transformers.utils import import_utils

    has_triton_package()
    import_utils.is_torchvision_available()
