"""Run a Scenario on (target, backend) and return its Trace.

The runner and the workload are the only writers of the Trace: the runner
drives the handle step by step and records, through one
``cgsim.recorder.ManagerRecorder`` per manager (the handle and each one it
drives beside it), what each returns (candidates, stored graphs, dispatch
decisions, executions, release results); the workload what the code under
test did with it.  A crash, an illegal operation, a hang or a
corrupted state in the target becomes an ``Error`` event, never an uncaught
exception: the properties judge it like anything else the target did.  A
broken environment is the exception: ``TargetEnvironmentError`` propagates
(exit 2 in the CLI), it is never a finding.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import torch

from cgsim.backends import get_backend
from cgsim.config import ManagerConfig
from cgsim.descriptors import BatchDescriptor
from cgsim.modes import ModeResolutionError
from cgsim.recorder import FATAL, ManagerRecorder, PlanFor, classify_error, error_event
from cgsim.scenario import Scenario
from cgsim.spec import expected_capture_descs
from cgsim.spec.rulesets import get_ruleset
from cgsim.spec.scheduler import SweepPlan, sweep_plan
from cgsim.targets import get_target
from cgsim.targets.base import ManagerUnderTest, TargetEnvironmentError, TargetUnsupported
from cgsim.timeouts import ScenarioTimeout, deadline
from cgsim.trace import Error, Trace
from cgsim.workload import Workload

__all__ = ["run_scenario", "ScenarioTimeout", "classify_error"]


def run_scenario(scenario: Scenario, target="reference", backend="mock", timeout: float | None = None,
                 sweep: bool = True) -> Trace:
    """Run ``scenario`` and return its Trace.  ``sweep``: before the first step
    and after every capture and release, ask the manager to dispatch every
    batch the scheduler can produce (``cgsim.spec.scheduler.sweep_plan``),
    without running them, so the dispatch properties judge them all."""
    # The workload's tensors are tiny: intra-op threads only add hand-off cost
    # (measured 50x on gelu of 64x8 with 2 threads on a 2-core machine), and
    # campaigns parallelise across processes instead.
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    target = get_target(target)
    # Before the deadline: one-time imports are not the scenario's time, and a
    # broken environment must stop here rather than become an Error event.
    target.prepare_environment()
    backend = get_backend(backend) if isinstance(backend, str) else backend
    ruleset = get_ruleset(scenario.ruleset)
    trace = Trace(target=target.name, backend=backend.name)
    batches = scenario.batches
    with backend.activate():
        workload = Workload(
            scenario.config, backend, trace, scenario.seed,
            max_batch_tokens=max((b.num_tokens for b in batches), default=0),
            max_batch_reqs=max((b.num_reqs for b in batches), default=0),
        )
        own = None
        try:
            # Engines serve and capture under inference mode; so does every step here.
            with deadline(timeout, f"scenario exceeded its {timeout or 0:g}s timeout (the target hangs)") as own, \
                    torch.inference_mode():
                _run_steps(scenario, target, backend, ruleset, workload, trace, sweep)
        except ScenarioTimeout as exc:
            if own is None or not own.owns(exc):
                raise  # an outer deadline (the caller's backstop) expired
            trace.add(Error(step=workload.step, phase=workload.phase, error="timeout", exc_type="ScenarioTimeout",
                            message=str(exc)))
    return trace


def _run_steps(scenario, target, backend, ruleset, workload: Workload, trace: Trace, sweep: bool) -> None:
    unreachable = target.drawing.unreachable  # optional: a lifecycle the engine cannot be driven through
    try:
        reason = unreachable(scenario) if unreachable is not None else None
        if reason is not None:
            trace.record_unsupported(reason)
            return
        handle = target.build(scenario.config, ruleset, backend, workload)
    except (ScenarioTimeout, TargetEnvironmentError):
        raise
    except TargetUnsupported as exc:
        trace.record_unsupported(str(exc))
        return
    except BaseException as exc:  # noqa: BLE001 - any failure to build is INIT-TOTAL's business
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        trace.add(error_event(-1, "build", exc))
        return

    def plan_for(config: ManagerConfig, known: tuple[BatchDescriptor, ...], light: bool) -> SweepPlan:
        return _plan(config, scenario.ruleset, known, scenario.seed, light)

    main = ManagerRecorder(handle, workload, scenario.config, trace, plan_for)
    main.start()
    subs = _sub_recorders(handle, trace, plan_for)

    def on_subs(step: int, record: Callable[..., None], *args) -> None:
        # A sub-manager that fails is recorded (an Error in its sub-trace) and
        # left alone for the rest of the run; the main run goes on.
        for name, sub in list(subs.items()):
            try:
                record(sub, step, *args)
            except FATAL:
                raise
            except BaseException as exc:  # noqa: BLE001
                sub.fail(step, exc)
                del subs[name]

    def swept(step: int, light: bool = False) -> bool:
        """Sweep every manager; False when the main one's dispatch failed (the Error is recorded)."""
        if not sweep:
            return True
        workload.at(max(step, 0), "runtime")
        on_subs(step, ManagerRecorder.sweep, light)
        try:
            main.sweep(step, light)
        except FATAL:
            raise
        except BaseException as exc:  # noqa: BLE001
            main.fail(step, exc)
            return False
        return True

    if not swept(-1, light=True):
        return
    recomputed = False
    for i, step in enumerate(scenario.steps):
        try:
            if step.kind == "capture":
                workload.at(i, "capture")
                main.capture(i)
                on_subs(i, ManagerRecorder.captured, not recomputed)
                if not recomputed:
                    main.recomputed(i)
                    recomputed = True
                if not swept(i):
                    return
            elif step.kind == "dispatch":
                workload.at(i, "runtime")
                main.dispatch(i, step.batch)
                on_subs(i, ManagerRecorder.dispatch, step.batch)
            else:
                workload.at(i, "runtime")
                main.release(i)
                on_subs(i, ManagerRecorder.released)
                if not swept(i, light=True):
                    return
        except FATAL:
            raise
        except BaseException as exc:  # noqa: BLE001
            if step.kind == "capture":
                main.capture_failed(i)
            main.fail(i, exc)
            # The manager's state is unknown after a failure: stop here rather
            # than report a cascade of consequences.
            return


