"""The encoder graph spec, properties, reference manager and its mutants."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from cgsim.encoder.mutants import ENCODER_MUTANTS
from cgsim.encoder.values import EncoderConfig, EncoderItem, EncoderScenario, EncoderScenarioError, EncoderStep
from cgsim.properties.encoder import ENCODER_PROPERTIES
from cgsim.spec.encoder import EncoderConfigRefused, doubling_grid, plan, subdivided_grid
from cgsim.encoder.strategies import encoder_scenarios, judge_encoder

# Runs a scenario on the mock and judges it; benchmarks/bench_encoder_mutants.py fuzzes with the same pieces.
judge = judge_encoder


def ids(verdict) -> set[str]:
    return {v.property for v in verdict.violations}


def test_grids_follow_the_designs():
    assert doubling_grid(16, 100) == [16, 32, 64, 100]
    assert doubling_grid(16, 64) == [16, 32, 64]
    grid = subdivided_grid(64, 4096, None)
    assert grid[:5] == [64, 80, 96, 112, 128] and 1024 in grid and 1152 in grid and grid[-1] == 4096
    assert subdivided_grid(64, 4096, 512)[-1] == 512 and subdivided_grid(64, 4096, 8)[-1] == 64


def test_plan_follows_the_users_settings_and_the_model():
    auto = plan(EncoderConfig(min_budget=16, max_num_batched_tokens=256, max_frames_per_video=4), "encoder")
    assert auto.budgets == (16, 32, 64, 128, 256) and auto.max_batch_size == 16 and auto.max_frames_per_batch == 64
    user = plan(EncoderConfig(token_budgets=(64, 32), max_vision_items=4), "encoder")
    assert user.budgets == (32, 64) and user.max_batch_size == 4
    items_only = plan(EncoderConfig(min_budget=16, max_vision_items=20, max_num_batched_tokens=100), "encoder")
    assert items_only.budgets == (20, 40, 80, 100) and items_only.max_batch_size == 20
    assert plan(EncoderConfig(video=False), "encoder").max_frames_per_batch == 0
    assert plan(EncoderConfig(max_frames_per_batch=3), "encoder").max_frames_per_batch == 3
    with pytest.raises(EncoderConfigRefused):
        plan(EncoderConfig(token_budgets=(8,), max_vision_items=9), "encoder")


def test_scenarios_round_trip_and_refuse_what_no_engine_sends():
    sc = ENCODER_MUTANTS["stale-tail"].example()
    assert EncoderScenario.from_json(sc.to_json()) == sc
    with pytest.raises(EncoderScenarioError, match="one frame"):
        EncoderItem(2, 2, 2)
    with pytest.raises(EncoderScenarioError, match="longer than"):
        EncoderScenario(EncoderConfig(max_frames_per_video=2),
                        (EncoderStep("capture"), EncoderStep("encode", (EncoderItem(3, 2, 2, True),))))
    with pytest.raises(EncoderScenarioError, match="unknown"):
        EncoderScenario(EncoderConfig(), (EncoderStep("capture"),), ruleset="nope")


@pytest.mark.parametrize("name", sorted(ENCODER_MUTANTS))
def test_each_mutant_is_caught_by_its_property_on_its_example(name):
    mutant = ENCODER_MUTANTS[name]
    sc = mutant.example()
    reference = judge("encoder-reference", sc)
    assert reference.ok, reference.violations
    assert mutant.caught_by in reference.checked
    assert mutant.caught_by in ids(judge(f"encoder-mutant:{name}", sc))


def test_every_encoder_property_is_some_mutants_catch_or_a_crash():
    caught = {m.caught_by for m in ENCODER_MUTANTS.values()}
    # ENC-COMPLETE, -COVER, -ONE-REPLAY and -CAPTURE-ONCE are judged by their own tests below.
    assert set(ENCODER_PROPERTIES) - caught == {"ENC-COMPLETE", "ENC-COVER", "ENC-ONE-REPLAY", "ENC-CAPTURE-ONCE",
                                                "ENC-NO-CRASH"}


def test_a_leak_from_padding_moves_a_real_items_output():
    # Without the model's padding logic the padding rows join frame 0 and item 0.
    sc = ENCODER_MUTANTS["ignores-padding-logic"].example()
    verdict = judge("encoder-mutant:ignores-padding-logic", sc)
    assert [v.facts for v in verdict.violations if v.property == "ENC-EQUAL"][0] == (("item", 0),)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate])
@given(encoder_scenarios())
def test_the_reference_manager_satisfies_every_encoder_property(sc):
    verdict = judge("encoder-reference", sc)
    assert verdict.ok, (sc.short(), [str(v) for v in verdict.violations])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENCODER_MUTANTS))
def test_hypothesis_finds_each_mutant(name):
    mutant = ENCODER_MUTANTS[name]
    found = []

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              phases=[Phase.generate], derandomize=True)
    @given(encoder_scenarios())
    def search(sc):
        if mutant.caught_by in ids(judge(f"encoder-mutant:{name}", sc)):
            found.append(sc)
            raise AssertionError("found")

    with pytest.raises(AssertionError, match="found"):
        search()
    assert found


def test_the_fake_tensor_parallel_group_gathers_in_rank_order_and_a_failing_rank_ends_the_wait():
    import threading

    import torch

    from cgsim.targets.vllm.encoder_dp import FakeGroup, GroupAborted

    group, out = FakeGroup(3), {}

    def rank(r: int, fail: bool = False) -> None:
        group.set_rank(r)
        with group.turn:
            try:
                if fail:
                    raise RuntimeError("boom")
                out[r] = group.all_gather(torch.full((1, 2), float(r)), dim=0)
            except Exception as exc:  # noqa: BLE001
                out[r] = exc
                group.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert all(torch.equal(out[r][:, 0], torch.tensor([0.0, 1.0, 2.0])) for r in range(3))

    group, out = FakeGroup(2), {}
    threads = [threading.Thread(target=rank, args=(0,)), threading.Thread(target=rank, args=(1, True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads)
    assert isinstance(out[0], GroupAborted) and str(out[1]) == "boom"


def test_an_eager_forward_whose_output_the_manager_scatters_itself_is_still_a_group():
    from cgsim.encoder.runner import groups_from_log

    items = (EncoderItem(1, 2, 4), EncoderItem(1, 4, 4), EncoderItem(1, 2, 2))
    log = [("replay", (0,), 2, 2, "default"), ("output", (0,), 4),
           ("eager", (1, 2), "default"),  # vLLM before 0.27: scatter_output_slices, no post-process call
           ("eager", (0,), "embed_multimodal")]
    groups = groups_from_log(3, log, items)
    assert [(g.ids, g.budget, g.site) for g in groups] == [((0,), 4, "manager"), ((1, 2), None, "manager"),
                                                            ((0,), None, "runner")]
    assert groups[1].rows == items[1].output_tokens + items[2].output_tokens
    # Where the toy post-processes the eager output (0.32+), that output's rows stand, in the eager's place.
    log = [("eager", (1,), "default"), ("replay", (0,), 2, 2, "default"), ("output", (0,), 4), ("output", (1,), 3)]
    assert [(g.ids, g.budget, g.rows) for g in groups_from_log(0, log, items)] == [((1,), None, 3), ((0,), 4, 4)]


class _CountingManager:
    """A manager recording what the handle asked of it (is_captured only where ``asks``)."""

    built = 0

    def __init__(self, asks: bool = True) -> None:
        type(self).built += 1
        self.graph_pool, self.calls = None, []
        if asks:
            self.is_captured = lambda: self.graph_pool is not None

    def capture(self, graph_pool):
        self.graph_pool = graph_pool

    def clear(self):
        self.graph_pool = None

    def supports_modality(self, modality):
        self.calls.append(modality)
        return modality == "image"

    def execute(self, mm_kwargs):
        self.calls.append("execute")
        return ["graph"]


class _Model:
    def get_input_modality(self, mm_kwargs):
        return mm_kwargs["modality"]

    def embed_multimodal(self, **mm_kwargs):
        return ["eager"]


@pytest.mark.parametrize("site", ["asks-captured", "built-at-capture"])
def test_the_handle_calls_the_manager_as_the_engines_runner_does(site):
    from cgsim.backends import get_backend
    from cgsim.encoder.runner import ASKS_CAPTURED, BUILT_AT_CAPTURE, ManagedEncoder

    call_site = {s.name: s for s in (ASKS_CAPTURED, BUILT_AT_CAPTURE)}[site]
    _CountingManager.built = 0
    asks = call_site is ASKS_CAPTURED
    handle = ManagedEncoder(_CountingManager(asks), _Model(), get_backend("mock"), call_site=call_site,
                            rebuild=lambda: _CountingManager(asks))
    image, video = {"modality": "image"}, {"modality": "video"}
    assert handle.encode(image) == ["eager"] and not handle.is_captured()  # nothing captured: the model runs it
    handle.capture()
    assert handle.is_captured() and handle.encode(image) == ["graph"]
    # V1 asks supports_modality: a video the manager does not take runs eagerly; V2 hands every batch over.
    assert handle.encode(video) == (["graph"] if asks else ["eager"])
    handle.clear()
    assert not handle.is_captured() and handle.encode(image) == ["eager"]
    handle.capture()
    assert handle.is_captured() and handle.encode(image) == ["graph"]
    # V1 builds a fresh manager at a capture after a clear (capture_model after profile_cudagraph_memory's).
    assert _CountingManager.built == (1 if asks else 2)
