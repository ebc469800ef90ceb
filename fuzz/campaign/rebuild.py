"""``python -m fuzz report RUN_DIR``: the report of a run, rebuilt from what
is on disk, after any death of its campaign (SIGKILL, the OOM killer, a
power loss) or a full disk.

What it reads: the findings (written by the workers the moment they were
confirmed, so they survive the campaign), the last summary.json if there is
one (settings, counts, workers: kept as they were), and the workers'
``.work/inflight-w<N>.json`` (the scenario each one was running; emptied when
a scenario returns, so a non-empty file names the scenario in flight when
the campaign died).  A run whose last summary is not final becomes
``"complete": false, "interrupted": "campaign died"``; a run that ended
normally keeps its state and is only re-rendered.  Missing repro scripts are
written again.

The exit status is the campaign's (``fuzz.campaign.run.exit_code``): 1 with
findings, 0 without, 3 when the report cannot be written, 2 when RUN_DIR is
not a run or its campaign is still running.
"""

from __future__ import annotations

import datetime as _dt
import glob
import json
import os
import sys
import time
from typing import TextIO

from cgsim.finding import FindingError
from cgsim.report.findings import load_finding, scan_findings
from cgsim.report.repro import write_repro
from cgsim.report.summary import SUMMARY_SCHEMA, build_summary, write_report
from fuzz.campaign.console import print_summary
from fuzz.campaign.inflight import describe_inflight, recorded_inflight
from fuzz.campaign.options import UsageError
from fuzz.campaign.run import EXIT_REPORT_FAILED, RUN_LOCK, CampaignResult, exit_code

__all__ = ["rebuild_report", "DIED", "REBUILD_NOTES"]

DIED = "campaign died"
LOCK_GRACE_S = 3.0
# A rebuilt summary lists the notes the rebuild wrote under this key; a
# report rebuilt again drops exactly those and writes fresh ones.
REBUILD_NOTES = "rebuild_notes"
# Summaries rebuilt before that key existed: their rebuild's notes, known by these words (read nowhere else).
_OLD_REBUILD_NOTE_WORDS = ("the campaign died before its final report", "re-rendered from the findings on disk",
                           "there was no summary.json", "finding file(s) could not be read",
                           "could not write the missing")


def rebuild_report(run_dir: str, out: TextIO | None = None, err: TextIO | None = None, quiet: bool = False):
    """Rebuild summary.json, junit.xml and index.md of ``run_dir``; returns a
    ``CampaignResult``.  UsageError (one line) when it is not a run, its
    summary is not a cgsim summary, or its campaign still runs."""
    out = out or sys.stdout
    err = err or sys.stderr
    run_dir = run_dir.rstrip("/") or "/"
    if not os.path.isdir(run_dir):
        what = "does not exist" if not os.path.exists(run_dir) else "is not a directory"
        raise UsageError(f"{run_dir} {what}; give a run directory such as reports/latest or reports/<run-id>")
    findings_dir = os.path.join(run_dir, "findings")
    summary_path = os.path.join(run_dir, "summary.json")
    if not os.path.isdir(findings_dir) and not os.path.exists(summary_path):
        raise UsageError(f"{run_dir} is not a campaign run directory (it has no findings/ and no summary.json); "
                         "give a run directory such as reports/latest or reports/<run-id>")
    lock_fd = _lock(os.path.join(run_dir, ".work", RUN_LOCK), run_dir)
    try:
        previous = _previous_summary(summary_path)
        summary = _rebuild(run_dir, findings_dir, previous)
        failed = False
        try:
            summary = write_report(run_dir, summary)  # as written: its notes recomputed (pictures)
        except OSError as exc:
            failed = True
            err.write(f"error: cannot write the report in {run_dir}: {exc}; the findings on disk are unchanged; "
                      "free space or fix the permissions and run this again\n")
        if not quiet:
            print_summary(out, summary, run_dir)
        return CampaignResult(EXIT_REPORT_FAILED if failed else exit_code(summary, None, False), run_dir, summary)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def _lock(path: str, run_dir: str) -> int | None:
    import fcntl

    if not os.path.exists(path):
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    # A campaign that was just killed may still hold the lock for a moment:
    # its processes drop it as the kernel tears them down, which can lag the
    # kill on a loaded machine.
    end = time.monotonic() + LOCK_GRACE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() < end:
                time.sleep(0.1)
                continue
        os.close(fd)
        raise UsageError(f"the campaign of {run_dir} is still running (it holds .work/{os.path.basename(path)}); "
                         "wait for it to finish or stop it, then run this again") from None


def _previous_summary(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}; fix its permissions, or move it away to rebuild "
                         "from the findings alone") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid JSON ({exc}); move it away to rebuild from the findings alone") from None
    if not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA:
        raise UsageError(f"{path} is not a cgsim campaign summary (no \"schema\": \"{SUMMARY_SCHEMA}\"); "
                         "give the directory of a cgsim run")
    return data


