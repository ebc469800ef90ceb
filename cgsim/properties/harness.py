"""What the harness sees around a run, as properties of the same registry.

NO-CRASH and NO-HANG judge the ``Error`` events the runner records (a target
that raised, corrupted its state or hung during capture, dispatch, replay or
release); ``cgsim.observe`` reports them too when the run never produced a
trace (the runner itself raised, the backstop timer fired, the worker process
died).  CHECK-CRASH is a bug in cgsim: a property check raised.

A failure while *building* the manager belongs to INIT-TOTAL, an illegal
operation anywhere to NO-ILLEGAL-OP.
"""

from __future__ import annotations

from cgsim.properties.registry import Violation, declare
from cgsim.properties.view import RunView

__all__ = ["NO_CRASH", "NO_HANG", "CHECK_CRASH"]

NO_CRASH, NO_HANG, CHECK_CRASH = "NO-CRASH", "NO-HANG", "CHECK-CRASH"

_WORDS = {"crash": "raised", "corrupt": "corrupted its state"}


@declare(NO_CRASH, "the target does not raise, die or corrupt its state in capture, dispatch, replay or release",
         family="harness", kind="crash", aliases=("TARGET-CRASH", "TARGET-CORRUPT"))
def no_crash(run: RunView) -> list[Violation]:
    return [
        Violation(NO_CRASH, f"target {_WORDS.get(e.error, e.error)} during {e.phase}: {e.exc_type}: {e.message}", e.step,
                  (("raised", f"{e.exc_type}: {e.message}"),))
        for e in run.errors
        if e.error in _WORDS and not run.is_build_error(e)
    ]


# Not shrunk: every attempt would cost a whole timeout.
@declare(NO_HANG, "the target finishes every scenario within the per-scenario timeout", family="harness",
         kind="hang", shrink=False, aliases=("TARGET-HANG",))
def no_hang(run: RunView) -> list[Violation]:
    return [
        Violation(NO_HANG, f"hung during {e.phase} at step {e.step}: {e.message}", e.step)
        for e in run.errors
        if e.error == "timeout"
    ][:1]


declare(CHECK_CRASH, "the property checks run on every trace without raising (a bug in cgsim itself)",
        family="harness", kind="crash", harness_only=True)
