"""The encoder targets, as target families of ``cgsim.targets.registry``
(``capture_family="encoder"``): ``encoder-reference`` (cgsim's reference
manager), ``encoder-mutant:NAME`` (one of its mutants) and ``vllm-encoder``
(vLLM's own ``EncoderCudaGraphManager`` through vLLM's front door,
``cgsim.targets.vllm.encoder``).

An encoder target has what every target's campaign asks (``name``,
``default_ruleset()``, ``prepare_environment()``, ``environment()``, the
roles ``drawing``, ``triage`` and ``tooling``), the encoder family's own
hooks (``encoder``: ``cgsim.targets.base.EncoderHooks``), ``reach(scenario)``
(the scenario with the config the engine builds from the settings it stands
for, and the launch that reaches it; TargetUnsupported where the engine
refuses them: counted, never judged) and ``builder(scenario, backend)`` (a
function building the handle)."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from cgsim.encoder.runner import ManagedEncoder, gc_held
from cgsim.encoder.toy import toy_for
from cgsim.encoder.values import EncoderScenario
from cgsim.targets.base import ENCODER_HOOKS, Drawing, EncoderHooks, Tooling, Triage, UnknownTarget
from cgsim.targets.registry import TargetFamily, family_of_target_name, get_target

__all__ = ["EncoderTarget", "REFERENCE_FAMILY", "MUTANT_FAMILY", "VLLM_FAMILY", "encoder_target", "encoder_builder",
           "ReferenceEncoderTarget"]


class EncoderTarget(Protocol):
    """What the encoder family asks of a target beside every target's contract (``cgsim.targets.base.Target``)."""

    name: str
    encoder: EncoderHooks

    def default_ruleset(self) -> str: ...

    def prepare_environment(self) -> None: ...

    def environment(self) -> dict: ...

    def reach(self, scenario: EncoderScenario) -> tuple[EncoderScenario, dict | None]: ...

    def builder(self, scenario: EncoderScenario, backend: Any) -> Callable[[], ManagedEncoder]: ...


class ReferenceEncoderTarget:
    """cgsim's reference encoder manager, or one of its mutants."""

    def __init__(self, name: str, cls: type) -> None:
        self.name, self.cls = name, cls
        self.drawing, self.triage, self.tooling, self.encoder = Drawing(), Triage(), Tooling(), EncoderHooks()

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


def _reference(_variant: str | None) -> ReferenceEncoderTarget:
    from cgsim.encoder.reference import ReferenceEncoderManager  # noqa: PLC0415

    return ReferenceEncoderTarget("encoder-reference", ReferenceEncoderManager)


def _mutant(variant: str | None) -> ReferenceEncoderTarget:
    from cgsim.encoder.mutants import ENCODER_MUTANTS  # noqa: PLC0415

    return ReferenceEncoderTarget(f"encoder-mutant:{variant}", ENCODER_MUTANTS[str(variant)].cls)


def _mutant_variants() -> dict[str, str]:
    from cgsim.encoder.mutants import ENCODER_MUTANTS  # noqa: PLC0415

    return {name: (m.cls.__doc__ or "").strip().splitlines()[0] for name, m in ENCODER_MUTANTS.items()}


def _vllm(_variant: str | None) -> Any:
    from cgsim.targets.vllm.doctor import encoder_self_check  # noqa: PLC0415 - vLLM only where asked for
    from cgsim.targets.vllm.encoder import VllmEncoderTarget  # noqa: PLC0415

    return VllmEncoderTarget(encoder_self_check)


REFERENCE_FAMILY = TargetFamily("encoder-reference", "cgsim's reference vision-encoder graph manager (docs/encoder.md)",
                                _reference, capture_family="encoder", hooks=ENCODER_HOOKS, cgsims_own=True)
MUTANT_FAMILY = TargetFamily("encoder-mutant", "a mutant of cgsim's reference vision-encoder graph manager", _mutant,
                             _mutant_variants, capture_family="encoder", hooks=ENCODER_HOOKS, cgsims_own=True)
VLLM_FAMILY = TargetFamily("vllm-encoder", "vLLM's EncoderCudaGraphManager through vLLM's front door", _vllm,
                           capture_family="encoder", hooks=ENCODER_HOOKS,
                           export_writer="fuzz.export_test.vllm_encoder:write_vllm_encoder_test")


def encoder_target(name: str) -> Any:
    """The encoder target ``name`` (``cgsim.targets.registry.get_target``,
    which checks its hooks); UnknownTarget where ``name`` is no encoder target."""
    family = family_of_target_name(name)
    if family is not None and family.capture_family != "encoder":
        raise UnknownTarget(f"{name} is no encoder target; use encoder-reference, encoder-mutant:NAME or vllm-encoder")
    return get_target(name)


def encoder_builder(target: str, scenario: EncoderScenario, backend: Any) -> Callable[[], ManagedEncoder]:
    """A function that builds ``target``'s handle for ``scenario`` (the runner counts a refusal)."""
    return encoder_target(target).builder(scenario, backend)
