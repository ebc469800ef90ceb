"""Campaign mechanics: findings written at once and shrunk, crashes/hangs/worker
deaths as findings, determinism, partial reports on SIGINT/SIGTERM/SIGKILL,
two campaigns in one report dir.

Most tests use ``FakePipeline``: real Scenarios from a tiny strategy, and a
fake run/judge pair (returning real Traces and Verdicts) whose bugs are chosen
per test, so the campaign machinery is tested independently of the
(separately tested) runner and properties.  One test runs the real pipeline
on a mutant.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cgsim.report.findings import load_finding, scan_findings
from cgsim.targets.base import Triage
from cgsim.targets.reference import ReferenceTarget

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def fake_strategy(ruleset, target=None):
    """Tiny scenarios: capture, then up to four batches of up to 16 tokens."""
    from hypothesis import strategies as st

    from cgsim.config import ManagerConfig
    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario, Step

    batch = st.builds(
        Batch,
        st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple),
        st.integers(0, 2),
    )
    return st.builds(
        lambda sizes, batches: Scenario(
            ManagerConfig(capture_sizes=tuple(sorted(set(sizes))), lora_cases=(0, 1, 2)),
            (Step.capture(),) + tuple(Step.dispatch(b) for b in batches),
            ruleset=ruleset or "pr48822",
        ),
        st.lists(st.integers(1, 16), min_size=1, max_size=4),
        st.lists(batch, min_size=1, max_size=4),
    )


class FakePipeline:
    """A fake target and checker returning real Traces and Verdicts.

    bug: which misbehaviour the fake target has.

    - "big": FAKE-BIG is violated when some dispatched batch has >= 3 tokens
      (minimal example: one batch of exactly 3 tokens);
    - "two": FAKE-BIG as above and FAKE-LORA when a batch has LoRA adapters;
    - "raise": run raises for batches of >= 5 tokens;
    - "hang": run sleeps forever (interruptible) for >= 6 tokens;
    - "hard-hang": run blocks in a way the signal timer cannot interrupt;
    - "segv": the process dies with SIGSEGV for >= 6 tokens;
    - "corrupt": the trace records a corrupted state for >= 4 tokens;
    - "env-error": run raises TargetEnvironmentError for >= 5 tokens (this
      machine's problem, as a shared coverage data file was);
    - "once": FAKE-BIG as "big", but only the first time a scenario runs in
      the process (a failure that does not replay);
    - "none": no bug;
    - "slow": no bug, each scenario sleeps 20 ms (for interruption tests);
    - "two-slow": "two", each scenario sleeping 20 ms (for the shrink limit).
    """

    def __init__(self, bug: str = "big"):
        self.bug = bug
        self.judged: set = set()  # per process: the scenarios judged so far ("once")

    def run(self, scenario, target, backend, timeout=None):
        from cgsim.timeouts import deadline
        from cgsim.trace import Error, Trace

        trace = Trace(target, backend)
        tokens = max(b.num_tokens for b in scenario.batches)
        if self.bug == "raise" and tokens >= 5:
            raise RuntimeError(f"fake target exploded on {tokens} tokens")
        if self.bug == "env-error" and tokens >= 5:
            from cgsim.targets import TargetEnvironmentError

            raise TargetEnvironmentError("DataError: Couldn't use data file '.coverage': no such table: coverage_schema")
        if self.bug == "hang" and tokens >= 6:
            from cgsim.timeouts import ScenarioTimeout

            try:
                with deadline(timeout, "fake scenario exceeded its timeout") as own:
                    while True:
                        time.sleep(0.01)
            except ScenarioTimeout as exc:
                if own is None or not own.owns(exc):
                    raise
                trace.add(Error(step=1, phase="dispatch", error="timeout", exc_type="ScenarioTimeout", message=str(exc)))
        if self.bug == "hard-hang" and tokens >= 6:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        if self.bug == "segv" and tokens >= 6:
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.bug in ("slow", "two-slow"):
            time.sleep(0.02)
        if self.bug == "slow60":  # a loaded machine
            time.sleep(0.06)
        if self.bug == "corrupt" and tokens >= 4:
            trace.add(Error(step=1, phase="dispatch", error="corrupt", exc_type="CorruptState",
                            message="captured flag set but no graphs"))
            trace.record_built(scenario.config.mode, uses_breakable=False, has_piecewise_runner=False)
        return trace

    def judge(self, scenario, trace):
        from cgsim.properties import Verdict, Violation, check_scenario

        # The harness properties judge the fake's Error events for real.
        harness = check_scenario(scenario, trace, only=["NO-CRASH", "NO-HANG"])
        viol = list(harness.violations)
        if self.bug in ("big", "two", "two-slow"):
            for i, b in enumerate(scenario.batches):
                if b.num_tokens >= 3:
                    viol.append(Violation("FAKE-BIG", f"batch of {b.num_tokens} tokens", i))
                    break
        if self.bug == "once":  # FAKE-BIG only the first time a scenario runs in this process
            key = json.dumps(scenario.to_json(), sort_keys=True)
            if key not in self.judged and any(b.num_tokens >= 3 for b in scenario.batches):
                viol.append(Violation("FAKE-BIG", "batch of 3 or more tokens, the first time", 0))
            self.judged.add(key)
        if self.bug == "gpu-env":
            gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
            viol.append(Violation(f"FAKE-GPU-{gpu}", f"ran with CUDA_VISIBLE_DEVICES={gpu}", 0))
        if self.bug == "twin":  # one property, two causes: every big batch, and big batches with adapters
            for i, b in enumerate(scenario.batches):
                if b.num_tokens >= 3:
                    viol.append(Violation("FAKE-BIG", f"batch of {b.num_tokens} tokens", i))
                    break
            for i, b in enumerate(scenario.batches):
                if b.num_tokens >= 3 and b.num_active_loras:
                    viol.append(Violation("FAKE-BIG", f"adapter batch of {b.num_tokens} tokens", i))
                    break
        if self.bug == "overflow":  # as properties.view.group caps a property's violations
            big = [i for i, b in enumerate(scenario.batches) if b.num_tokens >= 3]
            if big:
                viol.append(Violation("FAKE-BIG", "batch of many tokens", big[0]))
                viol.append(Violation("FAKE-BIG", "... and 3 more violations of this property", None,
                                      (("overflow", 3),)))
        if self.bug in ("two", "two-slow"):
            for i, b in enumerate(scenario.batches):
                if b.num_active_loras:
                    viol.append(Violation("FAKE-LORA", f"batch with {b.num_active_loras} adapters", i))
                    break
        return Verdict(tuple(viol), ("FAKE-BIG", "FAKE-LORA") + harness.checked)


# A run bounded by --max-examples gets a budget it never reaches: how many
# scenarios fit in some seconds depends on the machine's load, a count does not.
COUNTED_BUDGET_S = 600.0


def options(tmp_path, **kw):
    from fuzz.campaign import CampaignOptions

    base = dict(target="reference", budget_s=COUNTED_BUDGET_S if "max_examples" in kw else 3.0, workers=1, seed=1,
                report_dir=str(tmp_path / "reports"), quiet=True, timeout_s=2.0, shrink_grace_s=10.0)
    base.update(kw)
    return CampaignOptions(**base)


def run(tmp_path, bug="big", **kw):
    from fuzz.campaign import run_campaign

    return run_campaign(options(tmp_path, **kw), pipeline=FakePipeline(bug), strategy=fake_strategy)


def at(result, rel):
    return os.path.join(result.run_dir, rel)


def test_finding_is_shrunk_and_written_with_a_repro(tmp_path):
    result = run(tmp_path, bug="big", max_examples=60)
    assert result.exit_code == 1
    findings = result.summary["findings"]
    assert [f["property"] for f in findings] == ["FAKE-BIG"]
    f = findings[0]
    assert f["status"] == "shrunk"
    batches = [s["batch"] for s in f["scenario"]["steps"] if s["kind"] == "dispatch"]
    assert batches and sum(batches[-1]["query_lens"]) == 3  # shrunk to the boundary
    assert len(batches) == 1
    assert os.path.exists(at(result, f["path"])) and os.path.exists(at(result, f["repro_path"]))
    assert load_finding(at(result, f["path"])).id == f["id"]
    # the provisional (unshrunk) file was replaced, not left beside it
    assert [x.id for x in scan_findings(os.path.dirname(at(result, f["path"])))] == [f["id"]]
    summary = json.load(open(os.path.join(result.run_dir, "summary.json")))
    assert summary["complete"] is True and summary["schema_version"] == 1
    assert summary["properties"]["FAKE-BIG"]["failures"] >= 1
    assert summary["properties"]["FAKE-LORA"]["checks"] == summary["scenarios"]


@pytest.mark.slow
def test_a_finding_is_written_once_its_replay_shows_it(tmp_path):
    """Each failure is replayed once before its first file is written (kept
    as written here: too slow to shrink); replays are no scenarios, so a
    seed decides the same runs as before."""
    result = run(tmp_path, bug="two-slow", max_examples=100, shrink_limit_s=0.005)
    found = scan_findings(at(result, "findings"))
    assert sorted(f.property for f in found) == ["FAKE-BIG", "FAKE-LORA"]
    assert all(f.status == "pending" and f.extra["replays"] == {"runs": 1, "reproduced": 1} for f in found)
    assert not any("flaky" in f.extra for f in found)
    assert result.summary["scenarios"] == 100


def test_a_failure_that_does_not_replay_is_written_flaky_with_its_rate(tmp_path):
    """A failure the same worker cannot show again on the same backend (as
    a repro script exiting 0 where the campaign found it): written once, as
    seen, marked flaky with its rate, never shrunk into a "shrunk" finding
    that nothing reproduces."""
    from fuzz.campaign.worker import FLAKY_REPLAYS

    result = run(tmp_path, bug="once", max_examples=60)
    (f,) = scan_findings(at(result, "findings"))
    assert f.property == "FAKE-BIG" and f.status == "unshrunk"
    assert f.extra["replays"] == {"runs": FLAKY_REPLAYS, "reproduced": 0} and f.extra["flaky_rate"] == 0.0
    assert f"0 of {FLAKY_REPLAYS} replays" in f.extra["flaky"]
    (entry,) = result.summary["findings"]
    assert entry["flaky_rate"] == 0.0 and entry["status"] == "unshrunk"


def test_report_files_are_readable_by_others_and_hold_no_absolute_paths(tmp_path):
    old = os.umask(0o022)
    try:
        result = run(tmp_path, bug="big", max_examples=30)
    finally:
        os.umask(old)
    f = result.summary["findings"][0]
    for rel in ("summary.json", "junit.xml", "index.md", f["path"]):
        assert os.stat(at(result, rel)).st_mode & 0o777 == 0o644, rel
    assert os.stat(at(result, f["repro_path"])).st_mode & 0o777 == 0o755
    index = open(at(result, "index.md")).read()
    assert str(tmp_path) not in index and result.run_dir not in index
    assert "relative to this run's directory" in index
    assert f"python -m fuzz replay {f['path']}" in index and f"python {f['repro_path']}" in index


def test_keeps_going_after_a_finding_and_finds_other_properties(tmp_path):
    result = run(tmp_path, bug="two", max_examples=200)
    props = sorted(f["property"] for f in result.summary["findings"])
    assert props == ["FAKE-BIG", "FAKE-LORA"]
    # "unshrunk" is for what is never shrunk (hangs, deaths), not for a
    # violation seen while another one was being shrunk ("pending").
    assert not [f.id for f in scan_findings(os.path.join(result.run_dir, "findings")) if f.status == "unshrunk"]
    for f in result.summary["findings"]:
        assert f["status"] == "shrunk", f
        # each finding is shrunk for its own property, not the other one
        dispatched = [s["batch"] for s in f["scenario"]["steps"] if s["kind"] == "dispatch"]
        if f["property"] == "FAKE-LORA":
            assert dispatched[0]["num_active_loras"] == 1 and sum(dispatched[0]["query_lens"]) == 1


def _classify_adapter_batches(finding):
    return {"known_defect": "adapters" if "adapter" in finding.message else "plain"}


def test_a_second_documented_defect_behind_a_found_property_is_still_found(tmp_path, monkeypatch):
    """A target that names the documented defect of each finding (vLLM's
    classify): a property once found is still searched for an instance of
    another defect, which gets its own finding, shrunk for that defect."""
    monkeypatch.setattr(ReferenceTarget, "triage", Triage(classify=_classify_adapter_batches))
    result = run(tmp_path, bug="twin", max_examples=300)
    findings = scan_findings(os.path.join(result.run_dir, "findings"))
    assert sorted((f.property, f.extra["known_defect"]) for f in findings) == [("FAKE-BIG", "adapters"),
                                                                               ("FAKE-BIG", "plain")]
    for f in findings:
        assert f.status == "shrunk", f
        if f.extra["known_defect"] == "adapters":  # shrunk keeping its own cause
            batch = [s["batch"] for s in f.scenario["steps"] if s["kind"] == "dispatch"][0]
            assert batch["num_active_loras"] >= 1 and sum(batch["query_lens"]) == 3


def test_a_propertys_overflow_note_is_no_finding_of_its_own(tmp_path, monkeypatch):
    """ "... and N more violations" names no cause: a classifier labels it as
    nothing, and it must not become an unlabelled second finding."""
    monkeypatch.setattr(ReferenceTarget, "triage", Triage(
        classify=lambda f: {"known_defect": "big"} if f.message.startswith("batch of") else {}))
    result = run(tmp_path, bug="overflow", max_examples=200)
    findings = scan_findings(os.path.join(result.run_dir, "findings"))
    assert [(f.property, f.extra["known_defect"]) for f in findings] == [("FAKE-BIG", "big")]


@pytest.mark.slow
def test_a_shrink_past_its_limit_is_recorded_and_the_search_goes_on(tmp_path):
    """A slow shrink stops at --shrink-limit: its smallest failure so far is
    final (shrink-interrupted, saying why) and the worker fuzzes on, so a
    second defect is still found within the budget."""
    result = run(tmp_path, bug="two-slow", max_examples=150, shrink_limit_s=0.15)
    found = {f.property: f for f in scan_findings(at(result, "findings"))}
    assert set(found) == {"FAKE-BIG", "FAKE-LORA"}
    limited = [f for f in found.values() if "--shrink-limit" in f.extra.get("note", "")]
    assert limited and all(f.status == "shrink-interrupted" for f in limited)


@pytest.mark.slow
def test_a_failure_whose_run_outlasts_the_shrink_limit_waits_for_a_cheaper_recurrence(tmp_path):
    """A run longer than --shrink-limit leaves no time to shrink: Hypothesis
    would run that scenario again first.  Such a failure is written at once
    ("pending", with its time to find) and no shrink starts."""
    result = run(tmp_path, bug="two-slow", max_examples=100, shrink_limit_s=0.005)
    found = scan_findings(at(result, "findings"))
    assert sorted(f.property for f in found) == ["FAKE-BIG", "FAKE-LORA"]
    assert [f.status for f in found] == ["pending", "pending"], [(f.property, f.status) for f in found]
    assert all("first_seen_cpu_s" in f.extra for f in found)


def test_a_documented_defect_is_shrunk_once_over_all_its_properties(tmp_path, monkeypatch):
    """Two properties of one documented defect (a cascade: vLLM's #7 shows
    through five): the first is shrunk; the other is written final as it was
    seen, naming the shrunk finding, instead of costing a shrink of its own."""
    monkeypatch.setattr(ReferenceTarget, "triage", Triage(classify=lambda f: {"known_defect": "one-cause"}))
    result = run(tmp_path, bug="two", max_examples=200)
    found = {f.property: f for f in scan_findings(os.path.join(result.run_dir, "findings"))}
    assert set(found) == {"FAKE-BIG", "FAKE-LORA"}
    (shrunk,) = [f for f in found.values() if f.status == "shrunk"]
    (other,) = [f for f in found.values() if f is not shrunk]
    assert other.status == "unshrunk" and shrunk.id in other.extra["note"] and "one-cause" in other.extra["note"]
    assert "first_seen_scenarios" in other.extra


@pytest.mark.slow
def test_shrinking_takes_at_most_its_share_of_the_time(tmp_path):
    """With the share spent, a new failure is written at once ("pending",
    with its time to find) and the search goes on instead of shrinking it;
    with a share of 1 every failure is shrunk when it is found."""
    capped = run(tmp_path / "capped", bug="two-slow", max_examples=150, shrink_time_share=0.001)
    found = scan_findings(os.path.join(capped.run_dir, "findings"))
    assert sorted(f.property for f in found) == ["FAKE-BIG", "FAKE-LORA"]
    assert sorted(f.status for f in found) == ["pending", "shrunk"]
    assert all("first_seen_cpu_s" in f.extra for f in found)
    free = run(tmp_path / "free", bug="two-slow", max_examples=150, shrink_time_share=1.0)
    assert sorted(f.status for f in scan_findings(os.path.join(free.run_dir, "findings"))) == ["shrunk", "shrunk"]


def test_the_shrink_share_is_a_quarter_and_off_for_repeatable_runs():
    from fuzz.campaign import CampaignOptions, UsageError
    from fuzz.campaign.options import validate

    assert CampaignOptions(budget_s=60).shrink_share == 0.25
    assert CampaignOptions(budget_s=60, max_examples=100).shrink_share is None
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(UsageError, match="--shrink-share"):
            validate(CampaignOptions(budget_s=60, shrink_time_share=bad))


def test_the_shrink_limit_is_a_tenth_of_the_budget_and_off_for_repeatable_runs(tmp_path):
    from fuzz.campaign import CampaignOptions

    assert CampaignOptions(budget_s=600).shrink_limit == 60 and CampaignOptions(budget_s=10).shrink_limit == 5
    assert CampaignOptions(budget_s=600, max_examples=100).shrink_limit is None  # no time in a repeatable run
    assert CampaignOptions(budget_s=600, shrink_limit_s=0).shrink_limit is None


@pytest.mark.slow
def test_without_a_classifier_one_finding_per_property(tmp_path):
    result = run(tmp_path, bug="twin", max_examples=300)
    assert [f["property"] for f in result.summary["findings"]] == ["FAKE-BIG"]


def test_no_findings_exits_zero(tmp_path):
    result = run(tmp_path, bug="none", max_examples=40)
    assert result.exit_code == 0
    assert result.summary["findings"] == []
    assert result.summary["scenarios"] == 40


def _sglang_strategy(ruleset, target=None):
    """fake_strategy's scenarios, under the sglang ruleset whatever the campaign was given."""
    return fake_strategy("sglang", target)


@pytest.mark.parametrize("strategy, listed, absent", [
    (fake_strategy, "DISPATCH-PRIORITY", ("SGL-",)),  # pr48822: no SGLang design property can judge
    (_sglang_strategy, "SGL-DISPATCH-SOUND", ("FRESH-METADATA", "DISPATCH-PRIORITY")),  # waived by the design
])
def test_a_campaign_lists_only_the_properties_the_rulesets_it_ran_judge(tmp_path, strategy, listed, absent):
    """Idle properties are listed where a ruleset the workers ran judges
    them; the others are nowhere: console, summary.json, index.md,
    index.html, junit.xml."""
    import io

    from fuzz.campaign import run_campaign

    out = io.StringIO()
    result = run_campaign(options(tmp_path, max_examples=10, quiet=False), pipeline=FakePipeline("none"),
                          strategy=strategy, out=out, err=io.StringIO())
    assert result.exit_code == 0 and result.summary["scenarios"] == 10
    (idle,) = [line for line in out.getvalue().splitlines() if line.startswith("  judged nothing here")]
    assert listed in idle.split(": ", 1)[1].split(", ")
    texts = [out.getvalue()] + [open(at(result, name)).read()
                                for name in ("summary.json", "index.md", "index.html", "junit.xml")]
    for text in texts:
        assert listed in text and not any(word in text for word in absent)


def test_a_reference_campaign_lists_only_its_own_familys_properties(tmp_path):
    """The real pipeline on the reference (vLLM's designs): nothing of
    SGLang's runners or the vision encoder anywhere; "judged nothing here"
    still names the decode property this target cannot exercise
    (SERVED-EQUALS-EAGER: it serves nothing), and no harness outcome, which
    every scenario was watched for."""
    import io

    from cgsim.properties import WATCHED, judged_by
    from cgsim.properties.encoder import ENCODER_PROPERTIES
    from cgsim.spec.rulesets import rulesets_of
    from fuzz.campaign import run_campaign

    out = io.StringIO()
    result = run_campaign(options(tmp_path, max_examples=30, quiet=False), out=out, err=io.StringIO())
    assert result.exit_code == 0 and result.summary["scenarios"] == 30
    props = result.summary["properties"]
    assert set(props) <= set(judged_by(rulesets_of("vllm")))  # the decode family under vLLM's designs
    (idle,) = [line for line in out.getvalue().splitlines() if line.startswith("  judged nothing here")]
    idle_names = idle.split(": ", 1)[1].split(", ")
    assert idle_names == [pid for pid, v in props.items() if not v["checks"]]
    assert "SERVED-EQUALS-EAGER" in idle_names and not set(WATCHED) & set(idle_names)
    assert all(props[pid]["checks"] == 30 for pid in WATCHED)
    others = [pid for pid, p in judged_by(rulesets_of("sglang")).items() if p.engine] + list(ENCODER_PROPERTIES)
    texts = [out.getvalue()] + [open(at(result, name)).read()
                                for name in ("summary.json", "index.md", "index.html", "junit.xml")]
    for text in texts:
        assert "SERVED-EQUALS-EAGER" in text and not [pid for pid in others if pid in text]


def test_a_campaign_that_ran_no_scenario_is_not_a_clean_pass(tmp_path, capsys):
    result = run(tmp_path, bug="big", budget_s=0.01)  # over before the worker's first scenario
    assert result.summary["scenarios"] == 0
    assert result.exit_code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no scenario ran" in err and "--budget" in err


def test_same_seed_same_findings(tmp_path):
    # --max-examples bounds the run, not the clock: exactly repeatable
    a = run(tmp_path / "a", bug="two", max_examples=120, seed=7)
    b = run(tmp_path / "b", bug="two", max_examples=120, seed=7)
    ids = lambda r: sorted(f["id"] for f in r.summary["findings"])  # noqa: E731
    assert ids(a) == ids(b) and ids(a)
    assert a.summary["scenarios"] == b.summary["scenarios"]


@pytest.mark.slow
def test_same_seed_same_budget_same_findings(tmp_path):
    a = run(tmp_path / "a", bug="big", budget_s=2.0, seed=3)
    b = run(tmp_path / "b", bug="big", budget_s=2.0, seed=3)
    assert sorted(f["id"] for f in a.summary["findings"]) == sorted(f["id"] for f in b.summary["findings"])


@pytest.mark.slow
def test_a_counted_run_does_not_depend_on_the_machines_speed(tmp_path):
    """--max-examples bounds a test's run, never a wall-clock budget: on a
    machine this slow (60 ms a scenario) every scenario asked for still runs."""
    result = run(tmp_path, bug="slow60", max_examples=80)
    assert result.summary["scenarios"] == 80 and result.summary["complete"]


def test_target_that_raises_is_a_finding_and_the_campaign_goes_on(tmp_path):
    result = run(tmp_path, bug="raise", max_examples=80)
    assert result.exit_code == 1
    (f,) = result.summary["findings"]
    assert f["property"] == "NO-CRASH" and f["kind"] == "crash" and "exploded" in f["message"]
    assert result.summary["scenarios"] >= 80  # kept going after the crash


def _strategy_that_breaks(ruleset, target=None):
    """cgsim's own strategy failing in a worker (a bug in cgsim)."""
    return fake_strategy(ruleset, target).map(lambda s: s if len(s.steps) < 4 else 1 / 0)


@pytest.mark.parametrize("bug, strategy, words", [
    ("env-error", fake_strategy, "TargetEnvironmentError: DataError: Couldn't use data file"),
    ("big", _strategy_that_breaks, "ZeroDivisionError"),
])
def test_a_failure_of_cgsims_own_machinery_in_a_worker_is_exit_2_never_a_finding(tmp_path, capsys, bug, strategy,
                                                                                 words):
    from fuzz.campaign import run_campaign

    result = run_campaign(options(tmp_path, max_examples=200), pipeline=FakePipeline(bug), strategy=strategy)
    assert result.exit_code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: worker 0 failed: ") and words in err, err
    assert not any(words.split(":")[0] in f["message"] for f in result.summary["findings"])
    assert result.summary["complete"] is False and result.summary["interrupted"] == "worker failed"
    assert result.summary["workers"][0]["restarts"] == 0  # not restarted into the same failure
    assert os.path.exists(os.path.join(result.run_dir, ".work", "worker-0.err"))


def test_target_that_corrupts_its_state_is_a_finding(tmp_path):
    result = run(tmp_path, bug="corrupt", max_examples=60)
    assert result.exit_code == 1
    (f,) = result.summary["findings"]
    assert f["property"] == "NO-CRASH" and "corrupted its state" in f["message"] and "no graphs" in f["message"]
    assert f["status"] == "shrunk"


@pytest.mark.slow
def test_hanging_target_is_a_finding_with_a_timeout(tmp_path):
    result = run(tmp_path, bug="hang", max_examples=30, timeout_s=0.3)
    assert result.exit_code == 1
    hangs = [f for f in result.summary["findings"] if f["property"] == "NO-HANG"]
    assert hangs and hangs[0]["kind"] == "hang" and hangs[0]["status"] == "unshrunk"
    assert result.summary["scenarios"] > 1
    # the interrupted target may have left state behind: the worker restarted
    assert result.summary["workers"][0]["restarts"] >= 1


@pytest.mark.slow
def test_hard_hang_is_killed_by_the_watchdog_and_the_worker_restarts(tmp_path):
    result = run(tmp_path, bug="hard-hang", max_examples=20, timeout_s=0.3)
    hangs = [f for f in result.summary["findings"] if f["property"] == "NO-HANG"]
    assert hangs, result.summary
    assert hangs[0]["scenario"]["steps"]  # the scenario it hung on was kept
    assert result.summary["workers"][0]["restarts"] >= 1


@pytest.mark.slow
def test_worker_killed_by_a_segfault_becomes_a_finding(tmp_path):
    result = run(tmp_path, bug="segv", max_examples=20)
    crashes = [f for f in result.summary["findings"] if f["property"] == "NO-CRASH"]
    assert crashes and "SIGSEGV" in crashes[0]["message"]
    assert os.path.exists(at(result, crashes[0]["repro_path"]))
    assert result.summary["workers"][0]["restarts"] >= 1


def test_two_workers_merge_into_one_report(tmp_path):
    result = run(tmp_path, bug="big", workers=2, max_examples=80)
    assert result.exit_code == 1
    assert [f["property"] for f in result.summary["findings"]] == ["FAKE-BIG"]
    assert len(result.summary["workers"]) == 2
    assert all(w["scenarios"] > 0 for w in result.summary["workers"])


@pytest.mark.slow
def test_gpus_give_each_worker_its_own_device(tmp_path, monkeypatch):
    # One worker per listed GPU, spawned, CUDA_VISIBLE_DEVICES set per worker.
    import fuzz.campaign.options as options_mod

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(options_mod, "_nvidia_smi_gpus", lambda: [str(i) for i in range(8)])
    result = run(tmp_path, bug="gpu-env", gpus="3,5", one_per_gpu=True, max_examples=10)
    assert sorted(f["property"] for f in result.summary["findings"]) == ["FAKE-GPU-3", "FAKE-GPU-5"]
    assert [w["gpu"] for w in result.summary["workers"]] == ["3", "5"]
    assert result.summary["settings"]["workers"] == 2


def test_two_campaigns_share_a_report_dir(tmp_path):
    a = run(tmp_path, bug="big", max_examples=30)
    b = run(tmp_path, bug="big", max_examples=30)
    assert a.run_dir != b.run_dir
    for r in (a, b):
        assert json.load(open(os.path.join(r.run_dir, "summary.json")))["run_id"] == os.path.basename(r.run_dir)
    reports = str(tmp_path / "reports")
    assert open(os.path.join(reports, "LATEST")).read().strip() == os.path.basename(b.run_dir)
    assert os.path.realpath(os.path.join(reports, "latest")) == os.path.realpath(b.run_dir)


@pytest.mark.slow
def test_concurrent_campaigns_in_one_report_dir(tmp_path):
    procs = [_spawn_campaign(tmp_path, bug="big", budget=600.0, seed=s, extra=", max_examples=40") for s in (1, 2)]
    for p in procs:
        assert p.wait(timeout=60) == 1, p.stderr.read()
    runs = [d for d in os.listdir(tmp_path / "reports") if not d.startswith(".") and d not in ("latest", "LATEST")]
    assert len(runs) == 2
    for d in runs:
        summary = json.load(open(tmp_path / "reports" / d / "summary.json"))
        assert summary["complete"] and summary["findings"]


def _spawn_campaign(tmp_path, bug, budget, seed=1, workers=1, extra=""):
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from tests.fuzz.campaign.test_campaign import FakePipeline, fake_strategy
        from fuzz.campaign import CampaignOptions, run_campaign
        opts = CampaignOptions(target="reference", budget_s={budget}, workers={workers}, seed={seed},
                               report_dir={str(tmp_path / 'reports')!r}, quiet=True, timeout_s=5.0, shrink_grace_s=5.0{extra})
        sys.exit(run_campaign(opts, pipeline=FakePipeline({bug!r}), strategy=fake_strategy).exit_code)
        """
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_findings(tmp_path, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        for d in (tmp_path / "reports").glob("*/findings"):
            found = scan_findings(str(d))
            if found:
                return d.parent, found
        time.sleep(0.05)
    raise AssertionError("no finding appeared")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_leaves_a_valid_partial_report(tmp_path, sig):
    p = _spawn_campaign(tmp_path, bug="two", budget=60.0, workers=2)
    run_dir, found = _wait_for_findings(tmp_path)
    time.sleep(0.3)
    p.send_signal(sig)
    code = p.wait(timeout=30)
    assert code == 1, p.stderr.read()
    summary = json.load(open(run_dir / "summary.json"))
    assert summary["complete"] is False
    assert summary["interrupted"] == signal.Signals(sig).name
    on_disk = {f.id for f in scan_findings(str(run_dir / "findings"))}
    listed = {f["id"] for f in summary["findings"]} | {d for f in summary["findings"] for d in f["duplicates"]}
    assert on_disk == listed and on_disk
    assert (run_dir / "junit.xml").exists() and (run_dir / "index.md").exists()


def test_time_to_find_counts_the_earlier_incarnations_of_a_restarted_worker(tmp_path):
    """A restarted worker's first sighting counts from the worker's first
    start: what its slot's earlier incarnations fuzzed comes with the spec."""
    from fuzz.campaign import CampaignOptions
    from fuzz.campaign.executor import Slot
    from fuzz.campaign.worker import Worker, WorkerSpec

    slot = Slot(index=0, gpu=None, share=None, incarnation=2)
    slot.stats = {0: {"scenarios": 40, "fuzz_s": 3.0, "fuzz_cpu_s": 2.5},
                  1: {"scenarios": 10, "fuzz_s": 1.0, "fuzz_cpu_s": 0.5},
                  2: {"scenarios": 7, "fuzz_s": 9.0, "fuzz_cpu_s": 9.0}}  # the running one
    assert slot.fuzzed_before() == (4.0, 3.0, 50)
    spec = WorkerSpec(options=CampaignOptions(), index=0, incarnation=2, run_id="r", run_dir=str(tmp_path),
                      parent_pid=os.getpid(), deadline=time.time() + 60, max_examples=None,
                      fuzzed_before=slot.fuzzed_before())
    worker = Worker(spec, queue=None, stop_event=None, heartbeat=None)
    worker.scenarios = 5
    seen = worker._first_seen("FAKE-BIG")
    assert seen["first_seen_scenarios"] == 55 and seen["first_seen_cpu_s"] >= 3.0 and seen["first_seen_s"] >= 4.0


def test_an_orphaned_worker_never_writes_or_removes_a_finding(tmp_path):
    from cgsim.finding import Finding
    from cgsim.report.findings import FindingStore
    from cgsim.scenario import Scenario
    from fuzz.campaign import CampaignOptions
    from fuzz.campaign.worker import Abort, Worker, WorkerSpec

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a campaign pid that no longer exists
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    (run_dir / ".work").mkdir()
    spec = WorkerSpec(options=CampaignOptions(), index=0, incarnation=0, run_id="r", run_dir=str(run_dir),
                      parent_pid=dead.pid, deadline=time.time() + 60, max_examples=None)
    worker = Worker(spec, queue=None, stop_event=None, heartbeat=None)
    assert worker.orphaned()
    from cgsim.config import ManagerConfig
    from cgsim.descriptors import Batch
    from cgsim.scenario import Step

    scenario = Scenario(ManagerConfig(capture_sizes=(4,)), (Step.capture(), Step.dispatch(Batch((3,)))))
    seen = Finding(property="FAKE-BIG", message="x", target="reference", backend="mock",
                   scenario=scenario.to_json(), status="shrinking", run_id="r", worker=0, extra={"incarnation": 0})
    # A file the last report lists, written by this worker while it was live.
    FindingStore(str(run_dir / "findings")).put(seen)
    with pytest.raises(Abort):
        worker._record(seen.with_(message="rewritten"), "shrink-interrupted")
    worker._remove_own(seen.id)
    (kept,) = scan_findings(str(run_dir / "findings"))
    assert kept.id == seen.id and kept.message == "x" and kept.status == "shrinking"
    assert Scenario.from_json(kept.scenario) == scenario


def test_real_pipeline_finds_a_mutant(tmp_path):
    pytest.importorskip("fuzz.strategies")
    from cgsim.targets.mutants import MUTANTS  # noqa: F401

    from fuzz.campaign import CampaignOptions, run_campaign

    assert "missing-warmup" in MUTANTS
    result = run_campaign(
        CampaignOptions(target="mutant:missing-warmup", budget_s=60.0, max_examples=10, report_dir=str(tmp_path / "r"), quiet=True, seed=0)
    )
    assert result.exit_code == 1, result.summary
    f = next(f for f in result.summary["findings"] if f["property"] == "WARMUP-FIRST")
    from cgsim.replay import reproduce

    assert reproduce(load_finding(at(result, f["path"]))).reproduced


def _one_config_strategy(ruleset, target=None):
    """One config through three lifecycles (one to three dispatches), any batches."""
    from hypothesis import strategies as st

    from cgsim.config import ManagerConfig
    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario, Step

    batch = st.builds(Batch, st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple))
    return st.lists(batch, min_size=1, max_size=3).map(lambda batches: Scenario(
        ManagerConfig(capture_sizes=(4, 8)), (Step.capture(),) + tuple(Step.dispatch(b) for b in batches),
        ruleset=ruleset or "pr48822"))


