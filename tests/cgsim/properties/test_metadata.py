"""SPEC §4: the metadata properties (cgsim/properties/metadata.py) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

from dataclasses import replace

from cgsim.modes import CUDAGraphMode
from cgsim.properties import check_scenario
from cgsim.trace import (
    CaptureDone,
    Dispatch,
    Forward,
    GraphStored,
    PiecewiseLookup,
    Release,
    Replay,
)
from tests.cgsim.properties.hand_traces import (
    BASE,
    FD,
    PD,
    C,
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
# METADATA-LIVE
# --------------------------------------------------------------------------
def test_metadata_live_holds():
    sc = scenario(C(breakable=True), cap(), disp(1, 1), disp(3, 1))
    assert_holds("METADATA-LIVE", sc, good_trace(sc))


def test_metadata_live_dead_metadata():
    sc = scenario(BASE, cap(), disp(1, 1))
    t = mutate(good_trace(sc), is_(Replay), lambda r: replace(r, metadata_alive=False))
    assert_violates("METADATA-LIVE", sc, t, "no longer alive", FD(2, 2, 1).short(), "reqs=2 tokens=2")


def test_metadata_live_rebound_buffers():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = good_trace(sc)
    r = first(t, is_(Replay))
    t.metadata[r.runtime_metadata] = replace(t.metadata[r.runtime_metadata], buffers=(901, 902, 999))
    assert_violates("METADATA-LIVE", sc, t, "rebound to new buffers [999]", FD(4, 4, 1).short())


# --------------------------------------------------------------------------
# PAD-CONSISTENT
# --------------------------------------------------------------------------
def test_pad_consistent_holds():
    sc = scenario(C(breakable=True), cap(), disp(1, 1, 1), disp(3, 1))
    assert_holds("PAD-CONSISTENT", sc, good_trace(sc))


def test_pad_consistent_unpadded_runtime_metadata():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = good_trace(sc)
    r = first(t, is_(Replay))
    t.metadata[r.runtime_metadata] = replace(t.metadata[r.runtime_metadata], num_reqs=3, num_tokens=3)
    assert_violates("PAD-CONSISTENT", sc, t, "num_reqs=4 num_tokens=4", "num_reqs=3 num_tokens=3", FD(4, 4, 1).short())


def test_pad_consistent_breakable_piecewise_unpadded_under_pr48822_only():
    cfg = C(breakable=True)
    for ruleset, judged in (("pr48822", True), ("vllm-0.32", False)):
        sc = scenario(cfg, cap(), disp(3, 1), ruleset=ruleset)
        t = good_trace(sc)
        r = first(t, is_(Replay))
        assert r.path == "piecewise"
        t.metadata[r.runtime_metadata] = replace(t.metadata[r.runtime_metadata], num_reqs=2, num_tokens=4)
        t.metadata[r.graph_metadata] = replace(t.metadata[r.graph_metadata], num_reqs=4, num_tokens=4)
        if judged:
            assert_violates("PAD-CONSISTENT", sc, t, "num_reqs=4 num_tokens=4", "num_reqs=2", r.desc.short())
        else:
            assert "PAD-CONSISTENT" not in ids(run(sc, t).violations)


def test_pad_consistent_graph_max_query_len_too_small():
    sc = scenario(C(mode=CUDAGraphMode.FULL), cap(), disp(3, 1))
    t = good_trace(sc)
    r = first(t, is_(Replay))
    t.metadata[r.graph_metadata] = replace(t.metadata[r.graph_metadata], max_query_len=1)
    assert_violates("PAD-CONSISTENT", sc, t, "max_query_len=1 < the batch's max_query_len 3", "query_lens=[3, 1]")


# --------------------------------------------------------------------------
# KEY-CONSISTENT
# --------------------------------------------------------------------------
def test_key_consistent_holds():
    sc = scenario(C(lora_cases=(0, 1)), cap(), disp(3, 1), disp(3, 1, loras=1))
    assert_holds("KEY-CONSISTENT", sc, good_trace(sc))


def test_key_consistent_lookup_drops_lora_count():
    sc = scenario(C(lora_cases=(0, 1)), cap(), disp(3, 1, loras=1))
    t = good_trace(sc)
    dropped = lambda k: k[:3] + (0,)  # noqa: E731  the runtime key forgets the LoRA count
    t = mutate(t, is_(PiecewiseLookup, step=1), lambda e: replace(e, key=dropped(e.key)))
    t = mutate(t, lambda e: isinstance(e, Forward) and e.phase == "runtime", lambda e: replace(e, key=dropped(e.key)))
    assert_violates("KEY-CONSISTENT", sc, t, PD(4, lora=1).short(), "looked up under key ('pw', 4, None, 0)",
                    "captured under [('pw', 4, None, 1)]")


def test_key_consistent_lookup_missed():
    sc = scenario(BASE, cap(), disp(3, 1))
    t = good_trace(sc)
    t = mutate(t, is_(PiecewiseLookup, step=1), lambda e: replace(e, hit=False))
    assert_violates("KEY-CONSISTENT", sc, t, "missed", PD(4).short(), "reqs=2 tokens=4")


def test_pad_consistent_breakable_piecewise_max_query_len():
    sc = scenario(C(breakable=True), cap(), disp(3, 1))
    t = good_trace(sc)
    r = first(t, is_(Replay))
    assert r.path == "piecewise"
    t.metadata[r.graph_metadata] = replace(t.metadata[r.graph_metadata], max_query_len=1)
    assert_violates("PAD-CONSISTENT", sc, t, "piecewise replay", "max_query_len=1 < the batch's max_query_len 3")


def test_key_consistent_leaves_dispatch_after_release_to_before_capture():
    sc = scenario(C(mode=CUDAGraphMode.PIECEWISE), cap(), rel(), disp(3, 1))
    t = good_trace(scenario(C(mode=CUDAGraphMode.PIECEWISE), cap(), disp(3, 1)))
    t = mutate(t, lambda e: getattr(e, "step", None) == 1 and not isinstance(e, (GraphStored, CaptureDone)),
               lambda e: replace(e, step=2))
    t = mutate(t, is_(PiecewiseLookup), lambda e: replace(e, hit=False))
    t.events.insert(t.events.index(first(t, is_(Dispatch))), Release(1, False, 0))
    verdict = check_scenario(sc, t)
    assert "BEFORE-CAPTURE" in ids(verdict.violations)
    assert "KEY-CONSISTENT" not in ids(verdict.violations)
