"""The dispatch sweep: what it asks, how its answers are judged, and that the
shortcuts behind both (a batched dispatch, best fits searched per kind of
graph, judging only the batches the oracle disputes, plans counted from
their shapes) agree with the plain rules they stand for."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings, strategies as st

import cgsim.recorder as recorder
import cgsim.runner as runner
from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.spec.fit import compatible
from cgsim.modes import CUDAGraphMode as M
from cgsim.properties import check_scenario
from cgsim.properties.view import RunView, SweepView
from cgsim.scenario import Scenario, Step
from cgsim.spec import dispatch_choices, padding_key
from cgsim.spec.scheduler import _exhaustive, _space, _space_at_most, sweep_plan, sweep_token_limit
from cgsim.targets.mutants import mutant_names
from cgsim.trace import Sweep
from fuzz.strategies import configs, scenarios

TARGETS = ["reference"] + [f"mutant:{m}" for m in mutant_names()]
SLOW_OK = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@SLOW_OK
@given(scenarios(max_size=32), st.sampled_from(TARGETS))
def test_a_sweeps_best_fits_are_the_spec_oracles_choices(sc, target):
    """Per swept batch and mode, the best fits are every compatible captured
    graph of that mode padding least (``Fit.choices``: those of the highest
    mode), as the spec's ``dispatch_choices`` finds them by brute force."""
    run = RunView(sc, runner.run_scenario(sc, target=target))
    cases = run.config.lora_cases
    for sv in run.captured_sweeps:
        descs = sv.captured.descs
        for b, _, fit in sv.judged():
            assert set(fit.choices) == dispatch_choices(b, descs, cases), b
            for mode in (M.FULL, M.PIECEWISE, M.NONE):
                same = [d for d in descs if d.cg_mode is mode and compatible(d, b, cases)]
                if not same:
                    assert mode not in fit.by_mode, b
                    continue
                least = min(padding_key(d, b) for d in same)
                assert fit.by_mode[mode][0] == least, b
                assert set(fit.by_mode[mode][1]) == {d for d in same if padding_key(d, b) == least}, b
            assert set(fit.exact) == {d for d in descs if compatible(d, b, cases) and padding_key(d, b) == (0, 0)}


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios(max_size=32))
def test_judging_the_disputed_batches_gives_the_verdict_of_judging_every_batch(sc):
    """The dispatch properties read only the batches whose decision is not
    the oracle's (``SweepView.disputed``); judging every swept batch instead
    finds the same violations, on the reference and on every mutant."""
    traces = [runner.run_scenario(sc, target=target) for target in TARGETS]
    fast = [check_scenario(sc, trace) for trace in traces]
    disputed = SweepView.disputed
    SweepView.disputed = lambda self: list(self.judged())
    try:
        every = [check_scenario(sc, trace) for trace in traces]
    finally:
        SweepView.disputed = disputed
    assert fast == every


@SLOW_OK
@given(scenarios(max_size=32), st.sampled_from(TARGETS))
def test_a_sweep_asks_the_managers_own_dispatch_of_every_batch(sc, target):
    """The reference handle dispatches a sweep in one call; its answers are
    those of the manager's dispatch asked batch by batch (a mutant's own,
    where it overrides dispatch)."""
    asked = []
    real = recorder._record_sweep

    def compared(handle, plan, trace, step):
        assert handle.dispatch_all(plan.shapes) == [handle.m.dispatch(s) for s in plan.shapes]
        asked.append(len(plan.shapes))
        return real(handle, plan, trace, step)

    recorder._record_sweep = compared
    try:
        trace = runner.run_scenario(sc, target=target)
    finally:
        recorder._record_sweep = real
    assert not [e for e in trace.errors if e.exc_type == "AssertionError"], trace.errors
    assert asked or trace.unsupported or trace.errors


@settings(max_examples=80, deadline=None)
@given(configs(max_size=48), st.lists(st.integers(1, 40), max_size=5))
def test_a_plan_counted_from_its_shapes_is_the_space_and_its_quick_bound_holds(config, marks):
    """An exhaustive plan is its space (no input twice); the bound a small
    config's plan is made under without counting first is never below it."""
    limit, marks = sweep_token_limit(config), tuple(sorted(set(marks)))
    shapes = _exhaustive(config, limit, marks)
    assert len(set(shapes)) == len(shapes) == _space(config, limit, marks)
    assert _space_at_most(config, limit, len(marks)) >= len(shapes)
    descs = [BatchDescriptor(M.FULL, m, m) for m in marks]
    counted = sweep_plan(config, descs, bound=len(shapes))  # takes the path that counts first
    assert counted.coverage == "exhaustive" and counted.shapes == sweep_plan(config, descs).shapes


def _sweeps(trace) -> list[Sweep]:
    return [e for e in trace.events if isinstance(e, Sweep)]


def test_a_manager_that_plans_no_graph_is_swept_at_the_boundaries_after_its_capture_too():
    """Nothing captured, nothing planned: after the capture, as before it,
    every decision must be eager, and the boundary classes show it; a
    manager with graphs is swept whole after its capture."""
    big = dict(capture_sizes=tuple(range(8, 257, 8)), max_num_reqs=64, lora_cases=(0, 1, 2))
    none = Scenario(ManagerConfig(mode="NONE", **big), (Step.capture(), Step.dispatch(Batch((1, 1)))))
    assert [s.coverage for s in _sweeps(runner.run_scenario(none))] == ["boundary", "boundary"]
    full = Scenario(ManagerConfig(mode="FULL", **big), none.steps)
    assert [s.coverage for s in _sweeps(runner.run_scenario(full))] == ["boundary", "exhaustive"]


