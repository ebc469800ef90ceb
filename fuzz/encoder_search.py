"""The search one encoder campaign process runs (``search_encoder``), with
what it writes: findings, each with its repro script.  Hypothesis draws
scenarios; each is reached through the target's front door (refusals
counted), run and judged.  A property (and documented defect) seen failing
for the first time is written at once (status "shrinking"), shrunk with it
pinned (``cgsim.encoder.shrink``, at most ``shrink_limit_s``) and written
again.  ``fuzz.encoder_campaign`` runs it in one process,
``fuzz.encoder_workers`` in several."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from cgsim.encoder.observe import observe_encoder
from cgsim.encoder.shrink import shrink_encoder_scenario
from cgsim.encoder.values import EncoderScenario
from cgsim.finding import Finding
from cgsim.report.findings import finding_path, write_finding
from cgsim.report.repro import write_repro
from cgsim.targets.base import TargetEnvironmentError
from cgsim.targets.registry import source_options
from fuzz.encoder_strategies import encoder_scenarios

__all__ = ["EncoderCampaignOptions", "EncoderCampaignResult", "encoder_finding", "search_encoder",
           "write_encoder_finding", "remove_encoder_finding"]


@dataclass(frozen=True)
class EncoderCampaignOptions:
    target: str
    backend: str = "mock"
    budget_s: float = 60.0
    seed: int = 0
    max_examples: int | None = None
    report_dir: str = "reports"
    shrink_limit_s: float = 10.0
    quiet: bool = False
    command: str = ""
    workers: int = 1  # processes, each drawing its own seed's scenarios (bounded by the caller: bounded_workers)


@dataclass
class EncoderCampaignResult:
    run_dir: str
    exit_code: int
    scenarios: int = 0
    refused: int = 0
    findings: list = field(default_factory=list)
    checks: dict = field(default_factory=dict)
    interrupted: bool = False


_CHUNK = 50


_CHUNK = 50


def encoder_finding(target: Any, obs: Any, violation: Any, backend: str, defect: str | None = None,
                    **changes: Any) -> Finding:
    """The finding of ``violation`` in the observation ``obs`` of ``target``
    (its scenario as the engine reached it, the launch line that reaches it,
    the documented ``defect`` it is an instance of); ``changes`` as
    ``Finding.with_`` takes them (``extra`` merged)."""
    f = Finding.from_violation(violation, obs.scenario.to_json(), target.name, backend, obs.scenario.short())
    environment = target.environment()
    extra: dict[str, Any] = {"environment": environment}
    # The source tree it ran on (its description too), where the replay and the repro script look for it (as
    # decode findings).
    recorded = tuple(o.recorded_as for o in source_options() if o.recorded_as)
    extra.update({k: v for k, v in environment.items() if k.startswith(recorded)})
    if obs.launch is not None:
        extra["launch"] = obs.launch
    if defect is not None:
        extra["defect"] = defect
    extra.update(changes.pop("extra", {}))
    return f.with_(extra=extra, **changes)


def write_encoder_finding(findings_dir: str, finding: Finding) -> str:
    """The finding's repro script, then the finding (both atomically): a
    finding on disk always has its script."""
    write_repro(findings_dir, finding)
    return write_finding(findings_dir, finding)


def remove_encoder_finding(findings_dir: str, finding: Finding) -> None:
    """The finding and its repro script off the disk."""
    os.remove(finding_path(findings_dir, finding))
    try:
        os.remove(os.path.join(findings_dir, finding.repro))
    except FileNotFoundError:
        pass


def search_encoder(o: EncoderCampaignOptions, target: Any, backend: Any, run_id: str, findings_dir: str, seed: int,
                   max_examples: int | None, result: EncoderCampaignResult,
                   say: Callable[[str], None] | None = None) -> list[Finding]:
    """Draw, run and judge scenarios from ``seed`` until the budget or
    ``max_examples`` is spent, counting into ``result``; each finding is
    written the moment it is first seen and again once shrunk.  The
    findings, one per property and documented defect.  Ctrl-C ends the
    search (``result.interrupted``); an adapter error is raised."""
    # One finding per property and documented defect: a new defect behind a property already found is still sought.
    found: dict[tuple[str, str | None], Finding] = {}
    start = time.monotonic()
    ruleset = target.default_ruleset()
    # A setting the engine has no field for is only ever refused: drawn where it exists.
    takes_cap = (target.drawing.takes_max_token_budget or (lambda: True))()

    classify = target.triage.classify

    def defect_of(obs: Any, v: Any) -> str | None:
        return classify(obs.scenario, obs.trace, v).get("defect") if classify is not None else None

    def violation(obs: Any, key: tuple[str, str | None]) -> Any:
        return next((v for v in obs.verdict.violations if (v.property, defect_of(obs, v)) == key), None)

    def finding_for(key: tuple[str, str | None], obs: Any, status: str, first: Finding | None = None) -> Finding:
        extra: dict[str, Any] = {"campaign_seed": o.seed}
        if first is not None:
            extra["first_seen"] = first.id
        return encoder_finding(target, obs, violation(obs, key), o.backend, key[1], status=status, run_id=run_id,
                               seed=seed, elapsed_s=round(time.monotonic() - start, 3), extra=extra)

    def shrink(key: tuple[str, str | None], sc: EncoderScenario, first: Finding) -> Finding:
        def fails(candidate: EncoderScenario) -> bool:  # the property and defect pinned
            return violation(observe_encoder(target, candidate, backend), key) is not None

        smallest, complete = shrink_encoder_scenario(sc, fails, time.monotonic() + o.shrink_limit_s)
        obs = observe_encoder(target, smallest, backend)
        if violation(obs, key) is None:  # the shrink keeps only failing scenarios; a flaky target lands here
            return first
        final = finding_for(key, obs, "shrunk" if complete else "shrink-interrupted", first)
        write_encoder_finding(findings_dir, final)
        if final.id != first.id:
            remove_encoder_finding(findings_dir, first)
        return final

    drawn = [0]

    def out_of_time() -> bool:
        return time.monotonic() - start >= o.budget_s or bool(max_examples and drawn[0] >= max_examples)

    stopped: list[BaseException] = []

    def body(data: Any) -> None:
        # Drawn before the clock is read: Hypothesis requires the same draws for the same data.
        sc = data.draw(encoder_scenarios(ruleset=ruleset, cap=takes_cap))
        if out_of_time() or stopped:
            return  # the rest of this chunk's draws are skipped
        drawn[0] += 1
        result.scenarios += 1
        try:
            obs = observe_encoder(target, sc, backend)
        except TargetEnvironmentError as exc:  # cgsim's adapter, not the manager: stop, exit 2 outside Hypothesis
            stopped.append(exc)
            return
        if obs.refused is not None:
            result.refused += 1
            return
        for pid in obs.verdict.checked:
            result.checks[pid] = result.checks.get(pid, 0) + 1
        for key in dict.fromkeys((v.property, defect_of(obs, v)) for v in obs.verdict.violations):
            if key in found:
                continue
            first = finding_for(key, obs, "shrinking")
            write_encoder_finding(findings_dir, first)  # on disk, with its repro script, before the shrink starts
            found[key] = first
            if say is not None:
                say(f"found {key[0]} in {time.monotonic() - start:.1f}s: {first.message}")
            found[key] = shrink(key, obs.scenario, first)

    chunk = 0
    try:
        # Chunks of draws, each a Hypothesis run seeded from the campaign seed: repeatable with --seed.
        while not out_of_time() and not stopped:
            test = settings(max_examples=_CHUNK, deadline=None, database=None, phases=[Phase.generate],
                            suppress_health_check=list(HealthCheck))(
                hypothesis_seed(seed * 100_003 + chunk)(given(st.data())(body)))
            test()
            chunk += 1
    except KeyboardInterrupt:
        result.interrupted = True
    if stopped:
        raise stopped[0]
    return list(found.values())
