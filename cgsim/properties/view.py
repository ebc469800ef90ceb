"""A view of one run, built once per (Scenario, Trace) and handed to every check.

How the trace is cut up (see ``cgsim.trace`` for the events):

- A capture *session* is the run of capture events up to a ``CaptureDone``
  (or up to an ``Error`` / dispatch / release when capture never finished).
  ``CreateForwardFn`` carries no step, so it belongs to the session it sits in.
- The *captured set* while dispatching is what the manager holds: the
  ``GraphStored`` descriptors since the last ``Release`` plus, once a capture
  finished (``CaptureDone.ok``) and a piecewise runner exists, the PIECEWISE
  descriptors of the "initial" ``Candidates`` of that capture.

Traces may end early with an ``Error`` event; every view is built from what
is there and never raises on a partial trace.  Nothing here imports torch, a
target or the runner: a Trace written next to a finding can be judged again
anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress, repeat
from operator import and_, attrgetter, contains, ge, is_, not_, or_
from typing import Any, Callable, Iterable, Sequence

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape, lora_case
from cgsim.modes import CUDAGraphMode, ModeResolutionError
from cgsim.properties.registry import Violation
from cgsim.scenario import Scenario, Step
from cgsim.spec import desc_sort_key, expected_capture_descs, get_ruleset, resolved_mode
from cgsim.spec.fit import NO_FIT, Fit, best_fits, compatible
from cgsim.spec.rulesets import Ruleset
from cgsim.trace import (
    Candidates,
    CaptureDone,
    CreateForwardFn,
    Dispatch,
    Error,
    Event,
    Forward,
    GraphBytes,
    GraphStored,
    MetadataRecord,
    PiecewiseCapture,
    PiecewiseLookup,
    Release,
    Replay,
    Sweep,
    Trace,
)

__all__ = [
    "graph_gap",
    "RunView",
    "SweepView",
    "Fit",
    "Session",
    "Captured",
    "DispatchView",
    "is_warmup",
    "is_capture_pass",
    "is_full_capture",
    "shorts",
    "shown",
    "list_short",
    "mode_name",
    "incompat_reason",
    "group",
    "size_key",
    "sweep_violations",
    "not_run",
    "MAX_PER_GROUP",
]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
_MODE, _TOKENS = attrgetter("cg_mode"), attrgetter("num_tokens")
_CHOICES, _EXACT = attrgetter("choices"), attrgetter("exact")

# At most this many violations of one kind per capture session / per property,
# so a systematically broken target gives a readable finding, not thousands.
MAX_PER_GROUP = 8


@dataclass
class Session:
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
    def captured_something(self) -> bool:
        return any(is_capture_pass(f) for f in self.forwards) or any(isinstance(e, PiecewiseCapture) for e in self.events)


@dataclass
class Captured:
    """What the manager holds after a finished capture."""

    step: int | None
    stored: frozenset[BatchDescriptor]
    piecewise: frozenset[BatchDescriptor]

    @cached_property
    def descs(self) -> frozenset[BatchDescriptor]:
        return self.stored | self.piecewise


@dataclass
class DispatchView:
    dispatch: Dispatch
    captured: Captured | None  # None: not captured (never, failed, or released)
    replay: Replay | None = None
    lookups: list[PiecewiseLookup] = field(default_factory=list)
    runtime_forwards: list[Forward] = field(default_factory=list)


# Best fits of recent sweeps, oldest first: (swept batches' identity, captured
# descriptors, LoRA cases) -> (those batches, their fits).  The batches are
# kept so that their identity cannot be reused while the entry lives.
_FITS: dict[tuple, tuple[tuple[BatchShape, ...], list[Fit]]] = {}
_FITS_BOUND = 64


class SweepView:
    """One sweep with the captured state it saw, and, for each swept batch,
    the best fitting captured graphs per mode (computed once, shared by every
    dispatch property).  A scenario's own dispatch step is judged as a sweep
    of its one batch (``dispatch`` set, ``RunView.step_sweeps``): the
    dispatch properties have one loop, over ``RunView.judged_sweeps``.

    Best fit: among the captured descriptors of the batch's LoRA case and
    micro-batch count that are compatible with it, those that pad least
    (tokens, then requests) - scanned by increasing token count, so only the
    smallest fitting token groups are ever looked at."""

    def __init__(self, sweep: Sweep, captured: Captured | None, lora_cases: Sequence[int], after: str,
                 has_piecewise_runner: bool = False, dispatch: "DispatchView | None" = None):
        self.sweep = sweep
        # The dispatch step this view stands for (None: a dispatch sweep of the runner's).
        self.dispatch = dispatch
        self.captured = captured
        self.lora_cases = tuple(lora_cases)
        self.after = after  # "capture" | "release" | "start"
        self.has_piecewise_runner = has_piecewise_runner
        self._fits: list[Fit] | None = None
        self._disputed: list[tuple[BatchShape, BatchDescriptor, Fit]] | None = None
        self._exact: list[tuple[BatchShape, BatchDescriptor, Fit]] | None = None

    @property
    def step(self) -> int:
        return self.sweep.step

    def entries(self) -> Iterable[tuple[int, BatchShape, BatchDescriptor]]:
        return ((i, b, d) for i, (b, d) in enumerate(zip(self.sweep.batches, self.sweep.descs)))

    def judged(self) -> Iterable[tuple[BatchShape, BatchDescriptor, Fit]]:
        """(batch, what dispatch returned, what fits it best), for every swept batch."""
        return zip(self.sweep.batches, self.sweep.descs, self.fits())

    def disputed(self) -> list[tuple[BatchShape, BatchDescriptor, Fit]]:
        """The swept batches whose decision is not the oracle's, as ``judged``.

        The oracle's decisions: one of ``Fit.choices`` (the best fits of the
        highest-priority mode that fits) that something runs, or, where
        nothing fits, an eager run of at least the batch's tokens.  Such a
        decision is sound, prioritized, complete and minimal by construction
        of the fit, so DISPATCH-SOUND, -PRIORITY, -COMPLETE, -MINIMAL and
        BEFORE-CAPTURE judge only these (most of a sweep agrees; each
        property still judges a disputed batch by its own rule).  A property
        that may fault one of the oracle's own choices (DISPATCH-ROUNDTRIP)
        reads ``judged``."""
        if self._disputed is None:
            sw, fits = self.sweep, self.fits()
            descs, batches = sw.descs, sw.batches
            # Per batch, in C-level passes over the whole sweep: the decision is
            # one of the choices, or nothing fits and it runs the batch eagerly, whole.
            chosen = list(map(contains, map(_CHOICES, fits), descs))
            eager_whole = map(and_, map(is_, map(_MODE, descs), repeat(N)),
                              map(ge, map(_TOKENS, descs), map(_TOKENS, batches)))
            agreed = list(map(or_, chosen, map(and_, map(not_, map(_CHOICES, fits)), eager_whole)))
            # A chosen graph that nothing runs is no agreement (asked once per distinct decision).
            picked = list(compress(descs, chosen))
            idle = {key for key, d in dict(zip(map(id, picked), picked)).items()
                    if self.captured is None or self.not_run(d) is not None}
            if idle:
                agreed = [a and id(d) not in idle for a, d in zip(agreed, descs)]
            self._disputed = list(compress(zip(batches, descs, fits), map(not_, agreed)))
        return self._disputed

    def landing(self, mode: CUDAGraphMode) -> Iterable[tuple[BatchShape, BatchDescriptor]]:
        """(batch, decision) of the swept batches dispatched to a ``mode`` graph."""
        sw = self.sweep
        return compress(zip(sw.batches, sw.descs), map(is_, map(_MODE, sw.descs), repeat(mode)))

    def exact(self) -> list[tuple[BatchShape, BatchDescriptor, Fit]]:
        """``judged`` of the swept batches some captured graph has exactly the shape of."""
        if self._exact is None:
            fits = self.fits()
            self._exact = list(compress(zip(self.sweep.batches, self.sweep.descs, fits), map(_EXACT, fits)))
        return self._exact

    def when(self) -> str:
        if self.after == "start":
            return "in the dispatch sweep before the first capture"
        return f"in the dispatch sweep after the {self.after} at step {self.step}"

    def uncaptured_when(self) -> str:
        """When this view's batches were dispatched with no graphs held, in words."""
        if self.dispatch is not None:
            return "after a release with no capture since" if self.after == "release" else "before any successful capture"
        return "after a release" if self.after == "release" else "before any successful capture"

    def not_run(self, d: BatchDescriptor) -> str | None:
        """Why nothing runs graph ``d`` here (None: something does); a dispatch
        step also says so when its FULL graph ran on another path than a replay."""
        assert self.captured is not None
        why = not_run(d, self.captured, self.has_piecewise_runner)
        replay = self.dispatch.replay if self.dispatch is not None else None
        if why is None and d.cg_mode is F and replay is not None and replay.path != "full":
            return f"FULL {d.short()} ran on the {replay.path} path, not a graph replay"
        return why

    def fitting(self, b: Any, fit: Fit, mode: CUDAGraphMode | None = None) -> list[BatchDescriptor]:
        """The captured graphs of ``mode`` (None: any) that fit swept batch
        ``b``: every one for a dispatch step, the best fits per mode for a
        sweep (whose thousands of batches are judged from their best fits)."""
        if self.dispatch is not None and self.captured is not None:
            return [c for c in self.captured.descs
                    if (mode is None or c.cg_mode == mode) and compatible(c, b, self.lora_cases)]
        if mode is not None:
            best = fit.by_mode.get(mode)
            return list(best[1]) if best else []
        return [c for _, descs in fit.by_mode.values() for c in descs]

    def fits(self) -> list[Fit]:
        if self._fits is None:
            self._fits = self._compute()
        return self._fits

    def best(self, i: int) -> dict[CUDAGraphMode, tuple[tuple[int, int], tuple[BatchDescriptor, ...]]]:
        return self.fits()[i].by_mode

    def choices(self, i: int) -> tuple[BatchDescriptor, ...]:
        """What a correct dispatcher may return (empty: nothing fits, run eagerly)."""
        return self.fits()[i].choices

    def _compute(self) -> list[Fit]:
        if not (self.captured and self.captured.descs):
            return [NO_FIT] * len(self.sweep.batches)
        if self.dispatch is not None:
            return best_fits(self.sweep.batches, self.captured.descs, self.lora_cases)
        # The runner plans a config's sweep once, so a config drawn again (or
        # captured again in one run) sweeps the very same batches into the same
        # graphs: their best fits are the same too.
        batches = self.sweep.batches
        key = (id(batches), self.captured.descs, self.lora_cases)
        hit = _FITS.get(key)
        if hit is not None and hit[0] is batches:
            return hit[1]
        fits = best_fits(batches, self.captured.descs, self.lora_cases)
        if len(_FITS) >= _FITS_BOUND:
            del _FITS[next(iter(_FITS))]
        _FITS[key] = (batches, fits)
        return fits