def test_a_graph_answered_where_nothing_was_captured_is_a_finding(monkeypatch):
    """The light sweep after a capture of nothing still judges: a graph
    returned for one boundary batch breaks DISPATCH-SOUND."""
    from cgsim.targets.reference import ManagerHandle

    real = ManagerHandle.dispatch_all

    def dispatch_all(self, shapes):
        out = real(self, shapes)
        if self.m._graphs_captured:
            out[-1] = BatchDescriptor(M.FULL, shapes[-1].num_tokens, shapes[-1].num_reqs)
        return out

    monkeypatch.setattr(ManagerHandle, "dispatch_all", dispatch_all)
    sc = Scenario(ManagerConfig(mode="NONE", capture_sizes=(1, 2, 4), max_num_reqs=4), (Step.capture(),))
    trace = runner.run_scenario(sc)
    assert [s.coverage for s in _sweeps(trace)] == ["boundary", "boundary"]
    sound = [v for v in check_scenario(sc, trace).violations if v.property == "DISPATCH-SOUND"]
    assert sound and "but no graph is stored for it" in sound[0].message


def test_equal_graph_answers_share_one_object_in_the_trace(monkeypatch):
    """A target that builds a new descriptor per answer: the Sweep keeps one
    object per distinct graph decision (eager ones as returned)."""
    from cgsim.targets.reference import ManagerHandle

    real = ManagerHandle.dispatch_all
    monkeypatch.setattr(ManagerHandle, "dispatch_all", lambda self, shapes: [replace(d) for d in real(self, shapes)])
    sc = Scenario(ManagerConfig(mode="FULL", capture_sizes=(2, 4, 8), max_num_reqs=4), (Step.capture(),))
    sweep = _sweeps(runner.run_scenario(sc))[-1]
    graphs = [d for d in sweep.descs if d.cg_mode is not M.NONE]
    assert graphs and len({id(d) for d in graphs}) == len(set(graphs)) < len(graphs)
    assert not check_scenario(sc, runner.run_scenario(sc)).violations


def test_an_eager_answer_smaller_than_its_batch_is_a_finding_before_and_after_capture(monkeypatch):
    """Eager answers pass unjudged only where they cover the batch: one that
    drops a token breaks DISPATCH-SOUND, with nothing captured and with
    graphs."""
    from cgsim.targets.reference import ManagerHandle

    real = ManagerHandle.dispatch_all

    def dispatch_all(self, shapes):
        out = real(self, shapes)
        i = max(range(len(shapes)), key=lambda j: (out[j].cg_mode is M.NONE, shapes[j].num_tokens))
        out[i] = replace(out[i], num_tokens=shapes[i].num_tokens - 1)
        return out

    monkeypatch.setattr(ManagerHandle, "dispatch_all", dispatch_all)
    for mode in ("NONE", "FULL"):
        sc = Scenario(ManagerConfig(mode=mode, capture_sizes=(1, 2, 4), max_num_reqs=4), (Step.capture(),))
        sound = [v for v in check_scenario(sc, runner.run_scenario(sc)).violations if v.property == "DISPATCH-SOUND"]
        assert len(sound) == 2 and all("with fewer tokens than the batch" in v.message for v in sound), sound


def test_a_graph_captured_for_fewer_requests_than_a_batch_does_not_fit_it():
    """Best fits skip a graph of enough tokens but too few requests (and
    ``disputed`` then faults a dispatcher that returns it)."""
    from cgsim.descriptors import BatchShape
    from cgsim.properties.view import Captured

    few, many = BatchDescriptor(M.FULL, 8, 2), BatchDescriptor(M.FULL, 16, 8)
    shapes = (BatchShape(4, 8, 5, None, True), BatchShape(2, 8, 7, None, True))
    sweep = Sweep(step=0, captured_flag=True, batches=shapes, descs=(few, few), coverage="exhaustive", space=2)
    view = SweepView(sweep, Captured(0, frozenset({few, many}), frozenset()), (0,), "capture")
    assert [f.choices for f in view.fits()] == [(many,), (few,)]
    assert [(b, d) for b, d, _ in view.disputed()] == [(shapes[0], few)]


def test_a_chosen_graph_that_nothing_runs_is_disputed():
    """The best fit is a stored PIECEWISE graph, but nothing runs piecewise
    graphs: returning it agrees with no oracle (DISPATCH-SOUND judges it)."""
    from cgsim.descriptors import BatchShape
    from cgsim.properties.view import Captured

    piece = BatchDescriptor(M.PIECEWISE, 8)
    shapes = (BatchShape(2, 8, 7, None, True),)
    sweep = Sweep(step=0, captured_flag=True, batches=shapes, descs=(piece,), coverage="exhaustive", space=1)
    captured = Captured(0, frozenset({piece}), frozenset())
    assert [f.choices for f in SweepView(sweep, captured, (0,), "capture").fits()] == [(piece,)]
    idle = SweepView(sweep, captured, (0,), "capture", has_piecewise_runner=False)
    assert [d for _, d, _ in idle.disputed()] == [piece]
    assert not SweepView(sweep, Captured(0, frozenset(), frozenset({piece})), (0,), "capture",
                         has_piecewise_runner=True).disputed()
