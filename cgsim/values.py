"""One parser per kind of value a user types: durations, counts, shares and
size lists.  Every flag of a kind goes through the same parser, so ``10s``
means ten seconds to ``--timeout`` as it does to ``--budget``, and ``1,,2``
is refused wherever a size list is read.

A parser returns the value or raises ``ValueProblem`` whose text completes
"<flag> '<text>' ...": what is wrong with the value and what to give
instead; the caller names the flag.
"""

from __future__ import annotations

import json
import re

__all__ = ["ValueProblem", "MAX_DURATION_S", "parse_duration", "parse_count", "parse_share", "parse_sizes"]

# Longer than any campaign or scenario is meant to run: past it, a typo is likelier than intent.
MAX_DURATION_S = 7 * 24 * 3600.0

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_HINT = "write e.g. 60s, 5m, 1h30m or 90 (seconds)"
_SIZES_HINT = "write whole numbers with one comma between each, e.g. 1,2,4"


class ValueProblem(ValueError):
    """What is wrong with a value as typed, as the rest of "<flag> '<text>' ..."."""


def parse_duration(text: str, *, zero: bool = False, at_most: float = MAX_DURATION_S) -> float:
    """'60s', '5m', '1h30m', '250ms', '90' or '2.5' (plain seconds) -> seconds.
    ``zero``: 0 is taken too (a flag whose 0 means "none")."""
    raw = str(text).strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        total = float(raw)
    elif raw and re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ms|h|m|s))+", raw):
        total = sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(raw))
    elif re.fullmatch(r"-\s*\d.*", raw):
        raise ValueProblem(f"is negative; give a {'' if zero else 'positive '}duration: {_DURATION_HINT}")
    else:
        raise ValueProblem(f"is not a duration; {_DURATION_HINT}")
    if total <= 0 and not (zero and total == 0):
        raise ValueProblem(f"is not a positive duration; {_DURATION_HINT}")
    if total > at_most:
        raise ValueProblem(f"is longer than {_human(at_most)}; give at most {_human(at_most)}")
    return total


def _human(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def parse_count(text: str, *, least: int = 0, at_most: int | None = None) -> int:
    """A whole number from ``least`` to ``at_most``."""
    raw = str(text).strip()
    if not re.fullmatch(r"[+-]?\d+", raw):
        raise ValueProblem(f"is not a whole number; give e.g. {max(least, 1)}")
    value = int(raw)
    if value < least:
        raise ValueProblem(f"is less than {least}; give {least} or more")
    if at_most is not None and value > at_most:
        raise ValueProblem(f"is more than {at_most}; give at most {at_most}")
    return value


def parse_share(text: str) -> float:
    """A share of a whole: above 0, at most 1 (e.g. 0.25)."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueProblem("is not a number; give a share above 0 and at most 1, e.g. 0.25") from None
    if not 0 < value <= 1:
        raise ValueProblem("is not a share above 0 and at most 1; give e.g. 0.25 (1: all of it)")
    return value


def parse_sizes(text: str, *, least: int = 1) -> tuple[int, ...]:
    """'1,2,4' or a JSON list '[1, 2, 4]' -> (1, 2, 4): every item a whole
    number of at least ``least``; an empty item ('1,,2', '1,') is refused,
    never skipped."""
    raw = str(text).strip()
    if raw.startswith("["):
        try:
            items = json.loads(raw)
        except ValueError:
            raise ValueProblem(f"is not a JSON list; {_SIZES_HINT}, or [1, 2, 4]") from None
        if not isinstance(items, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise ValueProblem(f"is not a list of whole numbers; {_SIZES_HINT}, or [1, 2, 4]")
        parts = [str(i) for i in items]
    else:
        parts = [p.strip() for p in raw.split(",")]
    if not raw or not parts:
        raise ValueProblem(f"is empty; {_SIZES_HINT}")
    out = []
    for n, part in enumerate(parts, 1):
        if not part:
            raise ValueProblem(f"has an empty item (item {n}); {_SIZES_HINT}")
        if not re.fullmatch(r"[+-]?\d+", part):
            raise ValueProblem(f"item {n} ({part!r}) is not a whole number; {_SIZES_HINT}")
        if int(part) < least:
            raise ValueProblem(f"item {n} ({part}) is less than {least}; every item must be {least} or more")
        out.append(int(part))
    return tuple(out)
