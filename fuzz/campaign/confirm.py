"""The campaign's last phase: each finding asked of the engine's own runner.

The search runs on a target's fast tier (vLLM's manager, built by cgsim's
stand-in of its runner).  A target whose engine can build its own runner for
a finding's launch (the optional hook ``triage.confirm_findings``: vLLM's) is asked,
once the search has ended, whether the graphs each finding names exist in the
manager that runner builds.  Its verdict is written into the finding on disk
(``runner_confirmation``, atomically, one finding at a time) and decides
whether the report counts it as a defect of the engine or as "manager-level
only" (``cgsim.report.defects.reached``).  A stopped campaign skips the phase
(its findings stay unconfirmed, never dropped); a stop during it ends it.
"""

from __future__ import annotations

from typing import Any, Callable, TextIO

from cgsim.report.defects import CONFIRMATION
from cgsim.text import first_line

__all__ = ["confirm_phase", "phase_budget", "CONFIRMATION"]

# The phase takes as long as the search did, within these bounds: a build of
# a launch with many graph sizes takes minutes, and the report waits for it.
MIN_BUDGET_S, MAX_BUDGET_S = 60.0, 600.0


def phase_budget(search_budget_s: float) -> float:
    return min(MAX_BUDGET_S, max(MIN_BUDGET_S, search_budget_s))


def confirm_phase(target_name: str, findings_dir: str, jobs: int, stopped: Callable[[], bool],
                  err: TextIO, quiet: bool, budget_s: float = MIN_BUDGET_S) -> list[str]:
    """Confirm every finding in ``findings_dir`` through the target's hook,
    ``jobs`` runner builds at a time, within ``budget_s``; the notes it
    leaves for the report."""
    from cgsim.report.findings import FindingStore, scan_findings
    from cgsim.targets import get_target

    hook = get_target(target_name).triage.confirm_findings
    # A finding the runner itself found (served: cgsim.served) carries its verdict already.
    findings = [f.to_json() for f in scan_findings(findings_dir) if CONFIRMATION not in f.extra]
    if hook is None or not findings or stopped():
        return []
    if not quiet:
        err.write(f"confirming {len(findings)} finding(s) through the engine's own model runner "
                  f"({jobs} build(s) at a time, {budget_s:.0f} s for the builds)...\n")
        err.flush()
    try:
        verdicts: dict[str, Any] = hook(findings, jobs, stopped, budget_s)
    except Exception as exc:  # noqa: BLE001 - the findings stay, unconfirmed, and the note says why
        return [f"runner confirmation failed ({type(exc).__name__}: {first_line(exc, 200)}); "
                "the findings are reported unconfirmed"]
    store = FindingStore(findings_dir)
    try:
        for fid, verdict in verdicts.items():
            store.annotate(fid, {CONFIRMATION: verdict})
    except OSError as exc:  # a full disk: the findings on disk stay as they were, unconfirmed
        return [f"runner confirmation could not be written ({exc}); the findings are reported unconfirmed"]
    counts: dict[str, int] = {}
    for verdict in verdicts.values():
        counts[verdict["verdict"]] = counts.get(verdict["verdict"], 0) + 1
    said = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    return [f"runner confirmation: {said} (of {len(findings)} finding(s))"]
