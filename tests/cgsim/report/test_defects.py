"""Findings grouped by defect (cgsim.report.defects) and what a campaign
prints at its end: failing properties, how many held, those that judged
nothing, one card per defect, commands that stay valid, the HTML report."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from cgsim.finding import Finding
from cgsim.report.defects import group_defects, runner_said
from cgsim.report.markdown import render_markdown
from cgsim.report.summary import build_summary
from fuzz.campaign.run import EXIT_CLEAN, EXIT_FINDINGS, exit_code
from fuzz.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def entry(prop, fid, violates=(), status="shrunk", size=1, **extra):
    return {"id": fid, "property": prop, "violates": list(violates), "status": status,
            "scenario": {"steps": ["x"] * size}, **extra}


def test_one_scenario_that_violates_three_properties_is_one_card():
    entries = [entry("DISPATCH-COMPLETE", "c", ["DISPATCH-COMPLETE", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP"], size=3),
               entry("DISPATCH-PRIORITY", "p", ["DISPATCH-COMPLETE", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP"]),
               entry("DISPATCH-ROUNDTRIP", "r", ["DISPATCH-COMPLETE", "DISPATCH-ROUNDTRIP"]),
               entry("WARMUP-FIRST", "w", ["WARMUP-FIRST"])]
    cards = group_defects(entries)
    assert [c["primary"] for c in cards] == ["p", "w"]  # the smaller of the two scenarios that cover all three
    assert cards[0]["properties"] == ["DISPATCH-COMPLETE", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP"]
    assert sorted(cards[0]["findings"]) == ["c", "p", "r"] and cards[0]["findings"][0] == "p"
    assert cards[1]["findings"] == ["w"]


def test_a_documented_defect_is_one_card_whatever_its_properties():
    entries = [entry(p, p.lower(), [p], known_defect="#7 dead decode graphs") for p in
               ("CAPTURE-USEFUL", "DISPATCH-COMPLETE", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP", "KEY-CONSISTENT")]
    entries.append(entry("PAD-CONSISTENT", "pad", ["PAD-CONSISTENT"], known_defect="#3 padded metadata"))
    cards = group_defects(entries)
    assert [len(c["findings"]) for c in cards] == [5, 1]
    assert cards[0]["known_defect"] == "#7 dead decode graphs" and len(cards[0]["properties"]) == 5


def test_findings_without_violates_each_stand_alone():
    cards = group_defects([{"id": "a", "property": "A", "status": "shrunk", "scenario": {}},
                           {"id": "b", "property": "B", "status": "unshrunk", "scenario": {}}])
    assert [c["findings"] for c in cards] == [["a"], ["b"]]


@pytest.mark.slow
def test_the_range_off_by_one_mutant_is_one_defect_and_the_console_says_what_held(tmp_path, capsys, monkeypatch):
    """The campaign's end: the three properties the mutant breaks, one card
    for them, "N held", the properties that judged nothing on their own
    line (only those of the rulesets it ran), replay commands by absolute
    path (valid from any directory, and after reports/latest moved on), and
    index.html."""
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--target", "mutant:range-off-by-one", "--max-examples", "40", "--budget", "10m",
            "--report-dir", "reports"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    failing = sorted(re.findall(r"FAILED (\S+):", out))
    assert failing == ["DISPATCH-COMPLETE", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP"]
    assert re.search(r"^  \d+ held$", out, re.M)
    (idle,) = [line for line in out.splitlines() if line.startswith("  judged nothing here")]
    idle_names = idle.split(": ", 1)[1].split(", ")
    assert "DISPATCH-COMPLETE" not in idle_names
    assert "SGL-" not in out  # no ruleset this campaign ran judges an SGLang design property
    assert "CAPTURE-ORDER" not in out  # no table of every property: it held
    assert "1 defect(s) in 3 finding(s)" in out
    (replay,) = re.findall(r"replay: python -m fuzz replay (\S+)", out)
    assert os.path.isabs(replay) and "latest" not in replay
    report = re.search(r"^report: (\S+)", out, re.M).group(1)
    assert os.path.isabs(report) and report.endswith("index.html") and os.path.exists(report)
    assert main(argv) == 1  # a second run: reports/latest now names it
    capsys.readouterr()
    proc = subprocess.run([sys.executable, "-m", "fuzz", "replay", replay], cwd="/", capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stderr


@pytest.mark.slow
def test_the_report_shows_one_card_per_defect(tmp_path):
    from fuzz.campaign import CampaignOptions, run_campaign

    result = run_campaign(CampaignOptions(target="mutant:range-off-by-one", max_examples=40, budget_s=600.0,
                                          report_dir=str(tmp_path), quiet=True))
    (card,) = result.summary["defects"]
    assert card["properties"] == ["DISPATCH-COMPLETE", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP"]
    assert sorted(card["findings"]) == sorted(f["id"] for f in result.summary["findings"])
    md = open(os.path.join(result.run_dir, "index.md")).read()
    assert md.count("\n### ") == 1 and "**1 defect(s)** in 3 finding(s)" in md
    html = open(os.path.join(result.run_dir, "index.html")).read()
    assert html.count('class="defect"') == 1 and html.count('class="finding also"') == 2


def test_a_finding_the_engines_runner_never_builds_is_manager_level_only_not_a_defect():
    """fuzz.campaign.confirm's verdicts: 'absent' (the runner never captures the
    graphs the finding names) and 'refused' leave the defect count; the rest
    (confirmed, not asked, could not be asked) stay defects."""
    def finding(prop, verdict):
        extra = {"runner_confirmation": {"verdict": verdict, "manager": "main", "named": ["F:t16:r1:u16:ub2"],
                                         "missing": ["F:t16:r1:u16:ub2"] if verdict == "absent" else [],
                                         "detail": "the runner's main manager (FULL) holds F:t16:r1:u1"}}
        return Finding(property=prop, message="m", target="vllm", backend="mock", scenario={"steps": []},
                       status="shrunk", extra=extra)

    absent = build_summary(run_id="r", settings={}, findings=[finding("INIT-TOTAL", "absent")])
    assert absent["defects"] == [] and absent["manager_level"] == [absent["findings"][0]["id"]]
    assert exit_code(absent, None, False) == EXIT_CLEAN
    both = build_summary(run_id="r", settings={}, findings=[finding("INIT-TOTAL", "absent"),
                                                           finding("CAPTURE-USEFUL", "confirmed"),
                                                           finding("NO-CRASH", "environment")])
    assert sorted(c["properties"][0] for c in both["defects"]) == ["CAPTURE-USEFUL", "NO-CRASH"]
    assert exit_code(both, None, False) == EXIT_FINDINGS
    text = render_markdown(absent)
    assert "## Manager-level only" in text and "never captures F:t16:r1:u16:ub2" in text


@pytest.mark.parametrize("served, said", [
    ({"requests": 3, "replays": 9, "raised": None, "eager_raised": None, "differences": []},
     "served 3 requests with graphs (9 replays): eager's tokens"),
    ({"requests": 3, "replays": 9, "raised": None, "eager_raised": None,
      "differences": ["request r0: tokens [5, 7] with CUDA graphs, [5, 6] eager"]},
     "WRONG OUTPUT against eager: request r0: tokens [5, 7] with CUDA graphs, [5, 6] eager"),
    ({"requests": 3, "replays": 9, "raised": None, "eager_raised": None, "wrong_output": False,
      "differences": ["request r0: drafted [3, 0] with CUDA graphs, [3, 4] eager (its step 2)"]},
     "eager's output but OTHER DRAFTS (fewer accepted, slower): request r0: drafted [3, 0] with CUDA graphs, "
     "[3, 4] eager (its step 2)"),
    ({"requests": 3, "replays": 0, "raised": "RuntimeError: boom", "eager_raised": None, "differences": []},
     "serving with graphs, the engine raised: RuntimeError: boom"),
    ({"requests": 3, "replays": 0, "raised": "KeyError: x", "eager_raised": "KeyError: x", "differences": []},
     "serving raised with graphs and eager alike: KeyError: x"),
    ({"error": "serving took over 60 s"}, "not served here (serving took over 60 s)"),
])
def test_a_confirmed_finding_says_what_serving_its_launch_showed(served, said):
    """runner_build.confirm_findings serves each confirmed launch with graphs
    and eager; the runner's phrase ends with what that showed."""
    entry = {"runner_confirmation": {"verdict": "confirmed", "manager": "main", "named": ["F:t4:r4:u1"],
                                     "served": served}}
    assert runner_said(entry).startswith("confirmed: the runner built from the launch captures F:t4:r4:u1")
    assert runner_said(entry).endswith(said)
    del entry["runner_confirmation"]["served"]
    assert runner_said(entry).endswith("in its main manager")
