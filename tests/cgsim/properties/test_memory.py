"""The memory properties (cgsim/properties/memory.py) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

from dataclasses import replace

from cgsim.properties import check_scenario
from cgsim.properties.memory import graph_memory_by_manager, manager_graph_bytes
from cgsim.properties.view import RunView
from cgsim.trace import GraphBytes
from tests.cgsim.properties.hand_traces import (
    BASE,
    FD,
    TOKEN_BYTES,
    C,
    assert_holds,
    assert_violates,
    cap,
    disp,
    good_trace,
    is_,
    mutate,
    rel,
    scenario,
)

SMALLEST = FD(2, 2, 1)  # BASE's smallest FULL graph: a decode of 2 requests


def test_both_hold_on_a_good_trace_across_a_release():
    sc = scenario(BASE, cap(), disp(1, 1), rel(), cap())
    t = good_trace(sc)
    assert_holds("GRAPH-POOL-SHARED", sc, t)
    assert_holds("GRAPH-MEMORY-FIT", sc, t)


def test_pool_shared_sees_a_graph_in_a_pool_of_its_own():
    sc = scenario(BASE, cap())
    t = mutate(good_trace(sc), is_(GraphBytes, desc=SMALLEST), lambda e: replace(e, pool=1, pool_bytes=1024))
    (v,) = assert_violates("GRAPH-POOL-SHARED", sc, t, "went into 2 memory pools", f"reserve {8 * TOKEN_BYTES + 1024}")
    facts = dict(v.facts)
    assert facts["graph_memory_bytes"] == 8 * TOKEN_BYTES + 1024
    assert [p["pool"] for p in facts["pools"]] == [0, 1]
    assert facts["pools"][1]["graphs"] == [SMALLEST.to_json()]


def test_memory_fit_sees_bytes_beyond_the_forward():
    sc = scenario(BASE, cap())
    t = mutate(good_trace(sc), is_(GraphBytes, desc=SMALLEST),
               lambda e: replace(e, graph_bytes=e.forward_bytes + 8 * TOKEN_BYTES))
    (v,) = assert_violates("GRAPH-MEMORY-FIT", sc, t, SMALLEST.short(), f"{8 * TOKEN_BYTES} of them beyond")
    assert dict(v.facts)["extra_bytes"] == 8 * TOKEN_BYTES
    assert dict(v.facts)["graph"] == SMALLEST.to_json()


def test_memory_fit_does_not_judge_graphs_whose_forwards_were_not_measured():
    sc = scenario(BASE, cap())
    t = mutate(good_trace(sc), is_(GraphBytes), lambda e: replace(e, forward_bytes=None, graph_bytes=10**6))
    verdict = check_scenario(sc, t, ["GRAPH-MEMORY-FIT"])
    assert "GRAPH-MEMORY-FIT" not in verdict.checked and not verdict.violations


def test_neither_applies_without_graph_bytes():
    # On a GPU the backend accounts no graph memory: no GraphBytes, nothing judged.
    sc = scenario(C(mode="FULL"), cap())
    t = mutate(good_trace(sc), is_(GraphBytes), lambda e: None)
    verdict = check_scenario(sc, t, ["GRAPH-POOL-SHARED", "GRAPH-MEMORY-FIT"])
    assert verdict.checked == () and not verdict.violations


def test_manager_graph_bytes_counts_each_pool_once():
    sc = scenario(BASE, cap())
    graphs = RunView(sc, good_trace(sc)).graph_bytes[0]
    assert len(graphs) > 1
    assert manager_graph_bytes(graphs) == 8 * TOKEN_BYTES


def test_graph_memory_by_manager_after_each_capture():
    sc = scenario(BASE, cap(), rel(), cap())
    t = good_trace(sc)
    t.managers["draft-decode"] = good_trace(scenario(C(mode="FULL", capture_sizes=(2,)), cap()))
    assert graph_memory_by_manager(t) == (("main", 8 * TOKEN_BYTES), ("main", 8 * TOKEN_BYTES),
                                          ("draft-decode", 2 * TOKEN_BYTES))
