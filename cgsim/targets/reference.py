"""cgsim's reference CUDA-graph manager.

Written the way a careful vLLM engineer would write model runner V2's manager,
not by calling cgsim.spec: the spec is the oracle it is checked against.

Lifecycle: config -> every flag final -> candidate init -> capture through a
graph backend -> dispatch -> run_fullgraph / piecewise / eager ->
release_graphs -> capture again.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from itertools import groupby
from typing import Any, Callable, Sequence

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape, lora_case
from cgsim.modes import CUDAGraphMode, resolve_mode
from cgsim.spec.engine_configs import varlen_token_grid, vllm_capture_sizes
from cgsim.spec.rulesets import Ruleset, RulesetRejects
from cgsim.spec.vllm_options import decode_sizes_of
from cgsim.targets.base import CandidateSnapshot, Drawing, Execution, TargetUnsupported, Tooling, Triage
from cgsim.targets.registry import TargetFamily
from cgsim.workload.context import set_forward_context

__all__ = ["CudaGraphManager", "ModelCudaGraphManager", "ReferenceTarget", "ManagerHandle", "FAMILY"]

# Eager descriptors are values, equal for every manager: one per shape for
# the whole process, not per manager (each scenario builds a manager, and
# building the descriptors of its sweeps cost as much as dispatching them).
# Bounded, so a long campaign of huge configs does not keep them all.
_EAGER: dict[tuple[int, int, int, int], BatchDescriptor] = {}
_EAGER_BOUND = 200_000

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
ForwardFn = Callable[[CUDAGraphMode], None]
CreateForward = Callable[[BatchDescriptor, bool], ForwardFn]


def _runs(desc: BatchDescriptor, batch: Batch) -> bool:
    """Whether a graph of ``desc`` (already the batch's LoRA case) runs ``batch``:
    the batch's decode length or max query length, no more requests or tokens
    than the graph holds, its micro-batch count, and no empty second
    micro-batch (the runner runs that eagerly)."""
    if desc.uniform_token_count is not None and batch.uniform_token_count != desc.uniform_token_count:
        return False
    if desc.max_query_len is not None:
        longest = batch.decode_max_query_len
        if longest is None or longest > desc.max_query_len:
            return False
    if batch.num_tokens > desc.num_tokens or (desc.num_reqs is not None and batch.num_reqs > desc.num_reqs):
        return False
    if batch.num_ubatches != desc.num_ubatches:
        return False
    return desc.num_ubatches == 1 or 2 * batch.num_tokens >= desc.num_tokens


class CudaGraphManager:
    """Candidate init, the capture loop, dispatch and FULL replay."""

    def __init__(self, config: ManagerConfig, ruleset: Ruleset, backend):
        # The design's view of the config: what the runner asks mode resolution
        # for (adaptive verification's decode route) and the capture sizes
        # after rounding (RulesetRejects: the design refuses the config).
        config = ruleset.effective_config(config)
        self.config = config
        self.ruleset = ruleset
        self.backend = backend
        self.max_num_reqs = config.max_num_reqs
        self.decode_query_len = config.decode_query_len
        self.lora_cases = sorted(config.lora_cases)
        self.cudagraph_mode = resolve_mode(
            config.mode, config.attention_support, config.decode_query_len,
            config.attention_split, config.piecewise_available,
        )
        self.set_flags()
        self.graphs: dict[BatchDescriptor, object] = {}
        # FULL and piecewise graphs share one pool: capturing PIECEWISE first lets
        # the smaller FULL activations fit into blocks the pool already holds.
        self.pool = backend.cuda.graph_pool_handle() if self.cudagraph_mode != N else None
        self._graphs_captured = False
        self._capture_descs: dict[CUDAGraphMode, list[BatchDescriptor]] = {}
        self._candidates: dict[tuple[int, int], list[BatchDescriptor]] = {}
        self._eager = _EAGER
        self._case_of: dict[int, int] = {}  # active LoRA count -> its LoRA case
        # Candidate init reads the breakable flag: it must run after every flag is final.
        self._init_candidates()

    def set_flags(self) -> None:
        self.use_breakable_cg = self.config.breakable and self.cudagraph_mode.has_piecewise()

    # -- candidate init ------------------------------------------------------------
    def decode_query_lens(self) -> list[int]:
        return list(self.config.scheduler_decode_query_lens())

    def mixed_num_reqs(self, mixed_mode: CUDAGraphMode, size: int) -> int | None:
        if mixed_mode == F:
            return min(size, self.max_num_reqs)
        # Kernels inside breakable pieces read request metadata captured with the
        # graph, so under pr48822 the pieces are captured for padded requests.
        if self.ruleset.pad_breakable_piecewise_reqs and self.use_breakable_cg:
            return min(size, self.max_num_reqs)
        return None

    def ubatch_twin(self, desc: BatchDescriptor) -> BatchDescriptor | None:
        c = self.config
        if not self.ruleset.ubatch_twins or c.num_ubatches < 2 or desc.cg_mode != F or desc.num_reqs is None:
            return None
        if desc.max_query_len is not None and not self.ruleset.varlen_ubatch_twins:  # a varlen decode graph
            return None
        per_req, rem = divmod(desc.num_tokens, desc.num_reqs)
        if rem or desc.uniform_token_count not in (None, per_req):
            return None
        # Micro-batched uniform batches are pure decodes: their length is a decode length.
        if per_req not in self.decode_query_lens():
            return None
        if desc.num_tokens < max(c.num_ubatches, c.ubatch_threshold):
            return None
        return BatchDescriptor(F, desc.num_tokens, desc.num_reqs, per_req, desc.max_query_len,
                               desc.num_active_loras, c.num_ubatches)

    def build_capture_descs(self) -> dict[CUDAGraphMode, list[BatchDescriptor]]:
        mode = self.cudagraph_mode
        if mode == N:
            return {}
        decode_mode, mixed_mode = mode.decode_mode(), mode.mixed_mode()
        separate = mode.separate_routine()
        max_decode_tokens = self.max_num_reqs * self.decode_query_len
        max_size = self.config.max_capture_size
        by_mode: dict[CUDAGraphMode, list[BatchDescriptor]] = defaultdict(list)

        def add(desc: BatchDescriptor) -> None:
            for d in (desc, self.ubatch_twin(desc)):
                if d is not None and d not in by_mode[d.cg_mode]:
                    by_mode[d.cg_mode].append(d)

        if self.ruleset.decode_shapes and separate and decode_mode == F:
            for desc in self.decode_graphs_by_requests():
                add(desc)
            separate = False  # only the mixed graphs are keyed by the capture sizes
        for size in sorted(self.config.capture_sizes):
            for lora in self.lora_cases:
                if separate and decode_mode == F:
                    if self.config.varlen_decode:
                        if size <= max_decode_tokens:
                            add(BatchDescriptor(F, size, min(size, self.max_num_reqs), None, self.decode_query_len, lora))
                    else:
                        for q in self.decode_query_lens():
                            tokens = -(-size // q) * q
                            reqs = tokens // q
                            if tokens > max_decode_tokens or tokens > max_size or reqs > self.max_num_reqs:
                                continue
                            add(BatchDescriptor(F, tokens, reqs, q, None, lora))
                if mixed_mode != N:
                    add(BatchDescriptor(mixed_mode, size, self.mixed_num_reqs(mixed_mode, size), None, None, lora))
        # With dynamic speculative decoding a decode graph whose (length, request
        # count) the scheduler never produces would never replay.
        if F in by_mode:
            kept_full = set(self._scheduled_decode_graphs(by_mode[F]))
            by_mode[F] = [d for d in by_mode[F] if d in kept_full]
        for descs in by_mode.values():
            descs.sort(key=lambda d: d.num_tokens, reverse=True)
        return {mode: descs for mode, descs in by_mode.items() if descs}

    def _scheduled_decode_graphs(self, full: list[BatchDescriptor]) -> list[BatchDescriptor]:
        """The FULL graphs a scheduled batch can reach.  With a dynamic draft
        schedule the drafts of a step are chosen for the step before's request
        count, so a decode graph of length q and R requests serves the pure
        decodes of r requests above the next smaller such graph's, and only
        those r the schedule gives length q (a shrunk batch keeps its drafts);
        a micro-batched graph only those at the DBO threshold whose second
        micro-batch is not empty."""
        if self.config.spec_schedule is None:
            return list(full)
        most = self.config.scheduler_decode_limits
        kept, below = [], {}
        for d in sorted(full, key=lambda d: (d.num_tokens, d.num_reqs or 0)):
            q = d.uniform_token_count
            if q is None or d.num_reqs is None:
                kept.append(d)
                continue
            group = (q, d.num_active_loras, d.num_ubatches)
            floor = max(self.config.ubatch_threshold, self.config.num_ubatches) if d.num_ubatches > 1 else 1
            served = [r for r in range(below.get(group, 0) + 1, min(d.num_reqs, most.get(q, 0)) + 1)
                      if r * q >= floor and not (d.num_ubatches > 1 and 2 * r * q < d.num_tokens)]
            if served:
                kept.append(d)
                below[group] = d.num_reqs
        return kept

    def decode_graphs_by_requests(self) -> list[BatchDescriptor]:
        """Uniform decode graphs sized by request count (vllm-0.34): per decode
        length, every decode size below the most requests that length runs at
        (and the requests the largest graph's tokens hold), plus one graph at
        that limit; varlen decode graphs on the token grid up to the largest
        decode size's requests of the widest length."""
        c = self.config
        sizes = sorted(set(decode_sizes_of(c) or ()))
        q_max = self.decode_query_len
        out: list[BatchDescriptor] = []
        if c.varlen_decode:
            for tokens in varlen_token_grid(max(sizes, default=0) * q_max):
                out += [BatchDescriptor(F, tokens, min(tokens, self.max_num_reqs), None, q_max, lora)
                        for lora in self.lora_cases]
            return out
        runs_at: dict[int, int] = {}
        for r in range(1, self.max_num_reqs + 1):
            runs_at[c.scheduler_decode_query_len(r)] = r
        for q, most in sorted(runs_at.items()):
            limit = min(most, c.max_capture_size // q)
            if limit < 1:
                continue
            reqs = {n for n in sizes if n < limit}
            if any(n >= limit for n in sizes):
                reqs.add(limit)
            out += [BatchDescriptor(F, n * q, n, q, None, lora) for n in sorted(reqs) for lora in self.lora_cases]
        return out

    def build_candidates(self, capture_descs) -> dict[tuple[int, int], list[BatchDescriptor]]:
        candidates: dict[tuple[int, int], list[BatchDescriptor]] = {}
        for mode in (F, P):  # FULL graphs are preferred over piecewise ones
            ascending = list(reversed(capture_descs.get(mode, [])))
            for lora in self.lora_cases:
                descs = [d for d in ascending if d.num_active_loras == lora]
                groups = [(t, list(g)) for t, g in groupby(descs, key=lambda d: d.num_tokens)]
                start = 0
                for i, (tokens, group) in enumerate(groups):
                    members = self.candidate_members(groups, i)
                    for n in self.candidate_range(start, tokens):
                        self.add_candidates(candidates, (n, lora), members)
                    start = tokens + 1
        return candidates

    def candidate_members(self, groups: list[tuple[int, list[BatchDescriptor]]], i: int) -> list[BatchDescriptor]:
        """The graphs of one mode tried for token counts served first by group
        ``i`` (groups by ascending token count).  Every larger graph of the mode
        stays a candidate: the smallest one may not fit (another decode length,
        too few requests) while a larger one does."""
        return [d for _, g in groups[i:] for d in g]

    def candidate_range(self, start: int, tokens: int) -> range:
        """Token counts served first by the graphs of ``tokens`` tokens."""
        return range(start, tokens + 1)

    def add_candidates(self, candidates: dict, key: tuple[int, int], members: list[BatchDescriptor]) -> None:
        # Keys are per mode in effect: FULL members first, then PIECEWISE ones.
        candidates.setdefault(key, []).extend(members)

    def _init_candidates(self) -> None:
        self._capture_descs = self.build_capture_descs()
        self._candidates = self.build_candidates(self._capture_descs)

    # -- capture ----------------------------------------------------------------------
    def capture_order(self) -> list[BatchDescriptor]:
        # PIECEWISE first: its activations are larger, FULL then fits the grown pool.
        return [d for mode in (P, F) for d in self._capture_descs.get(mode, [])]

    def capture(self, create_forward_fn: CreateForward) -> None:
        cuda = self.backend.cuda
        # As vLLM's graph_capture(): warm-up and capture on one side stream,
        # ordered after the work before it.  A graph captured on another stream
        # than its warm-up ran on finds that stream's lazy state (cuBLAS
        # workspaces) uncreated and allocates it inside the capture.
        stream = cuda.Stream()
        stream.wait_stream(cuda.current_stream())
        with cuda.stream(stream):
            for desc in self.capture_order():
                self.capture_one(desc, create_forward_fn, stream)
        self._graphs_captured = True

    def capture_one(self, desc: BatchDescriptor, create_forward_fn: CreateForward, stream: Any) -> None:
        """Warm ``desc`` up and capture it, on ``stream`` (the current one)."""
        cuda = self.backend.cuda
        forward_fn = create_forward_fn(desc, True)
        forward_fn(N)  # warmup, eager
        if desc.cg_mode == P and not self.use_breakable_cg:
            # Same inputs; attention runs eagerly between the compiled pieces.
            forward_fn(P)
            return
        # Fresh attention state: backends mutate or lazily build metadata
        # during warmup, and a graph must not bake that in.
        forward_fn = create_forward_fn(desc, False)
        if desc.cg_mode == P:
            forward_fn(P)
            return
        if desc in self.graphs:
            raise RuntimeError(f"graph already captured for {desc.short()}")
        graph = cuda.CUDAGraph()
        with cuda.graph(graph, pool=self.pool, stream=stream):
            forward_fn(N)
        self.graphs[desc] = graph

    # -- dispatch and replay --------------------------------------------------------------
    def effective_lora_case(self, num_active_loras: int) -> int:
        # Per manager and count: dispatch asks it for every batch of a sweep.
        case = self._case_of.get(num_active_loras)
        if case is None:
            case = self._case_of[num_active_loras] = lora_case(num_active_loras, self.lora_cases)
        return case

    def dispatch(self, batch: Batch) -> BatchDescriptor:
        return self._dispatch_each((batch,))[0]

    def dispatch_each(self, batches: Sequence[Batch | BatchShape]) -> list[BatchDescriptor]:
        """dispatch() of every batch, in order: what a dispatch sweep asks,
        thousands of batches at once.  A manager that decides differently
        (overrides dispatch) is asked batch by batch."""
        if type(self).dispatch is not CudaGraphManager.dispatch:
            return [self.dispatch(b) for b in batches]
        return self._dispatch_each(batches)

    def _dispatch_each(self, batches: Sequence[Batch | BatchShape]) -> list[BatchDescriptor]:
        # Per LoRA count, once per call: the case its candidates are looked up
        # under, and the case a graph must be to run it (compatible(), the two
        # agree unless effective_lora_case is wrong).
        lookup: dict[int, int] = {}
        must: dict[int, int] = {}
        candidates = self._candidates if self._graphs_captured else {}
        eager = self._eager
        out: list[BatchDescriptor] = []
        for batch in batches:
            count, tokens = batch.num_active_loras, batch.num_tokens
            loras = lookup.get(count)
            if loras is None:
                loras = lookup[count] = self.effective_lora_case(count)
                must[count] = lora_case(count, self.lora_cases)
            found = None
            for desc in candidates.get((tokens, loras), ()):
                if desc.num_active_loras == must[count] and _runs(desc, batch):
                    found = desc
                    break
            if found is None:
                # Eager descriptors are values: one object per shape serves every
                # batch of a dispatch sweep that runs eagerly with it.
                key = (tokens, batch.num_reqs, loras, batch.num_ubatches)
                found = eager.get(key)
                if found is None:
                    if len(eager) > _EAGER_BOUND:
                        eager.clear()
                    found = eager[key] = BatchDescriptor(N, tokens, batch.num_reqs, num_active_loras=loras,
                                                         num_ubatches=batch.num_ubatches)
            out.append(found)
        return out

    def run_fullgraph(self, desc: BatchDescriptor) -> None:
        if desc.cg_mode != F:
            raise RuntimeError(f"run_fullgraph needs a FULL descriptor, got {desc.short()}")
        if desc not in self.graphs:
            raise RuntimeError(f"no graph captured for {desc.short()}")
        self.graphs[desc].replay()

    def release_graphs(self) -> None:
        # Descriptors stay: a later capture() refills the same set.
        self.graphs.clear()
        self._graphs_captured = False
        # The pool goes with its graphs.  Capturing again into a pool whose
        # graphs are all gone while tensors from it are still alive trips the
        # caching allocator's use_count > 0 assertion (seen on an H200), so the
        # next capture starts a fresh pool.
        if self.pool is not None:
            self.pool = self.backend.cuda.graph_pool_handle()

    def runtime_padding(self, batch: Batch, desc: BatchDescriptor) -> tuple[int, int]:
        """(num_reqs, num_tokens) attention metadata is built with at runtime:
        exactly what the graph was captured with, so in-graph kernels read
        consistent sizes."""
        if desc.cg_mode == N:
            return batch.num_reqs, batch.num_tokens
        if desc.num_reqs is not None:
            return desc.num_reqs, desc.num_tokens
        return batch.num_reqs, desc.num_tokens


class ModelCudaGraphManager(CudaGraphManager):
    """Model-level capture: create_forward_fn over the workload, and the model
    runner's execute path (padding, metadata, forward context)."""

    def __init__(self, config: ManagerConfig, ruleset: Ruleset, backend, workload):
        self.workload = workload
        super().__init__(config, ruleset, backend)
        workload.graph_pool = self.pool

    def skip_attn(self, desc: BatchDescriptor, warmup: bool = False) -> bool:
        return self.ruleset.skip_attn(desc.cg_mode == P, self.use_breakable_cg, warmup)

    def capture_num_reqs(self, desc: BatchDescriptor) -> int:
        return desc.num_reqs or min(desc.num_tokens, self.max_num_reqs)

    def piecewise_key(self, num_tokens: int, loras: int) -> tuple:
        return (num_tokens, loras > 0, loras)

    def make_create_forward_fn(self) -> CreateForward:
        w = self.workload

        def create_forward_fn(desc: BatchDescriptor, warmup: bool) -> ForwardFn:
            num_tokens = desc.num_tokens
            num_reqs = self.capture_num_reqs(desc)
            layout = w.prepare_dummy_inputs(num_reqs, num_tokens, desc.num_active_loras)
            md = None
            # Where the design skips attention only in the PIECEWISE pass, the
            # warmup still builds metadata.
            if not self.skip_attn(desc, warmup=True):
                full = desc.cg_mode == F
                max_q = desc.max_query_len or desc.uniform_token_count
                if max_q is None:
                    # A mixed graph (FULL, or breakable pieces that read metadata)
                    # may replay one prefill spanning the whole batch.
                    max_q = num_tokens
                md = w.prepare_attn(layout, num_reqs, num_tokens, max_q, for_capture=full)

            def forward_fn(cg_mode: CUDAGraphMode) -> None:
                key = self.piecewise_key(num_tokens, desc.num_active_loras) if cg_mode == P else None
                attn = None if cg_mode == P and self.skip_attn(desc) else md
                with set_forward_context(attn, num_tokens, cg_mode, key, desc.num_active_loras):
                    out = w.model_forward()
                if cg_mode == P:
                    return
                # Persistent output buffer allocated outside the graph pool: it
                # outlives every graph and is what run_fullgraph reads.
                w.hidden_states[:num_tokens].copy_(out)

            return forward_fn

        return create_forward_fn

    def capture_model(self) -> None:
        tapped = self.workload.tap_create_forward_fn(self.make_create_forward_fn())
        # Python's GC must not run inside a capture: collecting an old graph
        # (garbage from an earlier capture) frees driver objects while the
        # stream captures and invalidates the capture (seen on an H200).  Like
        # vLLM's freeze_gc_for_cudagraph_capture, GC is held off; no collect
        # first (it cost 3x campaign throughput on the H200).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.capture(tapped)
        finally:
            if was_enabled:
                gc.enable()

    def execute(self, batch: Batch, desc: BatchDescriptor) -> Execution:
        w = self.workload
        num_reqs, num_tokens = self.runtime_padding(batch, desc)
        layout = w.load_batch(batch, num_tokens)
        md = w.prepare_attn(layout, num_reqs, num_tokens, None, for_capture=False)
        loras = desc.num_active_loras
        with w.serving(desc):
            if desc.cg_mode == F:
                self.run_fullgraph(desc)
                return Execution(w.hidden_states[: batch.num_tokens].clone(), "full", md.id, desc)
            mode = P if desc.cg_mode == P else N
            key = self.piecewise_key(num_tokens, loras) if mode == P else None
            with set_forward_context(md, num_tokens, mode, key, loras if mode == P else batch.num_active_loras):
                out = w.model_forward()[: batch.num_tokens].clone()
            if mode == P:
                return Execution(out, "piecewise", md.id, key)
            return Execution(out, "eager", md.id)

    def release_graphs(self) -> None:
        super().release_graphs()
        # Piecewise graphs are captured into the manager's pool too.
        self.workload.graph_pool = self.pool


class ManagerHandle:
    """Adapts a ModelCudaGraphManager to the runner's ManagerUnderTest interface."""

    def __init__(self, manager: ModelCudaGraphManager):
        self.m = manager
        self.resolved_mode = manager.cudagraph_mode
        self.uses_breakable = manager.use_breakable_cg
        self.has_piecewise_runner = manager.cudagraph_mode.has_piecewise() and manager.config.piecewise_available

    def capture(self) -> None:
        self.m.capture_model()

    def dispatch(self, batch: Batch) -> BatchDescriptor:
        return self.m.dispatch(batch)

    def dispatch_all(self, shapes: Sequence[BatchShape]) -> list[BatchDescriptor]:
        return self.m.dispatch_each(shapes)

    def execute(self, batch: Batch, desc: BatchDescriptor) -> Execution:
        return self.m.execute(batch, desc)

    def release(self) -> None:
        self.m.release_graphs()

    def captured_flag(self) -> bool:
        return self.m._graphs_captured

    def stored_graphs(self) -> tuple[BatchDescriptor, ...]:
        return tuple(self.m.graphs)

    @staticmethod
    def _snapshot(capture_descs, candidates) -> CandidateSnapshot:
        descs = tuple(d for mode in (P, F) for d in capture_descs.get(mode, []))
        cands = tuple(sorted((k, tuple(v)) for k, v in candidates.items()))
        return CandidateSnapshot(descs, cands)

    def candidates(self) -> CandidateSnapshot:
        return self._snapshot(self.m._capture_descs, self.m._candidates)

    def recomputed_candidates(self) -> CandidateSnapshot:
        descs = self.m.build_capture_descs()
        return self._snapshot(descs, self.m.build_candidates(descs))


class ReferenceTarget:
    """cgsim's own manager; mutants subclass it with one bug each."""

    name = "reference"
    engine = "vllm"  # one manager dispatching every batch over candidate lists: vLLM's designs
    manager_class: type[ModelCudaGraphManager] = ModelCudaGraphManager
    capabilities = frozenset({"mock", "cuda", "release"})
    triage = Triage()
    tooling = Tooling()

    def __init__(self) -> None:
        self.drawing = Drawing(engine_capture_sizes=self._engine_capture_sizes)

    def default_ruleset(self) -> str | None:
        return None  # written to follow every ruleset: the strategy picks

    def prepare_environment(self) -> None:
        pass

    def environment(self) -> dict:
        return {}

    def _engine_capture_sizes(self, max_num_seqs: int, decode_query_len: int,
                              spec_schedule: tuple | None) -> tuple[int, ...]:
        """The sizes engines capture by default: vLLM 0.32's ladder, written out."""
        return vllm_capture_sizes(max_num_seqs, decode_query_len, spec_schedule)

    def build(self, config: ManagerConfig, ruleset: Ruleset, backend, workload) -> ManagerHandle:
        try:
            return ManagerHandle(self.manager_class(config, ruleset, backend, workload))
        except RulesetRejects as exc:
            raise TargetUnsupported(str(exc)) from None


FAMILY = TargetFamily("reference", "cgsim's reference CUDA-graph manager (the spec written as a careful engineer would)",
                      lambda _variant: ReferenceTarget(), cgsims_own=True)
