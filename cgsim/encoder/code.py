"""An encoder scenario as the constructor calls that make it (what a repro
script shows with ``--show-code``): Python that evaluates to the very
scenario (``tests/fuzz/test_encoder_campaign.py`` checks it), every config field
not at its default written out, and the plan its design gives the config as
a comment."""

from __future__ import annotations

import dataclasses

from cgsim.encoder.values import (
    EncoderConfig,
    EncoderItem,
    EncoderScenario,
    EncoderStep,
)

__all__ = ["IMPORT_LINE", "encoder_scenario_code"]

IMPORT_LINE = "from cgsim.encoder.values import EncoderConfig, EncoderItem, EncoderScenario, EncoderStep"


def _item(item: EncoderItem) -> str:
    return f"EncoderItem({item.frames}, {item.height}, {item.width}{', video=True' if item.video else ''})"


def _step(step: EncoderStep) -> str:
    if not step.items:
        return f"EncoderStep({step.kind!r})"
    items = ", ".join(_item(i) for i in step.items)
    return f"EncoderStep({step.kind!r}, ({items}{',' if len(step.items) == 1 else ''}))"


def _config(config: EncoderConfig) -> str:
    default = EncoderConfig()
    args = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
            if getattr(config, f.name) != getattr(default, f.name)]
    return f"EncoderConfig({', '.join(args)})"


def _plan(scenario: EncoderScenario) -> str:
    from cgsim.spec.encoder import EncoderConfigRefused, plan

    try:
        p = plan(scenario.config, scenario.ruleset)
    except EncoderConfigRefused as exc:
        return f"# the design {scenario.ruleset} refuses this config: {exc}"
    return (f"# the plan of design {scenario.ruleset}: budgets {list(p.budgets)}, max_batch_size {p.max_batch_size}, "
            f"max_frames_per_batch {p.max_frames_per_batch}")


def encoder_scenario_code(scenario: EncoderScenario) -> str:
    """Python source that builds ``scenario`` (the name ``scenario``)."""
    lines = [IMPORT_LINE, "", "scenario = EncoderScenario(", f"    {_config(scenario.config)},", "    ("]
    lines += [f"        {_step(s)}," for s in scenario.steps]
    lines.append("    ),")
    if scenario.ruleset != "encoder":
        lines.append(f"    ruleset={scenario.ruleset!r},")
    if scenario.seed:
        lines.append(f"    seed={scenario.seed!r},")
    lines += [")", _plan(scenario)]
    return "\n".join(lines)
