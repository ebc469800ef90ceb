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

from cgsim.descriptors import BatchDescriptor, BatchShape
from cgsim.modes import CUDAGraphMode
from cgsim.properties import Violation, resolve_alias
from cgsim.properties.registry import registered

__all__ = [
    "FINDING_SCHEMA",
    "FINDING_SCHEMA_VERSION",
    "STATUSES",
    "Finding",
    "FindingError",
    "desc_from_short",
    "facts_of_old_finding",
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
    "scenario_short", "run_id", "worker", "seed", "elapsed_s", "facts",
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
    # The violation's structured record (``Violation.record``): what every reader takes instead of the message.
    facts: Mapping[str, Any] = field(default_factory=dict)

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
        return self.facts.get(name)

    @property
    def batch(self) -> BatchShape | None:
        """The batch the violation is about (None: it names none)."""
        data = self.facts.get("batch")
        return BatchShape.from_json(data) if data is not None else None

    @property
    def got(self) -> BatchDescriptor | None:
        """The descriptor dispatch returned for ``batch``."""
        data = self.facts.get("got")
        return BatchDescriptor.from_json(data) if data is not None else None

    @property
    def expected(self) -> tuple[BatchDescriptor, ...] | None:
        """What a correct dispatcher may return for ``batch`` (empty: run it eagerly; None: not recorded)."""
        data = self.facts.get("expected")
        return tuple(BatchDescriptor.from_json(d) for d in data) if data is not None else None

    @property
    def manager(self) -> str | None:
        """The sub-manager (a draft model's) whose trace the violation is in; None: the main manager."""
        return self.facts.get("manager")

    @property
    def overflow(self) -> int | None:
        """Set on the note in place of the violations a property's count cap dropped (how many): no finding of its own."""
        return self.facts.get("overflow")

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
            facts=v.record(),
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
        if self.facts:
            out["facts"] = dict(self.facts)
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
        if "defect" in extra and "known_defect" not in extra:  # an encoder campaign's label, before it was this
            extra["known_defect"] = extra.pop("defect")
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
                elapsed_s=data.get("elapsed_s"), extra=extra, facts=facts_of_old_finding(data),
            )
        except (TypeError, ValueError) as exc:
            raise FindingError(f"{where} is malformed: {exc}") from None


# -- the reader of old findings ---------------------------------------------------------------
# Findings written before violations had structured fields (or with an
# earlier set of facts) are upgraded here, once, as they load: this is the one
# place that reads a finding's message, so that no reader has to.
_DESC = re.compile(r"Desc\((\w+)((?: \w+=\d+)*)\)")
_DESC_FIELDS = {"tokens": "num_tokens", "reqs": "num_reqs", "uniform": "uniform_token_count",
                "max_q": "max_query_len", "loras": "num_active_loras", "ubatches": "num_ubatches"}
# What dispatch returned, named right after these words by the dispatch properties.
_CHOSEN = re.compile(r"(?:dispatched to|ran eagerly|returned) \(?(?:(?:eager|incompatible|FULL|PIECEWISE|NONE) )?"
                     r"(Desc\([^)]*\))")
# The batch a dispatch message starts with: a sweep's BatchShape.short(), or a step's Batch.short().
_SWEPT = re.compile(r"Batch\(reqs=(\d+) tokens=(\d+) (?:uniform=(\d+)|max_q=(\d+))(?: loras=(\d+))?"
                    r"(?: ubatches=(\d+))?( prefill)?\)")
_STEP_BATCH = re.compile(r"Batch\(reqs=\d+ tokens=\d+ query_lens=\[[^\]]*\]((?: \w+=\d+)*)( prefill)?\)")


