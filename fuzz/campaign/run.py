"""The run of one fuzz campaign: workers, a deadline, one merged report.

``run_campaign`` validates everything up front (``options.validate``: a bad
target, ruleset, backend, budget or report directory, or a broken
environment, is a usage error before any worker starts; with ``--ray`` it
then joins the cluster, ``cluster.join_cluster``), then runs the
workers under an executor (``executor``): the supervisor (``supervisor``:
processes on this host, restarts, deaths as findings) or, with ``--ray``,
Ray actors on every node of a cluster (``ray_executor``), shows progress
(``console``), and writes summary.json,
junit.xml and index.md (``cgsim.report``) at the start, every few seconds
while running, and at the end, also when stopped by SIGINT/SIGTERM/SIGHUP
(then with ``"complete": false``).  Workers write their findings to disk
themselves (``worker``; over Ray, through the driver's node), so nothing
confirmed is lost if the campaign dies;
``fuzz.campaign.rebuild`` (``python -m fuzz report RUN_DIR``) rebuilds the
report from them.  A full disk stops the campaign with ``EXIT_REPORT_FAILED``
and one line naming what could not be written.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import secrets
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, TextIO

from cgsim.observe import Pipeline
from cgsim.report.defects import reached
from cgsim.report.findings import FindingStore, scan_findings
from cgsim.report.repro import write_repro
from cgsim.report.summary import build_summary, update_latest, write_report
from cgsim.text import first_line
from fuzz.campaign.confirm import confirm_phase, phase_budget
from fuzz.campaign.console import Progress, print_summary
from fuzz.campaign.executor import STOP_GRACE_S, Executor, stop_signals_raise
from fuzz.campaign.options import CampaignOptions, UsageError, validate
from fuzz.campaign.served import served_budget, served_phase
from fuzz.campaign.supervisor import Supervisor

__all__ = ["CampaignResult", "run_campaign", "settings_of", "exit_code", "hold_run_lock", "RUN_LOCK",
           "EXIT_CLEAN", "EXIT_FINDINGS", "EXIT_USAGE", "EXIT_REPORT_FAILED"]

REPORT_EVERY_S = 5.0
SHUTDOWN_GRACE_S = 5.0  # at the end of the budget: for the workers to write what they have
RUN_LOCK = "campaign.lock"
UNWRITABLE = "report directory unwritable"  # summary "interrupted" when the disk stopped the campaign
WORKER_FAILED = "worker failed"  # summary "interrupted" when cgsim's own machinery failed in a worker

# Exit status (the table is in reports/README.md).
EXIT_CLEAN = 0  # nothing found
EXIT_FINDINGS = 1  # findings (also in a partial run)
EXIT_USAGE = 2  # bad input or a broken environment: one line, nothing started (or no scenario ran)
EXIT_REPORT_FAILED = 3  # the report or a finding could not be written (a full disk)
_SIGNAL_EXITS = {"SIGHUP": 129, "SIGINT": 130, "SIGTERM": 143}  # stopped, nothing found


@dataclass(frozen=True)
class CampaignResult:
    exit_code: int
    run_dir: str
    summary: dict


def settings_of(o: CampaignOptions, gpus: list | None = None) -> dict:
    import hypothesis

    import cgsim

    return {
        "target": o.target, "backend": o.backend, "ruleset": o.ruleset or "any", "profile": o.profile,
        "budget_s": o.budget_s, "workers": o.workers, "seed": o.seed, "timeout_s": o.timeout_s,
        "max_examples": o.max_examples, "chunk_examples": o.chunk_examples, "gpus": gpus, "command": o.command,
        "environment": dict(o.environment), "cgsim_version": cgsim.__version__,
        "hypothesis_version": hypothesis.__version__, "python": platform.python_version(), "host": platform.node(),
        # Only where used, so that a local campaign's settings stay as they were.
        **({"ray": o.cluster.settings()} if o.cluster is not None else {}),
        **({"example_db": o.example_db} if o.example_db else {}),
    }


def _make_run_dir(report_dir: str) -> tuple[str, str]:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-{os.getpid()}-{secrets.token_hex(3)}"
    run_dir = os.path.join(report_dir, run_id)
    try:
        os.makedirs(report_dir, exist_ok=True)
        os.makedirs(os.path.join(run_dir, "findings"))
        os.makedirs(os.path.join(run_dir, ".work"))
        probe = os.path.join(run_dir, ".work", "probe")
        with open(probe, "w") as fh:
            fh.write("ok")
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"--report-dir {report_dir!r} is not writable: {exc.strerror or exc}; "
                         "give a directory you can write to") from None
    return run_id, run_dir


class _TargetCoverage:
    """The target's own coverage (its optional hooks ``tooling.coverage_start``
    and ``coverage_report``): workers measure into the run's
    .work/target-coverage, the final report says what they executed."""

    def __init__(self, o: CampaignOptions, run_dir: str):
        from cgsim.targets import get_target

        self.o, self.target = o, get_target(o.target)
        self.dir = os.path.join(run_dir, ".work", "target-coverage")
        start = self.target.tooling.coverage_start
        self.enabled = start is not None
        if self.enabled:
            start(self.dir)

    def section(self, final: bool) -> dict | None:
        if not self.enabled:
            return None
        if not final:
            return {"note": "computed when the campaign ends"}
        try:
            return self.target.tooling.coverage_report(self.dir, self.o.diff_base)
        except Exception as exc:  # noqa: BLE001 - a report section must not lose the report
            return {"note": f"could not compute the target's coverage: {type(exc).__name__}: {exc}"}


def hold_run_lock(run_dir: str) -> int:
    """Lock ``.work/campaign.lock`` for the life of this process (and of the
    workers it forks, which inherit the lock): ``fuzz report`` refuses to
    rebuild a run whose campaign still holds it.  The kernel drops the lock
    however the campaign ends (SIGKILL, the OOM killer, a reboot)."""
    import fcntl

    fd = os.open(os.path.join(run_dir, ".work", RUN_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def exit_code(summary: dict, stop_reason: str | None, report_failed: bool) -> int:
    """The documented exit status of a campaign (and of ``fuzz report``)."""
    if report_failed:
        return EXIT_REPORT_FAILED
    if any(reached(f) for f in summary["findings"]):  # manager-level-only findings are no defect of the engine
        return EXIT_FINDINGS
    if stop_reason in _SIGNAL_EXITS:
        return _SIGNAL_EXITS[stop_reason]
    return EXIT_CLEAN


def run_campaign(options: CampaignOptions, pipeline: Pipeline | None = None,
                 strategy: Callable[[str | None, str | None], Any] | None = None,
                 out: TextIO | None = None, err: TextIO | None = None,
                 ignore_late_signals: bool = False) -> CampaignResult:
    """Run one campaign; UsageError before anything starts.

    ``ignore_late_signals``: once the final report is written, block
    SIGINT/SIGTERM/SIGHUP for good, for a process that exits right after (the
    CLI's process entry): a second Ctrl-C that lands after the report, even
    while the interpreter shuts down (which puts the default handlers back),
    must not kill the process and change its exit status.  Blocked signals
    stay pending and die with the process.  Never for a caller that lives on
    (its children would inherit the blocked signals).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    # Start-up (imports, the target's checks, the strategy) may take a while:
    # a stop signal there ends it at once (StopSignal, KeyboardInterrupt).
    with stop_signals_raise():
        o = validate(options)
        if o.ray is not None:
            from fuzz.campaign.cluster import join_cluster

            o = join_cluster(o)
        from fuzz.campaign.search import search_of_target

        # The family's own scenarios (FamilySearch), unless the caller brings a strategy or pipeline.
        strategy = strategy or search_of_target(o.target).strategy
        try:
            strategy(o.ruleset, o.target)
        except Exception as exc:
            raise UsageError(f"cannot build the scenario strategy: {type(exc).__name__}: {exc}") from None
        saved = None
        if o.example_db:
            from fuzz.campaign.example_db import open_example_db

            saved = open_example_db(o.example_db, o.target, o.backend)
        saved_entries = saved.entries() if saved is not None else ()
        replay = saved_entries
        if o.self_check_findings:
            from fuzz.campaign.example_db import SavedFailure

            # Findings of the self-check about the code under test: run first (each
            # scenario once: a run records every property it violates), recorded like any other.
            first: dict[str, Any] = {}
            for f in o.self_check_findings:
                first.setdefault(json.dumps(f.scenario, sort_keys=True), f)
            replay += tuple(SavedFailure(f.id, f.property, "pending", dict(f.scenario)) for f in first.values())
        self_checked = len(replay) - len(saved_entries)
        run_id, run_dir = _make_run_dir(o.report_dir)
        lock_fd = hold_run_lock(run_dir)
        coverage = _TargetCoverage(o, run_dir)
        started_wall = time.time()
        started_at = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        sup = _executor(o)(o, run_id, run_dir, started_wall + o.budget_s, pipeline, strategy, replay=replay)
    progress = Progress(err, o.quiet)
    findings_dir = os.path.join(run_dir, "findings")
    report_errors: list[str] = []  # every failed report write, in order (never cleared)
    phase_stats: list[dict] = []  # what the phases after the search judged (the runner share's served launches)

    def report(complete: bool, final: bool = False) -> dict:
        findings = scan_findings(findings_dir)
        if saved is not None:
            saved.save(findings, final=final)
            if final:
                forgotten = saved.forget(sup.stats())
                if forgotten:
                    sup.notes.append(f"example database: {forgotten} saved failure(s) passed wherever they were "
                                     "replayed and were forgotten (fixed)")
        notes = list(sup.notes) + [f"not on disk: {f.property} {f.id}: {first_line(f.message, 200)}; "
                                   f"scenario {f.scenario_short}" for f in sup.unwritten]
        notes += list(dict.fromkeys(sup.store_errors + report_errors + (saved.errors if saved is not None else [])))
        if saved_entries:
            notes.append(f"example database: {len(saved_entries)} saved failure(s) replayed first")
        if saved is not None and saved.unreadable:
            notes.append(f"example database: {saved.unreadable} saved value(s) could not be read (corrupt, or of "
                         "another format) and were skipped; they are left as they are")
        if o.self_check_findings:
            notes.append(f"the target's self-check met {len(o.self_check_findings)} violation(s) no documented "
                         f"defect explains, in {self_checked} scenario(s); they were replayed first")
        summary = build_summary(
            run_id=run_id, settings=settings_of(o, [s.gpu for s in sup.slots] if o.gpu_list else None),
            findings=findings, stats=[*sup.stats(), *phase_stats], workers=sup.workers(), complete=complete,
            interrupted=sup.stop_reason or (UNWRITABLE if sup.store_errors or report_errors else None)
            or (WORKER_FAILED if sup.harness_errors else None),
            started_at=started_at, started_unix=sup.started,
            finished_at=_dt.datetime.now().astimezone().isoformat(timespec="seconds") if final else None,
            elapsed_s=time.time() - started_wall, notes=notes, inflight=[] if final else sup.inflight(),
            target_coverage=coverage.section(final),
        )
        try:
            # Pictures take seconds: drawn once, at a normal end (a stop must not wait for them).
            summary = write_report(run_dir, summary, pictures=(None if sup.stopped else True) if final else False)
        except OSError as exc:
            report_errors.append(f"cannot write the report in {run_dir}: {exc}")
            if not final:  # the findings cannot be far behind (one disk): stop while they are whole
                sup.request_stop()
        return summary

    # Our handler from here until the final report is on disk: a Ctrl-C
    # stops the waiting (a second one kills the workers), never the writing.
    previous = sup.install_signals()
    try:
        report(complete=False)
        _try(update_latest, o.report_dir, run_id)
        try:
            if not sup.stopped and not report_errors:
                sup.start()
            last_report = last_progress = time.monotonic()
            while not report_errors and sup.poll(timeout=0.1):
                mono = time.monotonic()
                if mono - last_progress >= progress.every:
                    progress.show(target=o.target, scenarios=sum(s.get("scenarios", 0) for s in sup.stats()),
                                  findings=len({f.property for f in scan_findings(findings_dir)}),
                                  left_s=max(0.0, sup.deadline - time.time()), alive=sup.alive(), workers=o.workers,
                                  budget_s=o.budget_s)
                    last_progress = mono
                if mono - last_report >= REPORT_EVERY_S:
                    report(complete=False)
                    last_report = mono
        finally:
            sup.shutdown(STOP_GRACE_S if sup.stop_reason else SHUTDOWN_GRACE_S)
        # Space may have come back since a write failed: one more try.
        sup.unwritten = [f for f in sup.unwritten if not _try(FindingStore(findings_dir, repro=write_repro).put, f)]
        share_s = served_budget(o.budget_s) if o.runner_share_s is None else o.runner_share_s
        if o.runner_confirm and share_s > 0 and not sup.stopped and not report_errors:
            # The runner's share: launches served end to end, differences written as findings.
            share = served_phase(o.target, o.backend, o.ruleset, o.seed or 0, findings_dir, o.workers,
                                 lambda: sup.stopped, err, o.quiet, share_s)
            sup.notes.extend(share.notes)
            phase_stats.append(share.stats())
        confirm_s = phase_budget(o.budget_s) if o.confirm_budget_s is None else o.confirm_budget_s
        if o.runner_confirm and confirm_s > 0 and not sup.stopped and not report_errors:
            # Before the final report: its defect count is of what the engine's runner builds.
            sup.notes.extend(confirm_phase(o.target, findings_dir, o.workers, lambda: sup.stopped, err, o.quiet,
                                           confirm_s))
        complete = not sup.stopped and not sup.cut_short and not report_errors
        summary = report(complete=complete, final=True)
        _try(update_latest, o.report_dir, run_id)
        progress.clear()
        # A campaign the disk cut short never ends as "nothing found".
        failed = bool(report_errors or sup.store_errors)
        if not o.quiet:
            _print_quietly(print_summary, out, summary, run_dir)
        harness = bool(sup.harness_errors) and not failed
        # A campaign that checked nothing has not found "nothing".
        idle = (not summary["scenarios"] and not summary["findings"] and sup.stop_reason is None and not failed
                and not harness)
        if idle:
            why = sup.notes[0] if sup.notes else ("the workers were still starting when the budget ended; "
                                                  "give a longer --budget")
            err.write(f"error: no scenario ran in the {o.budget_s:g}s budget ({why}); see {run_dir}/index.md\n")
            err.flush()
        if harness:
            # As at start-up: cgsim's own machinery failed, one line, exit 2.
            kept = len(scan_findings(findings_dir))
            err.write(f"error: {sup.harness_errors[0]}; the campaign stopped ({kept} finding(s) on disk were kept; "
                      f"traceback in {os.path.join(run_dir, '.work')}/worker-<n>.err)\n")
            err.flush()
        if failed:
            why = (sup.store_errors + report_errors)[0]
            kept = len(scan_findings(findings_dir))
            err.write(f"error: {why}; {kept} finding(s) on disk were kept, {len(sup.unwritten)} could not be "
                      f"written; free space, then run: python -m fuzz report {run_dir}\n")
            err.flush()
    finally:
        sup.restore_signals(previous, keep_blocked=ignore_late_signals)
        os.close(lock_fd)
    code = EXIT_USAGE if idle or harness else exit_code(summary, sup.stop_reason, failed)
    return CampaignResult(code, run_dir, summary)


def _executor(o: CampaignOptions) -> Callable[..., Executor]:
    if o.ray is not None:
        from fuzz.campaign.ray_executor import RayExecutor

        return RayExecutor
    return Supervisor


def _try(fn: Callable[..., Any], *args: Any) -> bool:
    try:
        fn(*args)
        return True
    except OSError:
        return False


def _print_quietly(fn: Callable[..., Any], *args: Any) -> None:
    """Print unless the reader went away (``run | head``): the report is on
    disk and the exit status still says what was found."""
    try:
        fn(*args)
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
