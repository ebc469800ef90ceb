"""summary.json (schema-versioned), built from plain data, and the files
rendered from it, plus the ``reports/latest`` pointer.

The summary is a function of what is on disk and what the workers counted:
the findings directory, the per-worker statistics, the run's settings.  So
``python -m fuzz report RUN_DIR`` rebuilds the same report after the
campaign died, from the findings alone.

Paths in the summary are relative to the run directory, so a report that is
moved, archived or uploaded keeps working commands (run them from the run
directory).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Iterable

from cgsim.families import DEFAULT_FAMILY, Family, families, family_of_finding, family_of_target
from cgsim.finding import Finding
from cgsim.properties import WATCHED, resolve_alias, statement
from cgsim.report.atomic import atomic_symlink, atomic_write_bytes, atomic_write_json, atomic_write_text
from cgsim.report.defects import group_defects, reached
from cgsim.report.html import render_html
from cgsim.report.junit import render_junit
from cgsim.report.markdown import render_markdown
from cgsim.text import first_line

__all__ = [
    "SUMMARY_SCHEMA", "SUMMARY_SCHEMA_VERSION", "build_summary", "finding_entries", "timeline", "totals", "write_report",
    "update_latest", "write_pictures",
]

SUMMARY_SCHEMA = "cgsim.campaign-summary"
SUMMARY_SCHEMA_VERSION = 1

# Which finding of a property the report shows first.
_RANK = {"shrunk": 0, "shrink-interrupted": 1, "shrinking": 2, "pending": 3, "unshrunk": 4, "new": 5}


def totals(stats: Iterable[dict]) -> tuple[int, Counter, Counter, dict[str, Counter]]:
    """(scenarios, checks, failures, coverage) summed over worker snapshots."""
    scenarios, checks, failures, coverage = 0, Counter(), Counter(), {}
    for s in stats:
        scenarios += s.get("scenarios", 0)
        checks.update(s.get("checks", {}))
        failures.update(s.get("failures", {}))
        for dim, counts in s.get("coverage", {}).items():
            coverage.setdefault(dim, Counter()).update(counts)
    return scenarios, checks, failures, coverage


def finding_entries(findings: Iterable[Finding], backend: str) -> list[dict]:
    """One entry per property: its best finding, the others as duplicates."""
    by_prop: dict[str, list[Finding]] = {}
    for f in findings:
        by_prop.setdefault(f.property, []).append(f)
    out = []
    opt = "" if backend == "mock" else f" --backend {backend}"
    for prop in sorted(by_prop):
        group = sorted(by_prop[prop], key=lambda f: (_RANK.get(f.status, 9), len(json.dumps(f.scenario, sort_keys=True)), f.id))
        primary = group[0]
        entry = primary.to_json()
        entry.pop("original_scenario", None)
        entry["duplicates"] = [f.id for f in group[1:]]
        entry["path"] = f"findings/{primary.id}.json"
        entry["repro_path"] = f"findings/{primary.repro}"
        entry["replay_command"] = f"python -m fuzz replay findings/{primary.id}.json{opt}"
        entry["scenario_code"] = _scenario_code(primary)
        out.append(entry)
    return out


def _scenario_code(finding: Finding) -> str | None:
    """The finding's scenario as its family's constructor calls (None where it does not load)."""
    try:
        return family_of_finding(finding).scenario_code(finding.scenario)
    except (ValueError, TypeError, KeyError):
        return None


def _family(settings: dict) -> Family:
    """The family of the campaign's target (the default family for a run that names none)."""
    target = settings.get("target")
    return family_of_target(target) if isinstance(target, str) else families()[DEFAULT_FAMILY]


