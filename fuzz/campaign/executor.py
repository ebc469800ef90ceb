"""What runs a campaign's workers, as ``run_campaign`` sees it.

Two executors: ``supervisor.Supervisor`` (worker processes on this host) and
``ray_executor.RayExecutor`` (workers as Ray actors on every node of a
cluster).  ``run_campaign`` drives either through ``Executor``; what they
share (the stop signals, counters, deaths turned into findings, the workers'
messages, each worker's ``WorkerSpec``) is ``ExecutorCommon``; a worker
position is a ``Slot``, each with its share of ``--max-examples``
(``split_examples``) and the same restart limits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from cgsim.finding import Finding
from cgsim.properties.registry import Violation
from cgsim.report.findings import FindingStore
from cgsim.report.repro import write_repro
from cgsim.families import FamilyRegistryError, family_of_scenario
from fuzz.campaign.worker import WorkerSpec

__all__ = ["Executor", "ExecutorCommon", "Slot", "split_examples", "STOP_SIGNALS", "STOP_GRACE_S", "StopSignal",
           "stop_signals_raise", "signame", "MAX_RESTARTS", "EXIT_ERROR_RESTARTS"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# After a stop signal: how long the workers have, together, to finish the finding at hand.
STOP_GRACE_S = 1.5
MAX_RESTARTS = 20  # per worker slot; a target that kills every worker should not spin forever
EXIT_ERROR_RESTARTS = 2


class StopSignal(BaseException):
    """SIGTERM or SIGHUP before the campaign's own handlers are in place
    (start-up: imports, checks, building the strategy).  A BaseException, as
    KeyboardInterrupt is for SIGINT, so no ``except Exception`` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signame(signum))
        self.signum = signum


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """SIGTERM/SIGHUP raise ``StopSignal`` (SIGINT raises KeyboardInterrupt)
    while the body runs, instead of killing the process with nothing said;
    unblocked, in case the process inherited them blocked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_stop(signum: int, frame: Any) -> None:
        raise StopSignal(signum)

    previous = {sig: signal.signal(sig, raise_stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # Block again what was blocked; never unblock (a caller may have blocked them for good).
        signal.pthread_sigmask(signal.SIG_BLOCK, set(mask) & set(STOP_SIGNALS))


@dataclass
class Slot:
    """One worker position; its process may be replaced (a new incarnation)."""

    index: int
    gpu: str | None
    share: int | None
    incarnation: int = 0
    process: Any = None
    restarts: int = 0
    error_restarts: int = 0
    killed_by_watchdog: bool = False
    end: str = "running"
    stats: dict[int, dict] = field(default_factory=dict)  # incarnation -> latest snapshot
    found: set = field(default_factory=set)
    spans: list = field(default_factory=list)  # per incarnation: [incarnation, start, end or None, how it ended]

    @property
    def scenarios(self) -> int:
        return sum(s.get("scenarios", 0) for s in self.stats.values())

    def fuzzed_before(self) -> tuple[float, float, int]:
        """Wall s, CPU s and scenarios of the incarnations before this one (their last snapshots)."""
        earlier = [s for k, s in self.stats.items() if k < self.incarnation]
        return (round(sum(s.get("fuzz_s", 0.0) for s in earlier), 3),
                round(sum(s.get("fuzz_cpu_s", 0.0) for s in earlier), 3), sum(s.get("scenarios", 0) for s in earlier))

    def row(self, t0: float) -> dict:
        spans = [{"incarnation": k, "start_s": round(a - t0, 3), "end_s": None if b is None else round(b - t0, 3), "end": how}
                 for k, a, b, how in self.spans]
        return {"worker": self.index, "gpu": self.gpu, "scenarios": self.scenarios, "restarts": self.restarts,
                "end": self.end, "spans": spans}

    def close_span(self) -> None:
        if self.spans and self.spans[-1][2] is None:
            self.spans[-1][2:] = [time.time(), self.end]


def split_examples(total: int | None, n: int) -> list[int | None]:
    """``--max-examples`` (None: no cap) shared out over ``n`` workers."""
    if total is None:
        return [None] * n
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]


class Executor(Protocol):
    """The interface ``run_campaign`` uses.

    ``start()`` launches the workers, ``poll(timeout)`` drains their messages
    and watches them (False once every worker has ended or the campaign was
    stopped), ``shutdown()`` stops them and keeps their last counters.  What
    the report reads: ``stats()`` (one counter snapshot per worker
    incarnation), ``workers()`` (one row per worker), ``inflight()``,
    ``notes``, ``stop_reason`` (the signal that stopped the campaign),
    ``store_errors`` and ``unwritten`` (findings that could not reach the
    disk), ``harness_errors`` (cgsim's own machinery failed in a worker:
    exit 2), ``cut_short`` (workers terminated at the hard deadline).
    """

    deadline: float
    notes: list[str]
    stop_reason: str | None
    store_errors: list[str]
    harness_errors: list[str]
    unwritten: list[Finding]
    cut_short: bool

    @property
    def stopped(self) -> bool: ...

    def start(self) -> None: ...

    def poll(self, timeout: float = 0.1) -> bool: ...

    def stats(self) -> list[dict]: ...

    def workers(self) -> list[dict]: ...

    def alive(self) -> int: ...

    def inflight(self) -> list[dict]: ...

    def request_stop(self) -> None: ...

    def install_signals(self) -> tuple: ...

    def restore_signals(self, previous: tuple, keep_blocked: bool = False) -> None: ...

    def shutdown(self, grace: float = 5.0) -> None: ...


class ExecutorCommon:
    """The parts of an executor that do not depend on where workers run.

    ``__init__`` sets what every executor keeps about its campaign; a subclass
    adds ``slots`` (each with ``index``, ``incarnation``, ``stats``, ``found``
    and ``row()``) and ``stop_event`` (anything with ``set()``), and defines
    ``kill_workers()``.
    """

    slots: list[Slot]
    stop_event: Any

    def __init__(self, options: Any, run_id: str, run_dir: str, deadline: float, pipeline: Any,
                 strategy: Callable[[str | None, str | None], Any], on_finding: Callable[[], None] | None,
                 replay: tuple) -> None:
        self.o = options
        self.run_id = run_id
        self.run_dir = run_dir
        self.deadline = deadline
        self.hard_deadline = deadline + options.shrink_grace + (options.timeout_s or 0) + 10.0
        self.pipeline = pipeline
        self.strategy = strategy
        self.on_finding = on_finding
        self.replay = replay  # failures saved by earlier campaigns, replayed first (example_db)
        self.notes: list[str] = []
        self.stop_reason: str | None = None
        self.store_errors: list[str] = []  # why findings could not be written (a full disk)
        self.unwritten: list[Finding] = []  # findings that never reached the disk
        # cgsim's own machinery failed in a worker (never a finding): the campaign stops, exit 2.
        self.harness_errors: list[str] = []
        self.cut_short = False
        self.started = time.time()

    # -- what the report reads -----------------------------------------------------
    def stats(self) -> list[dict]:
        return [s for slot in self.slots for s in slot.stats.values()]

    def workers(self) -> list[dict]:
        return [slot.row(self.started) for slot in self.slots]

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None or bool(self.store_errors) or bool(self.harness_errors)

    def request_stop(self) -> None:
        """Ask every worker to stop after the finding at hand."""
        self.stop_event.set()

    def kill_workers(self) -> None:
        raise NotImplementedError

    def worker_spec(self, slot: Slot, gpu: str | None = None) -> WorkerSpec:
        """What the worker of ``slot`` runs, in its current incarnation: the
        rest of its share of ``--max-examples`` (0: nothing left to run)."""
        share = slot.share
        if share is not None:
            share = max(0, share - slot.scenarios)
        return WorkerSpec(
            options=self.o, index=slot.index, incarnation=slot.incarnation, run_id=self.run_id, run_dir=self.run_dir,
            parent_pid=os.getpid(), deadline=self.deadline, max_examples=share, gpu=gpu,
            skip_properties=tuple(sorted(slot.found)), pipeline=self.pipeline, strategy=self.strategy,
            replay=self.replay if slot.incarnation == 0 else (), fuzzed_before=slot.fuzzed_before(),
        )

    # -- the workers' messages -----------------------------------------------------
    def _apply(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "stats":
            _, index, incarnation, stats = msg
            slot = self.slots[index]
            slot.stats[incarnation] = stats
            slot.found.update(stats.get("found", ()))
        elif kind == "finding":
            if self.on_finding is not None:
                self.on_finding()
        elif kind == "note":
            self.notes.append(f"worker {msg[1]}: {msg[2]}")
        elif kind == "worker-error":
            self.harness_errors.append(f"worker {msg[1]} failed: {msg[2]}")
            self.request_stop()
        elif kind == "store-error":
            _, index, text, data = msg
            self.store_errors.append(f"worker {index}: {text}")
            try:
                self.unwritten.append(Finding.from_json(data))
            except ValueError:
                pass
            self.request_stop()

    # -- deaths ----------------------------------------------------------------------
    def _death_finding(self, slot: Any, scenario: dict | None, prop: str, message: str,
                       note: str = "recorded by the parent after the worker process died", **extra: Any) -> None:
        if scenario is None:
            self.notes.append(f"{message}; the scenario it was running could not be read back")
            return
        try:
            short = family_of_scenario(scenario).scenario_short(scenario)
        except (FamilyRegistryError, TypeError, ValueError, KeyError):
            short = ""
        f = Finding.from_violation(Violation(prop, message), scenario, self.o.target, self.o.backend, short).with_(
            status="unshrunk", run_id=self.run_id, worker=slot.index, elapsed_s=time.time() - self.started,
            extra={"timeout_s": self.o.timeout_s, "incarnation": slot.incarnation, "recorded_at": round(time.time(), 3),
                   **dict(self.o.environment),
                   "note": note, **extra},
        )
        try:
            FindingStore(os.path.join(self.run_dir, "findings"), repro=write_repro).put(f)
        except OSError as exc:
            self.store_errors.append(f"cannot write finding {f.id}: {exc}")
            self.unwritten.append(f)
            self.request_stop()
        slot.found.add(prop)
        if self.on_finding is not None:
            self.on_finding()

    # -- stopping -------------------------------------------------------------------
    def install_signals(self) -> tuple:
        """Our SIGINT/SIGTERM/SIGHUP handlers, the signals unblocked (a
        process may inherit them blocked, e.g. from a test runner); returns
        what ``restore_signals`` puts back."""
        if threading.current_thread() is not threading.main_thread():
            return ({}, None)
        previous = {}

        def handler(signum: int, frame: Any) -> None:
            first = self.stop_reason is None
            if first:
                self.stop_reason = signame(signum)
            self.request_stop()
            if not first:  # a second Ctrl-C: stop waiting for workers
                self.kill_workers()

        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, handler)
        mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return (previous, mask)

    @staticmethod
    def restore_signals(previous: tuple, keep_blocked: bool = False) -> None:
        """Put back the handlers and the signal mask.  ``keep_blocked``: block
        the stop signals for good first (a process about to exit)."""
        handlers, mask = previous
        if mask is None:
            return
        if keep_blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        for sig, h in handlers.items():
            signal.signal(sig, h)
        if not keep_blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
