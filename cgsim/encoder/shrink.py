"""Shrinking an encoder scenario that fails: fewer steps, fewer and smaller
items, the user's settings back to what the manager infers, a smaller
model range, seed 0; kept only while the failure (one property, pinned)
still shows.  Greedy to a fixpoint within a deadline."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator

from cgsim.encoder.values import EncoderConfig, EncoderItem, EncoderScenario, EncoderScenarioError, EncoderStep

__all__ = ["shrink_encoder_scenario", "size"]


def size(sc: EncoderScenario) -> tuple:
    """Smaller is simpler: steps, items, patches, settings set, the model's range, seed."""
    c = sc.config
    items = [i for s in sc.steps for i in s.items]
    settings = (len(c.token_budgets) + (c.max_vision_items > 0) + (c.max_frames_per_batch is not None)
                + (c.max_token_budget is not None) + c.dp_encoder)
    return (len(sc.steps), len(items), sum(i.input_size for i in items), settings, sum(c.token_budgets),
            c.max_num_batched_tokens, c.max_frames_per_video, c.video, sc.seed)


def _configs(c: EncoderConfig) -> Iterator[EncoderConfig]:
    for i in range(len(c.token_budgets)):
        yield dataclasses.replace(c, token_budgets=c.token_budgets[:i] + c.token_budgets[i + 1:])
    for i, b in enumerate(c.token_budgets):
        if b > 1:
            yield dataclasses.replace(c, token_budgets=c.token_budgets[:i] + (b // 2,) + c.token_budgets[i + 1:])
    if c.max_vision_items:
        yield dataclasses.replace(c, max_vision_items=0)
        yield dataclasses.replace(c, max_vision_items=c.max_vision_items - 1)
    if c.max_frames_per_batch is not None:
        yield dataclasses.replace(c, max_frames_per_batch=None)
        if c.max_frames_per_batch > 0:
            yield dataclasses.replace(c, max_frames_per_batch=c.max_frames_per_batch - 1)
    if c.max_token_budget is not None:
        yield dataclasses.replace(c, max_token_budget=None)
    if c.dp_encoder:
        yield dataclasses.replace(c, dp_encoder=False, tp_size=1)
    if c.max_num_batched_tokens > c.min_budget:
        yield dataclasses.replace(c, max_num_batched_tokens=max(c.min_budget, c.max_num_batched_tokens // 2))
        yield dataclasses.replace(c, max_num_batched_tokens=c.max_num_batched_tokens - 1)
    if c.max_frames_per_video > 1:
        yield dataclasses.replace(c, max_frames_per_video=c.max_frames_per_video - 1)
    if c.video:
        yield dataclasses.replace(c, video=False)


def _items(item: EncoderItem) -> Iterator[EncoderItem]:
    if item.frames > 1:
        yield dataclasses.replace(item, frames=item.frames - 1)
    if item.height > 2:
        yield dataclasses.replace(item, height=item.height - 2)
    if item.width > 2:
        yield dataclasses.replace(item, width=item.width - 2)


def _candidates(sc: EncoderScenario) -> Iterator[tuple]:
    """(config, steps, seed) of each simpler scenario; validated when built."""
    steps, c, seed = sc.steps, sc.config, sc.seed
    for i in range(len(steps)):
        yield c, steps[:i] + steps[i + 1:], seed
    for i, step in enumerate(steps):
        for j in range(len(step.items) if len(step.items) > 1 else 0):
            new = EncoderStep("encode", step.items[:j] + step.items[j + 1:])
            yield c, steps[:i] + (new,) + steps[i + 1:], seed
    for config in _configs(c):
        yield config, steps, seed
    for i, step in enumerate(steps):
        for j, item in enumerate(step.items):
            for smaller in _items(item):
                new = EncoderStep("encode", step.items[:j] + (smaller,) + step.items[j + 1:])
                yield c, steps[:i] + (new,) + steps[i + 1:], seed
    if seed:
        yield c, steps, 0


def _valid(sc: EncoderScenario, parts: tuple) -> EncoderScenario | None:
    config, steps, seed = parts
    try:
        return EncoderScenario(config, steps, sc.ruleset, seed)
    except EncoderScenarioError:
        return None


def shrink_encoder_scenario(scenario: EncoderScenario, fails: Callable[[EncoderScenario], bool],
                            deadline: float | None = None) -> tuple[EncoderScenario, bool]:
    """The smallest scenario found that still ``fails``, and whether the
    shrink ran to its end (False: the deadline cut it short)."""
    current = scenario
    while True:
        for parts in _candidates(current):
            if deadline is not None and time.monotonic() >= deadline:
                return current, False
            candidate = _valid(current, parts)
            if candidate is not None and size(candidate) < size(current) and fails(candidate):
                current = candidate
                break
        else:
            return current, True
