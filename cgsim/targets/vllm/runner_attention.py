"""The attention backend cgsim supplies to vLLM's model runner on the mock.

vLLM's Triton attention backend with two things of cgsim's:

* its metadata builder declares the AttentionCGSupport level of the backend
  the launch names (FA3 ALWAYS, FA2 UNIFORM_BATCH, FlashInfer
  UNIFORM_SINGLE_TOKEN_DECODE: engine.ATTENTION_BACKENDS), whose kernels do
  not run here; the metadata it builds is vLLM's own;
* its arithmetic is torch ops (``paged_attention``, ``write_kv_cache``) in
  place of the Triton kernels, which under Triton's interpreter cost seconds
  a call.

The torch ops read what the kernels read (``query_start_loc``, ``seq_lens``,
``block_table``, ``slot_mapping``, the paged cache) with shapes fixed by the
metadata's worst case, never a host sync, so a graph captured around them
replays as the kernels' would: the capture metadata's ``max_seq_len`` is the
model's length (v1/worker/gpu/model_states/default.py, "Capture with
worst-case max_seq_len").  Anything the toy does not use (quantized KV,
encoder attention, ALiBi, sliding windows, soft-capping, sinks) stays on
vLLM's Triton path.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

__all__ = ["backend_with_support", "paged_attention", "write_kv_cache"]

# Keys per step of the online softmax: bounds one step's scores at
# tokens x KEY_CHUNK x heads.
KEY_CHUNK = 512


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """reshape_and_cache_flash: token i's key and value into slot
    ``slot_mapping[i]`` of the paged caches ([blocks, block_size, heads,
    head_size]); a negative slot (a padded token) writes nothing a request
    reads: it goes to block 0, vLLM's null block, which no request owns."""
    n = slot_mapping.shape[0]
    block_size = key_cache.shape[1]
    slots = slot_mapping.to(torch.int64)
    valid = slots >= 0
    slots = torch.where(valid, slots, torch.zeros_like(slots))
    blocks, offsets = slots // block_size, slots % block_size
    keep = valid.view(n, 1, 1)
    key_cache[blocks, offsets] = torch.where(keep, key[:n], torch.zeros_like(key[:n])).to(key_cache.dtype)
    value_cache[blocks, offsets] = torch.where(keep, value[:n], torch.zeros_like(value[:n])).to(value_cache.dtype)


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, out: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                    max_seq_len: int, scale: float, causal: bool) -> None:
    """unified_attention: each token of request r attends over r's keys in
    the paged caches (through ``block_table``), causally at its position
    ``seq_lens[r] - query_len(r) + i``; written into ``out`` [tokens, heads,
    head_size].  A token past the last request's end (padding) gets zeros."""
    tokens, heads, head_size = query.shape
    num_reqs = seq_lens.shape[0]
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = heads // kv_heads
    device = query.device
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    tok = torch.arange(tokens, device=device)
    req = torch.searchsorted(qsl[1:].contiguous(), tok, right=True).clamp(max=num_reqs - 1)
    in_request = tok < qsl[num_reqs]
    seq = seq_lens.to(torch.int64)[req]
    position = seq - (qsl[req + 1] - qsl[req]) + (tok - qsl[req])
    q = query.float().view(tokens, kv_heads, group, head_size) * scale
    width = block_table.shape[1]
    last_block = key_cache.shape[0] - 1
    acc = torch.zeros(tokens, kv_heads, group, head_size, dtype=torch.float32, device=device)
    running_max = torch.full((tokens, kv_heads, group), float("-inf"), dtype=torch.float32, device=device)
    running_sum = torch.zeros(tokens, kv_heads, group, dtype=torch.float32, device=device)
    rows = block_table[req].to(torch.int64)
    for start in range(0, max(int(max_seq_len), 1), KEY_CHUNK):
        keys_at = torch.arange(start, min(start + KEY_CHUNK, int(max_seq_len)), device=device)
        column = (keys_at // block_size).clamp(max=width - 1)
        blocks = rows[:, column].clamp(0, last_block)
        offsets = (keys_at % block_size).expand(tokens, -1)
        k = key_cache[blocks, offsets].float()  # [tokens, chunk, kv_heads, head_size]
        v = value_cache[blocks, offsets].float()
        visible = keys_at.view(1, -1) <= position.view(-1, 1) if causal else keys_at.view(1, -1) < seq.view(-1, 1)
        visible = visible & in_request.view(-1, 1)
        scores = torch.einsum("tkgd,tckd->tkgc", q, k)
        scores = scores.masked_fill(~visible.view(tokens, 1, 1, -1), float("-inf"))
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        safe_max = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
        weights = torch.exp(scores - safe_max.unsqueeze(-1))
        rescale = torch.exp(torch.where(torch.isfinite(running_max), running_max - safe_max,
                                        torch.full_like(running_max, float("-inf"))))
        acc = acc * rescale.unsqueeze(-1) + torch.einsum("tkgc,tckd->tkgd", weights, v)
        running_sum = running_sum * rescale + weights.sum(dim=-1)
        running_max = new_max
    result = acc / running_sum.clamp(min=1e-30).unsqueeze(-1)
    out.copy_(result.view(tokens, heads, head_size).to(out.dtype))


_BACKENDS: dict[str, type] = {}


def backend_with_support(support: str) -> type:
    """vLLM's Triton attention backend, its metadata builder declaring
    AttentionCGSupport ``support``, its arithmetic cgsim's torch ops."""
    if support in _BACKENDS:
        return _BACKENDS[support]
    triton_attn = importlib.import_module("vllm.v1.attention.backends.triton_attn")
    level = importlib.import_module("vllm.v1.attention.backend").AttentionCGSupport[support]
    builder = type("CgsimAttentionMetadataBuilder", (triton_attn.TritonAttentionMetadataBuilder,),
                   {"_cudagraph_support": level})
    impl = type("CgsimAttentionImpl", (triton_attn.TritonAttentionImpl,),
                {"forward": _forward, "do_kv_cache_update": _do_kv_cache_update})
    backend = type("CgsimAttentionBackend", (triton_attn.TritonAttentionBackend,),
                   {"get_builder_cls": staticmethod(lambda: builder), "get_impl_cls": staticmethod(lambda: impl)})
    for cls in (builder, impl, backend):
        cls.__module__ = __name__
    _BACKENDS[support] = backend
    return backend


def _on_torch_path(impl: Any) -> bool:
    """What the toy's attention uses: a decoder's causal attention over an
    unquantized cache, nothing else the Triton kernel also handles."""
    attn_type = getattr(impl, "attn_type", "decoder")
    decoder = getattr(attn_type, "value", attn_type) == "decoder"
    plain = not getattr(impl, "_is_per_token_head_quant", False) and "fp8" not in str(impl.kv_cache_dtype) \
        and "int" not in str(impl.kv_cache_dtype)
    extras = (impl.alibi_slopes, getattr(impl, "sinks", None), getattr(impl, "logits_soft_cap", None) or None)
    window = getattr(impl, "sliding_window", None)
    return decoder and plain and all(e is None for e in extras) and window in (None, (-1, -1))


def _caches(impl: Any, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # As the release's Triton impl, each to (B, N, H, hs): 0.26+ lay the cache out (B, H, N, 2*hs),
    # 0.20-0.25 (B, 2, N, H, hs) (its get_kv_cache_shape), unbound at dim 1.
    if kv_cache.dim() == 5:
        key_cache, value_cache = kv_cache.unbind(1)
        return key_cache, value_cache
    key_cache, value_cache = kv_cache.transpose(1, 2).split(impl.head_size, dim=-1)
    return key_cache, value_cache


def _forward(self: Any, layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor, output_scale: Any = None,
             output_block_scale: Any = None) -> torch.Tensor:
    causal = getattr(attn_metadata, "causal", True)
    if attn_metadata is None or output_scale is not None or output_block_scale is not None \
            or not isinstance(causal, bool) or not _on_torch_path(self):
        extra = {k: v for k, v in (("output_scale", output_scale), ("output_block_scale", output_block_scale))
                 if v is not None}
        return super(type(self), self).forward(layer, query, key, value, kv_cache, attn_metadata, output, **extra)
    n = attn_metadata.num_actual_tokens
    key_cache, value_cache = _caches(self, kv_cache)
    paged_attention(query[:n], key_cache, value_cache, output[:n], attn_metadata.query_start_loc,
                    attn_metadata.seq_lens, attn_metadata.block_table, attn_metadata.max_seq_len, self.scale,
                    causal)
    return output


def _do_kv_cache_update(self: Any, layer: Any, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                        slot_mapping: torch.Tensor) -> None:
    if not _on_torch_path(self):
        return super(type(self), self).do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
    key_cache, value_cache = _caches(self, kv_cache)
    write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
