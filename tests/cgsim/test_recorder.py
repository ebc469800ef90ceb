"""One recorder for every manager, and a trace header set once.

A handle that drives a twin of itself as a sub-manager (the same reference
manager under the same config) must get a sub-trace recorded exactly as the
main trace: the runner records both with ``cgsim.recorder.ManagerRecorder``.
A sub-manager that fails is recorded as the main one would be, and the main
run goes on unchanged.
"""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, replace

import pytest

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.modes import CUDAGraphMode
from cgsim.properties import check_scenario
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step
from cgsim.targets.base import SubManager
from cgsim.targets.reference import ReferenceTarget
from cgsim.trace import (
    Candidates,
    CaptureDone,
    Dispatch,
    EngineAlignment,
    Error,
    GraphBytes,
    GraphStored,
    HeaderAlreadySet,
    Release,
    Replay,
    Sweep,
    Trace,
    TraceHeader,
)

C, D, R = Step.capture(), Step.dispatch, Step.release()
CONFIG = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4, lora_cases=(0, 2))
LIFECYCLE = Scenario(
    CONFIG,
    (D(Batch((1,))), C, D(Batch((1, 1))), D(Batch((3,), has_prefill=True)), D(Batch((1, 1, 1), num_active_loras=1)),
     R, D(Batch((1,))), C, D(Batch((2, 1), has_prefill=True))),
    ruleset="vllm-0.32",
)
TWIN = "twin"


class _TwinHandle:
    """The reference handle, driving a second reference manager beside it
    (captured and released inside its own capture and release, as an
    engine's draft managers are)."""

    def __init__(self, main, twin, twin_workload, config):
        self.main, self.twin, self.twin_workload, self.config = main, twin, twin_workload, config
        self.resolved_mode, self.uses_breakable = main.resolved_mode, main.uses_breakable
        self.has_piecewise_runner = main.has_piecewise_runner

    def capture(self):
        self.main.capture()
        self.twin.capture()

    def release(self):
        self.main.release()
        self.twin.release()

    def sub_managers(self):
        return {TWIN: SubManager(self.twin, self.twin_workload, self.config, lambda batch: batch)}

    def __getattr__(self, name):  # dispatch, execute, candidates, ...: the main manager's
        return getattr(self.main, name)


class _TwinTarget(ReferenceTarget):
    name = "reference-twin"

    def build(self, config, ruleset, backend, workload):
        main = super().build(config, ruleset, backend, workload)
        twin_workload = workload.for_manager(TWIN, config)
        twin = super().build(config, ruleset, backend, twin_workload)
        return _TwinHandle(main, twin, twin_workload, config)


# What the recorder writes (the workload's own events carry ids of its own).
RECORDED = (Candidates, GraphStored, GraphBytes, CaptureDone, Sweep, Dispatch, Release, Error)


def _recorded(trace: Trace) -> list:
    out = []
    for e in trace.events:
        if isinstance(e, Replay):
            out.append(("replay", e.step, e.batch, e.desc, e.path, e.outputs_ok, e.metadata_alive, e.graph_from_step))
        elif isinstance(e, RECORDED):
            out.append(e)
    return out


def test_a_sub_manager_is_recorded_exactly_as_the_main_one():
    trace = run_scenario(LIFECYCLE, target=_TwinTarget())
    sub = trace.managers[TWIN]
    assert not trace.errors and not sub.errors
    assert sum(isinstance(e, Sweep) for e in sub.events) == 4  # before the first step, after each capture and release
    assert _recorded(sub) == _recorded(trace)
    assert sub.header == replace(trace.header, config=CONFIG.to_json())
    assert sorted(sub.outputs) == sorted(trace.outputs)
    assert not check_scenario(LIFECYCLE, trace).violations


