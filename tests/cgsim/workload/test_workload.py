"""The toy workload: its outputs depend on every metadata field a capture bug
can get wrong, a capture of it on the mock records one kernel per stage and
replays like eager, and its caches (kernel results, layouts, buffer
contents, eager references) are invisible."""

from __future__ import annotations

import gc

import pytest
import torch

from cgsim.backends import get_backend
from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import AttentionSupport, CUDAGraphMode
from cgsim.trace import Forward, PiecewiseCapture, Trace
from cgsim.workload import harness, model
from cgsim.workload.context import get_forward_context, set_forward_context
from cgsim.workload.harness import RequestLayout, Workload

N = CUDAGraphMode.NONE


@pytest.fixture
def mock():
    # These tests capture by hand, so they hold Python's GC off as engines do
    # around a capture: a graph left in a reference cycle by an earlier test
    # and collected mid-capture invalidates it (the mock does what an H200
    # did), and a test failed that way once in a CI run.
    backend = get_backend("mock")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with backend.activate(), torch.inference_mode():
            yield backend
    finally:
        if was_enabled:
            gc.enable()


def _workload(backend, support=AttentionSupport.ALWAYS, breakable=False, lora_cases=(0,), seed=0) -> Workload:
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(8,), max_num_reqs=4, lora_cases=lora_cases,
                        attention_support=support, breakable=breakable)
    return Workload(cfg, backend, Trace("t", backend.name), seed=seed, max_batch_tokens=16, max_batch_reqs=4)


def _forward(w: Workload, batch: Batch, num_reqs=None, num_tokens=None, mql=None, for_capture=False, lora_case=None):
    num_reqs = num_reqs or batch.num_reqs
    num_tokens = num_tokens or batch.num_tokens
    layout = w.load_batch(batch, num_tokens)
    md = w.prepare_attn(layout, num_reqs, num_tokens, mql, for_capture=for_capture)
    case = batch.num_active_loras if lora_case is None else lora_case
    with set_forward_context(md, num_tokens, N, lora_case=case):
        return w.model.run_stages(get_forward_context())[: batch.num_tokens].clone(), md


def _changes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() > 1e-3)


# ------------------------------------------------------- outputs depend on metadata


@pytest.mark.parametrize("field", ["query_start_loc", "seq_lens", "slot_mapping"])
def test_real_rows_depend_on_each_metadata_buffer(mock, field):
    w = _workload(mock)
    batch = Batch((3, 2, 3))
    good, md = _forward(w, batch)
    buf = getattr(md, field)
    if field == "query_start_loc":
        buf[1] = 1  # first request now ends after one token
    elif field == "seq_lens":
        buf[0] += 5
    else:
        buf[0] = (buf[0] + 7) % (model.KV_ROWS - 1)
    with set_forward_context(md, batch.num_tokens, N, lora_case=0):
        bad = w.model.run_stages(get_forward_context())[: batch.num_tokens]
    assert _changes(good, bad), f"changing {field} left every real row unchanged"


def test_real_rows_depend_on_max_query_len_under_the_uniform_kernel(mock):
    w = _workload(mock, support=AttentionSupport.UNIFORM_BATCH)
    batch = Batch((2, 2, 2))
    a, md = _forward(w, batch, mql=2, for_capture=True)
    assert md.kernel == "uniform"
    b, _ = _forward(w, batch, mql=3, for_capture=True)
    assert _changes(a, b)


@pytest.mark.parametrize("support", [AttentionSupport.UNIFORM_BATCH, AttentionSupport.UNIFORM_SINGLE_TOKEN_DECODE])
def test_real_rows_depend_on_the_kernel_kind(mock, support):
    w = _workload(mock, support=support)
    batch = Batch((1, 3))  # not uniform: only the varlen kernel is right for it
    varlen, _ = _forward(w, batch, mql=3)
    graph_kernel, md = _forward(w, batch, mql=3, for_capture=True)
    assert md.kernel != "varlen"
    assert _changes(varlen, graph_kernel)


def test_real_rows_depend_on_the_lora_case(mock):
    w = _workload(mock, lora_cases=(0, 1, 2))
    batch = Batch((2, 2), num_active_loras=2)
    full, _ = _forward(w, batch, lora_case=2)
    fewer, _ = _forward(w, batch, lora_case=1)
    none, _ = _forward(w, batch, lora_case=0)
    assert _changes(full, fewer) and _changes(fewer, none)


def test_padding_does_not_change_real_rows(mock):
    w = _workload(mock)
    batch = Batch((3, 2))
    exact, _ = _forward(w, batch)
    padded, _ = _forward(w, batch, num_reqs=4, num_tokens=8)
    assert float((exact - padded).abs().max()) <= harness.OUTPUT_TOLERANCE


# ------------------------------------------------------------ capture on the mock


