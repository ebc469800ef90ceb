"""A Scenario as the builder calls that make it: what a repro script and a
report show beside the JSON.  Every config field that is not at its default
is written out (``compiled_piecewise=False`` is often what decides the
mode), each engine's options as its options type built with the fields not
at their defaults, and a last comment says which mode the requested one
resolves to.

The text is Python that builds an equal Scenario (``exec`` it with the
names it imports); it is generated from validated values only (whole
numbers, mode and support names, booleans, a ruleset name).
"""

from __future__ import annotations

import enum
from dataclasses import MISSING, fields, is_dataclass

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.scenario import Scenario, Step

__all__ = ["scenario_code", "mode_resolution"]

_DEFAULT_CONFIG = ManagerConfig()
_DEFAULT_BATCH = {f.name: f.default for f in fields(Batch)}


def _value(v: object) -> str:
    if isinstance(v, enum.Enum):  # a mode or support level: its name, which the config parses
        return repr(v.name)
    if isinstance(v, (tuple, list)):
        inner = ", ".join(_value(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if is_dataclass(v) and not isinstance(v, type):  # an engine's options value
        changed = [f"{f.name}={_value(getattr(v, f.name))}" for f in fields(v)
                   if f.default is MISSING or getattr(v, f.name) != f.default]
        return f"{type(v).__name__}({', '.join(changed)})"
    return repr(v)


def _config_args(config: ManagerConfig) -> list[str]:
    args = []
    for f in fields(ManagerConfig):
        value = getattr(config, f.name)
        if f.name == "max_capture_size" and value == max(config.capture_sizes):
            continue  # derived: max(capture_sizes)
        if value != getattr(_DEFAULT_CONFIG, f.name):
            args.append(f"{f.name}={_value(value)}")
    return args


def _batch_call(batch: Batch) -> str:
    extra = [f"{name}={_value(getattr(batch, name))}" for name in ("num_active_loras", "num_ubatches", "has_prefill")
             if getattr(batch, name) != _DEFAULT_BATCH[name]]
    return f"Batch({', '.join([_value(batch.query_lens)] + extra)})"


def _step_call(step: Step) -> str:
    return f"Step.dispatch({_batch_call(step.batch)})" if step.batch is not None else f"Step.{step.kind}()"


def mode_resolution(scenario: Scenario) -> str:
    """"requested X resolves to Y under RULESET", or why the design refuses
    the config."""
    from cgsim.modes import ModeResolutionError
    from cgsim.spec import get_ruleset, resolved_mode
    from cgsim.spec.rulesets import RulesetRejects

    requested = scenario.config.mode.name
    try:
        resolved = resolved_mode(get_ruleset(scenario.ruleset).effective_config(scenario.config)).name
    except (ModeResolutionError, RulesetRejects) as exc:
        return f"requested {requested}: refused under {scenario.ruleset} ({exc})"
    same = " (as requested)" if resolved == requested else f" (requested {requested})"
    return f"resolved mode {resolved}{same} under ruleset {scenario.ruleset}"


def scenario_code(scenario: Scenario) -> str:
    """Python that builds ``scenario``, every non-default field written out,
    and its resolved mode as a comment."""
    options_imports = [f"from {type(v).__module__} import {type(v).__name__}" for v in scenario.config.engine_options]
    lines = ["from cgsim.config import ManagerConfig",
             *options_imports,
             "from cgsim.descriptors import Batch",
             "from cgsim.scenario import Scenario, Step",
             "",
             "scenario = Scenario(",
             "    ManagerConfig("]
    lines += [f"        {arg}," for arg in _config_args(scenario.config)]
    lines += ["    ),",
              "    ("]
    lines += [f"        {_step_call(step)}," for step in scenario.steps]
    lines.append("    ),")
    lines.append(f"    ruleset={scenario.ruleset!r},")
    if scenario.workload != "toy":
        lines.append(f"    workload={scenario.workload!r},")
    if scenario.seed:
        lines.append(f"    seed={scenario.seed!r},")
    lines.append(")")
    lines.append(f"# {mode_resolution(scenario)}")
    if scenario.served is not None:
        # The steps replay as they are; their origin stays in the scenario's JSON.
        lines.append(f"# the dispatch steps: what {scenario.served.short()} under `{scenario.served.launch}`")
    return "\n".join(lines)