def test_each_managers_graph_memory_is_recorded_after_each_capture():
    trace = run_scenario(LIFECYCLE, target=_TwinTarget())
    for t in (trace, trace.managers[TWIN]):
        stored = {(e.step, e.desc) for e in t.of(GraphStored) if e.desc.cg_mode == CUDAGraphMode.FULL}
        memory = t.of(GraphBytes)
        assert stored and {(e.step, e.desc) for e in memory} == stored
        # The reference's one pool per capture, a fresh one after the release (numbered per manager).
        assert {(e.step, e.pool) for e in memory} == {(1, 0), (7, 1)}
        assert all(0 < e.forward_bytes == e.graph_bytes <= e.pool_bytes for e in memory)


def test_the_main_trace_does_not_depend_on_its_sub_managers():
    plain = run_scenario(LIFECYCLE, target=ReferenceTarget()).to_json()
    twin = run_scenario(LIFECYCLE, target=_TwinTarget()).to_json()
    assert twin.pop("managers").keys() == {TWIN}
    plain.pop("managers"), plain.pop("target"), twin.pop("target")
    assert json.dumps(twin) == json.dumps(plain)


def _twin_dispatching(bad: Batch, answer):
    """A twin whose dispatch of ``bad`` is ``answer()``, every other batch the reference's."""

    class Target(_TwinTarget):
        def build(self, config, ruleset, backend, workload):
            handle = super().build(config, ruleset, backend, workload)
            real = handle.twin.dispatch
            handle.twin.dispatch = lambda b: answer() if b == bad else real(b)
            return handle

    return Target()


def _boom():
    raise RuntimeError("twin dispatch exploded")


@pytest.mark.parametrize("answer,error,exc_type,message", [
    (_boom, "crash", "RuntimeError", "twin dispatch exploded"),
    (lambda: "not a descriptor", "corrupt", "CorruptState",
     "dispatch returned 'not a descriptor', not a batch descriptor"),
])
def test_a_failing_sub_manager_is_recorded_as_the_main_one_would_be_and_left_alone(answer, error, exc_type, message):
    bad = LIFECYCLE.steps[3].batch
    trace = run_scenario(LIFECYCLE, target=_twin_dispatching(bad, answer))
    sub = trace.managers[TWIN]
    assert sub.errors == [Error(step=3, phase="dispatch", error=error, exc_type=exc_type, message=message)]
    assert _recorded(sub)[-1] == sub.errors[0]  # left alone for the rest of the run
    assert not trace.errors and max(e.step for e in trace.of(Dispatch)) == len(LIFECYCLE.steps) - 1
    # The main manager failing the same way is recorded the same way.
    main = run_scenario(LIFECYCLE, target=_main_dispatching(bad, answer))
    assert main.errors == sub.errors


def _main_dispatching(bad: Batch, answer):
    class Target(ReferenceTarget):
        def build(self, config, ruleset, backend, workload):
            handle = super().build(config, ruleset, backend, workload)
            real = handle.dispatch
            handle.dispatch = lambda b: answer() if b == bad else real(b)
            return handle

    return Target()


def test_a_sub_managers_failing_sweep_names_the_batch_as_the_main_ones_does():
    def broken(which):
        class Target(_TwinTarget):
            def build(self, config, ruleset, backend, workload):
                handle = super().build(config, ruleset, backend, workload)
                victim = handle.twin if which == "twin" else handle.main
                real = victim.dispatch

                def dispatch(b):
                    if b.num_tokens == 3 and b.num_reqs == 3:
                        raise RuntimeError("three requests")
                    return real(b)

                victim.dispatch = dispatch
                victim.dispatch_all = lambda shapes: [dispatch(s) for s in shapes]
                return handle

        return Target()

    sub = run_scenario(LIFECYCLE, target=broken("twin")).managers[TWIN].errors
    main = run_scenario(LIFECYCLE, target=broken("main")).errors
    assert len(sub) == len(main) == 1 and sub == main
    assert sub[0].phase == "dispatch" and sub[0].step == -1
    assert sub[0].message.startswith("during the dispatch sweep, dispatching ") and "three requests" in sub[0].message


# -- the header ---------------------------------------------------------------------------------------


