"""What a worker's scenarios covered, counted per dimension (what each
scenario is, as its family's ``FamilySearch.coverage_of`` says: for decode
scenarios rulesets, modes, capture-size ranges, config features, batch and
step kinds, where the batches came from; and whatever the judge counted for
a run): the report's "coverage" section, summed over workers by
``cgsim.report.summary``."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

__all__ = ["Coverage"]


class Coverage:
    """Counts per dimension: dimension -> key -> scenarios."""

    def __init__(self) -> None:
        self.dims: dict[str, Counter] = {}

    def add(self, dim: str, key: Any) -> None:
        self.dims.setdefault(dim, Counter())[str(key)] += 1

    def count(self, pairs: Any) -> None:
        """(dimension, key) pairs: what a scenario is (``FamilySearch.coverage_of``),
        what its run counted (``Outcome.coverage``)."""
        for dim, key in pairs:
            self.dims.setdefault(dim, Counter())[key] += 1

    def snapshot(self, more: Mapping[str, Counter]) -> dict:
        """Every non-empty dimension, with ``more`` (counted elsewhere), as plain dicts."""
        return {k: dict(v) for k, v in {**self.dims, **more}.items() if v}
