"""The sglang target's environment errors (exit 2, one line), apart from
``compat`` so that what compat drives (``mutation``) can raise them too."""

from __future__ import annotations

from cgsim.targets.base import TargetEnvironmentError

__all__ = ["SglangAdapterError", "SglangEnvironmentError"]


class SglangEnvironmentError(TargetEnvironmentError):
    """sglang is missing, or this tree lacks what the target drives: exit 2."""


class SglangAdapterError(SglangEnvironmentError):
    """cgsim's adapter (or a stand-in), not sglang, failed: exit 2, never a finding."""
