"""The campaign's last phase (fuzz.campaign.confirm): each finding on disk
asked of the engine's own runner through the target's hook, the verdict
written into the finding; nothing asked once the campaign was stopped."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

import cgsim.targets
from cgsim.finding import Finding
from cgsim.report.findings import scan_findings, write_finding
from cgsim.targets.base import Triage
from fuzz.campaign.confirm import CONFIRMATION, confirm_phase, phase_budget


def _finding(prop: str) -> Finding:
    return Finding(property=prop, message="m", target="vllm", backend="mock", scenario={"steps": [prop]},
                   status="shrunk")


@pytest.fixture
def findings_dir(tmp_path, monkeypatch):
    for prop in ("CAPTURE-USEFUL", "INIT-TOTAL"):
        write_finding(str(tmp_path), _finding(prop))
    asked = []

    def hook(findings, jobs, stopped, budget_s):
        asked.append((sorted(f["property"] for f in findings), jobs, budget_s))
        return {f["id"]: {"verdict": "absent" if f["property"] == "INIT-TOTAL" else "confirmed"} for f in findings}

    target = SimpleNamespace(triage=Triage(confirm_findings=hook))
    monkeypatch.setattr(cgsim.targets, "get_target", lambda name: target)
    return str(tmp_path), asked


def test_each_finding_carries_the_runners_verdict(findings_dir):
    path, asked = findings_dir
    notes = confirm_phase("vllm", path, 3, lambda: False, io.StringIO(), quiet=True, budget_s=phase_budget(5))
    assert asked == [(["CAPTURE-USEFUL", "INIT-TOTAL"], 3, 60.0)]
    verdicts = {f.property: f.extra[CONFIRMATION]["verdict"] for f in scan_findings(path)}
    assert verdicts == {"CAPTURE-USEFUL": "confirmed", "INIT-TOTAL": "absent"}
    assert notes == ["runner confirmation: 1 absent, 1 confirmed (of 2 finding(s))"]


def test_a_stopped_campaign_asks_nothing_and_keeps_its_findings(findings_dir):
    path, asked = findings_dir
    assert confirm_phase("vllm", path, 1, lambda: True, io.StringIO(), quiet=True) == []
    assert asked == [] and len(scan_findings(path)) == 2
    assert all(CONFIRMATION not in f.extra for f in scan_findings(path))


def test_a_verdict_that_cannot_be_written_leaves_the_findings_as_they_were(findings_dir, monkeypatch):
    path, _ = findings_dir

    def full_disk(self, fid, extra):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("cgsim.report.findings.FindingStore.annotate", full_disk)
    notes = confirm_phase("vllm", path, 1, lambda: False, io.StringIO(), quiet=True)
    assert len(notes) == 1 and "could not be written" in notes[0] and "No space left" in notes[0]
    assert len(scan_findings(path)) == 2
