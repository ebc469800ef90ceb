"""How engines configure CUDA-graph capture by default, written out from their
code, so scenarios can use the configs engines really run.

``vllm_capture_sizes``: vLLM 0.32's default capture-size list
(``VllmConfig._set_cudagraph_sizes``): 1, 2, 4, then every 8 up to 256 and
every 16 up to the max capture size, which is min(2 x max_num_seqs x
decode_query_len, 512) and at most max_num_batched_tokens; plus
max_num_batched_tokens when it fits; plus, with speculative decoding, the
uniform-decode sizes request_count x query_len of every decode tier (with a
dynamic schedule each tier's query length up to its widest batch), so every
tier's decode batches land on a multiple of its length.

``vllm_lora_cases``: vLLM 0.32's ``get_lora_capture_cases``: [0, max_loras+1],
or with ``specialize_active_lora`` the powers of two up to max_loras plus
max_loras+1.

vLLM 0.34 sizes uniform decode graphs by request count
(``decode_request_sizes``: from the deprecated shared sizes,
``VllmConfig._split_cudagraph_capture_sizes``), per decode query length
(``decode_shapes``: ``config/compilation.py decode_cudagraph_capture_shapes``),
and adaptive verification's varlen decode graphs on a token grid
(``varlen_token_grid``: ``varlen_decode_cudagraph_capture_grid``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from cgsim.config import SpecSchedule, dense_spec_schedule

__all__ = ["vllm_capture_sizes", "vllm_lora_cases", "decode_request_sizes", "decode_shapes", "varlen_token_grid",
           "DEFAULT_MAX_GRAPH_SIZE", "DEFAULT_MAX_BATCHED_TOKENS"]

DEFAULT_MAX_GRAPH_SIZE = 512  # 1024 on data-centre Blackwell
DEFAULT_MAX_BATCHED_TOKENS = 8192


def _request_counts(max_reqs: int, ceiling: int) -> list[int]:
    max_reqs = min(max_reqs, ceiling)
    counts = [n for n in (1, 2, 4) if n <= max_reqs]
    counts += list(range(8, min(max_reqs + 1, 256), 8))
    counts += list(range(256, max_reqs + 1, 16))
    return sorted(set(counts + [max_reqs]))


def vllm_capture_sizes(max_num_seqs: int, decode_query_len: int = 1, spec_schedule: SpecSchedule | None = None,
                       max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
                       max_graph_size: int = DEFAULT_MAX_GRAPH_SIZE) -> tuple[int, ...]:
    max_size = min(max_num_seqs * decode_query_len * 2, max_graph_size)
    uniform_decode: set[int] = set()
    if decode_query_len > 1:
        tiers = [(decode_query_len, max_num_seqs)]
        if spec_schedule is not None:
            dense = dense_spec_schedule(spec_schedule, max_num_seqs, decode_query_len - 1)
            widest: dict[int, int] = {}
            for batch_size, k in enumerate(dense[1:], start=1):
                widest[k + 1] = batch_size
            tiers = list(widest.items())
        uniform_decode = {n * q for q, reqs in tiers for n in _request_counts(reqs, max_graph_size)
                          if n * q <= max_size}
    elif max_num_seqs <= max_size:
        uniform_decode = {max_num_seqs}
    max_size = min(max_num_batched_tokens, max_size)
    sizes = [n for n in (1, 2, 4) if n <= max_size]
    if max_size >= 8:
        sizes += list(range(8, min(max_size + 1, 256), 8))
    if max_size >= 256:
        sizes += list(range(256, max_size + 1, 16))
    if max_num_batched_tokens <= max_size:
        sizes.append(max_num_batched_tokens)
    sizes += [s for s in uniform_decode if s <= max_num_batched_tokens]
    return tuple(sorted(set(sizes)))


def vllm_lora_cases(max_loras: int, specialize_active_lora: bool = False) -> tuple[int, ...]:
    if not specialize_active_lora:
        return (0, max_loras + 1)
    return (0,) + tuple(n for n in range(1, max_loras + 2) if (n & (n - 1)) == 0 or n == max_loras + 1)


def decode_request_sizes(capture_sizes: Iterable[int], query_lens: Iterable[int], max_num_seqs: int,
                         max_capture_size: int) -> tuple[int, ...]:
    """The request count each decode query length rounds a shared size up
    to, where that many requests of it fit in the largest size."""
    return tuple(sorted({min(-(-s // q), max_num_seqs) for s in capture_sizes for q in query_lens
                         if -(-s // q) * q <= max_capture_size}))


def decode_shapes(sizes: Iterable[int], limits: Mapping[int, int], max_tokens: int) -> list[tuple[int, int]]:
    """(num_reqs, query_len) of the uniform decode graphs: for each query
    length, the sizes up to the most requests it runs at and the tokens a
    decode graph holds, the first size past that limit captured at it."""
    ordered = sorted(set(sizes))
    shapes: set[tuple[int, int]] = set()
    for q, max_reqs in limits.items():
        limit = min(max_reqs, max_tokens // q)
        if limit < 1:
            continue
        shapes.update((min(n, limit), q) for n in ordered[: bisect.bisect_left(ordered, limit) + 1])
    return sorted(shapes, key=lambda shape: (shape[1], shape[0]))


def varlen_token_grid(max_tokens: int) -> tuple[int, ...]:
    """Token counts of varlen decode graphs: 1, 2, 4, four sizes per doubling
    from 8 to 1024, every 128 up to 4096, every 256 beyond, and the largest."""
    if max_tokens <= 0:
        return ()
    grid = {1, 2, 4, 8}
    low = 8
    while low < 1024:
        grid.update(range(low + low // 4, 2 * low + 1, low // 4))
        low *= 2
    grid.update(range(1024, 4096, 128), range(4096, max_tokens, 256))
    return tuple(sorted({s for s in grid if s < max_tokens} | {max_tokens}))
