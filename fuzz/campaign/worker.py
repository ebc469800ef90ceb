"""One campaign worker: a process that runs Hypothesis over Scenarios until its
deadline, writing every finding to disk itself the moment it is confirmed.

Why a worker writes its own findings: the parent may die or be killed, and a
worker killed with SIGKILL must lose at most the scenario it was running.  The
parent only merges what is on disk.

What happens to a failure (written at once, pinned and shrunk, pending,
final) is ``lifecycle.FindingLifecycle``'s; the worker runs the scenarios,
replays a new failure once before anything is written, and tells the
lifecycle what it saw.  What the scenarios covered is counted by
``coverage.Coverage``; the scenario in flight is announced through
``inflight``.

Every finding file has its ``repro_<id>.py`` beside it, written first.

A worker ends with its campaign: the kernel kills it when the parent dies
(``PR_SET_PDEATHSIG``), and it checks its parent before every scenario and,
under the findings lock, before it touches a finding file
(``cgsim.report.findings.FindingStore``), so an orphan never rewrites or
removes what the last report lists.  SIGINT is ignored and SIGTERM/SIGHUP
only ask the worker to stop: the campaign decides when its workers stop, and
a signal sent to the whole process group is never a crash of the target.

A finding that cannot be written (a full disk) is sent to the parent with
the error, and the worker stops with ``EXIT_STORE``: nothing more can be
recorded, and the findings already on disk stay as they are.

Properties that are not worth shrinking (a hang costs a timeout per attempt)
are written unshrunk; a target that left the process unusable makes the
worker exit for a restart.

Determinism: a chunk is one Hypothesis run of ``chunk_examples`` examples with
the seed ``derive_seed(seed, worker, incarnation, chunk)`` and no example
database, so the same seed explores the same scenarios in the same order.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from cgsim.finding import Finding
from cgsim.observe import Outcome, Pipeline, backstop_timeout
from cgsim.profiles import get_profile
from cgsim.report.findings import FindingStore
from cgsim.report.repro import write_repro
from cgsim.text import first_line
from fuzz.campaign.coverage import Coverage
from fuzz.campaign.decode_scenarios import NOT_REACHABLE
from fuzz.campaign.inflight import InflightFile, inflight_entry
from fuzz.campaign.lifecycle import FindingLifecycle, ShrinkState
from fuzz.campaign.options import CampaignOptions

__all__ = ["Worker", "WorkerSpec", "worker_main", "derive_seed", "EXIT_DONE", "EXIT_RESTART", "EXIT_ERROR", "EXIT_STORE",
           "Abort", "StoreFailed"]

EXIT_DONE = 0
EXIT_RESTART = 75  # "restart me": the target may have poisoned this process
EXIT_ERROR = 70  # the worker itself failed (traceback in .work/worker-<n>.err)
EXIT_STORE = 74  # a finding could not be written (EX_IOERR): the campaign stops
FLAKY_REPLAYS = 5  # replays of a failure the first replay did not show, for its rate

_stop_requested = False  # set by SIGTERM/SIGHUP: finish the finding at hand, then exit


PR_SET_PDEATHSIG = 1


def derive_seed(*parts: Any) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True)
class WorkerSpec:
    options: CampaignOptions
    index: int
    incarnation: int
    run_id: str
    run_dir: str
    parent_pid: int
    deadline: float  # time.time() after which no new scenario starts
    max_examples: int | None  # this incarnation's share; None = until the deadline
    gpu: str | None = None
    skip_properties: tuple[str, ...] = ()  # finding keys finalised by earlier incarnations of this worker
    pipeline: Pipeline | None = None  # None: the family's own (FamilySearch.observe's default)
    strategy: Callable[[str | None, str | None], Any] | None = None  # None: the family's (FamilySearch.strategy)
    stats_interval_s: float = 0.5
    replay: tuple = ()  # SavedFailure entries (example_db) to run before fuzzing
    # Wall s, CPU s and scenarios the earlier incarnations of this worker
    # fuzzed: a finding's time-to-find counts from the worker's first start.
    fuzzed_before: tuple[float, float, int] = (0.0, 0.0, 0)


class Abort(BaseException):
    """Stop the Hypothesis run now (deadline, stop request, example cap).  A
    BaseException, so Hypothesis propagates it instead of shrinking it."""


class _Restart(BaseException):
    """The target left this process unusable; finish up and exit for a restart."""


class _ShrinkLimit(BaseException):
    """The shrink under way reached --shrink-limit: record its smallest
    failure so far and go on searching in the next chunk."""


class StoreFailed(BaseException):
    """A finding could not be written: stop this worker (the parent was told)."""


class _HarnessFailed(BaseException):
    """cgsim's own machinery failed while running a scenario (the
    environment broke, a bug in the worker): a BaseException, so Hypothesis
    stops at once instead of shrinking it as if the target had failed."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class _PropertyFailed(AssertionError):
    def __init__(self, prop: str, message: str):
        super().__init__(f"{prop}: {message}")
        self.property = prop


