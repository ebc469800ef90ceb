"""The search a campaign's workers run for a target (``search_of_target``:
its family's ``cgsim.families.FamilySearch``: how its scenarios are drawn,
run and judged, read back from JSON, told apart and counted), and the decode
family's (``DECODE_SEARCH``).  The workers, the Ray actors and the parent
look it up by the campaign's target and never name a scenario type."""

from __future__ import annotations

from typing import Any

from cgsim.families import FamilySearch

__all__ = ["search_of_target", "DECODE_SEARCH"]


def search_of_target(name: str) -> FamilySearch:
    """The search of the family target ``name`` belongs to (``cgsim.families``)."""
    from cgsim.families import family_of_target, search_of_family

    return search_of_family(family_of_target(name))


def _decode_strategy(ruleset: str | None, target: str | None) -> Any:
    from fuzz.campaign.decode_scenarios import default_strategy

    return default_strategy(ruleset, target)


def _decode_observe(scenario: Any, target: str, backend: str, timeout_s: float | None, pipeline: Any) -> Any:
    from cgsim.observe import RUNNER, observe

    return observe(scenario, target, backend, timeout_s, pipeline if pipeline is not None else RUNNER)


def _decode_timeout(scenario: Any, timeout_s: float | None) -> float | None:
    from cgsim.observe import scenario_timeout

    return scenario_timeout(scenario, timeout_s)


def _decode_from_json(data: Any) -> Any:
    from cgsim.scenario import Scenario

    return Scenario.from_json(data)


def _decode_repeat_key(scenario: Any) -> tuple:
    """Config, ruleset and the kinds of the steps: the dispatch sweep judges
    every batch a config's scheduler can produce, so scenarios that differ
    only in their batches judge little the first did not."""
    return scenario.config, scenario.ruleset, tuple(step.kind for step in scenario.steps)


def _capture_size_range(largest: int) -> str:
    for lo, hi in ((1, 8), (9, 64), (65, 512), (513, 2048)):
        if lo <= largest <= hi:
            return f"{lo}-{hi}"
    return ">2048"


def _decode_coverage(scenario: Any) -> tuple[tuple[str, str], ...]:
    """Its ruleset, mode, capture-size range, config features, batch and
    step kinds, and where its batches came from (the engine's own
    scheduler, or cgsim's model of it)."""
    cfg = scenario.config
    pairs = [("rulesets", str(scenario.ruleset)), ("modes", cfg.mode.value),
             ("capture_size_ranges", _capture_size_range(max(cfg.capture_sizes)))]
    feats = [name for name, on in (
        ("breakable", cfg.breakable), ("varlen-decode", cfg.varlen_decode), ("spec-schedule", cfg.spec_schedule),
        ("speculative", cfg.decode_query_len > 1), ("lora", len(cfg.lora_cases) > 1),
        ("ubatches", cfg.num_ubatches > 1)) if on]
    pairs += [("config_features", f) for f in feats or ["plain"]]
    for step in scenario.steps:
        if step.batch is not None:
            pairs.append(("batch_kinds", str(step.batch.kind)))
        pairs.append(("step_kinds", str(step.kind)))
    pairs.append(("batch_sources", scenario.served.scheduler if scenario.served is not None else "model"))
    return tuple(pairs)


DECODE_SEARCH = FamilySearch("decode", _decode_strategy, _decode_observe, _decode_timeout, _decode_from_json,
                             _decode_repeat_key, _decode_coverage)