@pytest.mark.slow
def test_a_worker_runs_each_config_and_lifecycle_once_until_nothing_new_is_drawn(tmp_path):
    """Scenarios that differ only in their batches are one run to the
    dispatch sweep: a worker rejects the repeats (counted in the report's
    coverage), so its time goes to configs it has not run.  Once a whole
    chunk draws nothing new, it runs repeats again rather than nothing, and
    says no more about it than that it ran them."""
    from cgsim.config import ManagerConfig
    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario, Step
    from fuzz.campaign import CampaignOptions, run_campaign
    from fuzz.campaign.search import DECODE_SEARCH
    from fuzz.campaign.worker import Worker, WorkerSpec

    def scenario(*lens):
        return Scenario(ManagerConfig(capture_sizes=(4, 8)), (Step.capture(), Step.dispatch(Batch(lens))),
                        ruleset="pr48822")

    assert DECODE_SEARCH.repeat_key(scenario(1, 2)) == DECODE_SEARCH.repeat_key(scenario(3))
    spec = WorkerSpec(options=CampaignOptions(), index=0, incarnation=0, run_id="r", run_dir=str(tmp_path / "w"),
                      parent_pid=os.getppid(), deadline=time.time() + 60, max_examples=None)
    worker = Worker(spec, None, None, None)
    assert not worker._repeat(scenario(1, 2)) and worker._repeat(scenario(3))
    worker.repeats = True
    assert not worker._repeat(scenario(3))

    few = run_campaign(options(tmp_path, max_examples=3), pipeline=FakePipeline("none"),
                       strategy=_one_config_strategy)
    assert few.summary["scenarios"] == 3 and few.summary["coverage"]["repeats"]["rejected"] > 0
    more = run_campaign(options(tmp_path, max_examples=40), pipeline=FakePipeline("none"),
                        strategy=_one_config_strategy)
    assert more.summary["scenarios"] == 40 and not more.summary["notes"], more.summary["notes"]


def test_a_targets_evidence_hook_that_raises_still_writes_the_final_finding(tmp_path, monkeypatch):
    """The engine's scheduler asked about a finding's claim (the optional
    ``evidence`` hook) may itself fail, e.g. on a tree whose scheduler has a
    bug: the finding is written final all the same, saying why it has none."""
    def evidence(finding):
        raise RuntimeError("the scheduler exploded")

    monkeypatch.setattr(ReferenceTarget, "triage", Triage(evidence=evidence))
    result = run(tmp_path, bug="big", max_examples=60)
    assert result.exit_code == 1
    (f,) = result.summary["findings"]
    assert f["status"] == "shrunk"
    assert f["scheduler_evidence"] == {"error": "RuntimeError: the scheduler exploded"}
