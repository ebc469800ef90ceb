"""SPEC §4 as pure functions of one run: (Scenario, Trace) -> violations.

Each property is declared once, in the module of its family (``init``,
``capture``, ``metadata``, ``dispatch``, ``lifecycle``, ``memory``, ``harness``), with
``cgsim.properties.registry.declare``: an id from SPEC §4, a one-line
statement, a check over the ``RunView`` of the run and an ``applies``
predicate that says whether the run gave it anything to judge.  Checks read
only the Scenario, the Trace and the executable spec (``cgsim.spec``) under
the scenario's ruleset; they never import torch, a target or the runner.

Adding a property touches one family module (and its tests): the registry,
``check_scenario``, reports and ``fuzz list`` pick it up from there.
A ruleset may replace or waive a universal property (``Ruleset.replaces`` /
``waives``): ``check_scenario`` then does not judge it under that ruleset.
A property of one engine's design (``declare(..., engine=...)``) is judged
only under that engine's rulesets (``Property.judged_under``), and a
campaign lists only the properties the rulesets it ran judge
(``judged_by``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from cgsim.spec.rulesets import RULESETS

# Family modules register their properties on import, in report order; an
# engine's own design properties (judged only under its rulesets) come last.
from cgsim.properties import init, capture, metadata, dispatch, lifecycle, memory, harness  # noqa: F401,E401
from cgsim.properties import sglang  # noqa: F401,E402
from cgsim.properties.dispatch import useless_descriptors
from cgsim.properties.registry import DECODE_FAMILIES, Property, Verdict, Violation, registered, resolve_alias
from cgsim.properties.view import RunView
from cgsim.scenario import Scenario
from cgsim.trace import Trace

__all__ = [
    "Violation",
    "Property",
    "Verdict",
    "RunView",
    "PROPERTIES",
    "ALL_PROPERTIES",
    "WATCHED",
    "check_scenario",
    "judged_by",
    "property_ids",
    "statement",
    "resolve_alias",
    "useless_descriptors",
]

# Every declared id of the decode managers' judge, harness outcomes included (CHECK-CRASH has no check);
# the encoder's judge has its own (cgsim.properties.encoder.ENCODER_PROPERTIES).
ALL_PROPERTIES: dict[str, Property] = {pid: p for pid, p in registered().items() if p.family in DECODE_FAMILIES}
# The ones a trace can be judged by.
PROPERTIES: dict[str, Property] = {pid: p for pid, p in ALL_PROPERTIES.items() if not p.harness_only}
# The harness family's outcomes (a crash, a hang, a check that raised): every scenario is watched for them,
# whatever applied, so a campaign counts each scenario it ran as judged by them.
WATCHED: tuple[str, ...] = tuple(pid for pid, p in ALL_PROPERTIES.items() if p.family == "harness")


def property_ids() -> tuple[str, ...]:
    return tuple(PROPERTIES)


def statement(pid: str) -> str:
    prop = ALL_PROPERTIES.get(resolve_alias(pid))
    return prop.statement if prop is not None else ""


def judged_by(rulesets: Iterable[str]) -> dict[str, Property]:
    """The properties of ALL_PROPERTIES (in its order) that some of
    ``rulesets`` (names; unknown ones skipped) judges.  With no ruleset
    known (none ran, none was named), those no engine's design owns."""
    known = [RULESETS[name] for name in dict.fromkeys(rulesets) if name in RULESETS]
    if not known:
        return {pid: p for pid, p in ALL_PROPERTIES.items() if p.engine is None}
    return {pid: p for pid, p in ALL_PROPERTIES.items() if any(p.judged_under(r) for r in known)}


def check_scenario(scenario: Scenario, trace: Trace, only: Iterable[str] | None = None) -> Verdict:
    """Judge one run.  ``only`` restricts to the given ids (an unknown id raises ValueError)."""
    if only is None:
        chosen = list(PROPERTIES.values())
    else:
        wanted = list(dict.fromkeys(only))
        unknown = [i for i in wanted if i not in PROPERTIES]
        if unknown:
            raise ValueError(f"unknown property id(s) {unknown}; choose from {', '.join(PROPERTIES)}")
        chosen = [PROPERTIES[i] for i in PROPERTIES if i in wanted]
    if trace.unsupported:
        # The target refuses this config the way the real engine would at
        # start-up: there is no run to judge.
        return Verdict((), ())
    run = RunView(scenario, trace)
    violations: list[Violation] = []
    checked: list[str] = []
    # The main manager, then each other manager the target drives (a draft
    # model's), judged by the same properties under its own config; its
    # violations name it (``manager``; the message says so for people).
    managers: list[tuple[str | None, RunView]] = [(None, run), *run.manager_views().items()]
    for name, view in managers:
        for prop in chosen:
            # A ruleset may replace a universal property by its design's own
            # rule for it, or waive one its design has no rule for (SPEC §3),
            # and judges no other engine's design properties; a sub-manager's
            # ruleset replaces and waives as the main one's does.
            if not prop.judged_under(view.ruleset) or not prop.applies(view):
                continue
            checked.append(prop.id)
            found = prop.check(view)
            violations.extend(found if name is None else
                              (replace(v, message=f"{name} manager: {v.message}", manager=name) for v in found))
    return Verdict(tuple(violations), tuple(dict.fromkeys(checked)))