def graph_gap(mode: CUDAGraphMode, stored: bool, piecewise_runner: bool, piecewise_captured: bool) -> str | None:
    """Why nothing runs a graph of ``mode`` that dispatch returned: "not
    stored" (FULL, and no graph is ``stored`` for it), "no piecewise runner"
    or "not captured" (PIECEWISE); None: something does.  DISPATCH-SOUND's
    second half and the oracle's (``SweepView.disputed``); export-test
    carries this rule as written."""
    if mode is CUDAGraphMode.FULL and not stored:
        return "not stored"
    if mode is CUDAGraphMode.PIECEWISE and not piecewise_runner:
        return "no piecewise runner"
    if mode is CUDAGraphMode.PIECEWISE and not piecewise_captured:
        return "not captured"
    return None


_GAP_WORDS = {
    "not stored": "FULL {}, but no graph is stored for it",
    "no piecewise runner": "PIECEWISE {}, but nothing runs piecewise graphs",
    "not captured": "PIECEWISE {}, which was not captured",
}


def not_run(d: BatchDescriptor, captured: Captured, has_piecewise_runner: bool) -> str | None:
    """Why nothing runs graph ``d`` in a captured state (None: something does)."""
    gap = graph_gap(d.cg_mode, d in captured.stored, has_piecewise_runner, d in captured.piecewise)
    return None if gap is None else _GAP_WORDS[gap].format(d.short())


