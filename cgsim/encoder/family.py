"""The encoder family (``cgsim.families``): vLLM's vision-encoder manager,
cgsim's reference encoder manager and its mutants, over
``cgsim.encoder.values.EncoderScenario`` (JSON of ``"kind": "encoder"``);
its targets are those of ``cgsim.encoder.targets``, its replay ``cgsim.encoder.replay``,
its campaign search ``cgsim.encoder.search``."""

from __future__ import annotations

from typing import Any, Mapping

from cgsim.encoder.replay import describe_encoder, is_encoder_scenario, reproduce_encoder
from cgsim.families import CatalogueRow, Family, owns_target_of

__all__ = ["FAMILY"]


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


def _judged_by(rulesets: Any) -> Mapping[str, Any]:
    return _properties()  # every encoder design is judged by every encoder property


def _check_ruleset(target: str, ruleset: str) -> None:
    from cgsim.spec.encoder import design

    design(ruleset)  # ValueError naming the designs


def _catalogue() -> tuple[CatalogueRow, ...]:
    from cgsim.properties.encoder import ENCODER_PROPERTIES
    from cgsim.spec.encoder import DESIGNS
    from cgsim.targets import describe_targets

    owns = owns_target_of("encoder")
    rows = [CatalogueRow("mutant" if name.startswith("encoder-mutant:") else "target", name, summary)
            for name, summary in describe_targets().items() if owns(name)]
    rows += [CatalogueRow("ruleset", name, d.why) for name, d in DESIGNS.items()]
    rows += [CatalogueRow("property", pid, f"{prop.statement} (encoder)") for pid, prop in ENCODER_PROPERTIES.items()]
    return tuple(rows)


FAMILY = Family(
    name="encoder",
    summary="vision-encoder managers (vLLM's, cgsim's reference and mutants) over cgsim.encoder's EncoderScenario",
    owns_scenario=is_encoder_scenario,
    owns_target=owns_target_of("encoder"),
    reproduce=reproduce_encoder,
    describe=describe_encoder,
    scenario_code=_scenario_code,
    scenario_short=_scenario_short,
    properties=_properties,
    judged_by=_judged_by,
    check_ruleset=_check_ruleset,
    catalogue=_catalogue,
    search="cgsim.encoder.search:ENCODER_SEARCH",
)
