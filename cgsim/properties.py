"""SPEC §4 as pure functions: (Scenario, Trace) -> violations.

Each property is an id from SPEC §4, a one-line statement, a ``check`` that
returns the violations it saw (each naming the descriptor, batch, expected and
actual values) and an ``applies`` predicate that says whether the run gave it
anything to judge.  Checks read only the Scenario, the Trace and the executable
spec (``cgsim.spec``) under the scenario's ruleset; they never import torch, a
target or the runner, so a Trace written next to a finding can be judged again
anywhere.

Traces may end early with an ``Error`` event; every check judges what is there
and never raises on a partial trace.

One id is not in SPEC §4: ``NO-CRASH`` reports a target that raised ("crash"),
hung ("timeout") or corrupted its state ("corrupt") during capture, dispatch,
replay or release.  A failure while *building* the manager belongs to
INIT-TOTAL, an illegal operation anywhere to NO-ILLEGAL-OP.

How the trace is cut up (see ``cgsim.trace`` for the events):

- A capture *session* is the run of capture events up to a ``CaptureDone``
  (or up to an ``Error`` / dispatch / release when capture never finished).
  ``CreateForwardFn`` carries no step, so it belongs to the session it sits in.
- The *captured set* while dispatching is what the manager holds: the
  ``GraphStored`` descriptors since the last ``Release`` plus, once a capture
  finished (``CaptureDone.ok``) and a piecewise runner exists, the PIECEWISE
  descriptors of the "initial" ``Candidates`` of that capture.
"""

from __future__ import annotations

import contextvars
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, compatible, lora_case
from cgsim.modes import (
    RUNTIME_RANK,
    CUDAGraphMode,
    ModeResolutionError,
    required_support,
)
from cgsim.scenario import Scenario
from cgsim.spec import (
    dispatch_choices,
    expected_capture_descs,
    expected_dispatch,
    get_ruleset,
    padding_key,
    resolved_mode,
)
from cgsim.trace import (
    Candidates,
    CaptureDone,
    CreateForwardFn,
    Dispatch,
    Error,
    Event,
    Forward,
    GraphStored,
    MetadataRecord,
    PiecewiseCapture,
    PiecewiseLookup,
    Release,
    Replay,
    Trace,
)

__all__ = [
    "Violation",
    "Property",
    "Verdict",
    "PROPERTIES",
    "EXTRA_PROPERTY_IDS",
    "check_scenario",
    "property_ids",
]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE

# At most this many violations of one kind per capture session / per property,
# so a systematically broken target gives a readable finding, not thousands.
_MAX_PER_GROUP = 8


# --------------------------------------------------------------------------
# public records
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Violation:
    property: str  # the SPEC §4 id (or NO-CRASH)
    message: str  # names what was seen: descriptor, batch, expected vs actual
    step: int | None = None

    def __str__(self) -> str:
        where = f" (step {self.step})" if self.step is not None else ""
        return f"{self.property}{where}: {self.message}"


@dataclass(frozen=True)
class Property:
    id: str
    statement: str  # one line
    check: Callable[[Scenario, Trace], list[Violation]]
    # False when the scenario gives the property nothing to judge (e.g. no
    # dispatch steps); such a property counts as "not checked".
    applies: Callable[[Scenario, Trace], bool]


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


# --------------------------------------------------------------------------
# trace views shared by the checks
# --------------------------------------------------------------------------
@dataclass
class _Session:
    """One capture() call: its capture events in order and how it ended."""

    step: int | None
    events: list[Event]
    done: CaptureDone | None
    # Graphs the manager already held from an earlier capture (no release in
    # between) and did not capture again: the runner reads stored graphs off
    # the manager after capture, so they reappear as GraphStored here.
    carried: frozenset[BatchDescriptor] = frozenset()

    @property
    def ok(self) -> bool:
        return self.done is not None and self.done.ok

    @property
    def forwards(self) -> list[Forward]:
        return [e for e in self.events if isinstance(e, Forward)]

    @property
    def stored(self) -> list[BatchDescriptor]:
        """Graphs this capture stored (carried-over ones left out)."""
        return [e.desc for e in self.events if isinstance(e, GraphStored) and e.desc not in self.carried]

    @property
    def all_stored(self) -> list[BatchDescriptor]:
        return [e.desc for e in self.events if isinstance(e, GraphStored)]

    @property
    def captured_something(self) -> bool:
        return any(_is_capture_pass(f) for f in self.forwards) or any(isinstance(e, PiecewiseCapture) for e in self.events)


@dataclass
class _Captured:
    """What the manager holds after a finished capture."""

    step: int | None
    stored: frozenset[BatchDescriptor]
    piecewise: frozenset[BatchDescriptor]

    @property
    def descs(self) -> frozenset[BatchDescriptor]:
        return self.stored | self.piecewise


@dataclass
class _DispatchView:
    dispatch: Dispatch
    captured: _Captured | None  # None: not captured (never, failed, or released)
    replay: Replay | None = None
    lookups: list[PiecewiseLookup] = field(default_factory=list)
    runtime_forwards: list[Forward] = field(default_factory=list)


def _is_warmup(f: Forward) -> bool:
    return f.mode == N and not f.in_graph


def _is_capture_pass(f: Forward) -> bool:
    """The pass that is recorded: inside a FULL graph, or the PIECEWISE pass."""
    return f.in_graph or f.mode == P


def _is_full_capture(f: Forward) -> bool:
    """The forward recorded into a FULL graph.  (A breakable PIECEWISE capture
    may also report in_graph: its pieces are graphs too; it runs as PIECEWISE.)"""
    return f.in_graph and f.mode != P


def _capture_steps(scenario: Scenario) -> set[int]:
    return {i for i, s in enumerate(scenario.steps) if s.kind == "capture"}


# Views derived from one (scenario, trace), shared by the checks while
# check_scenario runs (nothing mutates the trace then); outside it every call
# recomputes, so a check stays a pure function of what it is given.
_VIEW_CACHE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("cgsim_properties_views", default=None)


def _cached(name: str, scenario: Scenario, trace: Trace, build: Callable[[], object]):
    cache = _VIEW_CACHE.get()
    if cache is None:
        return build()
    key = (name, id(scenario), id(trace))
    if key not in cache:
        cache[key] = build()
    return cache[key]


def _sessions(scenario: Scenario, trace: Trace) -> list[_Session]:
    return _cached("sessions", scenario, trace, lambda: _build_sessions(scenario, trace))


def _build_sessions(scenario: Scenario, trace: Trace) -> list[_Session]:
    capture_steps = _capture_steps(scenario)
    out: list[_Session] = []
    cur: list[Event] = []
    cur_step: int | None = None
    held: set[BatchDescriptor] = set()  # graphs stored since the last release

    def close(done: CaptureDone | None, step: int | None) -> None:
        nonlocal cur, cur_step
        if cur or done is not None:
            recaptured = {f.desc for f in cur if isinstance(f, Forward) and _is_full_capture(f)}
            stored = {e.desc for e in cur if isinstance(e, GraphStored)}
            carried = frozenset(d for d in stored if d in held and d not in recaptured)
            held.update(stored)
            out.append(_Session(step if step is not None else cur_step, cur, done, carried))
        cur, cur_step = [], None

    for e in trace.events:
        if isinstance(e, CaptureDone):
            close(e, e.step)
        elif isinstance(e, CreateForwardFn):
            cur.append(e)
        elif isinstance(e, (Forward, GraphStored, PiecewiseCapture)):
            if isinstance(e, Forward) and e.phase != "capture":
                continue
            # A piecewise runner may capture lazily at runtime; such events
            # carry a dispatch step and are not part of a capture session.
            if not isinstance(e, Forward) and capture_steps and e.step not in capture_steps:
                continue
            cur.append(e)
            if cur_step is None:
                cur_step = e.step
        elif isinstance(e, (Dispatch, Release)) or (isinstance(e, Error) and e.phase == "capture"):
            if cur:
                close(None, e.step if isinstance(e, Error) else None)
            if isinstance(e, Release):
                held.clear()
    if cur:
        close(None, None)
    return out


