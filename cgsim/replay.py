"""Re-run one finding: the shared core of ``python -m fuzz replay`` and of the
standalone repro scripts."""

from __future__ import annotations

from dataclasses import dataclass

from cgsim.backends import get_backend
from cgsim.finding import Finding
from cgsim.observe import RUNNER, Outcome, Pipeline, observe
from cgsim.scenario import Scenario
from cgsim.targets import get_target

__all__ = ["ReplayResult", "reproduce", "describe", "DEFAULT_REPLAY_TIMEOUT"]

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


def reproduce(finding: Finding, backend: str | None = None, timeout: float | None = None,
              pipeline: Pipeline = RUNNER) -> ReplayResult:
    """Run the finding's scenario on its target.  ``reproduced`` is True while
    the finding's property is still violated.

    Environment problems (no GPU, a target this install lacks, an engine that
    does not import) raise before anything runs: they must never look like a
    reproduction, nor like a fix."""
    if timeout is not None and timeout <= 0:
        raise ValueError(f"--timeout {timeout:g}: give a positive number of seconds")
    scenario = Scenario.from_json(finding.scenario)
    backend = backend or finding.backend or "mock"
    get_backend(backend)  # BackendUnavailable (e.g. cuda without a GPU)
    get_target(finding.target).check_environment()
    if timeout is None:
        timeout = float(finding.extra.get("timeout_s") or DEFAULT_REPLAY_TIMEOUT)
    outcome = observe(scenario, finding.target, backend, timeout, pipeline=pipeline)
    return ReplayResult(finding.property, outcome.first(finding.property) is not None, outcome)


def describe(finding: Finding) -> list[str]:
    lines = [f"finding {finding.id}: {finding.property} on target {finding.target}"]
    if finding.statement:
        lines.append(f"  property: {finding.statement}")
    if finding.message:
        lines.append(f"  first seen: {finding.message}")
    if finding.scenario_short:
        lines.append(f"  scenario: {finding.scenario_short}")
    return lines