def is_warmup(f: Forward) -> bool:
    return f.mode == N and not f.in_graph


def is_capture_pass(f: Forward) -> bool:
    """The pass that is recorded: inside a FULL graph, or the PIECEWISE pass."""
    return f.in_graph or f.mode == P


def is_full_capture(f: Forward) -> bool:
    """The forward recorded into a FULL graph.  (A breakable PIECEWISE capture
    may also report in_graph: its pieces are graphs too; it runs as PIECEWISE.)"""
    return f.in_graph and f.mode != P


class RunView:
    """Everything the checks derive from one run, computed on first use."""

    def __init__(self, scenario: Scenario, trace: Trace):
        self.scenario = scenario
        self.trace = trace
        # The config as the ruleset's design sees it (rounded capture sizes,
        # the adaptive-verification route); as given when the design refuses it.
        try:
            self.config: ManagerConfig = get_ruleset(scenario.ruleset).effective_config(scenario.config)
        except ValueError:
            self.config = scenario.config

    @cached_property
    def ruleset(self) -> Ruleset:
        return get_ruleset(self.scenario.ruleset)

    @cached_property
    def capture_steps(self) -> frozenset[int]:
        return frozenset(i for i, s in enumerate(self.scenario.steps) if s.kind == "capture")

    # -- the spec's answers (None when the spec rejects the config) -------------
    @cached_property
    def spec_descs(self) -> dict[CUDAGraphMode, tuple[BatchDescriptor, ...]] | None:
        try:
            return expected_capture_descs(self.config, self.scenario.ruleset)
        except (ModeResolutionError, ValueError):
            return None

    @cached_property
    def spec_mode(self) -> CUDAGraphMode | None:
        try:
            return resolved_mode(self.config)
        except (ModeResolutionError, ValueError):
            return None

    # -- trace views ------------------------------------------------------------
    def of(self, cls: type) -> list:
        return self.trace.of(cls)

    @cached_property
    def errors(self) -> list[Error]:
        return self.trace.errors

    @cached_property
    def sessions(self) -> list[Session]:
        capture_steps = self.capture_steps
        out: list[Session] = []
        cur: list[Event] = []
        cur_step: int | None = None
        held: set[BatchDescriptor] = set()  # graphs stored since the last release

        def close(done: CaptureDone | None, step: int | None) -> None:
            nonlocal cur, cur_step
            if cur or done is not None:
                recaptured = {f.desc for f in cur if isinstance(f, Forward) and is_full_capture(f)}
                stored = {e.desc for e in cur if isinstance(e, GraphStored)}
                carried = frozenset(d for d in stored if d in held and d not in recaptured)
                held.update(stored)
                out.append(Session(step if step is not None else cur_step, cur, done, carried))
            cur, cur_step = [], None

        for e in self.trace.events:
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

    @cached_property
    def graph_bytes(self) -> dict[int, list[GraphBytes]]:
        """Per capture step, the memory of the FULL graphs that capture
        captured (graphs carried over from an earlier capture left out), largest first."""
        carried = {s.step: s.carried for s in self.sessions}
        out: dict[int, list[GraphBytes]] = {}
        for e in self.of(GraphBytes):
            if e.desc not in carried.get(e.step, frozenset()):
                out.setdefault(e.step, []).append(e)
        for graphs in out.values():
            graphs.sort(key=lambda e: desc_sort_key(e.desc))
        return out

    def initial_candidates(self, step: int | None) -> Candidates | None:
        cands = [e for e in self.of(Candidates) if e.phase == "initial"]
        if not cands:
            return None
        exact = [c for c in cands if c.step == step]
        if exact:
            return exact[-1]
        before = [c for c in cands if step is None or c.step <= step]
        return before[-1] if before else cands[-1]

    def _piecewise_set(self, session: Session) -> frozenset[BatchDescriptor]:
        if not self.trace.has_piecewise_runner:
            return frozenset()
        cand = self.initial_candidates(session.step)
        if cand is not None:
            return frozenset(d for d in cand.capture_descs if d.cg_mode == P)
        # No candidates recorded: the PIECEWISE descriptors that had a capture pass.
        return frozenset(f.desc for f in session.forwards if f.desc is not None and f.desc.cg_mode == P and f.mode == P)

    @cached_property
    def _timeline(self) -> tuple[list[DispatchView], list[Captured], list[SweepView]]:
        by_done = {id(s.done): s for s in self.sessions if s.done is not None}
        stored: set[BatchDescriptor] = set()
        captured: Captured | None = None
        finished: list[Captured] = []
        views: list[DispatchView] = []
        sweeps: list[SweepView] = []
        by_step: dict[int, DispatchView] = {}
        steps = self.scenario.steps
        for e in self.trace.events:
            if isinstance(e, GraphStored):
                stored.add(e.desc)
            elif isinstance(e, CaptureDone):
                if e.ok:
                    session = by_done.get(id(e))
                    pw = self._piecewise_set(session) if session is not None else frozenset()
                    captured = Captured(e.step, frozenset(stored), pw)
                    finished.append(captured)
                else:
                    captured = None
            elif isinstance(e, Release):
                stored.clear()
                captured = None
            elif isinstance(e, Dispatch):
                v = DispatchView(e, captured)
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
            elif isinstance(e, Sweep):
                after = "start" if e.step < 0 or e.step >= len(steps) else steps[e.step].kind
                sweeps.append(SweepView(e, captured, self.config.lora_cases, after, self.trace.has_piecewise_runner))
        return views, finished, sweeps

    @property
    def dispatches(self) -> list[DispatchView]:
        """Every dispatch with the captured state it saw."""
        return self._timeline[0]

    @cached_property
    def captured_dispatches(self) -> list[DispatchView]:
        return [v for v in self.dispatches if v.captured is not None]

    @property
    def finished_captures(self) -> list[Captured]:
        """The captured state after each finished capture."""
        return self._timeline[1]

    @property
    def sweeps(self) -> list[SweepView]:
        return self._timeline[2]

    @cached_property
    def captured_sweeps(self) -> list[SweepView]:
        return [s for s in self.sweeps if s.captured is not None]

    @cached_property
    def step_sweeps(self) -> list[SweepView]:
        """Each dispatch step as a sweep of its one batch, with the captured state it saw."""
        releases = [r.step for r in self.of(Release)]
        out = []
        for v in self.dispatches:
            d = v.dispatch
            # Whether a release came before the step: the words a finding while nothing is captured uses.
            after = "release" if any(r < d.step for r in releases) else "start"
            sweep = Sweep(d.step, d.captured_flag, (d.batch,), (d.desc,), "step", 1)
            out.append(SweepView(sweep, v.captured, self.config.lora_cases, after, self.trace.has_piecewise_runner, v))
        return out

    @cached_property
    def judged_sweeps(self) -> list[SweepView]:
        """What the dispatch properties judge: every dispatch step (a sweep of one batch), then every sweep."""
        return self.step_sweeps + self.sweeps

    @cached_property
    def judged_captured(self) -> list[SweepView]:
        """``judged_sweeps`` taken while graphs were held."""
        return [s for s in self.judged_sweeps if s.captured is not None]

    @cached_property
    def graph_metadata(self) -> dict[tuple[int, BatchDescriptor], MetadataRecord]:
        """(capture step, FULL descriptor) -> the metadata its graph was captured with."""
        out: dict[tuple[int, BatchDescriptor], MetadataRecord] = {}
        for s in self.sessions:
            for f in s.forwards:
                if is_full_capture(f) and f.desc is not None and f.metadata is not None and s.step is not None:
                    rec = self.trace.metadata.get(f.metadata)
                    if rec is not None:
                        out[(s.step, f.desc)] = rec
        return out

    @cached_property
    def _graph_metadata_by_desc(self) -> dict[BatchDescriptor, list[tuple[int, MetadataRecord]]]:
        out: dict[BatchDescriptor, list[tuple[int, MetadataRecord]]] = {}
        for (s, d), rec in self.graph_metadata.items():
            out.setdefault(d, []).append((s, rec))
        return out

    def captured_with(self, desc: BatchDescriptor, step: int) -> MetadataRecord | None:
        """The metadata the graph for ``desc`` that is live at ``step`` was captured with."""
        best = None
        for s, rec in self._graph_metadata_by_desc.get(desc, ()):
            if s <= step and (best is None or s > best[0]):
                best = (s, rec)
        return best[1] if best else None

    def is_build_error(self, e: Error) -> bool:
        """Raised while building the manager.  A timeout during build may carry the
        workload's phase instead of "build": nothing the runner records after a
        successful build (resolved mode, initial candidates) exists then."""
        if e.phase == "build":
            return True
        t = self.trace
        return t.resolved_mode is None and not t.of(Candidates) and not t.of(CaptureDone)

    def metadata(self, mid: int | None) -> MetadataRecord | None:
        return None if mid is None else self.trace.metadata.get(mid)

    def manager_views(self) -> dict[str, "RunView"]:
        """A view of each other manager's sub-trace (a draft model's prefill
        and decode managers), under that manager's config: the same steps,
        each dispatch step with the batch that manager was asked about."""
        out: dict[str, RunView] = {}
        for name, sub in self.trace.managers.items():
            if sub.config is None:
                continue
            asked = {e.step: e.batch for e in sub.of(Dispatch)}
            steps = tuple(s if s.kind != "dispatch" else Step.dispatch(asked.get(i, _NOT_ASKED))
                          for i, s in enumerate(self.scenario.steps))
            # A speculative-decoding draft model's managers ("draft-*") follow the
            # ruleset's draft rules.
            rs = self.ruleset.for_draft() if name.startswith("draft-") else self.ruleset
            scenario = Scenario(ManagerConfig.from_json(sub.config), steps, ruleset=rs, seed=self.scenario.seed)
            out[name] = RunView(scenario, sub)
        return out


