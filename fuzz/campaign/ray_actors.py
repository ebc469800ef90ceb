"""The two Ray actors of a campaign on a cluster (``ray_executor``).

``FindingsSink``: one per campaign, pinned to the driver's node, so that it
writes the driver's run directory.  Workers on any node send it everything
a local worker writes to disk itself: each finding record (the Finding's
JSON and its status), written at once through ``FindingStore`` with the
same rules as a local worker's (provisional files only created, final ones
replacing only their own provisional file, removals only by their writer);
the scenario a worker is about to run (``.work/inflight-w<N>.json``, the
local format, so a death names it and ``fuzz report`` lists it after the
campaign died); the counters and notes, which the driver drains.  It
refuses every change from a worker that is no longer the slot's current
incarnation (one the driver killed or gave up on) and from every worker
once the driver's process is gone: an orphan must not change what the last
report lists.

``WorkerActor``: one per worker (one CPU, or one GPU with ``--backend
cuda``), running ``RayWorker``: the local ``Worker`` (the Hypothesis loop,
pinning, shrinking, replay of saved failures) with the disk replaced by the
sink.  The scenario in flight is sent, and its receipt awaited, *before*
the scenario runs: a worker that then dies (a segfault, the OOM killer, its
node lost) cannot take the name of its scenario with it.  The reply also
carries the campaign's stop request, so stopping costs no extra call.
"""

from __future__ import annotations

import faulthandler
import os
import platform
import threading
import time
import traceback
import warnings
from dataclasses import replace
from typing import Any

import ray

# Before torch is imported below: torch built without NumPy warns at import,
# in every actor's log, and it says nothing about cgsim (the CLI does the same).
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from cgsim.finding import Finding  # noqa: E402
from cgsim.report.findings import FindingStore
from cgsim.report.repro import write_repro
from fuzz.campaign.inflight import InflightFile, inflight_entry
from fuzz.campaign.worker import EXIT_DONE, EXIT_ERROR, EXIT_STORE, Abort, StoreFailed, Worker, WorkerSpec

__all__ = ["FindingsSink", "WorkerActor", "RayWorker", "SINK_TIMEOUT_S"]

SINK_TIMEOUT_S = 60.0  # a sink that does not answer a worker for this long is taken for gone with its driver


