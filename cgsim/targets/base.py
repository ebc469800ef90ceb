"""The one small interface every system under test implements.

A Target builds a ManagerUnderTest for (config, ruleset, backend, workload).
The runner drives it step by step and records what it sees; properties never
look at a target, only at the Trace, so adding a target never touches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.spec.rulesets import Ruleset

__all__ = ["Execution", "CandidateSnapshot", "ManagerUnderTest", "Target", "TargetError", "TargetUnsupported", "UnknownTarget"]


class TargetError(RuntimeError):
    """The target cannot be built in this environment (missing package, bad version)."""


class UnknownTarget(ValueError):
    pass


class TargetUnsupported(ValueError):
    """The target's own validation rejects this config (the real engine would
    refuse to start with it).  Not a finding: the scenario does not apply."""


@dataclass(frozen=True)
class Execution:
    """What running one dispatched batch produced."""

    outputs: torch.Tensor | None  # hidden states of the batch's real rows
    path: str  # "full" | "piecewise" | "eager"
    graph_metadata: int | None  # metadata the replayed graph / pieces were captured with
    runtime_metadata: int | None  # metadata prepared for this batch
    graph_from_step: int | None = None


@dataclass(frozen=True)
class CandidateSnapshot:
    capture_descs: tuple[BatchDescriptor, ...]
    candidates: tuple[tuple[tuple[int, int], tuple[BatchDescriptor, ...]], ...]


class ManagerUnderTest(Protocol):
    resolved_mode: CUDAGraphMode
    uses_breakable: bool
    has_piecewise_runner: bool

    def capture(self) -> None: ...
    def dispatch(self, batch: Batch) -> BatchDescriptor: ...
    def execute(self, batch: Batch, desc: BatchDescriptor) -> Execution: ...
    def release(self) -> None: ...
    def captured_flag(self) -> bool: ...
    def stored_graphs(self) -> tuple[BatchDescriptor, ...]: ...
    def candidates(self) -> CandidateSnapshot: ...
    def recomputed_candidates(self) -> CandidateSnapshot: ...


class Target(Protocol):
    name: str

    def build(self, config: ManagerConfig, ruleset: Ruleset, backend, workload) -> ManagerUnderTest: ...
