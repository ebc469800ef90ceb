"""The SPEC §5 fidelity table, one test per row, plus the mock's own contract.

Tests taking ``graph_backend`` run on the backend chosen with
``--cgsim-backend`` (default: mock): on ``cuda`` the very same assertions run
against real torch.cuda graphs, which is the agreement suite for the mock.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import re

import pytest
import torch

from cgsim import cuda_mock
from cgsim.backends import BACKENDS, BackendUnavailable, GraphBackend, get_backend
from cgsim.cuda_mock import (
    ALREADY_CAPTURED,
    CAPTURE_INVALIDATED,
    CAPTURE_UNSUPPORTED,
    CUDA_ERROR_TYPE,
    REPLAY_WITHOUT_CAPTURE,
)

HOST_COPY_RE = re.escape(cuda_mock.HOST_COPY.split(". ")[0])


@pytest.fixture
def graph_backend(request) -> GraphBackend:
    # The option comes from cgsim.pytest_plugin; unset (None) or unregistered means mock.
    name = request.config.getoption("cgsim_backend", default=None) or "mock"
    backend = get_backend(name)
    # Graphs left as garbage by earlier tests must not be collected in the
    # middle of this test's capture: that invalidates it, on a GPU as here.
    import gc

    gc.collect()
    with backend.activate():
        yield backend


def capture(backend: GraphBackend, fn, pool=None):
    """Capture ``fn()`` into a new graph; return (graph, fn's result)."""
    g = backend.cuda.CUDAGraph()
    with backend.cuda.graph(g, pool=pool):
        out = fn()
    return g, out


def replay(backend: GraphBackend, g) -> None:
    g.replay()
    backend.cuda.synchronize()


def vals(t: torch.Tensor) -> list:
    return t.detach().cpu().tolist()


# ------------------------------------------------------------ §5 rows: replay


def test_static_input_changed_in_place_after_capture_is_read_by_replay(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    g, y = capture(b, lambda: x * 2)
    x.fill_(3.0)
    replay(b, g)
    assert vals(y) == [6.0] * 4


def test_python_scalar_changed_after_capture_replay_uses_captured_value(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    cfg = {"scale": 2.0}
    g, y = capture(b, lambda: x * cfg["scale"])
    cfg["scale"] = 5.0
    replay(b, g)
    assert vals(y) == [2.0] * 4


def test_metadata_rebound_after_capture_replay_reads_old_object(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    meta = {"seq_lens": torch.full((4,), 1.0, device=b.device)}
    old = meta["seq_lens"]  # kept alive: on a GPU the graph would otherwise read freed memory
    g, y = capture(b, lambda: x + meta["seq_lens"])
    meta["seq_lens"] = torch.full((4,), 10.0, device=b.device)
    replay(b, g)
    assert vals(y) == [2.0] * 4
    old.fill_(3.0)
    replay(b, g)
    assert vals(y) == [4.0] * 4


def test_metadata_updated_in_place_is_read_by_replay(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    meta = {"seq_lens": torch.full((4,), 1.0, device=b.device)}
    g, y = capture(b, lambda: x + meta["seq_lens"])
    meta["seq_lens"].copy_(torch.arange(4, dtype=torch.float32, device=b.device))
    replay(b, g)
    assert vals(y) == [1.0, 2.0, 3.0, 4.0]


def test_output_read_after_capture_before_replay_has_no_computed_values(graph_backend):
    b = graph_backend
    x = torch.ones(64, device=b.device)
    g, y = capture(b, lambda: x + 1)
    b.cuda.synchronize()
    # The GPU shows fresh pool memory (zeros); the mock poisons (NaN). Either way:
    # not the value the capture would have computed.
    assert not torch.any(y == 2).item()
    if b.name == "mock":
        assert torch.isnan(y).all().item()
    replay(b, g)
    assert vals(y) == [2.0] * 64


def test_in_place_op_inside_capture_is_not_applied_until_replay(graph_backend):
    b = graph_backend
    buf = torch.zeros(4, device=b.device)
    g, _ = capture(b, lambda: buf.add_(1))
    b.cuda.synchronize()
    assert vals(buf) == [0.0] * 4
    replay(b, g)
    assert vals(buf) == [1.0] * 4
    replay(b, g)
    assert vals(buf) == [2.0] * 4


def test_outputs_land_in_the_same_tensor_every_replay(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    g, y = capture(b, lambda: x * 2 + 1)
    ptr = y.data_ptr()
    for v in (1.0, 2.0, 3.0):
        x.fill_(v)
        replay(b, g)
        assert y.data_ptr() == ptr
        assert vals(y) == [v * 2 + 1] * 4


# A mutating op whose schema does not say what it returns, as vLLM IR's
# maybe_inplace overloads (vllm/ir/op.py: infer_schema(mutates_args=...)):
# one returns its input, the other a new tensor.
_MAYBE_INPLACE = torch.library.Library("cgsim_mock_test", "FRAGMENT")
_MAYBE_INPLACE.define("double_returns_input(Tensor(a!) x) -> Tensor")
_MAYBE_INPLACE.define("double_returns_new(Tensor(a!) x) -> Tensor")
_MAYBE_INPLACE.impl("double_returns_input", lambda x: x.mul_(2), "CompositeExplicitAutograd")
_MAYBE_INPLACE.impl("double_returns_new", lambda x: x.mul_(2) + 1, "CompositeExplicitAutograd")


@pytest.mark.parametrize("op, expect", [("double_returns_input", [12.0, 14.0]), ("double_returns_new", [13.0, 15.0])])
def test_a_mutating_op_returning_an_unannotated_tensor_hands_its_replayed_result_on(graph_backend, op, expect):
    b = graph_backend
    x = torch.ones(2, device=b.device)
    g, y = capture(b, lambda: getattr(torch.ops.cgsim_mock_test, op)(x) + 2)
    x.copy_(torch.tensor([5.0, 6.0]))
    replay(b, g)
    assert vals(x) == [10.0, 12.0]
    assert vals(y) == expect


# An engine op that reads its arguments from a context set around the call,
# as vLLM's attention reads its forward context.
_CONTEXT: list[float] = [0.0]
_MAYBE_INPLACE.define("add_context(Tensor(a!) x) -> ()")


def _add_context(x: torch.Tensor) -> None:
    x.add_(_CONTEXT[0])


_MAYBE_INPLACE.impl("add_context", _add_context, "CompositeExplicitAutograd")


@contextlib.contextmanager
def _context(value: float):
    before, _CONTEXT[0] = _CONTEXT[0], value
    try:
        yield
    finally:
        _CONTEXT[0] = before


def test_an_op_recorded_whole_replays_under_the_state_it_was_captured_in() -> None:
    """cuda_mock.replay_state: a real graph's kernel keeps the arguments it was
    launched with; the mock re-runs an engine's op at replay, so it re-enters
    the state the provider gave at capture (the context set then, not now)."""
    b = get_backend("mock")
    with b.activate():
        x = torch.zeros(2, device=b.device)
        with cuda_mock.replay_state(lambda: (lambda v=_CONTEXT[0]: _context(v))), _context(3.0):
            g, _ = capture(b, lambda: torch.ops.cgsim_mock_test.add_context(x))
        with _context(100.0):
            replay(b, g)
        assert vals(x) == [3.0, 3.0]
        with _context(3.0):
            g2, _ = capture(b, lambda: torch.ops.cgsim_mock_test.add_context(x))  # no provider: now's state
        with _context(100.0):
            replay(b, g2)
        assert vals(x) == [103.0, 103.0]


def test_views_alias_as_in_eager(graph_backend):
    b = graph_backend
    x = torch.arange(4, dtype=torch.float32, device=b.device)
    buf = torch.zeros(4, device=b.device)

    def body():
        y = x * 2
        buf[1:3].add_(1)  # in-place through a view of a static buffer
        return y, y.view(2, 2), y[2:]

    g, (y, y2d, tail) = capture(b, body)
    replay(b, g)
    assert vals(buf) == [0.0, 1.0, 1.0, 0.0]
    assert vals(y2d) == [[0.0, 2.0], [4.0, 6.0]]
    assert vals(tail) == [4.0, 6.0]
    x.fill_(1.0)
    replay(b, g)
    assert vals(tail) == [2.0, 2.0]


# --------------------------------------------------- §5 rows: illegal, class 1

CLASS1 = {
    "item": lambda x: x.sum().item(),
    "bool": lambda x: bool(x.sum() > 0),
    "nonzero": lambda x: torch.nonzero(x),
    "masked_select": lambda x: torch.masked_select(x, x > 0),
    "unique": lambda x: torch.unique(x),
    "synchronize": lambda x: torch.cuda.synchronize(),
    "accelerator-synchronize": lambda x: torch.accelerator.synchronize(),
}


@pytest.mark.parametrize("op", sorted(CLASS1))
def test_sync_or_data_dependent_op_inside_capture_invalidates_it(graph_backend, op):
    b = graph_backend
    x = torch.ones(8, device=b.device)
    g = b.cuda.CUDAGraph()
    inner = None
    with pytest.raises(RuntimeError, match=CAPTURE_INVALIDATED) as outer:
        with b.cuda.graph(g):
            x * 2
            with pytest.raises(RuntimeError, match=CAPTURE_UNSUPPORTED) as inner:
                CLASS1[op](x)
    if b.name == "mock":
        assert type(inner.value) is CUDA_ERROR_TYPE
        assert type(outer.value) is CUDA_ERROR_TYPE
    assert not b.cuda.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match=re.escape(REPLAY_WITHOUT_CAPTURE)):
        g.replay()


def test_class1_error_propagating_out_of_the_block_is_replaced_by_invalidated_error(graph_backend):
    b = graph_backend
    x = torch.ones(8, device=b.device)
    g = b.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=CAPTURE_INVALIDATED) as ei:
        with b.cuda.graph(g):
            x.sum().item()
    assert CAPTURE_UNSUPPORTED in str(ei.value.__context__)


# --------------------------------------------------- §5 rows: illegal, class 2

CLASS2 = {
    ".cpu()": lambda b, x: x.cpu(),
    ".tolist()": lambda b, x: x.tolist(),
    "copy from pageable host": lambda b, x: x.copy_(b.host_buffer(torch.ones(8), pinned=False), non_blocking=True),
    "copy to pageable host": lambda b, x: b.host_buffer(torch.ones(8), pinned=False).copy_(x, non_blocking=True),
}


@pytest.mark.parametrize("op", sorted(CLASS2))
def test_pageable_host_copy_inside_capture_raises_and_capture_stays_valid(graph_backend, op):
    b = graph_backend
    x = torch.ones(8, device=b.device)
    g = b.cuda.CUDAGraph()
    with b.cuda.graph(g):
        with pytest.raises(RuntimeError, match=HOST_COPY_RE) as ei:
            CLASS2[op](b, x)
        y = x * 3
    assert type(ei.value) is RuntimeError
    replay(b, g)
    assert vals(y) == [3.0] * 8


def test_numpy_of_device_tensor_inside_capture_raises_type_error(graph_backend):
    b = graph_backend
    x = torch.ones(8, device=b.device)
    g = b.cuda.CUDAGraph()
    with b.cuda.graph(g):
        # TypeError "can't convert cuda:0 device type tensor to numpy"; a GPU
        # host without numpy says "Numpy is not available" (RuntimeError) first.
        with pytest.raises((TypeError, RuntimeError), match="(?i)numpy") as ei:
            x.numpy()
        if b.name == "mock":
            assert type(ei.value) is TypeError
        y = x * 3
    replay(b, g)
    assert vals(y) == [3.0] * 8


# ---------------------------------------------------------- §5 rows: host memory


def test_pinned_host_copy_non_blocking_inside_capture_reads_current_host_contents(graph_backend):
    b = graph_backend
    host_in = b.host_buffer(torch.ones(4), pinned=True)
    host_out = b.host_buffer(torch.zeros(4), pinned=True)
    dev = torch.zeros(4, device=b.device)

    def body():
        dev.copy_(host_in, non_blocking=True)
        y = dev * 2
        host_out.copy_(y, non_blocking=True)
        return y

    g, y = capture(b, body)
    for v in (5.0, 7.0):
        host_in.fill_(v)
        replay(b, g)
        assert vals(y) == [2 * v] * 4
        assert host_out.tolist() == [2 * v] * 4


def test_factories_asked_for_pinned_memory_make_pinned_host_buffers_a_capture_copies_from():
    """A GPU process has a pinned-host allocator (torch.zeros(..., pin_memory=True));
    a CPU build of torch has none.  Under pinned_host_factories such a buffer is
    the mock's pinned host memory: a non-blocking copy from it inside a capture
    is recorded and reads the buffer's contents at each replay."""
    b = get_backend("mock")
    with b.activate(), cuda_mock.pinned_host_factories():
        host_in = torch.zeros(4, pin_memory=True)
        staged = torch.tensor([1.0, 2.0], pin_memory=True)
        assert host_in.is_pinned() and staged.is_pinned() and staged.tolist() == [1.0, 2.0]
        assert not torch.zeros(4).is_pinned()
        dev = torch.zeros(4)

        def body():
            dev.copy_(host_in, non_blocking=True)
            return dev * 2

        g, y = capture(b, body)
        host_in.fill_(3.0)
        replay(b, g)
        assert vals(y) == [6.0] * 4
    assert torch.zeros is not None and not getattr(torch.zeros, "_cgsim_pinning", False)


def test_cpu_tensor_allocated_inside_capture_is_allowed(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    g = b.cuda.CUDAGraph()
    with b.cuda.graph(g):
        y = x * 2
        with b.host_ops():
            c = torch.arange(4)
            total = int(c.sum())  # a host-side .item(): no device involved
    assert c.tolist() == [0, 1, 2, 3]
    assert total == 6
    replay(b, g)
    assert vals(y) == [2.0] * 4


def test_tensor_built_on_host_inside_capture_copied_to_device_raises(graph_backend):
    b = graph_backend
    dev = torch.zeros(4, device=b.device)
    g = b.cuda.CUDAGraph()
    with b.cuda.graph(g):
        with pytest.raises(RuntimeError, match=HOST_COPY_RE):
            dev[:3] = torch.tensor([1.0, 2.0, 3.0])  # torch.tensor builds pageable host memory
        y = dev + 1
    replay(b, g)
    assert vals(y) == [1.0] * 4


def test_host_scalar_tensor_in_device_op_is_frozen_at_capture(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    scale = b.host_buffer(torch.tensor(2.0), pinned=False)
    g, y = capture(b, lambda: x * scale)
    scale.fill_(5.0)
    replay(b, g)
    assert vals(y) == [2.0] * 4


def test_host_tensor_in_device_op_inside_capture_is_a_device_mismatch(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    host = b.host_buffer(torch.ones(4), pinned=False)
    g = b.cuda.CUDAGraph()
    with b.cuda.graph(g):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            x * host
        y = x * 2
    replay(b, g)
    assert vals(y) == [2.0] * 4


# ------------------------------------------------------------ §5 rows: random


def test_random_op_inside_capture_draws_new_numbers_each_replay(graph_backend):
    b = graph_backend
    g, r = capture(b, lambda: torch.rand(1000, device=b.device))
    replay(b, g)
    first = r.clone()
    replay(b, g)
    second = r.clone()
    assert not torch.equal(first, second)
    assert 0.0 <= first.min().item() and first.max().item() < 1.0


# -------------------------------------------------------- §5 rows: lifecycle


def test_replay_after_reset_raises(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    g, y = capture(b, lambda: x * 2)
    replay(b, g)
    g.reset()
    with pytest.raises(RuntimeError, match=re.escape(REPLAY_WITHOUT_CAPTURE)):
        g.replay()


def test_replay_without_any_capture_raises(graph_backend):
    g = graph_backend.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=re.escape(REPLAY_WITHOUT_CAPTURE)):
        g.replay()


def test_second_capture_on_same_graph_raises(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    g, _ = capture(b, lambda: x * 2)
    s = b.cuda.Stream()
    with b.cuda.stream(s):
        with pytest.raises(RuntimeError, match=re.escape(ALREADY_CAPTURED)):
            g.capture_begin()
    assert not b.cuda.is_current_stream_capturing()


def test_capture_on_the_default_stream_raises(graph_backend):
    b = graph_backend
    g = b.cuda.CUDAGraph()
    with b.cuda.stream(b.cuda.default_stream()):
        with pytest.raises(RuntimeError, match="non-default stream"):
            g.capture_begin()


def test_each_replay_notes_the_stream_current_at_replay(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    side = b.cuda.Stream()
    with b.cuda.stream(side):
        g, _ = capture(b, lambda: x * 2)
    b.take_replay_streams()
    g.replay()
    with b.cuda.stream(side):
        g.replay()
        g.replay()
    g.replay()
    b.cuda.synchronize()
    # Each stream once, in the order first seen: a long run's replays add nothing until taken.
    assert b.take_replay_streams() == (b.cuda.default_stream(), side)
    assert b.take_replay_streams() == ()


def test_a_stream_left_current_in_one_block_is_not_current_in_the_next():
    with cuda_mock.patched_torch_cuda():
        torch.cuda.set_stream(torch.cuda.Stream())  # as torch's graph context leaves it when capture_end fails
    with cuda_mock.patched_torch_cuda():
        assert torch.cuda.current_stream() is torch.cuda.default_stream()


def test_a_graph_keeps_the_stream_it_was_captured_on():
    with cuda_mock.patched_torch_cuda():
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        assert g.capture_stream is None
        with torch.cuda.graph(g, stream=side):
            torch.ones(2) * 2
        assert g.capture_stream is side
        own = torch.cuda.CUDAGraph()
        with torch.cuda.graph(own):
            torch.ones(2) * 2
        assert own.capture_stream is torch.cuda.graph.default_capture_stream is not side


def test_is_current_stream_capturing_true_inside_capture_only(graph_backend):
    b = graph_backend
    x = torch.ones(4, device=b.device)
    seen = []
    assert b.cuda.is_current_stream_capturing() is False

    def body():
        seen.append(b.cuda.is_current_stream_capturing())
        return x * 2

    g, _ = capture(b, body)
    assert seen == [True]
    assert b.cuda.is_current_stream_capturing() is False
    replay(b, g)
    assert b.cuda.is_current_stream_capturing() is False


# ------------------------------------------------------------- §5 rows: pools


def _three_graphs_one_pool(b):
    pool = b.cuda.graph_pool_handle()
    x = torch.ones(1024, device=b.device)
    g1, out1 = capture(b, lambda: x * 2, pool=pool)
    g2, out2 = capture(b, lambda: x * 3, pool=pool)
    freed_ptr = out1.data_ptr()
    del out1  # first graph's output freed: its block goes back to the pool
    gc.collect()
    g3, out3 = capture(b, lambda: x * 4, pool=pool)
    return x, (g1, g2, g3), (out2, out3), freed_ptr


def test_shared_pool_third_graph_takes_the_freed_block(graph_backend):
    b = graph_backend
    _, graphs, (out2, out3), freed_ptr = _three_graphs_one_pool(b)
    assert out3.data_ptr() == freed_ptr
    assert out2.data_ptr() != freed_ptr


def test_shared_pool_replaying_earlier_graph_overwrites_later_graphs_output(graph_backend):
    b = graph_backend
    x, (g1, g2, g3), (out2, out3), _ = _three_graphs_one_pool(b)
    replay(b, g2)
    replay(b, g3)
    assert vals(out3) == [4.0] * 1024
    replay(b, g1)  # still writes x * 2 into the block out3 now lives in
    assert vals(out3) == [2.0] * 1024
    assert vals(out2) == [3.0] * 1024


def test_graph_pool_handle_and_graph_pool_share_a_pool(graph_backend):
    b = graph_backend
    x = torch.ones(1024, device=b.device)
    g1, out1 = capture(b, lambda: x * 2)
    ptr = out1.data_ptr()
    del out1
    gc.collect()
    g2, out2 = capture(b, lambda: x * 5, pool=g1.pool())
    assert out2.data_ptr() == ptr
    replay(b, g2)
    replay(b, g1)
    assert vals(out2) == [2.0] * 1024


def test_graph_keeps_its_private_memory_while_it_lives(graph_backend):
    b = graph_backend
    x = torch.ones(256, device=b.device)

    def body():
        h = x * 2  # intermediate: no Python reference survives the capture
        return h + 1

    g, y = capture(b, body)
    gc.collect()
    for v in (1.0, 4.0):
        x.fill_(v)
        replay(b, g)
        assert vals(y) == [2 * v + 1] * 256


# ------------------------------------------------------------- op coverage


class _Block(torch.nn.Module):
    """A decoder-layer-shaped module: embedding, norms, attention with a KV-cache
    write, residual, sampling-ish tail (topk, argmax, gather, dtype casts)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.qkv = torch.nn.Linear(32, 96)
        self.o = torch.nn.Linear(32, 32)
        self.rms = torch.nn.RMSNorm(32)

    def forward(self, ids, pos, kv_cache, slots):
        h = self.emb(ids) + pos.unsqueeze(-1).float() * 0.01
        q, k, v = self.qkv(self.ln(h)).split(32, dim=-1)
        kv_cache.index_copy_(0, slots, k)
        q, k, v = (t.view(1, -1, 4, 8).transpose(1, 2) for t in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = self.rms(h + self.o(a.transpose(1, 2).reshape(-1, 32)))
        top = torch.topk(torch.softmax(out, -1), 2, dim=-1)
        return (
            out,
            top.values,
            top.indices,
            torch.cat([out, h], -1).sum(0),
            torch.argmax(out, -1),
            out.to(torch.bfloat16),
            torch.where(out > 0, out, 0.0),
            torch.gather(out, 1, top.indices),
        )


@pytest.mark.parametrize("inference", [True, False], ids=["inference_mode", "no_grad"])
def test_decoder_block_replay_equals_eager(graph_backend, inference):
    b = graph_backend
    torch.manual_seed(0)
    model = _Block().to(b.device).eval()
    ids = torch.randint(0, 100, (16,), device=b.device)
    pos = torch.arange(16, device=b.device)
    slots = torch.arange(16, device=b.device)
    kv, kv_eager = torch.zeros(32, 32, device=b.device), torch.zeros(32, 32, device=b.device)
    ctx = torch.inference_mode if inference else torch.no_grad
    with ctx():
        model(ids, pos, torch.zeros_like(kv), slots)  # warmup: library init stays out of the capture
        g, outs = capture(b, lambda: model(ids, pos, kv, slots))
        b.cuda.synchronize()
        assert vals(kv) == [[0.0] * 32] * 32  # the cache write waits for replay
        for _ in range(3):
            ids.copy_(torch.randint(0, 100, (16,), device=b.device))
            replay(b, g)
            ref = model(ids, pos, kv_eager, slots)
            for got, want in zip(outs, ref):
                assert got.dtype == want.dtype and got.shape == want.shape
                torch.testing.assert_close(got, want)
            torch.testing.assert_close(kv, kv_eager)


def test_dtype_cast_inside_capture_under_inference_mode_is_replayed(graph_backend):
    b = graph_backend
    pos = torch.arange(4, device=b.device)
    with torch.inference_mode():
        g, (f, h) = capture(b, lambda: (pos.float() * 2, (pos.float() * 2).to(torch.float16)))
        pos.copy_(torch.tensor([4, 3, 2, 1], device=b.device))
        replay(b, g)
    assert vals(f) == [8.0, 6.0, 4.0, 2.0]
    assert vals(h) == [8.0, 6.0, 4.0, 2.0]


# ----------------------------------------------------- make_graphed_callables


def test_make_graphed_callables_matches_eager(graph_backend):
    b = graph_backend
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).to(b.device)
    eager = copy.deepcopy(model)
    sample = torch.randn(8, 16, device=b.device, requires_grad=True)
    graphed = b.cuda.make_graphed_callables(model, (sample,))
    for _ in range(3):
        # Grads set to None each step, as with optimizer.zero_grad(): autograd
        # steals the graph's static grad buffers as .grad, so accumulating across
        # replays would read memory the next replay overwrites (on a GPU too).
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        inp = torch.randn(8, 16, device=b.device, requires_grad=True)
        inp_e = inp.detach().clone().requires_grad_(True)
        out = graphed(inp)
        ref = eager(inp_e)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(inp.grad, inp_e.grad)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


# ---------------------------------------------------------------- backends


def test_get_backend_unknown_name_raises_value_error_naming_choices():
    with pytest.raises(ValueError, match=r"'gpu'.*mock.*cuda"):
        get_backend("gpu")
    assert BACKENDS == ("mock", "cuda")


def test_get_backend_mock_is_cpu_and_patches_torch_cuda():
    b = get_backend("mock")
    assert b.name == "mock" and b.device == torch.device("cpu")
    with b.activate():
        assert torch.cuda.CUDAGraph is cuda_mock.CUDAGraph
        assert torch.cuda.is_available()


def test_get_backend_cuda_without_gpu_says_what_to_do():
    if torch.cuda.is_available():
        b = get_backend("cuda")
        assert b.device.type == "cuda"
        return
    with pytest.raises(BackendUnavailable, match=r"cuda.*is_available\(\) is False.*--backend mock"):
        get_backend("cuda")


def test_get_backend_cuda_inside_the_mock_is_refused():
    with cuda_mock.patched_torch_cuda():
        with pytest.raises(BackendUnavailable, match="mock"):
            get_backend("cuda")


# ------------------------------------------------ the mock's own contract


def test_patched_torch_cuda_restores_everything_on_error():
    before = {n: torch.cuda.__dict__.get(n) for n in ("CUDAGraph", "graph", "synchronize", "is_available")}
    tensor_cpu = torch.Tensor.__dict__.get("cpu")
    with pytest.raises(KeyError):
        with cuda_mock.patched_torch_cuda():
            assert torch.cuda.graph is cuda_mock.graph
            raise KeyError("boom")
    after = {n: torch.cuda.__dict__.get(n) for n in before}
    assert after == before
    assert torch.Tensor.__dict__.get("cpu") is tensor_cpu
    assert not cuda_mock.is_patched()
    x = torch.ones(2)
    assert x.cpu() is x  # the real CPU .cpu() is back


def test_patched_torch_cuda_answers_torch_accelerators_memory_calls():
    """torch.accelerator's memory, cache and sync calls are torch.cuda's on a
    CUDA machine; under the mock they are the mock's, and torch's again after."""
    from cgsim.cuda_mock._patch import ACCELERATOR_NAMES

    before = {name: getattr(torch.accelerator, name) for name in ACCELERATOR_NAMES if hasattr(torch.accelerator, name)}
    available = torch.accelerator.is_available()
    with cuda_mock.patched_torch_cuda():
        pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        x = torch.ones(64)
        with torch.cuda.graph(g, pool=pool):
            y = x * 2
        assert torch.accelerator.get_memory_info() == torch.cuda.mem_get_info()
        assert torch.accelerator.memory_allocated() == torch.cuda.memory_allocated() > 0
        assert torch.accelerator.memory_reserved() == torch.cuda.memory_reserved()
        torch.accelerator.empty_cache()
        torch.accelerator.synchronize()
        g.replay()
        assert torch.equal(y, x * 2)
        assert torch.accelerator.is_available() == available  # no device-type claim: tensors stay where they were
    assert {name: getattr(torch.accelerator, name) for name in before} == before


def test_patched_torch_cuda_is_reentrant():
    real = torch.cuda.CUDAGraph
    with cuda_mock.patched_torch_cuda():
        with pytest.raises(ValueError):
            with cuda_mock.patched_torch_cuda():
                raise ValueError
        assert torch.cuda.CUDAGraph is cuda_mock.CUDAGraph  # inner exit kept the outer's mock
        with cuda_mock.patched_torch_cuda():
            assert torch.cuda.CUDAGraph is cuda_mock.CUDAGraph
        assert torch.cuda.CUDAGraph is cuda_mock.CUDAGraph
        assert torch.cuda.graphs.graph_pool_handle is cuda_mock.graph_pool_handle
    assert torch.cuda.CUDAGraph is real
    assert not cuda_mock.is_patched()


@pytest.mark.parametrize(
    "dtype, check",
    [
        (torch.float32, lambda t: torch.isnan(t).all()),
        (torch.bfloat16, lambda t: torch.isnan(t).all()),
        (torch.int64, lambda t: (t == cuda_mock.poison_value(torch.int64)).all() and t[0] < -(2**60)),
        (torch.int32, lambda t: (t == cuda_mock.poison_value(torch.int32)).all() and t[0] < -(2**30)),
        (torch.bool, lambda t: t.all()),
    ],
)
def test_mock_poisons_un_replayed_outputs(dtype, check):
    with cuda_mock.patched_torch_cuda():
        x = torch.zeros(8, dtype=dtype)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x.clone()
        assert check(y)
        g.replay()
        assert torch.equal(y, x)


def test_mock_op_after_invalidation_inside_capture_fails():
    with cuda_mock.patched_torch_cuda():
        x = torch.ones(4)
        g = torch.cuda.CUDAGraph()
        with pytest.raises(CUDA_ERROR_TYPE, match=CAPTURE_INVALIDATED):
            with torch.cuda.graph(g):
                with pytest.raises(CUDA_ERROR_TYPE, match=CAPTURE_UNSUPPORTED):
                    x.sum().item()
                with pytest.raises(CUDA_ERROR_TYPE, match=CAPTURE_INVALIDATED):
                    x * 2


def test_mock_blocking_pinned_copy_inside_capture_is_a_sync():
    with cuda_mock.patched_torch_cuda():
        host = cuda_mock.host_buffer(torch.ones(4), pinned=True)
        dev = torch.zeros(4)
        g = torch.cuda.CUDAGraph()
        with pytest.raises(CUDA_ERROR_TYPE, match=CAPTURE_INVALIDATED):
            with torch.cuda.graph(g):
                dev.copy_(host)


def test_mock_pinned_host_to_device_via_to_is_recorded():
    with cuda_mock.patched_torch_cuda():
        host = cuda_mock.host_buffer(torch.ones(4), pinned=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dev = host.to("cuda", non_blocking=True)
            y = dev + 1
        host.fill_(4.0)
        g.replay()
        assert y.tolist() == [5.0] * 4
        pageable = cuda_mock.host_buffer(torch.ones(4), pinned=False)
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            with pytest.raises(RuntimeError, match=HOST_COPY_RE):
                pageable.to("cuda", non_blocking=True)


def test_mock_graph_does_not_keep_callers_tensor_objects_alive():
    import weakref

    with cuda_mock.patched_torch_cuda():
        meta = torch.ones(4)
        ref = weakref.ref(meta)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = meta * 2
        del meta
        gc.collect()
        assert ref() is None  # liveness checks on the caller's objects still work
        g.replay()
        assert y.tolist() == [2.0] * 4


def test_a_pool_that_dies_in_one_cycle_with_its_graph_and_tensors_is_erased():
    # A manager holding its pool, its graphs and their outputs usually dies as
    # one reference cycle.  Its blocks are free then (no user storage is left)
    # and empty_cache must erase the pool: the pool id names a fresh pool, as
    # it does on a GPU once the memory is gone.
    from cgsim.cuda_mock import _memory

    class Manager:
        pass

    with cuda_mock.patched_torch_cuda():
        x = torch.ones(256)
        pool = torch.cuda.graph_pool_handle()
        m = Manager()
        m.me, m.graph = m, torch.cuda.CUDAGraph()
        with torch.cuda.graph(m.graph, pool=pool):
            m.out = x * 2
        del m
        gc.collect()
        torch.cuda.empty_cache()
        assert pool not in _memory._released
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            y = x * 3
        g.replay()
        assert y.tolist() == [3.0] * 256


def test_leaving_the_mock_discards_an_unended_capture():
    with pytest.warns(RuntimeWarning, match="still under way"):
        with cuda_mock.patched_torch_cuda():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(torch.cuda.Stream()):
                g.capture_begin()
    x = torch.ones(2)
    assert (x + 1).tolist() == [2.0, 2.0]  # computed, not recorded
    with cuda_mock.patched_torch_cuda():
        assert not torch.cuda.is_current_stream_capturing()


def test_capture_into_released_pool_with_live_blocks_raises(graph_backend):
    """Measured on an H200 (torch 2.11): once every graph of a pool is gone but a
    tensor allocated from it is still alive, capturing into that pool again trips
    the caching allocator's assertion; after the tensor is freed it works."""
    b = graph_backend
    cuda = b.cuda
    pool = cuda.graph_pool_handle()
    x = torch.ones(16, device=b.device)
    g = cuda.CUDAGraph()
    with cuda.graph(g, pool=pool):
        y = x * 2
    del g
    with pytest.raises(RuntimeError, match=r"use_count > 0 INTERNAL ASSERT FAILED"):
        g2 = cuda.CUDAGraph()
        with cuda.graph(g2, pool=pool):
            x * 3
    del y, g2
    g3 = cuda.CUDAGraph()
    with cuda.graph(g3, pool=pool):
        w = x * 4
    g3.replay()
    assert torch.equal(w.cpu(), torch.full((16,), 4.0))


def _capture_doubling(cuda, pool, x, stream):
    # CUDAGraph.capture_begin directly, as vLLM's breakable wrapper captures:
    # no torch.cuda.graph(), so no empty_cache on the way in.
    g = cuda.CUDAGraph()
    with cuda.stream(stream):
        g.capture_begin(pool=pool)
        y = x * 2
        g.capture_end()
    return g, y


def test_capture_begin_into_a_released_pool_without_empty_cache_raises():
    """Seen on an H200 (torch 2.11) with vLLM's breakable wrapper, which skips
    its empty_cache while gc is disabled: after release_graphs, the next
    capture_begin into the same pool tripped use_count > 0 although every
    block of the pool was free (one 2 MiB segment, all inactive); the same
    sequence in a bare script raised it too.  Mock only: on a GPU the failed
    capture_begin leaves the stream recording to the pool ("beginAllocateToPool:
    already recording to mempool_id" at the next capture on it)."""
    with cuda_mock.patched_torch_cuda():
        cuda = torch.cuda
        pool = cuda.graph_pool_handle()
        x = torch.ones(16)
        side = cuda.Stream()
        g, y = _capture_doubling(cuda, pool, x, side)
        del g, y
        g2 = cuda.CUDAGraph()
        with cuda.stream(side):
            with pytest.raises(RuntimeError, match=r"use_count > 0 INTERNAL ASSERT FAILED"):
                g2.capture_begin(pool=pool)


def test_capture_begin_after_device_empty_cache_only_trips_the_host_allocator():
    """Measured on an H200 (torch 2.11): capture_begin into a pool id whose only
    graph is gone, after torch.cuda.empty_cache, trips the pinned-host
    allocator's assertion (CachingHostAllocator.h:773), although the capture
    pinned no memory: that allocator registers a pool per id at every
    capture_begin and only its own empty_cache erases it.  Mock only, as
    above (on a GPU the failed capture_begin leaves the device side recording)."""
    if not cuda_mock._memory.HOST_GRAPH_POOLS:
        pytest.skip(f"torch {torch.__version__} predates the host allocator's graph pools (2.11)")
    with cuda_mock.patched_torch_cuda():
        cuda = torch.cuda
        pool = cuda.graph_pool_handle()
        side = cuda.Stream()
        g, y = _capture_doubling(cuda, pool, torch.ones(16), side)
        del g, y
        cuda.empty_cache()
        g2 = cuda.CUDAGraph()
        with cuda.stream(side):
            with pytest.raises(RuntimeError, match=r"CachingHostAllocator.h.*use_count > 0|use_count > 0.*CachingHostAllocator"):
                g2.capture_begin(pool=pool)


def test_capture_begin_after_both_empty_caches_works(graph_backend):
    """The same re-capture with the host cache emptied as well works (H200,
    torch 2.11), and so does torch.cuda.graph(), which empties both on entry."""
    b = graph_backend
    cuda = b.cuda
    pool = cuda.graph_pool_handle()
    x = torch.ones(16, device=b.device)
    side = cuda.Stream()
    g, y = _capture_doubling(cuda, pool, x, side)
    del g, y
    cuda.empty_cache()
    # torch.accelerator.empty_host_cache is newer than torch 2.11
    (getattr(torch.accelerator, "empty_host_cache", None) or torch._C._host_emptyCache)()
    g2, y2 = _capture_doubling(cuda, pool, x, side)
    g2.replay()
    assert torch.equal(y2.cpu(), torch.full((16,), 2.0))
    del g2, y2
    g3 = cuda.CUDAGraph()
    with cuda.graph(g3, pool=pool):
        w = x * 4
    g3.replay()
    assert torch.equal(w.cpu(), torch.full((16,), 4.0))


def test_graph_destroyed_during_another_capture_invalidates_it(graph_backend):
    """Measured on an H200: a graph freed while another capture is under way
    (Python's GC collecting an old graph mid-capture) invalidates that capture;
    leaving the block raises "operation failed due to a previous error during
    capture"."""
    import warnings

    b = graph_backend
    cuda = b.cuda
    x = torch.ones(8, device=b.device)
    old = cuda.CUDAGraph()
    with cuda.graph(old):
        x * 2
    g = cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match="operation failed due to a previous error during capture"):
            with cuda.graph(g):
                y = x + 1
                del old
                z = y * 3  # noqa: F841
    if b.name == "cuda":
        torch.cuda.synchronize()


def test_a_graph_left_from_an_earlier_installation_does_not_touch_a_later_capture():
    """Each installation of the mock is one launch's device (a process of its
    own on a GPU): a graph one leaves behind, collected during another's
    capture, is no error of the capturing engine."""
    with cuda_mock.patched_torch_cuda():
        old = torch.cuda.CUDAGraph()
        with torch.cuda.graph(old):
            torch.ones(8) * 2
    with cuda_mock.patched_torch_cuda():
        g = torch.cuda.CUDAGraph()
        x = torch.ones(8)
        with torch.cuda.graph(g):
            y = x + 1
            del old
        g.replay()
    assert torch.equal(y, torch.full((8,), 2.0))
