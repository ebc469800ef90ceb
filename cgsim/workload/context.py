"""The forward context: what the runner tells the model about the step it is
running (like vLLM's set_forward_context).  The model reads attention metadata
from here, so the trace records exactly what the code under test passed."""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator

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


@contextlib.contextmanager
def set_forward_context(
    attn_metadata: Any,
    num_tokens: int,
    cg_mode: CUDAGraphMode = CUDAGraphMode.NONE,
    key: PiecewiseKey | None = None,
    lora_case: int = 0,
) -> Iterator[ForwardContext]:
    ctx = ForwardContext(attn_metadata, num_tokens, cg_mode, key, lora_case)
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def get_forward_context() -> ForwardContext:
    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError("the model ran outside set_forward_context(); the runner must set one")
    return ctx
