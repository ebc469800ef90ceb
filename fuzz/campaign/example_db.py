"""The example database a campaign shares with the ones before and after it
(``--example-db PATH|redis://...``): the failures campaigns found, so that a
failure found on one node tonight is replayed first, on every worker, by
tomorrow's campaign.

Storage is a Hypothesis ``ExampleDatabase`` (a directory, or Redis through
``hypothesis.extra.redis``); what it stores are Scenarios, not Hypothesis
choice sequences, under one key per target and backend.  Why not let
Hypothesis replay its own database:

- a worker skips the properties it has already finalised, and Hypothesis's
  reuse phase deletes every saved example that no longer fails the test, so
  the second chunk of a campaign would erase the bugs its first chunk found;
- a choice sequence is only meaningful to the strategy that drew it, and the
  strategies change; a Scenario replays the same under any strategy;
- what a worker generates stays a function of the seed alone.

The driver (the campaign's own process) is the only one that opens the
database: it reads the saved failures once at the start and hands them to
every worker with its first incarnation (a Ray actor on another node needs
no access to it), saves every finding on disk as the report is written, and
at the end forgets the saved failures that every worker that replayed them
saw pass (a fixed bug, as Hypothesis forgets an example that stopped
failing).  A failure that still fails anywhere stays.

The trade-off: with a database a run is no longer a function of its seed
alone; what it replays first depends on what the database held.  That is
why a campaign without ``--example-db`` uses none.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Iterable

from cgsim.finding import Finding
from cgsim.report.findings import FINAL
from cgsim.text import first_line
from fuzz.campaign.options import UsageError

__all__ = ["SavedFailure", "SavedFailures", "open_example_db", "KEY_PREFIX"]

KEY_PREFIX = b"cgsim.campaign-failures:"
_SAVED = FINAL + ("unshrunk",)  # what is saved while the campaign runs; provisional ones at its end


@dataclass(frozen=True)
class SavedFailure:
    """One saved failure: the scenario and what it violated when saved."""

    digest: str  # names the stored value (what the workers report back)
    property: str
    status: str
    scenario: dict

    @property
    def size(self) -> int:
        return len(json.dumps(self.scenario, sort_keys=True))


def _value(finding: Finding) -> bytes:
    return json.dumps({"property": finding.property, "status": finding.status, "scenario": finding.scenario},
                      sort_keys=True, separators=(",", ":")).encode()


def _digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()[:16]


class SavedFailures:
    """The saved failures of one target and backend in one database."""

    def __init__(self, db: Any, spec: str, target: str, backend: str):
        self.db = db
        self.spec = spec
        self.key = KEY_PREFIX + f"{target}:{backend}".encode()
        self._values: dict[str, bytes] = {}  # digest -> value, of what was read at the start
        self._saved: set[str] = set()  # finding ids saved by this campaign
        self.errors: list[str] = []  # why a save or delete failed (notes; never stops a campaign)
        self.unreadable = 0  # saved values that could not be read (corrupt): skipped, left as they are

    def entries(self) -> tuple[SavedFailure, ...]:
        """Every readable saved failure, smallest scenario first; the values
        that cannot be read are counted (``unreadable``) and left as they are."""
        out = []
        try:
            values = list(self.db.fetch(self.key))
        except Exception as exc:  # a database that cannot be read must not stop the campaign
            self._error(f"cannot read the saved failures: {type(exc).__name__}: {first_line(exc)}; none replayed")
            return ()
        for value in values:
            try:
                data = json.loads(value)
                entry = SavedFailure(_digest(value), str(data["property"]), str(data["status"]), dict(data["scenario"]))
            except (ValueError, KeyError, TypeError):
                self.unreadable += 1  # corrupt, not ours, or a format we no longer read: left as it is
                continue
            self._values[entry.digest] = value
            out.append(entry)
        out.sort(key=lambda e: (e.size, e.digest))
        return tuple(out)

    def save(self, findings: Iterable[Finding], final: bool = False) -> None:
        """Save the findings not saved yet: the final and unshrunk ones while
        the campaign runs; at its end (``final``) also those still
        provisional (a campaign stopped mid-shrink found them all the same)."""
        for f in findings:
            if f.id in self._saved or not (final or f.status in _SAVED):
                continue
            try:
                self.db.save(self.key, _value(f))
            except Exception as exc:  # a database that went away must not stop the campaign
                self._error(f"cannot save finding {f.id}: {type(exc).__name__}: {first_line(exc)}")
                return
            self._saved.add(f.id)

    def forget(self, stats: Iterable[dict]) -> int:
        """Delete the saved failures that passed wherever they were replayed
        (per the workers' counters); returns how many."""
        passed: set[str] = set()
        failed: set[str] = set()
        for s in stats:
            replayed = s.get("replayed") or {}
            passed.update(replayed.get("passed", ()))
            failed.update(replayed.get("failed", ()))
        gone = 0
        for digest in sorted(passed - failed):
            value = self._values.get(digest)
            if value is None:
                continue
            try:
                self.db.delete(self.key, value)
            except Exception as exc:
                self._error(f"cannot forget a fixed failure: {type(exc).__name__}: {first_line(exc)}")
                break
            gone += 1
        return gone

    def _error(self, text: str) -> None:
        if text not in self.errors:
            self.errors.append(f"example database {self.spec}: {text}")


def open_example_db(spec: str, target: str, backend: str) -> SavedFailures:
    """``PATH`` (a directory, created if missing) or ``redis://HOST[:PORT][/DB]``;
    UsageError (one line) when it cannot be used."""
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return SavedFailures(_redis(spec), spec, target, backend)
    from hypothesis.database import DirectoryBasedExampleDatabase

    path = os.path.abspath(os.path.expanduser(spec))
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--example-db {spec!r} is a file; give a directory (it is created if missing) "
                         "or a redis://HOST:PORT URL")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".cgsim-probe")
        with open(probe, "w") as fh:
            fh.write("ok")
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"--example-db {spec!r} is not writable: {exc.strerror or exc}; "
                         "give a directory you can write to") from None
    return SavedFailures(DirectoryBasedExampleDatabase(path), spec, target, backend)


def _redis(spec: str) -> Any:
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise UsageError(f"--example-db {spec}: a Redis database needs the redis client, which is not installed: "
                         "pip install redis (or give a directory)") from None
    try:
        client = redis.Redis.from_url(spec)
        client.ping()
    except ValueError as exc:
        raise UsageError(f"--example-db {spec!r} is not a Redis URL ({first_line(exc)}); "
                         "write redis://HOST:PORT or redis://HOST:PORT/DB") from None
    except Exception as exc:  # redis.ConnectionError, a refused password, a timeout
        raise UsageError(f"--example-db {spec}: cannot reach Redis ({type(exc).__name__}: {first_line(exc)}); "
                         "start it or give another URL or a directory") from None
    return RedisExampleDatabase(client, key_prefix=b"cgsim:")