# A dispatch step a sub-manager was not asked about (no Dispatch event there).
_NOT_ASKED = Batch((1,))


# -- message helpers ---------------------------------------------------------------
def shown(descs: Iterable[BatchDescriptor], limit: int = 6) -> list[BatchDescriptor]:
    """The descriptors ``shorts`` names, in its order: what a violation records as the graphs it names."""
    return sorted(descs, key=lambda d: (d.cg_mode.value, -d.num_tokens, repr(d)))[:limit]


def shorts(descs: Iterable[BatchDescriptor], limit: int = 6) -> str:
    items = list(descs)
    text = ", ".join(d.short() for d in shown(items, limit))
    if len(items) > limit:
        text += f", ... ({len(items) - limit} more)"
    return "[" + text + "]"


def list_short(descs: Sequence[BatchDescriptor] | None) -> str:
    if descs is None:
        return "<no list>"
    return "[" + ", ".join(d.short() for d in descs[:4]) + (", ..." if len(descs) > 4 else "") + "]"


def mode_name(mode: CUDAGraphMode | None) -> str:
    return mode.value if mode is not None else "<rejected>"


def incompat_reason(d: BatchDescriptor, b: Batch, lora_cases: Sequence[int]) -> str:
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


def size_key(b) -> tuple:
    """Which of two failing batches reads more like a hand-written test."""
    return (b.num_tokens, b.num_reqs, b.num_active_loras, b.num_ubatches, b.has_prefill, b.max_query_len)


