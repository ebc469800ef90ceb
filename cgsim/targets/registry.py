"""The target registry: the one place that knows which targets exist.

Targets are entry points of the group ``cgsim.targets`` (so a package outside
cgsim can add one with a line in its pyproject.toml); cgsim's own are listed
here in the same form, so they work from a checkout that was never installed.
An entry point names a ``TargetFamily``: ``reference`` (one target),
``mutant`` (``mutant:NAME``, one per mutant), ``vllm``, ...

    [project.entry-points."cgsim.targets"]
    mytarget = "mypackage.cgsim_target:FAMILY"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Callable

from cgsim.targets.base import (TARGET_HOOKS, Hooks, PytestAdapter, SourceOption, Target, TargetEnvironmentError,
                                UnknownTarget)
from cgsim.spec.rulesets import get_ruleset, rulesets_of
from cgsim.text import did_you_mean, first_line

__all__ = ["ENTRY_POINT_GROUP", "TargetFamily", "families", "family_of_target_name", "get_target", "target_names",
           "describe_targets", "target_engine", "WrongRuleset", "check_ruleset_fits", "source_options",
           "mock_engine_adapters"]

ENTRY_POINT_GROUP = "cgsim.targets"

_BUILTIN = (
    EntryPoint("reference", "cgsim.targets.reference:FAMILY", ENTRY_POINT_GROUP),
    EntryPoint("mutant", "cgsim.targets.mutants:FAMILY", ENTRY_POINT_GROUP),
    EntryPoint("vllm", "cgsim.targets.vllm:FAMILY", ENTRY_POINT_GROUP),
    EntryPoint("sglang", "cgsim.targets.sglang:FAMILY", ENTRY_POINT_GROUP),
    EntryPoint("sglang-mutant", "cgsim.targets.sglang:MUTANT_FAMILY", ENTRY_POINT_GROUP),
    EntryPoint("encoder-reference", "cgsim.encoder.targets:REFERENCE_FAMILY", ENTRY_POINT_GROUP),
    EntryPoint("encoder-mutant", "cgsim.encoder.targets:MUTANT_FAMILY", ENTRY_POINT_GROUP),
    EntryPoint("vllm-encoder", "cgsim.encoder.targets:VLLM_FAMILY", ENTRY_POINT_GROUP),
)


@dataclass(frozen=True)
class TargetFamily:
    """Targets named ``name`` or, for a family with variants, ``name:VARIANT``.

    ``create(variant)`` builds the target (variant None for a plain target);
    ``variants()`` lists them with a one-line summary each.  Creating a target
    must be cheap and must not fail on a missing engine: the environment is
    checked by ``Target.prepare_environment`` before a campaign starts.
    ``source``: the flag naming a source tree of its engine (every command
    that runs a target takes it); ``pytest_adapter``: what
    ``--cgsim-mock-engine NAME`` does for a pytest session;
    ``capture_family``: the capture-manager family (``cgsim.families``)
    whose scenarios its targets run; ``hooks``: the roles its targets'
    optional hooks are checked against; ``export_writer``: where the
    function that writes one of its findings as the engine's own test is
    (``module:NAME``, called with the finding, how it was given and its
    documented row; ``python -m fuzz export-test``), None where it has
    none; ``cgsims_own``: its managers are cgsim's own (the reference and
    its mutants), which no engine test is written for.
    """

    name: str
    summary: str
    create: Callable[[str | None], Target]
    variants: Callable[[], dict[str, str]] = field(default=lambda: {})
    source: SourceOption | None = None
    pytest_adapter: PytestAdapter | None = None
    capture_family: str = "decode"
    hooks: Hooks = TARGET_HOOKS
    export_writer: str | None = None
    cgsims_own: bool = False

    def declaration_problem(self) -> str | None:
        """What is wrong with what the family declares beside its targets (None: nothing)."""
        for what, value, kind in (("source", self.source, SourceOption),
                                  ("pytest_adapter", self.pytest_adapter, PytestAdapter), ("hooks", self.hooks, Hooks)):
            if value is not None and not isinstance(value, kind):
                return f"its {what} is a {type(value).__name__}, not a cgsim.targets.base.{kind.__name__}"
        return None

    def names(self) -> list[str]:
        variants = self.variants()
        return [f"{self.name}:{v}" for v in variants] if variants else [self.name]


_cache: dict[str, TargetFamily] | None = None
# Entry points that did not load: named in the error when someone asks for them.
_broken: dict[str, str] = {}


def families() -> dict[str, TargetFamily]:
    """cgsim's targets, then every installed ``cgsim.targets`` entry point."""
    global _cache
    if _cache is None:
        found: dict[str, TargetFamily] = {}
        installed = list(entry_points(group=ENTRY_POINT_GROUP))
        for ep in list(_BUILTIN) + [ep for ep in installed if ep.value not in {b.value for b in _BUILTIN}]:
            if ep.name in found:
                continue
            try:
                family = ep.load()
            except Exception as exc:  # an external plugin that does not import must not hide the others
                _broken[ep.name] = (f"target entry point {ep.name} = {ep.value!r} does not load: "
                                    f"{type(exc).__name__}: {first_line(exc)}")
                continue
            if not isinstance(family, TargetFamily):
                _broken[ep.name] = (f"target entry point {ep.name} = {ep.value!r} is a {type(family).__name__}, "
                                    "not a cgsim.targets.registry.TargetFamily")
                continue
            problem = family.declaration_problem()
            if problem is not None:
                _broken[ep.name] = f"target entry point {ep.name} = {ep.value!r}: {problem}"
                continue
            found[family.name] = family
        _cache = found
    return _cache


