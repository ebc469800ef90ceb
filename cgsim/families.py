"""The capture-manager families: the one place that knows which exist.

A family is the capture managers one flow of values drives: ``decode`` (the
decode managers: vLLM's, SGLang's runners, the reference and its mutants;
``cgsim.scenario.Scenario``) and ``encoder`` (vLLM's vision-encoder manager;
``cgsim.encoder``).  Generic code (the campaign, replay, repro scripts, the
report, the doctor, the CLI) asks here for the family of a finding or a
target and calls its operations (a campaign's workers its ``FamilySearch``);
it never tests which family it runs.  A family's targets are those of the
target registry whose ``TargetFamily.capture_family`` names it.

Families are entry points of the group ``cgsim.families`` (so a package
outside cgsim can add one with a line in its pyproject.toml); cgsim's own
are listed here in the same form, so they work from a checkout that was
never installed.  An entry point names a ``Family``:

    [project.entry-points."cgsim.families"]
    myfamily = "mypackage.cgsim_family:FAMILY"
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from cgsim.finding import Finding
from cgsim.text import first_line

if TYPE_CHECKING:  # annotations only: importing the property registry runs every judge's module
    from cgsim.properties.registry import Property

__all__ = ["ENTRY_POINT_GROUP", "DEFAULT_FAMILY", "Family", "FamilySearch", "FamilyRegistryError", "ReplayOutcome",
           "CatalogueRow", "families", "family_of_finding", "family_of_scenario", "family_of_target",
           "search_of_family", "owns_target_of"]

ENTRY_POINT_GROUP = "cgsim.families"
# Scenarios no family claims (a kind unknown here, JSON that is no scenario) and target names none
# claims go to this family, whose loaders and target registry say what is wrong with them.
DEFAULT_FAMILY = "decode"

_BUILTIN = (
    EntryPoint("decode", "cgsim.decode_family:FAMILY", ENTRY_POINT_GROUP),
    EntryPoint("encoder", "cgsim.encoder.family:FAMILY", ENTRY_POINT_GROUP),
)


class ReplayOutcome(Protocol):
    """What a family's replay of a finding showed: ``reproduced`` while ``property`` is still violated."""

    property: str
    reproduced: bool

    def lines(self) -> list[str]: ...


@dataclass(frozen=True)
class CatalogueRow:
    """One line of ``python -m fuzz list``: what it is (target, mutant, ruleset, property), its name, its summary."""

    what: str
    name: str
    summary: str


