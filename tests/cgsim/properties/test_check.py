"""SPEC §4: the verdict of whole traces (check_scenario over every property) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.properties import check_scenario
from cgsim.scenario import Scenario, Step
from cgsim.spec import expected_capture_descs
from cgsim.trace import (
    Candidates,
    CaptureDone,
    Dispatch,
    Forward,
    GraphStored,
    PiecewiseLookup,
    Release,
    Replay,
    Trace,
)
from tests.cgsim.properties.hand_traces import (
    GOOD_CONFIGS,
    WORKFLOW,
    C,
    F,
    cap,
    disp,
    first,
    good_trace,
    is_,
    mutate,
    scenario,
)


def _producible(config: ManagerConfig, steps) -> tuple:
    """The workflow's batches as the scheduler would hand them in for
    ``config``: a shape that is no decode it schedules carries a prefill."""
    from cgsim.spec.scheduler import is_decode_batch as _decode_producible

    out = []
    for st in steps:
        b = st.batch
        if b is not None and not b.has_prefill and not _decode_producible(config, b.query_lens):
            st = Step.dispatch(replace(b, has_prefill=True))
        out.append(st)
    return tuple(out)


@pytest.mark.parametrize("name,config,ruleset", GOOD_CONFIGS, ids=[c[0] for c in GOOD_CONFIGS])
def test_good_trace_has_no_violation(name, config, ruleset):
    extra = (disp(2, 2, loras=min(1, max(config.lora_cases))), disp(4, 4, 4, 4, ubatches=2) if config.num_ubatches > 1 else disp(2))
    sc = scenario(config, *_producible(config, WORKFLOW + extra),
                  ruleset=ruleset)
    verdict = check_scenario(sc, good_trace(sc))
    spec_descs = {d for ds in expected_capture_descs(config, ruleset).values() for d in ds}
    dead = KNOWN_DEAD_IN_SPEC.get(name, set()) & spec_descs  # the spec may drop them
    rest = [v for v in verdict.violations if not (v.property == "CAPTURE-USEFUL" and any(d.short() + " " in v.message for d in dead))]
    assert not rest, "\n".join(map(str, rest))
    assert len(verdict.violations) == len(dead)
    assert "NO-CRASH" in verdict.checked and "INIT-TOTAL" in verdict.checked


# Capture descriptors of the spec (as first written) that CAPTURE-USEFUL finds
# dead; see test_dead_graphs_of_the_first_spec.
KNOWN_DEAD_IN_SPEC = {
    # q=3 for 1-2 requests, q=2 for 3-8: candidate init builds every decode
    # length for every size, so q=3 with 3 requests never runs (q=2 with 2
    # does, after a batch of 3 or more shrinks).
    "dyn-spec": {BatchDescriptor(F, 9, 3, 3)},
}


# --------------------------------------------------------------------------
# traces laid out the way cgsim.runner and the targets record them
# --------------------------------------------------------------------------
def as_runner_layout(t: Trace) -> Trace:
    """The runner's layout: the "initial" candidates once at build (step -1),
    "recomputed" once after the first capture, and GraphStored read off the
    manager after each capture (every graph it holds, carried-over ones too)."""
    initial = first(t, is_(Candidates, phase="initial"))
    recomputed = first(t, is_(Candidates, phase="recomputed"))
    events, pending, held, seen_done = [replace(initial, step=-1)], [], [], False
    for e in t.events:
        if isinstance(e, Candidates):
            continue
        if isinstance(e, GraphStored):
            pending.append(e)
            continue
        if isinstance(e, CaptureDone):
            fresh = [g.desc for g in pending]
            events += [GraphStored(d, e.step) for d in held if d not in fresh] + pending
            held += [d for d in fresh if d not in held]
            pending = []
            events.append(e)
            if not seen_done:
                events.append(recomputed)
                seen_done = True
            continue
        if isinstance(e, Release):
            held = []
        events.append(e)
    return Trace.from_header(t.header, events, dict(t.metadata))


@pytest.mark.parametrize("name,config,ruleset", GOOD_CONFIGS[:8], ids=[c[0] for c in GOOD_CONFIGS[:8]])
def test_runner_layout_has_no_violation(name, config, ruleset):
    sc = scenario(config, *WORKFLOW, ruleset=ruleset)
    verdict = check_scenario(sc, as_runner_layout(good_trace(sc)))
    assert verdict.ok, "\n".join(map(str, verdict.violations))


def test_second_capture_without_release_that_captures_nothing():
    """capture() again with every graph already there: the runner still reads
    the held graphs off the manager; they are not new, unwarmed captures, and
    replaying them is not stale."""
    sc = scenario(C(mode=CUDAGraphMode.FULL), cap(), cap(), disp(1, 1))
    t = good_trace(scenario(C(mode=CUDAGraphMode.FULL), cap(), disp(1, 1)))
    done = first(t, is_(CaptureDone))
    at = t.events.index(done) + 1
    t.events[at:at] = [CaptureDone(1, True, True)]
    t = mutate(t, lambda e: isinstance(e, (Dispatch, Replay, PiecewiseLookup)) or (isinstance(e, Forward) and e.phase == "runtime"),
               lambda e: replace(e, step=2))
    t = as_runner_layout(t)
    full = expected_capture_descs(sc.config, sc.ruleset)[F]
    assert len(t.of(GraphStored)) == 2 * len(full)  # read off after each capture
    verdict = check_scenario(sc, t)
    assert verdict.ok, "\n".join(map(str, verdict.violations))


# -- what readers take from a violation instead of its message ---------------------------------------


def test_the_count_cap_note_and_a_sub_managers_violations_say_so_as_fields():
    import json
    import os

    from cgsim.finding import Finding
    from cgsim.properties.registry import Violation
    from cgsim.properties.view import MAX_PER_GROUP, group

    many = [Violation("DISPATCH-SOUND", f"batch {i}", 1) for i in range(4 * MAX_PER_GROUP + 3)]
    kept = group(many)
    note = Finding.from_violation(kept[-1], {"config": {}}, "reference", "mock")
    assert note.overflow == 3 and note.manager is None
    assert not any(Finding.from_violation(v, {}, "reference", "mock").overflow for v in kept[:-1])
    sub = Finding.from_violation(Violation("CAPTURE-ONCE", "draft-decode manager: twice", 0, manager="draft-decode"),
                                 {}, "vllm", "mock")
    assert sub.manager == "draft-decode" and Finding.from_json(sub.to_json()).manager == "draft-decode"
    # A finding recorded before the field existed is upgraded as it loads (the export reads its manager).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    data = json.load(open(os.path.join(root, "docs", "findings", "fresh-metadata-2f61040c3e.json")))
    assert "facts" not in data
    assert Finding.from_json(data).manager == "draft-prefill"


def test_a_sub_managers_violation_carries_its_manager_as_a_fact():
    from unittest import mock

    from cgsim.properties.view import RunView
    from cgsim.runner import run_scenario

    config = ManagerConfig(mode=CUDAGraphMode.FULL_AND_PIECEWISE, capture_sizes=(1, 2, 4, 8), max_num_reqs=8)
    scenario = Scenario(config, (Step.capture(), Step.dispatch(Batch((1,) * 3))))
    buggy = RunView(scenario, run_scenario(scenario, "mutant:range-off-by-one"))
    # The buggy run judged as the draft decode manager of a clean one.
    with mock.patch.object(RunView, "manager_views", lambda self: {} if self is buggy else {"draft-decode": buggy}):
        verdict = check_scenario(scenario, run_scenario(scenario, "reference"))
    assert verdict.violations
    assert all(v.manager == "draft-decode" and v.message.startswith("draft-decode manager: ")
               for v in verdict.violations)
