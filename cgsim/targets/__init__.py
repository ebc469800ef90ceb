"""Systems under test behind one interface (``cgsim.targets.base``), found
through one registry (``cgsim.targets.registry``): cgsim's reference
manager, its mutants (``mutant:NAME``), an installed vLLM (``vllm``) and any
target a package adds through the ``cgsim.targets`` entry-point group."""

from __future__ import annotations

from cgsim.targets.base import (
    CandidateSnapshot,
    Execution,
    ManagerUnderTest,
    Target,
    TargetEnvironmentError,
    TargetError,
    TargetUnsupported,
    UnknownTarget,
)
from cgsim.targets.registry import TargetFamily, describe_targets, families, get_target, target_names

__all__ = [
    "CandidateSnapshot", "Execution", "ManagerUnderTest", "Target", "TargetEnvironmentError", "TargetError",
    "TargetUnsupported", "UnknownTarget", "TargetFamily", "describe_targets", "families", "get_target", "target_names",
]
