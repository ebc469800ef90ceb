"""The campaign's supervisor: worker processes, their restarts and deaths.

It starts one process per worker slot (``fuzz.campaign.worker``), watches
them (a heartbeat per slot says since when the running scenario runs),
kills one whose scenario hangs in native code past the timeout, and turns a
death the target caused into a finding (the in-flight scenario is on disk).
A target that left its process unusable (a poisoned CUDA context, a hang
interrupted mid-step) makes the worker exit for a restart.

Signals: the first SIGINT/SIGTERM/SIGHUP asks the workers to stop (they
finish the finding at hand); a second one kills them.  Either way the
campaign writes its final report.  A worker that dies of one of these
signals was stopped from outside: a note, never a finding.

A finding that cannot be written (a full disk: a worker exits with
``EXIT_STORE``, or the parent's own write fails) stops the campaign:
``store_errors`` says why, and the findings that did not reach the disk are
kept in memory for the report's notes.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
import signal
import time
from typing import Any, Callable

from cgsim.observe import Pipeline
from cgsim.properties.harness import NO_CRASH, NO_HANG
from fuzz.campaign import resources
from fuzz.campaign.executor import (EXIT_ERROR_RESTARTS, MAX_RESTARTS, STOP_SIGNALS, ExecutorCommon, Slot,
                                    split_examples)
from fuzz.campaign.executor import signame as _signame
from fuzz.campaign.inflight import describe_inflight, read_inflight
from fuzz.campaign.options import CampaignOptions
from fuzz.campaign.worker import EXIT_DONE, EXIT_ERROR, EXIT_RESTART, EXIT_STORE, worker_main

__all__ = ["Supervisor"]

WARM_WAIT_S = 10.0  # the first worker's memory is measured after its first scenario, or after this long


class Supervisor(ExecutorCommon):
    def __init__(self, options: CampaignOptions, run_id: str, run_dir: str, deadline: float,
                 pipeline: Pipeline | None, strategy: Callable[[str | None, str | None], Any] | None = None,
                 on_finding: Callable[[], None] | None = None, replay: tuple = ()):
        super().__init__(options, run_id, run_dir, deadline, pipeline, strategy, on_finding, replay)
        self.ctx = multiprocessing.get_context(options.method)
        self.queue = self.ctx.Queue()
        self.stop_event = self.ctx.Event()
        # Per worker: when its scenario started, and how long it may run (worker.py).
        self.heartbeat = self.ctx.Array("d", 2 * options.workers, lock=False)
        shares = split_examples(options.max_examples, options.workers)
        gpus = options.gpu_list
        self.slots = [Slot(i, gpus[i % len(gpus)] if gpus else None, shares[i]) for i in range(options.workers)]
        self.waiting: list[Slot] = []  # not started yet: they wait for the first worker's size
        self.worker_bytes = 0  # the largest private memory seen of a running worker

    # -- what the report reads -----------------------------------------------------
    def alive(self) -> int:
        return sum(1 for s in self.slots if s.process is not None)

    def inflight(self) -> list[dict]:
        """The scenario each live worker is running now (for a report rebuilt after a death)."""
        out = []
        for slot in self.slots:
            if slot.process is not None and self.heartbeat[slot.index]:
                data = read_inflight(self.run_dir, slot.index)
                if data is not None:
                    out.append(describe_inflight(data))
        return out

    # -- running ------------------------------------------------------------------
    def start(self) -> None:
        """Start the first worker; the others follow once it is warm, as many
        as the memory budget holds (``_start_waiting``)."""
        first, *self.waiting = self.slots
        self._start(first)

    def poll(self, timeout: float = 0.1) -> bool:
        """Drain messages, watch processes, start waiting workers; False once
        every worker has ended."""
        self._drain(timeout=timeout)
        if self.stopped:
            return False
        self._watch()
        self._start_waiting()
        if all(s.process is None for s in self.slots) and not self.waiting:
            return False
        if time.time() > self.hard_deadline:
            self.notes.append("workers did not stop by the hard deadline; they were terminated")
            self.cut_short = True
            return False
        return True

    def _start(self, slot: Slot) -> None:
        spec = self.worker_spec(slot, gpu=slot.gpu)
        if spec.max_examples == 0:
            slot.end = "done"
            slot.process = None
            return
        self.heartbeat[slot.index] = 0.0
        slot.killed_by_watchdog = False
        p = self.ctx.Process(target=worker_main, args=(spec, self.queue, self.stop_event, self.heartbeat),
                             name=f"cgsim-fuzz-w{slot.index}", daemon=True)
        p.start()
        slot.process = p
        slot.end = "running"
        slot.spans.append([slot.incarnation, time.time(), None, None])

    def _start_waiting(self) -> None:
        """Start the workers that wait, once the first is warm (it ran a
        scenario, ended, or has run ``WARM_WAIT_S``) and its memory is known:
        as many as ``MEMORY_SHARE`` of the memory still available holds, the
        rest never (a note says why).  Stops at once on a stop request and at
        the end of the budget."""
        if not self.waiting:
            return
        first = self.slots[0]
        if first.process is not None:
            self.worker_bytes = max(self.worker_bytes, resources.private_memory(first.process.pid) or 0)
        warm = first.scenarios > 0 or first.process is None or time.time() - first.spans[0][1] >= WARM_WAIT_S
        if not warm:
            return
        waiting, self.waiting = self.waiting, []
        budget = None
        available = resources.available_memory()
        if self.worker_bytes and available is not None:
            budget = resources.MemoryBudget(self.worker_bytes, available)
        fits = len(waiting) if budget is None else min(len(waiting), budget.fits)
        for n, slot in enumerate(waiting):
            if n >= fits or self.stopped or time.time() >= self.deadline:
                slot.end = "not started" + (": memory budget" if n >= fits else "")
                continue
            self._start(slot)
        if budget is not None and fits < len(waiting):
            self.notes.append(budget.describe(self.o.workers - len(waiting), self.o.workers))

    def _watch(self) -> None:
        now = time.time()
        for slot in self.slots:
            p = slot.process
            if p is None:
                continue
            if p.exitcode is None:
                started = self.heartbeat[slot.index]
                # Past the in-process backstop timer too (scaled with the scenario's work).
                limit = self.heartbeat[self.o.workers + slot.index] or (self.o.timeout_s or 0) * 1.5 + 2.0
                if self.o.timeout_s and started and now - started > limit and not slot.killed_by_watchdog:
                    # The in-process timer did not fire (a hang in C code, a
                    # blocked syscall): kill the worker, keep its scenario.
                    slot.killed_by_watchdog = True
                    try:
                        os.kill(p.pid, signal.SIGKILL)
                    except OSError:
                        pass
                continue
            self._exited(slot, p.exitcode)

    def _exited(self, slot: Slot, code: int) -> None:
        slot.process = None
        self._drain()
        restart = False
        work = os.path.join(self.run_dir, ".work")
        if code == EXIT_DONE:
            slot.end = "done"
        elif code == EXIT_STORE:
            slot.end = "stopped: could not write a finding"
            if not self.store_errors:
                self.store_errors.append(f"worker {slot.index} could not write a finding")
            self.stop_event.set()
        elif code == EXIT_RESTART:
            slot.end = "restarted (target left the process unusable)"
            restart = True
        elif code == EXIT_ERROR:
            # cgsim's own machinery failed there (the worker said what, or its
            # traceback does): no restart, the campaign stops with exit 2.
            text = _read(os.path.join(work, f"worker-{slot.index}.err")).strip().splitlines()
            last = text[-1] if text else "no traceback"
            slot.end = f"worker error: {last}"
            if not any(e.startswith(f"worker {slot.index} failed") for e in self.harness_errors):
                self.harness_errors.append(f"worker {slot.index} failed: {last}")
            self.notes.append(f"worker {slot.index} (incarnation {slot.incarnation}) failed: {last}; "
                              f"see .work/worker-{slot.index}.err")
            self.request_stop()
        elif code < 0:
            signame = _signame(-code)
            scenario = self._inflight(slot)
            if slot.killed_by_watchdog:
                limit = self.heartbeat[self.o.workers + slot.index] or self.o.timeout_s
                self._death_finding(slot, scenario, NO_HANG,
                                    f"the scenario ran past its time limit ({limit:g}s, the per-scenario timeout scaled "
                                    f"with its work) without returning to Python; the watchdog killed worker {slot.index}")
                slot.end = "killed by watchdog (hang)"
            elif -code == signal.SIGKILL:
                self.notes.append(f"worker {slot.index} was killed with SIGKILL from outside (OOM killer or a user); "
                                  "at most the scenario it was running is lost")
                slot.end = "killed (SIGKILL)"
            elif -code in STOP_SIGNALS:
                # Sent from outside (the target cannot be told from a user here,
                # and a stop request is never evidence of a bug).
                self.notes.append(f"worker {slot.index} was stopped by {signame} from outside; "
                                  "at most the scenario it was running is lost")
                slot.end = f"stopped ({signame})"
            else:
                stack = _fault_frames(_read(os.path.join(work, f"worker-{slot.index}.fault")))
                where = f"; innermost frames: {stack}" if stack else ""
                self._death_finding(slot, scenario, NO_CRASH,
                                    f"worker {slot.index} died with {signame} while running this scenario{where}")
                slot.end = f"died ({signame})"
            restart = True
        else:
            slot.end = f"exited with status {code}"
            self.notes.append(f"worker {slot.index} exited with unexpected status {code}")
            restart = slot.error_restarts < EXIT_ERROR_RESTARTS
            slot.error_restarts += 1
        slot.close_span()
        if restart and not self.stopped and time.time() < self.deadline and slot.restarts < MAX_RESTARTS:
            slot.restarts += 1
            slot.incarnation += 1
            self._start(slot)

    def _inflight(self, slot: Slot) -> dict | None:
        entry = read_inflight(self.run_dir, slot.index)
        return entry["scenario"] if entry else None

    def _drain(self, timeout: float = 0.0) -> None:
        first = True
        while True:
            try:
                msg = self.queue.get(timeout=timeout) if first and timeout else self.queue.get_nowait()
            except (queue_mod.Empty, OSError, ValueError, EOFError):
                return
            first = False
            self._apply(msg)

    # -- stopping -------------------------------------------------------------------
    def kill_workers(self) -> None:
        for s in self.slots:
            if s.process is not None and s.process.exitcode is None:
                try:
                    s.process.kill()
                except Exception:
                    pass

    def shutdown(self, grace: float = 5.0) -> None:
        """Ask every worker to stop, give them ``grace`` seconds together to
        finish the finding at hand, then kill the rest at once."""
        self.stop_event.set()
        for slot in self.waiting:
            slot.end = "not started"
        self.waiting = []
        end = time.monotonic() + grace
        live = [slot for slot in self.slots if slot.process is not None]
        for slot in live:
            slot.process.join(max(0.0, end - time.monotonic()))
        for slot in live:
            if slot.process.exitcode is None:
                slot.process.kill()
        for slot in live:
            p = slot.process
            p.join(1.0)
            self._drain()
            if slot.end == "running":
                slot.end = ("stopped" if p.exitcode in (EXIT_DONE, EXIT_RESTART) else
                            "stopped: could not write a finding" if p.exitcode == EXIT_STORE else
                            f"terminated ({p.exitcode})")
            slot.close_span()
            slot.process = None
        self._drain()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _fault_frames(text: str, n: int = 3) -> str:
    """The innermost frames of a faulthandler dump, as 'file:line in fn'."""
    frames = [line.strip()[len("File "):] for line in text.splitlines() if line.strip().startswith("File ")]
    return " <- ".join(f.replace('"', "") for f in frames[:n])