class Worker:
    """One worker's Hypothesis loop.  Where its output goes is replaceable
    (a Ray actor sends it to the driver's node, ``ray_actors.RayWorker``):
    ``store`` (a ``FindingStore``: ``put``, ``remove_own``), ``queue``
    (``put`` a message) and the hooks ``prepare``, ``write_inflight``,
    ``clear_inflight`` and ``orphaned``.  ``run`` raises ``StoreFailed``
    when a finding could not be written and may raise ``Abort`` when the
    campaign is gone."""

    def __init__(self, spec: WorkerSpec, queue: Any, stop_event: Any, heartbeat: Any):
        self.spec = spec
        self.o = spec.options
        self.queue = queue
        self.stop_event = stop_event
        self.heartbeat = heartbeat  # shared: start time of the running scenario (0 when idle), then its limits
        self.findings_dir = os.path.join(spec.run_dir, "findings")
        self.work_dir = os.path.join(spec.run_dir, ".work")
        # Keyed by finding_key: a property, or a property and the documented
        # defect of the code under test a finding of it is an instance of.
        self.lifecycle = FindingLifecycle(record=self._record, remove=self._remove_own, defect_of=self.defect_of,
                                          first_seen=self._first_seen, may_shrink=self._shrink_allowed,
                                          found=spec.skip_properties)
        self.shrink_spent = 0.0  # seconds this incarnation spent shrinking
        self._classify: Callable[[Finding], dict] | None = None
        self.scenarios = 0
        self.checks: Counter = Counter()
        self.failures: Counter = Counter()
        self.coverage = Coverage()
        self.last_stats = 0.0
        self.started = time.time()
        self._fuzz_started = (time.time(), time.process_time())  # reset once the target is warm
        self.first_seen: dict[str, dict] = {}
        self.ran: set[tuple] = set()  # the search's repeat_key of every scenario this worker ran
        self.repeats = False  # True once the strategy offers nothing new: repeats run again
        self.inflight = InflightFile(spec.run_dir, spec.index)
        self._chunk_seed: int | None = 0
        self.replayed: dict | None = None  # digests of the saved failures replayed: {"passed": [...], "failed": [...]}
        self.parent = os.getppid()  # the campaign, or (forkserver) the server that forked us
        self.owner = (spec.run_id, spec.index, spec.incarnation)
        self.store = FindingStore(self.findings_dir, allowed=lambda: not self.orphaned(), repro=write_repro)
        from fuzz.campaign.search import search_of_target

        self.search = search_of_target(self.o.target)  # how this family's scenarios run, read back and count

    # -- messaging -----------------------------------------------------------
    def _send(self, *msg: Any) -> None:
        try:
            self.queue.put(msg)
        except Exception:
            pass

    def _stats(self, final: bool = False) -> None:
        self.last_stats = time.monotonic()
        self._send(
            "stats", self.spec.index, self.spec.incarnation,
            {
                "scenarios": self.scenarios,
                **self._fuzzed(),
                "checks": dict(self.checks),
                "failures": dict(self.failures),
                "coverage": self.coverage.snapshot({"not_reachable": NOT_REACHABLE}),
                "found": sorted(self.lifecycle.found),
                "final": final,
                **({"replayed": self.replayed} if self.replayed is not None else {}),
            },
        )

    def orphaned(self) -> bool:
        """The campaign that started this worker is gone."""
        if os.getppid() != self.parent:
            return True
        if self.parent != self.spec.parent_pid:  # forked by a forkserver: ask after the campaign itself
            try:
                os.kill(self.spec.parent_pid, 0)
            except ProcessLookupError:
                return True
            except OSError:
                pass
        return False

    # -- hooks -----------------------------------------------------------------
    def write_inflight(self, scenario: Any) -> None:
        """Announce ``scenario`` as in flight before it runs (``inflight``)."""
        spec = self.spec
        self.inflight.write(inflight_entry(spec.index, spec.incarnation, os.getpid(), scenario.to_json()))

    def clear_inflight(self) -> None:
        self.inflight.clear()

    # -- findings ----------------------------------------------------------------
    def _record(self, finding: Finding, status: str, extra: dict | None = None) -> Finding:
        from cgsim.report.findings import FINAL

        spec, o = self.spec, self.o
        # The target says which documented defect of the code under test this
        # is (optional hook; e.g. vLLM's known defects), recorded with it.
        from cgsim.targets import get_target

        triage = get_target(o.target).triage
        labels = triage.classify(finding) if triage.classify is not None else {}
        launch = triage.launch  # the settings a user types to reach it
        if launch is not None:
            labels = {**labels, "launch": launch(self.search.scenario_from_json(finding.scenario))}
        evidence = triage.evidence  # the engine's scheduler on the claim's batch or graph
        if evidence is not None and (status in FINAL or status == "unshrunk"):  # a finding's last word
            try:
                said = evidence(finding)
            except Exception as exc:  # noqa: BLE001 - the finding is written all the same, saying why
                said = {"error": f"{type(exc).__name__}: {first_line(exc, 300)}"}
            if said is not None:
                labels = {**labels, "scheduler_evidence": said}
        if extra and extra.get("replays", False) is None:  # not replayed here (a recurrence, a shrink)
            extra = {k: v for k, v in extra.items() if k != "replays"}
        finding = finding.with_(
            status=status, run_id=spec.run_id, worker=spec.index, seed=self._chunk_seed,
            elapsed_s=time.time() - self.started,
            extra={"timeout_s": o.timeout_s, "incarnation": spec.incarnation, "recorded_at": round(time.time(), 3),
                   **dict(o.environment), **labels, **(extra or {})},
        )
        try:
            done = self.store.put(finding)
        except OSError as exc:
            # Nothing more can be recorded here; the parent keeps the finding
            # in its report's notes and stops the campaign.
            self._send("store-error", spec.index, f"cannot write finding {finding.id}: {exc}", finding.to_json())
            raise StoreFailed() from None
        if done is None:
            raise Abort()  # the campaign is gone: an orphan must not add to its report
        self._send("finding", spec.index, finding.id, finding.property, status)
        return finding

    def defect_of(self, finding: Finding) -> str | None:
        """The documented defect of the code under test that ``finding`` is an
        instance of, as the target's optional ``classify`` names it."""
        if finding.extra.get("known_defect"):  # labelled where it was observed (the encoder family's search)
            return finding.extra["known_defect"]
        if self._classify is None:
            from cgsim.targets import get_target

            self._classify = get_target(self.o.target).triage.classify or (lambda f: {})
        return self._classify(finding).get("known_defect")

    def finding_key(self, finding: Finding) -> str:
        """What makes a failure new to this worker.  A property once found is
        not searched for again, except for an instance of another documented
        defect of the code under test (the target's ``classify``): two
        defects often show through one property (vLLM's CAPTURE-USEFUL: a
        dead decode graph of dynamic speculative decoding within a second,
        the micro-batched twin of a mixed graph much later), and stopping at
        the first would hide the second for the whole campaign."""
        defect = self.defect_of(finding)
        return f"{finding.property}:{defect}" if defect else finding.property

    def _shrink_allowed(self) -> bool:
        """Whether a new failure may be shrunk now: shrinking takes at most
        ``shrink_share`` of the time this worker fuzzed.  Every defect not
        yet seen waits while one is shrunk; on a release with many defects
        (vLLM 0.25 has ten) shrinks took four fifths of a 60 s budget, and
        the last defects were seen late or not at all.  A failure seen while
        the share is spent is written at once all the same ("pending") and
        shrunk when it recurs with share to spare."""
        share = self.o.shrink_share
        if share is None or share >= 1:
            return True
        return self.shrink_spent <= share * self._fuzzed()["fuzz_s"]

    def _keyed(self, outcome: Outcome) -> dict[str, Finding]:
        """The outcome's first finding of each key, in order; a property's
        overflow note ("... and N more") is no finding of its own."""
        out: dict[str, Finding] = {}
        for f in outcome.findings:
            if out and f.overflow is not None:
                continue
            out.setdefault(self.finding_key(f), f)
        return out

    def _fuzzed(self) -> dict:
        """How long this incarnation has fuzzed (after the target's one-time set-up)."""
        wall, cpu = self._fuzz_started
        return {"fuzz_s": round(time.time() - wall, 3), "fuzz_cpu_s": round(time.process_time() - cpu, 3)}

    def _first_seen(self, key: str) -> dict:
        """How long this worker fuzzed, over all its incarnations, before it
        first saw a failure of this key: wall and CPU seconds, scenarios run."""
        if key not in self.first_seen:
            now = self._fuzzed()
            wall, cpu, scenarios = self.spec.fuzzed_before
            self.first_seen[key] = {"first_seen_s": round(wall + now["fuzz_s"], 3),
                                    "first_seen_cpu_s": round(cpu + now["fuzz_cpu_s"], 3),
                                    "first_seen_scenarios": scenarios + self.scenarios}
        return self.first_seen[key]

    def _remove_own(self, fid: str) -> None:
        """Remove a superseded provisional finding of this worker's, unless
        another worker's (or a final) finding now lives under that name."""
        try:
            self.store.remove_own(fid, self.owner)
        except OSError:
            pass  # a stale provisional file is a duplicate in the report, never a loss

    # -- the campaign loop -------------------------------------------------------
    def prepare(self) -> None:
        """Before anything else in ``run``: where this worker's files go."""
        os.makedirs(self.findings_dir, exist_ok=True)
        os.makedirs(self.work_dir, exist_ok=True)

    def run(self) -> int:
        self.prepare()
        from hypothesis import given, seed

        from cgsim.targets import get_target

        # One-time costs (an engine's cold import: ~20 s for vLLM) before the
        # first scenario, whose deadline must not pay them.
        get_target(self.o.target).prepare_environment()
        # Everything imported so far (torch, Hypothesis, an engine) lives as
        # long as the worker: out of the collector's sight, every collection
        # walks only what scenarios allocate (a third less GC time per scenario).
        import gc

        gc.collect()
        gc.freeze()
        self._fuzz_started = (time.time(), time.process_time())
        strategy = (self.spec.strategy or self.search.strategy)(self.o.ruleset, self.o.target)
        base = get_profile(self.o.profile).campaign_settings(self.o.chunk_examples)
        chunk = 0
        restart = False
        try:
            restart = self._replay(self.spec.replay)
            while not restart and not self._over(pinned=False):
                self._chunk_seed = derive_seed(self.o.seed, self.spec.index, self.spec.incarnation, chunk)
                restart = self._run_chunk(given, seed, base, strategy)
                chunk += 1
                if restart:
                    break
        finally:
            self._stats(final=True)
        return EXIT_RESTART if restart else EXIT_DONE

    def _over(self, pinned: bool) -> bool:
        if _stop_requested or (self.stop_event is not None and self.stop_event.is_set()):
            return True
        if self.orphaned():
            return True
        if self.spec.max_examples is not None and self.scenarios >= self.spec.max_examples and not pinned:
            return True
        limit = self.spec.deadline + (self.o.shrink_grace if pinned else 0.0)
        return time.time() >= limit

    def _repeat(self, scenario: Any) -> bool:
        """Whether this worker already ran a scenario of the same config and
        ruleset through the same steps (batches aside); else remember it.

        The dispatch sweep judges every batch a config's scheduler can
        produce after each capture, so a scenario that differs only in its
        batches judges little that the first did not, at the full price of
        building and capturing the config again.  Hypothesis's generate
        phase mutates each example into a few more (about 1.7 scenarios a
        config in a vLLM campaign; in a derandomized sample on vLLM 0.28,
        55 % of the CPU went to configs already run); rejected, those cost
        a draw instead, and the rare configs a documented defect needs come
        that much sooner.  Shrinking (a pinned
        failure) runs repeats as it must, and so does a worker whose
        strategy had nothing new in a whole chunk (a space that small is
        better fuzzed over its batches than not at all)."""
        if self.repeats:
            return False
        key = self.search.repeat_key(scenario)
        if key in self.ran:
            self.coverage.add("repeats", "rejected")
            return True
        if len(self.ran) > _RAN_BOUND:
            self.ran.clear()
        self.ran.add(key)
        return False

    def _run_one(self, scenario: Any) -> Outcome:
        """Run and judge one scenario, announced in flight first; count it."""
        outcome = self._observe(scenario)
        self.scenarios += 1
        self.coverage.count(self.search.coverage_of(scenario))
        self.coverage.count(outcome.coverage)
        for p in outcome.checked:
            self.checks[p] += 1
        for p in outcome.properties:
            self.failures[p] += 1
            if p not in outcome.checked:
                self.checks[p] += 1
        if time.monotonic() - self.last_stats > self.spec.stats_interval_s:
            self._stats()
        return outcome

    def _confirm(self, scenario: Any, outcome: Outcome, keys: list[str]) -> dict[str, dict]:
        """Replay a scenario whose failures (``keys``) are new to this worker,
        on the same target and backend, before any of them is written: key ->
        {"runs", "reproduced"}.  One replay confirms a failure; one it does
        not show is replayed ``FLAKY_REPLAYS`` times in all, for its rate.
        Not replayed (runs 0) when the run left the process unusable (a hang,
        a poisoned context).  Replays are not counted as scenarios: they
        change nothing a seed decides."""
        if outcome.needs_restart:
            return {key: {"runs": 0, "reproduced": 0, "why_not": "the run left the worker unusable"} for key in keys}
        tally = {key: {"runs": 0, "reproduced": 0} for key in keys}
        for n in range(FLAKY_REPLAYS):
            again = self._observe(scenario)
            shown = self._keyed(again)
            for key in keys:
                tally[key]["runs"] += 1
                tally[key]["reproduced"] += key in shown
            if (n == 0 and all(key in shown for key in keys)) or again.needs_restart:
                break
        return tally

    def _observe(self, scenario: Any) -> Outcome:
        """Run and judge one scenario, announced in flight (and to the
        watchdog) while it runs."""
        spec = self.spec
        self.write_inflight(scenario)
        if self.heartbeat is not None:
            # [index]: since when it runs; [workers + index]: after how long
            # the parent's watchdog may call it hung (past the backstop).
            self.heartbeat[spec.index] = time.time()
            limit = backstop_timeout(self.search.timeout_of(scenario, self.o.timeout_s))
            self.heartbeat[self.o.workers + spec.index] = limit + 1.0 if limit else 0.0
        try:
            return self.search.observe(scenario, self.o.target, self.o.backend, self.o.timeout_s, spec.pipeline)
        finally:
            if self.heartbeat is not None:
                self.heartbeat[spec.index] = 0.0
            self.clear_inflight()

    def _replay(self, entries: tuple) -> bool:
        """Run the failures that earlier campaigns saved (``example_db``),
        each once, before any fuzzing; True when the target left the process
        unusable.

        A saved scenario that still fails is recorded as it was saved: a
        shrunk one is final again (its property is not fuzzed for), an
        unshrunk one is provisional ("pending": a later chunk shrinks it if
        it recurs).  Which entries passed is counted for the campaign, which
        forgets them (a fixed bug); one that fails anywhere stays.
        """
        if not entries:
            return False
        self._chunk_seed = None  # a replayed finding comes from no seed of this campaign
        passed: list[str] = []
        failed: list[str] = []
        self.replayed = {"passed": passed, "failed": failed}
        for entry in entries:
            if self._over(pinned=False):
                break
            try:
                scenario = self.search.scenario_from_json(entry.scenario)
            except ValueError as exc:  # ScenarioError and its kin: JSON no scenario of this family
                self._send("note", self.spec.index, f"saved failure {entry.digest} cannot be replayed: {first_line(exc)}")
                continue
            outcome = self._run_one(scenario)
            (failed if outcome.properties else passed).append(entry.digest)
            self.lifecycle.saved(self._keyed(outcome), entry.property, entry.status, entry.digest)
            if outcome.needs_restart:
                return True
        return False

    def _run_chunk(self, given: Any, seed_dec: Any, base: Any, strategy: Any) -> bool:
        """One Hypothesis run (a chunk); True when the target left the process unusable."""
        from hypothesis import reject

        spec = self.spec
        shrink = ShrinkState()
        limit = self.o.shrink_limit

        def body(scenario: Any) -> None:
            if self._over(pinned=shrink.pinned is not None):
                raise Abort()
            if shrink.pinned is None and self._repeat(scenario):
                reject()
            if shrink.pinned is not None and limit is not None and time.monotonic() - shrink.pinned_at > limit:
                raise _ShrinkLimit()
            started = time.monotonic()
            try:
                outcome = self._run_one(scenario)
            except Exception as exc:  # observe() turns every failure of the target into a finding
                raise _HarnessFailed(exc) from exc
            # A failure whose one run outlasts the shrink limit cannot get
            # smaller within it: Hypothesis's first shrink step runs it
            # again, and the limit, checked before each run, lets that run
            # whole (an engine-sized config can take most of a shrink limit
            # for one run).  It waits ("pending") for a cheaper recurrence instead.
            too_slow = limit is not None and time.monotonic() - started > limit
            keyed = self._keyed(outcome) if outcome.findings else {}
            new = self.lifecycle.new_keys(keyed, shrink)
            try:
                replays = self._confirm(scenario, outcome, new) if new else {}
            except Exception as exc:  # as for the first run: the machinery, never the target
                raise _HarnessFailed(exc) from exc
            self.lifecycle.seen(shrink, scenario, keyed, replays, too_slow)
            if outcome.needs_restart:
                shrink.restart = True
                raise _Restart()
            if shrink.pinned is not None and shrink.pinned in keyed:
                raise _PropertyFailed(shrink.pinned, keyed[shrink.pinned].message)

        test = base(seed_dec(self._chunk_seed)(given(strategy)(body)))
        status = "shrunk"
        ran_before = self.scenarios
        try:
            test()
        except (Abort, _Restart):
            status = "shrink-interrupted"
        except _ShrinkLimit:
            status = "shrink-interrupted"
            shrink.limited = True
        except _PropertyFailed:
            pass
        except Exception as exc:
            if not _hypothesis_verdict(exc):
                # Anything else is cgsim's own machinery failing (the strategy,
                # the environment, this worker): never a finding; the campaign
                # stops with exit 2 (worker_main).
                raise
            if type(exc).__name__ == "Unsatisfiable" and self.scenarios == ran_before and not self.repeats:
                self.repeats = True  # every draw was a repeat (_repeat): nothing failed
                return False
            status = "shrink-interrupted"
            if type(exc).__name__.startswith("Flaky"):
                # The failure did not reproduce on replay: the target depends on
                # state left by earlier scenarios (or on time).  Worth knowing.
                shrink.flaky = f"{type(exc).__name__}: {first_line(exc, 300)}"
            if shrink.pinned is None:
                self._send("note", spec.index, f"chunk seed {self._chunk_seed}: {type(exc).__name__}: {first_line(exc, 300)}")
        if shrink.pinned is not None:
            self.shrink_spent += time.monotonic() - shrink.pinned_at
        if shrink.pinned is not None and not self.orphaned():
            try:
                self.lifecycle.finalise(shrink, status, note=f"shrink stopped at its {limit:g}s limit (--shrink-limit)"
                                        if shrink.limited else None)
            except Abort:
                pass
        return shrink.restart


