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
from cgsim.targets.registry import (
    TargetFamily,
    WrongRuleset,
    check_ruleset_fits,
    describe_targets,
    families,
    get_target,
    target_engine,
    target_names,
)

__all__ = [
    "CandidateSnapshot", "Execution", "ManagerUnderTest", "Target", "TargetEnvironmentError", "TargetError",
    "TargetUnsupported", "UnknownTarget", "TargetFamily", "describe_targets", "families", "get_target", "target_names",
    "target_engine", "WrongRuleset", "check_ruleset_fits",
]
