"""CUDA-graph modes, attention support levels and mode resolution (SPEC §2).

A configured mode is either plain (NONE, PIECEWISE, FULL) or a pair
(decode mode, mixed mode).  Resolution turns what the user asked for into what
the attention backends can actually support; it is the first thing a manager
does and every later decision (which descriptors exist, which graph a batch
replays) depends on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "CUDAGraphMode",
    "AttentionSupport",
    "ModeResolutionError",
    "ResolutionInputs",
    "resolve_mode",
    "required_support",
    "RUNTIME_MODES",
]


class CUDAGraphMode(enum.Enum):
    """Configured or runtime graph mode.  Values are the names used in JSON."""

    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"  # (FULL, NONE)
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"  # (FULL, PIECEWISE)

    # Members are singletons (and compare by identity), so the identity hash
    # is a valid one.  Enum's own hashes the name in Python, and a dispatch
    # sweep hashes a descriptor, mode included, for every batch it asks.
    __hash__ = object.__hash__

    @classmethod
    def parse(cls, value: "str | CUDAGraphMode") -> "CUDAGraphMode":
        if isinstance(value, CUDAGraphMode):
            return value
        try:
            return cls[str(value).upper()]
        except KeyError:
            choices = ", ".join(m.name for m in cls)
            raise ValueError(
                f"unknown cudagraph mode {value!r}; choose one of {choices}"
            ) from None

    def separate_routine(self) -> bool:
        return self in (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE)

    def decode_mode(self) -> "CUDAGraphMode":
        return _PAIRS[self][0]

    def mixed_mode(self) -> "CUDAGraphMode":
        return _PAIRS[self][1]

    def has_full(self) -> bool:
        return CUDAGraphMode.FULL in _PAIRS[self]

    def has_piecewise(self) -> bool:
        return CUDAGraphMode.PIECEWISE in _PAIRS[self]

    def is_runtime(self) -> bool:
        return self in RUNTIME_MODES

    @classmethod
    def from_parts(cls, decode: "CUDAGraphMode", mixed: "CUDAGraphMode") -> "CUDAGraphMode":
        for mode, pair in _PAIRS.items():
            if pair == (decode, mixed) and (mode.separate_routine() or decode == mixed):
                return mode
        raise ValueError(f"no configured mode has decode part {decode.name} and mixed part {mixed.name}")


_PAIRS = {
    CUDAGraphMode.NONE: (CUDAGraphMode.NONE, CUDAGraphMode.NONE),
    CUDAGraphMode.PIECEWISE: (CUDAGraphMode.PIECEWISE, CUDAGraphMode.PIECEWISE),
    CUDAGraphMode.FULL: (CUDAGraphMode.FULL, CUDAGraphMode.FULL),
    CUDAGraphMode.FULL_DECODE_ONLY: (CUDAGraphMode.FULL, CUDAGraphMode.NONE),
    CUDAGraphMode.FULL_AND_PIECEWISE: (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE),
}

RUNTIME_MODES = (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)

# Rank of a runtime mode: how much of the step a graph covers.
RUNTIME_RANK = {CUDAGraphMode.NONE: 0, CUDAGraphMode.PIECEWISE: 1, CUDAGraphMode.FULL: 2}


class AttentionSupport(enum.IntEnum):
    """How much of a batch an attention backend can run inside one full graph."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3

    @classmethod
    def parse(cls, value: "str | int | AttentionSupport") -> "AttentionSupport":
        if isinstance(value, AttentionSupport):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[str(value).upper()]
        except KeyError:
            choices = ", ".join(s.name for s in cls)
            raise ValueError(
                f"unknown attention support level {value!r}; choose one of {choices}"
            ) from None


class ModeResolutionError(ValueError):
    """The requested mode cannot run with the declared attention support."""


@dataclass(frozen=True)
class ResolutionInputs:
    requested: CUDAGraphMode
    support: AttentionSupport
    decode_query_len: int = 1
    # Attention is split out of the compiled graph (piecewise compilation with
    # attention as a splitting op), so attention can run eagerly between pieces.
    attention_split: bool = True
    # Some way to run PIECEWISE graphs exists: a compiled submodule or breakable graphs.
    piecewise_available: bool = True


def required_support(mode: CUDAGraphMode, decode_query_len: int = 1) -> AttentionSupport:
    """The least attention support level that can run ``mode``'s FULL parts."""
    if mode.mixed_mode() == CUDAGraphMode.FULL:
        return AttentionSupport.ALWAYS
    if mode.decode_mode() == CUDAGraphMode.FULL:
        if decode_query_len > 1:
            return AttentionSupport.UNIFORM_BATCH
        return AttentionSupport.UNIFORM_SINGLE_TOKEN_DECODE
    return AttentionSupport.NEVER


def resolve_mode(
    requested: "CUDAGraphMode | str",
    support: "AttentionSupport | str | int",
    decode_query_len: int = 1,
    attention_split: bool = True,
    piecewise_available: bool = True,
) -> CUDAGraphMode:
    """Resolve a requested mode against the attention backends (SPEC §2 table).

    The rules run in order; each sees the previous one's result.  Raises
    ModeResolutionError when a FULL graph is asked of a backend that can never
    be captured in one.
    """
    mode = CUDAGraphMode.parse(requested)
    support = AttentionSupport.parse(support)
    if decode_query_len < 1:
        raise ValueError(f"decode_query_len must be >= 1, got {decode_query_len}")
    F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE

    if mode == N:
        return mode

    # Rule 2: a FULL mixed part needs ALWAYS.
    if mode.mixed_mode() == F and support < AttentionSupport.ALWAYS:
        if support == AttentionSupport.NEVER:
            raise ModeResolutionError(
                f"cudagraph mode {mode.name} needs full graphs for mixed batches, but the "
                f"attention backends declare support NEVER; use PIECEWISE or NONE, or an "
                f"attention backend that supports full graphs"
            )
        mode = CUDAGraphMode.FULL_AND_PIECEWISE if attention_split else CUDAGraphMode.FULL_DECODE_ONLY

    # Rule 3: no full decode graph for a backend that never supports one.
    if mode.decode_mode() == F and support == AttentionSupport.NEVER:
        mode = P if attention_split else N

    # Rule 4: multi-token uniform decode needs UNIFORM_BATCH.
    if mode.decode_mode() == F and decode_query_len > 1 and support < AttentionSupport.UNIFORM_BATCH:
        mode = P if attention_split else N

    # Rule 5: piecewise parts need something that runs piecewise graphs.
    if mode.has_piecewise() and not piecewise_available:
        mode = {P: N, CUDAGraphMode.FULL_AND_PIECEWISE: CUDAGraphMode.FULL_DECODE_ONLY}.get(mode, mode)

    # Rule 6.
    if mode.has_full() and support == AttentionSupport.NEVER:
        raise ModeResolutionError(
            f"resolved cudagraph mode {mode.name} still has full graphs but the attention "
            f"backends declare support NEVER; request PIECEWISE or NONE"
        )
    return mode
