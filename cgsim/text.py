"""The first line of an error or a message: what a one-line error, a
finding's summary line or a note shows."""

from __future__ import annotations

import difflib
import re
from typing import Iterable

__all__ = ["first_line", "did_you_mean", "reason_class"]


def first_line(value: object, limit: int | None = None) -> str:
    """The first non-empty line of ``str(value)`` (an exception's type name if
    it says nothing), cut to ``limit`` characters."""
    lines = [line for line in str(value).strip().splitlines() if line.strip()]
    text = lines[0].strip() if lines else (type(value).__name__ if isinstance(value, BaseException) else "")
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def reason_class(reason: str) -> str:
    """A refusal's reason without its numbers: one count per kind of reason."""
    return re.sub(r"\b\d+\b", "N", first_line(reason, 160))


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """" (did you mean 'reference'?)" for the choice closest to a mistyped
    ``name``, or "" when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
