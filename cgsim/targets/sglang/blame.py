"""Whose failure an exception is: sglang's (a finding for the properties to
judge) or cgsim's adapter's (exit 2, never a finding).

An exception is the adapter's when the innermost frame that raised it is in
cgsim (the handle, the fake model runner, the toy model and attention, the
workload) or in a stand-in package, or when a TypeError / AttributeError
names one of the adapter's stand-in objects (sglang calling a method the
fake process does not have is the fake's gap, not sglang's defect).  Frames
of cgsim's CUDA mock are sglang's: the mock raises what CUDA would for what
sglang asked of it.  ``EngineCallError`` is the exception the toy world
raises on purpose when sglang calls it against its contract: sglang's.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

from cgsim.modes import ModeResolutionError
from cgsim.targets.base import TargetEnvironmentError, TargetUnsupported
from cgsim.targets.sglang.compat import SglangAdapterError
from cgsim.text import first_line
from cgsim.timeouts import ScenarioTimeout

__all__ = ["EngineCallError", "raised_by_adapter", "guarded", "STAND_IN_NAMES"]

_CGSIM = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CUDA_MOCK = os.path.join(_CGSIM, "cuda_mock")
# The fake process's objects sglang calls: an AttributeError or TypeError naming
# one is the adapter's interface drifting from sglang's.
STAND_IN_NAMES = ("FakeModelRunner", "AdapterSlots", "ToyAttention", "ToyCausalLM", "_Body", "_ModelConfig",
                  "_TpGroup", "_QuietProgress", "ViewLayout", "SglangHandle", "'types.SimpleNamespace'",
                  "'SimpleNamespace'", "_Inert", "DraftAttention", "_DraftWorker", "DraftDecodeHandle",
                  "DraftExtendHandle", "_DraftExtendModel")


# sglang's complaints that the process around it did not publish a state it
# reads (parallel ranks, server config): the fake process's gap.
PROCESS_STATE_GAPS = ("has not been written in this process", "derived parallel width", "not published",
                      "ParallelContext has no", "unknown parallel field")


class EngineCallError(RuntimeError):
    """sglang called the toy model or attention backend against their contract
    (e.g. inputs of more rows than the graph's buffers): sglang's failure."""


def _stand_in_roots() -> tuple[str, ...]:
    """Folders of the stand-in packages the install put into site-packages."""
    roots = []
    for entry in sys.path:
        manifest = os.path.join(entry, "cgsim_sglang_standins.txt")
        if os.path.isfile(manifest):
            with open(manifest, encoding="utf-8") as fh:
                roots += [os.path.join(entry, line.strip()) + os.sep for line in fh if line.strip()]
            roots.append(os.path.join(entry, "_cgsim_standin.py"))
    return tuple(roots)


@functools.lru_cache(maxsize=1)
def _stand_ins() -> tuple[str, ...]:
    return _stand_in_roots()


def _innermost(exc: BaseException) -> Any:
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last


def _is_adapter_file(path: str) -> bool:
    path = os.path.abspath(path)
    if path.startswith(_CGSIM + os.sep):
        return not path.startswith(_CUDA_MOCK + os.sep)
    return any(path.startswith(root) for root in _stand_ins())


def raised_by_adapter(exc: BaseException) -> str | None:
    """Where the adapter raised ``exc`` ("file:line", or the stand-in it
    names), or None when the failure is sglang's.  A failure re-raised with
    context (``raise ... from exc``) is judged by its cause."""
    if isinstance(exc, EngineCallError):
        return None
    if exc.__cause__ is not None:
        return raised_by_adapter(exc.__cause__)
    last = _innermost(exc)
    if last is not None and _is_adapter_file(last.tb_frame.f_code.co_filename):
        return f"{os.path.basename(last.tb_frame.f_code.co_filename)}:{last.tb_lineno}"
    if any(gap in str(exc) for gap in PROCESS_STATE_GAPS):
        return f"sglang found process state the adapter did not set ({first_line(exc, 120)})"
    if isinstance(exc, (TypeError, AttributeError)):
        named = [n for n in STAND_IN_NAMES if n in str(exc)]
        if named:
            return f"sglang asked the adapter's {named[0].strip(chr(39))} for what it lacks"
    return None


def guarded(method: Callable) -> Callable:
    """Errors of the adapter itself are a broken environment (SglangAdapterError,
    exit 2); everything sglang raises stays the target's, for the properties."""

    @functools.wraps(method)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (TargetUnsupported, TargetEnvironmentError, ScenarioTimeout, ModeResolutionError):
            raise
        except Exception as exc:
            where = raised_by_adapter(exc)
            if where is None:
                raise
            raise SglangAdapterError(
                f"cgsim's sglang adapter failed, not sglang ({type(exc).__name__}: {first_line(exc, 240)}; at "
                f"{where}) in {method.__name__}: the adapter does not fit this sglang tree, report it with the "
                "sglang version") from exc

    return wrapped
