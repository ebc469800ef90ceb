"""Triton kernels launched inside a capture, under Triton's interpreter.

A real capture records a Triton launch as a kernel node: it runs at each
replay, on the addresses it was given, and not at capture.  Triton's
interpreter (``TRITON_INTERPRET=1``, how kernels run on CPU tensors) instead
runs the kernel at launch, on the tensors' memory directly, behind the
dispatcher where the capture's mode cannot see it: the kernel ran once, at
capture, and never at replay, so a graph around it replayed stale values.
While the mock captures, a launch is recorded instead, its tensors aliased as
a recorded aten op's are, and run at each replay.
"""

from __future__ import annotations

import sys
from typing import Any

from torch.utils._python_dispatch import _disable_current_modes

from . import _errors
from ._runtime import G

__all__ = ["record_interpreted_launches"]

_INTERPRETER = "triton.runtime.interpreter"
_PATCHED = "_cgsim_records_launches"


def record_interpreted_launches() -> None:
    """Once Triton's interpreter is loaded, its launches inside a mock capture
    are recorded (idempotent; outside a capture a launch runs as before)."""
    mod = sys.modules.get(_INTERPRETER)
    executor = getattr(mod, "GridExecutor", None)
    if executor is None or getattr(executor, _PATCHED, False):
        return
    launch_now = executor.__call__

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        cap = G.capture
        rec = getattr(cap.graph, "_recorder", None) if cap is not None else None
        if rec is None or cap.host_depth:
            return launch_now(self, *args, **kwargs)
        if cap.invalidated:
            raise _errors.capture_invalidated_error(f"Triton kernel {_name(self)}")
        with _disable_current_modes():  # aliasing is bookkeeping, not captured work
            a_args = tuple(rec.alias_all(a) for a in args)
            a_kwargs = {k: rec.alias_all(v) for k, v in kwargs.items()}
        rec.ops.append((launch_now, (self, *a_args), a_kwargs))
        rec.funcs.append(f"triton.{_name(self)}")
        return None

    executor.__call__ = launch
    setattr(executor, _PATCHED, True)


def _name(executor: Any) -> str:
    return getattr(getattr(executor, "fn", None), "__name__", "kernel")