def test_full_capture_records_one_kernel_per_stage_and_replays_like_eager(mock):
    w = _workload(mock)
    batch = Batch((3, 1))
    layout = w.load_batch(batch, 8)
    md = w.prepare_attn(layout, 4, 8, 4, for_capture=True)
    g = mock.cuda.CUDAGraph()
    with set_forward_context(md, 8, N, lora_case=0):
        eager = w.model.run_stages(get_forward_context()).clone()
        with mock.cuda.graph(g):
            out = w.model.run_stages(get_forward_context())
    assert g.recorded_ops == [f"cgsim.toy_{s.name.rstrip('0123456789')}.default" for s in w.model.stages]
    assert torch.isnan(out).all()  # nothing computed before the first replay
    g.replay()
    assert torch.equal(out, eager)
    # A new batch written into the same buffers is what the replay reads.
    other = Batch((2, 2))
    w.at(3, w.phase)
    layout = w.load_batch(other, 8)
    w.prepare_attn(layout, 4, 8, 4, for_capture=True)
    g.replay()
    assert _changes(out[:4], eager[:4])


def test_graph_reads_the_old_buffers_after_a_rebind(mock):
    w = _workload(mock)
    batch = Batch((2, 2))
    layout = w.load_batch(batch, 4)
    md = w.prepare_attn(layout, 2, 4, 2, for_capture=True)
    g = mock.cuda.CUDAGraph()
    with set_forward_context(md, 4, N, lora_case=0):
        with mock.cuda.graph(g):
            out = w.model.run_stages(get_forward_context())
    g.replay()
    captured = out.clone()
    w.builder.allocate_buffers()  # rebind: the graph keeps reading the old memory
    w.at(5, w.phase)
    layout = w.load_batch(Batch((1, 3)), 4)
    w.prepare_attn(layout, 2, 4, 2, for_capture=True)
    g.replay()
    fresh, _ = _forward(w, Batch((1, 3)), num_reqs=2, num_tokens=4, mql=2, for_capture=True)
    assert _changes(out, fresh)  # stale metadata, new token inputs: not the right answer
    assert _changes(out, captured)  # but the token inputs are read live


def test_illegal_op_in_target_code_around_the_kernels_still_invalidates(mock):
    w = _workload(mock)
    layout = w.load_batch(Batch((2,)), 2)
    md = w.prepare_attn(layout, 1, 2, 2, for_capture=True)
    g = mock.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="operation failed due to a previous error during capture"):
        with set_forward_context(md, 2, N, lora_case=0):
            with mock.cuda.graph(g):
                out = w.model.run_stages(get_forward_context())
                with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
                    out.sum().item()


# ------------------------------------------------------------------ the caches


def test_kernel_results_are_remembered_by_exact_input_bytes_and_handed_out_fresh(mock):
    x = torch.randn(5, model.HIDDEN)
    w = model._make_weights(2, 0, 1, torch.device("cpu"))
    layer = w["layers"][0]
    lora_ids = torch.tensor([0, 1, 0, 1, 1])
    args = (x, layer["w1"], layer["w2"], w["lora_tables"], lora_ids, 1)
    first = model._mlp_op(*args)
    again = model._mlp_op(*args)
    assert torch.equal(first, again) and first.data_ptr() != again.data_ptr()
    first.zero_()  # a caller writing into its result does not reach the memo
    assert torch.equal(model._mlp_op(*args), again)
    assert torch.equal(again, model._mlp_kernel(*args))  # same as computing it
    x[0, 0] += 1.0  # other bytes: computed again
    assert torch.equal(model._mlp_op(*args), model._mlp_kernel(*args))
    assert not torch.equal(model._mlp_op(*args), again)


def test_layouts_and_buffer_contents_are_shared_and_exact(mock):
    batch = Batch((3, 1), num_active_loras=1)
    a = RequestLayout.of(batch, salt=7)
    assert RequestLayout.of(Batch((3, 1), num_active_loras=1), salt=7) is a
    fresh = RequestLayout(batch, salt=7)
    assert torch.equal(a.input_ids, fresh.input_ids) and a.slots == fresh.slots
    w = _workload(mock)
    w.load_batch(batch, 6)
    md = w.prepare_attn(a, 3, 6, None, for_capture=False)
    b = w.builder
    assert b.query_start_loc.tolist() == [0, 3, 4, 4, 4]  # padding requests are empty
    assert b.seq_lens.tolist() == [a.seq_lens[0], a.seq_lens[1], 0, 0]
    assert b.slot_mapping[:4].tolist() == a.slots and set(b.slot_mapping[4:].tolist()) == {-1}
    assert md.seq_lens.data_ptr() == b.seq_lens.data_ptr()
    assert w.buffers.lora_ids[:6].tolist() == a.lora_ids.tolist() + [0, 0]


