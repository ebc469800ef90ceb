"""Finding: one violated property with the Scenario that shows it.

The one shape a failure has from the moment ``cgsim.observe`` sees it to the
JSON file on disk, the summary entry and the repro script: a frozen value
with a schema version.  Its id is a function of (target, property,
scenario), so the same bug found twice with the same minimal scenario gets
the same id in every run.

Status, over a finding's life in a campaign: "shrinking" (written the moment
it is confirmed, while Hypothesis shrinks it), then "shrunk" (the smallest
failing scenario) or "shrink-interrupted" (the budget or a stop cut the
shrink short); "pending" for a property seen while another one was
shrinking (a later chunk pins and shrinks it if it shows again);
"unshrunk" for a failure that is never shrunk (a hang, a worker death);
"new" for a finding not yet written anywhere.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from cgsim.properties import Violation, resolve_alias
from cgsim.properties.registry import registered

__all__ = [
    "FINDING_SCHEMA",
    "FINDING_SCHEMA_VERSION",
    "STATUSES",
    "Finding",
    "FindingError",
    "finding_id",
]

FINDING_SCHEMA = "cgsim.finding"
FINDING_SCHEMA_VERSION = 1
STATUSES = ("new", "shrinking", "shrunk", "shrink-interrupted", "pending", "unshrunk")

# Fields with a meaning of their own; anything else a finding carries (notes,
# the first scenario seen, the environment it was found in) is kept in
# ``extra`` and written back unchanged.
_CORE = (
    "property", "statement", "kind", "message", "step", "target", "backend", "status", "scenario",
    "scenario_short", "run_id", "worker", "seed", "elapsed_s",
)
_DERIVED = ("schema", "schema_version", "id", "ruleset", "repro")


class FindingError(ValueError):
    """A finding file is unreadable or not a cgsim finding."""


def _declared(pid: str):
    """The declared property (any family: a finding of the encoder's graphs too), or None."""
    return registered().get(pid)


def finding_id(target: str, prop: str, scenario_json: Mapping) -> str:
    canonical = json.dumps({"target": target, "property": prop, "scenario": scenario_json}, sort_keys=True,
                           separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", prop.lower()).strip("-") or "finding"
    return f"{slug}-{digest}"


@dataclass(frozen=True, eq=False)
class Finding:
    property: str
    message: str
    target: str
    backend: str
    scenario: Mapping[str, Any]  # the Scenario's JSON form (what replays it)
    kind: str = "violation"  # violation | crash | hang
    step: int | None = None
    status: str = "new"
    statement: str = ""
    scenario_short: str = ""
    run_id: str = ""
    worker: int | None = None
    seed: int | None = None
    elapsed_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"finding status {self.status!r} is not one of {', '.join(STATUSES)}")
        if not self.statement:
            prop = _declared(self.property)
            if prop is not None:
                object.__setattr__(self, "statement", prop.statement)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Finding) and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]

    # -- derived --------------------------------------------------------------
    @property
    def id(self) -> str:
        return finding_id(self.target, self.property, self.scenario)

    @property
    def ruleset(self) -> str | None:
        return self.scenario.get("ruleset") if isinstance(self.scenario, Mapping) else None

    @property
    def repro(self) -> str:
        return f"repro_{self.id}.py"

    def fact(self, name: str) -> Any:
        """A structured fact the property recorded with the violation (None: none by that name)."""
        return (self.extra.get("facts") or {}).get(name)

    @property
    def manager(self) -> str | None:
        """The sub-manager (a draft model's) whose trace the violation is in; None: the main manager.
        Findings recorded before the fact existed name it only as their message's prefix."""
        name = self.fact("manager")
        if name is not None or self.fact("overflow") is not None:
            return name
        head, sep, _ = self.message.partition(" manager: ")
        return head if sep and head.startswith("draft-") and " " not in head else None

    @property
    def is_overflow_note(self) -> bool:
        """The note in place of the violations a property's count cap dropped: no finding of its own."""
        return self.fact("overflow") is not None

    @property
    def shrinkable(self) -> bool:
        prop = _declared(self.property)
        return prop.shrink if prop is not None else True

    def with_(self, **changes: Any) -> "Finding":
        extra = changes.pop("extra", None)
        if extra is not None:
            changes["extra"] = {**self.extra, **extra}
        return replace(self, **changes)

    # -- construction -----------------------------------------------------------
    @classmethod
    def from_violation(cls, v: Violation, scenario_json: Mapping, target: str, backend: str,
                       scenario_short: str = "") -> "Finding":
        prop = _declared(v.property)
        return cls(
            property=v.property, message=v.message, target=target, backend=backend, scenario=scenario_json,
            kind=prop.kind if prop is not None else "violation", step=v.step, scenario_short=scenario_short,
            extra={"facts": dict(v.facts)} if v.facts else {},
        )

    # -- JSON -------------------------------------------------------------------
    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "schema": FINDING_SCHEMA,
            "schema_version": FINDING_SCHEMA_VERSION,
            "id": self.id,
            "property": self.property,
            "statement": self.statement,
            "kind": self.kind,
            "message": self.message,
            "step": self.step,
            "target": self.target,
            "backend": self.backend,
            "ruleset": self.ruleset,
            "status": self.status,
            "scenario": self.scenario,
            "scenario_short": self.scenario_short,
            "run_id": self.run_id,
            "worker": self.worker,
            "seed": self.seed,
            "elapsed_s": None if self.elapsed_s is None else round(self.elapsed_s, 3),
            "repro": self.repro,
        }
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "finding") -> "Finding":
        if not isinstance(data, dict) or data.get("schema") != FINDING_SCHEMA:
            raise FindingError(f"{where} is not a cgsim finding (no \"schema\": \"{FINDING_SCHEMA}\")")
        if data.get("schema_version") != FINDING_SCHEMA_VERSION:
            raise FindingError(
                f"{where} has schema_version {data.get('schema_version')!r}; this cgsim reads {FINDING_SCHEMA_VERSION}"
            )
        for key in ("id", "property", "target", "scenario"):
            if key not in data:
                raise FindingError(f"{where} lacks the field {key!r}")
        if not isinstance(data["scenario"], dict):
            raise FindingError(f"{where}: 'scenario' must be a JSON object")
        status = data.get("status") or "unshrunk"
        if status not in STATUSES:
            raise FindingError(f"{where}: status {status!r} is not one of {', '.join(STATUSES)}")
        # The property as this cgsim names it; the id stays the one on disk
        # (it names the file and the repro script).
        prop = resolve_alias(str(data["property"]))
        extra = {k: v for k, v in data.items() if k not in _CORE and k not in _DERIVED}
        if prop != data["property"]:
            extra.setdefault("recorded_as", data["property"])
            extra.setdefault("recorded_id", data["id"])
        try:
            return cls(
                property=prop, message=str(data.get("message", "")), target=str(data["target"]),
                backend=str(data.get("backend") or "mock"), scenario=data["scenario"],
                kind=str(data.get("kind") or "violation"), step=data.get("step"), status=status,
                statement=str(data.get("statement") or ""), scenario_short=str(data.get("scenario_short") or ""),
                run_id=str(data.get("run_id") or ""), worker=data.get("worker"), seed=data.get("seed"),
                elapsed_s=data.get("elapsed_s"), extra=extra,
            )
        except (TypeError, ValueError) as exc:
            raise FindingError(f"{where} is malformed: {exc}") from None
