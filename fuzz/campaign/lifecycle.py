"""The life of a failure inside one campaign worker, from its first sighting
to its final finding: what is written when, what is shrunk, what waits.

1. a failure new to the worker (by its finding key: the property, plus the
   documented defect the target's ``classify`` names) has been replayed
   once before anything is written (the worker's ``_confirm``); one the
   replays did not always show is written as it was seen, "unshrunk" and
   flaky with its rate, and never shrunk;
2. a shrinkable failure is *pinned* when no other is and shrinking may take
   the time (``may_shrink``): its first sighting is written at once
   ("shrinking"), and while it is shrunk only a failure of the same key
   counts (the worker raises for it alone), so the shrink cannot wander off
   to a different bug with a smaller example;
3. a failure that cannot be pinned now (another is pinned, the shrink share
   is spent, one run of it outlasts the shrink limit) is written at once
   ("pending") and pinned when it recurs;
4. a failure of a documented defect already shrunk, or of a property not
   worth shrinking, is final as seen ("unshrunk");
5. when the shrink ends, the smallest failure is written ("shrunk", or
   "shrink-interrupted"), and only then are the first sighting and any
   pending file of the same key removed.

``FindingLifecycle`` decides; writing and removing are the caller's
(``record``, ``remove``), so a test drives it with plain values and a
findings directory, without Hypothesis or a target.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from cgsim.finding import Finding
from cgsim.report.findings import FINAL

__all__ = ["ShrinkState", "FindingLifecycle"]


@dataclass
class ShrinkState:
    """One Hypothesis run's shrink: nothing pinned until a failure is."""

    pinned: str | None = None  # the finding key being shrunk
    pinned_at: float = 0.0  # time.monotonic() when it was pinned
    best: tuple[Any, Finding] | None = None  # (scenario, finding): the smallest failure of the pinned key so far
    first: Finding | None = None  # the pinned key's first sighting, on disk as "shrinking"
    restart: bool = False  # the target left the process unusable
    limited: bool = False  # the shrink stopped at --shrink-limit
    flaky: str | None = None  # Hypothesis's word that the pinned failure did not replay


