"""The findings directory of a run: one ``<id>.json`` per Finding, written
atomically, plus its ``repro_<id>.py``.

A finding is written the moment a failure is confirmed (status "shrinking",
"pending" or "unshrunk") and replaced only by its own shrunk version, so a
reader (the parent merging a report, ``fuzz report`` after the campaign
died, a user) always finds complete, readable files.

``FindingStore`` is the one writer of a run's findings directory.  Several
processes write into it (the workers, the campaign parent recording a
worker's death), so every change happens under an exclusive lock on
``findings/.lock`` (released by the kernel if its holder is killed), after
the writer's ``allowed()`` check: a worker whose campaign is gone is no
longer the campaign's live worker and must not change what the last report
lists.  The rules:

- a provisional finding (shrinking, pending, unshrunk) is only ever
  *created*: if a file of that id exists (the same property on the same
  scenario, found by another worker or an earlier incarnation) it stays;
- a final finding (shrunk, shrink-interrupted) replaces only a provisional
  file of the same id (the id is a hash of target, property and scenario, so
  that file *is* the same finding, before shrinking), never another final;
- a superseded provisional file is removed only by the process that wrote it
  (same run, worker and incarnation), and only while it is still provisional.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Callable, Iterator

from cgsim.finding import Finding, FindingError
from cgsim.report.atomic import atomic_write_json

__all__ = ["write_finding", "load_finding", "scan_findings", "finding_path", "FindingStore", "Owner",
           "PROVISIONAL", "FINAL", "LOCK_NAME"]

PROVISIONAL = ("new", "shrinking", "pending", "unshrunk")
FINAL = ("shrunk", "shrink-interrupted")
LOCK_NAME = ".lock"

Owner = tuple  # (run_id, worker, incarnation): who wrote a provisional file


def finding_path(findings_dir: str, finding: Finding) -> str:
    return os.path.join(findings_dir, f"{finding.id}.json")


def write_finding(findings_dir: str, finding: Finding) -> str:
    """Write one finding unconditionally (tests, tools outside a campaign).
    A campaign writes through ``FindingStore``."""
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


def _owner_of(data: dict) -> Owner:
    return (data.get("run_id"), data.get("worker"), data.get("incarnation"))


class FindingStore:
    """Changes to one findings directory, under its lock and a liveness check.

    ``allowed`` is called with the lock held, just before each change; when
    it returns False nothing is changed and the call returns None/False.
    """

    def __init__(self, findings_dir: str, allowed: Callable[[], bool] = lambda: True,
                 repro: Callable[[str, Finding], str] | None = None):
        self.dir = findings_dir
        self.allowed = allowed
        self._repro = repro

    @contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        fd = os.open(os.path.join(self.dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _read(self, fid: str) -> dict | None:
        try:
            with open(os.path.join(self.dir, fid + ".json"), encoding="utf-8") as fh:
                data = json.load(fh)
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def put(self, finding: Finding) -> str | None:
        """Write ``finding`` and its repro script by the rules above.
        Returns "written", "kept" (a file of that id stays) or None (not
        allowed: nothing changed).  OSError (a full disk) propagates, with
        the old file, if any, intact."""
        with self._locked():
            if not self.allowed():
                return None
            existing = self._read(finding.id)
            if existing is not None and (finding.status not in FINAL or existing.get("status") in FINAL):
                return "kept"
            # The repro first: a finding on disk always has its script (a
            # script without a finding is ignored by every reader).
            if self._repro is not None:
                self._repro(self.dir, finding)
            write_finding(self.dir, finding)
            return "written"

    def annotate(self, fid: str, extra: dict) -> bool:
        """Add ``extra`` to the finding of id ``fid`` on disk (its status and
        scenario unchanged); False where there is none, or writing is no
        longer allowed.  OSError propagates, the old file intact."""
        with self._locked():
            if not self.allowed():
                return False
            data = self._read(fid)
            if data is None:
                return False
            write_finding(self.dir, Finding.from_json(data).with_(extra=extra))
            return True

    def remove_own(self, fid: str, owner: Owner) -> bool:
        """Remove a provisional finding that ``owner`` wrote and that is
        still provisional; anything else stays."""
        with self._locked():
            if not self.allowed():
                return False
            data = self._read(fid)
            if data is None or _owner_of(data) != owner or data.get("status") not in ("shrinking", "pending"):
                return False
            os.unlink(os.path.join(self.dir, fid + ".json"))
            try:
                os.unlink(os.path.join(self.dir, f"repro_{fid}.py"))
            except OSError:
                pass
            return True

