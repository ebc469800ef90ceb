"""The encoder family's campaign search (``cgsim.families.FamilySearch``):
what the campaign's workers (``fuzz.campaign``) draw, run, judge and count
for an encoder target, as they do for every family.

A scenario is reached through the target's front door (refused: counted,
never judged), run on the backend and judged by every encoder property;
each violation is a finding of the scenario as the engine reached it, with
the launch that reaches it and the documented defect it is an instance of
(``known_defect``, the target's ``encoder.classify``)."""

from __future__ import annotations

import json
import time
from typing import Any

from cgsim.families import FamilySearch
from cgsim.finding import Finding
from cgsim.observe import Outcome

__all__ = ["ENCODER_SEARCH", "encoder_findings"]

_targets: dict[str, Any] = {}  # per process: the target of each name a worker ran


def _target(name: str) -> Any:
    if name not in _targets:
        from cgsim.encoder.targets import encoder_target

        _targets[name] = encoder_target(name)
    return _targets[name]


def _strategy(ruleset: str | None, target: str | None) -> Any:
    from cgsim.encoder.strategies import encoder_scenarios

    # A setting the engine has no field for is only ever refused: drawn where it exists.
    takes = _target(target).encoder.takes_max_token_budget if target is not None else None
    return encoder_scenarios(ruleset=ruleset or "encoder", cap=takes() if takes is not None else True)


def _observe(scenario: Any, target: str, backend: str, timeout_s: float | None, pipeline: Any) -> Outcome:
    from cgsim.backends import get_backend
    from cgsim.encoder.observe import observe_encoder

    start = time.perf_counter()
    t = _target(target)
    obs = observe_encoder(t, scenario, get_backend(backend))
    seconds = time.perf_counter() - start
    if obs.refused is not None:  # counted, never judged
        return Outcome(seconds=seconds, coverage=(("outcomes", "refused by the engine"),), unsupported=obs.refused)
    return Outcome(encoder_findings(t, obs, backend), tuple(obs.verdict.checked), seconds,
                   coverage=(("outcomes", "judged"),))


def encoder_findings(target: Any, obs: Any, backend: str) -> tuple[Finding, ...]:
    """Each violation of the observation ``obs`` of ``target`` as a finding:
    the scenario as the engine reached it, the launch that reaches it, the
    documented defect it is an instance of (``known_defect``)."""
    reached, short = obs.scenario.to_json(), obs.scenario.short()
    classify = target.encoder.classify
    findings = []
    for v in obs.verdict.violations:
        labels = dict(classify(obs.scenario, obs.trace, v)) if classify is not None else {}
        if obs.launch is not None:
            labels["launch"] = obs.launch
        findings.append(Finding.from_violation(v, reached, target.name, backend, short).with_(extra=labels))
    return tuple(findings)


def _timeout(scenario: Any, timeout_s: float | None) -> float | None:
    return timeout_s  # an encoder scenario's steps are few and small: no scaling


def _from_json(data: Any) -> Any:
    from cgsim.encoder.values import EncoderScenario

    return EncoderScenario.from_json(data)


def _repeat_key(scenario: Any) -> tuple:
    # No sweep judges a config's other batches here: only the same scenario is a repeat.
    return (json.dumps(scenario.to_json(), sort_keys=True),)


def _coverage(scenario: Any) -> tuple[tuple[str, str], ...]:
    """Its ruleset, the config's features, and its step kinds."""
    cfg = scenario.config
    pairs = [("rulesets", str(scenario.ruleset))]
    feats = [name for name, on in (
        ("token-budgets", bool(cfg.token_budgets)), ("max-items", bool(cfg.max_vision_items)),
        ("frames-per-batch", cfg.max_frames_per_batch is not None), ("cap", cfg.max_token_budget is not None),
        ("video", cfg.video), ("tensor-parallel", cfg.tp_size > 1), ("dp-encoder", cfg.dp_encoder)) if on]
    pairs += [("config_features", f) for f in feats or ["plain"]]
    pairs += [("step_kinds", step.kind) for step in scenario.steps]
    return tuple(pairs)


ENCODER_SEARCH = FamilySearch("encoder", _strategy, _observe, _timeout, _from_json, _repeat_key, _coverage)