@dataclass(frozen=True)
class FamilySearch:
    """What a campaign's workers ask of one family's scenarios.

    ``strategy(ruleset, target)``: a Hypothesis strategy of the family's
    scenarios for a campaign against ``target``; ``observe(scenario, target,
    backend, timeout_s, pipeline)``: run and judge one (``cgsim.observe.Outcome``;
    TargetEnvironmentError where the environment, never the target, failed;
    ``pipeline`` None: the family's own); ``timeout_of(scenario, timeout_s)``:
    the per-scenario limit ``timeout_s`` scales to for it;
    ``scenario_from_json(data)``: a scenario from its JSON (ValueError where
    it is none); ``repeat_key(scenario)``: what makes two scenarios the same
    run (a worker skips repeats while it searches); ``coverage_of(scenario)``:
    the (dimension, key) pairs the report's coverage section counts for it."""

    family: str
    strategy: Callable[[str | None, str | None], Any]
    observe: Callable[[Any, str, str, float | None, Any], Any]
    timeout_of: Callable[[Any, float | None], float | None]
    scenario_from_json: Callable[[Any], Any]
    repeat_key: Callable[[Any], tuple]
    coverage_of: Callable[[Any], tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Family:
    """One family of capture managers, as the operations generic code needs.

    ``owns_scenario(json)``: whether a scenario's JSON (a finding's
    ``scenario``) is this family's, by its ``kind``; ``owns_target(name)``:
    whether a target name is one of its targets; ``reproduce(finding,
    backend, timeout)``: re-run a finding of this family (environment
    problems raise before anything runs); ``describe(finding)``: what the
    finding is, before it is replayed; ``scenario_code(json)``: the scenario
    as the constructor calls that build it (the loader's ValueError,
    TypeError or KeyError for one that does not load); ``scenario_short(json)``:
    the scenario's one-line short form (the same errors); ``properties()``: the
    property registry its scenarios are judged by, in report order;
    ``judged_by(rulesets)``: those of them some of ``rulesets`` judges (what a
    campaign's report lists); ``check_ruleset(target, ruleset)``: raises (one
    line) unless ``ruleset`` is one of the family's that ``target`` may be
    judged by; ``catalogue()``: its rows of ``python -m fuzz list``;
    ``search``: where its ``FamilySearch`` is, as ``module:NAME`` (loaded by
    ``search_of_family``: a family's search may live in ``fuzz``, which cgsim
    never imports).
    """

    name: str
    summary: str
    owns_scenario: Callable[[Any], bool]
    owns_target: Callable[[str], bool]
    reproduce: Callable[[Finding, str | None, float | None], ReplayOutcome]
    describe: Callable[[Finding], list[str]]
    scenario_code: Callable[[Any], str]
    scenario_short: Callable[[Any], str]
    properties: Callable[[], Mapping[str, Property]]
    judged_by: Callable[[Iterable[str]], Mapping[str, Property]]
    check_ruleset: Callable[[str, str], None]
    catalogue: Callable[[], tuple[CatalogueRow, ...]]
    search: str


_cache: dict[str, Family] | None = None


class FamilyRegistryError(RuntimeError):
    """A family entry point that does not load or is no Family: one line naming it."""


def families() -> dict[str, Family]:
    """cgsim's families, then every installed ``cgsim.families`` entry point, by name."""
    global _cache
    if _cache is None:
        found: dict[str, Family] = {}
        installed = list(entry_points(group=ENTRY_POINT_GROUP))
        for ep in list(_BUILTIN) + [ep for ep in installed if ep.value not in {b.value for b in _BUILTIN}]:
            if ep.name in found:
                continue
            try:
                family = ep.load()
                problem = None if isinstance(family, Family) else (f"is a {type(family).__name__}, "
                                                                   "not a cgsim.families.Family")
            except Exception as exc:  # noqa: BLE001 - said in one line naming the entry point
                problem = f"does not load: {type(exc).__name__}: {first_line(exc)}"
            if problem is not None and ep in _BUILTIN:
                raise FamilyRegistryError(f"family entry point {ep.name} = {ep.value!r} {problem}")
            if problem is None:
                found[family.name] = family
            else:  # an outside family that does not load must not hide cgsim's own: said where nothing claims
                _broken[ep.name] = f"family entry point {ep.name} = {ep.value!r} {problem}"
        _cache = found
    return _cache


_broken: dict[str, str] = {}  # outside family entry points that did not load, by name: why


def _unclaimed(what: str) -> Family:
    """The default family for what no family claims; where an outside family
    did not load, it may be that one's: FamilyRegistryError naming it."""
    if _broken:
        raise FamilyRegistryError(f"no family claims {what}, and {'; '.join(sorted(_broken.values()))}")
    return families()[DEFAULT_FAMILY]


def family_of_scenario(scenario: Any) -> Family:
    """The family whose scenario this JSON is (the default family where none claims it)."""
    registered = families()
    kind = scenario.get("kind") if isinstance(scenario, Mapping) else None
    return next((f for f in registered.values() if f.owns_scenario(scenario)), None) or (
        _unclaimed(f"a scenario of kind {kind!r}") if kind is not None else registered[DEFAULT_FAMILY])


def family_of_finding(finding: Finding) -> Family:
    """The family of a finding: that of its scenario."""
    return family_of_scenario(finding.scenario)


def family_of_target(name: str) -> Family:
    """The family a target name belongs to (the default family where none claims it)."""
    registered = families()
    return next((f for f in registered.values() if f.owns_target(name)), None) or _unclaimed(f"the target {name!r}")


def search_of_family(family: Family) -> FamilySearch:
    """The family's ``FamilySearch`` (``Family.search``); FamilyRegistryError where it does not load."""
    module, _, name = family.search.partition(":")
    try:
        search = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise FamilyRegistryError(f"the {family.name} family's search {family.search!r} does not load: "
                                  f"{type(exc).__name__}: {first_line(exc)}") from None
    if not isinstance(search, FamilySearch):
        raise FamilyRegistryError(f"the {family.name} family's search {family.search!r} is a "
                                  f"{type(search).__name__}, not a cgsim.families.FamilySearch")
    return search


def owns_target_of(family: str) -> Callable[[str], bool]:
    """``Family.owns_target`` for a family whose targets are those of
    ``cgsim.targets.registry`` that declare it their ``capture_family``."""

    def owns(name: str) -> bool:
        from cgsim.targets.registry import family_of_target_name

        target_family = family_of_target_name(name)
        return target_family is not None and target_family.capture_family == family

    return owns