class FindingLifecycle:
    """Which failures a worker has written, pinned, left pending or
    finalised, keyed by finding key.

    ``record(finding, status, extra)`` writes a finding and returns it as
    written; ``remove(id)`` removes a superseded provisional file of this
    worker's; ``defect_of(finding)`` is the documented defect it is an
    instance of (or None); ``first_seen(key)`` the time-to-find fields of a
    key; ``may_shrink()`` whether shrinking may take more time now.
    """

    def __init__(self, record: Callable[[Finding, str, dict | None], Finding], remove: Callable[[str], None],
                 defect_of: Callable[[Finding], str | None], first_seen: Callable[[str], dict],
                 may_shrink: Callable[[], bool], found: Iterable[str] = (),
                 clock: Callable[[], float] = time.monotonic):
        self.record = record
        self.remove = remove
        self.defect_of = defect_of
        self.first_seen = first_seen
        self.may_shrink = may_shrink
        self.clock = clock
        self.found: set[str] = set(found)  # final: not searched for again
        self.provisional: dict[str, str] = {}  # key -> id of its pending file
        self.shrunk_defects: dict[str, str] = {}  # documented defect -> id of its final finding

    def new_keys(self, keyed: dict[str, Finding], shrink: ShrinkState) -> list[str]:
        """The keys of ``keyed`` never written by this worker: replayed before anything is written."""
        return [key for key in keyed if key not in self.found and key != shrink.pinned and key not in self.provisional]

    def seen(self, shrink: ShrinkState, scenario: Any, keyed: dict[str, Finding], replays: dict[str, dict],
             too_slow: bool = False) -> None:
        """One run of ``scenario`` failed with ``keyed`` (key -> its first
        finding), the new keys replayed as ``replays`` says (key ->
        {"runs", "reproduced"}); ``too_slow``: its one run outlasted the
        shrink limit, so it cannot be pinned."""
        pinned = shrink.pinned
        if pinned is not None and pinned in keyed:
            # While shrinking, a smaller scenario counts only if it still shows
            # the same key: the same defect, not merely the same property.
            shrink.best = (scenario, keyed[pinned])
        for key, finding in keyed.items():
            if key in self.found or key == pinned:
                continue
            defect = self.defect_of(finding)
            replay = replays.get(key)
            if replay is not None and replay["runs"] and replay["reproduced"] < replay["runs"]:
                self._flaky(key, finding, replay)
            elif not finding.shrinkable:
                self.record(finding, "unshrunk", {"note": f"{finding.property} findings are not shrunk",
                                                  "replays": replay, **self.first_seen(key)})
                self.found.add(key)
            elif defect in self.shrunk_defects:
                self._same_defect(key, finding, defect, replay)
            elif pinned is None and not too_slow and self.may_shrink():
                shrink.pinned = pinned = key
                shrink.pinned_at = self.clock()
                shrink.best = (scenario, finding)
                shrink.first = self.record(finding, "shrinking", {"replays": replay, **self.first_seen(key)})
            elif key not in self.provisional:
                self.provisional[key] = self.record(finding, "pending",
                                                    {"replays": replay, **self.first_seen(key)}).id

    def finalise(self, shrink: ShrinkState, status: str, note: str | None = None) -> None:
        """The pinned key's shrink ended: its smallest failure is written
        with ``status``, then its first sighting and pending file go."""
        key, first = shrink.pinned, shrink.first
        assert key is not None and first is not None and shrink.best is not None, "nothing was pinned"
        _, found = shrink.best
        # found_at: when the failure was first confirmed (recorded_at: when this, the shrunk one, was).
        extra = {"first_id": first.id, "original_scenario": first.scenario, "found_at": first.extra.get("recorded_at"),
                 **{k: v for k, v in first.extra.items() if k.startswith("first_seen")}}
        if shrink.flaky:
            extra["flaky"] = shrink.flaky
        if note:
            extra["note"] = note
        final = self.record(found, status, extra)
        # Only once the shrunk version is on disk does its first sighting go.
        if first.id != final.id:
            self.remove(first.id)
        self.found.add(key)
        defect = self.defect_of(final)
        if defect is not None:
            self.shrunk_defects.setdefault(defect, final.id)
        old = self.provisional.pop(key, None)
        if old and old not in (final.id, first.id):
            self.remove(old)

    def saved(self, keyed: dict[str, Finding], prop: str, status: str, digest: str) -> None:
        """A failure saved by an earlier campaign (property ``prop``, saved
        as ``status``) failed again with ``keyed``: recorded as it was saved
        where it is still that property's final finding, else pending (or
        unshrunk, where not worth shrinking) for a later chunk to shrink."""
        for key, finding in keyed.items():
            if key in self.found or key in self.provisional:
                continue
            if finding.property == prop and status in FINAL:
                now = status
            else:
                now = "unshrunk" if not finding.shrinkable else "pending"
            # No first_seen: nothing was searched for (the time-to-find of a
            # replayed failure would say nothing about the fuzzer).
            recorded = self.record(finding, now, {
                "replayed": digest,
                "note": f"saved by an earlier campaign ({status}) and replayed from the example database"})
            if now == "pending":
                self.provisional[key] = recorded.id
            else:
                self.found.add(key)
                defect = self.defect_of(recorded) if now in FINAL else None
                if defect is not None:
                    self.shrunk_defects.setdefault(defect, recorded.id)

    def _flaky(self, key: str, finding: Finding, replay: dict) -> None:
        """A failure its replays did not always show: written once, as it was
        seen, with its rate; never shrunk (shrinking needs a failure that
        repeats) and not searched for again by this worker."""
        runs, shown = replay["runs"], replay["reproduced"]
        self.record(finding, "unshrunk", {
            "flaky": f"reproduced in {shown} of {runs} replays on the same backend right after it was seen",
            "flaky_rate": round(shown / runs, 3), "replays": replay,
            "note": "flaky: not shrunk; the target depends on state earlier scenarios left, or on timing",
            **self.first_seen(key)})
        self.found.add(key)

    def _same_defect(self, key: str, finding: Finding, defect: str, replay: dict | None) -> None:
        """A failure of another property of a documented defect this worker
        already shrank: final as it is (one scenario of a defect often
        violates five properties, vLLM's #7 among them, and five shrinks of
        one known cause would cost a short campaign most of its budget)."""
        shrunk = self.shrunk_defects[defect]
        note = f"not shrunk: an instance of the documented defect {defect}, shrunk in {shrunk}"
        recorded = self.record(finding, "unshrunk", {"note": note, "replays": replay, **self.first_seen(key)})
        self.found.add(key)
        old = self.provisional.pop(key, None)
        if old and old != recorded.id:
            self.remove(old)
