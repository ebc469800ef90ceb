"""The forward context: what the runner tells the model about the step it is
running (like vLLM's set_forward_context).  The model reads attention metadata
from here, so the trace records exactly what the code under test passed."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from cgsim.modes import CUDAGraphMode

__all__ = ["ForwardContext", "set_forward_context", "get_forward_context", "PiecewiseKey"]

# (num_tokens, has_lora, num_active_loras): the key piecewise graphs are captured
# and looked up under (vLLM's BatchDescriptor for the piecewise backend).
PiecewiseKey = tuple


@dataclass(frozen=True)
class ForwardContext:
    attn_metadata: Any
    num_tokens: int
    cg_mode: CUDAGraphMode
    key: PiecewiseKey | None = None
    lora_case: int = 0


_CURRENT: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar("cgsim_forward_context", default=None)


class _Scope:
    """``with set_forward_context(...)``: the context is current inside."""

    __slots__ = ("ctx", "_token")

    def __init__(self, ctx: ForwardContext):
        self.ctx = ctx

    def __enter__(self) -> ForwardContext:
        self._token = _CURRENT.set(self.ctx)
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)


def set_forward_context(
    attn_metadata: Any,
    num_tokens: int,
    cg_mode: CUDAGraphMode = CUDAGraphMode.NONE,
    key: PiecewiseKey | None = None,
    lora_case: int = 0,
) -> _Scope:
    return _Scope(ForwardContext(attn_metadata, num_tokens, cg_mode, key, lora_case))


def get_forward_context() -> ForwardContext:
    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError("the model ran outside set_forward_context(); the runner must set one")
    return ctx
