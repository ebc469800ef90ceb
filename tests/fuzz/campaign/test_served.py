"""The campaign's runner share (fuzz.campaign.served): drawn scenarios served
through the target's hook, each difference between graphs and eager written
at once as a SERVED-EQUALS-EAGER finding that carries its runner verdict,
never asked of the runner again; replayed by serving again (cgsim.served)."""

from __future__ import annotations

import dataclasses

import io

import pytest

import cgsim.served
import cgsim.targets
from cgsim.config import ManagerConfig
from cgsim.finding import Finding
from cgsim.modes import CUDAGraphMode
from cgsim.replay import describe, reproduce
from cgsim.report.defects import reached, runner_said
from cgsim.report.findings import scan_findings, write_finding
from cgsim.scenario import Scenario, Step
from cgsim.targets.base import Drawing, Triage
from fuzz.campaign import served as phase
from fuzz.campaign.confirm import CONFIRMATION, confirm_phase


def _scenario(reqs: int) -> Scenario:
    return Scenario(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4), max_num_reqs=reqs),
                    (Step.capture(),))


def _run(tokens: list[int], raised: str | None = None) -> dict:
    return {"tokens": {"r0": tokens}, "logprobs": {"r0": [-1.0] * len(tokens)}, "raised": raised, "replays": 3}


class _Target:
    """A target whose runner serves scenario ``max_num_reqs == 4`` wrong."""

    def __init__(self) -> None:
        self.asked: list = []
        self.drawing = Drawing()
        self.triage = Triage(launch=self.launch, serve_scenarios=self.serve_scenarios, classify=self.classify)

    def prepare_environment(self) -> None:
        pass

    def launch(self, scenario: Scenario) -> dict:
        return {"line": f"serve --max-num-seqs {scenario.config.max_num_reqs}"}

    def classify(self, finding: Finding) -> dict:
        return {"known_defect": "wrong-tokens"} if finding.property == "SERVED-EQUALS-EAGER" else {}

    def serve_scenarios(self, scenarios, jobs, stopped, budget_s):
        self.asked.append(([s.config.max_num_reqs for s in scenarios], jobs, budget_s))
        out = []
        for s in scenarios:
            n = s.config.max_num_reqs
            if n == 3:
                out.append({"error": "the toy has no such model here"})
            elif n == 5:
                out.append(None)
            elif n == 6:
                out.append({"launch_line": "x", "requests": 1, "graphs": _run([], "RuntimeError: UVA"),
                            "eager": _run([], "RuntimeError: UVA")})
            else:
                graphs = _run([5, 7] if n == 4 else [5, 6])
                out.append({"launch_line": self.launch(s)["line"], "requests": 1, "graphs": graphs,
                            "eager": _run([5, 6]), "seconds": 35.0 if n == 4 else 21.4})
        return out


@pytest.fixture
def target(monkeypatch):
    t = _Target()
    for module in (cgsim.targets, cgsim.served):
        monkeypatch.setattr(module, "get_target", lambda name: t)
    monkeypatch.setattr(phase, "draw_served",
                        lambda name, ruleset, seed, limit: [_scenario(n) for n in (2, 3, 4, 5, 6)])
    return t


def test_a_served_difference_is_a_finding_on_disk_with_the_runners_verdict(target, tmp_path, monkeypatch):
    monkeypatch.setattr(phase.os, "cpu_count", lambda: 4)
    share = phase.served_phase("vllm", "mock", None, 0, str(tmp_path), 3, lambda: False, io.StringIO(), True, 60.0)
    assert target.asked == [([2, 3, 4, 5, 6], 2, 60.0)]  # two at a time on 4 cores
    [f] = scan_findings(str(tmp_path))
    assert f.property == "SERVED-EQUALS-EAGER" and f.fact("tokens") == [5, 7] and f.fact("eager_tokens") == [5, 6]
    assert f.scenario == _scenario(4).to_json() and f.extra["launch"] == {"line": "serve --max-num-seqs 4"}
    assert f.extra["known_defect"] == "wrong-tokens"  # the target's classify, as for the search's findings
    assert (tmp_path / f.repro).exists()
    entry = f.to_json()
    assert reached(entry) and "WRONG OUTPUT against eager: request r0: tokens [5, 7]" in runner_said(entry)
    assert share.notes == ("runner share: 2 launch(es) served with graphs and eager, 1 differ, 1 left unserved by "
                           "the budget (a pair took 21-35 s)",
                           "runner share: 1 launch(es) not served here: the toy has no such model here",
                           "runner share: 1 launch(es) not served here: vLLM raised with graphs and eager alike: "
                           "RuntimeError: UVA")
    assert share.seconds == (21.4, 35.0)
    # Counted as the search's checks are: the property judged two launches, one failed; and as coverage.
    assert share.stats() == {"checks": {"SERVED-EQUALS-EAGER": 2}, "failures": {"SERVED-EQUALS-EAGER": 1},
                             "coverage": {"runner_share": {"served": 2, "differ": 1, "unserved_budget": 1,
                                                           "not_served": 2},
                                          "runner_share_not_served": {
                                              "the toy has no such model here": 1,
                                              "vLLM raised with graphs and eager alike: RuntimeError: UVA": 1}}}


