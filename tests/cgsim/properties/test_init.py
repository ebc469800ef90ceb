"""SPEC §4: the init properties (cgsim/properties/init.py) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cgsim.modes import AttentionSupport, CUDAGraphMode
from cgsim.properties import check_scenario
from cgsim.spec import expected_capture_order
from cgsim.trace import Candidates, Error, Trace, TraceHeader
from tests.cgsim.properties.hand_traces import (
    BASE,
    FD,
    PD,
    C,
    P,
    assert_holds,
    assert_violates,
    cap,
    good_trace,
    ids,
    is_,
    mutate,
    scenario,
)


# --------------------------------------------------------------------------
# CAND-ORDER
# --------------------------------------------------------------------------
def test_cand_order_holds():
    sc = scenario(C(breakable=True))
    assert_holds("CAND-ORDER", sc, good_trace(sc))


def test_cand_order_recomputed_differs():
    sc = scenario()
    t = mutate(good_trace(sc), is_(Candidates, phase="recomputed"),
               lambda c: replace(c, capture_descs=tuple(d for d in c.capture_descs if d != FD(8, 8, 1))))
    assert_violates("CAND-ORDER", sc, t, "recomputed vs initial", "FULL: missing", FD(8, 8, 1).short())


def test_cand_order_recomputed_candidate_lists_differ():
    sc = scenario()
    t = mutate(good_trace(sc), is_(Candidates, phase="recomputed"),
               lambda c: replace(c, candidates=tuple((k, tuple(reversed(v))) for k, v in c.candidates)))
    assert_violates("CAND-ORDER", sc, t, "candidate lists differ", "num_tokens=")


def test_cand_order_pr48822_bug_piecewise_built_as_if_not_breakable():
    cfg = C(breakable=True)
    sc = scenario(cfg)
    stale = expected_capture_order(C(breakable=False), "pr48822")  # PIECEWISE num_reqs None
    t = mutate(good_trace(sc), is_(Candidates, phase="initial"), lambda c: replace(c, capture_descs=stale))
    vs = assert_violates("CAND-ORDER", sc, t, "differ from the spec", "PIECEWISE: missing", PD(8, 8).short(),
                         "unexpected", PD(8).short(), "PR 48822")
    assert any("recomputed vs initial" in v.message for v in vs)  # recomputing on the final state disagrees too


# --------------------------------------------------------------------------
# CAND-BOUNDS
# --------------------------------------------------------------------------
def test_cand_bounds_holds():
    sc = scenario(C(decode_query_len=3, max_num_reqs=4, capture_sizes=(2, 4, 8, 12)))
    assert_holds("CAND-BOUNDS", sc, good_trace(sc))


@pytest.mark.parametrize("bad,words", [
    (FD(16, 8), ("num_tokens 16 outside 1..8",)),
    (FD(4, 6), ("num_reqs 6 > min(num_tokens 4",)),
    (FD(6, 2, 2), ("num_reqs x uniform_token_count = 2 x 2, has 6",)),
    (FD(8, 8, 1), ("appears 2 times",)),
])
def test_cand_bounds_violations(bad, words):
    sc = scenario()
    t = mutate(good_trace(sc), is_(Candidates, phase="initial"), lambda c: replace(c, capture_descs=c.capture_descs + (bad,)))
    assert_violates("CAND-BOUNDS", sc, t, bad.short(), *words)


def test_cand_bounds_candidate_list_holds_foreign_descriptor():
    sc = scenario()
    t = mutate(good_trace(sc), is_(Candidates, phase="initial"),
               lambda c: replace(c, candidates=(((8, 0), (FD(4, 4, 1),)),) + c.candidates[1:]))
    assert_violates("CAND-BOUNDS", sc, t, "candidate list (num_tokens=8, lora=0)", "fewer tokens than the key")


# --------------------------------------------------------------------------
# DECODE-LENGTHS
# --------------------------------------------------------------------------
DYN = C(decode_query_len=3, spec_schedule=((1, 2, 2), (3, 8, 1)), capture_sizes=(1, 2, 4, 8, 16))


def test_decode_lengths_holds_with_dynamic_schedule():
    sc = scenario(DYN)
    assert_holds("DECODE-LENGTHS", sc, good_trace(sc))


def test_decode_lengths_schedule_ignored():
    sc = scenario(DYN)
    static = good_trace(scenario(C(decode_query_len=3, capture_sizes=(1, 2, 4, 8, 16))))  # graphs for q=3 only
    assert_violates("DECODE-LENGTHS", sc, static, "no FULL decode graph for query length(s) [2]",
                    "the scheduler produces [2, 3]", "dynamic schedule")


def test_decode_lengths_length_never_scheduled():
    sc = scenario(BASE)
    t = good_trace(scenario(C(decode_query_len=2)))
    assert_violates("DECODE-LENGTHS", sc, t, "query length(s) [2] the scheduler never produces", "uniform=2")


def test_decode_lengths_does_not_apply_to_varlen_or_plain_full():
    for cfg in (C(varlen_decode=True), C(mode=CUDAGraphMode.FULL)):
        sc = scenario(cfg)
        assert "DECODE-LENGTHS" not in check_scenario(sc, good_trace(sc)).checked


# --------------------------------------------------------------------------
# INIT-TOTAL
# --------------------------------------------------------------------------
def test_init_total_holds():
    sc = scenario(DYN)
    assert_holds("INIT-TOTAL", sc, good_trace(sc))


def test_init_total_build_crash_on_valid_config():
    sc = scenario()
    t = Trace("test", "mock", events=[Error(0, "build", "crash", "AttributeError", "'NoneType' has no attribute 'breakable'")])
    assert_violates("INIT-TOTAL", sc, t, "building the manager failed", "AttributeError", "FULL_AND_PIECEWISE")


def test_init_total_rejected_config_may_fail_to_build():
    sc = scenario(C(mode=CUDAGraphMode.FULL, attention_support=AttentionSupport.NEVER))
    t = Trace("test", "mock", events=[Error(0, "build", "crash", "ModeResolutionError", "needs full graphs")])
    assert_holds("INIT-TOTAL", sc, t)
    hung = Trace("test", "mock", events=[Error(0, "build", "timeout", "TimeoutError", "hung")])
    assert_violates("INIT-TOTAL", sc, hung, "timeout")


def test_init_total_insane_descriptor():
    sc = scenario()
    bad = FD(8, 2, 4)  # uniform 4 > the largest decode query length 1
    t = mutate(good_trace(sc), is_(Candidates, phase="initial"), lambda c: replace(c, capture_descs=c.capture_descs + (bad,)))
    assert_violates("INIT-TOTAL", sc, t, bad.short(), "uniform_token_count 4 outside 1..1")


# --------------------------------------------------------------------------
# MODE-RESOLUTION
# --------------------------------------------------------------------------
def test_mode_resolution_holds_inkling_seed():
    cfg = C(mode=CUDAGraphMode.PIECEWISE, attention_support=AttentionSupport.UNIFORM_BATCH)
    sc = scenario(cfg)
    t = good_trace(sc)
    assert t.resolved_mode == P
    assert_holds("MODE-RESOLUTION", sc, t)


def test_mode_resolution_wrong_mode():
    cfg = C(attention_support=AttentionSupport.UNIFORM_SINGLE_TOKEN_DECODE, decode_query_len=2)
    sc = scenario(cfg)
    t = good_trace(sc)
    t = Trace.from_header(replace(t.header, resolved_mode=CUDAGraphMode.FULL_AND_PIECEWISE), t.events, t.metadata)
    assert_violates("MODE-RESOLUTION", sc, t, "resolved to FULL_AND_PIECEWISE, expected PIECEWISE",
                    "needs attention support UNIFORM_BATCH > declared UNIFORM_SINGLE_TOKEN_DECODE")


def test_mode_resolution_rejected_config_resolved_anyway():
    sc = scenario(C(mode=CUDAGraphMode.FULL, attention_support=AttentionSupport.NEVER))
    t = Trace.from_header(TraceHeader("test", "mock", resolved_mode=CUDAGraphMode.FULL))
    assert_violates("MODE-RESOLUTION", sc, t, "the spec rejects this config", "resolved it to FULL")


def test_timeout_while_building_counts_for_init_total():
    # The runner stamps a timeout with the workload's phase, "capture" before any step ran.
    sc = scenario(BASE, cap())
    t = Trace("test", "mock", events=[Error(0, "capture", "timeout", "ScenarioTimeout", "scenario exceeded its 5s timeout")])
    verdict = check_scenario(sc, t)
    # A hang is a hang wherever it happens; while building it is INIT-TOTAL too.
    assert ids(verdict.violations) == {"INIT-TOTAL", "NO-HANG"}
    assert "timeout" in verdict.violations[0].message
