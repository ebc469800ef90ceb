"""Findings: one violated property (or a crash, hang or corruption of the
target) with the Scenario that shows it, as a schema-versioned JSON file.

A finding is written the moment a failure is confirmed (status "shrinking")
and rewritten when shrinking ends (status "shrunk").  Its id is a function of
(target, property, scenario), so the same bug found twice with the same
minimal scenario gets the same id in every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from cgsim.report.atomic import atomic_write_json

__all__ = [
    "FINDING_SCHEMA",
    "FINDING_SCHEMA_VERSION",
    "HARNESS_PROPERTIES",
    "FindingError",
    "finding_id",
    "new_finding",
    "write_finding",
    "load_finding",
    "scan_findings",
]

FINDING_SCHEMA = "cgsim.finding"
FINDING_SCHEMA_VERSION = 1

# Failures the harness sees that are not a SPEC §4 property: the target blew
# up, never returned, or left itself in a state it cannot run from.
HARNESS_PROPERTIES: dict[str, str] = {
    "TARGET-CRASH": "the target runs every scenario without raising and without killing its process",
    "TARGET-HANG": "the target finishes every scenario within the per-scenario timeout",
    "TARGET-CORRUPT": "the target leaves its own state consistent after every step",
    "CHECK-CRASH": "the property checks run on every trace without raising (a bug in cgsim itself)",
}

STATUSES = ("shrinking", "shrunk", "unshrunk", "shrink-interrupted")


class FindingError(ValueError):
    """A finding file is unreadable or not a cgsim finding."""


def finding_id(target: str, prop: str, scenario_json: dict) -> str:
    canonical = json.dumps({"target": target, "property": prop, "scenario": scenario_json}, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", prop.lower()).strip("-") or "finding"
    return f"{slug}-{digest}"


def new_finding(
    *,
    prop: str,
    message: str,
    kind: str,
    target: str,
    backend: str,
    scenario_json: dict,
    status: str,
    statement: str = "",
    step: int | None = None,
    run_id: str = "",
    worker: int | None = None,
    seed: int | None = None,
    elapsed_s: float | None = None,
    scenario_short: str = "",
    extra: dict | None = None,
) -> dict:
    if status not in STATUSES:
        raise ValueError(f"finding status {status!r} is not one of {STATUSES}")
    fid = finding_id(target, prop, scenario_json)
    data: dict[str, Any] = {
        "schema": FINDING_SCHEMA,
        "schema_version": FINDING_SCHEMA_VERSION,
        "id": fid,
        "property": prop,
        "statement": statement or HARNESS_PROPERTIES.get(prop, ""),
        "kind": kind,
        "message": message,
        "step": step,
        "target": target,
        "backend": backend,
        "ruleset": scenario_json.get("ruleset") if isinstance(scenario_json, dict) else None,
        "status": status,
        "scenario": scenario_json,
        "scenario_short": scenario_short,
        "run_id": run_id,
        "worker": worker,
        "seed": seed,
        "elapsed_s": None if elapsed_s is None else round(elapsed_s, 3),
        "repro": f"repro_{fid}.py",
    }
    if extra:
        data.update(extra)
    return data


def write_finding(findings_dir: str, data: dict) -> str:
    path = os.path.join(findings_dir, f"{data['id']}.json")
    atomic_write_json(path, data)
    return path


def load_finding(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise FindingError(f"cannot read finding {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FindingError(f"finding {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != FINDING_SCHEMA:
        raise FindingError(f"{path} is not a cgsim finding (no \"schema\": \"{FINDING_SCHEMA}\")")
    if data.get("schema_version") != FINDING_SCHEMA_VERSION:
        raise FindingError(
            f"finding {path} has schema_version {data.get('schema_version')!r}; this cgsim reads {FINDING_SCHEMA_VERSION}"
        )
    for key in ("id", "property", "target", "scenario"):
        if key not in data:
            raise FindingError(f"finding {path} lacks the field {key!r}")
    return data


def scan_findings(findings_dir: str) -> list[dict]:
    """Every readable finding in a directory, in a stable order.  Half-written
    files cannot exist (writes are atomic); unreadable ones are skipped."""
    out = []
    try:
        names = sorted(os.listdir(findings_dir))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            out.append(load_finding(os.path.join(findings_dir, name)))
        except FindingError:
            continue
    return out
