"""Mutants of the reference encoder manager: one bug class each, each
with the property that must catch it and a scenario that shows it
(``tests/cgsim/encoder/test_encoder.py`` checks both, and that Hypothesis finds them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from cgsim.encoder.reference import ReferenceEncoderManager
from cgsim.encoder.values import EncoderConfig, EncoderItem, EncoderScenario, EncoderStep

__all__ = ["EncoderMutant", "ENCODER_MUTANTS"]


@dataclass(frozen=True)
class EncoderMutant:
    name: str
    cls: type
    caught_by: str
    example: Callable[[], EncoderScenario]
    bug_class: str


def _sc(*batches: tuple[EncoderItem, ...], clear: bool = False, **config: Any) -> EncoderScenario:
    steps = [EncoderStep("capture")] + [EncoderStep("encode", b) for b in batches]
    if clear:
        steps += [EncoderStep("clear"), EncoderStep("encode", batches[-1])]
    return EncoderScenario(EncoderConfig(**config), tuple(steps))


def _img(h: int = 4, w: int = 4) -> EncoderItem:
    return EncoderItem(1, h, w)


class BudgetDropsLargest(ReferenceEncoderManager):
    """The doubling loop stops below the model's largest budget and never adds it."""

    @staticmethod
    def _doubling(lo: int, hi: int) -> list[int]:
        out, b = [], lo
        while b <= hi:
            out.append(b)
            b *= 2
        return out


class CaptureSkipsSmallest(ReferenceEncoderManager):
    """The capture loop stops before the smallest budget."""

    def capture(self, graph_pool: Any) -> None:
        self.graph_pool = graph_pool
        for budget in sorted(self.token_budgets, reverse=True)[:-1]:
            self._capture_one(budget)


class FitStrict(ReferenceEncoderManager):
    """A batch exactly the size of a budget is sent to the next one."""

    def _budget_for(self, tokens: int, items: int, frames: int) -> int | None:
        if items > self.max_batch_size or frames > self._frame_slots():
            return None
        return next((b for b in sorted(self.graphs) if tokens < b), None)


class IgnoresItemLimit(ReferenceEncoderManager):
    """More items than a graph has slots for are replayed on it."""

    def _budget_for(self, tokens: int, items: int, frames: int) -> int | None:
        return super()._budget_for(tokens, min(items, self.max_batch_size), frames)


class IgnoresPaddingLogic(ReferenceEncoderManager):
    """The model's padding logics are ignored: every buffer is zero-padded."""

    def _fill(self, key: str, buf: torch.Tensor, src: torch.Tensor) -> None:
        buf.zero_()
        buf[: src.shape[0]].copy_(src)


class StaleTail(ReferenceEncoderManager):
    """Replay copies the new rows without resetting the rest of the buffer."""

    def _fill(self, key: str, buf: torch.Tensor, src: torch.Tensor) -> None:
        buf[: src.shape[0]].copy_(src)


class NoClone(ReferenceEncoderManager):
    """Outputs are views of the graph's output buffer, which the next replay overwrites."""

    def execute(self, mm_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        specs = self.model.get_encoder_cudagraph_item_specs(mm_kwargs)
        tokens = [s.output_tokens for s in specs]
        order = list(range(len(specs)))
        batch = self.model.select_encoder_cudagraph_items(mm_kwargs, order)
        budget = self._budget_for(sum(tokens), len(specs), sum(self.model.encoder_item_frames(mm_kwargs)))
        out = self.model.encoder_eager_forward(batch) if budget is None else self._replay(budget, batch)
        dest: dict[int, torch.Tensor] = {}
        self.model.postprocess_encoder_output({"default": out}, order, tokens, dest, clone=False,
                                              batch_mm_kwargs=batch)
        return [dest[i] for i in order]


class ClearKeepsPool(ReferenceEncoderManager):
    """clear() drops the graphs but keeps the pool, so the manager still says it is captured."""

    def clear(self) -> None:
        self.graphs.clear()


ENCODER_MUTANTS = {m.name: m for m in (
    EncoderMutant("budget-drops-largest", BudgetDropsLargest, "ENC-PLAN",
                  lambda: _sc((_img(),), max_num_batched_tokens=100), "budget plan"),
    EncoderMutant("capture-skips-smallest", CaptureSkipsSmallest, "ENC-CAPTURED",
                  lambda: _sc((_img(),)), "capture loop"),
    EncoderMutant("fit-strict", FitStrict, "ENC-MINIMAL",
                  lambda: _sc((_img(8, 8),)), "budget choice"),
    EncoderMutant("ignores-item-limit", IgnoresItemLimit, "ENC-FIT",
                  lambda: _sc((_img(2, 2), _img(2, 2), _img(2, 2)), (_img(2, 2),), token_budgets=(16, 32),
                              max_vision_items=2),
                  "item limit"),
    EncoderMutant("ignores-padding-logic", IgnoresPaddingLogic, "ENC-EQUAL",
                  lambda: _sc((_img(), _img(2, 2))), "padding"),
    EncoderMutant("stale-tail", StaleTail, "ENC-EQUAL",
                  lambda: _sc((_img(6, 4), _img(2, 4)), (_img(2, 2),)), "buffer refill"),
    EncoderMutant("no-clone", NoClone, "ENC-STABLE",
                  lambda: _sc((_img(),), (_img(),)), "output lifetime"),
    EncoderMutant("clear-keeps-pool", ClearKeepsPool, "ENC-UNCAPTURED",
                  lambda: _sc((_img(),), clear=True), "clear"),
)}
