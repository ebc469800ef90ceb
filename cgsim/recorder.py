"""Record one manager into one trace.

The runner drives a handle step by step; the handle and each other manager
it drives (``sub_managers()``, e.g. a draft model's) get a
``ManagerRecorder``, which records what that manager returns into its own
trace (the main one, or ``trace.managers[name]``): the header and
candidates once it is built, the graphs a capture stored and the memory
their captures took (where the backend accounts it), dispatch sweeps,
dispatches with their replays, releases, and the ``Error`` a failure
becomes.  One recorder for every manager, so a sub-trace is recorded exactly
as the main trace is.
"""

from __future__ import annotations

import math
from itertools import compress, repeat
from operator import attrgetter, is_not
from typing import Any, Callable

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.spec.scheduler import SweepPlan
from cgsim.targets.base import Execution, ManagerUnderTest, TargetEnvironmentError
from cgsim.timeouts import ScenarioTimeout
from cgsim.trace import (
    Candidates,
    CaptureDone,
    Dispatch,
    Error,
    GraphBytes,
    GraphStored,
    Release,
    Replay,
    Sweep,
    Trace,
)
from cgsim.workload import OUTPUT_TOLERANCE, Workload

__all__ = ["ManagerRecorder", "PlanFor", "FATAL", "classify_error", "error_event"]

# Never a recorded failure: the run's own deadline, a broken environment, the user.
FATAL = (ScenarioTimeout, TargetEnvironmentError, KeyboardInterrupt, SystemExit)

# The sweep plan for (a manager's config, the descriptors it planned, light).
PlanFor = Callable[[ManagerConfig, tuple[BatchDescriptor, ...], bool], SweepPlan]

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


def error_event(step: int, phase: str, exc: BaseException) -> Error:
    """The Error event a failure of ``phase`` at ``step`` becomes."""
    where = None
    if isinstance(exc, _SweepFailed):
        where, exc = exc.where, exc.exc
    if isinstance(exc, _Corrupt):
        err = Error(step=step, phase=phase, error="corrupt", exc_type="CorruptState", message=str(exc))
    else:
        err = Error(step=step, phase=phase, error=classify_error(exc), exc_type=type(exc).__name__,
                    message=str(exc)[:2000])
    if where is not None:
        err = Error(step=err.step, phase=err.phase, error=err.error, exc_type=err.exc_type,
                    message=f"{where}: {err.message}")
    return err


