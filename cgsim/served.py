"""The runner tier's served scenarios: a scenario's launch served end to end
through the engine's own model runner, judged by SERVED-EQUALS-EAGER.

A target that can serve (its optional hook ``triage.serve_scenarios``: vLLM's
scheduler, ``execute_model`` and sampler around the runner it builds for the
launch) hands back, per scenario, the same requests served with CUDA graphs
and eager as plain runs (tokens and log-probabilities per request, what was
raised).  ``served_finding`` judges one such pair with the property's rule
(``cgsim.properties.lifecycle.served_violations``) and makes the finding a
campaign writes; ``reproduce_served`` serves a finding's scenario again, for
``fuzz replay`` and repro scripts alike.  Such a finding is the runner's own
word: it carries its runner verdict (``served``) and is never asked of the
runner again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cgsim.finding import Finding
from cgsim.properties.lifecycle import SERVED_EQUALS_EAGER, changes_output, served_violations
from cgsim.properties.registry import Violation
from cgsim.scenario import Scenario
from cgsim.targets import get_target
from cgsim.targets.base import ScenarioNotRunnable

__all__ = ["TIER", "SERVED_VERDICT", "SERVE_TIMEOUT_S", "ServedReplayResult", "is_served_finding", "served_finding",
           "consequence", "reproduce_served", "describe_served"]

TIER = "runner"  # facts["tier"] of a finding served through the engine's runner
SERVED_VERDICT = "served"  # its runner_confirmation verdict: found by the runner itself
SERVE_TIMEOUT_S = 300.0  # a served pair: the runner built and run twice, with graphs and eager


def is_served_finding(finding: Finding) -> bool:
    """Whether ``finding`` was found by serving its launch (replayed here)."""
    return finding.facts.get("tier") == TIER


def served_finding(target: str, backend: str, scenario: Scenario, served: Mapping[str, Any],
                   launch: Mapping[str, Any] | None) -> Finding | None:
    """The finding a served pair shows (None: graphs gave eager's tokens),
    one per scenario: the first difference its message, every difference in
    its facts."""
    violations = served_violations(served["graphs"], served["eager"])
    if not violations:
        return None
    first = violations[0]
    facts = {**first.record(), "tier": TIER, "launch_line": served.get("launch_line"),
             "differences": [v.message for v in violations], "replays": served["graphs"].get("replays")}
    from cgsim.report.defects import CONFIRMATION  # noqa: PLC0415 - the report owns the key it reads

    verdict = {"verdict": SERVED_VERDICT, "served": consequence(served)}
    finding = Finding(property=SERVED_EQUALS_EAGER, message=first.message, target=target, backend=backend,
                      scenario=scenario.to_json(), status="unshrunk", scenario_short=scenario.short(),
                      facts=facts, extra={"launch": dict(launch or {}), CONFIRMATION: verdict,
                                                 "timeout_s": SERVE_TIMEOUT_S})
    return finding.with_(statement=_statement())


def _statement() -> str:
    from cgsim.properties.registry import registered  # noqa: PLC0415

    return registered()[SERVED_EQUALS_EAGER].statement


def consequence(served: Mapping[str, Any]) -> dict:
    """A served pair in the words the report's runner phrase reads: requests,
    replays, what graphs and eager raised, where graphs differ, and whether
    that is in the output (not only in the drafts)."""
    graphs, eager = served["graphs"], served["eager"]
    violations = [] if graphs.get("raised") else served_violations(graphs, eager)
    return {"requests": served.get("requests"), "replays": graphs.get("replays"), "raised": graphs.get("raised"),
            "eager_raised": eager.get("raised"), "differences": [v.message for v in violations],
            "wrong_output": any(changes_output(v) for v in violations)}


@dataclass(frozen=True)
class ServedReplayResult:
    """What serving a finding's scenario again showed: ``reproduced`` while
    graphs and eager still differ."""

    property: str
    reproduced: bool
    violations: tuple[Violation, ...]
    launch_line: str = ""

    def lines(self) -> list[str]:
        if self.reproduced:
            return [f"REPRODUCED {self.property}: {v.message}" for v in self.violations] + \
                   ([f"  served: {self.launch_line}"] if self.launch_line else [])
        return [f"not reproduced: {self.property} holds on this run (served: {self.launch_line})"]


def reproduce_served(finding: Finding, timeout: float | None = None) -> ServedReplayResult:
    """Serve ``finding``'s scenario through the target's runner again, within
    ``timeout`` (the finding's own, else ``SERVE_TIMEOUT_S``).
    ScenarioNotRunnable where the target cannot serve it here (nothing ran:
    neither a reproduction nor a fix)."""
    target = get_target(finding.target)
    target.prepare_environment()
    serve = target.triage.serve_scenarios
    if serve is None:
        raise ScenarioNotRunnable(f"{finding.id} was found by serving through the engine's runner; target "
                                  f"{finding.target} cannot serve here")
    scenario = Scenario.from_json(finding.scenario)
    [served] = serve([scenario], 1, lambda: False, timeout or float(finding.extra.get("timeout_s") or SERVE_TIMEOUT_S))
    if served is None or "error" in served:
        why = "too little time" if served is None else served["error"]
        raise ScenarioNotRunnable(f"{finding.id} cannot be served on {finding.target} here: {why}")
    violations = tuple(served_violations(served["graphs"], served["eager"]))
    return ServedReplayResult(finding.property, bool(violations), violations, str(served.get("launch_line") or ""))


def describe_served(finding: Finding) -> list[str]:
    lines = [f"finding {finding.id}: {finding.property} on target {finding.target}, served through its runner"]
    if finding.statement:
        lines.append(f"  property: {finding.statement}")
    for d in finding.facts.get("differences") or [finding.message]:
        lines.append(f"  first seen: {d}")
    if finding.facts.get("launch_line"):
        lines.append(f"  launch: {finding.facts['launch_line']}")
    return lines
