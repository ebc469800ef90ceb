"""Trace: what happened when a Scenario ran on (target, backend), in order.

Plain frozen records, JSON-serialisable, so properties are pure functions of
(Scenario, Trace) and a trace can be written next to a finding.

Who records what (so a buggy target cannot hide it):
- ``CreateForwardFn``: a tap between the model-level manager and the base
  manager's capture loop, wrapping create_forward_fn.
- ``Forward``: the workload's model, at every forward call, from the forward
  context the target set (mode, metadata) and the graph backend (in_graph,
  the current stream).
- ``Metadata`` records: the workload's attention metadata builder, whenever
  the target asks it for metadata.
- ``GraphStored`` / ``Candidates`` / ``CaptureDone``: read off the target after
  capture (what it says it stored and would dispatch over).
- ``PiecewiseCapture`` / ``PiecewiseLookup``: the workload's piecewise runner.
- ``Dispatch`` / ``Replay`` / ``Release`` / ``Error``: the runner (``cgsim/recorder.py``);
  a ``Replay``'s streams from the graph backend, which notes every graph replay.
- ``Sweep``: the runner, asking the manager to dispatch every batch the
  scheduler can produce (without running them) before the first capture and
  after every capture and release.

Other managers the target drives beside the main one (the speculative-decoding
draft model's prefill and decode managers) get a Trace of their own in
``Trace.managers``, with the same events recorded the same way, and the
config that manager works with (``Trace.config``, in its header): the
properties judge each such sub-trace like the main one, under that config.
- ``GraphBytes``: the runner, after a capture, from what the workload
  measured inside each FULL graph's capture and the backend's pool accounts.
- ``TraceHeader.alignment``: the runner, once the manager is built, from what
  the handle read off its engine's own alignment helper (where it has one).
- ``RankDispatch`` / ``GraphOutput``: the workload, from what an engine
  target reports that the events above cannot carry: every data-parallel
  rank's decision for a batch, and what a graph replay handed back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, Iterable

from cgsim.descriptors import Batch, BatchDescriptor, BatchShape
from cgsim.modes import CUDAGraphMode

__all__ = [
    "MetadataRecord",
    "Event",
    "CreateForwardFn",
    "Forward",
    "GraphStored",
    "CaptureDone",
    "Candidates",
    "PiecewiseCapture",
    "PiecewiseLookup",
    "Dispatch",
    "Replay",
    "Release",
    "Sweep",
    "RankDispatch",
    "GraphOutput",
    "GraphBytes",
    "Error",
    "Trace",
    "TraceHeader",
    "EngineAlignment",
    "HeaderAlreadySet",
    "EVENT_TYPES",
]


@dataclass(frozen=True)
class MetadataRecord:
    """One attention-metadata object the builder handed out.

    ``buffers``: identities of the persistent buffers it reads (query start
    locations, sequence lengths, slot mapping); a graph captured with this
    metadata reads exactly these.  ``state``: identities of per-object mutable
    state (the backend's lazily built plan/scratch) that must not be shared
    between warmup and capture.  ``phase`` is "capture" or "runtime".
    """

    id: int
    num_reqs: int
    num_tokens: int
    max_query_len: int
    for_capture: bool
    buffers: tuple[int, ...]
    state: tuple[int, ...]
    phase: str


class Event:
    kind: ClassVar[str] = "event"

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):  # type: ignore[arg-type]
            out[f.name] = _to_json(getattr(self, f.name))
        return out


@dataclass(frozen=True)
class CreateForwardFn(Event):
    kind: ClassVar[str] = "create_forward_fn"
    desc: BatchDescriptor
    warmup: bool


@dataclass(frozen=True)
class Forward(Event):
    """The model ran.  ``desc`` is the descriptor being captured (capture phase)
    or the dispatched one (runtime); ``metadata`` the id of the attention
    metadata in the forward context (None = attention skipped); ``in_graph``
    whether a FULL graph capture was recording; ``key`` the piecewise key in
    the forward context, if any; ``stream`` the stream it ran on, as the
    workload numbers streams (0 the default stream, then 1, 2, ... in the
    order the trace first met them)."""

    kind: ClassVar[str] = "forward"
    desc: BatchDescriptor | None
    mode: CUDAGraphMode
    metadata: int | None
    in_graph: bool
    num_tokens: int
    phase: str  # "capture" | "runtime"
    step: int
    key: tuple | None = None
    stream: int = 0


@dataclass(frozen=True)
class GraphStored(Event):
    kind: ClassVar[str] = "graph_stored"
    desc: BatchDescriptor
    step: int


@dataclass(frozen=True)
class CaptureDone(Event):
    """End of a capture() call: whether it finished and whether the manager now
    says it is captured."""

    kind: ClassVar[str] = "capture_done"
    step: int
    ok: bool
    captured_flag: bool


@dataclass(frozen=True)
class Candidates(Event):
    """Candidate-init output: ``phase`` "initial" (as the manager holds it) or
    "recomputed" (candidate init run again on the finished manager)."""

    kind: ClassVar[str] = "candidates"
    phase: str
    capture_descs: tuple[BatchDescriptor, ...]
    candidates: tuple[tuple[tuple[int, int], tuple[BatchDescriptor, ...]], ...]
    step: int


@dataclass(frozen=True)
class PiecewiseCapture(Event):
    """Piecewise graphs were captured under ``key``.  ``stream``: the
    engine's stream they were captured on (numbered as ``Forward.stream``);
    None where the engine ran on the default stream, which no GPU captures
    on, and the workload's runner chose a side stream itself."""

    kind: ClassVar[str] = "piecewise_capture"
    key: tuple
    metadata: int | None
    step: int
    stream: int | None = None


@dataclass(frozen=True)
class PiecewiseLookup(Event):
    kind: ClassVar[str] = "piecewise_lookup"
    key: tuple
    hit: bool
    step: int


@dataclass(frozen=True)
class Dispatch(Event):
    kind: ClassVar[str] = "dispatch"
    step: int
    batch: Batch
    desc: BatchDescriptor
    captured_flag: bool


@dataclass(frozen=True)
class Replay(Event):
    """A dispatched batch ran.  ``path``: "full" (graph replay), "piecewise" or
    "eager".  ``graph_metadata``: the metadata the replayed graph (or the
    piecewise pieces) was captured with; ``runtime_metadata``: the metadata
    prepared for this batch.  ``max_abs_err`` over the batch's real rows
    against the eager reference (None if no output was produced)."""

    kind: ClassVar[str] = "replay"
    step: int
    batch: Batch
    desc: BatchDescriptor
    path: str
    graph_metadata: int | None
    runtime_metadata: int | None
    metadata_alive: bool | None
    max_abs_err: float | None
    outputs_ok: bool
    graph_from_step: int | None = None  # the capture step that stored the replayed graph
    # The stream current when the runner handed the step to the manager (its
    # inputs written and its outputs read there), and the stream each graph
    # replay of the step ran on, numbered as Forward.stream.
    step_stream: int | None = None
    replay_streams: tuple[int, ...] = ()


@dataclass(frozen=True)
class Release(Event):
    kind: ClassVar[str] = "release"
    step: int
    captured_flag_after: bool
    graphs_after: int


@dataclass(frozen=True)
class Sweep(Event):
    """Dispatch decisions for the schedulable batches, taken without running
    them.  ``step`` is the capture or release step it follows (-1: before any
    step); ``descs[i]`` is what dispatch returned for ``batches[i]``.
    ``coverage``: "exhaustive" (every dispatch input the scheduler can
    produce, ``space`` of them), "boundary" (every boundary class) or
    "boundary+sample" (and a seeded sample of the rest)."""

    kind: ClassVar[str] = "sweep"
    step: int
    captured_flag: bool
    batches: tuple[BatchShape, ...]
    descs: tuple[BatchDescriptor, ...]
    coverage: str
    space: int


@dataclass(frozen=True)
class RankDispatch(Event):
    """Data-parallel attention: each rank's decision for one step, rank 0
    first (rank 0 runs the scenario's batch or swept shape, ``batch``).  Per
    rank: (its request count, the graph it replays or None for eager).  The
    ranks run collectives inside the graph, so they must agree."""

    kind: ClassVar[str] = "rank_dispatch"
    step: int
    batch: BatchShape
    ranks: tuple[tuple[int, BatchDescriptor | None], ...]


@dataclass(frozen=True)
class GraphOutput(Event):
    """What a graph replay handed back: ``graph`` is the graph that replayed
    (the engine's own key, translated), ``rows`` the output rows returned,
    ``real_rows`` the batch's tokens, ``padded_rows`` the graph's; ``output``
    the output kind ("logits", or "proxy" for tensors handed to a next
    pipeline stage); the hidden-state modes the graph was captured with and
    the batch asked for ("NULL" < "LAST" < "FULL"; None where the engine has
    none)."""

    kind: ClassVar[str] = "graph_output"
    step: int
    graph: BatchDescriptor
    rows: int
    real_rows: int
    padded_rows: int
    output: str
    captured_hidden: str | None = None
    runtime_hidden: str | None = None


@dataclass(frozen=True)
class GraphBytes(Event):
    """What a stored FULL graph's capture took from its memory pool, read
    after the capture at ``step`` (where the backend accounts graph memory:
    the CPU mock).  ``pool``: its pool, numbered per manager in the order its
    graphs first used one; ``graph_bytes``: the blocks its capture was
    handed; ``forward_bytes``: of those, what the model's forwards at the
    graph's own size took inside the capture (None where the graph's work is
    not the model's forwards alone: a multi-step draft); ``pool_bytes``: what its pool
    reserves after the capture."""

    kind: ClassVar[str] = "graph_bytes"
    step: int
    desc: BatchDescriptor
    pool: int
    graph_bytes: int
    forward_bytes: int | None
    pool_bytes: int


@dataclass(frozen=True)
class Error(Event):
    """The target raised, did something illegal, hung or corrupted its state."""

    kind: ClassVar[str] = "error"
    step: int
    phase: str  # "build" | "capture" | "dispatch" | "replay" | "release"
    error: str  # "crash" | "illegal-op" | "timeout" | "corrupt"
    exc_type: str
    message: str


EVENT_TYPES: dict[str, type] = {
    cls.kind: cls
    for cls in (
        CreateForwardFn, Forward, GraphStored, CaptureDone, Candidates, PiecewiseCapture,
        PiecewiseLookup, Dispatch, Replay, Release, Sweep, RankDispatch, GraphOutput, GraphBytes, Error,
    )
}


@dataclass(frozen=True)
class EngineAlignment:
    """What the engine's own helpers answer, for the launch a manager was
    built for, about the multiple its graph sizes must be: ``decode``, the
    alignment of a decode graph's batch size times its alignment width (the
    decode runner's sizing), ``prefill``, of a prefill bucket's tokens (None:
    the engine aligns no prefill buckets); ``helper``, the engine function
    asked (``module.function``).  Read off the engine by the target (SGLang:
    ``get_cuda_graph_batch_size_alignment`` under the launch's two-batch
    overlap, attention TP and DP), so the alignment properties judge the
    graphs by the engine's rule rather than by cgsim's copy of it; cgsim's
    copy is held to it by the target's tests."""

    decode: int
    prefill: int | None
    helper: str

    def to_json(self) -> dict:
        return {"decode": self.decode, "prefill": self.prefill, "helper": self.helper}


@dataclass(frozen=True)
class TraceHeader:
    """What a trace says of the run as a whole.  ``target``, ``backend`` and,
    in a sub-trace, ``config`` (its manager's ManagerConfig JSON) are known
    when the trace is made; the rest once: what the built manager says of
    itself (``resolved_mode``, ``uses_breakable``, ``has_piecewise_runner``,
    and where the target reads it off its engine, ``alignment``) or why the
    target refused the scenario (``unsupported``: nothing to judge)."""

    target: str
    backend: str
    config: dict | None = None
    resolved_mode: CUDAGraphMode | None = None
    uses_breakable: bool = False
    has_piecewise_runner: bool = False
    unsupported: str | None = None
    alignment: EngineAlignment | None = None


class HeaderAlreadySet(RuntimeError):
    """A trace's build outcome was recorded twice."""


class Trace:
    """The ordered events of one run plus the metadata records they refer to.
    Built by one runner, read by the properties.  The header is a frozen
    value, set once (``record_built`` or ``record_unsupported``)."""

    def __init__(self, target: str, backend: str, *, config: dict | None = None, events: Iterable[Event] = (),
                 metadata: dict[int, MetadataRecord] | None = None):
        self._header = TraceHeader(target, backend, config)
        self._settled = False
        self.events: list[Event] = list(events)
        self.metadata: dict[int, MetadataRecord] = {} if metadata is None else metadata
        # Replayed outputs of the real rows per dispatch step (CPU tensors), for
        # comparing backends; not part of the JSON form.
        self.outputs: dict[int, Any] = {}
        # Sub-traces of the other managers the target drives (name -> Trace).
        self.managers: dict[str, Trace] = {}

    @classmethod
    def from_header(cls, header: TraceHeader, events: Iterable[Event] = (),
                    metadata: dict[int, MetadataRecord] | None = None) -> "Trace":
        """A trace whose header is final: a run's events judged again, altered."""
        trace = cls(header.target, header.backend, events=events, metadata=metadata)
        trace._header, trace._settled = header, True
        return trace

    def record_built(self, resolved_mode: CUDAGraphMode | None, uses_breakable: bool,
                     has_piecewise_runner: bool, alignment: EngineAlignment | None = None) -> None:
        """The manager was built: what it says of itself (and, where the
        target asked its engine, the engine's alignment for the launch)."""
        self._settle(resolved_mode=resolved_mode, uses_breakable=uses_breakable,
                     has_piecewise_runner=has_piecewise_runner, alignment=alignment)

    def record_unsupported(self, reason: str) -> None:
        """The target refused the scenario (its own validation, or a lifecycle no settings reach)."""
        self._settle(unsupported=reason)

    def _settle(self, **outcome: Any) -> None:
        if self._settled:
            raise HeaderAlreadySet(f"the trace of {self._header.target} already has its build outcome")
        self._header, self._settled = replace(self._header, **outcome), True

    @property
    def header(self) -> TraceHeader:
        return self._header

    @property
    def target(self) -> str:
        return self._header.target

    @property
    def backend(self) -> str:
        return self._header.backend

    @property
    def config(self) -> dict | None:
        return self._header.config

    @property
    def resolved_mode(self) -> CUDAGraphMode | None:
        return self._header.resolved_mode

    @property
    def uses_breakable(self) -> bool:
        return self._header.uses_breakable

    @property
    def has_piecewise_runner(self) -> bool:
        return self._header.has_piecewise_runner

    @property
    def unsupported(self) -> str | None:
        return self._header.unsupported

    @property
    def alignment(self) -> EngineAlignment | None:
        return self._header.alignment

    def add(self, event: Event) -> None:
        self.events.append(event)

    def of(self, cls: type) -> list:
        return [e for e in self.events if isinstance(e, cls)]

    @property
    def errors(self) -> list[Error]:
        return self.of(Error)

    def __repr__(self) -> str:
        return f"Trace({self._header!r}, {len(self.events)} events, managers={sorted(self.managers)})"

    def to_json(self) -> dict:
        h = self._header
        return {
            "target": h.target,
            "backend": h.backend,
            "resolved_mode": h.resolved_mode.value if h.resolved_mode else None,
            "uses_breakable": h.uses_breakable,
            "has_piecewise_runner": h.has_piecewise_runner,
            "unsupported": h.unsupported,
            "alignment": h.alignment.to_json() if h.alignment is not None else None,
            "events": [e.to_json() for e in self.events],
            "metadata": [asdict(m) for m in self.metadata.values()],
            "config": h.config,
            "managers": {name: t.to_json() for name, t in self.managers.items()},
        }


def _to_json(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, CUDAGraphMode):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    return value
