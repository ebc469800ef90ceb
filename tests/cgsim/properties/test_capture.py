"""SPEC §4: the capture properties (cgsim/properties/capture.py) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cgsim.descriptors import BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.properties import check_scenario
from cgsim.properties.capture import captured_off_warmup_stream, replayed_off_step_stream
from cgsim.spec import expected_capture_order
from cgsim.trace import CaptureDone, CreateForwardFn, Error, Forward, GraphStored, PiecewiseCapture, Replay, Trace
from tests.cgsim.properties.hand_traces import (
    BASE,
    FD,
    PD,
    C,
    F,
    N,
    P,
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
    run,
    scenario,
)


# --------------------------------------------------------------------------
# CAPTURE-ORDER
# --------------------------------------------------------------------------
def test_capture_order_holds():
    sc = scenario(C(lora_cases=(0, 1)))
    assert_holds("CAPTURE-ORDER", sc, good_trace(sc))


def test_capture_order_full_before_piecewise():
    sc = scenario()
    order = expected_capture_order(BASE, "pr48822")
    full_first = [d for d in order if d.cg_mode == F] + [d for d in order if d.cg_mode == P]
    assert_violates("CAPTURE-ORDER", sc, good_trace(sc, full_first), "PIECEWISE", "captured after FULL", PD(8).short())


def test_capture_order_smallest_first():
    sc = scenario()
    order = expected_capture_order(BASE, "pr48822")
    ascending = sorted([d for d in order if d.cg_mode == P], key=lambda d: d.num_tokens) + [d for d in order if d.cg_mode == F]
    assert_violates("CAPTURE-ORDER", sc, good_trace(sc, ascending), PD(4).short(), "after the smaller", PD(2).short())


# --------------------------------------------------------------------------
# CAPTURE-ONCE
# --------------------------------------------------------------------------
def test_capture_once_holds():
    sc = scenario(BASE, cap(), rel(), cap())
    assert_holds("CAPTURE-ONCE", sc, good_trace(sc))


def test_capture_once_full_captured_twice():
    sc = scenario()
    t = good_trace(sc)
    f = first(t, lambda e: isinstance(e, Forward) and e.in_graph and e.desc == FD(4, 4, 1))
    t.events.insert(t.events.index(f), f)
    assert_violates("CAPTURE-ONCE", sc, t, FD(4, 4, 1).short(), "captured 2 times")


def test_capture_once_graph_not_stored():
    sc = scenario()
    t = mutate(good_trace(sc), is_(GraphStored, desc=FD(2, 2, 1)), lambda e: None)
    assert_violates("CAPTURE-ONCE", sc, t, FD(2, 2, 1).short(), "no graph was stored")


def test_capture_once_extra_graph_stored():
    sc = scenario()
    t = good_trace(sc)
    t.events.insert(t.events.index(first(t, is_(CaptureDone))), GraphStored(FD(6, 6, 1), 0))
    assert_violates("CAPTURE-ONCE", sc, t, "stored without a capture pass", "not in the manager's FULL capture list", FD(6, 6, 1).short())


# --------------------------------------------------------------------------
# WARMUP-FIRST
# --------------------------------------------------------------------------
def test_warmup_first_holds():
    sc = scenario(C(breakable=True))
    assert_holds("WARMUP-FIRST", sc, good_trace(sc))


def test_warmup_first_full_without_warmup():
    sc = scenario()
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.desc == FD(8, 8, 1) and not e.in_graph, lambda e: None)
    assert_violates("WARMUP-FIRST", sc, t, FD(8, 8, 1).short(), "inside a FULL graph before its warmup")


def test_warmup_first_piecewise_without_create():
    sc = scenario()
    t = mutate(good_trace(sc), is_(CreateForwardFn, desc=PD(4), warmup=True), lambda e: None)
    assert_violates("WARMUP-FIRST", sc, t, PD(4).short(), "as PIECEWISE before its warmup", "no create_forward_fn(warmup=True)")


# --------------------------------------------------------------------------
# FRESH-METADATA
# --------------------------------------------------------------------------
def test_fresh_metadata_holds_full_and_breakable_piecewise():
    sc = scenario(C(breakable=True))
    assert_holds("FRESH-METADATA", sc, good_trace(sc))


def _warmup_md(t: Trace, d: BatchDescriptor) -> int:
    return first(t, lambda e: isinstance(e, Forward) and e.desc == d and e.mode == N and not e.in_graph).metadata


def test_fresh_metadata_full_reuses_warmup_object():
    sc = scenario()
    t = good_trace(sc)
    w = _warmup_md(t, FD(4, 4, 1))
    t = mutate(t, lambda e: isinstance(e, Forward) and e.in_graph and e.desc == FD(4, 4, 1), lambda e: replace(e, metadata=w))
    assert_violates("FRESH-METADATA", sc, t, "FULL graph", FD(4, 4, 1).short(), f"warmup's metadata object #{w}")


def test_fresh_metadata_breakable_piecewise_shares_state():
    sc = scenario(C(breakable=True))
    t = good_trace(sc)
    w = _warmup_md(t, PD(8, 8))
    c = first(t, lambda e: isinstance(e, Forward) and e.mode == P and e.desc == PD(8, 8)).metadata
    t.metadata[c] = replace(t.metadata[c], state=t.metadata[w].state)
    assert_violates("FRESH-METADATA", sc, t, "breakable PIECEWISE capture", PD(8, 8).short(), "shares mutable state",
                    f"#{w}")


# --------------------------------------------------------------------------
# SKIP-ATTN
# --------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,ruleset", [(BASE, "pr48822"), (BASE, "vllm-0.32"), (C(breakable=True), "pr48822")])
def test_skip_attn_holds(cfg, ruleset):
    sc = scenario(cfg, ruleset=ruleset)
    assert_holds("SKIP-ATTN", sc, good_trace(sc))


def test_skip_attn_nonbreakable_piecewise_built_metadata_under_pr48822():
    sc = scenario()
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.mode == P, lambda e: replace(e, metadata=77))
    assert_violates("SKIP-ATTN", sc, t, "PIECEWISE capture forward", PD(8).short(), "built attention metadata #77")


def test_skip_attn_full_capture_skipped_attention():
    sc = scenario()
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.in_graph, lambda e: replace(e, metadata=None))
    assert_violates("SKIP-ATTN", sc, t, "FULL graph capture forward", FD(8, 8, 1).short(), "metadata None")


def test_skip_attn_piecewise_skipped_under_vllm_032():
    sc = scenario(ruleset="vllm-0.32")
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.mode == P, lambda e: replace(e, metadata=None))
    assert_violates("SKIP-ATTN", sc, t, "ruleset vllm-0.32 builds metadata", PD(8).short())


# --------------------------------------------------------------------------
# NO-ILLEGAL-OP and NO-CRASH
# --------------------------------------------------------------------------
def test_no_illegal_op_holds():
    sc = scenario()
    assert_holds("NO-ILLEGAL-OP", sc, good_trace(sc))


def test_no_illegal_op_reports_the_error():
    sc = scenario()
    t = good_trace(sc)
    t.events = t.events[:5] + [Error(0, "capture", "illegal-op", "RuntimeError", "operation not permitted when stream is capturing")]
    vs = assert_violates("NO-ILLEGAL-OP", sc, t, "during capture", "operation not permitted")
    assert vs[0].step == 0
    assert "NO-CRASH" not in ids(run(sc, t).violations)


def test_breakable_piecewise_capture_reported_in_graph():
    """The vLLM adapter marks a breakable PIECEWISE capture pass in_graph (its
    pieces are graphs): still a PIECEWISE capture, not a FULL one."""
    sc = scenario(C(mode=CUDAGraphMode.PIECEWISE, breakable=True))
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.mode == P, lambda e: replace(e, in_graph=True))
    verdict = check_scenario(sc, t)
    assert verdict.ok, "\n".join(map(str, verdict.violations))
    assert "FRESH-METADATA" in verdict.checked


# --------------------------------------------------------------------------
# CAPTURE-STREAM-CONSISTENT
# --------------------------------------------------------------------------
def test_capture_stream_predicates():
    assert captured_off_warmup_stream(1, 2)
    assert not captured_off_warmup_stream(1, 1)
    assert not captured_off_warmup_stream(None, 2) and not captured_off_warmup_stream(1, None)
    assert replayed_off_step_stream(0, (0, 2, 3, 2)) == (2, 3)
    assert replayed_off_step_stream(0, (0, 0)) == ()
    assert replayed_off_step_stream(None, (2,)) == ()


def test_capture_stream_consistent_holds_side_stream_capture_default_stream_replay():
    # vLLM's shape: warm-up and capture on graph_capture()'s side stream, replays on the current one.
    sc = scenario(C(breakable=True), cap(), disp(1, 1), disp(3))
    assert_holds("CAPTURE-STREAM-CONSISTENT", sc, good_trace(sc))


def test_capture_stream_full_graph_captured_on_another_stream():
    sc = scenario()
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.in_graph and e.desc == FD(4, 4, 1),
               lambda e: replace(e, stream=2))
    (v,) = assert_violates("CAPTURE-STREAM-CONSISTENT", sc, t, f"FULL graph for {FD(4, 4, 1).short()}",
                           "captured on stream 2", "warmup ran on stream 1")
    assert dict(v.facts)["warmed_on"] == 1 and dict(v.facts)["captured_on"] == 2


def test_capture_stream_piecewise_captured_on_another_stream():
    sc = scenario()
    t = mutate(good_trace(sc), is_(PiecewiseCapture, key=("pw", 4, None, 0)), lambda e: replace(e, stream=0))
    assert_violates("CAPTURE-STREAM-CONSISTENT", sc, t, f"piecewise graphs for {PD(4).short()}",
                    "captured on the default stream", "warmup ran on stream 1")


def test_capture_stream_no_claim_where_cgsim_chose_the_piecewise_stream():
    sc = scenario()
    t = mutate(good_trace(sc), lambda e: isinstance(e, PiecewiseCapture), lambda e: replace(e, stream=None))
    assert_holds("CAPTURE-STREAM-CONSISTENT", sc, t)


def test_capture_stream_replay_on_another_stream_than_the_step():
    sc = scenario(BASE, cap(), disp(1, 1))
    t = mutate(good_trace(sc), lambda e: isinstance(e, Replay) and e.path == "full",
               lambda e: replace(e, replay_streams=(3,)))
    (v,) = assert_violates("CAPTURE-STREAM-CONSISTENT", sc, t, "full replay", "ran on stream 3",
                           "the step ran on the default stream")
    assert dict(v.facts)["replay_streams"] == [3]


def test_capture_stream_no_replay_claim_where_streams_were_not_seen():
    sc = scenario(BASE, cap(), disp(1, 1))
    t = mutate(good_trace(sc), lambda e: isinstance(e, Replay),
               lambda e: replace(e, step_stream=None, replay_streams=(3,)))
    assert_holds("CAPTURE-STREAM-CONSISTENT", sc, t)
