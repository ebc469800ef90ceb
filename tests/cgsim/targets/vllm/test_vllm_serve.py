"""Served scenarios: vLLM's own scheduler decides a scenario's batches
(``cgsim.targets.vllm.scheduling.serve``, the vLLM target's ``serve`` hook),
and every batch it schedules is dispatched through the real manager and
judged by the properties.

Needs vLLM (the ``vllm-0.NN`` tox envs); skipped with the reason elsewhere,
unless CGSIM_REQUIRE_VLLM=1 says vLLM must be there.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.descriptors import Batch, BatchShape  # noqa: E402
from cgsim.finding import Finding  # noqa: E402
from cgsim.properties import check_scenario  # noqa: E402
from cgsim.runner import run_scenario  # noqa: E402
from cgsim.scenario import Scenario, Step  # noqa: E402
from cgsim.targets import TargetUnsupported, get_target  # noqa: E402
from cgsim.targets.vllm.compat import require_vllm  # noqa: E402
from cgsim.targets.vllm.known import classify  # noqa: E402
from cgsim.targets.vllm.engine import takes_dynamic_schedule  # noqa: E402
from cgsim.targets.vllm.scheduling import RequestSpec, Workload, run_scheduler  # noqa: E402
from cgsim.targets.vllm.scheduling.serve import MAX_SERVED_STEPS, ModelMiss  # noqa: E402
from cgsim.trace import Dispatch, Replay  # noqa: E402
from fuzz.campaign.decode_scenarios import default_strategy  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

CAPS = require_vllm()
TARGET = get_target("vllm")
# Speculative decoding with three tokens a step, LoRA and a chunked prompt: decodes, mixed and prefill batches.
CONFIG = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3)
TRACE = Workload((RequestSpec(0, 5, 6), RequestSpec(0, 40, 4), RequestSpec(2, 3, 8), RequestSpec(3, 1, 5)),
                 acceptance=0.5, seed=1)


def served(config: ManagerConfig, requests: Workload) -> Scenario:
    built = TARGET.drawing.engine_config(config)
    stream, origin = TARGET.drawing.serve(built, requests)
    return Scenario(built, (Step.capture(), *(Step.dispatch(b) for b in stream)), ruleset=CAPS.ruleset,
                    served=origin)


def test_a_served_scenario_dispatches_every_batch_vllm_scheduled_in_order():
    sc = served(CONFIG, TRACE)
    run = run_scheduler(sc.config, TRACE)
    scheduled = [b.batch() for b in run.batches]
    # A run of identical neighbours is one dispatch step; nothing else is left out or reordered.
    folded = [b for i, b in enumerate(scheduled) if i == 0 or scheduled[i - 1] != b]
    assert list(sc.batches) == folded[:MAX_SERVED_STEPS]
    assert sc.served.scheduler == run.scheduler and sc.served.scheduled == len(run.batches)
    assert sc.served.launch == run.launch and json.loads(sc.served.requests) == TRACE.to_json()
    assert Workload.from_json(json.loads(sc.served.requests)) == TRACE
    assert Scenario.from_json(json.loads(sc.dumps())) == sc
    assert f"served by {run.scheduler}: 4 requests" in sc.short()


def test_every_served_batch_is_dispatched_replayed_and_judged():
    sc = served(CONFIG, TRACE)
    trace = run_scenario(sc, target="vllm", backend="mock", timeout=300)
    assert not trace.unsupported and not trace.errors, (trace.unsupported, trace.errors)
    assert [d.batch for d in trace.of(Dispatch)] == list(sc.batches)
    assert len(trace.of(Replay)) == len(sc.batches)
    found = [Finding.from_violation(v, sc.to_json(), "vllm", "mock") for v in check_scenario(sc, trace).violations]
    # Only the release's documented defects may show on a clean tree.
    assert all(classify(f, CAPS.version) is not None for f in found), [(f.property, f.message) for f in found]


def test_a_trace_vllm_refuses_is_refused_not_served():
    lora_request = Workload((RequestSpec(0, 4, 2, lora=1),))
    with pytest.raises(TargetUnsupported, match="does not enable LoRA"):
        served(CONFIG, lora_request)


def test_a_scheduled_batch_outside_the_model_is_a_bug_of_cgsim_not_a_scenario(monkeypatch):
    # A model whose decodes are never longer than one token per request misses
    # every speculative decode vLLM schedules.
    monkeypatch.setattr(ManagerConfig, "scheduler_longest_decode_len", lambda self, n: 1)
    with pytest.raises(ModelMiss, match=r"scheduled Batch\(.*leaves out .* the request trace that shows it: \{"):
        served(CONFIG, TRACE)
    assert ModelMiss("x").exit_code == 2


def test_the_runner_share_serves_the_launches_it_drew_cheapest_first():
    """Fewer draft steps, then fewer and smaller graphs: a short share serves
    a launch rather than running out inside an expensive first one."""
    from fuzz.campaign.served import draw_served  # noqa: PLC0415

    drawn = draw_served("vllm", CAPS.ruleset, 1, 4)  # drawn in another order
    costs = [(s.config.decode_query_len, len(s.config.capture_sizes), max(s.config.capture_sizes)) for s in drawn]
    assert len(set(costs)) >= 2 and costs == sorted(costs), costs


def test_campaigns_draw_served_scenarios_that_replay_from_their_json():
    """The campaign's strategy serves some scenarios from vLLM's scheduler;
    a served scenario's JSON carries its steps and origin, and reads back the
    same (a repro needs no scheduler)."""
    from hypothesis import Phase

    drawn: list[Scenario] = []

    @settings(max_examples=24, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(default_strategy(CAPS.ruleset, "vllm"))
    def draw(scenario):
        drawn.append(scenario)

    draw()
    served_ones = [s for s in drawn if s.served is not None]
    assert served_ones and len(served_ones) < len(drawn), (len(served_ones), len(drawn))
    for scenario in served_ones:
        assert Scenario.from_json(json.loads(scenario.dumps())) == scenario
        assert scenario.steps[0].kind == "capture" and all(s.kind == "dispatch" for s in scenario.steps[1:])
        assert "vllm serve" in scenario.served.launch


# -- the scheduler's word on a finding's claim ------------------------------------

# docs/findings.md #6's launch: one request drafts a token (length 2), two draft none (length 1).
FINDING_6 = os.path.join(ROOT, "docs", "findings", "capture-useful-a02a072c44.json")
# Two requests verify one draft each, one request none (the shrink of issue #35's question).
SHRINK = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=2, decode_query_len=2,
                       spec_schedule=((1, 1, 0), (2, 2, 1)), attention_support="UNIFORM_BATCH")


def _dynamic_schedules() -> bool:
    """Whether this tree takes a dynamic speculative schedule (else vLLM refuses the launch)."""
    if takes_dynamic_schedule():
        return True
    with pytest.raises(TargetUnsupported):
        TARGET.drawing.engine_config(SHRINK)
    return False


def _findings(sc: Scenario, prop: str) -> list[Finding]:
    trace = run_scenario(sc, target="vllm", backend="mock", timeout=300)
    return [Finding.from_violation(v, sc.to_json(), "vllm", "mock") for v in check_scenario(sc, trace).violations
            if v.property == prop]


def test_a_served_findings_batches_are_the_schedulers():
    sc = served(CONFIG, TRACE)

    def said(shape):
        return TARGET.triage.evidence(Finding("DISPATCH-SOUND", "m", "vllm", "mock", sc.to_json(), step=1,
                                              facts={"batch": shape.to_json()}))

    assert said(sc.batches[0].shape) == {"batches_from": "scheduler", "scheduler": sc.served.scheduler,
                                         "requests": 4, "batch_scheduled": True}
    # A batch of the scenario's sweep is the model's, asked of the scheduler like any other.
    swept = BatchShape(num_reqs=4, num_tokens=8, max_query_len=2, uniform_token_count=2, has_prefill=False)
    assert swept not in {b.shape for b in sc.batches}
    assert said(swept)["batches_from"] == "model"


def test_a_dispatch_findings_batch_is_looked_for_among_the_batches_vllm_schedules():
    built = TARGET.drawing.engine_config(CONFIG)
    sc = Scenario(built, (Step.capture(),), ruleset=CAPS.ruleset)

    def said(batch):
        return TARGET.triage.evidence(Finding("DISPATCH-SOUND", "m", "vllm", "mock", sc.to_json(),
                                              facts={"batch": batch.shape.to_json()}))

    scheduled = said(Batch((3, 3)))  # two requests verifying their two drafts each
    assert scheduled["batches_from"] == "model" and scheduled["batch_scheduled"] is True
    assert scheduled["runs"] == 4 and scheduled["scheduled"] > 100 and "vllm serve" in scheduled["launch"]
    # Static drafts of two: a decode of length 2 only where a request nears max_model_len, never four at once.
    assert said(Batch((2, 2, 2, 2)))["batch_scheduled"] is False


def test_the_scheduler_agrees_that_finding_6s_graph_is_never_used():
    if not _dynamic_schedules():
        return
    documented = Finding.from_json(json.loads(open(FINDING_6).read()))
    sc = Scenario.from_json(documented.scenario)
    useful = _findings(sc, "CAPTURE-USEFUL")
    if not useful:  # fixed in 0.34: vLLM sizes decode graphs by the schedule
        return
    said = TARGET.triage.evidence(useful[0])
    assert said["batches_from"] == "model" and said["graph_used"] is False, said


def test_a_model_narrower_than_vllms_scheduler_is_contradicted_on_the_finding(monkeypatch):
    if not _dynamic_schedules():
        return
    # The model before vLLM's scheduler was run: a decode of n requests is n x the
    # schedule's length for n, so the graph a shrunk batch of one request replays
    # (FULL tokens=2 reqs=1) looks unused; vLLM's scheduler says otherwise.
    monkeypatch.setattr(ManagerConfig, "scheduler_longest_decode_len", ManagerConfig.scheduler_decode_query_len)
    built = TARGET.drawing.engine_config(SHRINK)
    sc = Scenario(built, (Step.capture(),), ruleset=CAPS.ruleset)
    claims = [f for f in _findings(sc, "CAPTURE-USEFUL") if "tokens=2 reqs=1" in f.message]
    assert claims, "the narrow model calls the one-request length-2 graph unused"
    said = TARGET.triage.evidence(claims[0])
    assert said["graph_used"] is True, said


def _documented_claims():
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "findings", "*.json"))):
        data = json.loads(open(path).read())
        if data["property"].startswith("DISPATCH-") or data["property"] == "CAPTURE-USEFUL":
            yield pytest.param(path, id=os.path.basename(path)[:-5])


@pytest.mark.parametrize("path", list(_documented_claims()))
def test_documented_findings_rest_on_what_vllms_scheduler_does(path):
    """docs/findings.md never cries wolf: where a documented dispatch finding
    shows on this tree, vLLM's scheduler schedules its decode batch, and no
    batch it schedules dispatches to a graph documented as never used."""
    documented = Finding.from_json(json.loads(open(path).read()))
    sc = Scenario.from_json(documented.scenario)
    try:
        if TARGET.drawing.unreachable(sc) is not None:
            return
        TARGET.drawing.engine_config(sc.config)
    except TargetUnsupported:
        return  # not reachable on this release (docs/findings.md's matrix says so)
    shown = _findings(sc, documented.property)
    if not shown:
        return  # not in this release
    said = TARGET.triage.evidence(shown[0])
    assert said is not None and said["batches_from"] == "model", said
    if documented.property == "CAPTURE-USEFUL":
        assert said["graph_used"] is False, said
    elif not said["batch_scheduled"]:
        # Only a prefill's exact shape may go unseen in a few runs; a decode batch must be scheduled.
        assert BatchShape(**shown[0].facts["batch"]).has_prefill, said
