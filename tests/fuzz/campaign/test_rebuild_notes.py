"""``python -m fuzz report RUN_DIR`` knows its own earlier notes by the list
a rebuilt summary keeps of them (``rebuild_notes``), never by their words:
a campaign's note that reads like a rebuild's survives any number of
rebuilds, the rebuild's own are replaced, and a summary rebuilt before the
list existed is still cleaned of its rebuild's notes."""

from __future__ import annotations

import json

from cgsim.config import ManagerConfig
from cgsim.finding import Finding
from cgsim.report.findings import write_finding
from cgsim.report.summary import build_summary, write_report
from cgsim.scenario import Scenario, Step
from fuzz.campaign.rebuild import REBUILD_NOTES, rebuild_report

# A campaign's own note that shares words with the notes a rebuild writes.
CAMPAIGN_NOTE = "worker 1 re-rendered from the findings on disk its cache; there was no summary.json to read"
SETTINGS = {"target": "mutant:full-before-piecewise", "backend": "mock", "ruleset": "any", "seed": 4,
            "budget_s": 60, "workers": 1}


def _dead_run(tmp_path, notes=(), **extra):
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    write_finding(str(run_dir / "findings"), Finding(
        property="CAPTURE-ORDER", message="FULL before PIECEWISE", target="mutant:full-before-piecewise",
        backend="mock", scenario=Scenario(ManagerConfig(), (Step.capture(),)).to_json(), status="shrunk"))
    last = build_summary(run_id="run-x", settings=SETTINGS, findings=[], stats=[{"scenarios": 3}],
                         started_at="2026-01-01T00:00:00+00:00", elapsed_s=5.0, notes=notes)
    write_report(str(run_dir), dict(last, **extra))
    return run_dir


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_a_rebuild_lists_the_notes_it_wrote_and_replaces_only_those(tmp_path):
    run_dir = _dead_run(tmp_path, notes=[CAMPAIGN_NOTE])
    rebuild_report(str(run_dir), quiet=True)
    first = _summary(run_dir)
    own = first[REBUILD_NOTES]
    assert own and all(n in first["notes"] for n in own) and CAMPAIGN_NOTE not in own
    assert any("the campaign died before its final report" in n for n in own)
    for _ in range(2):
        rebuild_report(str(run_dir), quiet=True)
    again = _summary(run_dir)
    assert again["notes"].count(CAMPAIGN_NOTE) == 1  # kept, though it reads like a rebuild's
    assert len(again["notes"]) == len(first["notes"])  # the rebuild's own replaced, not added to
    assert again[REBUILD_NOTES] == [n for n in again["notes"] if n != CAMPAIGN_NOTE]


def test_a_summary_rebuilt_before_the_list_existed_loses_its_rebuilds_notes(tmp_path):
    old_note = ("the campaign died before its final report (last file written at 2026-01-01T00:00:05+00:00); "
                "rebuilt from the findings on disk by python -m fuzz report at 2026-01-01T01:00:00+00:00; counts "
                "are from the last summary")
    run_dir = _dead_run(tmp_path, notes=["a note of the campaign", old_note],
                        rebuilt_at="2026-01-01T01:00:00+00:00", last_activity="2026-01-01T00:00:05+00:00")
    rebuild_report(str(run_dir), quiet=True)
    summary = _summary(run_dir)
    assert old_note not in summary["notes"]
    assert "a note of the campaign" in summary["notes"] and "a note of the campaign" not in summary[REBUILD_NOTES]
    assert sum("the campaign died before its final report" in n for n in summary["notes"]) == 1


def test_a_summary_never_rebuilt_keeps_every_note(tmp_path):
    run_dir = _dead_run(tmp_path, notes=[CAMPAIGN_NOTE])
    rebuild_report(str(run_dir), quiet=True)
    assert CAMPAIGN_NOTE in _summary(run_dir)["notes"]