# Scenario keys a worker remembers (a config is a few hundred bytes).
_RAN_BOUND = 100_000


def _hypothesis_verdict(exc: Exception) -> bool:
    """Whether Hypothesis raised ``exc`` about the target's behaviour (a
    failure that did not replay; nothing left to draw), as opposed to
    cgsim's own machinery failing."""
    return type(exc).__name__.startswith("Flaky") or type(exc).__name__ == "Unsatisfiable"


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux);
    the parent check in the loop covers other systems."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _request_stop(signum: int, frame: Any) -> None:
    global _stop_requested
    _stop_requested = True


def worker_main(spec: WorkerSpec, queue: Any, stop_event: Any, heartbeat: Any) -> None:
    """Process entry point.  Exit status: EXIT_DONE, EXIT_RESTART, EXIT_ERROR
    or EXIT_STORE."""
    _die_with_parent()
    if spec.options.method != "forkserver" and os.getppid() != spec.parent_pid:
        os._exit(EXIT_DONE)  # the parent died before the death signal was armed
    # Ctrl-C, a terminal hang-up and a group SIGTERM reach every process of
    # the group; the parent decides when workers stop (via stop_event) so
    # that they can finish the finding at hand, and a worker that dies of
    # them must not look like a target crash.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGHUP, _request_stop)
    if spec.gpu is not None:
        # Before anything imports torch.cuda in this process (spawned workers).
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.gpu
    torch = sys.modules.get("torch")  # imported by the parent before the fork, or later by the runner
    if torch is not None:
        try:
            torch.set_num_threads(1)  # one core per worker; workers scale, threads fight
        except Exception:
            pass
    work = os.path.join(spec.run_dir, ".work")
    try:
        # A segfault in the target: its Python stack lands in the worker's
        # fault file, which the parent quotes in the NO-CRASH finding.
        import faulthandler

        os.makedirs(work, exist_ok=True)
        fault = open(os.path.join(work, f"worker-{spec.index}.fault"), "w")
        faulthandler.enable(file=fault)
    except (OSError, RuntimeError):
        pass
    code = EXIT_ERROR
    try:
        code = Worker(spec, queue, stop_event, heartbeat).run()
    except StoreFailed:
        code = EXIT_STORE
    except BaseException as exc:
        try:
            os.makedirs(work, exist_ok=True)
            with open(os.path.join(work, f"worker-{spec.index}.err"), "a", encoding="utf-8") as fh:
                fh.write(traceback.format_exc())
        except OSError:
            pass
        # What the campaign's one line says (the traceback is in the file).
        shown = exc.cause if isinstance(exc, _HarnessFailed) else exc
        try:
            queue.put(("worker-error", spec.index, f"{type(shown).__name__}: {first_line(shown, 300)}"))
        except Exception:
            pass
        code = EXIT_ERROR
    finally:
        try:
            queue.close()
            queue.join_thread()
        except Exception:
            pass
    os._exit(code)

