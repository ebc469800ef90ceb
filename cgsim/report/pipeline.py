"""The one pipeline, seen from a campaign or a repro: run a Scenario on
(target, backend), check the properties, and turn everything that went wrong
(a violated property, an exception, a hang) into a list of observations.

``Pipeline`` is the seam: the default one imports cgsim's runner, properties
and targets lazily; tests pass small stand-ins.  Everything here is plain
cgsim (no Hypothesis), so a repro script can use it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cgsim.report.findings import HARNESS_PROPERTIES
from cgsim.timeouts import ScenarioTimeout, deadline

__all__ = [
    "Pipeline",
    "Observation",
    "Outcome",
    "ScenarioTimeout",
    "PipelineUnavailable",
    "scenario_timer",
    "observe",
]


class PipelineUnavailable(RuntimeError):
    """A part of the pipeline is not installed (yet) or cannot start."""


@dataclass(frozen=True)
class Observation:
    property: str
    message: str
    step: int | None = None
    kind: str = "violation"  # violation | crash | hang | corrupt


@dataclass
class Outcome:
    observations: list[Observation] = field(default_factory=list)
    checked: tuple[str, ...] = ()
    seconds: float = 0.0
    # The target may have left process-wide state unusable (a hang interrupted
    # mid-step, a poisoned CUDA context): the worker should restart.
    needs_restart: bool = False

    @property
    def properties(self) -> list[str]:
        seen: list[str] = []
        for o in self.observations:
            if o.property not in seen:
                seen.append(o.property)
        return seen

    def first(self, prop: str) -> Observation | None:
        return next((o for o in self.observations if o.property == prop), None)


class Pipeline:
    """The default pipeline: cgsim.runner, cgsim.properties, cgsim.targets."""

    def _mod(self, name: str) -> Any:
        import importlib

        try:
            return importlib.import_module(name)
        except ImportError as exc:
            raise PipelineUnavailable(f"{name} cannot be imported ({exc}); is this cgsim complete?") from None

    # -- validation (before any worker starts) ---------------------------------
    def check_target(self, name: str) -> None:
        targets = self._mod("cgsim.targets")
        targets.get_target(name)  # raises UnknownTarget

    def check_backend(self, name: str) -> None:
        if name not in ("mock", "cuda"):
            raise ValueError(f"unknown backend {name!r}; choose mock or cuda")
        backends = self._mod("cgsim.backends")
        getter = getattr(backends, "get_backend", None)
        if getter is not None:
            getter(name)  # raises BackendUnavailable (e.g. cuda without a GPU)
        elif name == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise PipelineUnavailable("--backend cuda needs a CUDA GPU and torch.cuda.is_available() is False")

    def check_ruleset(self, name: str) -> None:
        from cgsim.spec import get_ruleset

        get_ruleset(name)

    def target_names(self) -> list[str]:
        return list(self._mod("cgsim.targets").target_names())

    def mutants(self) -> dict[str, str]:
        mutants = self._mod("cgsim.targets.mutants").MUTANTS
        return {name: _first_sentence(cls.__doc__ or "") for name, cls in mutants.items()}

    def properties(self) -> dict[str, str]:
        props = self._mod("cgsim.properties").PROPERTIES
        return {pid: getattr(p, "statement", "") for pid, p in props.items()}

    # -- the pipeline -----------------------------------------------------------
    def strategy(self, ruleset: str | None) -> Any:
        strategies = self._mod("fuzz.strategies")
        return strategies.scenarios(ruleset=ruleset)

    def run(self, scenario: Any, target: str, backend: str, timeout: float | None = None) -> Any:
        return self._mod("cgsim.runner").run_scenario(scenario, target=target, backend=backend, timeout=timeout)

    def check(self, scenario: Any, trace: Any) -> Any:
        return self._mod("cgsim.properties").check_scenario(scenario, trace)

    def statement(self, prop: str) -> str:
        if prop in HARNESS_PROPERTIES:
            return HARNESS_PROPERTIES[prop]
        try:
            return self.properties().get(prop, "")
        except Exception:
            return ""


def _first_sentence(doc: str) -> str:
    para = " ".join(doc.strip().split("\n\n")[0].split())
    end = para.find(". ")
    return para if end < 0 else para[: end + 1]


def scenario_timer(seconds: float | None):
    """The backstop timer around a pipeline run (see cgsim.timeouts)."""
    return deadline(seconds, f"scenario did not finish within {seconds:g}s" if seconds else "")


_ERROR_KIND_TO_PROPERTY = {"crash": "TARGET-CRASH", "timeout": "TARGET-HANG", "corrupt": "TARGET-CORRUPT"}
_CUDA_POISON = ("CUDA error", "cudaError", "illegal memory access", "device-side assert", "CUBLAS_STATUS", "CUDNN_STATUS")


def observe(pipeline: Pipeline, scenario: Any, target: str, backend: str, timeout: float | None = None) -> Outcome:
    """Run one scenario and say what went wrong, if anything.

    The runner enforces ``timeout`` itself (a hang becomes an Error event);
    a second, looser timer here is the backstop for a runner that does not.
    A hang is reported as TARGET-HANG rather than as the NO-CRASH violation
    the properties derive from it: it is a different bug from a raise, and it
    is not shrunk (each attempt would cost a timeout).
    """
    start = time.perf_counter()
    out = Outcome()
    backstop = None if not timeout else timeout * 1.5 + 1.0
    try:
        with scenario_timer(backstop):
            trace = pipeline.run(scenario, target, backend, timeout)
    except ScenarioTimeout as exc:
        out.observations.append(Observation("TARGET-HANG", str(exc), None, "hang"))
        out.needs_restart = True
        out.seconds = time.perf_counter() - start
        return out
    except Exception as exc:  # the runner records target bugs itself; this is a last line
        msg = f"{type(exc).__name__}: {exc}"
        out.observations.append(Observation("TARGET-CRASH", f"run_scenario raised {msg}", None, "crash"))
        out.needs_restart = backend == "cuda" and any(p in msg for p in _CUDA_POISON)
        out.seconds = time.perf_counter() - start
        return out
    try:
        verdict = pipeline.check(scenario, trace)
    except Exception as exc:
        out.observations.append(
            Observation("CHECK-CRASH", f"check_scenario raised {type(exc).__name__}: {exc}", None, "crash")
        )
        out.seconds = time.perf_counter() - start
        return out
    out.checked = tuple(getattr(verdict, "checked", ()) or ())
    errors = [e for e in getattr(trace, "events", ()) if getattr(e, "kind", None) == "error"]
    hangs = [e for e in errors if getattr(e, "error", "") == "timeout"]
    hang_steps = {getattr(e, "step", None) for e in hangs}
    for v in getattr(verdict, "violations", ()) or ():
        if hangs and v.property == "NO-CRASH" and getattr(v, "step", None) in hang_steps:
            continue  # reported as TARGET-HANG below
        out.observations.append(Observation(v.property, v.message, getattr(v, "step", None), "violation"))
    for e in hangs[:1]:
        out.observations.append(
            Observation("TARGET-HANG", f"hung during {e.phase} at step {e.step}: {e.message}", e.step, "hang")
        )
        out.needs_restart = True
    if not out.observations:
        # Errors no property claimed (a checker without NO-CRASH): still findings.
        for e in errors:
            prop = _ERROR_KIND_TO_PROPERTY.get(getattr(e, "error", ""), None)
            if prop is None or out.first(prop) is not None:
                continue
            kind = {"TARGET-CRASH": "crash", "TARGET-HANG": "hang", "TARGET-CORRUPT": "corrupt"}[prop]
            out.observations.append(
                Observation(prop, f"{e.error} in {e.phase} at step {e.step}: {e.exc_type}: {e.message}", e.step, kind)
            )
    if backend == "cuda" and any(
        any(p in f"{getattr(e, 'exc_type', '')} {getattr(e, 'message', '')}" for p in _CUDA_POISON) for e in errors
    ):
        out.needs_restart = True
    out.seconds = time.perf_counter() - start
    return out
