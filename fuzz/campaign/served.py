"""The campaign's runner share: scenarios served end to end through the
engine's own model runner.

The search judges the manager on a target's fast tier; paths only the
engine's runner takes (its input preparation and padding, the attention
metadata it builds, its draft managers) run here.  After the search, a
target that can serve (the optional hook ``triage.serve_scenarios``) is given
scenarios drawn from the campaign's own strategy and seed, one per distinct
launch, those the engine can be started with; each launch's requests are
served with CUDA graphs and eager, and a difference is a SERVED-EQUALS-EAGER
finding (``cgsim.served``), written to disk the moment it is judged.  A
stopped campaign skips the phase; a stop during it ends it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, TextIO

from cgsim.text import first_line

__all__ = ["served_phase", "served_budget", "draw_served", "DRAWN", "ServedShare"]

# The phase takes a quarter of the search's budget, within these bounds: a
# served pair (graphs and eager) of a small launch takes ~40 s on 2 cores.
SHARE, MIN_BUDGET_S, MAX_BUDGET_S = 0.25, 120.0, 600.0
DRAWN = 40  # scenarios drawn to find distinct launches among


@dataclass(frozen=True)
class ServedShare:
    """What the runner share did: the report's notes, how many launches
    SERVED-EQUALS-EAGER judged (served with graphs and eager) and found
    differing, counted into the summary as the search's workers' checks are,
    how many the budget left unserved, why the others were not served
    here (reason, count), and the seconds each served pair took."""

    notes: tuple[str, ...] = ()
    served: int = 0
    differ: int = 0
    unserved: int = 0
    not_served: tuple[tuple[str, int], ...] = ()
    seconds: tuple[float, ...] = ()

    def stats(self) -> dict:
        """A worker-snapshot-shaped count (cgsim.report.summary.totals); the
        launches it drew also as the coverage dimensions ``runner_share``
        and ``runner_share_not_served`` (by reason)."""
        from cgsim.properties.lifecycle import SERVED_EQUALS_EAGER  # noqa: PLC0415

        out: dict = {"checks": {SERVED_EQUALS_EAGER: self.served} if self.served else {},
                     "failures": {SERVED_EQUALS_EAGER: self.differ} if self.differ else {}}
        not_served = sum(n for _, n in self.not_served)
        if self.served or self.unserved or not_served:
            out["coverage"] = {"runner_share": {"served": self.served, "differ": self.differ,
                                                "unserved_budget": self.unserved, "not_served": not_served}}
            if self.not_served:
                out["coverage"]["runner_share_not_served"] = dict(self.not_served)
        return out


def served_budget(search_budget_s: float) -> float:
    return min(MAX_BUDGET_S, max(MIN_BUDGET_S, SHARE * search_budget_s))


def draw_served(target_name: str, ruleset: str | None, seed: int, limit: int) -> list[Any]:
    """Up to ``limit`` scenarios of the campaign's strategy (its target and
    ruleset, drawn from ``seed``), one per distinct launch, each one the
    engine is started with and whose lifecycle a user reaches; the cheapest
    to serve first."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    from cgsim.modes import CUDAGraphMode
    from cgsim.targets import get_target
    from cgsim.targets.base import TargetUnsupported
    from fuzz.campaign.search import search_of_target

    target = get_target(target_name)
    launch, unreachable = target.triage.launch, target.drawing.unreachable
    drawn: list[Any] = []

    @with_seed(seed)
    @settings(max_examples=DRAWN, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(search_of_target(target_name).strategy(ruleset, target_name))
    def collect(scenario: Any) -> None:
        drawn.append(scenario)

    collect()
    chosen: dict[str, Any] = {}
    for scenario in drawn:
        if len(chosen) >= limit:
            break
        if unreachable is not None and unreachable(scenario) is not None:
            continue
        if scenario.config.mode == CUDAGraphMode.NONE:  # no graphs: it would be served eager twice
            continue
        try:
            key = json.dumps(launch(scenario), sort_keys=True)
        except TargetUnsupported:
            continue
        chosen.setdefault(key, scenario)
    # Cheapest first: a short share serves something rather than running out inside its first launch.
    return sorted(chosen.values(), key=_serving_cost)


def _serving_cost(scenario: Any) -> tuple:
    """What serving a launch costs grows with its draft steps (a draft model
    runs beside the target's) and with the graphs it captures."""
    c = scenario.config
    return (c.decode_query_len, len(c.capture_sizes), max(c.capture_sizes, default=0))


def _span(seconds: list[float]) -> str:
    low, high = min(seconds), max(seconds)
    return f"{low:.0f}" if round(low) == round(high) else f"{low:.0f}-{high:.0f}"


def served_phase(target_name: str, backend: str, ruleset: str | None, seed: int, findings_dir: str, jobs: int,
                 stopped: Callable[[], bool], err: TextIO, quiet: bool, budget_s: float = MIN_BUDGET_S) -> ServedShare:
    """Serve scenarios of the campaign's strategy through the target's hook,
    ``jobs`` at a time within ``budget_s``; write each difference found as a
    finding into ``findings_dir``; what was judged, and the report's notes."""
    from cgsim.report.findings import FindingStore
    from cgsim.report.repro import write_repro
    from cgsim.served import served_finding
    from cgsim.targets import get_target

    triage = get_target(target_name).triage
    serve, launch = triage.serve_scenarios, triage.launch
    classify = triage.classify  # which documented defect a difference is, as the workers record
    if serve is None or stopped():
        return ServedShare()
    # A serving child's torch keeps two cores busy: more at once only slows each past its budget.
    jobs = max(1, min(jobs, (os.cpu_count() or 2) // 2))
    try:
        scenarios = draw_served(target_name, ruleset, seed, limit=4 * jobs)
        if not scenarios:
            return ServedShare(("runner share: no drawn scenario has a launch the engine starts with",))
        if not quiet:
            err.write(f"serving up to {len(scenarios)} launch(es) through the engine's own model runner "
                      f"({jobs} at a time, {budget_s:.0f} s)...\n")
            err.flush()
        results = serve(scenarios, jobs, stopped, budget_s)
    except Exception as exc:  # noqa: BLE001 - the search's findings stand; the note says why this share has none
        return ServedShare((f"runner share failed ({type(exc).__name__}: {first_line(exc, 200)}); nothing was served",))
    store = FindingStore(findings_dir, repro=write_repro)
    served = differ = 0
    seconds: list[float] = []
    errors: dict[str, int] = {}
    for scenario, result in zip(scenarios, results):
        if result is None:
            continue
        if "error" in result:
            errors[result["error"]] = errors.get(result["error"], 0) + 1
            continue
        if result["graphs"].get("raised") and result["eager"].get("raised"):
            # Nothing about graphs: vLLM raised eager too (a launch, or a tree, the toy cannot serve).
            why = f"vLLM raised with graphs and eager alike: {first_line(result['eager']['raised'], 200)}"
            errors[why] = errors.get(why, 0) + 1
            continue
        served += 1
        if "seconds" in result:
            seconds.append(float(result["seconds"]))
        # The launch the target served, where it says (it may serve another than the search's, vLLM's DFlash).
        finding = served_finding(target_name, backend, scenario, result, result.get("launch") or launch(scenario))
        if finding is None:
            continue
        if classify is not None:
            finding = finding.with_(extra=classify(finding))
        differ += 1
        try:
            store.put(finding)
        except OSError as exc:  # a full disk: what was written stays
            return ServedShare((f"runner share: finding {finding.id} could not be written ({exc})",), served, differ)
    unserved = len(scenarios) - served - sum(errors.values())
    notes = [f"runner share: {served} launch(es) served with graphs and eager, {differ} differ"
             + (f", {unserved} left unserved by the budget" if unserved else "")
             + (f" (a pair took {_span(seconds)} s)" if seconds else "")]
    notes += [f"runner share: {n} launch(es) not served here: {why}" for why, n in sorted(errors.items())]
    return ServedShare(tuple(notes), served, differ, unserved, tuple(sorted(errors.items())), tuple(seconds))