def timeline(findings: Iterable[Finding], workers: Iterable[dict], started_unix: float | None, elapsed_s: float) -> dict:
    """What the report's per-worker timeline draws, in seconds since the
    campaign started: each worker's incarnations (start, end, how it ended)
    and each finding on disk (when it was first confirmed, when this version
    was written).  Times a finding does not carry (written by an older
    cgsim) are None."""

    def since(t: object) -> float | None:
        if started_unix is None or not isinstance(t, (int, float)):
            return None
        return round(float(t) - started_unix, 3)

    out = []
    for f in findings:
        recorded = since(f.extra.get("recorded_at"))
        found = since(f.extra.get("found_at"))
        out.append({"id": f.id, "property": f.property, "worker": f.worker, "status": f.status,
                    "found_s": found if found is not None else recorded, "recorded_s": recorded})
    lanes = [{"worker": w.get("worker"), "gpu": w.get("gpu"), "spans": list(w.get("spans", []))} for w in workers]
    return {"elapsed_s": round(elapsed_s, 3), "workers": lanes,
            "findings": sorted(out, key=lambda e: (e["found_s"] is None, e["found_s"] or 0.0, e["id"]))}


def build_summary(*, run_id: str, settings: dict, findings: Iterable[Finding], stats: Iterable[dict] = (),
                  workers: Iterable[dict] = (), complete: bool = False, interrupted: str | None = None,
                  started_at: str | None = None, finished_at: str | None = None, elapsed_s: float = 0.0,
                  notes: Iterable[str] = (), inflight: Iterable[dict] = (), started_unix: float | None = None,
                  target_coverage: dict | None = None) -> dict:
    findings = list(findings)
    workers = list(workers)
    scenarios, checks, failures, coverage = totals(stats)
    # Only what a ruleset the campaign ran (or was pinned to) judges, of the family of its target: the rest
    # could judge nothing here.
    rulesets = [*coverage.get("rulesets", {}), settings.get("ruleset"), *(f.scenario.get("ruleset") for f in findings)]
    props: dict[str, dict] = {}
    for pid, prop in _family(settings).judged_by(r for r in rulesets if isinstance(r, str)).items():
        props[pid] = {"statement": prop.statement, "checks": checks.get(pid, 0), "failures": failures.get(pid, 0)}
    for pid in sorted(set(checks) | set(failures)):
        if resolve_alias(pid) not in props and (checks.get(pid) or failures.get(pid)):
            props[pid] = {"statement": statement(pid), "checks": checks.get(pid, 0), "failures": failures.get(pid, 0)}
    # Every scenario was watched for a crash, a hang and a check that raised, whatever applied.
    for pid in WATCHED:
        if pid in props:
            props[pid]["checks"] = max(props[pid]["checks"], scenarios)
    for f in findings:  # a death found by the parent has no worker counter
        entry = props.setdefault(f.property, {"statement": f.statement, "checks": 0, "failures": 0})
        entry["failures"] = max(entry["failures"], 1)
        entry["checks"] = max(entry["checks"], 1)
    backend = settings.get("backend", "mock")
    entries = finding_entries(findings, backend)
    return {
        "schema": SUMMARY_SCHEMA,
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "run_id": run_id,
        "complete": complete,
        "interrupted": interrupted,
        "started_at": started_at,
        "finished_at": finished_at,
        "elapsed_s": round(elapsed_s, 3),
        "settings": settings,
        "scenarios": scenarios,
        "scenarios_per_s": round(scenarios / elapsed_s, 2) if elapsed_s > 0 else None,
        "properties": props,
        "coverage": {k: dict(sorted(v.items())) for k, v in sorted(coverage.items())},
        "findings": entries,
        # The findings grouped by defect: what the console and the report show as cards.
        "defects": group_defects([e for e in entries if reached(e)]),
        # Findings the engine's own runner does not build: shown apart, never as defects.
        "manager_level": [e["id"] for e in entries if not reached(e)],
        "workers": workers,
        "started_unix": started_unix,
        "timeline": timeline(findings, workers, started_unix, elapsed_s),
        "inflight": list(inflight),
        "notes": list(notes),
        # Which of the target's own code the campaign executed (targets that measure it).
        "target_coverage": target_coverage,
    }


PICTURES_DIR = "pictures"
PICTURES_NOTE = "dispatch findings have no pictures"


