"""A fuzz campaign: workers, a deadline, one merged report.

``run_campaign`` validates everything up front (``options.validate``: a bad
target, ruleset, backend, budget or report directory, or a broken
environment, is a usage error before any worker starts), then runs the
workers under the supervisor (``supervisor``: processes, restarts, deaths
as findings), shows progress (``console``), and writes summary.json,
junit.xml and index.md (``cgsim.report``) at the start, every few seconds
while running, and at the end, also when stopped by SIGINT/SIGTERM (then
with ``"complete": false``).  Workers write their findings to disk
themselves (``worker``), so nothing confirmed is lost if the campaign dies.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import secrets
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, TextIO

from cgsim.observe import RUNNER, Pipeline
from cgsim.report.findings import scan_findings
from cgsim.report.summary import build_summary, update_latest, write_report
from fuzz.campaign.console import Progress, print_summary
from fuzz.campaign.options import CampaignOptions, UsageError, options_for_profile, parse_budget, resolve_gpus, validate
from fuzz.campaign.supervisor import Supervisor
from fuzz.campaign.worker import default_strategy

__all__ = [
    "UsageError", "CampaignOptions", "CampaignResult", "parse_budget", "options_for_profile", "resolve_gpus",
    "run_campaign", "settings_of",
]

REPORT_EVERY_S = 5.0


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
    """The target's own coverage (optional hooks coverage_start / coverage_report):
    workers measure into the run's .work/target-coverage, the final report says
    what they executed."""

    def __init__(self, o: CampaignOptions, run_dir: str):
        from cgsim.targets import get_target

        self.o, self.target = o, get_target(o.target)
        self.dir = os.path.join(run_dir, ".work", "target-coverage")
        start = getattr(self.target, "coverage_start", None)
        self.enabled = start is not None
        if self.enabled:
            start(self.dir)

    def section(self, final: bool) -> dict | None:
        if not self.enabled:
            return None
        if not final:
            return {"note": "computed when the campaign ends"}
        try:
            return self.target.coverage_report(self.dir, self.o.diff_base)
        except Exception as exc:  # noqa: BLE001 - a report section must not lose the report
            return {"note": f"could not compute the target's coverage: {type(exc).__name__}: {exc}"}


def run_campaign(options: CampaignOptions, pipeline: Pipeline = RUNNER,
                 strategy: Callable[[str | None, str | None], Any] = default_strategy,
                 out: TextIO | None = None, err: TextIO | None = None) -> CampaignResult:
    out = out or sys.stdout
    err = err or sys.stderr
    o = validate(options)
    try:
        strategy(o.ruleset, o.target)
    except Exception as exc:
        raise UsageError(f"cannot build the scenario strategy: {type(exc).__name__}: {exc}") from None
    run_id, run_dir = _make_run_dir(o.report_dir)
    coverage = _TargetCoverage(o, run_dir)
    started_wall = time.time()
    started_at = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    sup = Supervisor(o, run_id, run_dir, started_wall + o.budget_s, pipeline, strategy)
    progress = Progress(err, o.quiet)
    findings_dir = os.path.join(run_dir, "findings")

    def report(complete: bool, final: bool = False) -> dict:
        summary = build_summary(
            run_id=run_id, settings=settings_of(o, [s.gpu for s in sup.slots] if o.gpu_list else None),
            findings=scan_findings(findings_dir), stats=sup.stats(), workers=sup.workers(), complete=complete,
            interrupted=sup.stop_reason, started_at=started_at,
            finished_at=_dt.datetime.now().astimezone().isoformat(timespec="seconds") if final else None,
            elapsed_s=time.time() - started_wall, notes=sup.notes, inflight=[] if final else sup.inflight(),
            target_coverage=coverage.section(final),
        )
        try:
            write_report(run_dir, summary)
        except OSError as exc:
            sup.notes.append(f"could not write the report: {exc}")
        return summary

    report(complete=False)
    update_latest(o.report_dir, run_id)
    # Our handler stays until the final report is on disk: a second Ctrl-C
    # stops the waiting, never the writing.
    previous = sup.install_signals()
    try:
        try:
            sup.start()
            last_report = last_progress = time.monotonic()
            while sup.poll(timeout=0.1):
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
            sup.shutdown()
        complete = sup.stop_reason is None and not sup.cut_short
        summary = report(complete=complete, final=True)
        update_latest(o.report_dir, run_id)
        progress.clear()
        if not o.quiet:
            print_summary(out, summary, run_dir)
    finally:
        sup.restore_signals(previous)
    if summary["findings"]:
        code = 1
    elif sup.stop_reason is not None:
        code = 130 if sup.stop_reason == "SIGINT" else 143
    else:
        code = 0
    return CampaignResult(code, run_dir, summary)