def test_a_served_finding_records_the_launch_the_target_says_it_served(target, tmp_path, monkeypatch):
    """A target may serve another launch than its launch hook's (vLLM: a
    speculative scenario drafting with DFlash): the finding names that one."""
    serve = target.triage.serve_scenarios

    def serving_another(scenarios, jobs, stopped, budget_s):
        return [None if r is None or "graphs" not in r else {**r, "launch": {"line": "serve --dflash"}}
                for r in serve(scenarios, jobs, stopped, budget_s)]

    monkeypatch.setattr(target, "triage", dataclasses.replace(target.triage, serve_scenarios=serving_another))
    phase.served_phase("vllm", "mock", None, 0, str(tmp_path), 1, lambda: False, io.StringIO(), True)
    [f] = scan_findings(str(tmp_path))
    assert f.extra["launch"] == {"line": "serve --dflash"}


def test_the_confirmation_phase_leaves_a_served_finding_alone(target, tmp_path, monkeypatch):
    phase.served_phase("vllm", "mock", None, 0, str(tmp_path), 1, lambda: False, io.StringIO(), True)
    write_finding(str(tmp_path), Finding(property="INIT-TOTAL", message="m", target="vllm", backend="mock",
                                         scenario=_scenario(2).to_json(), status="shrunk"))
    asked = []
    target.triage = Triage(confirm_findings=lambda fs, j, s, b: asked.extend(f["property"] for f in fs) or {})
    confirm_phase("vllm", str(tmp_path), 1, lambda: False, io.StringIO(), quiet=True)
    assert asked == ["INIT-TOTAL"]
    served = [f for f in scan_findings(str(tmp_path)) if f.property == "SERVED-EQUALS-EAGER"]
    assert served[0].extra[CONFIRMATION]["verdict"] == "served"


def test_a_launch_that_cannot_be_derived_is_a_note_and_the_campaign_goes_on(target, tmp_path, monkeypatch):
    def broken(name, ruleset, seed, limit):
        raise KeyError("toy_model")

    monkeypatch.setattr(phase, "draw_served", broken)
    share = phase.served_phase("vllm", "mock", None, 0, str(tmp_path), 1, lambda: False, io.StringIO(), True)
    assert share == phase.ServedShare(("runner share failed (KeyError: 'toy_model'); nothing was served",))
    assert scan_findings(str(tmp_path)) == []


def test_a_stopped_campaign_serves_nothing(target, tmp_path):
    share = phase.served_phase("vllm", "mock", None, 0, str(tmp_path), 1, lambda: True, io.StringIO(), True)
    assert share == phase.ServedShare() and share.stats() == {"checks": {}, "failures": {}}
    assert target.asked == [] and scan_findings(str(tmp_path)) == []


def test_a_served_finding_replays_by_serving_its_scenario_again(target, tmp_path):
    phase.served_phase("vllm", "mock", None, 0, str(tmp_path), 1, lambda: False, io.StringIO(), True)
    [f] = scan_findings(str(tmp_path))
    result = reproduce(f)
    assert result.reproduced and result.lines()[0].startswith("REPRODUCED SERVED-EQUALS-EAGER: request r0")
    assert target.asked[-1][0] == [4]
    assert any("launch: serve --max-num-seqs 4" in line for line in describe(f))
    fixed = f.with_(scenario=_scenario(2).to_json())  # the same claim on a launch served right
    assert not reproduce(fixed).reproduced


def test_a_served_finding_that_cannot_be_served_here_is_neither_reproduced_nor_fixed(target, tmp_path):
    phase.served_phase("vllm", "mock", None, 0, str(tmp_path), 1, lambda: False, io.StringIO(), True)
    [f] = scan_findings(str(tmp_path))
    with pytest.raises(cgsim.served.ScenarioNotRunnable, match="no such model"):
        reproduce(f.with_(scenario=_scenario(3).to_json()))


def test_the_share_is_a_quarter_of_the_search_within_bounds():
    assert [phase.served_budget(b) for b in (10, 800, 4000)] == [120.0, 200.0, 600.0]


def test_served_launches_count_as_the_propertys_checks_in_the_summary():
    from cgsim.report.summary import build_summary  # noqa: PLC0415

    summary = build_summary(run_id="r", settings={"ruleset": "vllm-0.32", "backend": "mock"}, findings=[],
                            stats=[{"scenarios": 3, "checks": {"NO-CRASH": 3}}, phase.ServedShare((), 2, 0).stats()])
    assert summary["properties"]["SERVED-EQUALS-EAGER"]["checks"] == 2  # held, not "judged nothing here"


@pytest.mark.slow
@pytest.mark.parametrize("share, confirm, expected", [(None, None, {"share": 150.0, "confirm": 600.0}),
                                                      (45.0, 0.0, {"share": 45.0}),
                                                      (0.0, 30.0, {"confirm": 30.0})])
def test_a_campaign_gives_each_runner_phase_its_own_budget_and_zero_skips_it(tmp_path, monkeypatch, share, confirm,
                                                                             expected):
    """--runner-share and --confirm-budget: after the search, the share and the
    confirmation each run for the time given (by default a quarter of the
    budget and the budget, within their bounds: 150 s and 600 s of 600 s), and
    not at all for 0."""
    import fuzz.campaign.run as run  # noqa: PLC0415
    from tests.fuzz.campaign.test_campaign import options  # noqa: PLC0415

    asked: dict[str, float] = {}

    def share_phase(*args):
        asked["share"] = args[-1]
        return phase.ServedShare()

    def confirmation(*args):
        asked["confirm"] = args[-1]
        return []

    monkeypatch.setattr(run, "served_phase", share_phase)
    monkeypatch.setattr(run, "confirm_phase", confirmation)
    result = run.run_campaign(options(tmp_path, max_examples=3, runner_share_s=share, confirm_budget_s=confirm))
    assert result.exit_code in (0, 1) and asked == expected