def _initial_candidates(trace: Trace, step: int | None) -> Candidates | None:
    cands = [e for e in trace.of(Candidates) if e.phase == "initial"]
    if not cands:
        return None
    exact = [c for c in cands if c.step == step]
    if exact:
        return exact[-1]
    before = [c for c in cands if step is None or c.step <= step]
    return before[-1] if before else cands[-1]


def _spec_descs(scenario: Scenario) -> dict[CUDAGraphMode, tuple[BatchDescriptor, ...]] | None:
    """The spec's capture descriptors, or None when the config is rejected."""
    try:
        return expected_capture_descs(scenario.config, scenario.ruleset)
    except (ModeResolutionError, ValueError):
        return None


def _spec_mode(scenario: Scenario) -> CUDAGraphMode | None:
    try:
        return resolved_mode(scenario.config)
    except (ModeResolutionError, ValueError):
        return None


def _piecewise_set(scenario: Scenario, trace: Trace, session: _Session) -> frozenset[BatchDescriptor]:
    if not trace.has_piecewise_runner:
        return frozenset()
    cand = _initial_candidates(trace, session.step)
    if cand is not None:
        return frozenset(d for d in cand.capture_descs if d.cg_mode == P)
    # No candidates recorded: the PIECEWISE descriptors that had a capture pass.
    return frozenset(f.desc for f in session.forwards if f.desc is not None and f.desc.cg_mode == P and f.mode == P)


def _timeline(scenario: Scenario, trace: Trace) -> tuple[list[_Session], list[_DispatchView], list[_Captured]]:
    """Sessions, every dispatch with the captured state it saw, and the
    captured state after each finished capture."""
    return _cached("timeline", scenario, trace, lambda: _build_timeline(scenario, trace))


def _build_timeline(scenario: Scenario, trace: Trace) -> tuple[list[_Session], list[_DispatchView], list[_Captured]]:
    sessions = _sessions(scenario, trace)
    by_done = {id(s.done): s for s in sessions if s.done is not None}
    stored: set[BatchDescriptor] = set()
    captured: _Captured | None = None
    finished: list[_Captured] = []
    views: list[_DispatchView] = []
    by_step: dict[int, _DispatchView] = {}
    for e in trace.events:
        if isinstance(e, GraphStored):
            stored.add(e.desc)
        elif isinstance(e, CaptureDone):
            if e.ok:
                session = by_done.get(id(e))
                pw = _piecewise_set(scenario, trace, session) if session is not None else frozenset()
                captured = _Captured(e.step, frozenset(stored), pw)
                finished.append(captured)
            else:
                captured = None
        elif isinstance(e, Release):
            stored.clear()
            captured = None
        elif isinstance(e, Dispatch):
            v = _DispatchView(e, captured)
            views.append(v)
            by_step[e.step] = v
        elif isinstance(e, Replay):
            v = by_step.get(e.step)
            if v is not None and v.replay is None:
                v.replay = e
        elif isinstance(e, PiecewiseLookup):
            v = by_step.get(e.step)
            if v is not None:
                v.lookups.append(e)
        elif isinstance(e, Forward) and e.phase == "runtime":
            v = by_step.get(e.step)
            if v is not None:
                v.runtime_forwards.append(e)
    return sessions, views, finished


def _is_build_error(trace: Trace, e: Error) -> bool:
    """Raised while building the manager.  A timeout during build may carry the
    workload's phase instead of "build": nothing the runner records after a
    successful build (resolved mode, initial candidates) exists then."""
    if e.phase == "build":
        return True
    return trace.resolved_mode is None and not trace.of(Candidates) and not trace.of(CaptureDone)


def _md(trace: Trace, mid: int | None) -> MetadataRecord | None:
    return None if mid is None else trace.metadata.get(mid)


def _shorts(descs: Iterable[BatchDescriptor], limit: int = 6) -> str:
    items = sorted(descs, key=lambda d: (d.cg_mode.value, -d.num_tokens, repr(d)))
    text = ", ".join(d.short() for d in items[:limit])
    if len(items) > limit:
        text += f", ... ({len(items) - limit} more)"
    return "[" + text + "]"


def _incompat_reason(d: BatchDescriptor, b: Batch, lora_cases: Sequence[int]) -> str:
    reasons = []
    if d.uniform_token_count is not None and d.uniform_token_count != b.uniform_token_count:
        reasons.append(f"uniform_token_count {d.uniform_token_count} != batch's {b.uniform_token_count}")
    if d.max_query_len is not None and b.decode_max_query_len is None:
        reasons.append(f"batch has a prefill but the graph bounds max_query_len to {d.max_query_len}")
    elif d.max_query_len is not None and b.max_query_len > d.max_query_len:
        reasons.append(f"batch max_query_len {b.max_query_len} > {d.max_query_len}")
    if d.num_reqs is not None and d.num_reqs < b.num_reqs:
        reasons.append(f"num_reqs {d.num_reqs} < batch's {b.num_reqs}")
    if d.num_tokens < b.num_tokens:
        reasons.append(f"num_tokens {d.num_tokens} < batch's {b.num_tokens}")
    case = lora_case(b.num_active_loras, lora_cases)
    if d.num_active_loras != case:
        reasons.append(f"LoRA case {d.num_active_loras} != {case} (batch has {b.num_active_loras} active)")
    if d.num_ubatches != b.num_ubatches:
        reasons.append(f"num_ubatches {d.num_ubatches} != batch's {b.num_ubatches}")
    return "; ".join(reasons) or "compatible"


def _group(violations: list[Violation]) -> list[Violation]:
    """Drop exact duplicates and cap the count per property."""
    seen: set[tuple] = set()
    out: list[Violation] = []
    dropped = 0
    for v in violations:
        key = (v.property, v.message)
        if key in seen:
            continue
        seen.add(key)
        if len(out) >= 4 * _MAX_PER_GROUP:
            dropped += 1
            continue
        out.append(v)
    if dropped and out:
        out.append(Violation(out[0].property, f"... and {dropped} more violations of this property", None))
    return out


# --------------------------------------------------------------------------
# candidate init
# --------------------------------------------------------------------------
def _by_mode(descs: Iterable[BatchDescriptor]) -> dict[CUDAGraphMode, set[BatchDescriptor]]:
    out: dict[CUDAGraphMode, set[BatchDescriptor]] = {}
    for d in descs:
        out.setdefault(d.cg_mode, set()).add(d)
    return out


def _diff_by_mode(actual: Iterable[BatchDescriptor], expected: Iterable[BatchDescriptor]) -> list[str]:
    a, e = _by_mode(actual), _by_mode(expected)
    parts = []
    for mode in (P, F, N):
        got, want = a.get(mode, set()), e.get(mode, set())
        if got == want:
            continue
        missing, extra = want - got, got - want
        text = f"{mode.value}:"
        if missing:
            text += f" missing {_shorts(missing)}"
        if extra:
            text += f" unexpected {_shorts(extra)}"
        parts.append(text)
    return parts


