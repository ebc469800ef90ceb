"""The property registry: every property is declared once, with its id, its
one-line statement, its family, the engine whose design it states (where it
is one engine's own) and when it applies, and is validated when
its module is imported (as Hypothesis's ``stateful`` validates rules at
definition time), so a malformed property fails at import, never mid-campaign.

Two kinds of entries share one vocabulary:

- trace properties (``check`` given): pure functions of a ``RunView``;
  where a property's decision is a rule over plain values, that rule is a
  pure predicate of its module, named by ``rule=`` beside the check, which
  calls it; export-test generates an exported test's check from the same
  predicate's source (``fuzz/export_test/vllm_rules.py``), so no property's
  rule is written twice;
- harness outcomes (``check`` None): what the harness itself sees around a
  run (the runner raised, the process died, a check raised).  They are
  declared here too so that findings, summaries and ``fuzz list`` name every
  failure the same way.
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass
from typing import Any, TYPE_CHECKING, Callable, Iterable

from cgsim.spec.rulesets import RULESETS, Ruleset

if TYPE_CHECKING:  # pragma: no cover
    from cgsim.properties.view import RunView

__all__ = [
    "FAMILIES",
    "DECODE_FAMILIES",
    "ENCODER_FAMILIES",
    "KINDS",
    "InvalidProperty",
    "add_property_family",
    "Property",
    "Verdict",
    "Violation",
    "declare",
    "registered",
    "resolve_alias",
]

# Families in report order: what candidate init built, how it was captured,
# what the graphs read, where batches went, what replay and release did, the
# memory the graphs hold, and what happened around the run (the decode
# managers' judge, cgsim.properties); then the vision encoder's graphs
# (judged on encoder scenarios only, cgsim.properties.encoder).
DECODE_FAMILIES = ("init", "capture", "metadata", "dispatch", "lifecycle", "memory", "harness")
ENCODER_FAMILIES = ("encoder",)
FAMILIES = DECODE_FAMILIES + ENCODER_FAMILIES

# Property families a capture-manager family outside cgsim added (add_property_family), in order.
_ADDED_FAMILIES: list[str] = []

KINDS = ("violation", "crash", "hang")
_ID = re.compile(r"^[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*$")
_MAX_STATEMENT = 240


class InvalidProperty(TypeError):
    """A property declaration is malformed; the message says what was given and what to do."""


@dataclass(frozen=True)
class Violation:
    """One thing a property saw go wrong: ``message`` says it for people;
    readers (reports, pictures, documented-defect classifiers, export) read
    the structured fields, never the message.

    ``batch``: the batch it is about (``BatchShape.to_json()``); ``got``: the
    descriptor dispatch returned for it (``BatchDescriptor.to_json()``);
    ``expected``: the descriptors a correct dispatcher may return (an empty
    list: none fits, run it eagerly); ``manager``: the sub-manager (a draft
    model's) whose trace it is in, None for the main manager; ``overflow``:
    set on the note that stands for the violations a count cap dropped (how
    many), which is no violation of its own.  ``facts``: (name, JSON value)
    pairs a property records beside them (e.g. ``graph``, ``captured``,
    ``swept_after``, ``fit_in_candidates``, ``raised``)."""

    property: str
    message: str
    step: int | None = None
    facts: tuple[tuple[str, Any], ...] = ()
    batch: dict | None = None
    got: dict | None = None
    expected: tuple[dict, ...] | None = None
    manager: str | None = None
    overflow: int | None = None

    def __str__(self) -> str:
        where = f" (step {self.step})" if self.step is not None else ""
        return f"{self.property}{where}: {self.message}"

    def record(self) -> dict[str, Any]:
        """Every structured field that is set and the facts, as one JSON object (what a Finding stores)."""
        out: dict[str, Any] = dict(self.facts)
        for name in ("batch", "got", "expected", "manager", "overflow"):
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if name == "expected" else value
        return out


@dataclass(frozen=True)
class Property:
    id: str
    statement: str  # one line
    family: str
    # (RunView) -> violations; None for a harness outcome nobody can check from a trace.
    check: "Callable[[RunView], Iterable[Violation]] | None"
    # (RunView) -> whether the run gave the property anything to judge.
    applies: "Callable[[RunView], bool]"
    # Whether a failing scenario is worth shrinking (a hang costs a timeout per attempt).
    shrink: bool = True
    # Ids this property had in earlier cgsim versions (findings on disk still name them).
    aliases: tuple[str, ...] = ()
    # What a failure is: "violation" of a rule, or the target "crash"ed or "hang"s.
    kind: str = "violation"
    # The engine whose design it states (judged only under that engine's rulesets); None: every engine's.
    engine: str | None = None
    # The pure predicate over plain values that decides it (no RunView): a
    # public top-level function of the check's module, which the check calls
    # and export-test generates its exported check from.  None: not factored.
    rule: Callable[..., Any] | None = None

    @property
    def harness_only(self) -> bool:
        return self.check is None

    def judged_under(self, ruleset: Ruleset) -> bool:
        """Whether ``ruleset`` judges this property: a ruleset of its engine
        (where it has one) that neither replaces nor waives it."""
        return self.engine in (None, ruleset.engine) and ruleset.judges(self.id)


@dataclass(frozen=True)
class Verdict:
    violations: tuple[Violation, ...]
    checked: tuple[str, ...]  # ids that applied

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_property(self) -> dict[str, list[Violation]]:
        out: dict[str, list[Violation]] = {}
        for v in self.violations:
            out.setdefault(v.property, []).append(v)
        return out


_REGISTRY: dict[str, Property] = {}
_ALIASES: dict[str, str] = {}


def _always(run: "RunView") -> bool:
    return True


def _one_parameter(fn: Callable, what: str, pid: str) -> None:
    if not callable(fn):
        raise InvalidProperty(f"property {pid}: {what} must be a function of one RunView, got {fn!r}")
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return
    if len(params) != 1:
        raise InvalidProperty(
            f"property {pid}: {what} {getattr(fn, '__name__', fn)!r} takes {len(params)} required arguments; "
            "it must take exactly one (the RunView of the run being judged)"
        )


def _plain_rule(rule: Callable, check: Callable, pid: str) -> None:
    """A property's ``rule``: a public top-level function of the check's own
    module (listed in its ``__all__``), taking plain values, never a RunView."""
    if not inspect.isfunction(rule) or rule.__name__ != rule.__qualname__ or rule.__name__ == "<lambda>":
        raise InvalidProperty(f"property {pid}: rule must be a function defined at the top level of its module, "
                              f"got {rule!r}")
    for p in inspect.signature(rule).parameters.values():
        if p.name == "run" or "RunView" in str(p.annotation) or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise InvalidProperty(f"property {pid}: rule {rule.__name__} takes {p}; a rule takes plain values "
                                  "by name, never the RunView")
    if rule.__module__ != check.__module__:
        raise InvalidProperty(f"property {pid}: rule {rule.__name__} is defined in {rule.__module__}; define it "
                              f"beside the check, in {check.__module__}")
    module = sys.modules.get(rule.__module__)
    if rule.__name__.startswith("_") or rule.__name__ not in getattr(module, "__all__", ()):
        raise InvalidProperty(f"property {pid}: rule {rule.__name__} must be public, in {rule.__module__}'s "
                              "__all__ (export-test generates the exported check from it)")


def add_property_family(name: str) -> None:
    """Let ``@declare`` take ``family=name``: the property family of a
    capture-manager family outside cgsim, named by its properties module
    before its declarations (cgsim's own are ``FAMILIES``)."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        raise InvalidProperty(f"property family {name!r}: give a lower-case, hyphenated name, e.g. 'draft-encoder'")
    if name not in FAMILIES and name not in _ADDED_FAMILIES:
        _ADDED_FAMILIES.append(name)


def declare(
    pid: str,
    statement: str,
    *,
    family: str,
    applies: "Callable[[RunView], bool] | None" = None,
    shrink: bool = True,
    aliases: tuple[str, ...] = (),
    kind: str = "violation",
    harness_only: bool = False,
    engine: str | None = None,
    rule: Callable[..., Any] | None = None,
) -> Callable:
    """Declare a property.  As a decorator over its check::

        @declare("CAPTURE-ORDER", "PIECEWISE captured before FULL, largest first", family="capture",
                 applies=has_capture_forwards)
        def capture_order(run: RunView) -> list[Violation]: ...

    A harness outcome has no check: ``declare(ID, statement, family="harness",
    harness_only=True)`` registers it and returns the Property.  ``engine``:
    a property of one engine's design (a ruleset's ``engine``), judged only
    under that engine's rulesets.  ``rule``: the pure predicate over plain
    values the check calls to decide (see ``Property.rule``).
    """
    if not isinstance(pid, str) or not _ID.match(pid):
        raise InvalidProperty(
            f"property id {pid!r} is not an upper-case, hyphenated id; write it like SPEC §4 does, e.g. 'CAPTURE-ORDER'"
        )
    if pid in _REGISTRY or pid in _ALIASES:
        raise InvalidProperty(f"property {pid} is declared twice; give the new property its own id")
    if not isinstance(statement, str) or not statement.strip() or "\n" in statement:
        raise InvalidProperty(f"property {pid}: the statement must be one non-empty line, got {statement!r}")
    if len(statement) > _MAX_STATEMENT:
        raise InvalidProperty(
            f"property {pid}: the statement has {len(statement)} characters; keep it to one line of at most "
            f"{_MAX_STATEMENT} (details go into the violation messages)"
        )
    if family not in FAMILIES and family not in _ADDED_FAMILIES:
        raise InvalidProperty(f"property {pid}: family {family!r} is unknown; use one of "
                              f"{', '.join(FAMILIES + tuple(_ADDED_FAMILIES))} (a capture-manager family of your own: "
                              "add_property_family first)")
    if kind not in KINDS:
        raise InvalidProperty(f"property {pid}: kind {kind!r} is unknown; use one of {', '.join(KINDS)}")
    engines = sorted({r.engine for r in RULESETS.values()})
    if engine is not None and engine not in engines:
        raise InvalidProperty(f"property {pid}: engine {engine!r} has no ruleset; use one of {', '.join(engines)} "
                              "or None (every engine's)")
    if applies is not None:
        _one_parameter(applies, "applies", pid)
    if rule is not None and harness_only:
        raise InvalidProperty(f"property {pid}: a harness outcome has no check, so no rule")
    for alias in aliases:
        if not _ID.match(alias) or alias in _REGISTRY or alias in _ALIASES:
            raise InvalidProperty(f"property {pid}: alias {alias!r} is malformed or already taken")

    def register(check: "Callable[[RunView], Iterable[Violation]] | None") -> Property:
        if check is not None:
            _one_parameter(check, "check", pid)
        if rule is not None:
            _plain_rule(rule, check, pid)
        prop = Property(pid, statement.strip(), family, check, applies or _always, shrink, tuple(aliases), kind,
                        engine, rule)
        _REGISTRY[pid] = prop
        for alias in aliases:
            _ALIASES[alias] = pid
        return prop

    if harness_only:
        return register(None)  # type: ignore[return-value]

    def decorator(check: Callable) -> Callable:
        register(check)
        return check

    return decorator


def registered() -> dict[str, Property]:
    """Every declared property, families in FAMILIES order (then those added), declaration order within one."""
    rank = {f: i for i, f in enumerate(FAMILIES + tuple(_ADDED_FAMILIES))}
    order = {pid: i for i, pid in enumerate(_REGISTRY)}
    return {p.id: p for p in sorted(_REGISTRY.values(), key=lambda p: (rank[p.family], order[p.id]))}


def resolve_alias(pid: str) -> str:
    """The current id of ``pid`` (an id from an older cgsim resolves to its successor)."""
    return _ALIASES.get(pid, pid)
