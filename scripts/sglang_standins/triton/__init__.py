"""Import-time stand-in for triton (spares the ~1 GB wheel, which has no CPU use here).

Needed by: sglang/srt/utils/common.py (`import triton`, `triton.runtime.jit`), and by
~100 kernel modules on the runner's import chain that do `import triton.language as tl`
and decorate kernels with @triton.jit / @triton.autotune at import time.
Why a stand-in suffices: cgsim's sglang target never launches a Triton kernel (the toy
model and attention backend are plain torch). Decorators return inert kernel objects;
launching one (`kernel[grid](...)`) raises, so an accidental launch is loud.
"""
import sys
import types

__version__ = "3.5.0"  # sglang compares against 3.5.0 (dsa/utils.py) and reads it for config file names


class JITFunction:
    def __init__(self, fn, **kw):
        self.fn, self.__name__, self.__doc__ = fn, getattr(fn, "__name__", "kernel"), fn.__doc__

    def __getitem__(self, grid):
        raise RuntimeError(f"triton stand-in: kernel {self.__name__} cannot run on CPU")

    def __call__(self, *a, **k):  # called from another @triton.jit body: never on CPU
        raise RuntimeError(f"triton stand-in: {self.__name__} cannot run on CPU")


def jit(fn=None, **kw):
    return JITFunction(fn, **kw) if fn is not None else (lambda f: JITFunction(f, **kw))


def autotune(*a, **k):
    return lambda f: f


def heuristics(*a, **k):
    return lambda f: f


class Config:
    def __init__(self, kwargs=None, num_warps=4, num_stages=2, num_ctas=1, **k):
        self.kwargs, self.num_warps, self.num_stages, self.num_ctas = dict(kwargs or {}), num_warps, num_stages, num_ctas


def cdiv(x, y):
    return (x + y - 1) // y


def next_power_of_2(n):
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


class constexpr:  # used as an annotation (x: tl.constexpr) and called (tl.constexpr(3))
    def __init__(self, value=None):
        self.value = value


class dtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"triton.language.{self.name}"


def _anything(qualname):
    def stub(*a, **k):
        raise RuntimeError(f"triton stand-in: {qualname} is device code")
    stub.__name__ = qualname
    return stub


def _tl_getattr(modname):
    def __getattr__(attr):  # tl.float32 -> a dtype, tl.load / tl.arange / ... -> device-only function
        if attr.startswith("__"):
            raise AttributeError(attr)
        return dtype(attr) if attr[:3] in ("int", "flo", "uin", "bfl") else _anything(f"{modname}.{attr}")
    return __getattr__


def _module(name, fallback=False, **attrs):
    m = types.ModuleType(name)
    m.__path__ = []
    m.__dict__.update(attrs)
    if fallback:
        m.__getattr__ = _tl_getattr(name)
    sys.modules[name] = m
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, m)
    return m


language = _module("triton.language", True, constexpr=constexpr, dtype=dtype, jit=jit)
_module("triton.language.extra", True)
_module("triton.language.extra.libdevice", True)
_module("triton.language.math", True)
runtime = _module("triton.runtime")
# torch._inductor (imported by sglang's compilation modules) probes triton whenever
# `import triton` succeeds; these are the names it needs at import time:
# torch/_inductor/runtime/triton_compat.py (CompiledKernel, OutOfResources,
# KernelInterface, triton_key, tl.core.view's signature), torch/utils/_triton.py
# (backends.backends) and torch/_inductor/runtime/hints.py (backends.compiler and
# compiler.compiler without AttrsDescriptor = the "Triton in 2025" branch).


class KernelInterface:
    pass


class CompiledKernel:
    pass


class OutOfResources(Exception):
    pass


_module("triton.runtime.jit", JITFunction=JITFunction, KernelInterface=KernelInterface)
_module("triton.runtime.autotuner", OutOfResources=OutOfResources)
_module("triton.runtime.cache", triton_key=lambda: "triton-standin")
_module("triton.language.core", view=lambda input, *shape, _semantic=None: None)
backends = _module("triton.backends", backends={})
_module("triton.backends.compiler")
compiler = _module("triton.compiler", CompiledKernel=CompiledKernel)
_module("triton.compiler.compiler")
testing = _module("triton.testing")
