"""Import stand-ins for `triton` and `torchvision`, visible only to imports made by SGLang's own modules.

SGLang imports triton and torchvision at module level even for code paths that never run on CPU; PyPI's
triton is about 1 GB and its torchvision does not load beside a CPU torch. The stand-ins are scoped to
importers inside the `sglang` package so that torch and transformers keep seeing "not installed".
Child-process only: never import this into a notebook kernel or the parent.
"""

import importlib
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


class _JITFunction:
    """`triton.jit`'s result: keeps the Python function as `.fn` (SGLang's `CachedKernel` and others
    check `isinstance(fn, triton.runtime.jit.JITFunction)` and read `fn.fn` at import); calling it
    calls the function, launching it (`kernel[grid](...)`) raises."""

    def __init__(self, fn, **kwargs):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __getitem__(self, grid):
        raise NotImplementedError(f"triton kernel {self.__name__} cannot be launched: triton is a stand-in on CPU")


def _jit(fn=None, **kwargs):
    """`@triton.jit` and `@triton.jit(...)`."""
    if fn is None:
        return lambda f: _JITFunction(f, **kwargs)
    return _JITFunction(fn, **kwargs)


class _Unavailable:
    """A kernel of a strict stand-in package: importable, but calling it raises (a CPU load must never
    run one; if it does, the report shows the error instead of a silently wrong result)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name} is a draftdoctor stand-in: that kernel is not installed on CPU")

    def __repr__(self):
        return f"<stand-in {self._name}>"


class _StrictStubModule(types.ModuleType):
    """A package (e.g. `sgl_kernel`) whose names import but whose functions raise when called."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        value = type(name, (_StubClass,), {"__module__": self.__name__}) if name[:1].isupper() else _Unavailable(full)
        setattr(self, name, value)
        return value


class _AliasModule(types.ModuleType):
    """Stands for another module: every name is looked up there when asked for. Serves a GPU-less
    fallback import (`from vllm...layernorm import RMSNorm` at the end of SGLang's own layernorm.py)
    with SGLang's own classes, which is what a GPU host, which never takes that branch, builds with."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module(_FINDER.aliases[self.__name__]), name)


def _under(name, prefixes):
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _new_module(name):
    if name in _FINDER.aliases:
        module = _AliasModule(name)
    elif _under(name, _FINDER.strict):
        module = _StrictStubModule(name)
    elif _under(name, _FINDER.roots):
        module = _StubModule(name)
    else:  # a parent package of a strict or alias name: holds nothing else
        module = types.ModuleType(name)
    module.__path__ = []
    module.__spec__ = importlib.machinery.ModuleSpec(name, _FINDER, is_package=True)
    sys.modules[name] = module
    if name == "triton":
        module.__version__ = _TRITON_VERSION
        module.cdiv = _cdiv
        module.next_power_of_2 = _next_power_of_2
        module.jit = _jit
    if name == "triton.runtime.jit":
        module.JITFunction = _JITFunction
    return module


class _ScopedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stub packages, but only when the import statement runs in a module of `importer`."""

    roots = ("triton", "torchvision")
    strict = ()  # modules (and everything under them) served by a strict stand-in (set by `install`)
    aliases = {}  # module name -> the module it stands for (set by `install`)
    importer = "sglang"

    def _serves(self, fullname):
        if _under(fullname, self.roots + self.strict) or fullname in self.aliases:
            return True
        return any(name.startswith(fullname + ".") for name in (*self.strict, *self.aliases))  # a parent

    def find_spec(self, fullname, path=None, target=None):
        if not self._serves(fullname) or not self._imported_by_importer():
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


def install(strict=(), aliases=None):
    """Install the scoped stubs. Call after torch and transformers have cached their own
    triton/torchvision availability checks (see `freeze_availability_checks`).

    `strict`: more modules to stand in for, whose functions raise when called (releases that import
    `sgl_kernel` or `vllm._custom_ops` on the loader's path though only a GPU runs them);
    `aliases`: {module: module it stands for} (see `_AliasModule`). Their parent packages are served
    empty, so any other module under them stays "not installed"."""
    _FINDER.strict = tuple(strict)
    _FINDER.aliases = dict(aliases or {})
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


def real_auto_image_processor():
    """transformers 5.4 to 5.17 export `AutoImageProcessor` as a dummy that raises unless torchvision is
    installed; SGLang registers its multimodal image processors with it at import. The class itself
    (in its own module) needs no torchvision to register one: export that, as a host with torchvision
    sees it."""
    import importlib

    real = importlib.import_module("transformers.models.auto.image_processing_auto").__dict__["AutoImageProcessor"]
    # after that import: the first import of a transformers submodule can put a new lazy module object in
    # sys.modules["transformers"], and `from transformers import ...` reads that one
    sys.modules["transformers"].AutoImageProcessor = real
