"""Run one Scenario on (target, backend) and judge it: the stage every job
shares (a campaign worker, ``fuzz replay``, a repro script, a benchmark).

Everything that went wrong becomes a ``Finding``: a violated property, and
what the harness sees around the run (the runner raised: NO-CRASH; the
backstop timer fired: NO-HANG; a property check raised: CHECK-CRASH).

``Pipeline`` is the seam for tests: anything with ``run`` (-> Trace) and
``judge`` (-> Verdict) will do; ``RUNNER`` is the real one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Protocol

from cgsim.backends import get_backend
from cgsim.config import AttentionSupport, ManagerConfig
from cgsim.finding import Finding
from cgsim.properties import Verdict, check_scenario
from cgsim.properties.harness import CHECK_CRASH, NO_CRASH, NO_HANG
from cgsim.properties.memory import graph_memory_by_manager
from cgsim.properties.registry import Violation
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario
from cgsim.spec.rulesets import Ruleset, UnknownRuleset, get_ruleset
from cgsim.targets.base import TargetEnvironmentError
from cgsim.text import reason_class
from cgsim.timeouts import ScenarioTimeout, deadline
from cgsim.trace import Sweep, Trace

__all__ = ["Pipeline", "RunnerPipeline", "RUNNER", "Outcome", "observe", "scenario_timeout", "backstop_timeout",
           "CUDA_POISON"]

# Text of errors after which a CUDA context is unusable: the worker must restart.
CUDA_POISON = ("CUDA error", "cudaError", "illegal memory access", "device-side assert", "CUBLAS_STATUS", "CUDNN_STATUS")


# Graphs a scenario may capture within one unscaled timeout (see scenario_timeout).
GRAPHS_PER_TIMEOUT = 24


def scenario_timeout(scenario: Scenario, timeout: float | None) -> float | None:
    """The per-scenario timeout, scaled with the work the scenario asks for.

    ``timeout`` is what a scenario of the usual size gets.  A config as
    engines run it captures hundreds of graphs (a 51-size ladder, two LoRA
    cases, FULL and PIECEWISE), and capturing them is slow, not hung: the
    limit grows with the graphs per capture step, so only a target that stops
    making progress is called hung.  The graphs counted are the spec's for the
    config and for its requested mode kept as requested: a target that keeps
    a mode the spec drops (vLLM before 0.30 keeps PIECEWISE without a
    piecewise runner, docs/findings.md #9, and runs all its "captures") has
    that work to do, and it is not a hang."""
    if not timeout:
        return timeout
    graphs = _graphs_per_capture(scenario.config, scenario.ruleset)
    captures = sum(1 for s in scenario.steps if s.kind == "capture")
    return timeout * max(1.0, graphs * max(1, captures) / GRAPHS_PER_TIMEOUT)


@lru_cache(maxsize=256)
def _graphs_per_capture(config: ManagerConfig, ruleset: str) -> int:
    """The larger of the spec's capture list for ``config`` and for its
    requested mode kept as requested, with its draft managers' lists where
    it has a draft model (the ruleset's ``draft_managers``; cached: the
    worker and the runner both ask, and an engine-sized config's list takes
    milliseconds)."""
    from cgsim.spec import expected_capture_descs  # noqa: PLC0415

    def graphs_of(c: ManagerConfig) -> int:
        try:
            return sum(len(d) for d in expected_capture_descs(c, ruleset).values())
        except Exception:  # noqa: BLE001 - a rejected config captures nothing
            return 0

    graphs = graphs_of(config)
    if config.attention_support != AttentionSupport.ALWAYS or not config.piecewise_available:
        try:
            as_requested = replace(config, attention_support=AttentionSupport.ALWAYS, compiled_piecewise=True)
        except Exception:  # noqa: BLE001 - no such variant: the config's own count
            return graphs
        graphs = max(graphs, graphs_of(as_requested))
    if config.decode_query_len > 1:
        graphs *= 1 + _draft_managers(ruleset)  # the draft model's managers capture too
    return graphs


def _draft_managers(ruleset: str) -> int:
    try:
        return get_ruleset(ruleset).draft_managers
    except UnknownRuleset:
        return Ruleset.draft_managers


def backstop_timeout(timeout: float | None) -> float | None:
    """The looser timer around a whole run, for a runner that does not stop itself."""
    return None if not timeout else timeout * 1.5 + 1.0


class Pipeline(Protocol):
    def run(self, scenario: Scenario, target: str, backend: str, timeout: float | None) -> Trace: ...
    def judge(self, scenario: Scenario, trace: Trace) -> Verdict: ...


class RunnerPipeline:
    """cgsim's runner and property catalogue."""

    def run(self, scenario: Scenario, target: str, backend: str, timeout: float | None) -> Trace:
        return run_scenario(scenario, target=target, backend=backend, timeout=timeout)

    def judge(self, scenario: Scenario, trace: Trace) -> Verdict:
        return check_scenario(scenario, trace)


RUNNER = RunnerPipeline()


@dataclass(frozen=True)
class Outcome:
    findings: tuple[Finding, ...] = ()
    checked: tuple[str, ...] = ()
    seconds: float = 0.0
    # The target may have left process-wide state unusable (a hang interrupted
    # mid-step, a poisoned CUDA context): the worker should restart.
    needs_restart: bool = False
    # (dimension, value) pairs for the campaign's coverage section: how each
    # dispatch sweep after a capture covered the schedulable batches, and
    # what each manager's graph pools reserved after each capture.
    coverage: tuple[tuple[str, str], ...] = ()
    # The target refused the scenario (the engine would not be started with
    # its settings, or cannot be driven through its lifecycle): nothing ran.
    unsupported: str | None = None

    @property
    def properties(self) -> list[str]:
        return list(dict.fromkeys(f.property for f in self.findings))

    def first(self, prop: str) -> Finding | None:
        return next((f for f in self.findings if f.property == prop), None)


def _bytes_range(n: int) -> str:
    """The range of graph memory ``n`` bytes falls in, for the coverage counts."""
    for hi, label in ((4 << 10, "< 4 KiB"), (64 << 10, "4-64 KiB"), (1 << 20, "64 KiB-1 MiB")):
        if n < hi:
            return label
    return ">= 1 MiB"


def observe(scenario: Scenario, target: str, backend: str, timeout: float | None = None,
            pipeline: Pipeline = RUNNER) -> Outcome:
    """Run one scenario and say what went wrong, if anything.

    The runner enforces ``timeout`` (scaled by ``scenario_timeout``) itself: a
    hang becomes an Error event; a looser timer here is the backstop for a
    run that does not return.
    """
    start = time.perf_counter()
    timeout = scenario_timeout(scenario, timeout)
    scenario_json = scenario.to_json()
    short = scenario.short()

    def finding(prop: str, message: str, step: int | None = None, facts: tuple = ()) -> Finding:
        return Finding.from_violation(Violation(prop, message, step, facts), scenario_json, target, backend, short)

    def outcome(findings: list[Finding], checked: tuple[str, ...] = (), restart: bool = False) -> Outcome:
        return Outcome(tuple(findings), checked, time.perf_counter() - start, restart)

    backstop = backstop_timeout(timeout)
    try:
        with deadline(backstop, f"scenario did not finish within {backstop:g}s" if backstop else ""):
            trace = pipeline.run(scenario, target, backend, timeout)
    except ScenarioTimeout as exc:
        return outcome([finding(NO_HANG, str(exc))], restart=True)
    except TargetEnvironmentError:
        raise  # a broken environment is never a finding
    except Exception as exc:  # the runner records target bugs itself; this is a last line
        msg = f"{type(exc).__name__}: {exc}"
        return outcome([finding(NO_CRASH, f"run_scenario raised {msg}", facts=(("raised", msg),))],
                       restart=backend == "cuda" and any(p in msg for p in CUDA_POISON))
    try:
        verdict = pipeline.judge(scenario, trace)
    except Exception as exc:
        return outcome([finding(CHECK_CRASH, f"a property check raised {type(exc).__name__}: {exc}")])
    # Every property this scenario violates, on each of its findings: a
    # report shows them as one defect (cgsim.report.defects).
    violates = sorted({v.property for v in verdict.violations})
    findings = [Finding.from_violation(v, scenario_json, target, backend, short).with_(extra={"violates": violates})
                for v in verdict.violations]
    errors = trace.errors
    # A failed capture on a GPU may leave the context unable to capture again:
    # a fresh process.  On the mock the process is clean (targets forget their
    # own capture state, base.py rule 6), and restarting there would cut the
    # shrink of every campaign whose target fails captures often.
    capture_failed = any(e.phase == "capture" and e.error != "corrupt" for e in errors)
    restart = any(e.error == "timeout" for e in errors) or (
        capture_failed and get_backend(backend).capture_failure_poisons) or (
        backend == "cuda" and any(any(p in f"{e.exc_type} {e.message}" for p in CUDA_POISON) for e in errors))
    covered = tuple(("dispatch_sweeps", e.coverage) for e in trace.of(Sweep) if e.captured_flag)
    covered += tuple(("graph_memory", f"{name}: {_bytes_range(held)}") for name, held in graph_memory_by_manager(trace))
    if trace.unsupported:
        covered += (("not_reachable", reason_class(trace.unsupported)),)
    return Outcome(tuple(findings), verdict.checked, time.perf_counter() - start, restart, covered, trace.unsupported)
