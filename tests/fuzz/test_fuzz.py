"""The fuzz tests: the property suite over generated Scenarios, and the
lifecycle state machine.  No pytest fixtures: the target, backend and ruleset
come from CGSIM_TARGET / CGSIM_BACKEND / CGSIM_RULESET (set by the
--cgsim-* options), so HypoFuzz can drive these tests directly."""

import json
from types import SimpleNamespace

import pytest
from hypothesis import event, given, settings

from cgsim.properties import check_scenario
from cgsim.runner import run_scenario
from cgsim.targets.base import Drawing
from fuzz.machine import LifecycleMachine, settings_backend, settings_ruleset, settings_target
from fuzz.strategies import scenarios


def _check(scenario):
    event(f"mode={scenario.config.mode.value}")
    event(f"ruleset={scenario.ruleset}")
    for b in scenario.batches:
        event(f"batch={b.kind}")
    trace = run_scenario(scenario, settings_target(), settings_backend(), timeout=600)
    verdict = check_scenario(scenario, trace)
    for pid in verdict.checked:
        event(f"checked={pid}")
    assert verdict.ok, scenario.dumps() + "\n" + "\n".join(f"{v.property}: {v.message}" for v in verdict.violations)


def _derandomized_draws(strategy, n):
    """The first ``n`` values Hypothesis generates from ``strategy``, the same every run."""
    from hypothesis import Phase

    drawn = []

    @settings(max_examples=n, database=None, phases=(Phase.generate,), deadline=None, derandomize=True)
    @given(strategy)
    def draw(value):
        drawn.append(value)

    draw()
    return drawn


@given(scenarios(ruleset=settings_ruleset() or "pr48822", max_size=64))
def test_properties_hold_pr48822(scenario):
    _check(scenario)


@given(scenarios(ruleset=settings_ruleset() or "vllm-0.32", max_size=64))
def test_properties_hold_vllm_0_32(scenario):
    _check(scenario)


