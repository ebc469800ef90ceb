"""SPEC §4: the run view (cgsim/properties/view.py: the sweeps' best fits, cached) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

from cgsim.properties import check_scenario
from cgsim.trace import GraphStored, Trace
from tests.cgsim.properties.hand_traces import BASE, cap, disp, scenario


def test_a_sweep_answer_that_is_no_descriptor_is_a_corrupt_state_naming_its_batch(monkeypatch):
    from cgsim.runner import run_scenario
    from cgsim.targets import reference

    handle = next(c for c in vars(reference).values() if isinstance(c, type) and "dispatch_all" in vars(c))
    real = handle.dispatch_all

    def dispatch_all(self, shapes):
        out = real(self, shapes)
        return out[:-1] + ["not a descriptor"] if self.m._graphs_captured else out

    monkeypatch.setattr(handle, "dispatch_all", dispatch_all)
    sc = scenario(BASE, cap(), disp(1, 1))
    trace = run_scenario(sc)
    errors = [e for e in trace.events if getattr(e, "kind", "") == "error"]
    assert errors and errors[0].exc_type == "CorruptState"
    assert "dispatch returned 'not a descriptor' for" in errors[0].message


def test_a_sweep_judged_again_under_other_captured_graphs_gets_its_own_best_fits():
    """Best fits are cached per (plan, captured graphs): the same swept
    batches judged with one graph fewer stored are judged against that."""
    from cgsim.runner import run_scenario

    sc = scenario(BASE, cap(), disp(1, 1))
    trace = run_scenario(sc)
    assert not check_scenario(sc, trace).violations
    stored = [e for e in trace.events if isinstance(e, GraphStored)]
    dropped = max(stored, key=lambda e: e.desc.num_tokens).desc
    events = [e for e in trace.events if not (isinstance(e, GraphStored) and e.desc == dropped)]
    fewer = Trace.from_header(trace.header, events, trace.metadata)
    sound = [v for v in check_scenario(sc, fewer).violations if v.property == "DISPATCH-SOUND"]
    assert sound and f"dispatched to FULL {dropped.short()}, but no graph is stored for it" in sound[0].message
    # ... and judged again as recorded, nothing.
    assert not check_scenario(sc, trace).violations
