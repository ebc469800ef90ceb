"""The encoder targets: what builds an encoder handle for a scenario on a
backend.  ``encoder-reference`` (cgsim's reference manager),
``encoder-mutant:NAME`` (one of its mutants) and ``vllm-encoder`` (vLLM's
own ``EncoderCudaGraphManager``, ``cgsim.targets.vllm.encoder``)."""

from __future__ import annotations

from typing import Any, Callable

from cgsim.encoder.runner import ManagedEncoder
from cgsim.encoder.toy import ToyVisionEncoder
from cgsim.encoder.values import EncoderScenario

__all__ = ["ENCODER_TARGETS", "encoder_builder", "toy_for"]

ENCODER_TARGETS = ("encoder-reference", "encoder-mutant:NAME")


def toy_for(scenario: EncoderScenario, device: Any, **kw: Any) -> ToyVisionEncoder:
    c = scenario.config
    return ToyVisionEncoder(min_budget=c.min_budget, max_budget=c.max_num_batched_tokens,
                            max_frames_per_video=c.max_frames_per_video, device=device, video=c.video,
                            seed=scenario.seed, **kw)


def encoder_builder(target: str, scenario: EncoderScenario, backend: Any) -> Callable[[], ManagedEncoder]:
    """A function that builds the handle (called by the runner, which counts a refusal)."""
    from cgsim.encoder.mutants import ENCODER_MUTANTS  # noqa: PLC0415
    from cgsim.encoder.reference import ReferenceEncoderManager  # noqa: PLC0415

    if target == "encoder-reference":
        cls = ReferenceEncoderManager
    elif target.startswith("encoder-mutant:") and target.split(":", 1)[1] in ENCODER_MUTANTS:
        cls = ENCODER_MUTANTS[target.split(":", 1)[1]].cls
    else:
        raise ValueError(f"encoder target {target!r} is unknown; use encoder-reference or encoder-mutant:NAME "
                         f"({', '.join(ENCODER_MUTANTS)})")

    def build() -> ManagedEncoder:
        model = toy_for(scenario, backend.device)
        return ManagedEncoder(cls(scenario.config, model, backend.device, backend.cuda), model, backend)

    return build
