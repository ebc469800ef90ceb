"""Re-run one encoder finding: the one place that decides how a finding whose
scenario is an encoder scenario (``"kind": "encoder"``) replays.

``cgsim.replay.reproduce`` and ``describe`` hand encoder findings here, so
``python -m fuzz replay FINDING.json`` and a campaign's repro script
(``repro_<id>.py``) replay them alike: the finding's target is built as the
campaign built it (``cgsim.encoder.targets``), its scenario reached through
the target's front door, run and judged (``cgsim.encoder.observe``), and the
finding reproduces while its property is still violated."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cgsim.finding import Finding
from cgsim.properties.registry import Violation
from cgsim.targets.base import ScenarioNotRunnable

__all__ = ["EncoderReplayResult", "describe_encoder", "is_encoder_scenario", "reproduce_encoder"]


def is_encoder_scenario(scenario: object) -> bool:
    """Whether a scenario's JSON (a finding's ``scenario``) is an encoder scenario's (its finding replays here)."""
    return isinstance(scenario, Mapping) and scenario.get("kind") == "encoder"


@dataclass(frozen=True)
class EncoderReplayResult:
    """What a replay showed: ``reproduced`` while ``property`` is still violated."""

    property: str
    reproduced: bool
    violations: tuple[Violation, ...]  # every violation of this run
    defects: tuple[tuple[str, str | None], ...] = ()  # (property, documented defect) per violation, where the target labels them

    def lines(self) -> list[str]:
        first: dict[str, Violation] = {}
        for v in self.violations:
            first.setdefault(v.property, v)
        labels: dict[str, str | None] = {}
        for pid, defect in self.defects:
            labels.setdefault(pid, defect)
        out = []
        seen = first.get(self.property)
        if self.reproduced and seen is not None:
            out.append(f"REPRODUCED {self.property}: {seen.message}{_label(labels.get(self.property))}")
        else:
            out.append(f"not reproduced: {self.property} holds on this run")
        out += [f"also violated {pid}: {v.message}{_label(labels.get(pid))}" for pid, v in first.items()
                if pid != self.property]
        return out


def _label(defect: str | None) -> str:
    return f" (documented defect {defect}, docs/encoder.md)" if defect else ""


def describe_encoder(finding: Finding) -> list[str]:
    """What the finding is, before it is replayed (no engine is imported)."""
    lines = [f"finding {finding.id}: {finding.property} on target {finding.target}"]
    if finding.statement:
        lines.append(f"  property: {finding.statement}")
    if finding.message:
        lines.append(f"  first seen: {finding.message}")
    if finding.extra.get("known_defect"):
        lines.append(f"  documented defect: {finding.extra['known_defect']} (docs/encoder.md)")
    if finding.scenario_short:
        lines.append(f"  scenario: {finding.scenario_short}")
    launch = finding.extra.get("launch")
    if isinstance(launch, Mapping) and launch.get("line"):
        lines.append(f"  launch: {launch['line']}")
    return lines


def reproduce_encoder(finding: Finding, backend: str | None = None, timeout: float | None = None) -> EncoderReplayResult:
    """Run the finding's encoder scenario on its target.

    Environment problems (a target this install lacks, no vLLM, no GPU for
    ``cuda``), a scenario that does not load and settings the engine here
    refuses raise before any verdict: never a reproduction, nor a fix.
    ``timeout`` is accepted for the shared signature; an encoder scenario
    runs in this process without a per-scenario timeout."""
    from cgsim.backends import get_backend
    from cgsim.encoder.observe import observe_encoder
    from cgsim.encoder.targets import encoder_target
    from cgsim.encoder.values import EncoderScenario

    if timeout is not None and timeout <= 0:
        raise ValueError(f"--timeout {timeout:g}: give a positive number of seconds")
    target = encoder_target(finding.target)
    target.prepare_environment()
    scenario = EncoderScenario.from_json(dict(finding.scenario))
    obs = observe_encoder(target, scenario, get_backend(backend or finding.backend or "mock"))
    if obs.refused is not None:
        raise ScenarioNotRunnable(f"{finding.id} cannot run on {finding.target} here: the engine refuses its "
                                  f"settings ({obs.refused})")
    classify = target.encoder.classify
    defects = tuple((v.property, classify(obs.scenario, obs.trace, v).get("known_defect"))
                    for v in obs.verdict.violations) if classify is not None else ()
    return EncoderReplayResult(finding.property, any(v.property == finding.property for v in obs.verdict.violations),
                               tuple(obs.verdict.violations), defects)