def family_of_target_name(name: str) -> TargetFamily | None:
    """The target family a target name is of (None: no family of that name)."""
    return families().get(name.partition(":")[0])


def target_names() -> list[str]:
    return [n for family in families().values() for n in family.names()]


def describe_targets() -> dict[str, str]:
    """Every target name with its one-line summary."""
    out: dict[str, str] = {}
    for family in families().values():
        variants = family.variants()
        if variants:
            out.update({f"{family.name}:{v}": s for v, s in variants.items()})
        else:
            out[family.name] = family.summary
    return out


def get_target(name: "str | Target") -> Target:
    if not isinstance(name, str):
        return name
    base, _, variant = name.partition(":")
    family = families().get(base)
    if family is None and base in _broken:
        raise TargetEnvironmentError(_broken[base])
    if family is None:
        hint = did_you_mean(name, target_names() + list(families()))
        raise UnknownTarget(f"unknown target {name!r}{hint}; use one of {', '.join(_choices())} (python -m fuzz list)")
    variants = family.variants()
    if variants and variant not in variants:
        what = (f"unknown {base} {variant!r}{did_you_mean(variant, variants)}" if variant
                else f"target {base!r} needs a variant ({base}:NAME)")
        raise UnknownTarget(f"{what}; choose one of {', '.join(sorted(variants))} (python -m fuzz list)")
    if not variants and variant:
        raise UnknownTarget(f"target {base!r} takes no variant, got {name!r}")
    target = family.create(variant or None)
    family.hooks.check(target)  # a hook defined wrongly is one line here, not a hook silently skipped later
    return target


def source_options() -> list[SourceOption]:
    """The source-tree options the families declare, in registry order."""
    return [f.source for f in families().values() if f.source is not None]


def mock_engine_adapters() -> dict[str, PytestAdapter]:
    """``--cgsim-mock-engine`` choices: family name -> its adapter."""
    return {f.name: f.pytest_adapter for f in families().values() if f.pytest_adapter is not None}


def _choices() -> list[str]:
    return [f.name + (":NAME" if f.variants() else "") for f in families().values()]


class WrongRuleset(ValueError):
    """A ruleset of another engine's design than the target's: every
    property judged by it would hold the target to rules it never chose."""


def target_engine(target: Target) -> str:
    """The engine whose designs a target follows (its rulesets' ``engine``):
    its ``engine`` attribute, else its default ruleset's, else vLLM's."""
    engine = getattr(target, "engine", None)
    if engine:
        return engine
    try:
        default = target.default_ruleset()
    except Exception:  # noqa: BLE001 - an engine that is not here: its own check says so
        default = None
    return get_ruleset(default).engine if default else "vllm"


def check_ruleset_fits(target_name: str, ruleset: str) -> None:
    """WrongRuleset (one line) unless ``ruleset`` states a design of the
    engine ``target_name`` follows."""
    engine = target_engine(get_target(target_name))
    found = get_ruleset(ruleset).engine
    if found != engine:
        raise WrongRuleset(f"ruleset {ruleset!r} states {found}'s design, and target {target_name} follows "
                           f"{engine}'s; choose one of {', '.join(rulesets_of(engine))}, or leave the ruleset out "
                           "(the target's own)")
