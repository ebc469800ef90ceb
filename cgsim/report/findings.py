"""The findings directory of a run: one ``<id>.json`` per Finding, written
atomically, plus its ``repro_<id>.py``.

A finding is written the moment a failure is confirmed (status "shrinking"
or "unshrunk") and replaced only by its own shrunk version, so a reader (the
parent merging a report, ``fuzz report`` after the campaign died, a user)
always finds complete, readable files.
"""

from __future__ import annotations

import json
import os

from cgsim.finding import Finding, FindingError
from cgsim.report.atomic import atomic_write_json

__all__ = ["write_finding", "load_finding", "scan_findings", "finding_path"]


def finding_path(findings_dir: str, finding: Finding) -> str:
    return os.path.join(findings_dir, f"{finding.id}.json")


def write_finding(findings_dir: str, finding: Finding) -> str:
    path = finding_path(findings_dir, finding)
    atomic_write_json(path, finding.to_json())
    return path


def load_finding(path: str) -> Finding:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise FindingError(f"cannot read finding {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FindingError(f"finding {path} is not valid JSON ({exc})") from None
    return Finding.from_json(data, where=f"finding {path}")


def scan_findings(findings_dir: str) -> list[Finding]:
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
