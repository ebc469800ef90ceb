"""Compiled vLLM ops an install lacks, as torch ops (the runner build's).

A GPU host's bundle carries vLLM's Python without a ``vllm._C`` built for
its Python and torch, so an op a model calls directly through
``vllm._custom_ops`` (not through a CustomOp's ``forward_native``) is
missing there: DFlash's context step normalises the context states with
``ops.rms_norm`` (v1 qwen3_dflash.py ``_normalize_context_states``).  Each
row here is registered only where ``torch.ops._C`` lacks it, with vLLM's
schema (csrc/torch_bindings.cpp) and its arithmetic in torch ops, which the
mock records inside a capture as it records the model's own.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

__all__ = ["rms_norm", "STAND_INS", "define_missing"]


def rms_norm(result: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:  # noqa: A002
    """csrc/layernorm_kernels.cu rms_norm: ``input`` over its last dimension
    scaled by the reciprocal root of its mean square plus ``epsilon`` (in
    float32, as the kernel accumulates), times ``weight``, into ``result``."""
    x = input.float()
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    result.copy_((normed.to(input.dtype) * weight).to(result.dtype))


# (name, vLLM's schema, the torch arithmetic)
STAND_INS: tuple[tuple[str, str, Callable[..., None]], ...] = (
    ("rms_norm", "rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()", rms_norm),
)

_LIBS: list[Any] = []  # a Library unregisters its ops when collected


def define_missing(namespace: str = "_C") -> tuple[str, ...]:
    """Register each stand-in ``torch.ops.<namespace>`` lacks; the names
    registered."""
    # vllm._custom_ops loads vllm._C where the install has one: checked before it, every op would look missing.
    importlib.import_module("vllm._custom_ops")
    ops = getattr(torch.ops, namespace)
    missing = [row for row in STAND_INS if not hasattr(ops, row[0])]
    if not missing:
        return ()
    lib = torch.library.Library(namespace, "FRAGMENT")
    _LIBS.append(lib)
    for name, schema, impl in missing:
        lib.define(schema)
        lib.impl(name, impl, "CompositeExplicitAutograd")
    return tuple(name for name, _, _ in missing)
