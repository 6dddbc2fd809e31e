"""Import-only stub for torchvision, put on PYTHONPATH for the SGLang
benchmark client only.  The PyPI torchvision wheel is CUDA-linked (needs
libc10_cuda.so) and cannot load against the CPU torch 2.13.0 wheel used here.
sglang.bench_serving imports sglang.srt.* modules that import torchvision
submodules at module level but never use them on the benchmark-client path.
Any submodule import succeeds; attributes are placeholders that raise if called."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+stub"


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, a):
        if a.startswith("__"):
            raise AttributeError(a)
        return _Placeholder(f"{self._name}.{a}")

    def __call__(self, *a, **k):
        raise RuntimeError(f"torchvision stub: {self._name} is not available")

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, a):
        if a.startswith("__"):
            raise AttributeError(a)
        return _Placeholder(f"{self.__name__}.{a}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder(f"torchvision.{name}")
