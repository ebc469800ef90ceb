"""The decode family (``cgsim.families``): the decode managers (vLLM's,
SGLang's runners, the reference and its mutants) over ``cgsim.scenario.Scenario``,
whose JSON has no ``kind``; its targets are those of ``cgsim.targets.registry``.

Its replay is here: a finding's scenario observed again on its target, or,
for a finding served through the engine's runner, served again by
``cgsim.served``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cgsim.backends import get_backend
from cgsim.families import CatalogueRow, Family, owns_target_of
from cgsim.finding import Finding
from cgsim.observe import RUNNER, Outcome, Pipeline, observe
from cgsim.scenario import Scenario
from cgsim.served import ServedReplayResult, describe_served, is_served_finding, reproduce_served
from cgsim.targets import get_target
from cgsim.targets.base import ScenarioNotRunnable

__all__ = ["FAMILY", "DEFAULT_REPLAY_TIMEOUT", "ReplayResult", "reproduce_decode", "describe_decode"]

DEFAULT_REPLAY_TIMEOUT = 60.0


@dataclass(frozen=True)
class ReplayResult:
    property: str
    reproduced: bool
    outcome: Outcome

    def lines(self) -> list[str]:
        out = []
        seen = self.outcome.first(self.property)
        if self.reproduced and seen is not None:
            out.append(f"REPRODUCED {self.property}: {seen.message}")
        else:
            out.append(f"not reproduced: {self.property} holds on this run")
        for f in self.outcome.findings:
            if f.property != self.property:
                out.append(f"also violated {f.property}: {f.message}")
        return out


def reproduce_decode(finding: Finding, backend: str | None = None, timeout: float | None = None,
                     pipeline: Pipeline = RUNNER) -> ReplayResult | ServedReplayResult:
    """Run a decode finding's scenario on its target (a served finding: serve it again)."""
    if timeout is not None and timeout <= 0:
        raise ValueError(f"--timeout {timeout:g}: give a positive number of seconds")
    if is_served_finding(finding):
        return reproduce_served(finding, timeout)
    scenario = Scenario.from_json(finding.scenario)
    backend = backend or finding.backend or "mock"
    get_backend(backend)  # BackendUnavailable (e.g. cuda without a GPU)
    get_target(finding.target).prepare_environment()
    if timeout is None:
        timeout = float(finding.extra.get("timeout_s") or DEFAULT_REPLAY_TIMEOUT)
    outcome = observe(scenario, finding.target, backend, timeout, pipeline=pipeline)
    if outcome.unsupported is not None:
        # Nothing ran: neither a reproduction nor a fix.
        raise ScenarioNotRunnable(f"{finding.id} cannot run on {finding.target} here: {outcome.unsupported}")
    return ReplayResult(finding.property, outcome.first(finding.property) is not None, outcome)


def describe_decode(finding: Finding) -> list[str]:
    if is_served_finding(finding):
        return describe_served(finding)
    lines = [f"finding {finding.id}: {finding.property} on target {finding.target}"]
    if finding.statement:
        lines.append(f"  property: {finding.statement}")
    if finding.message:
        lines.append(f"  first seen: {finding.message}")
    if finding.scenario_short:
        lines.append(f"  scenario: {finding.scenario_short}")
    try:
        from cgsim.scenario_code import mode_resolution

        lines.append(f"  {mode_resolution(Scenario.from_json(finding.scenario))}")
    except (ValueError, TypeError, KeyError):
        pass  # a scenario that does not load: reproduce() says why
    return lines


def _owns_scenario(scenario: Any) -> bool:
    return isinstance(scenario, Mapping) and "kind" not in scenario  # the decode schema has no kind


def _scenario_code(scenario: Any) -> str:
    from cgsim.scenario_code import scenario_code

    return scenario_code(Scenario.from_json(scenario))


def _scenario_short(scenario: Any) -> str:
    return Scenario.from_json(scenario).short()


def _properties() -> Mapping[str, Any]:
    from cgsim.properties import ALL_PROPERTIES

    return ALL_PROPERTIES


def _judged_by(rulesets: Any) -> Mapping[str, Any]:
    from cgsim.properties import judged_by

    return judged_by(rulesets)


def _check_ruleset(target: str, ruleset: str) -> None:
    from cgsim.spec import get_ruleset
    from cgsim.targets import check_ruleset_fits

    get_ruleset(ruleset)
    check_ruleset_fits(target, ruleset)


def _catalogue() -> tuple[CatalogueRow, ...]:
    from cgsim.properties import ALL_PROPERTIES
    from cgsim.spec import RULESETS
    from cgsim.targets import describe_targets

    owns = owns_target_of("decode")
    rows = [CatalogueRow("mutant" if name.startswith("mutant:") else "target", name, summary)
            for name, summary in describe_targets().items() if owns(name)]
    rows += [CatalogueRow("ruleset", name, rs.summary) for name, rs in RULESETS.items()]
    rows += [CatalogueRow("property", pid, prop.statement + (" (harness)" if prop.family == "harness" else ""))
             for pid, prop in ALL_PROPERTIES.items()]
    return tuple(rows)


FAMILY = Family(
    name="decode",
    summary="the decode managers (vLLM, SGLang, cgsim's reference and mutants) over cgsim.scenario.Scenario",
    owns_scenario=_owns_scenario,
    owns_target=owns_target_of("decode"),
    reproduce=reproduce_decode,
    describe=describe_decode,
    scenario_code=_scenario_code,
    scenario_short=_scenario_short,
    properties=_properties,
    judged_by=_judged_by,
    check_ruleset=_check_ruleset,
    catalogue=_catalogue,
    search="fuzz.campaign.search:DECODE_SEARCH",
)
