"""The life of a failure in a campaign worker (``fuzz.campaign.lifecycle``),
driven with plain findings and a real findings directory: no Hypothesis, no
target.  What is on disk after each step is what a report (or a campaign
that dies right then) would list."""

from __future__ import annotations

import time

import pytest

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.finding import Finding
from cgsim.report.findings import FindingStore, scan_findings
from cgsim.scenario import Scenario, Step
from fuzz.campaign.lifecycle import FindingLifecycle, ShrinkState

OWNER = ("run", 0, 0)
CONFIRMED = {"runs": 1, "reproduced": 1}


def scenario(*lens: int) -> dict:
    """A dispatch scenario; more batches make a bigger one."""
    steps = (Step.capture(),) + tuple(Step.dispatch(Batch((n,))) for n in lens)
    return Scenario(ManagerConfig(capture_sizes=(4, 8)), steps, ruleset="pr48822").to_json()


def seen(prop: str, *lens: int) -> Finding:
    return Finding(property=prop, message=f"{prop} failed", target="reference", backend="mock",
                   scenario=scenario(*lens))


class Disk:
    """A findings directory and a lifecycle writing into it, as a worker's."""

    def __init__(self, tmp_path, defects: dict[str, str] | None = None, may_shrink: bool = True):
        self.dir = str(tmp_path / "findings")
        (tmp_path / "findings").mkdir()
        self.store = FindingStore(self.dir)
        self.defects = defects or {}
        self.may_shrink = may_shrink
        self.life = FindingLifecycle(record=self.record, remove=self.remove, defect_of=self.defect_of,
                                     first_seen=lambda key: {"first_seen_s": 1.5}, may_shrink=lambda: self.may_shrink,
                                     clock=lambda: 100.0)

    def record(self, finding: Finding, status: str, extra: dict | None) -> Finding:
        finding = finding.with_(status=status, run_id=OWNER[0], worker=OWNER[1],
                                extra={"incarnation": OWNER[2], "recorded_at": round(time.time(), 3), **(extra or {})})
        self.store.put(finding)
        return finding

    def remove(self, fid: str) -> None:
        self.store.remove_own(fid, OWNER)

    def defect_of(self, finding: Finding) -> str | None:
        return self.defects.get(finding.property)

    def on_disk(self) -> dict[str, Finding]:
        return {f.id: f for f in scan_findings(self.dir)}

    def seen(self, shrink: ShrinkState, *findings: Finding, replays: dict | None = None,
             too_slow: bool = False) -> None:
        keyed = {f.property: f for f in findings}
        new = self.life.new_keys(keyed, shrink)
        replays = replays if replays is not None else {key: CONFIRMED for key in new}
        self.life.seen(shrink, findings[0].scenario, keyed, replays, too_slow)


def test_a_first_sighting_is_on_disk_before_it_is_shrunk_and_replaced_by_the_smallest(tmp_path):
    disk = Disk(tmp_path)
    shrink = ShrinkState()
    big, smaller = seen("DISPATCH-COMPLETE", 3, 5, 7), seen("DISPATCH-COMPLETE", 3, 5)
    smallest = seen("DISPATCH-COMPLETE", 3)
    disk.seen(shrink, big)
    assert shrink.pinned == "DISPATCH-COMPLETE" and shrink.pinned_at == 100.0
    (first,) = disk.on_disk().values()  # a campaign that died now would still list it
    assert first.id == big.id and first.status == "shrinking" and first.extra["first_seen_s"] == 1.5
    # While shrinking, smaller failures of the pinned key are remembered, not written.
    disk.seen(shrink, smaller)
    disk.seen(shrink, seen("CAPTURE-ORDER", 3), smallest)
    assert shrink.best[1].id == smallest.id
    assert {f.status for f in disk.on_disk().values()} == {"shrinking", "pending"}
    disk.life.finalise(shrink, "shrunk")
    final = disk.on_disk()
    assert big.id not in final  # the first sighting went once the shrunk one was on disk
    shrunk = final[smallest.id]
    assert shrunk.status == "shrunk" and shrunk.extra["first_id"] == big.id
    assert shrunk.extra["original_scenario"] == big.scenario and shrunk.extra["first_seen_s"] == 1.5
    assert "DISPATCH-COMPLETE" in disk.life.found
    # A recurrence of a finalised key changes nothing.
    disk.seen(ShrinkState(), seen("DISPATCH-COMPLETE", 3, 5, 7))
    assert set(disk.on_disk()) == set(final)


def test_a_failure_its_replays_do_not_always_show_is_written_flaky_and_never_shrunk(tmp_path):
    disk = Disk(tmp_path)
    shrink = ShrinkState()
    flaky = seen("DISPATCH-STABLE", 2, 3)
    disk.seen(shrink, flaky, replays={"DISPATCH-STABLE": {"runs": 5, "reproduced": 2}})
    assert shrink.pinned is None
    (written,) = disk.on_disk().values()
    assert written.status == "unshrunk" and written.extra["flaky_rate"] == 0.4
    assert "2 of 5" in written.extra["flaky"] and written.extra["replays"] == {"runs": 5, "reproduced": 2}
    assert "DISPATCH-STABLE" in disk.life.found
    assert disk.life.new_keys({"DISPATCH-STABLE": flaky}, ShrinkState()) == []


