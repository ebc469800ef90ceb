"""The workload: what create_forward_fn needs, for any target.

It owns the static input buffers, the attention metadata builder, the toy
model, the piecewise runner and the eager reference, and it records into the
Trace what the code under test actually did: every create_forward_fn call
(through ``tap_create_forward_fn``), every forward with the metadata and mode
the code under test put into the forward context, the metadata objects,
piecewise captures and lookups, and which metadata each graph was captured
with.  Targets call it; they never write the trace themselves (the recording
contract in ``cgsim.targets.base``).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape
from cgsim.modes import CUDAGraphMode
from cgsim.trace import (
    CreateForwardFn,
    Forward,
    GraphOutput,
    MetadataRecord,
    PiecewiseCapture,
    PiecewiseLookup,
    RankDispatch,
    Trace,
)
from cgsim.workload.attention import AttentionMetadata, MetadataBuilder, backend_for
from cgsim.workload.context import ForwardContext, get_forward_context, set_forward_context
from cgsim.workload.model import HIDDEN, KV_ROWS, VOCAB, ToyModel

__all__ = ["Workload", "RequestLayout", "GraphRecord", "CaptureBytes", "EagerForward", "ReferenceTerm",
           "OUTPUT_TOLERANCE"]

# Replayed rows must equal eager rows within this absolute tolerance.  Graph
# replay runs the same kernels on the same data, so only reduction-order noise
# from padded shapes is allowed.
OUTPUT_TOLERANCE = 1e-4
NUM_LAYERS = 2


@dataclass(frozen=True)
class CaptureBytes:
    """A FULL graph's capture as the backend accounts it: its pool, the
    bytes its capture was handed and, of those, the model's forwards';
    ``forward_bytes`` is None where the graph's work is not the model's
    forwards alone (a manager whose eager reference is its own forward,
    ``EagerForward``: e.g. several draft steps and what joins them)."""

    pool: Any
    graph_bytes: int
    forward_bytes: int | None


@dataclass(frozen=True)
class GraphRecord:
    """What a graph (or a piecewise graph's pieces) was captured with, and when."""

    metadata: int | None
    step: int


class RequestLayout:
    """Deterministic per-request inputs for a batch: token ids, context lengths,
    positions, KV slots and LoRA adapter ids.

    A pure function of (query lengths, active LoRAs, salt), so ``of`` hands out
    one shared, read-only layout per key (with the buffer contents derived
    from it) instead of drawing it again for every forward."""

    def __init__(self, batch: Batch, salt: int):
        self.batch = batch
        g = torch.Generator().manual_seed(10007 * salt + 17)
        n = batch.num_tokens
        self.input_ids = torch.randint(0, VOCAB, (n,), generator=g)
        self.query_lens = list(batch.query_lens)
        self.context_lens = [(i * 3 + salt) % 7 for i in range(batch.num_reqs)]
        self.seq_lens = [c + q for c, q in zip(self.context_lens, self.query_lens)]
        positions, slots, lora_ids = [], [], []
        a = batch.num_active_loras
        for i, (c, q) in enumerate(zip(self.context_lens, self.query_lens)):
            for p in range(c, c + q):
                positions.append(p)
                slots.append((i * 13 + p) % (KV_ROWS - 1))
                lora_ids.append((i % a) + 1 if a else 0)
        self.positions = torch.tensor(positions, dtype=torch.int64)
        self.slots = slots
        self.lora_ids = torch.tensor(lora_ids, dtype=torch.int64)
        self._derived: dict[tuple, torch.Tensor] = {}

    @classmethod
    def of(cls, batch: Batch, salt: int) -> "RequestLayout":
        key = (batch.query_lens, batch.num_active_loras, salt)
        layout = _LAYOUTS.get(key)
        if layout is None:
            if len(_LAYOUTS) >= _CACHE_ENTRIES:
                _LAYOUTS.clear()
            layout = _LAYOUTS[key] = cls(batch, salt)
        return layout

    @classmethod
    def dummy(cls, num_reqs: int, num_tokens: int, lora_case: int) -> "RequestLayout":
        """The capture-time dummy batch: tokens spread over the requests as
        evenly as possible (at least one each), like InputBatch.make_dummy."""
        num_reqs = max(1, min(num_reqs, num_tokens))
        base, extra = divmod(num_tokens, num_reqs)
        lens = tuple(base + (1 if i < extra else 0) for i in range(num_reqs))
        return cls.of(Batch(lens, num_active_loras=lora_case), salt=0)

    def derived(self, key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """A tensor computed from this layout alone (buffer contents), made once."""
        t = self._derived.get(key)
        if t is None:
            t = self._derived[key] = make()
        return t

    def token_inputs(self, num_tokens_padded: int) -> torch.Tensor:
        """Token ids, positions and LoRA ids as rows of one tensor, padding
        rows included (valid ids, position 0, no adapter)."""
        n = self.batch.num_tokens
        out = torch.zeros(3, num_tokens_padded, dtype=torch.int64)
        out[0, :n] = self.input_ids
        out[1, :n] = self.positions
        out[2, :n] = self.lora_ids
        return out


# Layouts and eager outputs are pure functions of their keys; the caches are
# bounded by entry count (cleared when full) so that a long campaign stays flat.
_CACHE_ENTRIES = 4096
_LAYOUTS: dict[tuple, RequestLayout] = {}
_EAGER: dict[tuple, torch.Tensor] = {}


class EagerForward:
    """How a sub-manager's model runs a batch eagerly, when that is not one
    forward of the toy model (``Workload.for_manager``'s ``reference``).
    ``key``: hashable, equal only for forwards that compute the same thing."""

    key: Any = None

    def run(self, workload: "Workload", batch: Batch) -> torch.Tensor:
        raise NotImplementedError


class ReferenceTerm:
    """What a target's model adds to the toy model's forward (``Workload.reference_term``):
    the eager reference applies it to the toy's eager output for a batch."""

    def key(self, batch: Batch) -> Any:
        """Hashable, equal only where the term computes the same thing for
        batches of equal layout (it may tell apart what the layout does not,
        e.g. has_prefill)."""
        raise NotImplementedError

    def apply(self, out: torch.Tensor, layout: "RequestLayout", batch: Batch) -> torch.Tensor:
        raise NotImplementedError


class _Buffers:
    """Static model inputs: graphs read these addresses at every replay."""

    def __init__(self, max_tokens: int, device: torch.device):
        self.allocate(max_tokens, device)

    def allocate(self, max_tokens: int, device: torch.device) -> None:
        # One allocation, three buffers: a batch is loaded with one copy.
        self._flat = torch.zeros(3, max_tokens, dtype=torch.int64, device=device)
        self.input_ids = self._flat[0]
        self.positions = self._flat[1]
        self.lora_ids = self._flat[2]
        self._views: dict[int, tuple[torch.Tensor, ...]] = {}
        self._rows: dict[int, torch.Tensor] = {}

    def load(self, layout: RequestLayout, num_tokens_padded: int, capturing: bool = False) -> None:
        rows = self._rows.get(num_tokens_padded)
        if rows is None:
            rows = self._rows[num_tokens_padded] = self._flat[:, :num_tokens_padded]
        if capturing:
            # Inside a capture the host tensor must be made now, as host memory
            # (a cached one would pass for device memory on the mock).
            rows.copy_(layout.token_inputs(num_tokens_padded))
            return
        rows.copy_(layout.derived(("tokens", num_tokens_padded), lambda: layout.token_inputs(num_tokens_padded)))

    def view(self, num_tokens: int) -> tuple[torch.Tensor, ...]:
        v = self._views.get(num_tokens)
        if v is None:
            v = self._views[num_tokens] = (
                self.input_ids[:num_tokens], self.positions[:num_tokens], self.lora_ids[:num_tokens])
        return v


class PiecewiseRunner:
    """Piecewise graphs: the model's non-break stages captured per key, break
    stages (attention) run eagerly between them.  Keys are what the forward
    context carries: (num_tokens, has_lora, num_active_loras)."""

    def __init__(self, workload: "Workload"):
        self.w = workload
        self.graphs: dict[tuple, list] = {}

    def clear(self) -> None:
        self.graphs.clear()

    def run(self, ctx: ForwardContext) -> torch.Tensor:
        w = self.w
        key = ctx.key
        if w.phase == "capture":
            if key not in self.graphs:
                self.graphs[key], stream = self._capture(ctx)
                w.record_piecewise_capture(key, ctx.attn_metadata, stream)
            return self._replay(self.graphs[key], ctx)
        hit = key in self.graphs
        w.note_piecewise_lookup(key, hit)
        if not hit:
            # A miss at runtime: the real wrapper would capture a graph mid-serving
            # or fall back; we run the stages eagerly and let KEY-CONSISTENT judge.
            return w.model.run_stages(ctx)
        return self._replay(self.graphs[key], ctx)

    def _capture(self, ctx: ForwardContext) -> tuple[list, int | None]:
        """The pieces, and the engine's stream they were captured on (None: cgsim's side stream)."""
        w = self.w
        cuda = w.backend.cuda
        pieces = []
        stream = cuda.current_stream()
        on_default = stream == cuda.default_stream()
        T = ctx.num_tokens
        x = torch.zeros(T, HIDDEN, device=w.device)
        for piece in w.model.pieces():
            if not isinstance(piece, list):
                pieces.append(("eager", piece, None, None, None))
                x = piece.fn(x, ctx)
                continue
            static_in = x.clone()
            graph = cuda.CUDAGraph()
            # On the stream the engine captures on (vLLM's piecewise wrapper passes
            # current_stream()), where its warm-up ran: a stream's first matmul
            # allocates cuBLAS workspaces, and allocated during a capture they
            # land in the graph pool and keep it alive for good (seen on an
            # H200: 32 MiB + 1 MiB live in a pool after all its graphs were gone).
            # The engine has no stream to give only when it runs on the default
            # stream, which no GPU captures on (vLLM's current_stream() never
            # hands it out): then torch.cuda.graph's own side stream, recorded
            # as None so that no property blames the engine for cgsim's choice.
            with cuda.graph(graph, pool=w.graph_pool, stream=None if on_default else stream):
                out = static_in
                for stage in piece:
                    out = stage.fn(out, ctx)
            pieces.append(("graph", piece, graph, static_in, out))
            x = out
        return pieces, None if on_default else w.stream_token(stream)

    def _replay(self, pieces: list, ctx: ForwardContext) -> torch.Tensor:
        x = torch.zeros(ctx.num_tokens, HIDDEN, device=self.w.device)
        for kind, piece, graph, static_in, out in pieces:
            if kind == "eager":
                x = piece.fn(x, ctx)
            else:
                static_in.copy_(x)
                graph.replay()
                x = out
        return x


class Workload:
    """One scenario's model, buffers and recorders.  ``phase`` ("capture" or
    "runtime") and ``step`` are where the runner is (``at``); ``current_desc``
    is set by the tap and the runner, so forwards are attributed to the
    descriptor being served."""

    def __init__(self, config: ManagerConfig, backend, trace: Trace, seed: int = 0, max_batch_tokens: int = 0,
                 max_batch_reqs: int = 0):
        self.config = config
        self.backend = backend
        self.device = backend.device
        self._trace = trace
        self.seed = seed
        self.phase = "capture"
        self.step = 0
        self.current_desc: BatchDescriptor | None = None
        self.attention = backend_for(config.attention_support, config.breakable)
        max_tokens = max(config.max_capture_size or 1, max_batch_tokens, 1)
        max_reqs = max(config.max_num_reqs, max_batch_reqs, 1)
        self.max_tokens = max_tokens
        self.builder = MetadataBuilder(self.attention, max_reqs, max_tokens, self.device, self._record_metadata)
        self.buffers = _Buffers(max_tokens, self.device)
        self.hidden_states = torch.zeros(max_tokens, HIDDEN, device=self.device)
        max_loras = max(config.lora_cases) if config.lora_cases else 0
        self.model = ToyModel(
            NUM_LAYERS, self.device, seed, self.attention.in_graph_metadata_op,
            sconv_in_pieces=config.breakable, max_loras=max_loras, static_inputs=self.buffers.view,
        )
        self.piecewise = PiecewiseRunner(self)
        # FULL graphs by descriptor, piecewise graphs by key: what each was captured with.
        self._graphs: dict[BatchDescriptor, GraphRecord] = {}
        self._pieces: dict[tuple, GraphRecord] = {}
        # FULL graphs by descriptor: the graph object (weakly: a release must
        # free it) and what the model's forward took inside its capture.
        self._captures: dict[BatchDescriptor, tuple[weakref.ref, int]] = {}
        self.graph_pool = None  # set by the target to its manager's pool
        self._streams: dict[int, int] = {}  # a stream's id -> its number in this trace (stream_token)
        self._reference = None
        self.reference_forward: EagerForward | None = None  # see for_manager
        self.reference_term: ReferenceTerm | None = None  # set by a target whose model adds to the toy's


    PHASES = ("capture", "runtime")

    def at(self, step: int, phase: str) -> None:
        """Where the run is: what the model records from now on belongs to
        ``step`` in ``phase``."""
        if phase not in self.PHASES:
            raise ValueError(f"phase {phase!r} is not one of {', '.join(self.PHASES)}")
        self.step, self.phase = step, phase
    def for_manager(self, name: str, config: ManagerConfig, share_metadata: bool = False,
                    reference: "EagerForward | None" = None) -> "Workload":
        """The workload of another manager the target drives (a draft model's):
        its own model and input buffers, recording into the sub-trace
        ``trace.managers[name]``; phase and step follow this workload's.
        ``share_metadata``: its attention metadata comes from this workload's
        builder and buffers (a draft prefill reuses the target's metadata),
        and both traces hold the same metadata records.  ``reference``: that
        manager's model is not one forward of the toy model (SGLang's draft
        decode runs several draft steps in one graph), so its eager reference
        is ``reference.run(ref_workload, batch)`` on a reference workload of
        its own (``reference.key`` tells such forwards apart in the cache)."""
        sub = Trace(self._trace.target, self._trace.backend, config=config.to_json())
        self._trace.managers[name] = sub
        child = _ManagerWorkload(self, config, sub, name)
        child.reference_forward = reference
        if share_metadata:
            child.attention, child.builder = self.attention, self.builder
            sub.metadata = self._trace.metadata
        return child

    # -- recording ----------------------------------------------------------------
    def stream_token(self, stream: Any) -> int:
        """This trace's number for ``stream``: 0 the default stream, then 1, 2,
        ... in the order this workload first met them (the same on every
        backend, where a stream's own id is not; a sub-manager's trace numbers
        its own, so the main trace does not depend on it)."""
        if stream == self.backend.cuda.default_stream():
            return 0
        return self._streams.setdefault(int(stream.stream_id), len(self._streams) + 1)

    def _record_metadata(self, record: MetadataRecord) -> None:
        self._trace.metadata[record.id] = record

    def tap_create_forward_fn(self, create_forward_fn: Callable, to_desc: Callable[[Any], BatchDescriptor] | None = None
                              ) -> Callable:
        """Wrap the capture loop's create_forward_fn so that every call is
        recorded, whatever the loop does with it, and the forwards that follow
        are attributed to its descriptor.  ``to_desc`` translates an engine's
        descriptor into cgsim's."""

        def tapped(desc: Any, warmup: bool = False) -> Callable:
            d = to_desc(desc) if to_desc is not None else desc
            self._trace.add(CreateForwardFn(desc=d, warmup=warmup))
            self.current_desc = d
            return create_forward_fn(desc, warmup=warmup)

        return tapped

    def record_piecewise_capture(self, key: tuple, md: AttentionMetadata | None, stream: int | None) -> None:
        md_id = md.id if md is not None else None
        self._trace.add(PiecewiseCapture(key=key, metadata=md_id, step=self.step, stream=stream))
        self._pieces[key] = GraphRecord(md_id, self.step)

    def note_piecewise_lookup(self, key: tuple, hit: bool) -> None:
        """The runtime looked a piecewise graph up under ``key`` (``hit``: one was there)."""
        self._trace.add(PiecewiseLookup(key=key, hit=hit, step=self.step))

    def note_rank_dispatch(self, batch: BatchShape, ranks: tuple[tuple[int, BatchDescriptor | None], ...]) -> None:
        """Data-parallel ranks decided for one batch: (requests, graph or None) per rank, rank 0 first."""
        self._trace.add(RankDispatch(step=self.step, batch=batch, ranks=tuple(ranks)))

    def note_graph_output(self, graph: BatchDescriptor, rows: int, real_rows: int, padded_rows: int, output: str,
                          captured_hidden: str | None = None, runtime_hidden: str | None = None) -> None:
        """A graph replay of ``graph`` handed back ``rows`` output rows (see ``cgsim.trace.GraphOutput``)."""
        self._trace.add(GraphOutput(step=self.step, graph=graph, rows=rows, real_rows=real_rows,
                                    padded_rows=padded_rows, output=output, captured_hidden=captured_hidden,
                                    runtime_hidden=runtime_hidden))

    def ensure_capacity(self, max_num_reqs: int, max_num_tokens: int) -> None:
        """Grow the static inputs and the metadata buffers before the first
        capture, for an engine that pads beyond the config's sizes (SGLang
        rounds the request pool up to its alignment, and its decode graphs
        hold bs x width tokens).  The buffers are replaced, so this must run
        before any metadata or graph reads them."""
        b = self.builder
        if max_num_reqs <= b.max_num_reqs and max_num_tokens <= self.max_tokens:
            return
        if self._graphs or self._pieces or self._trace.metadata:
            raise RuntimeError("ensure_capacity after metadata or graphs exist: call it before the first capture")
        self.max_tokens = max(self.max_tokens, max_num_tokens)
        b.max_num_reqs = max(b.max_num_reqs, max_num_reqs)
        b.max_num_tokens = self.max_tokens
        b.allocate_buffers()
        self.buffers.allocate(self.max_tokens, self.device)  # the model reads them through this object
        self.hidden_states = torch.zeros(self.max_tokens, HIDDEN, device=self.device)
        self._reference = None

    def graph_record(self, desc: BatchDescriptor) -> GraphRecord | None:
        return self._graphs.get(desc)

    def piecewise_record(self, key: tuple) -> GraphRecord | None:
        return self._pieces.get(key)

    def capture_bytes(self, desc: BatchDescriptor) -> CaptureBytes | None:
        """What the stored FULL graph of ``desc`` took from its pool (None:
        the backend accounts no graph memory, or no capture of it was seen)."""
        seen = self._captures.get(desc)
        graph = seen[0]() if seen is not None else None
        memory = getattr(graph, "memory", None)
        if memory is None:
            return None
        forward = seen[1] if self.reference_forward is None else None
        return CaptureBytes(memory.pool, memory.taken_bytes, forward)

    def forget_graphs(self, kept: Iterable[BatchDescriptor] = ()) -> None:
        """After a release: no piecewise graph and no graph record survives,
        except the records of the FULL graphs the manager still stores (a
        release that released nothing): a replay of one of those is still
        that capture's graph, which RELEASE-RECAPTURE must be able to see."""
        keep = set(kept)
        self.piecewise.clear()
        self._graphs = {d: r for d, r in self._graphs.items() if d in keep}
        self._captures = {d: c for d, c in self._captures.items() if d in keep}
        self._pieces.clear()

    @contextlib.contextmanager
    def serving(self, desc: BatchDescriptor | None) -> Iterator[None]:
        previous = self.current_desc
        self.current_desc = desc
        try:
            yield
        finally:
            self.current_desc = previous

    # -- what create_forward_fn / the model runner call ------------------------
    def _capturing(self) -> bool:
        return bool(self.backend.cuda.is_current_stream_capturing())

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int, lora_case: int = 0) -> RequestLayout:
        layout = RequestLayout.dummy(num_reqs, num_tokens, lora_case)
        self.buffers.load(layout, num_tokens, self._capturing())
        return layout

    def prepare_attn(self, layout: RequestLayout, num_reqs_padded: int, num_tokens_padded: int,
                     max_query_len: int | None, for_capture: bool) -> AttentionMetadata:
        mql = max_query_len if max_query_len is not None else max(layout.query_lens)
        b = self.builder
        contents = None
        if not self._capturing():  # inside a capture the host tensor must be made now (see _Buffers.load)
            contents = layout.derived(("metadata", b.max_num_reqs, b.max_num_tokens),
                                      lambda: b.buffer_contents(layout.query_lens, layout.seq_lens, layout.slots))
        return b.build(
            layout.query_lens, layout.seq_lens, layout.slots, num_reqs_padded, num_tokens_padded, mql, for_capture,
            self.phase, contents,
        )

    def load_batch(self, batch: Batch, num_tokens_padded: int) -> RequestLayout:
        layout = RequestLayout.of(batch, salt=self.seed * 31 + self.step)
        self.buffers.load(layout, num_tokens_padded, self._capturing())
        return layout

    def model_forward(self) -> torch.Tensor:
        """The model entry point: reads the forward context the caller set."""
        ctx = get_forward_context()
        md = ctx.attn_metadata
        md_id = md.id if md is not None else None
        in_graph = bool(self.backend.cuda.is_current_stream_capturing())
        self._trace.add(
            Forward(
                desc=self.current_desc, mode=ctx.cg_mode, metadata=md_id, in_graph=in_graph,
                num_tokens=ctx.num_tokens, phase=self.phase, step=self.step, key=ctx.key,
                stream=self.stream_token(self.backend.cuda.current_stream()),
            )
        )
        if ctx.cg_mode == CUDAGraphMode.PIECEWISE:
            return self.piecewise.run(ctx)
        if in_graph and self.phase == "capture" and self.current_desc is not None:
            # The FULL graph being recorded reads this metadata for its whole life.
            self._graphs[self.current_desc] = GraphRecord(md_id, self.step)
            return self._measured_forward(ctx)
        return self.model.run_stages(ctx)

    def _measured_forward(self, ctx: ForwardContext) -> torch.Tensor:
        """The model's forward inside a FULL graph's capture, with what it
        took from the graph's pool where the backend accounts it."""
        capturing = self.backend.capturing_graph
        graph = capturing() if capturing is not None else None
        if graph is None:
            return self.model.run_stages(ctx)
        before = graph.memory.taken_bytes
        out = self.model.run_stages(ctx)
        took = graph.memory.taken_bytes - before
        # Micro-batched graphs run the model once per micro-batch inside one capture.
        seen = self._captures.get(self.current_desc)
        if seen is not None and seen[0]() is graph:
            took += seen[1]
        self._captures[self.current_desc] = (weakref.ref(graph), took)
        return out

    def run_breakable(self, ctx: ForwardContext, capturing: bool,
                      break_op: Callable[[Any], Callable[[torch.Tensor, torch.Tensor], None]]) -> torch.Tensor:
        """A forward under an engine's breakable CUDA-graph wrapper: the model's
        non-break stages are recorded into the pieces, each break stage runs
        through ``break_op(stage)(x, out)`` (the engine's eager-break op, which
        runs eagerly at replay and reads the forward context current then)."""
        md = ctx.attn_metadata
        stream = self.stream_token(self.backend.cuda.current_stream())
        self._trace.add(Forward(desc=self.current_desc, mode=CUDAGraphMode.PIECEWISE,
                                metadata=md.id if md is not None else None, in_graph=capturing,
                                num_tokens=ctx.num_tokens, phase=self.phase, step=self.step, key=ctx.key,
                                stream=stream))
        if capturing and ctx.key is not None:
            self.record_piecewise_capture(ctx.key, md, stream)
        x = torch.empty(0, device=self.device)
        for stage in self.model.stages:
            if stage.breaks:
                out = torch.empty(ctx.num_tokens, HIDDEN, device=self.device)
                break_op(stage)(x, out)
                x = out
            else:
                x = stage.fn(x, ctx)
        return x

    def metadata_alive(self, md_id: int | None) -> bool | None:
        return None if md_id is None else self.builder.buffers_alive(md_id)

    # -- the oracle ----------------------------------------------------------------
    def eager_reference(self, batch: Batch) -> torch.Tensor:
        """Outputs the batch's real rows must have: the same model run eagerly
        on exactly the batch, with its own buffers (nothing shared with the
        target, so a target bug cannot leak into the reference).

        A pure function of the model's parameters and the batch's layout, so
        it is computed once per (model, batch, salt) in a process."""
        salt = self.seed * 31 + self.step
        forward = self.reference_forward
        key = (str(self.device), NUM_LAYERS, self.seed, self.attention.in_graph_metadata_op,
               self.model.max_loras, batch.query_lens, batch.num_active_loras, salt,
               forward.key if forward is not None else None,
               self.reference_term.key(batch) if self.reference_term is not None else None)
        out = _EAGER.get(key)
        if out is None:
            out = self._eager_reference(batch)
            if len(_EAGER) >= _CACHE_ENTRIES:
                _EAGER.clear()
            _EAGER[key] = out
        return out.clone()

    def _eager_reference(self, batch: Batch) -> torch.Tensor:
        if self._reference is None:
            self._reference = Workload(self.config, self.backend, Trace("eager", self.backend.name), self.seed,
                                       self.max_tokens, self.builder.max_num_reqs)
        ref = self._reference
        ref.at(self.step, "runtime")
        if self.reference_forward is not None:
            return self.reference_forward.run(ref, batch).clone()
        layout = ref.load_batch(batch, batch.num_tokens)
        md = ref.prepare_attn(layout, batch.num_reqs, batch.num_tokens, None, for_capture=False)
        with set_forward_context(md, batch.num_tokens, CUDAGraphMode.NONE, lora_case=batch.num_active_loras):
            out = ref.model.run_stages(get_forward_context()).clone()
        return out if self.reference_term is None else self.reference_term.apply(out, layout, batch)


class _ManagerWorkload(Workload):
    """Workload.for_manager: the runner sets phase and step on the main
    workload only; a sub-manager's forwards carry the main one's."""

    def __init__(self, parent: Workload, config: ManagerConfig, trace: Trace, name: str):
        self._parent = parent
        # A draft model is a model of its own: another seed.
        super().__init__(config, parent.backend, trace, parent.seed * 7919 + len(name),
                         parent.max_tokens, parent.builder.max_num_reqs)

    @property
    def phase(self) -> str:  # type: ignore[override]
        return self._parent.phase

    @phase.setter
    def phase(self, value: str) -> None:
        pass  # the main workload's phase is the run's

    @property
    def step(self) -> int:  # type: ignore[override]
        return self._parent.step

    @step.setter
    def step(self, value: int) -> None:
        pass
