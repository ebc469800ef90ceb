"""Re-run one finding: the shared core of ``python -m fuzz replay`` and of the
standalone repro scripts."""

from __future__ import annotations

from dataclasses import dataclass
from cgsim.report.pipeline import Outcome, Pipeline, observe

__all__ = ["ReplayResult", "reproduce", "DEFAULT_REPLAY_TIMEOUT"]

DEFAULT_REPLAY_TIMEOUT = 60.0


@dataclass(frozen=True)
class ReplayResult:
    property: str
    reproduced: bool
    outcome: Outcome

    def lines(self) -> list[str]:
        out = []
        obs = self.outcome.first(self.property)
        if self.reproduced and obs is not None:
            out.append(f"REPRODUCED {self.property}: {obs.message}")
        else:
            out.append(f"not reproduced: {self.property} holds on this run")
        for o in self.outcome.observations:
            if o.property != self.property:
                out.append(f"also violated {o.property}: {o.message}")
        return out


def reproduce(finding: dict, backend: str | None = None, pipeline: Pipeline | None = None, timeout: float | None = None) -> ReplayResult:
    """Run the finding's scenario on its target.  ``reproduced`` is True while
    the finding's property is still violated."""
    from cgsim.scenario import Scenario

    pipeline = pipeline or Pipeline()
    scenario = Scenario.from_json(finding["scenario"])
    backend = backend or finding.get("backend") or "mock"
    # Environment problems (no GPU, a target this install lacks) must not look
    # like a reproduction: check them before running anything.
    pipeline.check_backend(backend)
    pipeline.check_target(finding["target"])
    if timeout is None:
        timeout = float(finding.get("timeout_s") or DEFAULT_REPLAY_TIMEOUT)
    outcome = observe(pipeline, scenario, finding["target"], backend, timeout)
    prop = finding["property"]
    return ReplayResult(prop, outcome.first(prop) is not None, outcome)


def describe(finding: dict) -> list[str]:
    lines = [
        f"finding {finding.get('id')}: {finding.get('property')} on target {finding.get('target')}",
    ]
    if finding.get("statement"):
        lines.append(f"  property: {finding['statement']}")
    if finding.get("message"):
        lines.append(f"  first seen: {finding['message']}")
    if finding.get("scenario_short"):
        lines.append(f"  scenario: {finding['scenario_short']}")
    return lines


