"""Scenario: the unit of work every job runs (a pytest example, a campaign
scenario, a repro script).  A JSON-serialisable value with a schema version."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cgsim.config import ConfigError, ManagerConfig
from cgsim.descriptors import Batch
from cgsim.spec.rulesets import DEFAULT_RULESET, get_ruleset
from cgsim.spec.scheduler import why_unschedulable

__all__ = ["SCHEMA_VERSION", "Step", "Served", "Scenario", "ScenarioError", "STEP_KINDS"]

SCHEMA_VERSION = 1
STEP_KINDS = ("capture", "dispatch", "release")


class ScenarioError(ValueError):
    """A Scenario (or its JSON) is malformed; the message says where and how to fix it."""


@dataclass(frozen=True)
class Step:
    """``capture`` (capture all graphs), ``dispatch`` (dispatch ``batch`` and run
    it: replay, piecewise or eager) or ``release`` (drop the graphs)."""

    kind: str
    batch: Batch | None = None

    def __post_init__(self) -> None:
        if self.kind not in STEP_KINDS:
            raise ScenarioError(f"step kind {self.kind!r} is unknown; use one of {', '.join(STEP_KINDS)}")
        if (self.kind == "dispatch") != (self.batch is not None):
            raise ScenarioError(f"a {self.kind!r} step {'needs' if self.kind == 'dispatch' else 'takes no'} batch")

    @classmethod
    def capture(cls) -> "Step":
        return cls("capture")

    @classmethod
    def release(cls) -> "Step":
        return cls("release")

    @classmethod
    def dispatch(cls, batch: Batch) -> "Step":
        return cls("dispatch", batch)

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind}
        if self.batch is not None:
            out["batch"] = self.batch.to_json()
        return out

    def short(self) -> str:
        return self.kind if self.batch is None else f"dispatch {self.batch.short()}"


@dataclass(frozen=True)
class Served:
    """Where a served scenario's dispatch steps come from: the batches the
    engine's own scheduler (``scheduler``, a class name) scheduled, in order,
    for a request trace (``requests``, canonical JSON) under ``launch`` (the
    command line, with the settings only the scheduler reads).  ``scheduled``
    counts its batches; a run of identical neighbours is one step, and a
    stream longer than a scenario holds keeps its first batches."""

    scheduler: str
    launch: str
    requests: str
    scheduled: int

    def to_json(self) -> dict:
        return {"scheduler": self.scheduler, "launch": self.launch, "requests": json.loads(self.requests),
                "scheduled": self.scheduled}

    @classmethod
    def from_json(cls, data: Any) -> "Served":
        if not isinstance(data, dict):
            raise ScenarioError("a scenario's 'served' must be an object with scheduler, launch, requests, scheduled")
        return cls(str(data["scheduler"]), str(data["launch"]), json.dumps(data["requests"], sort_keys=True),
                   int(data["scheduled"]))

    def short(self) -> str:
        count = len(json.loads(self.requests).get("requests", ()))
        return f"served by {self.scheduler}: {count} requests, {self.scheduled} batches"


@dataclass(frozen=True)
class Scenario:
    config: ManagerConfig
    steps: tuple[Step, ...]
    ruleset: str = DEFAULT_RULESET
    workload: str = "toy"
    seed: int = 0
    # Set where the dispatch steps are what the engine's scheduler scheduled (None: drawn from the model).
    served: Served | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        get_ruleset(self.ruleset)  # fail early on an unknown ruleset
        # Batches must be ones the scheduler can produce for this config.
        for i, step in enumerate(self.steps):
            why = why_unschedulable(self.config, step.batch) if step.batch is not None else None
            if why is not None:
                raise ScenarioError(f"step {i}: {why}")

    @property
    def batches(self) -> list[Batch]:
        return [s.batch for s in self.steps if s.batch is not None]

    def to_json(self) -> dict:
        out = {
            "schema_version": SCHEMA_VERSION,
            "ruleset": self.ruleset,
            "workload": self.workload,
            "seed": self.seed,
            "config": self.config.to_json(),
            "steps": [s.to_json() for s in self.steps],
        }
        if self.served is not None:
            out["served"] = self.served.to_json()
        return out

    def dumps(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_json(), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, data: Any) -> "Scenario":
        if not isinstance(data, dict):
            raise ScenarioError("a scenario must be a JSON object with config, ruleset and steps")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ScenarioError(
                f"scenario schema_version is {version!r}, this cgsim reads version {SCHEMA_VERSION}; "
                "regenerate the scenario with this cgsim or install the cgsim that wrote it"
            )
        try:
            config = ManagerConfig.from_json(data["config"])
            steps = []
            for i, raw in enumerate(data["steps"]):
                if not isinstance(raw, dict) or "kind" not in raw:
                    raise ScenarioError(f"step {i} must be an object with a 'kind'")
                batch = Batch.from_json(raw["batch"]) if raw.get("batch") is not None else None
                steps.append(Step(raw["kind"], batch))
            return cls(
                config=config,
                steps=tuple(steps),
                ruleset=data.get("ruleset", DEFAULT_RULESET),
                workload=data.get("workload", "toy"),
                seed=int(data.get("seed", 0)),
                served=Served.from_json(data["served"]) if data.get("served") is not None else None,
            )
        except KeyError as exc:
            raise ScenarioError(f"scenario JSON lacks the field {exc.args[0]!r}") from None
        except ConfigError as exc:
            raise ScenarioError(f"scenario config is invalid: {exc}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ScenarioError):
                raise
            raise ScenarioError(f"scenario JSON is malformed: {exc}") from None

    @classmethod
    def loads(cls, text: str) -> "Scenario":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
        return cls.from_json(data)

    def short(self) -> str:
        served = f", {self.served.short()}" if self.served is not None else ""
        return (f"Scenario({self._mode_label()}, sizes={list(self.config.capture_sizes)}, ruleset={self.ruleset}, "
                f"steps={[s.short() for s in self.steps]}{served})")

    def _mode_label(self) -> str:
        """The requested mode, and what it resolves to where that differs
        (a field the short form leaves out, e.g. compiled_piecewise, decides it)."""
        from cgsim.modes import ModeResolutionError
        from cgsim.spec import resolved_mode
        from cgsim.spec.rulesets import RulesetRejects

        requested = self.config.mode.value
        try:
            resolved = resolved_mode(get_ruleset(self.ruleset).effective_config(self.config)).value
        except (ModeResolutionError, RulesetRejects):
            return requested
        return requested if resolved == requested else f"{requested}->{resolved}"
