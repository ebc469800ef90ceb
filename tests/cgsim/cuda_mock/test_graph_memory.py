"""The mock's graph-memory accounts: what a capture took from its pool and what a pool holds."""

from __future__ import annotations

import gc

import pytest
import torch

from cgsim import cuda_mock
from cgsim.backends import get_backend

ROWS = 256  # float32 rows of 4 bytes: 1024 bytes, two of the mock's 512-byte granules


@pytest.fixture
def cuda():
    gc.collect()
    backend = get_backend("mock")
    with backend.activate():
        yield backend.cuda


def _capture(cuda, rows: int, pool=None):
    x = torch.ones(rows)
    g = cuda.CUDAGraph()
    with cuda.graph(g, pool=pool):
        seen = cuda_mock.capturing_graph()
        y = (x * 2) + 1  # two outputs of rows floats each; the first dies inside the capture
    return g, y, seen


def test_a_graph_accounts_the_blocks_its_capture_took(cuda):
    g, y, seen = _capture(cuda, ROWS)
    assert seen is g
    assert cuda_mock.capturing_graph() is None
    mem = g.memory
    assert isinstance(mem, cuda_mock.GraphMemory)
    assert mem.pool == g.pool()
    # x * 2 and its + 1: two blocks of ROWS floats, both fresh in a private pool.
    assert mem.taken_bytes == 2 * ROWS * 4
    assert mem.pool_growth == 2 * ROWS * 4
    pool = cuda_mock.pool_memory(g.pool())
    assert pool.reserved_bytes == 2 * ROWS * 4
    assert pool.allocated_bytes == ROWS * 4  # y is alive, x * 2 is not
    del y


def test_a_smaller_graph_in_a_shared_pool_takes_without_growing_it(cuda):
    pool = cuda.graph_pool_handle()
    g1, y1, _ = _capture(cuda, 2 * ROWS, pool)
    del y1  # the first graph's output is not kept: its block is free for the next capture
    g2, y2, _ = _capture(cuda, ROWS, pool)
    # Without splitting it is handed the first graph's larger blocks whole.
    assert g2.memory.taken_bytes == g1.memory.taken_bytes == 2 * 2 * ROWS * 4
    assert g2.memory.pool_growth == 0
    assert cuda_mock.pool_memory(pool).reserved_bytes == g1.memory.taken_bytes
    # Private pools: the same two captures cost the sum.
    p1, _, _ = _capture(cuda, 2 * ROWS)
    p2, _, _ = _capture(cuda, ROWS)
    total = sum(cuda_mock.pool_memory(g.pool()).reserved_bytes for g in (p1, p2))
    assert total == p1.memory.taken_bytes + p2.memory.taken_bytes > cuda_mock.pool_memory(pool).reserved_bytes
    del y2


def test_memory_so_far_while_capturing_and_none_before(cuda):
    g = cuda.CUDAGraph()
    assert g.memory is None
    x = torch.ones(ROWS)
    with cuda.graph(g):
        a = x * 2
        during = cuda_mock.capturing_graph().memory
        b = a + 1
    assert during.taken_bytes == ROWS * 4
    assert g.memory.taken_bytes == 2 * ROWS * 4
    del a, b


def test_a_pool_that_does_not_exist_holds_nothing(cuda):
    assert cuda_mock.pool_memory((0, 10**9)) == cuda_mock.PoolMemory((0, 10**9), 0, 0)
