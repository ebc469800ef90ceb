"""What a worker's scenarios covered, counted per dimension (rulesets,
modes, capture-size ranges, config features, batch and step kinds, where
the batches came from, and whatever the judge counted for a run): the
report's "coverage" section, summed over workers by
``cgsim.report.summary``."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

__all__ = ["Coverage", "capture_size_range"]


def capture_size_range(largest: int) -> str:
    for lo, hi in ((1, 8), (9, 64), (65, 512), (513, 2048)):
        if lo <= largest <= hi:
            return f"{lo}-{hi}"
    return ">2048"


class Coverage:
    """Counts per dimension: dimension -> key -> scenarios."""

    def __init__(self) -> None:
        self.dims: dict[str, Counter] = {}

    def add(self, dim: str, key: Any) -> None:
        self.dims.setdefault(dim, Counter())[str(key)] += 1

    def scenario(self, scenario: Any) -> None:
        """What one scenario that ran is: its config's features, its steps."""
        cfg = scenario.config
        self.add("rulesets", scenario.ruleset)
        self.add("modes", cfg.mode.value)
        self.add("capture_size_ranges", capture_size_range(max(cfg.capture_sizes)))
        feats = [name for name, on in (
            ("breakable", cfg.breakable), ("varlen-decode", cfg.varlen_decode), ("spec-schedule", cfg.spec_schedule),
            ("speculative", cfg.decode_query_len > 1), ("lora", len(cfg.lora_cases) > 1),
            ("ubatches", cfg.num_ubatches > 1)) if on]
        for f in feats or ["plain"]:
            self.add("config_features", f)
        for step in scenario.steps:
            if step.batch is not None:
                self.add("batch_kinds", step.batch.kind)
            self.add("step_kinds", step.kind)
        # Where the batches came from: the engine's own scheduler, or cgsim's model of it.
        self.add("batch_sources", scenario.served.scheduler if scenario.served is not None else "model")

    def outcome(self, pairs: Any) -> None:
        """What the run itself counted (``Outcome.coverage``: (dimension, key) pairs)."""
        for dim, key in pairs:
            self.dims.setdefault(dim, Counter())[key] += 1

    def snapshot(self, more: Mapping[str, Counter]) -> dict:
        """Every non-empty dimension, with ``more`` (counted elsewhere), as plain dicts."""
        return {k: dict(v) for k, v in {**self.dims, **more}.items() if v}