def sweep_violations(prop: str, sweep: SweepView, failures: list[tuple[Any, str]],
                     facts: Callable[[Any], tuple] | None = None,
                     expected: Callable[[Any], Iterable[BatchDescriptor]] | None = None) -> list[Violation]:
    """One violation per sweep: the smallest failing batch, and how many
    failed (a dispatch step's one batch: just it).  It carries the batch,
    what dispatch returned for it, ``expected`` of it (what a correct
    dispatcher may return) and ``facts`` of it."""
    if not failures:
        return []
    b, msg = min(failures, key=lambda f: size_key(f[0]))
    sw = sweep.sweep
    given = facts(b) if facts is not None else ()
    shape = b if isinstance(b, BatchShape) else b.shape
    fields: dict[str, Any] = {"batch": shape.to_json(), "got": sw.descs[sw.batches.index(b)].to_json()}
    if expected is not None:
        fields["expected"] = tuple(d.to_json() for d in sorted(expected(b), key=desc_sort_key))
    if sweep.dispatch is not None:
        return [Violation(prop, msg, sweep.step, given, **fields)]
    of = {"exhaustive": f"all {sw.space}", "boundary": f"{len(sw.batches)} (every boundary class) of the {sw.space}"}.get(
        sw.coverage, f"{len(sw.batches)} (every boundary class and a sample) of the {sw.space}")
    count = f"{len(failures)} of {of} schedulable batches fail; this is the smallest"
    given = (*given, ("swept_after", sweep.after))
    return [Violation(prop, f"{msg} ({sweep.when()}: {count})", sweep.step if sweep.step >= 0 else None, given,
                      **fields)]


def candidates_hold(run: "RunView", step: int | None, batch: Any, desc: BatchDescriptor) -> bool | None:
    """Whether the manager's own candidate list for ``batch`` (its token count
    and LoRA case, as the manager recorded it) holds ``desc``; None where the
    manager recorded no candidate lists."""
    cand = run.initial_candidates(step)
    if cand is None or not cand.candidates:
        return None
    key = (batch.num_tokens, lora_case(batch.num_active_loras, run.config.lora_cases))
    listed = dict(cand.candidates).get(key, ())
    return desc in listed


def group(violations: Iterable[Violation]) -> list[Violation]:
    """Drop exact duplicates and cap the count per property at 4 x MAX_PER_GROUP."""
    seen: set[tuple] = set()
    out: list[Violation] = []
    dropped = 0
    for v in violations:
        key = (v.property, v.message)
        if key in seen:
            continue
        seen.add(key)
        if len(out) >= 4 * MAX_PER_GROUP:
            dropped += 1
            continue
        out.append(v)
    if dropped and out:
        # A count, not a violation of its own: the fact says so to readers (the campaign skips it).
        out.append(Violation(out[0].property, f"... and {dropped} more violations of this property", None,
                             overflow=dropped))
    return out
