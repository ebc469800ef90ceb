"""Compiled vLLM ops an install lacks, as torch ops (the runner build's).

A GPU host's bundle carries vLLM's Python without a ``vllm._C`` built for
its Python and torch, so an op a model calls directly through
``vllm._custom_ops`` (not through a CustomOp's ``forward_native``) is
missing there: DFlash's context step normalises the context states with
``ops.rms_norm`` and rotates their keys with ``ops.rotary_embedding``
(qwen3_dflash.py ``_normalize_context_states``, ``_apply_rope_to_context_k``).  Each
row here is registered only where ``torch.ops._C`` lacks it, with vLLM's
schema (csrc/torch_bindings.cpp) and its arithmetic in torch ops, which the
mock records inside a capture as it records the model's own.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

__all__ = ["rms_norm", "rotary_embedding", "STAND_INS", "define_missing"]


def rms_norm(result: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:  # noqa: A002
    """csrc/layernorm_kernels.cu rms_norm: ``input`` over its last dimension
    scaled by the reciprocal root of its mean square plus ``epsilon`` (in
    float32, as the kernel accumulates), times ``weight``, into ``result``."""
    x = input.float()
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    result.copy_((normed.to(input.dtype) * weight).to(result.dtype))


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None, head_size: int,
                     cos_sin_cache: torch.Tensor, is_neox: bool, rope_dim_offset: int = 0,
                     inverse: bool = False) -> None:
    """csrc/pos_encoding_kernels.cu rotary_embedding, in place: each head of
    ``query`` (and ``key``) rotated at its token's position over the cache's
    rotary dimensions from ``rope_dim_offset`` (NeoX: the two halves; GPT-J:
    even and odd elements), backwards where ``inverse``."""
    cos, sin = cos_sin_cache.index_select(0, positions.flatten()).chunk(2, dim=-1)
    if inverse:
        sin = -sin
    width = cos_sin_cache.shape[-1]
    for x in (query, key) if key is not None else (query,):
        heads = x.view(positions.numel(), -1, head_size)
        part = heads[..., rope_dim_offset:rope_dim_offset + width]
        c, s, rot = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float(), part.float()  # the kernel's float math
        if is_neox:
            x1, x2 = rot.chunk(2, dim=-1)
            part.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))
        else:
            x1, x2 = rot[..., ::2], rot[..., 1::2]
            part.copy_(torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2))


# (name, vLLM's schema, the torch arithmetic)
STAND_INS: tuple[tuple[str, str, Callable[..., None]], ...] = (
    ("rms_norm", "rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()", rms_norm),
    ("rotary_embedding", "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
                         "Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) -> ()",
     rotary_embedding),
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
