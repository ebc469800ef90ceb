"""Pinned host memory from torch's factories: ``torch.zeros(..., pin_memory=True)``.

A GPU process has a pinned-host allocator; a CPU build of torch has none and
raises "pin_memory=True requires a CUDA or other accelerator backend" when a
factory asks for it.  Inside ``pinned_host_factories()`` such a call makes an
ordinary CPU tensor marked pinned host memory (``host_buffer(t, pinned=True)``),
so the host-copy rules of a capture apply to it as to a tensor pinned with
``Tensor.pin_memory()``."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from . import _memory

# The factories that take pin_memory (torch/_torch_docs.py); the *_like ones too.
FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange", "empty_strided", "randn", "rand",
             "empty_like", "zeros_like", "ones_like", "full_like")


def _pinning(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def make(*args: Any, **kwargs: Any) -> torch.Tensor:
        if not kwargs.get("pin_memory"):
            return factory(*args, **kwargs)
        kwargs["pin_memory"] = False
        return _memory.host_buffer(factory(*args, **kwargs), pinned=True)

    make.__name__ = getattr(factory, "__name__", "factory")
    return make


@contextlib.contextmanager
def pinned_host_factories() -> Iterator[None]:
    """torch's factories given ``pin_memory=True`` make pinned host buffers for
    the duration (nested uses share the outermost)."""
    saved = {name: getattr(torch, name) for name in FACTORIES if hasattr(torch, name)}
    if any(getattr(fn, "_cgsim_pinning", False) for fn in saved.values()):
        yield
        return
    try:
        for name, fn in saved.items():
            wrapped = _pinning(fn)
            wrapped._cgsim_pinning = True  # type: ignore[attr-defined]
            setattr(torch, name, wrapped)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)