def write_pictures(run_dir: str, summary: dict, draw: bool | None = True) -> dict:
    """``pictures/<id>.png`` for every dispatch finding (cgsim.report.plots),
    and the summary with ``picture`` (its path) on those entries.  A picture
    is drawn once per finding id (the id is a hash of the finding's scenario,
    so its map never changes) and never blocks the report: without
    matplotlib the summary gets a note, a drawing error goes to the entry's
    ``picture_error``.  ``draw`` False: only the pictures already drawn (a
    campaign's reports while it runs: drawing takes seconds); None: the
    same, noting that ``fuzz report`` draws the others (a stopped campaign's
    last report, which must not keep a stop waiting)."""
    from cgsim.report import plots

    entries, missing, undrawn = [], False, 0
    for entry in summary.get("findings", []):
        entry = dict(entry)
        entries.append(entry)
        if missing or not plots.is_dispatch_picture_finding(entry):
            continue
        rel = f"{PICTURES_DIR}/{entry['id']}.png"
        path = os.path.join(run_dir, rel)
        if not os.path.exists(path) and not draw:
            undrawn += 1
            continue
        if not os.path.exists(path):
            try:
                png = plots.finding_picture(entry, "png")
            except plots.MissingMatplotlib:
                missing = True
                continue
            except Exception as exc:  # a bad picture must not cost the report
                entry["picture_error"] = f"{type(exc).__name__}: {first_line(exc, 300)}"
                continue
            if png is None:
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write_bytes(path, png)
        entry["picture"] = rel
    _prune_pictures(os.path.join(run_dir, PICTURES_DIR), {e.get("id") for e in entries})
    # Said afresh each time: a note of an earlier rendering (matplotlib missing
    # then) must not outlive the pictures drawn now.
    notes = [n for n in summary.get("notes", []) if not n.startswith(PICTURES_NOTE)]
    if missing:
        notes.append(f"{PICTURES_NOTE}: {plots.MissingMatplotlib()}")
    elif undrawn and draw is None:
        notes.append(f"{PICTURES_NOTE} ({undrawn}): the campaign was stopped before they were drawn; "
                     "python -m fuzz report RUN_DIR draws them")
    return dict(summary, findings=entries, notes=notes)


def _prune_pictures(directory: str, keep: set) -> None:
    """Drop the pictures of findings that were superseded (a shrinking
    finding's, once its shrunk version is on disk)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith(".png") and name[:-4] not in keep:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _read_pictures(run_dir: str, summary: dict) -> dict[str, bytes]:
    images = {}
    for entry in summary.get("findings", []):
        rel = entry.get("picture")
        if rel:
            try:
                with open(os.path.join(run_dir, rel), "rb") as fh:
                    images[rel] = fh.read()
            except OSError:
                pass
    return images


def write_report(run_dir: str, summary: dict, pictures: bool | None = True) -> dict:
    """Write the dispatch findings' pictures (``pictures``: as
    ``write_pictures``'s ``draw``), junit.xml, index.md, index.html and
    summary.json, and return the summary as written.  The summary goes
    last: a reader that finds a summary finds the others consistent with some
    (possibly older) state of the same run."""
    summary = dict(summary)
    summary.setdefault("schema", SUMMARY_SCHEMA)
    summary.setdefault("schema_version", SUMMARY_SCHEMA_VERSION)
    summary = write_pictures(run_dir, summary, draw=pictures)
    atomic_write_text(os.path.join(run_dir, "junit.xml"), render_junit(summary))
    atomic_write_text(os.path.join(run_dir, "index.md"), render_markdown(summary))
    atomic_write_text(os.path.join(run_dir, "index.html"), render_html(summary, _read_pictures(run_dir, summary)))
    atomic_write_json(os.path.join(run_dir, "summary.json"), summary)
    return summary


def update_latest(report_dir: str, run_id: str) -> None:
    """``reports/latest`` (a symlink) and ``reports/LATEST`` (a file naming the
    run, for filesystems without symlinks), each replaced atomically."""
    atomic_write_text(os.path.join(report_dir, "LATEST"), run_id + "\n")
    try:
        atomic_symlink(run_id, os.path.join(report_dir, "latest"))
    except OSError:
        pass
