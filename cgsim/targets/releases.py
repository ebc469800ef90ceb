"""Release knowledge every engine family shares: how versions order, which
design a release follows, and whether a release lies in a range.

Each engine keeps its own rows (vLLM's ``compat.DESIGNS``, SGLang's, the
documented defects' first and fixed releases); this module is the one
reader of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Design", "version_key", "design_for", "in_range"]


def version_key(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string, missing parts 0; local
    (``+cpu``, ``+12.gabc``) and dev parts ignored: ``0.35.0.dev12+g1`` is 0.35.0."""
    nums = [int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3]]
    major, minor, patch = nums + [0] * (3 - len(nums))
    return major, minor, patch


@dataclass(frozen=True)
class Design:
    """The releases from ``first`` on follow ruleset ``ruleset`` (until the next row)."""

    first: str
    ruleset: str
    code: str  # where in the engine the design shows


def design_for(designs: Sequence[Design], version: str) -> Design | None:
    """The row of ``designs`` (oldest first) that ``version`` follows; None: older than all."""
    key = version_key(version)
    rows = [d for d in designs if version_key(d.first) <= key]
    return rows[-1] if rows else None


def in_range(version: str, first: str, until: str | None) -> bool:
    """``first`` <= ``version`` < ``until`` (None: no end)."""
    v = version_key(version)
    return v >= version_key(first) and (until is None or v < version_key(until))
