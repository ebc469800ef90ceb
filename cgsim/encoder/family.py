"""The encoder family (``cgsim.families``): vLLM's vision-encoder manager,
cgsim's reference encoder manager and its mutants, over
``cgsim.encoder.values.EncoderScenario`` (JSON of ``"kind": "encoder"``);
its targets are those of ``cgsim.encoder.targets``, its replay ``cgsim.encoder.replay``."""

from __future__ import annotations

from typing import Any, Mapping

from cgsim.encoder.replay import describe_encoder, is_encoder_scenario, reproduce_encoder
from cgsim.families import CatalogueRow, Family

__all__ = ["FAMILY"]


def _owns_target(name: str) -> bool:
    from cgsim.encoder.targets import is_encoder_target

    return is_encoder_target(name)


def _scenario_code(scenario: Any) -> str:
    from cgsim.encoder.code import encoder_scenario_code
    from cgsim.encoder.values import EncoderScenario

    return encoder_scenario_code(EncoderScenario.from_json(scenario))


def _scenario_short(scenario: Any) -> str:
    from cgsim.encoder.values import EncoderScenario

    return EncoderScenario.from_json(scenario).short()


def _properties() -> Mapping[str, Any]:
    from cgsim.properties.encoder import ENCODER_PROPERTIES

    return ENCODER_PROPERTIES


def _catalogue() -> tuple[CatalogueRow, ...]:
    from cgsim.encoder.mutants import ENCODER_MUTANTS
    from cgsim.properties.encoder import ENCODER_PROPERTIES
    from cgsim.spec.encoder import DESIGNS

    rows = [CatalogueRow("target", "encoder-reference",
                         "cgsim's reference vision-encoder graph manager (docs/encoder.md)"),
            CatalogueRow("target", "vllm-encoder", "vLLM's EncoderCudaGraphManager through vLLM's front door")]
    rows += [CatalogueRow("mutant", f"encoder-mutant:{name}", (m.cls.__doc__ or "").strip().splitlines()[0])
             for name, m in ENCODER_MUTANTS.items()]
    rows += [CatalogueRow("ruleset", name, d.why) for name, d in DESIGNS.items()]
    rows += [CatalogueRow("property", pid, f"{prop.statement} (encoder)") for pid, prop in ENCODER_PROPERTIES.items()]
    return tuple(rows)


FAMILY = Family(
    name="encoder",
    summary="vision-encoder managers (vLLM's, cgsim's reference and mutants) over cgsim.encoder's EncoderScenario",
    owns_scenario=is_encoder_scenario,
    owns_target=_owns_target,
    reproduce=reproduce_encoder,
    describe=describe_encoder,
    scenario_code=_scenario_code,
    scenario_short=_scenario_short,
    properties=_properties,
    catalogue=_catalogue,
)
