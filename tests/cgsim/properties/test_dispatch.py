"""SPEC §4: the dispatch properties (cgsim/properties/dispatch.py) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.properties import check_scenario, useless_descriptors
from cgsim.scenario import Step
from cgsim.spec import eager_descriptor
from cgsim.trace import (
    CaptureDone,
    CreateForwardFn,
    Dispatch,
    Forward,
    GraphStored,
    Replay,
    Trace,
)
from tests.cgsim.properties.hand_traces import (
    BASE,
    FD,
    GOOD_CONFIGS,
    PD,
    WORKFLOW,
    C,
    F,
    N,
    assert_holds,
    assert_violates,
    cap,
    disp,
    first,
    good_trace,
    ids,
    is_,
    mutate,
    rel,
    scenario,
)


def test_dispatch_properties_do_not_apply_without_dispatch_steps():
    sc = scenario(BASE, cap())
    verdict = check_scenario(sc, good_trace(sc))
    assert verdict.ok
    for pid in ("DISPATCH-SOUND", "DISPATCH-PRIORITY", "DISPATCH-COMPLETE", "DISPATCH-MINIMAL",
                "DISPATCH-ROUNDTRIP", "REPLAY-EQUALS-EAGER", "METADATA-LIVE", "RELEASE-RECAPTURE"):
        assert pid not in verdict.checked
    assert "CAPTURE-USEFUL" in verdict.checked


# --------------------------------------------------------------------------
# CAPTURE-USEFUL
# --------------------------------------------------------------------------
@pytest.mark.parametrize("name,config,ruleset", GOOD_CONFIGS[:6], ids=[c[0] for c in GOOD_CONFIGS[:6]])
def test_capture_useful_holds(name, config, ruleset):
    sc = scenario(config, ruleset=ruleset)
    assert_holds("CAPTURE-USEFUL", sc, good_trace(sc))


def test_capture_useful_dead_decode_graph():
    cfg = C(mode=CUDAGraphMode.FULL)
    sc = scenario(cfg)
    dead = FD(8, 8, 3)  # q=1: no batch the scheduler produces prefers a uniform-3 graph
    t = good_trace(sc)
    done = first(t, is_(CaptureDone))
    t.events[t.events.index(done):t.events.index(done)] = [
        CreateForwardFn(dead, True), Forward(dead, N, 1, False, 8, "capture", 0),
        CreateForwardFn(dead, False), Forward(dead, N, 2, True, 8, "capture", 0), GraphStored(dead, 0)]
    vs = assert_violates("CAPTURE-USEFUL", sc, t, dead.short(), "never the unique dispatch choice")
    assert len(vs) == 1


def test_capture_useful_keeps_piecewise_size_1():
    """FULL_AND_PIECEWISE with q=1: a 1-token decode goes to the FULL graph, but
    a 1-token prompt chunk has a prefill and goes to the PIECEWISE one."""
    cfg = C(capture_sizes=(1, 2, 4, 8))
    captured = [FD(s, s, 1) for s in (1, 2, 4, 8)] + [PD(s) for s in (1, 2, 4, 8)]
    assert set(useless_descriptors(cfg, captured)) == set()


def test_dead_graphs_of_the_first_spec():
    dyn = next(c for n, c, r in GOOD_CONFIGS if n == "dyn-spec")
    # q=3 for 1-2 requests, q=2 for 3-8 requests
    dyn_captured = [FD(t, t // q, q) for q in (2, 3) for t in (q, 2 * q, 3 * q, 4 * q, 6 * q, 8 * q) if t <= 16 and t // q <= 8]
    dyn_captured += [PD(s) for s in (1, 2, 4, 8, 16)]
    # Prompt chunks carry a prefill, so only pure decodes reach decode graphs.
    # q=3 with 3-4 requests is never scheduled; q=2 with 1-2 requests is, once
    # a batch of 3 or more shrinks (vLLM's scheduler: tests/cgsim/targets/vllm/test_vllm_scheduler.py).
    assert set(useless_descriptors(dyn, dyn_captured)) == {FD(9, 3, 3), FD(12, 4, 3)}
    varlen = next(c for n, c, r in GOOD_CONFIGS if n == "varlen")
    vdesc = lambda t: BatchDescriptor(F, t, t, None, 2)  # noqa: E731
    # varlen FULL decode graphs take every pure decode of up to 2 tokens, but a
    # 2-token prompt chunk has a prefill and runs on the PIECEWISE graph.
    assert set(useless_descriptors(varlen, [vdesc(2), vdesc(4), vdesc(8), PD(2), PD(4), PD(8)])) == set()


def test_capture_useful_dynamic_spec_decode_graph_for_unscheduled_length():
    # The schedule gives 2 spec tokens (q=3) only to batches of 1-2 requests:
    # a q=3 decode graph for 4 requests is never used.
    cfg = C(mode=CUDAGraphMode.FULL_DECODE_ONLY, decode_query_len=3, spec_schedule=((1, 2, 2), (3, 8, 1)),
                     capture_sizes=(3, 6, 12))
    captured = [FD(12, 4, 3), FD(6, 2, 3), FD(12, 6, 2)]
    dead = useless_descriptors(cfg, captured)
    assert set(dead) == {FD(12, 4, 3)}


# --------------------------------------------------------------------------
# DISPATCH-*
# --------------------------------------------------------------------------
def _redispatch(t: Trace, step: int, desc: BatchDescriptor, path: str | None = None) -> Trace:
    t = mutate(t, is_(Dispatch, step=step), lambda e: replace(e, desc=desc))
    return mutate(t, is_(Replay, step=step), lambda e: replace(e, desc=desc, path=path or e.path))


def test_dispatch_sound_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("DISPATCH-SOUND", sc, good_trace(sc))


def test_dispatch_sound_incompatible_descriptor():
    sc = scenario(BASE, cap(), disp(3, 1))
    t = _redispatch(good_trace(sc), 1, FD(4, 4, 1), "full")
    assert_violates("DISPATCH-SOUND", sc, t, FD(4, 4, 1).short(), "uniform_token_count 1 != batch's None", "query_lens=[3, 1]")


def test_dispatch_sound_full_without_stored_graph():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = mutate(good_trace(sc), is_(GraphStored, desc=FD(4, 4, 1)), lambda e: None)
    assert_violates("DISPATCH-SOUND", sc, t, "no graph is stored", FD(4, 4, 1).short())


def test_dispatch_sound_piecewise_without_runner():
    sc = scenario(BASE, cap(), disp(3, 1))
    t = good_trace(sc)
    t = Trace.from_header(replace(t.header, has_piecewise_runner=False), t.events, t.metadata)
    assert_violates("DISPATCH-SOUND", sc, t, "nothing runs piecewise graphs", PD(4).short())


def test_dispatch_priority_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("DISPATCH-PRIORITY", sc, good_trace(sc))


def test_dispatch_priority_piecewise_over_full():
    sc = scenario(BASE, cap(), disp(1, 1))
    t = _redispatch(good_trace(sc), 1, PD(2), "piecewise")
    assert_violates("DISPATCH-PRIORITY", sc, t, PD(2).short(), "captured FULL", FD(2, 2, 1).short())


def test_dispatch_complete_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("DISPATCH-COMPLETE", sc, good_trace(sc))


def test_dispatch_complete_eager_fallback():
    sc = scenario(BASE, cap(), disp(3, 1))
    b = Batch((3, 1))
    t = _redispatch(good_trace(sc), 1, eager_descriptor(b, (0,)), "eager")
    assert_violates("DISPATCH-COMPLETE", sc, t, "ran eagerly", "query_lens=[3, 1]", PD(4).short())


def test_dispatch_minimal_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("DISPATCH-MINIMAL", sc, good_trace(sc))


def test_dispatch_minimal_pads_too_much():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = _redispatch(good_trace(sc), 1, FD(8, 8, 1))
    assert_violates("DISPATCH-MINIMAL", sc, t, FD(8, 8, 1).short(), "(5, 5)", FD(4, 4, 1).short(), "(1, 1)")


def test_dispatch_roundtrip_holds():
    sc = scenario(BASE, cap(), disp(1, 1, 1, 1), disp(3, 1), disp(2, 2, 2, 2))
    assert_holds("DISPATCH-ROUNDTRIP", sc, good_trace(sc))


def test_dispatch_roundtrip_allows_full_with_request_padding():
    # varlen FULL (8 tokens, 8 reqs, max_q 2) over the exact PIECEWISE 8: same tokens, higher priority.
    sc = scenario(C(varlen_decode=True, decode_query_len=2), cap(), disp(2, 2, 2, 2))
    t = good_trace(sc)
    assert first(t, is_(Dispatch)).desc.cg_mode == F
    assert_holds("DISPATCH-ROUNDTRIP", sc, t)


def test_dispatch_roundtrip_higher_priority_pads_tokens_only_as_the_oracle_chooses():
    # A 4-token batch with an exact PIECEWISE graph and two larger FULL ones:
    # the smaller FULL graph is what DISPATCH-PRIORITY and the oracle ask for
    # (FULL over PIECEWISE, then least padding), so it is no roundtrip
    # failure; the larger one is.
    sc = scenario(C(mode=CUDAGraphMode.FULL_AND_PIECEWISE), cap(), disp(3, 1))
    t = mutate(good_trace(sc), lambda e: True, lambda e: e)
    t.events.insert(0, GraphStored(FD(8, 8), 0))  # FULL mixed graphs of 8 and 6 tokens
    t.events.insert(0, GraphStored(FD(6, 6), 0))
    assert_violates("DISPATCH-ROUNDTRIP", sc, _redispatch(t, 1, FD(8, 8), "full"), "exactly the shape of captured",
                    PD(4).short(), FD(8, 8).short())
    assert_holds("DISPATCH-ROUNDTRIP", sc, _redispatch(t, 1, FD(6, 6), "full"))


def test_dispatch_roundtrip_exact_shape_goes_elsewhere():
    sc = scenario(BASE, cap(), disp(1, 1, 1, 1))
    t = _redispatch(good_trace(sc), 1, FD(8, 8, 1))
    assert_violates("DISPATCH-ROUNDTRIP", sc, t, "exactly the shape of captured", FD(4, 4, 1).short(), FD(8, 8, 1).short())


def test_before_capture_holds():
    sc = scenario(BASE, disp(1), cap(), disp(1), rel(), disp(1))
    t = good_trace(sc)
    assert [d.desc.cg_mode for d in t.of(Dispatch)] == [N, F, N]
    assert_holds("BEFORE-CAPTURE", sc, t)


def test_before_capture_dispatch_returns_graph_before_capture():
    sc = scenario(BASE, disp(1, 1), cap())
    t = _redispatch(good_trace(sc), 0, FD(2, 2, 1))
    assert_violates("BEFORE-CAPTURE", sc, t, "before any successful capture", FD(2, 2, 1).short(), "reqs=2 tokens=2")


def test_before_capture_dispatch_returns_graph_after_release():
    sc = scenario(BASE, cap(), rel(), disp(1, 1))
    t = _redispatch(good_trace(sc), 2, FD(2, 2, 1))
    assert_violates("BEFORE-CAPTURE", sc, t, "after a release", FD(2, 2, 1).short())


def test_before_capture_flag_not_set_after_capture():
    sc = scenario()
    t = mutate(good_trace(sc), is_(CaptureDone), lambda e: replace(e, captured_flag=False))
    assert_violates("BEFORE-CAPTURE", sc, t, "not marked captured")


def test_dispatch_stable_compares_a_dispatch_with_the_sweep_after_its_capture():
    from dataclasses import replace as _replace

    from cgsim.runner import run_scenario
    from cgsim.trace import Sweep

    sc = scenario(BASE, cap(), disp(1, 1), disp(1, 1, 1))
    trace = run_scenario(sc)
    verdict = check_scenario(sc, trace)
    assert "DISPATCH-STABLE" in verdict.checked and "DISPATCH-STABLE" not in ids(verdict.violations)
    # The sweep after the capture said something else for the batch of step 1.
    shape = sc.steps[1].batch.shape
    events = []
    for e in trace.events:
        if isinstance(e, Sweep) and e.step == 0:
            i = e.batches.index(shape)
            other = next(d for d in e.descs if d != e.descs[i])
            e = _replace(e, descs=e.descs[:i] + (other,) + e.descs[i + 1:])
        events.append(e)
    changed = Trace.from_header(trace.header, events, trace.metadata)
    stable = [v for v in check_scenario(sc, changed).violations if v.property == "DISPATCH-STABLE"]
    assert stable and "in the dispatch sweep after the capture at step 0" in stable[0].message


def test_dispatch_stable_tells_prefill_splits_by_their_longest_request():
    # vLLM 0.20-0.27 pass every batch's longest request to their uniform count,
    # so [2, 2] + prefill and [3, 1] + prefill are different questions there:
    # a sweep answer for the one says nothing about the other.
    from dataclasses import replace as _replace

    from cgsim.runner import run_scenario
    from cgsim.trace import Sweep

    sc = scenario(BASE, cap(), Step.dispatch(Batch((2, 2), has_prefill=True)))
    trace = run_scenario(sc)
    shape = sc.steps[1].batch.shape
    events = []
    for e in trace.events:
        if isinstance(e, Sweep) and e.step == 0:
            step_desc = next(x.desc for x in trace.events if isinstance(x, Dispatch) and x.step == 1)
            other = next(d for d in e.descs if d != step_desc)
            split = _replace(shape, max_query_len=3)
            e = _replace(e, batches=e.batches + (split,), descs=e.descs + (other,))
        events.append(e)
    changed = Trace.from_header(trace.header, events, trace.metadata)
    assert "DISPATCH-STABLE" not in ids(check_scenario(sc, changed).violations)
