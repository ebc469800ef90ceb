"""The attention arithmetic cgsim supplies to vLLM's runner on the mock
(cgsim.targets.vllm.runner_attention): what vLLM's kernels compute, and a
graph of it replays for any batch that fits, as the kernels' would.
Torch only: no vLLM needed."""

from __future__ import annotations

import math

import pytest
import torch

from cgsim.backends import get_backend
from cgsim.targets.vllm.runner_attention import paged_attention, write_kv_cache

HEADS, KV_HEADS, HEAD_SIZE, BLOCK, BLOCKS, WIDTH = 4, 2, 16, 16, 40, 8
SCALE = 0.25


def _caches() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kv = torch.zeros(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_SIZE)  # vLLM's logical (B, H, N, 2*hs) order
    key_cache, value_cache = kv.transpose(1, 2).split(HEAD_SIZE, dim=-1)
    return kv, key_cache, value_cache


def _fill(key_cache, value_cache, seq_lens: list[int]) -> tuple[torch.Tensor, dict, dict]:
    """Each request's keys and values written through write_kv_cache into
    blocks of its own (block 0 is vLLM's null block)."""
    table = torch.zeros(len(seq_lens), WIDTH, dtype=torch.int32)
    keys, values, next_block = {}, {}, 1
    for r, s in enumerate(seq_lens):
        for j in range(math.ceil(s / BLOCK)):
            table[r, j] = next_block
            next_block += 1
        keys[r], values[r] = torch.randn(s, KV_HEADS, HEAD_SIZE), torch.randn(s, KV_HEADS, HEAD_SIZE)
        slots = torch.tensor([int(table[r, p // BLOCK]) * BLOCK + p % BLOCK for p in range(s)])
        write_kv_cache(keys[r], values[r], key_cache, value_cache, slots)
    return table, keys, values


def _reference(q: torch.Tensor, keys: dict, values: dict, seq_lens: list[int], query_lens: list[int]) -> torch.Tensor:
    rows, t = [], 0
    for r, (s, n) in enumerate(zip(seq_lens, query_lens)):
        for i in range(n):
            upto = s - n + i + 1
            k = keys[r][:upto].repeat_interleave(HEADS // KV_HEADS, dim=1)
            v = values[r][:upto].repeat_interleave(HEADS // KV_HEADS, dim=1)
            rows.append(torch.einsum("hl,lhd->hd", (torch.einsum("hd,lhd->hl", q[t], k) * SCALE).softmax(-1), v))
            t += 1
    return torch.stack(rows)


@pytest.mark.parametrize("max_seq_len", [37, 4096])
def test_each_token_attends_causally_over_its_own_requests_paged_keys(max_seq_len: int) -> None:
    """A prefill of 3 tokens, a decode, a 37-token prompt; four padded tokens
    after them get zeros.  The same with the capture's worst-case length."""
    torch.manual_seed(0)
    _, key_cache, value_cache = _caches()
    seq_lens, query_lens = [20, 5, 37], [3, 1, 37]
    table, keys, values = _fill(key_cache, value_cache, seq_lens)
    q = torch.randn(sum(query_lens) + 4, HEADS, HEAD_SIZE)
    out = torch.full_like(q, 7.0)
    paged_attention(q, key_cache, value_cache, out, torch.tensor([0, 3, 4, 41], dtype=torch.int32),
                    torch.tensor(seq_lens, dtype=torch.int32), table, max_seq_len, SCALE, True)
    assert torch.allclose(out[:41], _reference(q, keys, values, seq_lens, query_lens), atol=1e-5)
    assert torch.equal(out[41:], torch.zeros(4, HEADS, HEAD_SIZE))


def test_a_padded_tokens_write_reaches_only_the_null_block() -> None:
    kv, key_cache, value_cache = _caches()
    _fill(key_cache, value_cache, [20])
    before = kv.clone()
    write_kv_cache(torch.randn(2, KV_HEADS, HEAD_SIZE), torch.randn(2, KV_HEADS, HEAD_SIZE), key_cache, value_cache,
                   torch.tensor([-1, -1]))
    assert torch.equal(kv[1:], before[1:])


def test_a_decode_graph_captured_once_replays_what_eager_gives_for_longer_sequences() -> None:
    """Captured as vLLM's runner captures decode graphs (max_seq_len the
    model's length, dummy sequences of length 1), replayed after the batch's
    metadata is written into the same buffers: no host sync at capture, and
    the same output as eager."""
    torch.manual_seed(1)
    backend = get_backend("mock")
    with backend.activate():
        _, key_cache, value_cache = _caches()
        table, keys, values = _fill(key_cache, value_cache, [30, 9])
        q = torch.randn(2, HEADS, HEAD_SIZE)
        qsl, seq_lens = torch.tensor([0, 1, 2], dtype=torch.int32), torch.ones(2, dtype=torch.int32)
        block_table = torch.zeros_like(table)
        out = torch.zeros_like(q)
        graph = backend.cuda.CUDAGraph()
        with backend.cuda.graph(graph):
            paged_attention(q, key_cache, value_cache, out, qsl, seq_lens, block_table, 4096, SCALE, True)
        seq_lens.copy_(torch.tensor([30, 9], dtype=torch.int32))
        block_table.copy_(table)
        graph.replay()
    assert torch.allclose(out, _reference(q, keys, values, [30, 9], [1, 1]), atol=1e-5)