def _rebuild(run_dir: str, findings_dir: str, previous: dict | None) -> dict:
    prev = previous or {}
    # The campaign's last sign of life: before this rebuild writes anything,
    # and as an earlier rebuild found it (its own writes are no sign of life).
    last_life = _parse_time(prev.get("last_activity")) if prev.get("rebuilt_at") else None
    last_life = last_life or _last_sign_of_life(run_dir)
    findings = scan_findings(findings_dir)
    campaign_notes = [n for n in prev.get("notes", []) if not _written_by_a_rebuild(n, prev)]
    own: list[str] = []  # the notes this rebuild writes
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    unreadable = []
    for path in sorted(glob.glob(os.path.join(findings_dir, "*.json"))):
        try:
            load_finding(path)
        except FindingError as exc:
            unreadable.append(f"{os.path.basename(path)} ({exc})")
    if unreadable:
        own.append(f"{len(unreadable)} finding file(s) could not be read and are not listed: {'; '.join(unreadable)}")
    for f in findings:
        if not os.path.exists(os.path.join(findings_dir, f.repro)):
            try:
                write_repro(findings_dir, f)
            except OSError as exc:
                own.append(f"could not write the missing {f.repro}: {exc}")

    final = bool(prev.get("finished_at"))
    settings = prev.get("settings") or _settings_from(findings)
    if not prev:
        own.append("there was no summary.json: settings and counts are unknown; only the findings are listed")
    inflight = [] if final else _inflight(run_dir, prev)
    started = _parse_time(prev.get("started_at"))
    elapsed = prev.get("elapsed_s") or 0.0
    if not final:
        if started is not None and last_life is not None:
            elapsed = max(elapsed, last_life - started)
        when = _dt.datetime.fromtimestamp(last_life).astimezone().isoformat(timespec="seconds") if last_life else "?"
        own.append(f"the campaign died before its final report (last file written at {when}); rebuilt from the "
                   f"findings on disk by python -m fuzz report at {now}; counts are from the last summary")
        own += [_running_note(entry) for entry in inflight]
    else:
        own.append(f"re-rendered from the findings on disk by python -m fuzz report at {now}")
    workers = [dict(w, end="died with the campaign") if w.get("end") == "running" and not final else w
               for w in prev.get("workers", [])]
    summary = build_summary(
        run_id=prev.get("run_id") or os.path.basename(os.path.abspath(run_dir)),
        settings=settings, findings=findings, stats=[_stats_from(prev)], workers=workers,
        complete=bool(prev.get("complete")) if final else False,
        interrupted=prev.get("interrupted") if final else DIED,
        started_at=prev.get("started_at"), started_unix=prev.get("started_unix"),
        finished_at=prev.get("finished_at") if final else None,
        elapsed_s=float(elapsed or 0.0), notes=campaign_notes + own, inflight=inflight,
    )
    summary["rebuilt_at"] = now
    summary[REBUILD_NOTES] = own
    summary["last_activity"] = (_dt.datetime.fromtimestamp(last_life).astimezone().isoformat(timespec="seconds")
                                if last_life else None)
    return summary


def _written_by_a_rebuild(note: str, prev: dict) -> bool:
    """Whether an earlier rebuild wrote ``note`` (its summary lists them);
    a summary rebuilt before the list existed: its rebuild's words, and the
    notes on what was in flight made from its ``inflight`` entries."""
    if REBUILD_NOTES in prev:
        return note in prev[REBUILD_NOTES]
    if not prev.get("rebuilt_at"):
        return False  # never rebuilt: every note is the campaign's
    earlier_inflight = {_running_note(e) for e in prev.get("inflight", []) if isinstance(e, dict)}
    return note in earlier_inflight or any(words in note for words in _OLD_REBUILD_NOTE_WORDS)


def _stats_from(prev: dict) -> dict:
    """The last summary's totals, in the shape of one worker's counters."""
    props = prev.get("properties", {})
    return {
        "scenarios": prev.get("scenarios", 0),
        "checks": {p: v.get("checks", 0) for p, v in props.items()},
        "failures": {p: v.get("failures", 0) for p, v in props.items()},
        "coverage": prev.get("coverage", {}),
    }


def _settings_from(findings: list) -> dict:
    first = findings[0] if findings else None
    return {"target": first.target if first else "?", "backend": first.backend if first else "mock",
            "ruleset": "any", "budget_s": 0, "workers": 0, "seed": None}


def _inflight(run_dir: str, prev: dict) -> list[dict]:
    recorded = recorded_inflight(run_dir)
    if recorded is None:  # no scratch directory (an uploaded report): the last summary's view
        return [e for e in prev.get("inflight", []) if isinstance(e, dict)]
    out = []
    for data in recorded:
        entry = describe_inflight(data)
        entry.pop("since_s", None)  # "since now" means nothing for a dead campaign
        out.append(entry)
    return out


def _running_note(entry: dict) -> str:
    """The note on one summary "inflight" entry of a dead campaign."""
    return (f"worker {entry.get('worker')} was running a scenario when the campaign died "
            f"(started {entry.get('started_at') or '?'}): {entry.get('scenario_short') or '?'}")


def _last_sign_of_life(run_dir: str) -> float | None:
    latest = None
    for root, _dirs, files in os.walk(run_dir):
        for name in files:
            try:
                m = os.stat(os.path.join(root, name)).st_mtime
            except OSError:
                continue
            latest = m if latest is None else max(latest, m)
    return latest


def _parse_time(text: object) -> float | None:
    try:
        return _dt.datetime.fromisoformat(str(text)).timestamp()
    except (TypeError, ValueError):
        return None
