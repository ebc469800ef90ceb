"""A Hypothesis RuleBasedStateMachine over the manager lifecycle: capture,
dispatch + replay, release, recapture.  Its invariant is the whole property
catalogue.

Each rule re-runs the scenario so far from scratch rather than stepping a live
manager: the runner stays single-pass and the trace the invariant judges is
exactly what a repro script of the same steps would produce.
"""

from __future__ import annotations

import os

from hypothesis import event, strategies as st, target
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cgsim.properties import check_scenario
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step
from fuzz.strategies import RULESET_NAMES, batches, configs

__all__ = ["LifecycleMachine", "settings_target", "settings_backend", "settings_ruleset"]


def settings_target() -> str:
    return os.environ.get("CGSIM_TARGET", "reference")


def settings_backend() -> str:
    return os.environ.get("CGSIM_BACKEND", "mock")


def settings_ruleset() -> str | None:
    return os.environ.get("CGSIM_RULESET") or None


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.scenario: Scenario | None = None
        self.captured = False
        self.events_seen = 0

    @initialize(config=configs(max_size=32), ruleset=st.sampled_from(RULESET_NAMES))
    def setup(self, config, ruleset):
        ruleset = settings_ruleset() or ruleset
        self.scenario = Scenario(config=config, steps=(), ruleset=ruleset)
        event(f"mode={config.mode.value}")
        event(f"ruleset={ruleset}")

    def _extend(self, step: Step) -> None:
        assert self.scenario is not None
        self.scenario = Scenario(self.scenario.config, self.scenario.steps + (step,), self.scenario.ruleset,
                                 self.scenario.workload, self.scenario.seed)

    # Capturing over live graphs is a caller error in every manager (vLLM asserts):
    # the lifecycle is capture, serve, release, capture again.
    @precondition(lambda self: not self.captured)
    @rule()
    def capture(self):
        self._extend(Step.capture())
        self.captured = True

    @rule(data=st.data())
    def dispatch_and_replay(self, data):
        assert self.scenario is not None
        batch = data.draw(batches(self.scenario.config))
        event(f"batch={batch.kind}")
        self._extend(Step.dispatch(batch))

    @precondition(lambda self: self.captured)
    @rule()
    def release(self):
        self._extend(Step.release())
        self.captured = False

    @invariant()
    def properties_hold(self):
        if self.scenario is None or not self.scenario.steps:
            return
        trace = run_scenario(self.scenario, settings_target(), settings_backend(), timeout=600)
        verdict = check_scenario(self.scenario, trace)
        self.events_seen = len(trace.events)
        for pid in verdict.checked:
            event(f"checked={pid}")
        assert verdict.ok, "\n".join(f"{v.property}: {v.message}" for v in verdict.violations)

    def teardown(self):
        # Steer towards long lifecycles (target() may be called once per example).
        target(float(self.events_seen), label="trace events")