def desc_from_short(text: str) -> BatchDescriptor | None:
    """The inverse of ``BatchDescriptor.short()`` (None if it is not one)."""
    m = _DESC.fullmatch(text.strip())
    if not m:
        return None
    fields: dict[str, Any] = {}
    for part in m.group(2).split():
        key, _, value = part.partition("=")
        if key not in _DESC_FIELDS:
            return None
        fields[_DESC_FIELDS[key]] = int(value)
    if "num_tokens" not in fields:
        return None
    try:
        return BatchDescriptor(CUDAGraphMode.parse(m.group(1)), **fields)
    except (ValueError, TypeError):
        return None


def _desc_json(text: str) -> dict | None:
    d = desc_from_short(text)
    return d.to_json() if d is not None else None


def _batch_from_message(message: str, scenario: Any, step: Any) -> dict | None:
    m = _SWEPT.match(message)
    if m:
        reqs, tokens, uniform, max_q, loras, ubatches, prefill = m.groups()
        u = int(uniform) if uniform is not None else None
        return BatchShape(int(reqs), int(tokens), u if u is not None else int(max_q), u, bool(prefill),
                          int(loras or 0), int(ubatches or 1)).to_json()
    if _STEP_BATCH.match(message) and isinstance(step, int) and isinstance(scenario, Mapping):
        steps = scenario.get("steps") or []
        if 0 <= step < len(steps) and isinstance(steps[step], Mapping) and steps[step].get("batch"):
            from cgsim.descriptors import Batch  # noqa: PLC0415 - only for findings that old

            return Batch.from_json(steps[step]["batch"]).shape.to_json()
    return None


def facts_of_old_finding(data: Mapping[str, Any]) -> dict[str, Any]:
    """The structured record of a finding as loaded: the ``facts`` written
    with it, with what findings recorded before a field existed say only in
    their message (or under an earlier name) filled in.  The reader of old
    findings; a finding written by this cgsim passes through unchanged."""
    facts = dict(data.get("facts") or {})
    message = str(data.get("message") or "")
    # Earlier names: the batch's shape and the dispatched descriptor (the short texts beside them are dropped).
    if "batch_shape" in facts:
        facts["batch"] = facts.pop("batch_shape")
    if "dispatched" in facts:
        facts["got"] = facts.pop("dispatched")
    for name in ("batch", "got"):
        if isinstance(facts.get(name), str):
            del facts[name]
    facts.pop("fits", None)
    if facts.get("overflow") is None and "manager" not in facts:
        head, sep, rest = message.partition(" manager: ")
        if sep and head.startswith("draft-") and " " not in head:
            facts["manager"] = head
            message = rest
    prop = resolve_alias(str(data.get("property", "")))
    if prop.startswith("DISPATCH-") or prop in ("BEFORE-CAPTURE", "KEY-CONSISTENT"):
        if "batch" not in facts:
            shape = _batch_from_message(message, data.get("scenario"), data.get("step"))
            if shape is not None:
                facts["batch"] = shape
        if "got" not in facts:
            m = _CHOSEN.search(message)
            got = _desc_json(m.group(1)) if m else None
            if got is not None:
                facts["got"] = got
        if "swept_after" not in facts and "in the dispatch sweep" in message:
            facts["swept_after"] = ("start" if "before the first capture" in message else
                                    "release" if "sweep after the release" in message else "capture")
        if "expected" not in facts and prop in ("DISPATCH-PRIORITY", "DISPATCH-COMPLETE") and "although" in message:
            # The best fitting graph the message names (what a correct dispatcher returns, or one of them).
            tail = message.split("although", 1)[1]
            named = [d for d in (_desc_json(m.group(0)) for m in _DESC.finditer(tail)) if d]
            if named:
                facts["expected"] = named[-1:]
    if prop == "CAPTURE-USEFUL" and "graph" not in facts:
        m = _DESC.search(message.split(" is never", 1)[0])
        graph = _desc_json(m.group(0)) if m else None
        if graph is not None:
            facts["graph"] = graph
    facts.update(_named_in_old_message(prop, message, facts))
    if prop in ("NO-CRASH", "INIT-TOTAL") and "raised" not in facts:
        # "target raised during capture: Type: text" / "building the manager failed (crash: Type: text) ..."
        m = (re.match(r"target .+? during [\w-]+: (.*)$", message, re.S)
             or re.match(r"run_scenario raised (.*)$", message, re.S)
             or re.match(r"building the manager failed \([\w-]+: (.*)\) for a valid config", message, re.S)
             or re.match(r"building the manager .*?, not a clear error: (.*)$", message, re.S))
        if m:
            facts["raised"] = m.group(1)
    return facts


