"""Per-scenario deadlines: SIGALRM in the main thread raises ScenarioTimeout
inside a hanging target.  Used by the runner (a hang becomes an Error event)
and as the backstop around a whole run (``cgsim.observe``).  No torch
import: the campaign parent uses it too.

Deadlines nest: an inner deadline never switches an outer one off.  One
process timer is armed for the earliest pending deadline; when a deadline
ends, the timer is re-armed for the earliest one still pending, so the
backstop around a run keeps covering it while the runner's own, shorter
timer is active, and fires even if the inner one is longer.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

__all__ = ["ScenarioTimeout", "Deadline", "deadline"]


class ScenarioTimeout(BaseException):
    """Raised inside a hanging target.  A BaseException so neither target code
    nor Hypothesis that catches Exception can swallow it.  ``deadline`` is the
    one that expired (a caller that set its own deadline re-raises others)."""

    def __init__(self, message: str, deadline: "Deadline | None" = None):
        super().__init__(message)
        self.deadline = deadline


@dataclass(eq=False)
class Deadline:
    end: float  # time.monotonic()
    message: str
    fired: bool = field(default=False)

    def owns(self, exc: BaseException) -> bool:
        return isinstance(exc, ScenarioTimeout) and exc.deadline is self


_pending: list[Deadline] = []
_previous_handler = None


def _arm() -> None:
    live = [d for d in _pending if not d.fired]
    if not live:
        signal.setitimer(signal.ITIMER_REAL, 0)
        return
    # A deadline already due fires (almost) at once; 0 would disarm the timer.
    signal.setitimer(signal.ITIMER_REAL, max(1e-4, min(d.end for d in live) - time.monotonic()))


def _expire(signum, frame) -> None:
    live = [d for d in _pending if not d.fired]
    if not live:
        return
    due = min(live, key=lambda d: d.end)
    if due.end - time.monotonic() > 1e-3:  # woken early (re-armed meanwhile): wait on
        _arm()
        return
    due.fired = True
    _arm()
    raise ScenarioTimeout(due.message, due)


@contextmanager
def deadline(seconds: float | None, message: str) -> Iterator[Deadline | None]:
    """Raise ScenarioTimeout(message) in this block after ``seconds``.

    A no-op without a timeout or outside the main thread (a hang in C code
    that never returns to the interpreter needs the worker pool's watchdog
    instead).  Yields the Deadline, whose ``owns(exc)`` tells a caller that
    catches ScenarioTimeout whether it was this deadline that expired.
    """
    if seconds is not None and seconds < 0:
        raise ValueError(f"a deadline of {seconds:g}s is negative; give a positive number of seconds (or none)")
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield None
        return
    d = Deadline(time.monotonic() + seconds, message)
    with _alarm_blocked():
        _push(d)
    try:
        yield d
    finally:
        # An outer deadline may fire in the instant before SIGALRM is blocked
        # (or as it is unblocked): finish the bookkeeping, then let it through.
        late: ScenarioTimeout | None = None
        while d in _pending:
            try:
                with _alarm_blocked():
                    if d in _pending:
                        _pop(d)
            except ScenarioTimeout as exc:
                late = exc
        if late is not None:
            raise late


@contextmanager
def _alarm_blocked() -> Iterator[None]:
    """No SIGALRM while the list of deadlines changes: an outer deadline that
    expires here fires once the bookkeeping is done, never half-way through
    it (which would leave a finished deadline pending, or none armed)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _push(d: Deadline) -> None:
    global _previous_handler
    if not _pending:
        _previous_handler = signal.signal(signal.SIGALRM, _expire)
    _pending.append(d)
    _arm()


def _pop(d: Deadline) -> None:
    global _previous_handler
    _pending.remove(d)
    if _pending:
        _arm()
    else:
        signal.setitimer(signal.ITIMER_REAL, 0)
        # A timer that went off while blocked would, once unblocked, reach the
        # restored handler (SIG_DFL ends the process): take it now.
        if signal.SIGALRM in signal.sigpending():
            signal.sigtimedwait({signal.SIGALRM}, 0)
        signal.signal(signal.SIGALRM, _previous_handler if _previous_handler is not None else signal.SIG_DFL)
        _previous_handler = None
