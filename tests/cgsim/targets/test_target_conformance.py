"""Every registered target follows the recording contract of
``cgsim.targets.base``: it never writes the Trace itself, every forward is
attributed to the descriptor it serves, every graph that ran is known to
the workload, and what the runner records fits together.

The same lifecycle runs on every target the registry lists (the reference,
each mutant, vLLM where it imports, any target a package adds).  Mutants
are buggy on purpose: the contract is about how a target reports what it
did, not whether it did it right.
"""

from __future__ import annotations

import sys

import pytest

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step
from cgsim.targets import TargetEnvironmentError, get_target, target_names
from cgsim.targets.base import CAPABILITIES
from cgsim.trace import CaptureDone, Dispatch, Error, Forward, PiecewiseCapture, Replay, Trace

C, D, R = Step.capture(), Step.dispatch, Step.release()

LIFECYCLE = Scenario(
    ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4, lora_cases=(0, 2)),
    (D(Batch((1,))), C, D(Batch((1, 1))), D(Batch((3,), has_prefill=True)), D(Batch((1, 1, 1), num_active_loras=1)),
     R, D(Batch((1,))), C, D(Batch((2, 1), has_prefill=True))),
    ruleset="vllm-0.32",
)

WRITERS = ("cgsim.runner", "cgsim.recorder", "cgsim.workload")


def _run_recording_writers(name: str, monkeypatch) -> tuple[Trace, set[str]]:
    target = get_target(name)
    try:
        target.prepare_environment()
    except TargetEnvironmentError as exc:
        pytest.skip(f"{name} cannot run here: {exc}")
    writers: set[str] = set()
    original = Trace.add

    def add(self, event):
        writers.add(sys._getframe(1).f_globals.get("__name__", "?"))
        return original(self, event)

    monkeypatch.setattr(Trace, "add", add)
    trace = run_scenario(LIFECYCLE, target=name, backend="mock", timeout=120)
    return trace, writers


def _marks(name: str) -> list:
    if name == "vllm":
        return [pytest.mark.vllm]
    if name == "sglang" or name.startswith("sglang-mutant:"):
        return [pytest.mark.sglang]
    return []


def _params():
    # Engine targets run where the engine imports (the vllm / sglang tox envs), and skip elsewhere.
    # The decode family's targets: the recording contract is its runner's (the encoder's has its own tests).
    from cgsim.families import owns_target_of

    return [pytest.param(n, marks=_marks(n)) for n in target_names() if owns_target_of("decode")(n)]


@pytest.mark.parametrize("name", _params())
def test_target_follows_the_recording_contract(name, monkeypatch):
    trace, writers = _run_recording_writers(name, monkeypatch)
    target = get_target(name)
    assert set(target.capabilities) <= set(CAPABILITIES), target.capabilities
    assert trace.target == name
    # 1. Only the runner and the workload write the trace.
    stray = {w for w in writers if not w.startswith(WRITERS)}
    assert not stray, f"{name} writes the Trace from {sorted(stray)}; targets call the workload instead"
    if trace.unsupported:
        pytest.skip(f"{name} refuses the lifecycle config: {trace.unsupported}")
    capture_steps = {i for i, s in enumerate(LIFECYCLE.steps) if s.kind == "capture"}
    errors = trace.of(Error)
    last = errors[0].step if errors else len(LIFECYCLE.steps)
    # 2. Each capture step that ran ends with a CaptureDone.
    done = {e.step for e in trace.of(CaptureDone)}
    assert {s for s in capture_steps if s <= last} <= done
    # 3. Forwards are attributed: capture forwards to the descriptor being
    #    captured, runtime forwards to a dispatch step.
    for f in trace.of(Forward):
        if f.phase == "capture":
            assert f.step in capture_steps and f.desc is not None, f
        else:
            assert LIFECYCLE.steps[f.step].kind == "dispatch", f
    # 4. Every dispatch that ran has its execution recorded, and a graph that
    #    ran is one the workload saw captured (metadata and step known).
    dispatched = {d.step for d in trace.of(Dispatch)}
    replayed = {r.step: r for r in trace.of(Replay)}
    for step in dispatched:
        assert step in replayed or any(e.step == step for e in errors), f"dispatch at step {step} left no record"
    for r in replayed.values():
        assert r.path in ("full", "piecewise", "eager")
        if r.path == "full":
            assert r.graph_from_step in capture_steps, r
        if r.path == "piecewise" and trace.uses_breakable:
            assert r.graph_from_step in capture_steps, r
    # 5. Metadata the trace refers to was built through the workload.
    referenced = {f.metadata for f in trace.of(Forward)} | {e.metadata for e in trace.of(PiecewiseCapture)}
    referenced |= {r.graph_metadata for r in replayed.values()} | {r.runtime_metadata for r in replayed.values()}
    assert referenced - {None} <= set(trace.metadata)
    trace.to_json()  # what a finding stores beside it
