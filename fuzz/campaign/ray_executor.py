"""A campaign's workers as Ray actors on every node of a cluster
(``python -m fuzz run --ray [ADDRESS|auto|local]``), the sibling of the
local ``supervisor``.

The cluster itself (connecting, bounding the workers by it) is
``cluster``'s; the run joins it before this executor starts.

- ``RayExecutor``: one actor per worker, one CPU each, or one GPU each with
  ``--backend cuda`` (``ray_actors.WorkerActor``), spread over the nodes;
  the same slots, shares of ``--max-examples``, seeds
  (``derive_seed(seed, worker, incarnation, chunk)``: disjoint streams),
  restarts and deaths-as-findings as the local supervisor.

Where findings go: a worker on another node cannot write the driver's disk,
so it sends each finding record to ``ray_actors.FindingsSink``, an actor on
the driver's node that writes it with the same ``FindingStore`` rules; a
finding is on disk the moment the driver's node receives it.  If the driver
dies, Ray ends its job's actors (they are not detached) and the sink
refuses their writes meanwhile; what is lost is at most the records in
transit and the scenarios in flight, which the sink's in-flight files name
(``fuzz report`` lists them).

Deaths (``ray.exceptions.RayActorError``): the driver restarts the worker
as a new actor (a new incarnation), and its in-flight scenario becomes a
finding as a local worker's death does: NO-HANG when the watchdog killed
it (its scenario ran past the backstop), NO-CRASH when its process died or
its node was lost while it ran a scenario.  Ray reports a process that died
the same way whatever killed it (a segfault, abort, the kernel's OOM killer,
``kill -9``), so those findings say so, and their replay tells.  A worker
stopped by ``ray.kill`` from outside, by Ray's memory monitor or by a
preempted node is a note, as a local worker killed from outside is.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from cgsim.observe import Pipeline
from cgsim.properties.harness import NO_CRASH, NO_HANG
from cgsim.text import first_line
from fuzz.campaign.cluster import Cluster
from fuzz.campaign.executor import EXIT_ERROR_RESTARTS, MAX_RESTARTS, ExecutorCommon, Slot, split_examples
from fuzz.campaign.inflight import describe_inflight, read_inflight
from fuzz.campaign.options import CampaignOptions
from fuzz.campaign.worker import EXIT_DONE, EXIT_ERROR, EXIT_RESTART, EXIT_STORE

__all__ = ["RayExecutor", "RaySlot"]

_CALL_TIMEOUT_S = 60.0


@dataclass
class RaySlot(Slot):
    actor: Any = None
    ref: Any = None  # the actor's run() result
    stopping: bool = False  # killed by the driver at the end
    node: str | None = None
    node_ip: str | None = None
    node_id: str | None = None
    pid: int | None = None

    def row(self, t0: float) -> dict:
        return {**super().row(t0), "node": self.node, "node_ip": self.node_ip}


class RayExecutor(ExecutorCommon):
    def __init__(self, options: CampaignOptions, run_id: str, run_dir: str, deadline: float,
                 pipeline: Pipeline | None, strategy: Callable[[str | None, str | None], Any] | None = None,
                 on_finding: Callable[[], None] | None = None, replay: tuple = ()):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from fuzz.campaign.ray_actors import FindingsSinkActor

        self._ray = ray
        super().__init__(options, run_id, run_dir, deadline, pipeline, strategy, on_finding, replay)
        self.cluster: Cluster = options.cluster
        # Set from signal handlers too, where no Ray call may be made: poll()
        # and shutdown() pass it on.
        self.stop_event = threading.Event()
        self._kill_requested = False
        self._stop_sent = False
        self.state: dict[int, dict] = {}
        shares = split_examples(options.max_examples, options.workers)
        self.slots = [RaySlot(i, None, shares[i]) for i in range(options.workers)]
        # Pinned to this machine (no CPU of its own): it writes the run directory.
        self.sink = FindingsSinkActor.options(
            num_cpus=0, max_restarts=0, name=f"cgsim-{run_id}-sink",
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.cluster.driver_node, soft=False),
        ).remote(run_dir, os.getpid())
        self._call(self.sink.now)

    def _call(self, method: Any, *args: Any) -> Any:
        return self._ray.get(method.remote(*args), timeout=_CALL_TIMEOUT_S)

    # -- what the report reads -----------------------------------------------------
    def alive(self) -> int:
        return sum(1 for s in self.slots if s.ref is not None)

    def inflight(self) -> list[dict]:
        out = []
        for slot in self.slots:
            st = self.state.get(slot.index)
            if slot.ref is None or not st or not st.get("started"):
                continue
            data = read_inflight(self.run_dir, slot.index)
            if data is not None and data.get("incarnation") == slot.incarnation:
                out.append({**describe_inflight(data), "node": data.get("node")})
        return out

    # -- running ------------------------------------------------------------------
    def start(self) -> None:
        for slot in self.slots:
            self._start(slot)

    def _start(self, slot: RaySlot) -> None:
        from fuzz.campaign.ray_actors import WorkerRayActor

        spec = self.worker_spec(slot)
        if spec.max_examples == 0:
            slot.end = "done"
            return
        self._call(self.sink.register, slot.index, slot.incarnation)
        resources = {"num_cpus": 1, "num_gpus": 1 if self.o.backend == "cuda" else 0}
        slot.actor = WorkerRayActor.options(
            **resources, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD",
            name=f"cgsim-{self.run_id}-w{slot.index}.{slot.incarnation}",
        ).remote()
        slot.ref = slot.actor.run.remote(spec, self.sink)
        slot.killed_by_watchdog = False
        slot.end = "starting"
        slot.spans.append([slot.incarnation, time.time(), None, None])

    def poll(self, timeout: float = 0.1) -> bool:
        """Drain the sink, watch the actors; False once every worker has ended."""
        refs = [s.ref for s in self.slots if s.ref is not None]
        if refs:
            self._ray.wait(refs, num_returns=1, timeout=timeout)
        self._pass_on_stop()
        self._drain()
        if self.stopped:
            return False
        self._watch()
        if all(s.ref is None for s in self.slots):
            return False
        if time.time() > self.hard_deadline:
            self.notes.append("workers did not stop by the hard deadline; they were terminated")
            self.cut_short = True
            return False
        return True

    def _pass_on_stop(self) -> None:
        if self.stop_event.is_set() and not self._stop_sent:
            self._stop_sent = True
            try:
                self._call(self.sink.request_stop)
            except Exception:
                pass
        if self._kill_requested:
            self._kill_all()

    def _drain(self) -> None:
        ray = self._ray
        try:
            messages, state = self._call(self.sink.drain)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
            if not self.store_errors:
                self.store_errors.append(f"the actor writing findings on this machine stopped answering "
                                         f"({type(exc).__name__}: {first_line(exc, 200)})")
            self.request_stop()
            return
        for msg in messages:
            if msg[0] == "hello":
                _, index, incarnation, info = msg
                slot = self.slots[index]
                if incarnation == slot.incarnation:
                    slot.node, slot.node_ip, slot.node_id = info["node"], info["node_ip"], info["node_id"]
                    slot.gpu, slot.pid = info["gpu"], info["pid"]
                    if slot.end == "starting":
                        slot.end = "running"
            else:
                self._apply(msg)
        self.state = state

    def _watch(self) -> None:
        refs = [s.ref for s in self.slots if s.ref is not None]
        ready = set(self._ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        now = self._call(self.sink.now) if self.o.timeout_s else 0.0  # the sink's clock stamps "started"
        for slot in self.slots:
            if slot.ref is None:
                continue
            if slot.ref in ready:
                self._ended(slot)
                continue
            st = self.state.get(slot.index)
            if not self.o.timeout_s or not st or st["incarnation"] != slot.incarnation or not st["started"]:
                continue
            limit = st["limit"] or self.o.timeout_s * 1.5 + 2.0
            if now - st["started"] > limit and not slot.killed_by_watchdog:
                # The in-process timer did not fire (a hang in C code, a
                # blocked syscall): kill the actor, keep its scenario.
                slot.killed_by_watchdog = True
                self._kill(slot)

    def _kill(self, slot: RaySlot) -> None:
        try:
            self._ray.kill(slot.actor, no_restart=True)
        except Exception:
            pass

    def _ended(self, slot: RaySlot) -> None:
        ray = self._ray
        ref, slot.ref = slot.ref, None
        try:
            code, text = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            self._drain()  # the dead worker's last counters
            restart = self._died(slot, exc)
        else:
            self._drain()
            restart = self._exited(slot, code, text)
            self._kill(slot)  # its process ends: one the target poisoned must not be reused
        slot.actor = None
        slot.close_span()
        if restart and not self.stopped and time.time() < self.deadline and slot.restarts < MAX_RESTARTS:
            slot.restarts += 1
            slot.incarnation += 1
            self._start(slot)

    def _where(self, slot: RaySlot) -> str:
        where = f"worker {slot.index}"
        if slot.node:
            where += f" (a Ray actor on node {slot.node}" + (f", pid {slot.pid})" if slot.pid else ")")
        return where

    def _exited(self, slot: RaySlot, code: int, text: str) -> bool:
        """The actor's run() returned ``code``: the local exit statuses."""
        if code == EXIT_DONE:
            slot.end = "done"
        elif code == EXIT_STORE:
            slot.end = "stopped: could not write a finding"
            if not self.store_errors:
                self.store_errors.append(f"worker {slot.index} could not write a finding")
            self.request_stop()
        elif code == EXIT_RESTART:
            slot.end = "restarted (target left the process unusable)"
            return True
        elif code == EXIT_ERROR:
            lines = text.strip().splitlines()
            last = lines[-1] if lines else "no traceback"
            name = f"worker-{slot.index}.err"
            try:
                with open(os.path.join(self.run_dir, ".work", name), "a", encoding="utf-8") as fh:
                    fh.write(f"{self._where(slot)}, incarnation {slot.incarnation}:\n{text}")
            except OSError:
                pass
            slot.end = f"worker error: {last}"
            self.notes.append(f"{self._where(slot)} (incarnation {slot.incarnation}) failed: {last}; see .work/{name}")
            # cgsim's own machinery failed there: never restarted into it again, exit 2 (as a local worker).
            self.harness_errors.append(f"worker {slot.index} failed: {last}")
            self.request_stop()
            return False
        else:
            slot.end = f"exited with status {code}"
            self.notes.append(f"worker {slot.index} exited with unexpected status {code}")
            slot.error_restarts += 1
            return slot.error_restarts <= EXIT_ERROR_RESTARTS
        return False

    def _inflight_scenario(self, slot: RaySlot) -> dict | None:
        data = read_inflight(self.run_dir, slot.index)
        if data is None or data.get("incarnation") != slot.incarnation:
            return None
        return data["scenario"]

    def _node_lost(self, slot: RaySlot, message: str) -> bool:
        if "node has died" in message or "node died" in message:
            return True
        if slot.node_id is None:
            return False
        try:
            return not any(n["NodeID"] == slot.node_id and n.get("Alive") for n in self._ray.nodes())
        except Exception:
            return False

    def _died(self, slot: RaySlot, exc: Exception) -> bool:
        """The actor died (its process, or its node); True: restart it."""
        message = str(exc)
        where = self._where(slot)
        if slot.stopping:
            slot.end = "terminated"
            return False
        if getattr(exc, "actor_init_failed", False):
            slot.end = "worker error: the actor could not start"
            self.notes.append(f"worker {slot.index} could not start as a Ray actor: {_ray_reason(message)}")
            slot.error_restarts += 1
            return slot.error_restarts <= EXIT_ERROR_RESTARTS
        scenario = self._inflight_scenario(slot)
        ray_note = "recorded by the driver after the worker's Ray actor died"
        if slot.killed_by_watchdog:
            st = self.state.get(slot.index) or {}
            limit = st.get("limit") or self.o.timeout_s
            self._death_finding(slot, scenario, NO_HANG,
                                f"the scenario ran past its time limit ({limit:g}s, the per-scenario timeout scaled "
                                f"with its work) without returning to Python; the watchdog killed {where}",
                                note=ray_note, node=slot.node)
            slot.end = "killed by watchdog (hang)"
        elif "killed by `ray.kill`" in message:
            self.notes.append(f"{where} was killed with ray.kill from outside; at most the scenario it was running "
                              "is lost")
            slot.end = "killed (ray.kill)"
        elif "low on memory" in message or type(exc).__name__ == "OutOfMemoryError":
            self.notes.append(f"Ray's memory monitor killed {where} (its node ran low on memory); at most the "
                              "scenario it was running is lost")
            slot.end = "killed (node low on memory)"
        elif getattr(exc, "preempted", False):
            self.notes.append(f"the node of {where} was preempted; at most the scenario it was running is lost")
            slot.end = "node preempted"
        elif self._node_lost(slot, message):
            self._death_finding(slot, scenario, NO_CRASH,
                                f"node {slot.node or '?'} was lost while {where} ran this scenario "
                                f"({_ray_reason(message)}); a node also dies of causes outside the target "
                                "(hardware, a reboot, the network): replay it to tell",
                                note=ray_note, node=slot.node)
            slot.end = "node lost"
        else:
            self._death_finding(slot, scenario, NO_CRASH,
                                f"{where} died while running this scenario ({_ray_reason(message)}); Ray reports a "
                                "crash (SIGSEGV, abort) the same way as kill -9 or the kernel's OOM killer, so replay "
                                "it to tell; the worker's Python stack, if it crashed, is in its Ray log on that node",
                                note=ray_note, node=slot.node)
            slot.end = "died"
        return True

    # -- stopping -------------------------------------------------------------------
    def kill_workers(self) -> None:
        # From a signal handler: no Ray call here; poll() and shutdown() act on it.
        self._kill_requested = True

    def _kill_all(self) -> None:
        for slot in self.slots:
            if slot.actor is not None and not slot.stopping:
                slot.stopping = True
                self._kill(slot)

    def shutdown(self, grace: float = 5.0) -> None:
        ray = self._ray
        self.stop_event.set()
        self._pass_on_stop()
        end = time.monotonic() + grace
        while time.monotonic() < end and not self._kill_requested:
            refs = [s.ref for s in self.slots if s.ref is not None]
            if not refs:
                break
            ray.wait(refs, num_returns=len(refs), timeout=0.1)
            self._drain()
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            for slot in self.slots:
                if slot.ref is not None and slot.ref in ready:
                    self._finish(slot)
        self._kill_all()
        for slot in self.slots:
            if slot.ref is not None:
                self._finish(slot)
        try:
            self._drain()
        except Exception:
            pass
        try:
            ray.kill(self.sink, no_restart=True)
        except Exception:
            pass
        if self.cluster.opened:
            ray.shutdown()

    def _finish(self, slot: RaySlot) -> None:
        ray = self._ray
        ref, slot.ref = slot.ref, None
        try:
            code, _ = ray.get(ref, timeout=10.0)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            code = None
        if slot.end in ("running", "starting"):
            slot.end = ("stopped" if code in (EXIT_DONE, EXIT_RESTART) else
                        "stopped: could not write a finding" if code == EXIT_STORE else "terminated")
        if code is not None:
            self._kill(slot)
        slot.actor = None
        slot.close_span()


def _ray_reason(message: str) -> str:
    """Ray's one-line reason for an actor's death, out of its long message."""
    for line in message.splitlines():
        line = line.strip()
        if line.startswith("The actor is dead because") or line.startswith("The actor died because"):
            return first_line(line.split(" Some common causes")[0], 300)
    return first_line(message, 300)