def _sub_recorders(handle: ManagerUnderTest, trace: Trace, plan_for: PlanFor) -> dict[str, ManagerRecorder]:
    """The other managers a handle drives (``sub_managers()``, e.g. a draft
    model's), each recorded into its sub-trace the way the main one is."""
    getter = getattr(handle, "sub_managers", None)
    recorders: dict[str, ManagerRecorder] = {}
    for name, sub in (getter() if getter is not None else {}).items():
        st = trace.managers.get(name)
        if st is None:  # its workload was not made with Workload.for_manager
            continue
        recorders[name] = ManagerRecorder(sub.handle, sub.workload, sub.config, st, plan_for, sub.batch_for)
        recorders[name].start()
    return recorders


# A light sweep (before the first capture, after a release: everything must
# run eagerly) of a config this small sweeps every batch, with the plan its
# capture sweeps use: one plan a scenario instead of two, which costs less
# than the extra dispatches (most fuzzed configs are this small).  A manager
# that plans no graph has only light sweeps: they take the boundary plan.
LIGHT_EXHAUSTIVE_BOUND = 1_000


def _plan(config: ManagerConfig, ruleset: str, known: tuple[BatchDescriptor, ...], seed: int, light: bool) -> SweepPlan:
    # A campaign runs one config under many scenario seeds, and most plans
    # (every exhaustive one) do not depend on the seed: those are made once.
    if light and known:
        full = _seeded_plan(config, ruleset, known, 0, False)
        if full.coverage == "exhaustive" and len(full.shapes) <= LIGHT_EXHAUSTIVE_BOUND:
            return full
    plan = _seeded_plan(config, ruleset, known, 0, light)
    return _seeded_plan(config, ruleset, known, seed, light) if plan.seeded and seed != 0 else plan


@lru_cache(maxsize=128)
def _seeded_plan(config: ManagerConfig, ruleset: str, known: tuple[BatchDescriptor, ...], seed: int,
                 light: bool) -> SweepPlan:
    return sweep_plan(config, _boundary_descs(config, ruleset, known), seed=seed, light=light)


@lru_cache(maxsize=64)
def _boundary_descs(config: ManagerConfig, ruleset: str, known: tuple[BatchDescriptor, ...]) -> tuple[BatchDescriptor, ...]:
    # Boundaries from the spec's descriptors and the target's own: a sweep
    # probes around both, so a target that captures other sizes is probed
    # where its dispatch changes too.
    try:
        spec = [d for ds in expected_capture_descs(config, ruleset).values() for d in ds]
    except (ModeResolutionError, ValueError):
        spec = []
    return tuple(dict.fromkeys(spec + list(known)))