def test_the_header_is_set_once():
    trace = Trace("t", "mock")
    assert trace.header == TraceHeader("t", "mock") and trace.resolved_mode is None
    trace.record_built(CUDAGraphMode.FULL, uses_breakable=True, has_piecewise_runner=False)
    assert (trace.resolved_mode, trace.uses_breakable, trace.has_piecewise_runner) == (CUDAGraphMode.FULL, True, False)
    with pytest.raises(HeaderAlreadySet):
        trace.record_built(CUDAGraphMode.NONE, uses_breakable=False, has_piecewise_runner=False)
    with pytest.raises(HeaderAlreadySet):
        trace.record_unsupported("too late")
    assert trace.resolved_mode is CUDAGraphMode.FULL and trace.unsupported is None
    refused = Trace("t", "mock")
    refused.record_unsupported("the engine refuses it")
    with pytest.raises(HeaderAlreadySet):
        refused.record_built(CUDAGraphMode.FULL, uses_breakable=False, has_piecewise_runner=False)
    assert refused.unsupported == "the engine refuses it"


def test_the_header_cannot_be_changed_from_outside():
    trace = Trace.from_header(TraceHeader("t", "mock", resolved_mode=CUDAGraphMode.FULL))
    with pytest.raises(AttributeError):
        trace.resolved_mode = CUDAGraphMode.NONE
    with pytest.raises(FrozenInstanceError):
        trace.header.resolved_mode = CUDAGraphMode.NONE  # type: ignore[misc]
    with pytest.raises(HeaderAlreadySet):
        trace.record_unsupported("a header given whole is final")


def test_the_json_form_keeps_its_keys_and_order():
    trace = run_scenario(LIFECYCLE, target=_TwinTarget())
    out = trace.to_json()
    keys = ["target", "backend", "resolved_mode", "uses_breakable", "has_piecewise_runner", "unsupported", "alignment",
            "events", "metadata", "config", "managers"]
    assert list(out) == keys and list(out["managers"][TWIN]) == keys
    assert (out["target"], out["backend"], out["resolved_mode"], out["config"]) == (
        "reference-twin", "mock", "FULL_AND_PIECEWISE", None)
    assert out["managers"][TWIN]["config"] == CONFIG.to_json()
    refused = Trace("t", "mock")
    refused.record_unsupported("no")
    assert refused.to_json()["unsupported"] == "no" and refused.to_json()["resolved_mode"] is None
    assert out["alignment"] is None  # the reference asks no engine


ALIGNED = EngineAlignment(decode=2, prefill=None, helper="engine.alignment")


class _AlignedTarget(_TwinTarget):
    """The twin, its handles saying what their engine answers for the alignment."""

    name = "reference-aligned"

    def build(self, config, ruleset, backend, workload):
        handle = super().build(config, ruleset, backend, workload)
        handle.engine_alignment = ALIGNED
        handle.twin.engine_alignment = replace(ALIGNED, decode=1)
        return handle


def test_the_engines_alignment_is_recorded_once_into_each_header():
    trace = run_scenario(LIFECYCLE, target=_AlignedTarget())
    assert trace.alignment == ALIGNED and trace.managers[TWIN].alignment == replace(ALIGNED, decode=1)
    assert trace.to_json()["alignment"] == {"decode": 2, "prefill": None, "helper": "engine.alignment"}
    with pytest.raises(HeaderAlreadySet):
        trace.record_built(CUDAGraphMode.FULL, uses_breakable=False, has_piecewise_runner=False, alignment=ALIGNED)


def test_a_step_records_its_stream_and_the_streams_its_replays_ran_on():
    sc = Scenario(ManagerConfig(mode="FULL", capture_sizes=(2,), max_num_reqs=2), (C, D(Batch((1, 1))), D(Batch((3,)))),
                  ruleset="pr48822")
    trace = run_scenario(sc, target="reference")
    assert [(r.path, r.step_stream, r.replay_streams) for r in trace.of(Replay)] == [("full", 0, (0,)),
                                                                                    ("eager", 0, ())]