TestLifecycle = LifecycleMachine.TestCase
TestLifecycle.settings = settings(settings(), stateful_step_count=6, max_examples=max(10, settings().max_examples // 5))


def test_spec_schedules_run_past_max_num_seqs_as_users_write_them():
    """A schedule is written for batch sizes, not for one engine's
    max_num_seqs: the strategy draws tiers that end at it and tiers past it,
    and each is a config cgsim accepts."""
    from hypothesis import find

    from cgsim.config import ManagerConfig
    from fuzz.strategies import spec_schedules

    within = find(spec_schedules(3, 8), lambda s: s[-1][1] == 8)
    beyond = find(spec_schedules(3, 8), lambda s: s[-1][0] > 8)  # a tier no batch of this engine reaches
    for schedule in (within, beyond):
        ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=8, decode_query_len=4,
                      spec_schedule=schedule)


def test_spec_schedules_halve_and_reach_past_a_one_request_engine():
    """Halved schedules (K, K/2, ...) never schedule K - 1 tokens for K > 2,
    the tier that stops vLLM 0.25-0.31's Eagle/MTP engines at start-up (#3),
    so what else a schedule shows gets seen; and an engine of one request still
    gets the tiers past it that users write (#5 needs one)."""
    from hypothesis import find

    from fuzz.strategies import spec_schedules

    halved = find(spec_schedules(4, 8), lambda s: [k for _, _, k in s[:3]] == [4, 2, 1])
    assert all(k != 3 for _, _, k in halved)
    beyond = find(spec_schedules(3, 1), lambda s: len(s) == 2)
    assert beyond[0] == (1, 1, 3) and beyond[1][0] == 2 and beyond[1][2] < 3


@pytest.mark.slow
def test_speculative_configs_capture_past_their_request_limit_as_often_as_a_draft_needs():
    """vLLM 0.25-0.31's draft decode manager survives a dynamic schedule only
    where every capture size lies past max_num_seqs plus a decode (#3 crashes
    the others while they capture), and only there do #1 and #6 show on those
    releases.  A quarter of the speculative tiny configs are drawn so: every
    size past max_num_reqs + q, and a size within a decode of every request
    (a FULL decode graph).  Drawn only by chance, under a fifth of the
    dynamic schedules were such engines."""
    from fuzz.strategies import configs

    # 6000 draws: about 850 distinct dynamic schedules, so the share is
    # within a few points of its mean (0.34 drawn so, 0.18 by chance alone).
    drawn = _derandomized_draws(configs(max_size=32), 6000)
    dynamic = {c for c in drawn if c.spec_schedule is not None}  # distinct: Hypothesis repeats some
    past = [c for c in dynamic if min(c.capture_sizes) > c.max_num_reqs + c.decode_query_len - 1
            and min(c.capture_sizes) <= c.max_num_reqs * c.decode_query_len]
    assert len(dynamic) > 500 and len(past) > 0.25 * len(dynamic), (len(past), len(dynamic))


@pytest.mark.slow
def test_surviving_dynamic_sd_configs_start_on_releases_whose_draft_decode_manager_takes_the_targets_lengths():
    """vLLM 0.25-0.31 give the draft decode manager (decode_query_len 1) the
    target's tiers as lengths k + 1 - K and round every capture size up to
    each (#3): a zero length divides by zero, and a negative one whose
    rounded size is within max_num_reqs tokens becomes a graph of negative
    size.  Every draw of the family survives that rounding, has FULL decode
    graphs of two lengths that round some size apart, and is about one tiny
    config in sixteen."""
    from fuzz.strategies import configs, surviving_dynamic_sd_configs

    def round_up(n, m):  # vLLM's round_up, with the draft's non-positive lengths
        return (n + m - 1) // m * m

    family = _derandomized_draws(surviving_dynamic_sd_configs(max_size=64), 400)
    apart = 0
    for c in family:
        big_k = c.decode_query_len - 1
        assert c.mode.value in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE") and c.num_ubatches == 1, c
        assert c.attention_support.name in ("ALWAYS", "UNIFORM_BATCH") and max(c.capture_sizes) <= 64, c
        for _, _, k in c.spec_schedule:
            draft_len = k + 1 - big_k
            assert draft_len != 0, c.spec_schedule
            if draft_len < 0:
                assert all(round_up(s, draft_len) > c.max_num_reqs for s in c.capture_sizes), c
        lengths = {k + 1 for start, _, k in c.spec_schedule if start <= c.max_num_reqs and k >= 1}
        assert len(lengths) >= 2, c.spec_schedule
        graphs = {(n, s) for s in c.capture_sizes for n in lengths
                  if round_up(s, n) <= max(c.capture_sizes) and round_up(s, n) // n <= c.max_num_reqs}
        apart += any(round_up(s, a) != round_up(s, b) for a, s in graphs for b, t in graphs if s == t and a != b)
    assert apart > 0.5 * len(family), (apart, len(family))

    drawn = _derandomized_draws(configs(max_size=64), 4000)
    # The family's K - 1 is never a tier and its sizes start past max_num_reqs + K.
    share = sum(c.spec_schedule is not None and c.decode_query_len >= 4 and c.num_ubatches == 1
                and min(c.capture_sizes) > c.max_num_reqs + c.decode_query_len - 1
                and max(c.capture_sizes) == c.max_num_reqs * c.decode_query_len
                and all(k != c.decode_query_len - 2 for _, _, k in c.spec_schedule) for c in drawn) / len(drawn)
    assert 1 / 32 < share < 1 / 8, share


def test_scenarios_draw_only_configs_the_target_can_be_given(monkeypatch):
    """With a target's unsupported_reason, no drawn scenario is one the target
    refuses (a refused scenario costs a run and judges nothing), and the
    campaign's default strategy passes the target's own."""
    from hypothesis import HealthCheck, Phase

    from fuzz.campaign import decode_scenarios

    def refusal(config):
        return "no micro-batching here" if config.num_ubatches > 1 else None

    seen = []

    @settings(max_examples=150, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(scenarios(ruleset="vllm-0.32", refusal=refusal))
    def draw(scenario):
        seen.append(scenario.config.num_ubatches)

    draw()
    assert seen and set(seen) == {1}

    class Refusing:
        drawing = Drawing(unsupported_reason=refusal)

    import cgsim.targets as targets

    monkeypatch.setattr(targets, "get_target", lambda name: Refusing())
    strategy = decode_scenarios.default_strategy("vllm-0.32", "refusing")
    seen.clear()
    given(strategy)(settings(max_examples=100, database=None, phases=[Phase.generate],
                             suppress_health_check=list(HealthCheck))(lambda scenario: seen.append(
                                 scenario.config.num_ubatches)))()
    assert seen and set(seen) == {1}


def _served_by(batches_for):
    """A fake target hook: the 'scheduler' schedules ``batches_for(requests)``."""
    from cgsim.scenario import Served

    def serve(config, requests):
        stream = batches_for(config, requests)
        return stream, Served("FakeScheduler", "fake serve", json.dumps(requests.to_json(), sort_keys=True),
                              len(stream))
    return serve


def test_served_scenarios_dispatch_what_the_engines_scheduler_scheduled_and_read_back_from_json(monkeypatch):
    """A target's serve hook: some of the scenarios capture, then dispatch
    exactly the hook's batches in its order; the scenario's JSON keeps their
    origin and reads back equal; traces the engine refuses are not drawn."""
    from hypothesis import HealthCheck, Phase

    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario
    from cgsim.targets import TargetUnsupported
    from fuzz.campaign import decode_scenarios

    def batches_for(config, requests):
        if len(requests.requests) > 6:
            raise TargetUnsupported("too many requests for this engine")
        return tuple(Batch((1,) * n) for n in range(1, min(len(requests.requests), config.max_num_reqs) + 1))

    class Serving:
        drawing = Drawing(serve=_served_by(batches_for))

    import cgsim.targets as targets

    monkeypatch.setattr(targets, "get_target", lambda name: Serving())
    seen = []

    @settings(max_examples=120, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(decode_scenarios.default_strategy("vllm-0.32", "serving"))
    def draw(scenario):
        seen.append(scenario)

    draw()
    served = [s for s in seen if s.served is not None]
    assert served and len(served) < len(seen) / 2, (len(served), len(seen))
    for s in served:
        requests = json.loads(s.served.requests)["requests"]
        assert 1 <= len(requests) <= 6
        assert [st.kind for st in s.steps] == ["capture"] + ["dispatch"] * (len(s.steps) - 1)
        assert list(s.batches) == list(batches_for(s.config, SimpleNamespace(requests=requests)))
        assert Scenario.from_json(json.loads(s.dumps())) == s and "served by FakeScheduler" in s.short()


def test_a_served_scenario_with_a_malformed_origin_is_one_line():
    from cgsim.config import ManagerConfig
    from cgsim.scenario import Scenario, ScenarioError, Step

    data = Scenario(ManagerConfig(capture_sizes=(1, 2)), (Step.capture(),)).to_json()
    data["served"] = {"scheduler": "Scheduler", "launch": "vllm serve"}
    with pytest.raises(ScenarioError, match="lacks the field 'requests'"):
        Scenario.from_json(data)
    data["served"] = "Scheduler"
    with pytest.raises(ScenarioError, match="'served' must be an object"):
        Scenario.from_json(data)
