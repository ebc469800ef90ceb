"""Run a Scenario on (target, backend) and return its Trace.

The runner and the workload are the only writers of the Trace: the runner
records what the manager handle returns (candidates, stored graphs,
dispatch decisions, executions, release results), the workload what the
code under test did with it.  A crash, an illegal operation, a hang or a
corrupted state in the target becomes an ``Error`` event, never an uncaught
exception: the properties judge it like anything else the target did.  A
broken environment is the exception: ``TargetEnvironmentError`` propagates
(exit 2 in the CLI), it is never a finding.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import compress, repeat
from operator import attrgetter, is_not

import torch

from cgsim.backends import get_backend
from cgsim.config import ManagerConfig
from cgsim.descriptors import BatchDescriptor
from cgsim.modes import CUDAGraphMode, ModeResolutionError
from cgsim.scenario import Scenario
from cgsim.spec import expected_capture_descs
from cgsim.spec.rulesets import get_ruleset
from cgsim.spec.scheduler import SweepPlan, sweep_plan
from cgsim.targets import get_target, optional_hook
from cgsim.targets.base import Execution, ManagerUnderTest, TargetEnvironmentError, TargetUnsupported
from cgsim.timeouts import ScenarioTimeout, deadline
from cgsim.trace import Candidates, CaptureDone, Dispatch, Error, GraphStored, Release, Replay, Sweep, Trace
from cgsim.workload import OUTPUT_TOLERANCE, Workload

__all__ = ["run_scenario", "ScenarioTimeout", "classify_error"]

ILLEGAL_MARKERS = (
    "operation not permitted when stream is capturing",
    "operation failed due to a previous error during capture",
    "Cannot copy between CPU and CUDA tensors during CUDA graph capture",
    "captures_underway",
)


def classify_error(exc: BaseException) -> str:
    if isinstance(exc, ScenarioTimeout):
        return "timeout"
    text = str(exc)
    if any(m in text for m in ILLEGAL_MARKERS) or type(exc).__name__ == "AcceleratorError":
        return "illegal-op"
    # An out-of-bounds index is a device-side assert on a GPU (illegal); on the
    # CPU mock the same kernel raises IndexError synchronously.
    if isinstance(exc, IndexError) or "out of bounds for dimension" in text:
        return "illegal-op"
    return "crash"


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


def _error(step: int, phase: str, exc: BaseException) -> Error:
    kind = classify_error(exc)
    return Error(step=step, phase=phase, error=kind, exc_type=type(exc).__name__, message=str(exc)[:2000])


def _run_steps(scenario, target, backend, ruleset, workload: Workload, trace: Trace, sweep: bool) -> None:
    unreachable = optional_hook(target, "unreachable")  # optional: a lifecycle the engine cannot be driven through
    try:
        reason = unreachable(scenario) if unreachable is not None else None
        if reason is not None:
            trace.unsupported = reason
            return
        handle = target.build(scenario.config, ruleset, backend, workload)
    except (ScenarioTimeout, TargetEnvironmentError):
        raise
    except TargetUnsupported as exc:
        trace.unsupported = str(exc)
        return
    except BaseException as exc:  # noqa: BLE001 - any failure to build is INIT-TOTAL's business
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        trace.add(_error(-1, "build", exc))
        return
    trace.resolved_mode = handle.resolved_mode
    trace.uses_breakable = handle.uses_breakable
    trace.has_piecewise_runner = handle.has_piecewise_runner
    snap = handle.candidates()
    trace.add(Candidates(phase="initial", capture_descs=snap.capture_descs, candidates=snap.candidates, step=-1))
    known = tuple(snap.capture_descs)
    subs = _SubRuns(handle, trace, scenario)

    def swept(step: int, light: bool = False, stored: tuple = ()) -> bool:
        """Sweep; False when dispatch failed (the Error is recorded).  Before
        a capture and after a release the manager must return NONE for
        everything (``light``): the boundary classes suffice to see it does
        not.  So too after a capture (``light`` False) of a manager that
        planned no graph and stored none (``stored``)."""
        if not sweep:
            return True
        workload.at(max(step, 0), "runtime")
        subs.sweep(step, light)
        try:
            _sweep(handle, scenario.config, scenario, trace, step, known, light or not (known or stored))
        except (ScenarioTimeout, TargetEnvironmentError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001
            where = "during the dispatch sweep"
            if isinstance(exc, _SweepFailed):
                where, exc = f"during the dispatch sweep, dispatching {exc.shape.short()}", exc.exc
            if isinstance(exc, _Corrupt):
                err = Error(step=step, phase="dispatch", error="corrupt", exc_type="CorruptState", message=str(exc))
            else:
                err = _error(step, "dispatch", exc)
            trace.add(Error(step=err.step, phase=err.phase, error=err.error, exc_type=err.exc_type,
                            message=f"{where}: {err.message}"))
            return False
        return True

    if not swept(-1, light=True):
        return
    recomputed = False
    for i, step in enumerate(scenario.steps):
        phase = step.kind
        try:
            if step.kind == "capture":
                workload.at(i, "capture")
                stored: tuple = ()
                try:
                    handle.capture()
                finally:
                    workload.current_desc = None
                    stored = tuple(handle.stored_graphs())
                    for desc in stored:
                        trace.add(GraphStored(desc=desc, step=i))
                trace.add(CaptureDone(step=i, ok=True, captured_flag=handle.captured_flag()))
                subs.captured(i, first=not recomputed)
                if not recomputed:
                    snap = handle.recomputed_candidates()
                    trace.add(Candidates(phase="recomputed", capture_descs=snap.capture_descs,
                                         candidates=snap.candidates, step=i))
                    recomputed = True
                if not swept(i, stored=stored):
                    return
            elif step.kind == "dispatch":
                workload.at(i, "runtime")
                batch = step.batch
                desc = handle.dispatch(batch)
                if not isinstance(desc, BatchDescriptor):
                    raise _Corrupt(f"dispatch returned {desc!r}, not a batch descriptor")
                trace.add(Dispatch(step=i, batch=batch, desc=desc, captured_flag=handle.captured_flag()))
                phase = "replay"
                execution = handle.execute(batch, desc)
                trace.add(_replay_event(i, batch, desc, execution, workload, handle))
                if execution.outputs is not None:
                    trace.outputs[i] = execution.outputs.detach().float().cpu()
                subs.dispatched(i, batch)
            else:
                workload.at(i, "runtime")
                handle.release()
                workload.forget_graphs(kept=_safe(handle.stored_graphs, ()))
                trace.add(Release(step=i, captured_flag_after=handle.captured_flag(),
                                  graphs_after=len(handle.stored_graphs())))
                subs.released(i)
                if not swept(i, light=True):
                    return
        except (ScenarioTimeout, TargetEnvironmentError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001
            if step.kind == "capture":
                trace.add(CaptureDone(step=i, ok=False, captured_flag=_safe(handle.captured_flag, False)))
            err = _error(i, phase, exc)
            if isinstance(exc, _Corrupt):
                err = Error(step=i, phase=phase, error="corrupt", exc_type="CorruptState", message=str(exc))
            trace.add(err)
            # The manager's state is unknown after a failure: stop here rather
            # than report a cascade of consequences.
            return


_MODE = attrgetter("cg_mode")


class _Corrupt(Exception):
    pass


class _SweepFailed(Exception):
    def __init__(self, shape, exc: BaseException):
        super().__init__(str(exc))
        self.shape, self.exc = shape, exc


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


def _sweep(handle: ManagerUnderTest, config: ManagerConfig, scenario: Scenario, trace: Trace, step: int,
           known: tuple[BatchDescriptor, ...], light: bool) -> None:
    plan = _plan(config, scenario.ruleset, known, scenario.seed, light)
    try:
        descs = handle.dispatch_all(plan.shapes)
    except TargetEnvironmentError:
        raise  # a broken environment, not a dispatch decision to judge
    except Exception:
        # Name the batch that broke dispatch: ask one at a time.
        for shape in plan.shapes:
            try:
                handle.dispatch(shape)
            except TargetEnvironmentError:
                raise
            except Exception as exc:
                raise _SweepFailed(shape, exc) from exc
        raise
    if len(descs) != len(plan.shapes):
        raise _Corrupt(f"dispatch_all returned {len(descs)} decisions for {len(plan.shapes)} batches")
    # Equal graph decisions share one object in the Trace (a sweep's few
    # graphs answer thousands of batches).  Eager decisions carry the batch's
    # own counts, so few are equal: they are kept as returned.  C-level passes
    # over the decisions: most targets return their stored descriptors, and
    # then there is nothing to share.
    if not set(map(type, descs)) <= {BatchDescriptor}:
        for shape, d in zip(plan.shapes, descs):
            if not isinstance(d, BatchDescriptor):
                raise _Corrupt(f"dispatch returned {d!r} for {shape.short()}, not a batch descriptor")
    graphs = list(compress(descs, map(is_not, map(_MODE, descs), repeat(CUDAGraphMode.NONE))))
    distinct = dict(zip(map(id, graphs), graphs))
    if len(set(distinct.values())) == len(distinct):
        decisions = tuple(descs)
    else:
        interned: dict[BatchDescriptor, BatchDescriptor] = {}
        decisions = tuple(d if d.cg_mode is CUDAGraphMode.NONE else interned.setdefault(d, d) for d in descs)
    trace.add(Sweep(step=step, captured_flag=handle.captured_flag(), batches=plan.shapes, descs=decisions,
                    coverage=plan.coverage, space=plan.space))


class _SubRuns:
    """The other managers a handle drives (``sub_managers()``, e.g. a draft
    model's), recorded into their sub-traces the way the main one is.  A
    sub-manager that fails is recorded (an Error in its sub-trace) and left
    alone for the rest of the run; the main run goes on."""

    def __init__(self, handle: ManagerUnderTest, trace: Trace, scenario: Scenario):
        getter = getattr(handle, "sub_managers", None)
        self.scenario = scenario
        self.subs: dict[str, tuple] = {}
        for name, sub in (getter() if getter is not None else {}).items():
            st = trace.managers.get(name)
            if st is None:  # its workload was not made with Workload.for_manager
                continue
            st.resolved_mode, st.uses_breakable = sub.handle.resolved_mode, sub.handle.uses_breakable
            st.has_piecewise_runner = sub.handle.has_piecewise_runner
            snap = sub.handle.candidates()
            st.add(Candidates(phase="initial", capture_descs=snap.capture_descs, candidates=snap.candidates, step=-1))
            self.subs[name] = (sub, st, tuple(snap.capture_descs))

    def _each(self, step: int, phase: str, fn) -> None:
        for name, (sub, st, known) in list(self.subs.items()):
            try:
                fn(sub, st, known)
            except (ScenarioTimeout, TargetEnvironmentError, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001
                st.add(_error(step, phase, exc))
                del self.subs[name]

    def sweep(self, step: int, light: bool) -> None:
        def one(sub, st, known) -> None:
            # Light, as the main manager's: also after a capture where this one planned and stored nothing.
            _sweep(sub.handle, sub.config, self.scenario, st, step, known,
                   light or not (known or sub.handle.stored_graphs()))

        self._each(step, "dispatch", one)

    def captured(self, step: int, first: bool) -> None:
        def record(sub, st, known) -> None:
            sub.workload.current_desc = None
            for desc in sub.handle.stored_graphs():
                st.add(GraphStored(desc=desc, step=step))
            st.add(CaptureDone(step=step, ok=True, captured_flag=sub.handle.captured_flag()))
            if first:
                snap = sub.handle.recomputed_candidates()
                st.add(Candidates(phase="recomputed", capture_descs=snap.capture_descs, candidates=snap.candidates,
                                  step=step))

        self._each(step, "capture", record)

    def dispatched(self, step: int, batch) -> None:
        def serve(sub, st, known) -> None:
            b = sub.batch_for(batch)
            if b is None:
                return
            desc = sub.handle.dispatch(b)
            if not isinstance(desc, BatchDescriptor):
                raise _Corrupt(f"dispatch returned {desc!r}, not a batch descriptor")
            st.add(Dispatch(step=step, batch=b, desc=desc, captured_flag=sub.handle.captured_flag()))
            execution = sub.handle.execute(b, desc)
            st.add(_replay_event(step, b, desc, execution, sub.workload, sub.handle))
            if execution.outputs is not None:
                st.outputs[step] = execution.outputs.detach().float().cpu()

        self._each(step, "replay", serve)

    def released(self, step: int) -> None:
        def record(sub, st, known) -> None:
            sub.workload.forget_graphs(kept=_safe(sub.handle.stored_graphs, ()))
            st.add(Release(step=step, captured_flag_after=sub.handle.captured_flag(),
                           graphs_after=len(sub.handle.stored_graphs())))

        self._each(step, "release", record)


def _safe(fn, default):
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return default


def _graph_record(execution: Execution, workload: Workload, handle: ManagerUnderTest) -> tuple[int | None, int | None]:
    """(metadata the graph that ran was captured with, the capture step)."""
    if execution.path == "full":
        rec = workload.graph_record(execution.graph_key)
        return (rec.metadata, rec.step) if rec is not None else (None, None)
    if execution.path == "piecewise":
        rec = workload.piecewise_record(execution.graph_key)
        if rec is None:
            return None, None
        # Compiled pieces run attention eagerly between them: only breakable
        # pieces read metadata captured with them.
        return (rec.metadata if handle.uses_breakable else None), rec.step
    return None, None


def _replay_event(step: int, batch, desc, execution: Execution, workload: Workload, handle: ManagerUnderTest) -> Replay:
    expected = workload.eager_reference(batch)
    out = execution.outputs
    err: float | None = None
    ok = False
    if out is not None and tuple(out.shape) == tuple(expected.shape):
        diff = (out.detach().to(expected.device, expected.dtype) - expected).abs()
        err = float(diff.max()) if diff.numel() else 0.0
        ok = math.isfinite(err) and err <= OUTPUT_TOLERANCE
        if not math.isfinite(err):
            err = float("inf")
    graph_md, from_step = _graph_record(execution, workload, handle)
    return Replay(
        step=step, batch=batch, desc=desc, path=execution.path, graph_metadata=graph_md,
        runtime_metadata=execution.runtime_metadata, metadata_alive=workload.metadata_alive(graph_md),
        max_abs_err=err, outputs_ok=ok, graph_from_step=from_step,
    )