def test_a_failure_that_cannot_be_pinned_now_waits_pending_and_is_shrunk_when_it_recurs(tmp_path):
    disk = Disk(tmp_path)
    one = ShrinkState()
    disk.seen(one, seen("DISPATCH-COMPLETE", 3, 5), seen("CAPTURE-ORDER", 3, 5, 7))
    assert one.pinned == "DISPATCH-COMPLETE"
    pending = next(f for f in disk.on_disk().values() if f.property == "CAPTURE-ORDER")
    assert pending.status == "pending" and disk.life.provisional == {"CAPTURE-ORDER": pending.id}
    disk.life.finalise(one, "shrunk")
    # The next chunk sees it again: it is pinned now, shrunk, and its pending file goes.
    two = ShrinkState()
    assert disk.life.new_keys({"CAPTURE-ORDER": pending}, two) == []  # written already: not replayed again
    disk.seen(two, seen("CAPTURE-ORDER", 3, 4))
    assert two.pinned == "CAPTURE-ORDER"
    disk.seen(two, seen("CAPTURE-ORDER", 4))
    disk.life.finalise(two, "shrink-interrupted", note="shrink stopped at its 5s limit (--shrink-limit)")
    by_property = {f.property: f for f in disk.on_disk().values()}
    assert len(disk.on_disk()) == 2
    assert by_property["CAPTURE-ORDER"].status == "shrink-interrupted"
    assert by_property["CAPTURE-ORDER"].scenario == scenario(4)
    assert by_property["CAPTURE-ORDER"].extra["note"].startswith("shrink stopped")
    assert disk.life.provisional == {} and disk.life.found == {"DISPATCH-COMPLETE", "CAPTURE-ORDER"}


@pytest.mark.parametrize("why", ["share spent", "too slow"])
def test_a_failure_is_not_pinned_while_the_shrink_share_is_spent_or_one_run_outlasts_the_limit(tmp_path, why):
    disk = Disk(tmp_path, may_shrink=why != "share spent")
    shrink = ShrinkState()
    disk.seen(shrink, seen("DISPATCH-COMPLETE", 3), too_slow=why == "too slow")
    assert shrink.pinned is None
    (written,) = disk.on_disk().values()
    assert written.status == "pending" and "DISPATCH-COMPLETE" in disk.life.provisional
    assert "DISPATCH-COMPLETE" not in disk.life.found


def test_another_property_of_a_documented_defect_already_shrunk_is_final_as_seen(tmp_path):
    disk = Disk(tmp_path, defects={"DISPATCH-COMPLETE": "defect-7", "DISPATCH-PRIORITY": "defect-7"})
    one = ShrinkState()
    # DISPATCH-PRIORITY first waits (another shrink runs), then the defect is shrunk under DISPATCH-COMPLETE.
    disk.seen(one, seen("DISPATCH-COMPLETE", 3, 5), seen("DISPATCH-PRIORITY", 3, 5, 7))
    pending = disk.life.provisional["DISPATCH-PRIORITY"]
    disk.seen(one, seen("DISPATCH-COMPLETE", 3))
    disk.life.finalise(one, "shrunk")
    shrunk_id = seen("DISPATCH-COMPLETE", 3).id
    assert disk.life.shrunk_defects == {"defect-7": shrunk_id}
    two = ShrinkState()
    again = seen("DISPATCH-PRIORITY", 2, 3)
    disk.seen(two, again)
    assert two.pinned is None  # one shrink per documented defect
    on_disk = disk.on_disk()
    assert pending not in on_disk  # its pending file made way for the final one
    final = on_disk[again.id]
    assert final.status == "unshrunk" and shrunk_id in final.extra["note"] and "defect-7" in final.extra["note"]
    assert "DISPATCH-PRIORITY" in disk.life.found and disk.life.provisional == {}


def test_a_property_not_worth_shrinking_is_final_as_seen(tmp_path):
    disk = Disk(tmp_path)
    shrink = ShrinkState()
    disk.seen(shrink, seen("NO-HANG", 3, 5, 7))
    assert shrink.pinned is None
    (written,) = disk.on_disk().values()
    assert written.status == "unshrunk" and "not shrunk" in written.extra["note"]
    assert "NO-HANG" in disk.life.found


def test_a_saved_failure_that_fails_again_is_final_as_saved_or_pending(tmp_path):
    disk = Disk(tmp_path)
    again = {"DISPATCH-COMPLETE": seen("DISPATCH-COMPLETE", 3), "CAPTURE-ORDER": seen("CAPTURE-ORDER", 3)}
    disk.life.saved(again, "DISPATCH-COMPLETE", "shrunk", "digest-1")
    on_disk = {f.property: f for f in disk.on_disk().values()}
    saved = on_disk["DISPATCH-COMPLETE"]
    assert saved.status == "shrunk" and saved.extra["replayed"] == "digest-1"
    assert "first_seen_s" not in saved.extra  # nothing was searched for
    assert on_disk["CAPTURE-ORDER"].status == "pending"  # another property: shrunk when it recurs
    assert disk.life.found == {"DISPATCH-COMPLETE"} and set(disk.life.provisional) == {"CAPTURE-ORDER"}


def test_keys_finalised_by_an_earlier_incarnation_are_not_searched_for_again(tmp_path):
    disk = Disk(tmp_path)
    life = FindingLifecycle(record=disk.record, remove=disk.remove, defect_of=disk.defect_of,
                            first_seen=lambda key: {}, may_shrink=lambda: True, found=("DISPATCH-COMPLETE",))
    shrink = ShrinkState()
    keyed = {"DISPATCH-COMPLETE": seen("DISPATCH-COMPLETE", 3)}
    assert life.new_keys(keyed, shrink) == []
    life.seen(shrink, scenario(3), keyed, {})
    assert shrink.pinned is None and disk.on_disk() == {}
