"""SPEC §4: the harness properties (cgsim/properties/harness.py) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

import pytest

from cgsim.properties import check_scenario
from cgsim.trace import Dispatch, Error, Replay, Trace
from tests.cgsim.properties.hand_traces import (
    BASE,
    GOOD_CONFIGS,
    WORKFLOW,
    assert_holds,
    assert_violates,
    cap,
    disp,
    good_trace,
    ids,
    run,
    scenario,
)


@pytest.mark.parametrize("name,config,ruleset", GOOD_CONFIGS[:10], ids=[c[0] for c in GOOD_CONFIGS[:10]])
def test_partial_traces_never_crash_a_property(name, config, ruleset):
    sc = scenario(config, *WORKFLOW, ruleset=ruleset)
    full = good_trace(sc)
    for cut in range(len(full.events) + 1):
        events = full.events[:cut]
        step = max((getattr(e, "step", 0) for e in events), default=0)
        events = events + [Error(step, "capture", "crash", "RuntimeError", "boom")]
        partial = Trace.from_header(full.header, events, full.metadata)
        verdict = check_scenario(sc, partial)
        assert "NO-CRASH" in ids(verdict.violations)


def test_no_crash_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("NO-CRASH", sc, good_trace(sc))


def test_no_crash_reports_crash_in_dispatch():
    sc = scenario(BASE, cap(), disp(1))
    t = good_trace(sc)
    t.events = [e for e in t.events if not isinstance(e, (Replay, Dispatch))] + [
        Error(1, "dispatch", "crash", "KeyError", "(8, 0)")]
    assert_violates("NO-CRASH", sc, t, "raised during dispatch", "KeyError")
    assert "INIT-TOTAL" not in ids(run(sc, t).violations)
