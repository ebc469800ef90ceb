"""Hypothesis strategies for encoder scenarios: configs as users set the
encoder graphs (budgets, items per graph, frames per batch, the cap), the
model's budget range, and lifecycles of capture, encoder batches and clears
(images and videos whose tokens span the budgets).

``judge_encoder`` runs one scenario against an encoder target on a backend
and judges it with every encoder property: what tests/cgsim/encoder/test_encoder.py and
benchmarks/bench_encoder_mutants.py do with each drawn scenario; a campaign
draws through ``cgsim.encoder.search``."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from cgsim.backends import get_backend
from cgsim.encoder.runner import run_encoder_scenario
from cgsim.encoder.targets import encoder_builder
from cgsim.encoder.values import EncoderConfig, EncoderItem, EncoderScenario, EncoderStep
from cgsim.properties.encoder import check_encoder_scenario
from cgsim.properties.registry import Verdict

__all__ = ["encoder_configs", "encoder_items", "encoder_scenarios", "judge_encoder"]


@st.composite
def encoder_configs(draw, video: bool | None = None, cap: bool = True) -> EncoderConfig:
    """``cap``: whether the engine has a setting for the largest generated budget (vLLM 0.34+)."""
    min_budget = draw(st.sampled_from((4, 8, 16, 24)))
    max_tokens = draw(st.integers(min_budget, 320))
    budgets = ()
    if draw(st.booleans()):
        budgets = tuple(sorted(draw(st.lists(st.integers(1, max_tokens), min_size=1, max_size=4))))
    items = draw(st.sampled_from((0, 0, 1, 2, 3, 4, 8)))
    frames = draw(st.sampled_from((None, None, 1, 2, 4, 8, 16)))
    cap = draw(st.sampled_from((None, None, 32, 64, 128))) if cap else None
    tp = draw(st.sampled_from((1, 1, 2, 4)))
    return EncoderConfig(token_budgets=budgets, max_vision_items=items, max_frames_per_batch=frames,
                         max_token_budget=cap, max_num_batched_tokens=max_tokens, min_budget=min_budget,
                         max_frames_per_video=draw(st.sampled_from((1, 2, 4))),
                         video=draw(st.booleans()) if video is None else video, tp_size=tp,
                         dp_encoder=tp > 1 and draw(st.booleans()))


@st.composite
def encoder_items(draw, config: EncoderConfig, video: bool) -> EncoderItem:
    if video:
        frames = draw(st.integers(1, config.max_frames_per_video))
        return EncoderItem(frames, 2 * draw(st.integers(1, 3)), 2 * draw(st.integers(1, 3)), video=True)
    return EncoderItem(1, 2 * draw(st.integers(1, 8)), 2 * draw(st.integers(1, 6)))


@st.composite
def encoder_scenarios(draw, ruleset: str = "encoder", config: EncoderConfig | None = None,
                      cap: bool = True) -> EncoderScenario:
    config = config if config is not None else draw(encoder_configs(cap=cap))
    steps = [EncoderStep("capture")]
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 5)) == 0:
            steps.append(EncoderStep("clear" if steps[-1].kind != "clear" else "capture"))
        else:
            # One modality per batch, as the engine's runner groups them.
            video = config.video and draw(st.integers(0, 3)) == 0
            steps.append(EncoderStep("encode", tuple(draw(st.lists(encoder_items(config, video), min_size=1,
                                                                   max_size=5)))))
    return EncoderScenario(config, tuple(steps), ruleset, draw(st.integers(0, 3)))


def judge_encoder(target: str, scenario: EncoderScenario, backend: Any = None) -> Verdict:
    """Run ``scenario`` against the encoder ``target`` (``encoder-reference``,
    ``encoder-mutant:NAME``, ...) on ``backend`` (default: the mock) and judge
    the trace with every encoder property."""
    backend = get_backend("mock") if backend is None else backend
    return check_encoder_scenario(scenario, run_encoder_scenario(scenario, encoder_builder(target, scenario, backend)))