class FindingsSink:
    def __init__(self, run_dir: str, driver_pid: int):
        self.run_dir = run_dir
        self.findings_dir = os.path.join(run_dir, "findings")
        self.driver_pid = driver_pid
        self.current: dict[int, int] = {}  # worker index -> its live incarnation
        self.messages: list[tuple] = []
        self.state: dict[int, dict] = {}  # worker index -> {"incarnation", "started", "limit"} (this node's clock)
        self.stop = False
        self.inflight_files: dict[int, InflightFile] = {}  # worker index -> its in-flight file on the driver's disk

    def now(self) -> float:
        return time.time()

    def _driver_alive(self) -> bool:
        try:
            os.kill(self.driver_pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            pass
        return True

    def _live(self, index: int, incarnation: int) -> bool:
        return self.current.get(index) == incarnation and self._driver_alive()

    def _inflight(self, index: int) -> InflightFile:
        if index not in self.inflight_files:
            self.inflight_files[index] = InflightFile(self.run_dir, index)
        return self.inflight_files[index]

    # -- the driver ---------------------------------------------------------------------
    def register(self, index: int, incarnation: int) -> None:
        """From now on only ``incarnation`` of worker ``index`` may write."""
        self.current[index] = incarnation
        self.state.pop(index, None)
        self._inflight(index).clear()

    def drain(self) -> tuple[list, dict]:
        messages, self.messages = self.messages, []
        return messages, {i: dict(s) for i, s in self.state.items()}

    def request_stop(self) -> None:
        self.stop = True

    # -- the workers --------------------------------------------------------------------
    def started(self, index: int, incarnation: int, scenario: dict, limit: float, pid: int, node: str) -> bool:
        """A worker is about to run ``scenario``; returns whether it should stop."""
        if not self._live(index, incarnation):
            return True
        now = time.time()
        self._inflight(index).write(inflight_entry(index, incarnation, pid, scenario, node=node, started=now))
        self.state[index] = {"incarnation": incarnation, "started": now, "limit": limit}
        return self.stop

    def idle(self, index: int, incarnation: int) -> None:
        if self.current.get(index) == incarnation:
            self._inflight(index).clear()
            if index in self.state:
                self.state[index]["started"] = 0.0

    def put(self, index: int, incarnation: int, data: dict) -> Any:
        """``FindingStore.put`` for the worker: "written", "kept", None (not
        allowed), or ["error", text] (the write failed: a full disk)."""
        store = FindingStore(self.findings_dir, allowed=lambda: self._live(index, incarnation), repro=write_repro)
        try:
            return store.put(Finding.from_json(data))
        except OSError as exc:
            return ["error", str(exc)]

    def remove_own(self, index: int, incarnation: int, fid: str, owner: list) -> bool:
        store = FindingStore(self.findings_dir, allowed=lambda: self._live(index, incarnation))
        try:
            return store.remove_own(fid, tuple(owner))
        except OSError:
            return False

    def message(self, msg: tuple) -> None:
        self.messages.append(msg)


class _SinkQueue:
    """The worker's message queue: counters and notes, sent without waiting
    (Ray runs one caller's calls to an actor in order)."""

    def __init__(self, sink: Any):
        self.sink = sink

    def put(self, msg: tuple) -> None:
        self.sink.message.remote(msg)


class _SinkStore:
    """The worker's FindingStore: every change is made by the sink, and awaited."""

    def __init__(self, sink: Any, index: int, incarnation: int):
        self.sink, self.index, self.incarnation = sink, index, incarnation

    def put(self, finding: Finding) -> str | None:
        try:
            done = ray.get(self.sink.put.remote(self.index, self.incarnation, finding.to_json()), timeout=SINK_TIMEOUT_S)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return None  # the campaign is gone: nothing more of ours may change its findings
        if isinstance(done, list):
            raise OSError(done[1])
        return done

    def remove_own(self, fid: str, owner: tuple) -> bool:
        try:
            return bool(ray.get(self.sink.remove_own.remote(self.index, self.incarnation, fid, list(owner)),
                                timeout=SINK_TIMEOUT_S))
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return False


class RayWorker(Worker):
    """``Worker`` on a node that cannot see the driver's disk."""

    def __init__(self, spec: WorkerSpec, sink: Any, node: str):
        super().__init__(spec, queue=_SinkQueue(sink), stop_event=threading.Event(), heartbeat=None)
        self.sink = sink
        self.node = node
        self.store = _SinkStore(sink, spec.index, spec.incarnation)
        self._sink_gone = False

    def prepare(self) -> None:
        # Nothing goes to this node's disk.  The backend is this node's to
        # check (the driver may have no GPU): a worker error, in the notes.
        from cgsim.backends import get_backend

        get_backend(self.o.backend)

    def orphaned(self) -> bool:
        # Ray ends the actors with their driver's job; until it does, the
        # sink refuses their writes, and a sink that stops answering is gone.
        return self._sink_gone

    def write_inflight(self, scenario: Any) -> None:
        from cgsim.observe import backstop_timeout

        limit = backstop_timeout(self.search.timeout_of(scenario, self.o.timeout_s))
        spec = self.spec
        try:
            stop = ray.get(self.sink.started.remote(spec.index, spec.incarnation, scenario.to_json(),
                                                    limit + 1.0 if limit else 0.0, os.getpid(), self.node),
                           timeout=SINK_TIMEOUT_S)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            # Never run a scenario nobody would hear of if it killed us.
            self._sink_gone = True
            raise Abort() from None
        if stop:
            self.stop_event.set()

    def clear_inflight(self) -> None:
        try:
            self.sink.idle.remote(self.spec.index, self.spec.incarnation)
        except ray.exceptions.RayError:
            pass


class WorkerActor:
    """One campaign worker as a Ray actor; ``run`` returns (exit code, traceback)."""

    def __init__(self) -> None:
        try:
            import torch

            torch.set_num_threads(1)  # one core per worker, as local workers
        except Exception:
            pass

    def run(self, spec: WorkerSpec, sink: Any) -> tuple[int, str]:
        node = platform.node()
        # The driver's deadline, on this node's clock (a round trip off at most).
        offset = ray.get(sink.now.remote()) - time.time()
        spec = replace(spec, deadline=spec.deadline - offset)
        gpus = ",".join(str(g) for g in ray.get_gpu_ids()) or None
        sink.message.remote(("hello", spec.index, spec.incarnation,
                             {"node": node, "node_ip": ray.util.get_node_ip_address(),
                              "node_id": ray.get_runtime_context().get_node_id(), "gpu": gpus, "pid": os.getpid()}))
        # A crash's Python stack goes to this worker's log on its node (the
        # NO-CRASH finding says where).
        faulthandler.enable()
        try:
            return RayWorker(spec, sink, node).run(), ""
        except StoreFailed:
            return EXIT_STORE, ""
        except Abort:  # the sink went away with the campaign
            return EXIT_DONE, ""
        except BaseException:
            return EXIT_ERROR, traceback.format_exc()
        finally:
            # The messages above were sent without waiting; one awaited call
            # after them (same caller, in order) has them all delivered before
            # the driver sees this method return and drains the sink.
            try:
                ray.get(sink.now.remote(), timeout=SINK_TIMEOUT_S)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                pass


FindingsSinkActor = ray.remote(FindingsSink)
WorkerRayActor = ray.remote(WorkerActor)