def check_cand_order(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    cands = trace.of(Candidates)
    initial = [c for c in cands if c.phase == "initial"]
    recomputed = [c for c in cands if c.phase == "recomputed"]
    for r in recomputed:
        i = _initial_candidates(trace, r.step)
        if i is None:
            continue
        diff = _diff_by_mode(r.capture_descs, i.capture_descs)
        if diff:
            out.append(Violation(
                "CAND-ORDER",
                "candidate init run again on the finished manager gives other capture descriptors "
                "(recomputed vs initial): " + "; ".join(diff),
                r.step,
            ))
        ic, rc = dict(i.candidates), dict(r.candidates)
        if ic != rc:
            keys = sorted(set(ic) | set(rc))
            bad = [k for k in keys if ic.get(k) != rc.get(k)]
            shown = []
            for k in bad[:3]:
                shown.append(
                    f"(num_tokens={k[0]}, lora={k[1]}): initial {_list_short(ic.get(k))} vs recomputed {_list_short(rc.get(k))}"
                )
            out.append(Violation(
                "CAND-ORDER",
                f"candidate lists differ after recomputing on the finished manager for {len(bad)} key(s): "
                + "; ".join(shown),
                r.step,
            ))
    expected = _spec_descs(scenario)
    if expected is not None:
        want = [d for ds in expected.values() for d in ds]
        reported: set[tuple] = set()
        for i in initial:
            diff = _diff_by_mode(i.capture_descs, want)
            if not diff or tuple(diff) in reported:
                continue
            reported.add(tuple(diff))
            hint = _not_breakable_hint(scenario, i.capture_descs)
            out.append(Violation(
                "CAND-ORDER",
                f"capture descriptors differ from the spec (ruleset {scenario.ruleset}, resolved mode "
                f"{_mode_name(_spec_mode(scenario))}): " + "; ".join(diff) + hint,
                i.step,
            ))
    return _group(out)


def _list_short(descs: Sequence[BatchDescriptor] | None) -> str:
    if descs is None:
        return "<no list>"
    return "[" + ", ".join(d.short() for d in descs[:4]) + (", ..." if len(descs) > 4 else "") + "]"


def _mode_name(mode: CUDAGraphMode | None) -> str:
    return mode.value if mode is not None else "<rejected>"


def _not_breakable_hint(scenario: Scenario, descs: Sequence[BatchDescriptor]) -> str:
    cfg = scenario.config
    if not cfg.breakable:
        return ""
    try:
        as_if = expected_capture_descs(cfg.with_(breakable=False, compiled_piecewise=True), scenario.ruleset)
    except (ModeResolutionError, ValueError):
        return ""
    got = {d for d in descs if d.cg_mode == P}
    if got and got == set(as_if.get(P, ())):
        return (
            " (the PIECEWISE descriptors are the ones a non-breakable manager builds: candidate init "
            "ran before the breakable flag was final, the PR 48822 ordering bug)"
        )
    return ""


def check_cand_bounds(scenario: Scenario, trace: Trace) -> list[Violation]:
    cfg = scenario.config
    max_size = cfg.max_capture_size
    out: list[Violation] = []
    for c in trace.of(Candidates):
        if c.phase != "initial":
            continue
        counts = Counter(c.capture_descs)
        for d, n in counts.items():
            if n > 1:
                out.append(Violation("CAND-BOUNDS", f"{d.short()} appears {n} times in the {d.cg_mode.value} capture list", c.step))
        for d in counts:
            if not 0 < d.num_tokens <= max_size:
                out.append(Violation(
                    "CAND-BOUNDS", f"{d.short()}: num_tokens {d.num_tokens} outside 1..{max_size} (max capture size)", c.step))
            if d.num_reqs is not None and d.num_reqs > min(d.num_tokens, cfg.max_num_reqs):
                out.append(Violation(
                    "CAND-BOUNDS",
                    f"{d.short()}: num_reqs {d.num_reqs} > min(num_tokens {d.num_tokens}, max_num_reqs {cfg.max_num_reqs})",
                    c.step,
                ))
            if d.cg_mode == F and d.uniform_token_count is not None:
                if d.num_reqs is None or d.num_tokens != d.num_reqs * d.uniform_token_count:
                    out.append(Violation(
                        "CAND-BOUNDS",
                        f"{d.short()}: FULL uniform decode descriptor needs num_tokens = num_reqs x uniform_token_count "
                        f"= {d.num_reqs} x {d.uniform_token_count}, has {d.num_tokens}",
                        c.step,
                    ))
        capset = set(c.capture_descs)
        for (n, lora), descs in c.candidates:
            for d in descs:
                if d not in capset:
                    problem = "is not a capture descriptor"
                elif d.num_tokens < n:
                    problem = f"has fewer tokens than the key ({d.num_tokens} < {n})"
                elif d.num_active_loras != lora:
                    problem = f"is for LoRA case {d.num_active_loras}, not {lora}"
                else:
                    continue
                out.append(Violation(
                    "CAND-BOUNDS", f"candidate list (num_tokens={n}, lora={lora}) holds {d.short()}, which {problem}", c.step))
    return _group(out)


def check_init_total(scenario: Scenario, trace: Trace) -> list[Violation]:
    cfg = scenario.config
    out: list[Violation] = []
    rejected = _spec_mode(scenario) is None
    for e in trace.errors:
        if not _is_build_error(trace, e) or e.error == "illegal-op":
            continue
        if rejected and e.error == "crash":
            continue  # the config cannot run; a clear error is the right answer
        out.append(Violation(
            "INIT-TOTAL",
            f"building the manager failed ({e.error}: {e.exc_type}: {e.message}) for a valid config "
            f"(requested {cfg.mode.value}, support {cfg.attention_support.name}, resolves to {_mode_name(_spec_mode(scenario))})"
            if not rejected else
            f"building the manager for a config the spec rejects ended in {e.error}, not a clear error: {e.exc_type}: {e.message}",
            e.step,
        ))
    max_q = cfg.decode_query_len
    for c in trace.of(Candidates):
        if c.phase != "initial":
            continue
        for d in dict.fromkeys(c.capture_descs):
            problems = []
            if d.num_tokens < 1:
                problems.append(f"num_tokens {d.num_tokens} < 1")
            if d.num_reqs is not None and d.num_reqs < 1:
                problems.append(f"num_reqs {d.num_reqs} < 1")
            if d.uniform_token_count is not None and not 1 <= d.uniform_token_count <= max_q:
                problems.append(f"uniform_token_count {d.uniform_token_count} outside 1..{max_q} (largest decode query length)")
            if d.max_query_len is not None and d.max_query_len < 1:
                problems.append(f"max_query_len {d.max_query_len} < 1")
            if d.num_active_loras not in cfg.lora_cases:
                problems.append(f"num_active_loras {d.num_active_loras} is not a LoRA case {list(cfg.lora_cases)}")
            if d.num_ubatches not in (1, cfg.num_ubatches):
                problems.append(f"num_ubatches {d.num_ubatches} is neither 1 nor the configured {cfg.num_ubatches}")
            if d.cg_mode == N:
                problems.append("a NONE descriptor in the capture list")
            if problems:
                out.append(Violation("INIT-TOTAL", f"insane descriptor {d.short()}: " + "; ".join(problems), c.step))
    return _group(out)


def _applies_init_total(scenario: Scenario, trace: Trace) -> bool:
    return bool(trace.of(Candidates)) or any(_is_build_error(trace, e) for e in trace.errors) or trace.resolved_mode is not None


# --------------------------------------------------------------------------
# capture protocol
# --------------------------------------------------------------------------
def _capture_sequence(session: _Session) -> list[BatchDescriptor]:
    """Descriptors in the order their capture started (first warmup create)."""
    seq: list[BatchDescriptor] = []
    seen: set[BatchDescriptor] = set()
    creates = [e for e in session.events if isinstance(e, CreateForwardFn)]
    source = [e.desc for e in creates if e.warmup] if creates else [f.desc for f in session.forwards if f.desc is not None]
    for d in source:
        if d not in seen:
            seen.add(d)
            seq.append(d)
    return seq


def check_capture_order(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    for s in _sessions(scenario, trace):
        seq = [d for d in _capture_sequence(s) if d.cg_mode in (P, F)]
        found = 0
        for prev, cur in zip(seq, seq[1:]):
            if prev.cg_mode == F and cur.cg_mode == P:
                msg = f"PIECEWISE {cur.short()} captured after FULL {prev.short()} (expected all PIECEWISE first, then FULL)"
            elif prev.cg_mode == cur.cg_mode and cur.num_tokens > prev.num_tokens:
                msg = (f"{cur.short()} captured after the smaller {prev.short()} "
                       f"(expected largest first within {cur.cg_mode.value})")
            else:
                continue
            found += 1
            if found <= _MAX_PER_GROUP:
                out.append(Violation("CAPTURE-ORDER", msg, s.step))
        if found > _MAX_PER_GROUP:
            out.append(Violation("CAPTURE-ORDER", f"... {found - _MAX_PER_GROUP} more out-of-order captures in this session; "
                                 f"order seen: {_list_short(seq)}", s.step))
    return out


def check_capture_once(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    spec = _spec_descs(scenario)
    for s in _sessions(scenario, trace):
        in_graph = Counter(f.desc for f in s.forwards if _is_full_capture(f) and f.desc is not None)
        stored = Counter(s.stored)
        for d, n in in_graph.items():
            if d.cg_mode != F:
                out.append(Violation("CAPTURE-ONCE", f"{d.short()} (not FULL) was captured inside a FULL graph", s.step))
            elif n > 1:
                out.append(Violation("CAPTURE-ONCE", f"FULL {d.short()} captured {n} times in one capture (expected once)", s.step))
        for d, n in stored.items():
            if n > 1:
                out.append(Violation("CAPTURE-ONCE", f"graph for {d.short()} stored {n} times (expected once)", s.step))
            if in_graph[d] == 0:
                out.append(Violation("CAPTURE-ONCE", f"graph for {d.short()} stored without a capture pass for it", s.step))
        if not s.ok:
            continue
        cand = _initial_candidates(trace, s.step)
        if cand is not None:
            full_list, source = [d for d in cand.capture_descs if d.cg_mode == F], "the manager's FULL capture list"
        elif spec is not None:
            full_list, source = list(spec.get(F, ())), "the spec's FULL capture list"
        else:
            continue
        stored.update({d: 1 for d in s.carried})
        for d in dict.fromkeys(full_list):
            if in_graph[d] == 0 and stored[d] == 0:
                out.append(Violation("CAPTURE-ONCE", f"FULL {d.short()} is in {source} but was never captured nor stored", s.step))
            elif stored[d] == 0:
                out.append(Violation("CAPTURE-ONCE", f"FULL {d.short()} was captured but no graph was stored for it", s.step))
        extra = set(stored) - set(full_list)
        if extra:
            out.append(Violation("CAPTURE-ONCE", f"stored graphs not in {source}: {_shorts(extra)}", s.step))
    return _group(out)


def check_warmup_first(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    for s in _sessions(scenario, trace):
        created: set[BatchDescriptor] = set()
        warmed: set[BatchDescriptor] = set()
        for e in s.events:
            if isinstance(e, CreateForwardFn):
                if e.warmup:
                    created.add(e.desc)
            elif isinstance(e, Forward) and e.desc is not None:
                if _is_warmup(e):
                    if e.desc in created:
                        warmed.add(e.desc)
                elif _is_capture_pass(e) and e.desc not in warmed:
                    why = ("no create_forward_fn(warmup=True) for it" if e.desc not in created
                           else "create_forward_fn(warmup=True) was called but its eager warmup forward never ran")
                    where = "inside a FULL graph" if _is_full_capture(e) else f"as {e.mode.value}"
                    out.append(Violation(
                        "WARMUP-FIRST", f"{e.desc.short()} captured {where} before its warmup ({why})", e.step))
            elif isinstance(e, GraphStored) and e.desc not in warmed and e.desc not in s.carried:
                out.append(Violation("WARMUP-FIRST", f"graph for {e.desc.short()} stored but its warmup never ran", e.step))
    return _group(out)


def check_fresh_metadata(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    for s in _sessions(scenario, trace):
        warm: dict[BatchDescriptor, int | None] = {}
        for f in s.forwards:
            d = f.desc
            if d is None:
                continue
            if _is_warmup(f):
                warm[d] = f.metadata
                continue
            full = _is_full_capture(f) and d.cg_mode == F
            breakable_pw = f.mode == P and d.cg_mode == P and trace.uses_breakable
            if not (full or breakable_pw) or d not in warm:
                continue
            w, c = warm[d], f.metadata
            if w is None or c is None:
                continue  # attention skipped: SKIP-ATTN judges that
            what = "FULL graph" if full else "breakable PIECEWISE capture"
            if w == c:
                out.append(Violation(
                    "FRESH-METADATA",
                    f"{what} for {d.short()} captured with the warmup's metadata object #{c} "
                    "(expected a fresh object from create_forward_fn(warmup=False))",
                    f.step,
                ))
                continue
            rw, rc = _md(trace, w), _md(trace, c)
            if rw is not None and rc is not None:
                shared = sorted(set(rw.state) & set(rc.state))
                if shared:
                    out.append(Violation(
                        "FRESH-METADATA",
                        f"{what} for {d.short()}: captured metadata #{c} shares mutable state {shared} with the "
                        f"warmup's metadata #{w} (backends mutate or lazily build it during warmup)",
                        f.step,
                    ))
    return _group(out)


def check_skip_attn(scenario: Scenario, trace: Trace) -> list[Violation]:
    rs = get_ruleset(scenario.ruleset)
    out: list[Violation] = []
    for s in _sessions(scenario, trace):
        for f in s.forwards:
            d = f.desc
            if d is None:
                continue
            skip = rs.skip_attn(d.cg_mode == P, trace.uses_breakable)
            kind = "warmup" if _is_warmup(f) else ("FULL graph capture" if _is_full_capture(f) else f"{f.mode.value} capture")
            if skip and f.metadata is not None:
                out.append(Violation(
                    "SKIP-ATTN",
                    f"{kind} forward for {d.short()} built attention metadata #{f.metadata}; ruleset {rs.name} "
                    "skips attention for PIECEWISE without breakable graphs (attention runs outside the pieces)",
                    f.step,
                ))
            elif not skip and f.metadata is None:
                out.append(Violation(
                    "SKIP-ATTN",
                    f"{kind} forward for {d.short()} ran with attention skipped (metadata None); ruleset {rs.name} "
                    f"builds metadata here (breakable={trace.uses_breakable})",
                    f.step,
                ))
    return _group(out)


# --------------------------------------------------------------------------
# metadata at replay
# --------------------------------------------------------------------------
def _metadata_judged(scenario: Scenario, trace: Trace, r: Replay) -> bool:
    """FULL replays, and breakable PIECEWISE replays under rulesets that pad."""
    if r.path == "full":
        return True
    return r.path == "piecewise" and trace.uses_breakable and get_ruleset(scenario.ruleset).pad_breakable_piecewise_metadata


def check_metadata_live(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    for r in trace.of(Replay):
        head = f"{r.path} replay of {r.desc.short()} for {r.batch.short()}"
        if r.metadata_alive is False:
            out.append(Violation(
                "METADATA-LIVE", f"{head}: the metadata #{r.graph_metadata} the graph was captured with is no longer alive", r.step))
        if not _metadata_judged(scenario, trace, r):
            continue
        if r.graph_metadata is not None and r.runtime_metadata is None and r.path == "full":
            out.append(Violation(
                "METADATA-LIVE",
                f"{head}: no runtime metadata was prepared, so the graph reads whatever the buffers of #{r.graph_metadata} hold",
                r.step,
            ))
            continue
        g, rt = _md(trace, r.graph_metadata), _md(trace, r.runtime_metadata)
        if g is None or rt is None:
            continue
        if set(g.buffers) != set(rt.buffers):
            out.append(Violation(
                "METADATA-LIVE",
                f"{head}: runtime metadata #{rt.id} was rebound to new buffers {sorted(set(rt.buffers) - set(g.buffers))} "
                f"instead of updating the captured buffers {sorted(g.buffers)} of #{g.id} in place (the graph reads stale values)",
                r.step,
            ))
    return _group(out)


def check_pad_consistent(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    for r in trace.of(Replay):
        if not _metadata_judged(scenario, trace, r):
            continue
        g, rt = _md(trace, r.graph_metadata), _md(trace, r.runtime_metadata)
        head = f"{r.path} replay of {r.desc.short()} for {r.batch.short()}"
        if g is not None and rt is not None:
            if (g.num_reqs, g.num_tokens) != (rt.num_reqs, rt.num_tokens):
                out.append(Violation(
                    "PAD-CONSISTENT",
                    f"{head}: captured with metadata sized num_reqs={g.num_reqs} num_tokens={g.num_tokens}, runtime "
                    f"metadata has num_reqs={rt.num_reqs} num_tokens={rt.num_tokens} (expected the padded sizes)",
                    r.step,
                ))
        if g is not None and g.max_query_len < r.batch.max_query_len:
            out.append(Violation(
                "PAD-CONSISTENT",
                f"{head}: graph captured with max_query_len={g.max_query_len} < the batch's max_query_len {r.batch.max_query_len}",
                r.step,
            ))
    return _group(out)


def check_key_consistent(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    sessions = _sessions(scenario, trace)
    # Capture keys per descriptor, per capture session (latest wins).
    keys_at: list[tuple[int, dict[BatchDescriptor, set[tuple]]]] = []
    for s in sessions:
        keys: dict[BatchDescriptor, set[tuple]] = {}
        current: BatchDescriptor | None = None
        for e in s.events:
            if isinstance(e, (CreateForwardFn, Forward)) and e.desc is not None:
                current = e.desc
                if isinstance(e, Forward) and e.mode == P and e.key is not None:
                    keys.setdefault(e.desc, set()).add(tuple(e.key))
            elif isinstance(e, PiecewiseCapture) and current is not None:
                keys.setdefault(current, set()).add(tuple(e.key))
        keys_at.append((s.step if s.step is not None else -1, keys))

    def captured_keys(desc: BatchDescriptor, step: int) -> set[tuple] | None:
        for s_step, keys in reversed(keys_at):
            if s_step <= step and desc in keys:
                return keys[desc]
        return None

    _, views, _ = _timeline(scenario, trace)
    for v in views:
        d, b, step = v.dispatch.desc, v.dispatch.batch, v.dispatch.step
        piecewise_path = v.replay is not None and v.replay.path == "piecewise"
        if d.cg_mode != P and not piecewise_path:
            continue
        if v.captured is None:
            continue  # nothing captured (yet, or any more): BEFORE-CAPTURE's business
        known = captured_keys(d, step)
        runtime_keys = [tuple(lk.key) for lk in v.lookups] + [tuple(f.key) for f in v.runtime_forwards if f.key is not None and f.mode == P]
        if known:
            wrong = [k for k in dict.fromkeys(runtime_keys) if k not in known]
            if wrong:
                out.append(Violation(
                    "KEY-CONSISTENT",
                    f"{b.short()} dispatched to {d.short()} is looked up under key {wrong[0]}, but that piecewise graph "
                    f"was captured under {sorted(known, key=repr)}",
                    step,
                ))
                continue
        misses = [lk for lk in v.lookups if not lk.hit]
        if misses and (known is not None or piecewise_path or (v.captured is not None and d in v.captured.piecewise)):
            out.append(Violation(
                "KEY-CONSISTENT",
                f"{b.short()} dispatched to {d.short()}: piecewise lookup for key {tuple(misses[0].key)} missed"
                + (f" (captured keys: {sorted(known, key=repr)})" if known else " (no piecewise graph under that key)"),
                step,
            ))
    return _group(out)


def _applies_key_consistent(scenario: Scenario, trace: Trace) -> bool:
    dispatch_steps = {d.step for d in trace.of(Dispatch)}
    return any(lk.step in dispatch_steps for lk in trace.of(PiecewiseLookup)) or any(
        r.path == "piecewise" for r in trace.of(Replay)
    ) or any(d.desc.cg_mode == P for d in trace.of(Dispatch))


# --------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------
def check_dispatch_sound(scenario: Scenario, trace: Trace) -> list[Violation]:
    cases = scenario.config.lora_cases
    out: list[Violation] = []
    _, views, _ = _timeline(scenario, trace)
    for v in views:
        d, b, step = v.dispatch.desc, v.dispatch.batch, v.dispatch.step
        if d.cg_mode == N:
            if d.num_tokens < b.num_tokens:
                out.append(Violation("DISPATCH-SOUND", f"{b.short()} dispatched to eager {d.short()} with fewer tokens than the batch", step))
            continue
        if not compatible(d, b, cases):
            out.append(Violation(
                "DISPATCH-SOUND", f"{b.short()} dispatched to incompatible {d.short()}: {_incompat_reason(d, b, cases)}", step))
        if v.captured is None:
            continue  # before capture / after release: BEFORE-CAPTURE judges it
        if d.cg_mode == F:
            if d not in v.captured.stored:
                out.append(Violation(
                    "DISPATCH-SOUND", f"{b.short()} dispatched to FULL {d.short()}, but no graph is stored for it", step))
            elif v.replay is not None and v.replay.path != "full":
                out.append(Violation(
                    "DISPATCH-SOUND", f"{b.short()} dispatched to FULL {d.short()} ran on the {v.replay.path} path, not a graph replay", step))
        elif d.cg_mode == P:
            if not trace.has_piecewise_runner:
                out.append(Violation(
                    "DISPATCH-SOUND",
                    f"{b.short()} dispatched to PIECEWISE {d.short()}, but nothing runs piecewise graphs "
                    "(no compiled submodule, no breakable capture)",
                    step,
                ))
            elif d not in v.captured.piecewise:
                out.append(Violation(
                    "DISPATCH-SOUND", f"{b.short()} dispatched to PIECEWISE {d.short()}, which was not captured", step))
    return _group(out)


def _captured_views(scenario: Scenario, trace: Trace) -> list[_DispatchView]:
    return [v for v in _timeline(scenario, trace)[1] if v.captured is not None]


def check_dispatch_priority(scenario: Scenario, trace: Trace) -> list[Violation]:
    cases = scenario.config.lora_cases
    out: list[Violation] = []
    for v in _captured_views(scenario, trace):
        d, b = v.dispatch.desc, v.dispatch.batch
        if d.cg_mode == F:
            continue
        full = [c for c in v.captured.descs if c.cg_mode == F and compatible(c, b, cases)]
        if full:
            best = expected_dispatch(b, full, cases)
            out.append(Violation(
                "DISPATCH-PRIORITY",
                f"{b.short()} dispatched to {d.cg_mode.value} {d.short()} although the captured FULL {best.short()} fits it "
                "(expected FULL over PIECEWISE over NONE)",
                v.dispatch.step,
            ))
    return _group(out)


def check_dispatch_complete(scenario: Scenario, trace: Trace) -> list[Violation]:
    cases = scenario.config.lora_cases
    out: list[Violation] = []
    for v in _captured_views(scenario, trace):
        d, b = v.dispatch.desc, v.dispatch.batch
        if d.cg_mode != N:
            continue
        fits = [c for c in v.captured.descs if compatible(c, b, cases)]
        if fits:
            best = expected_dispatch(b, fits, cases)
            out.append(Violation(
                "DISPATCH-COMPLETE",
                f"{b.short()} ran eagerly ({d.short()}) although {len(fits)} captured descriptor(s) fit it, e.g. {best.short()}",
                v.dispatch.step,
            ))
    return _group(out)


def check_dispatch_minimal(scenario: Scenario, trace: Trace) -> list[Violation]:
    cases = scenario.config.lora_cases
    out: list[Violation] = []
    for v in _captured_views(scenario, trace):
        d, b = v.dispatch.desc, v.dispatch.batch
        if d.cg_mode == N or not compatible(d, b, cases):
            continue
        same = [c for c in v.captured.descs if c.cg_mode == d.cg_mode and compatible(c, b, cases)]
        if not same:
            continue
        least = min(padding_key(c, b) for c in same)
        got = padding_key(d, b)
        if got > least:
            better = expected_dispatch(b, same, cases)
            out.append(Violation(
                "DISPATCH-MINIMAL",
                f"{b.short()} dispatched to {d.short()} padding (tokens, reqs) = {got}; captured {better.short()} "
                f"pads only {least}",
                v.dispatch.step,
            ))
    return _group(out)


def _exact_shape(d: BatchDescriptor, b: Batch, cases: Sequence[int]) -> bool:
    return compatible(d, b, cases) and d.num_tokens == b.num_tokens and d.num_reqs in (None, b.num_reqs)


def check_dispatch_roundtrip(scenario: Scenario, trace: Trace) -> list[Violation]:
    cases = scenario.config.lora_cases
    out: list[Violation] = []
    for v in _captured_views(scenario, trace):
        d, b = v.dispatch.desc, v.dispatch.batch
        exact = [c for c in v.captured.descs if _exact_shape(c, b, cases)]
        if not exact:
            continue
        target = max(exact, key=lambda c: RUNTIME_RANK[c.cg_mode])
        rank, want = RUNTIME_RANK[d.cg_mode], RUNTIME_RANK[target.cg_mode]
        # Higher priority may pad requests (a FULL graph always fixes num_reqs)
        # but no tokens; the same priority must pad no more than the exact one.
        ok = d.cg_mode != N and compatible(d, b, cases) and (
            (rank > want and d.num_tokens == b.num_tokens)
            or (rank == want and padding_key(d, b) <= padding_key(target, b))
        )
        if not ok:
            out.append(Violation(
                "DISPATCH-ROUNDTRIP",
                f"{b.short()} has exactly the shape of captured {target.short()} but dispatched to {d.short()}"
                + (f" (pads {padding_key(d, b)})" if d.cg_mode != N else ""),
                v.dispatch.step,
            ))
    return _group(out)


def _applies_roundtrip(scenario: Scenario, trace: Trace) -> bool:
    cases = scenario.config.lora_cases
    return any(
        _exact_shape(c, v.dispatch.batch, cases) for v in _captured_views(scenario, trace) for c in v.captured.descs
    )


def check_before_capture(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    for e in trace.of(CaptureDone):
        if e.ok and not e.captured_flag:
            out.append(Violation(
                "BEFORE-CAPTURE", "capture finished but the manager is not marked captured (every dispatch will run eagerly)", e.step))
        elif not e.ok and e.captured_flag:
            out.append(Violation(
                "BEFORE-CAPTURE", "capture did not finish but the manager says it is captured", e.step))
    releases = [r.step for r in trace.of(Release)]
    for v in _timeline(scenario, trace)[1]:
        if v.captured is not None:
            continue
        d, b = v.dispatch.desc, v.dispatch.batch
        if d.cg_mode != N:
            when = ("after a release with no capture since" if any(r < v.dispatch.step for r in releases)
                    else "before any successful capture")
            out.append(Violation(
                "BEFORE-CAPTURE",
                f"{b.short()} dispatched {when} returned {d.short()} (expected NONE; manager captured_flag="
                f"{v.dispatch.captured_flag})",
                v.dispatch.step,
            ))
    return _group(out)


def _applies_before_capture(scenario: Scenario, trace: Trace) -> bool:
    return bool(trace.of(CaptureDone)) or any(v.captured is None for v in _timeline(scenario, trace)[1])


# --------------------------------------------------------------------------
# config-level: useful graphs, decode lengths, mode resolution
# --------------------------------------------------------------------------
def _nonuniform(r: int, t: int, mq: int) -> tuple[int, ...] | None:
    """r positive query lengths summing to t, the largest exactly mq, not all equal."""
    if r < 2 or mq < 2 or r > t or mq > t - (r - 1) or r * mq <= t:
        return None
    rest, n = t - mq, r - 1
    base, extra = divmod(rest, n)
    lens = (mq,) + (base + 1,) * extra + (base,) * (n - extra)
    if base < 1 or max(lens) != mq or len(set(lens)) < 2:
        return None
    return lens


def _probe_shapes(cfg: ManagerConfig, d: BatchDescriptor) -> set[tuple[int, ...]]:
    """Query-length tuples the scheduler can produce that fit ``d`` most
    tightly: the batches on which ``d`` has its best chance to be chosen.

    Producible: one request of any length; uniform decode batches with the
    scheduler's query length for their request count; equal-length batches
    whose length is no decode length at all (prefill chunks); non-uniform
    batches.  An equal-length batch whose length is a decode length the
    scheduler uses only for *other* request counts is not producible: that is
    how a decode graph for a length the schedule never applies shows as dead.

    Compatibility only tightens as a batch grows towards ``d`` (more tokens,
    more requests, a larger max_query_len exclude competitors), so the
    corners are: ``d``'s own token count (and one less), the most requests
    ``d`` admits (and one less), max_query_len at ``d``'s bound or as large as
    the batch allows.
    """
    max_size, max_reqs = cfg.max_capture_size, cfg.max_num_reqs
    shapes: set[tuple[int, ...]] = set()
    for t in {d.num_tokens, d.num_tokens - 1, d.uniform_token_count or 0, d.max_query_len or 0}:
        if 1 <= t <= max_size:
            shapes.add((t,))  # one request: a prefill chunk (or decode) of t tokens
    if d.uniform_token_count is not None:
        return shapes
    r_cap = min(max_reqs, d.num_reqs if d.num_reqs is not None else max_reqs)
    decode_lens = set(cfg.scheduler_decode_query_lens())
    t = min(d.num_tokens, max_size)
    for r in {min(r_cap, t), min(r_cap, t) - 1}:
        if r >= 2:
            u = t // r
            # Equal-length requests: a decode batch when u is the scheduler's
            # length for r requests, else a prefill that happens to be even.
            if u not in decode_lens or u == cfg.scheduler_decode_query_len(r):
                shapes.add((u,) * r)
    for t in (d.num_tokens, d.num_tokens - 1):
        if t < 3 or t > max_size:
            continue
        for r in {min(r_cap, t - 1), min(r_cap, t - 1) - 1}:
            if r < 2:
                continue
            lo = -(-t // r) + (1 if t % r == 0 else 0)
            for mq in {lo, t - r + 1, d.max_query_len or lo}:
                lens = _nonuniform(r, t, mq)
                if lens is not None:
                    shapes.add(lens)
    return shapes


def _decode_shapes(cfg: ManagerConfig) -> set[tuple[int, ...]]:
    shapes = set()
    for r in range(1, cfg.max_num_reqs + 1):
        q = cfg.scheduler_decode_query_len(r)
        if r * q > cfg.max_capture_size:
            continue  # a dynamic schedule may give more requests a shorter length
        shapes.add((q,) * r)
    return shapes


def _decode_producible(cfg: ManagerConfig, lens: tuple[int, ...]) -> bool:
    """Whether the scheduler can hand in ``lens`` as a pure decode batch: the
    schedule's length for that request count, or any lengths up to the decode
    query length with varlen decode."""
    if len(set(lens)) == 1 and lens[0] == cfg.scheduler_decode_query_len(len(lens)):
        return True
    return cfg.varlen_decode and max(lens) <= cfg.decode_query_len


def _batches_for(cfg: ManagerConfig, shapes: Iterable[tuple[int, ...]], lora: int, ubatches: int) -> list[Batch]:
    """Every shape as a batch with a prefill (any shape can be prompt chunks),
    and as a decode batch where the scheduler can produce it as one."""
    out = []
    for lens in shapes:
        if len(lens) > cfg.max_num_reqs:
            continue
        for prefill in (False, True):
            if not prefill and not _decode_producible(cfg, lens):
                continue
            b = Batch(lens, lora, 1, has_prefill=prefill)
            if ubatches > 1:
                if b.uniform_token_count is None or b.num_tokens < max(cfg.ubatch_threshold, ubatches):
                    continue
                b = Batch(lens, lora, ubatches, has_prefill=prefill)
            out.append(b)
    return out


def useless_descriptors(cfg: ManagerConfig, captured: Iterable[BatchDescriptor]) -> dict[BatchDescriptor, str]:
    """Captured descriptors that are never the unique dispatch choice for a
    batch the scheduler can produce, each with an example of where its
    batches go instead."""
    captured = list(dict.fromkeys(captured))
    cases = cfg.lora_cases
    buckets: dict[tuple[int, int], list[BatchDescriptor]] = {}
    for d in captured:
        buckets.setdefault((d.num_active_loras, d.num_ubatches), []).append(d)
    decode = _decode_shapes(cfg)
    useful: set[BatchDescriptor] = set()
    example: dict[BatchDescriptor, str] = {}
    for (lora, ub), bucket in buckets.items():
        if lora not in cases:
            continue  # INIT-TOTAL reports a descriptor for a non-existent LoRA case
        pending = set(bucket)
        batches = _batches_for(cfg, decode, lora, ub)
        for b in batches:
            choices = dispatch_choices(b, bucket, cases)
            if len(choices) == 1:
                useful |= choices
        pending -= useful
        for d in sorted(pending, key=lambda x: repr(x)):
            for b in _batches_for(cfg, _probe_shapes(cfg, d), lora, ub):
                choices = dispatch_choices(b, bucket, cases)
                if len(choices) == 1:
                    useful |= choices
                if choices == {d}:
                    break
                if d not in example and compatible(d, b, cases) and choices:
                    example[d] = f"e.g. {b.short()} goes to {_shorts(choices, 3)}"
    out = {}
    for d in captured:
        if d not in useful:
            out[d] = example.get(d, "no producible batch fits it")
    return out


def check_capture_useful(scenario: Scenario, trace: Trace) -> list[Violation]:
    cfg = scenario.config
    out: list[Violation] = []
    judged: set[frozenset] = set()
    for cap in _timeline(scenario, trace)[2]:
        if not cap.descs or cap.descs in judged:
            continue
        judged.add(cap.descs)
        for d, why in useless_descriptors(cfg, cap.descs).items():
            out.append(Violation(
                "CAPTURE-USEFUL",
                f"captured {d.short()} is never the unique dispatch choice for a batch the scheduler can produce "
                f"(up to {cfg.max_capture_size} tokens, {cfg.max_num_reqs} requests): {why}",
                cap.step,
            ))
    return _group(out)


def _decode_routine(scenario: Scenario, trace: Trace) -> bool:
    mode = trace.resolved_mode or _spec_mode(scenario)
    return (
        mode is not None and mode.separate_routine() and mode.decode_mode() == F and not scenario.config.varlen_decode
    )


def check_decode_lengths(scenario: Scenario, trace: Trace) -> list[Violation]:
    if not _decode_routine(scenario, trace):
        return []
    cfg = scenario.config
    scheduler = set(cfg.scheduler_decode_query_lens())
    spec = _spec_descs(scenario)
    # Lengths for which some capture size gives a FULL decode graph within the bounds.
    feasible = {d.uniform_token_count for d in (spec or {}).get(F, ()) if d.uniform_token_count is not None} if spec is not None else scheduler
    sources: list[tuple[int | None, str, list[BatchDescriptor]]] = []
    for s in _sessions(scenario, trace):
        if s.ok:
            sources.append((s.step, "stored FULL graphs", s.stored))
    if not sources:
        for c in trace.of(Candidates):
            if c.phase == "initial":
                sources.append((c.step, "FULL capture descriptors", list(c.capture_descs)))
    out: list[Violation] = []
    for step, what, descs in sources:
        lens = {d.uniform_token_count for d in descs if d.cg_mode == F and d.uniform_token_count is not None}
        extra, missing = lens - scheduler, feasible - lens
        sched_text = f"the scheduler produces {sorted(scheduler)}"
        if cfg.spec_schedule is not None:
            sched_text += f" (dynamic schedule {[list(e) for e in cfg.spec_schedule]} clamped to {cfg.num_speculative_tokens} spec tokens, {cfg.max_num_reqs} reqs)"
        if extra:
            ex = [d for d in descs if d.cg_mode == F and d.uniform_token_count in extra]
            out.append(Violation(
                "DECODE-LENGTHS",
                f"{what} include decode query length(s) {sorted(extra)} the scheduler never produces, e.g. {ex[0].short()}; {sched_text}",
                step,
            ))
        if missing:
            out.append(Violation(
                "DECODE-LENGTHS",
                f"{what} have no FULL decode graph for query length(s) {sorted(missing)}; {sched_text}, graphs exist for {sorted(lens)}",
                step,
            ))
    return _group(out)


def _applies_decode_lengths(scenario: Scenario, trace: Trace) -> bool:
    return _decode_routine(scenario, trace) and (
        any(s.ok for s in _sessions(scenario, trace)) or any(c.phase == "initial" for c in trace.of(Candidates))
    )


def check_mode_resolution(scenario: Scenario, trace: Trace) -> list[Violation]:
    cfg = scenario.config
    got = trace.resolved_mode
    built_failed = any(_is_build_error(trace, e) for e in trace.errors)
    try:
        want: CUDAGraphMode | None = resolved_mode(cfg)
        reason = ""
    except (ModeResolutionError, ValueError) as exc:
        want, reason = None, str(exc)
    inputs = (f"requested {cfg.mode.value}, support {cfg.attention_support.name}, q={cfg.decode_query_len}, "
              f"attention_split={cfg.attention_split}, piecewise_available={cfg.piecewise_available}")
    out: list[Violation] = []
    if want is None:
        if got is not None and not built_failed:
            out.append(Violation(
                "MODE-RESOLUTION", f"{inputs}: the spec rejects this config ({reason}) but the target resolved it to {got.value}"))
        return out
    if got is None:
        return out
    if got != want:
        out.append(Violation("MODE-RESOLUTION", f"{inputs}: resolved to {got.value}, expected {want.value}"))
    need = required_support(got, cfg.decode_query_len)
    if need > cfg.attention_support:
        out.append(Violation(
            "MODE-RESOLUTION",
            f"{inputs}: resolved mode {got.value} needs attention support {need.name} > declared {cfg.attention_support.name}"))
    return out


def _applies_mode_resolution(scenario: Scenario, trace: Trace) -> bool:
    return trace.resolved_mode is not None or any(_is_build_error(trace, e) for e in trace.errors)


# --------------------------------------------------------------------------
# errors, replay results, release
# --------------------------------------------------------------------------
def check_no_illegal_op(scenario: Scenario, trace: Trace) -> list[Violation]:
    return [
        Violation("NO-ILLEGAL-OP", f"illegal operation during {e.phase}: {e.exc_type}: {e.message}", e.step)
        for e in trace.errors
        if e.error == "illegal-op"
    ]


def check_no_crash(scenario: Scenario, trace: Trace) -> list[Violation]:
    words = {"crash": "raised", "timeout": "hung (timeout)", "corrupt": "corrupted its state"}
    return [
        Violation("NO-CRASH", f"target {words.get(e.error, e.error)} during {e.phase}: {e.exc_type}: {e.message}", e.step)
        for e in trace.errors
        if e.error != "illegal-op" and not _is_build_error(trace, e)
    ]


def check_replay_equals_eager(scenario: Scenario, trace: Trace) -> list[Violation]:
    out = []
    for r in trace.of(Replay):
        if not r.outputs_ok:
            err = "no output produced" if r.max_abs_err is None else f"max abs error {r.max_abs_err:g} over the real rows"
            out.append(Violation(
                "REPLAY-EQUALS-EAGER",
                f"{r.path} run of {r.desc.short()} for {r.batch.short()} differs from eager: {err}"
                + (f" (graph from capture step {r.graph_from_step})" if r.graph_from_step is not None else ""),
                r.step,
            ))
    return _group(out)


def check_release_recapture(scenario: Scenario, trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    releases = trace.of(Release)
    for e in releases:
        if e.graphs_after != 0:
            out.append(Violation("RELEASE-RECAPTURE", f"release left {e.graphs_after} graph(s) stored (expected 0)", e.step))
        if e.captured_flag_after:
            out.append(Violation("RELEASE-RECAPTURE", "release left the manager marked captured", e.step))
    # Captures that actually recorded graphs (a capture() that found everything
    # already captured records none and does not make older graphs stale).
    storing = [s.step for s in _sessions(scenario, trace) if s.ok and s.captured_something and s.step is not None]
    for r in trace.of(Replay):
        if r.graph_from_step is None:
            continue
        released = [x.step for x in releases if x.step < r.step]
        recaptured = [x for x in storing if x < r.step]
        head = f"{r.path} replay of {r.desc.short()} for {r.batch.short()}"
        if released and r.graph_from_step < released[-1]:
            out.append(Violation(
                "RELEASE-RECAPTURE",
                f"{head} used a graph from capture step {r.graph_from_step}, released at step {released[-1]}", r.step))
        elif recaptured and r.graph_from_step < recaptured[-1]:
            out.append(Violation(
                "RELEASE-RECAPTURE",
                f"{head} used a stale graph from capture step {r.graph_from_step}; the latest capture was at step "
                f"{recaptured[-1]}", r.step))
    return _group(out)


# --------------------------------------------------------------------------
# applies helpers
# --------------------------------------------------------------------------
def _has_sessions(scenario: Scenario, trace: Trace) -> bool:
    return any(s.events or s.done is not None for s in _sessions(scenario, trace))


def _has_capture_forwards(scenario: Scenario, trace: Trace) -> bool:
    return any(s.forwards for s in _sessions(scenario, trace))


def _has_fresh_candidates(scenario: Scenario, trace: Trace) -> bool:
    for s in _sessions(scenario, trace):
        for f in s.forwards:
            if f.desc is None:
                continue
            if (_is_full_capture(f) and f.desc.cg_mode == F) or (f.mode == P and f.desc.cg_mode == P and trace.uses_breakable):
                return True
    return False


def _has_candidates(phase: str | None = None) -> Callable[[Scenario, Trace], bool]:
    return lambda s, t: any(phase is None or c.phase == phase for c in t.of(Candidates))


def _has_dispatch(scenario: Scenario, trace: Trace) -> bool:
    return bool(trace.of(Dispatch))


def _has_captured_dispatch(scenario: Scenario, trace: Trace) -> bool:
    return bool(_captured_views(scenario, trace))


def _has_metadata_replay(scenario: Scenario, trace: Trace) -> bool:
    return any(_metadata_judged(scenario, trace, r) or r.metadata_alive is not None for r in trace.of(Replay))


def _has_padded_replay(scenario: Scenario, trace: Trace) -> bool:
    return any(_metadata_judged(scenario, trace, r) for r in trace.of(Replay))


def _has_finished_capture(scenario: Scenario, trace: Trace) -> bool:
    return any(c.descs for c in _timeline(scenario, trace)[2])


def _always(scenario: Scenario, trace: Trace) -> bool:
    return True


def _has_replay(scenario: Scenario, trace: Trace) -> bool:
    return bool(trace.of(Replay))


def _has_release_or_recapture(scenario: Scenario, trace: Trace) -> bool:
    return bool(trace.of(Release)) or len(trace.of(CaptureDone)) > 1


def _has_capture_or_illegal(scenario: Scenario, trace: Trace) -> bool:
    return _has_sessions(scenario, trace) or any(e.error == "illegal-op" for e in trace.errors)


# --------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------
def _p(id_: str, statement: str, check, applies) -> Property:
    return Property(id_, statement, check, applies)


PROPERTIES: dict[str, Property] = {
    p.id: p
    for p in (
        _p("CAND-ORDER", "candidate init run again on the finished manager gives the same descriptors and candidates, "
           "and they match the spec", check_cand_order, _has_candidates()),
        _p("CAND-BOUNDS", "every descriptor has 0 < num_tokens <= max capture size, num_reqs <= min(num_tokens, max_num_reqs), "
           "FULL uniform decode num_tokens = num_reqs x uniform_token_count, no duplicates", check_cand_bounds,
           _has_candidates("initial")),
        _p("CAPTURE-ORDER", "PIECEWISE captured before FULL, largest first within a mode", check_capture_order,
           _has_capture_forwards),
        _p("CAPTURE-ONCE", "each FULL descriptor captured exactly once; stored graphs = FULL capture list",
           check_capture_once, _has_sessions),
        _p("WARMUP-FIRST", "every capture of a descriptor is preceded by its warmup", check_warmup_first,
           _has_capture_forwards),
        _p("FRESH-METADATA", "FULL and breakable PIECEWISE captures use metadata that is not the warmup's "
           "(identity and no shared state)", check_fresh_metadata, _has_fresh_candidates),
        _p("SKIP-ATTN", "attention metadata is None exactly when the ruleset says skip", check_skip_attn,
           _has_capture_forwards),
        _p("METADATA-LIVE", "metadata read by a stored graph is alive and not rebound until the graph is released",
           check_metadata_live, _has_metadata_replay),
        _p("PAD-CONSISTENT", "the metadata a graph was captured with covers every batch dispatched to it",
           check_pad_consistent, _has_padded_replay),
        _p("KEY-CONSISTENT", "a piecewise graph is looked up under the key it was captured under",
           check_key_consistent, _applies_key_consistent),
        _p("CAPTURE-USEFUL", "every captured descriptor is the unique dispatch choice for some batch the scheduler "
           "can produce", check_capture_useful, _has_finished_capture),
        _p("DECODE-LENGTHS", "FULL decode graphs exist for exactly the decode query lengths the scheduler produces",
           check_decode_lengths, _applies_decode_lengths),
        _p("INIT-TOTAL", "building the manager succeeds for every valid config and every descriptor is sane",
           check_init_total, _applies_init_total),
        _p("NO-ILLEGAL-OP", "nothing illegal (host sync, data-dependent shape, pageable copy) during capture",
           check_no_illegal_op, _has_capture_or_illegal),
        _p("DISPATCH-SOUND", "the dispatched descriptor fits the batch and something runs it",
           check_dispatch_sound, _has_dispatch),
        _p("DISPATCH-PRIORITY", "if a captured FULL descriptor fits the batch, dispatch returns FULL",
           check_dispatch_priority, _has_captured_dispatch),
        _p("DISPATCH-COMPLETE", "if any captured descriptor fits the batch, dispatch does not return NONE",
           check_dispatch_complete, _has_captured_dispatch),
        _p("DISPATCH-MINIMAL", "among fitting captured descriptors of the chosen mode, dispatch pads least",
           check_dispatch_minimal, _has_captured_dispatch),
        _p("DISPATCH-ROUNDTRIP", "a batch exactly the shape of a captured descriptor dispatches to it "
           "(or to one of higher priority that pads no more)", check_dispatch_roundtrip, _applies_roundtrip),
        _p("BEFORE-CAPTURE", "dispatch before capture (or after release) returns NONE", check_before_capture,
           _applies_before_capture),
        _p("REPLAY-EQUALS-EAGER", "outputs after replay equal eager outputs on the real rows",
           check_replay_equals_eager, _has_replay),
        _p("MODE-RESOLUTION", "the resolved mode matches SPEC §2 and needs no more support than declared",
           check_mode_resolution, _applies_mode_resolution),
        _p("RELEASE-RECAPTURE", "release drops every graph and the captured flag; nothing from before is replayed "
           "after a recapture", check_release_recapture, _has_release_or_recapture),
        # Not in SPEC §4: the target raised, hung or corrupted its state after it was built.
        _p("NO-CRASH", "the target does not raise, hang or corrupt its state in capture, dispatch, replay or release",
           check_no_crash, _always),
    )
}

EXTRA_PROPERTY_IDS = ("NO-CRASH",)


def property_ids() -> tuple[str, ...]:
    return tuple(PROPERTIES)


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
    violations: list[Violation] = []
    checked: list[str] = []
    if getattr(trace, "unsupported", None):
        # The target refuses this config the way the real engine would at
        # start-up: there is no run to judge.
        return Verdict((), ())
    token = _VIEW_CACHE.set({})
    try:
        for prop in chosen:
            if not prop.applies(scenario, trace):
                continue
            checked.append(prop.id)
            violations.extend(prop.check(scenario, trace))
    finally:
        _VIEW_CACHE.reset(token)
    return Verdict(tuple(violations), tuple(checked))