class ManagerRecorder:
    """Records one manager (a handle, or a ``SubManager``'s) into one trace.
    ``batch_for``: the batch this manager is asked about when the main one
    serves a batch (None: not asked); the main manager's is the batch itself.
    ``phase``: the phase of the step in progress, the one a failure is
    recorded in."""

    def __init__(self, handle: ManagerUnderTest, workload: Workload, config: ManagerConfig, trace: Trace,
                 plan_for: PlanFor, batch_for: Callable[[Batch], Batch | None] | None = None):
        self.handle, self.workload, self.config, self.trace = handle, workload, config, trace
        self.plan_for = plan_for
        self.batch_for = batch_for
        self.known: tuple[BatchDescriptor, ...] = ()  # the capture descriptors it planned
        self.stored: tuple[BatchDescriptor, ...] = ()  # what its last capture stored
        self.pools: dict[Any, int] = {}  # the pools its graphs captured into, numbered as first seen
        self.phase = "build"

    def start(self) -> None:
        """The manager is built: the trace's header, and its candidates as it holds them."""
        handle = self.handle
        # The engine's own answer for the alignment, where the handle asked its engine (base.ManagerUnderTest).
        self.trace.record_built(handle.resolved_mode, handle.uses_breakable, handle.has_piecewise_runner,
                                getattr(handle, "engine_alignment", None))
        snap = handle.candidates()
        self.trace.add(Candidates(phase="initial", capture_descs=snap.capture_descs, candidates=snap.candidates,
                                  step=-1))
        self.known = tuple(snap.capture_descs)

    def capture(self, step: int) -> None:
        """Capture (the main handle: the others capture inside it) and record what it stored."""
        self.phase = "capture"
        try:
            self.handle.capture()
        finally:
            self.graphs_stored(step)
        self.capture_done(step)

    def captured(self, step: int, first: bool) -> None:
        """What a manager that captured inside the main one's capture stored;
        after the first capture also its recomputed candidates."""
        self.phase = "capture"
        self.graphs_stored(step)
        self.capture_done(step)
        if first:
            self.recomputed(step)

    def graphs_stored(self, step: int) -> None:
        self.workload.current_desc = None
        self.stored = tuple(self.handle.stored_graphs())
        for desc in self.stored:
            self.trace.add(GraphStored(desc=desc, step=step))
        self.graph_bytes(step)

    def graph_bytes(self, step: int) -> None:
        """What each stored FULL graph's capture took from its pool, and what the pool reserves now."""
        pool_memory = self.workload.backend.pool_memory
        if pool_memory is None:
            return
        for desc in self.stored:
            seen = self.workload.capture_bytes(desc)
            if seen is None:
                continue
            pool = self.pools.setdefault(seen.pool, len(self.pools))
            self.trace.add(GraphBytes(step=step, desc=desc, pool=pool, graph_bytes=seen.graph_bytes,
                                      forward_bytes=seen.forward_bytes,
                                      pool_bytes=pool_memory(seen.pool).reserved_bytes))

    def capture_done(self, step: int) -> None:
        self.trace.add(CaptureDone(step=step, ok=True, captured_flag=self.handle.captured_flag()))

    def capture_failed(self, step: int) -> None:
        self.trace.add(CaptureDone(step=step, ok=False, captured_flag=_safe(self.handle.captured_flag, False)))

    def recomputed(self, step: int) -> None:
        """Candidate init run again on the finished manager."""
        self.phase = "capture"
        snap = self.handle.recomputed_candidates()
        self.trace.add(Candidates(phase="recomputed", capture_descs=snap.capture_descs, candidates=snap.candidates,
                                  step=step))

    def sweep(self, step: int, light: bool) -> None:
        """Ask the manager to dispatch every batch of its plan, without running
        them.  ``light``: everything must run eagerly (before a capture, after
        a release), so the boundary classes suffice; so too after a capture
        of a manager that planned no graph and stored none."""
        self.phase = "dispatch"
        try:
            plan = self.plan_for(self.config, self.known, light or not (self.known or self.stored))
            _record_sweep(self.handle, plan, self.trace, step)
        except FATAL:
            raise
        except _SweepFailed:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure of the sweep is recorded as one
            raise _SweepFailed(exc) from exc

    def dispatch(self, step: int, batch: Batch) -> None:
        """Dispatch the batch (this manager's, ``batch_for``), run it and record both."""
        self.phase = "dispatch"
        if self.batch_for is not None:
            batch = self.batch_for(batch)
            if batch is None:
                return
        desc = self.handle.dispatch(batch)
        if not isinstance(desc, BatchDescriptor):
            raise _Corrupt(f"dispatch returned {desc!r}, not a batch descriptor")
        self.trace.add(Dispatch(step=step, batch=batch, desc=desc, captured_flag=self.handle.captured_flag()))
        self.phase = "replay"
        backend = self.workload.backend
        backend.take_replay_streams()  # replays before this step are not its own
        step_stream = self.workload.stream_token(backend.cuda.current_stream())
        execution = self.handle.execute(batch, desc)
        replayed_on = tuple(map(self.workload.stream_token, backend.take_replay_streams()))
        self.trace.add(_replay_event(step, batch, desc, execution, self.workload, self.handle, step_stream,
                                     replayed_on))
        if execution.outputs is not None:
            self.trace.outputs[step] = execution.outputs.detach().float().cpu()

    def release(self, step: int) -> None:
        """Release the graphs (the main handle: the others release inside it) and record it."""
        self.phase = "release"
        self.handle.release()
        self.released(step)

    def released(self, step: int) -> None:
        self.phase = "release"
        self.workload.forget_graphs(kept=_safe(self.handle.stored_graphs, ()))
        self.trace.add(Release(step=step, captured_flag_after=self.handle.captured_flag(),
                               graphs_after=len(self.handle.stored_graphs())))

    def fail(self, step: int, exc: BaseException) -> None:
        """Record a failure of the step in progress as an Error event."""
        self.trace.add(error_event(step, self.phase, exc))


_MODE = attrgetter("cg_mode")


class _Corrupt(Exception):
    """The manager answered with something no manager can (a corrupted state)."""


class _SweepFailed(Exception):
    """A dispatch sweep failed; ``where`` names the batch when one alone broke dispatch."""

    def __init__(self, exc: BaseException, shape: Any = None):
        super().__init__(str(exc))
        self.exc = exc
        self.where = "during the dispatch sweep" + (f", dispatching {shape.short()}" if shape is not None else "")


def _record_sweep(handle: ManagerUnderTest, plan: SweepPlan, trace: Trace, step: int) -> None:
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
                raise _SweepFailed(exc, shape) from exc
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


def _replay_event(step: int, batch, desc, execution: Execution, workload: Workload, handle: ManagerUnderTest,
                  step_stream: int | None, replay_streams: tuple[int, ...]) -> Replay:
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
        max_abs_err=err, outputs_ok=ok, graph_from_step=from_step, step_stream=step_stream,
        replay_streams=replay_streams,
    )