# What a property names in its message, recorded as facts since: the graphs
# (CAND-ORDER, INIT-TOTAL, FRESH-METADATA, SKIP-ATTN, REPLAY-EQUALS-EAGER),
# the modes (MODE-RESOLUTION, CAND-ORDER), the exact shape a DISPATCH-ROUNDTRIP
# batch has, what PAD-CONSISTENT's captured metadata is short of.
_REQUESTED = re.compile(r"requested (\w+)(?: \(routed to (\w+) by ruleset .*?\))?, support ")
_GRAPH_PASS = re.compile(r"(warmup|FULL graph capture|(\w+) capture) forward for (Desc\([^)]*\))")


def _named_in_old_message(prop: str, message: str, facts: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if prop in ("CAND-ORDER", "INIT-TOTAL") and "graphs" not in facts:
        named = (_desc_json(m.group(0)) for m in re.finditer(r"Desc\([^)]*\)", message.split(" is never")[0]))
        out["graphs"] = [d for d in named if d]
    if prop == "CAND-ORDER" and "spec_mode" not in facts:
        m = re.search(r"\(ruleset .*?, resolved mode ([A-Z_]+|<rejected>)\)", message)
        if m:
            out["spec_mode"] = m.group(1) if m.group(1) != "<rejected>" else None
    if prop == "MODE-RESOLUTION" and "requested" not in facts:
        m = _REQUESTED.match(message)
        if m:
            out["requested"], out["routed"] = m.group(1), m.group(2) or m.group(1)
        for pattern, names in ((r"resolved to (\w+), expected (\w+)$", ("resolved", "spec_mode")),
                               (r"the spec rejects this config \((.*)\) but the target resolved it to (\w+)$",
                                ("spec_rejects", "resolved")),
                               (r"resolved mode (\w+) needs attention support (\w+) > ", ("resolved", "needs_support"))):
            m = re.search(pattern, message, re.DOTALL)
            if m:
                out.update(zip(names, m.groups()))
                break
    if prop == "DISPATCH-ROUNDTRIP" and "exact" not in facts:
        m = re.search(r"has exactly the shape of captured (Desc\([^)]*\))", message)
        exact = _desc_json(m.group(1)) if m else None
        if exact is not None:
            out["exact"] = exact
    if prop == "PAD-CONSISTENT" and "mismatch" not in facts:
        if "max_query_len" in message:
            out["mismatch"] = "max_query_len"
        elif "metadata sized" in message or "metadata has num_reqs" in message:
            out["mismatch"] = "size"
    if prop == "FRESH-METADATA" and "graph" not in facts and "warmup's metadata" in message:
        m = _DESC.search(message)
        if m and _desc_json(m.group(0)) is not None:
            out["graph"] = _desc_json(m.group(0))
    if prop == "SKIP-ATTN" and "graph" not in facts:
        m = _GRAPH_PASS.match(message)
        if m and _desc_json(m.group(3)) is not None:
            out["graph"] = _desc_json(m.group(3))
            mode = "NONE" if m.group(1) == "warmup" else m.group(2)
            if mode is not None:
                out["forward_mode"] = mode
    if prop == "REPLAY-EQUALS-EAGER" and "graph" not in facts:
        m = re.match(r"(\w+) run of (Desc\([^)]*\)) for ", message)
        if m and _desc_json(m.group(2)) is not None:
            out["graph"], out["path"] = _desc_json(m.group(2)), m.group(1)
    return out