def test_builder_writes_a_buffer_rebound_on_its_own_where_it_now_is(mock):
    w = _workload(mock)
    b = w.builder
    b.seq_lens = torch.full_like(b.seq_lens, 99)
    layout = RequestLayout.of(Batch((2, 2)), salt=1)
    md = w.prepare_attn(layout, 2, 4, None, for_capture=False)
    assert md.seq_lens.tolist() == layout.seq_lens


def test_eager_reference_is_remembered_and_handed_out_fresh(mock):
    w = _workload(mock, seed=3)
    w.at(4, w.phase)
    batch = Batch((2, 3))
    first = w.eager_reference(batch)
    first.add_(1.0)
    again = w.eager_reference(batch)
    harness._EAGER.clear()
    model._memo.clear()
    assert torch.equal(again, w.eager_reference(batch))
    assert not torch.equal(first, again)


def test_the_run_says_where_it_is_in_one_call_and_a_phase_the_model_has_no_rules_for_is_refused():
    from cgsim.backends import get_backend
    from cgsim.config import ManagerConfig
    from cgsim.trace import Forward, PiecewiseCapture, Trace
    from cgsim.workload.harness import Workload

    w = Workload(ManagerConfig(mode="FULL", capture_sizes=(2,), max_num_reqs=2), get_backend("mock"), Trace("t", "mock"))
    w.at(3, "runtime")
    assert (w.step, w.phase) == (3, "runtime")
    with pytest.raises(ValueError, match="phase 'replay' is not one of capture, runtime"):
        w.at(4, "replay")
    assert (w.step, w.phase) == (3, "runtime")


# ------------------------------------------------------------ graph memory on the mock


def _capture_forwards(mock, w: Workload, desc, forwards: int, extra_rows: int = 0):
    """Capture ``forwards`` model forwards (micro-batches) of ``desc`` into one
    graph, then ``extra_rows`` rows of scratch outside the model."""
    layout = w.load_batch(Batch((2, 2)), desc.num_tokens)
    md = w.prepare_attn(layout, 2, desc.num_tokens, 2, for_capture=True)
    w.at(0, "capture")
    w.current_desc = desc
    g = mock.cuda.CUDAGraph()
    with set_forward_context(md, desc.num_tokens, N, lora_case=0):
        with mock.cuda.graph(g):
            outs = [w.model_forward() for _ in range(forwards)]
            scratch = torch.zeros(extra_rows, model.HIDDEN) if extra_rows else None
    return g, outs, scratch


@pytest.mark.parametrize("forwards", [1, 2])
def test_the_model_forwards_share_of_a_full_capture_is_measured(mock, forwards):
    w = _workload(mock)
    desc = BatchDescriptor(CUDAGraphMode.FULL, 4, 2)
    g, outs, scratch = _capture_forwards(mock, w, desc, forwards, extra_rows=64)
    seen = w.capture_bytes(desc)
    assert seen == harness.CaptureBytes(g.pool(), g.memory.taken_bytes, seen.forward_bytes)
    # Every micro-batch's forward counts; the scratch outside the model does not.
    assert seen.graph_bytes - seen.forward_bytes == 64 * model.HIDDEN * 4
    one = _workload(mock)
    kept = _capture_forwards(mock, one, desc, 1)  # the graph lives while its bytes are read
    assert seen.forward_bytes == forwards * one.capture_bytes(desc).forward_bytes > 0
    del kept, outs, scratch


def test_a_manager_with_a_forward_of_its_own_is_not_measured(mock):
    w = _workload(mock)
    w.reference_forward = harness.EagerForward()
    desc = BatchDescriptor(CUDAGraphMode.FULL, 4, 2)
    g, _, _ = _capture_forwards(mock, w, desc, 1)
    assert w.capture_bytes(desc) == harness.CaptureBytes(g.pool(), g.memory.taken_bytes, None)
    w.forget_graphs()
    assert w.capture_bytes(desc) is None


def test_streams_are_numbered_per_trace_and_a_piecewise_capture_on_the_default_stream_is_cgsims_choice(mock):
    trace = Trace("t", mock.name)
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(8,), max_num_reqs=4)
    w = Workload(cfg, mock, trace, max_batch_tokens=16, max_batch_reqs=4)
    cuda = mock.cuda
    side, other = cuda.Stream(), cuda.Stream()
    assert [w.stream_token(s) for s in (cuda.default_stream(), other, side, other)] == [0, 1, 2, 1]
    layout = w.load_batch(Batch((4,)), 8)
    md = w.prepare_attn(layout, 1, 8, None, for_capture=False)
    key = (8, False, 0)
    for stream in (None, side):  # the engine on the default stream, then on a side stream of its own
        w.piecewise.clear()
        with cuda.stream(stream), set_forward_context(md, 8, CUDAGraphMode.PIECEWISE, key):
            w.model_forward()
    captures = trace.of(PiecewiseCapture)
    forwards = trace.of(Forward)
    assert [c.stream for c in captures] == [None, 2] and [f.stream for f in forwards] == [0, 2]
