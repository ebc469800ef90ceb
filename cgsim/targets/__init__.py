"""Systems under test behind one interface: the reference manager, its
mutants (``mutant:NAME``) and an installed vLLM (``vllm``)."""

from __future__ import annotations

from cgsim.targets.base import (
    CandidateSnapshot,
    Execution,
    ManagerUnderTest,
    Target,
    TargetError,
    TargetUnsupported,
    UnknownTarget,
)

__all__ = [
    "CandidateSnapshot", "Execution", "ManagerUnderTest", "Target", "TargetError", "TargetUnsupported", "UnknownTarget",
    "get_target", "target_names",
]


def _mutants() -> dict:
    try:
        from cgsim.targets.mutants import MUTANTS
    except ImportError:  # pragma: no cover - during bring-up
        return {}
    return MUTANTS


def target_names() -> list[str]:
    return ["reference"] + [f"mutant:{name}" for name in _mutants()] + ["vllm"]


def get_target(name: "str | Target") -> Target:
    if not isinstance(name, str):
        return name
    if name == "reference":
        from cgsim.targets.reference import ReferenceTarget

        return ReferenceTarget()
    if name.startswith("mutant:"):
        mutant = name.split(":", 1)[1]
        mutants = _mutants()
        if mutant not in mutants:
            raise UnknownTarget(
                f"unknown mutant {mutant!r}; choose one of {', '.join(sorted(mutants))} (python -m fuzz list)"
            )
        return mutants[mutant]()
    if name == "vllm":
        from cgsim.targets.vllm import VllmTarget

        return VllmTarget()
    raise UnknownTarget(f"unknown target {name!r}; use reference, mutant:NAME or vllm (python -m fuzz list)")
