"""The encoder targets: what builds an encoder handle for a scenario on a
backend.  ``encoder-reference`` (cgsim's reference manager),
``encoder-mutant:NAME`` (one of its mutants) and ``vllm-encoder`` (vLLM's
own ``EncoderCudaGraphManager`` through vLLM's front door,
``cgsim.targets.vllm.encoder``).

An encoder target has: ``name``, ``default_ruleset()`` (the design it
follows), ``prepare_environment()`` (TargetEnvironmentError, one line),
``environment()``, its optional hooks by role (``drawing``, ``triage``,
``tooling``: ``cgsim.targets.base.EncoderDrawing`` and its kin),
``reach(scenario)`` (the scenario with the config the
engine builds from the settings it stands for, and the launch that reaches
it; TargetUnsupported where the engine refuses them: counted, never judged)
and ``builder(scenario, backend)`` (a function building the handle)."""

from __future__ import annotations

from typing import Any, Callable

from cgsim.encoder.runner import ManagedEncoder, gc_held
from cgsim.encoder.toy import toy_for
from cgsim.encoder.values import EncoderScenario
from cgsim.targets.base import ENCODER_HOOKS, EncoderDrawing, EncoderTooling, EncoderTriage, UnknownTarget

__all__ = ["ENCODER_TARGET_NAMES", "is_encoder_target", "encoder_target", "encoder_builder", "ReferenceEncoderTarget"]

ENCODER_TARGET_NAMES = ("encoder-reference", "encoder-mutant:NAME", "vllm-encoder")


def is_encoder_target(name: str) -> bool:
    return name in ("encoder-reference", "vllm-encoder") or name.startswith("encoder-mutant:")


class ReferenceEncoderTarget:
    """cgsim's reference encoder manager, or one of its mutants."""

    def __init__(self, name: str, cls: type) -> None:
        self.name, self.cls = name, cls
        self.drawing, self.triage, self.tooling = EncoderDrawing(), EncoderTriage(), EncoderTooling()

    def default_ruleset(self) -> str:
        return "encoder"

    def prepare_environment(self) -> None:
        return None

    def environment(self) -> dict:
        return {}

    def reach(self, scenario: EncoderScenario) -> tuple[EncoderScenario, dict | None]:
        return scenario, None

    def builder(self, scenario: EncoderScenario, backend: Any) -> Callable[[], ManagedEncoder]:
        def build() -> ManagedEncoder:
            model = toy_for(scenario, backend.device)
            return ManagedEncoder(self.cls(scenario.config, model, backend.device, backend.cuda), model, backend,
                                  capture_context=gc_held)

        return build


def encoder_target(name: str) -> Any:
    """The encoder target ``name``; one whose optional hooks are not typed or
    callable as declared (ENCODER_HOOKS) is TargetEnvironmentError, one line."""
    target = _create(name)
    ENCODER_HOOKS.check(target)
    return target


def _create(name: str) -> Any:
    from cgsim.encoder.mutants import ENCODER_MUTANTS  # noqa: PLC0415
    from cgsim.encoder.reference import ReferenceEncoderManager  # noqa: PLC0415

    if name == "encoder-reference":
        return ReferenceEncoderTarget(name, ReferenceEncoderManager)
    if name.startswith("encoder-mutant:"):
        mutant = ENCODER_MUTANTS.get(name.split(":", 1)[1])
        if mutant is None:
            raise UnknownTarget(f"encoder mutant {name.split(':', 1)[1]!r} is unknown; choose one of "
                                f"{', '.join(ENCODER_MUTANTS)}")
        return ReferenceEncoderTarget(name, mutant.cls)
    if name == "vllm-encoder":
        from cgsim.targets.vllm.doctor import encoder_self_check  # noqa: PLC0415 - vLLM only where asked for
        from cgsim.targets.vllm.encoder import VllmEncoderTarget  # noqa: PLC0415

        return VllmEncoderTarget(encoder_self_check)
    raise UnknownTarget(f"encoder target {name!r} is unknown; use one of {', '.join(ENCODER_TARGET_NAMES)}")


def encoder_builder(target: str, scenario: EncoderScenario, backend: Any) -> Callable[[], ManagedEncoder]:
    """A function that builds ``target``'s handle for ``scenario`` (the runner counts a refusal)."""
    return encoder_target(target).builder(scenario, backend)
