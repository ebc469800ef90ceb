"""The one per-scenario timer: SIGALRM in the main thread raises
ScenarioTimeout inside a hanging target.  Used by the runner (a hang becomes an
Error event) and by the campaign's backstop around targets that do not go
through the runner.  No torch import: the campaign parent uses it too."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = ["ScenarioTimeout", "deadline"]


class ScenarioTimeout(BaseException):
    """Raised inside a hanging target.  A BaseException so neither target code
    nor Hypothesis that catches Exception can swallow it."""


@contextmanager
def deadline(seconds: float | None, message: str) -> Iterator[None]:
    """Raise ScenarioTimeout(message) after ``seconds``.  A no-op without a
    timeout or outside the main thread (a hang in C code that never returns to
    the interpreter needs the worker pool's watchdog instead).  Nested timers
    do not stack: the inner one replaces the outer until it ends."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _expire(signum, frame):
        raise ScenarioTimeout(message)

    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
