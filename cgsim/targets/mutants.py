"""Mutants: the reference manager with exactly one real-engine bug each.

Each mutant is one ``ModelCudaGraphManager`` subclass that overrides the
smallest method reproducing one bug class seen in real engines (its
docstring says which and where), declared with ``@mutant``: its name, the
property that must catch it, a minimal scenario that shows it, and how the
fuzzer is pointed at it.  They exist so cgsim can check itself: every mutant
must be caught by its property on the CPU mock while the reference passes
the same scenario, and Hypothesis must find and shrink it
(``tests/cgsim/targets/test_mutants.py`` runs both for every declared mutant).

Adding a mutant is one class here.  Targets are named ``mutant:<name>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import AttentionSupport, CUDAGraphMode
from cgsim.scenario import Scenario, Step
from cgsim.spec.fit import compatible
from cgsim.targets.reference import ModelCudaGraphManager, ReferenceTarget
from cgsim.targets.registry import TargetFamily

__all__ = ["MUTANTS", "MUTANT_INFO", "Mutant", "Fuzz", "mutant", "mutant_names", "FAMILY"]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
C, D, R = Step.capture, Step.dispatch, Step.release
FAP = "FULL_AND_PIECEWISE"


@dataclass(frozen=True)
class Fuzz:
    """How the fuzzer is pointed at a mutant: the properties any of which may
    catch its shrunk case, the configs where the bug can show at all, a
    pinned ruleset, and whether it needs a release step."""

    catchers: frozenset[str]
    configs: Callable[[ManagerConfig], bool] | None = None
    ruleset: str | None = None
    release: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "catchers", frozenset(self.catchers))


@dataclass(frozen=True)
class Mutant:
    name: str
    manager_class: type
    target_class: type
    caught_by: str  # the property that must catch ``example``
    example: Callable[[], Scenario]  # the minimal scenario that shows the bug
    fuzz: Fuzz
    summary: str = field(default="")


MUTANT_INFO: dict[str, Mutant] = {}
MUTANTS: dict[str, type] = {}  # name -> its Target class


def _scenario(steps, ruleset: str = "pr48822", **config) -> Scenario:
    return Scenario(config=ManagerConfig(**config), steps=tuple(steps), ruleset=ruleset)


def mutant(name: str, *, caught_by: str, example: Callable[[], Scenario], fuzz: Fuzz) -> Callable[[type], type]:
    """Declare a mutant (see the module docstring); validated at import."""

    def register(manager_class: type) -> type:
        doc = (manager_class.__doc__ or "").strip()
        if not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", name):
            raise TypeError(f"mutant name {name!r} must be lower-case words joined by hyphens")
        if name in MUTANT_INFO:
            raise TypeError(f"mutant {name!r} is declared twice")
        if not issubclass(manager_class, ModelCudaGraphManager) or manager_class is ModelCudaGraphManager:
            raise TypeError(f"mutant {name}: decorate a ModelCudaGraphManager subclass, got {manager_class!r}")
        if "Bug class" not in doc:
            raise TypeError(f"mutant {name}: its docstring must say which bug class it is and where ('Bug class: ...')")
        from cgsim.properties import PROPERTIES

        for prop in {caught_by} | set(fuzz.catchers):
            if prop not in PROPERTIES:
                raise TypeError(f"mutant {name}: {prop!r} is not a property id (python -m fuzz list)")
        target_class = type(manager_class.__name__ + "Target", (ReferenceTarget,), {
            "__doc__": manager_class.__doc__, "__module__": manager_class.__module__,
            "name": f"mutant:{name}", "manager_class": manager_class,
        })
        first_paragraph = " ".join(doc.split("\n\n")[0].split())
        end = first_paragraph.find(". ")
        summary = first_paragraph if end < 0 else first_paragraph[: end + 1]
        MUTANT_INFO[name] = Mutant(name, manager_class, target_class, caught_by, example, fuzz, summary)
        MUTANTS[name] = target_class
        return manager_class

    return register


@mutant(
    "init-before-breakable",
    caught_by="CAND-ORDER",
    # Breakable PIECEWISE descriptors built as if not breakable (num_reqs None).
    example=lambda: _scenario([C()], mode="PIECEWISE", capture_sizes=(2,), breakable=True),
    fuzz=Fuzz({"CAND-ORDER"}),
)
class InitBeforeBreakable(ModelCudaGraphManager):
    """Candidate init runs before the breakable flag is final.

    Bug class: init ordering.  Seen in vLLM model runner V2 before PR 48822,
    which moved ``_init_candidates()`` after ``use_breakable_cg`` was set: with
    the old order the PIECEWISE descriptors were built as if graphs were not
    breakable (under ``pr48822`` their num_reqs is None instead of padded).
    """

    def set_flags(self) -> None:
        # The flag is not final yet when the base __init__ runs candidate init.
        self.use_breakable_cg = False

    def __init__(self, config, ruleset, backend, workload):
        super().__init__(config, ruleset, backend, workload)
        # ... and only now does it get its real value: too late for the descriptors.
        ModelCudaGraphManager.set_flags(self)


@mutant(
    "unclamped-num-reqs",
    caught_by="CAND-BOUNDS",
    # Capture size 4 with max_num_reqs 2: the mixed FULL descriptor says 4 requests.
    example=lambda: _scenario([C()], mode="FULL", capture_sizes=(4,), max_num_reqs=2),
    fuzz=Fuzz({"CAND-BOUNDS", "CAND-ORDER", "NO-CRASH"}),
)
class UnclampedNumReqs(ModelCudaGraphManager):
    """Request counts of mixed FULL descriptors not clamped to max_num_reqs.

    Bug class: descriptor bounds.  Where: vLLM model runner V2 candidate
    init / ``_dummy_run`` (the ``num_reqs = min(num_tokens, max_num_reqs)``
    clamp; SPEC §2 "num_reqs = min(size, max_num_reqs) for FULL"): capture
    sizes above max_num_seqs produce descriptors (and dummy batches) with more
    requests than the scheduler can ever send or the metadata buffers hold.
    """

    def mixed_num_reqs(self, mixed_mode, size):
        if mixed_mode == F:
            return size  # not clamped to max_num_reqs
        return super().mixed_num_reqs(mixed_mode, size)


@mutant(
    "global-candidate-ranges",
    caught_by="DISPATCH-COMPLETE",
    # The FULL decode group claims tokens 0..4, the mixed batch (2, 2) finds no PIECEWISE graph.
    example=lambda: _scenario([C(), D(Batch((2, 2)))], mode=FAP, capture_sizes=(4,)),
    fuzz=Fuzz({"DISPATCH-COMPLETE", "DISPATCH-ROUNDTRIP"}),
)
class GlobalCandidateRanges(ModelCudaGraphManager):
    """Candidate ranges keyed across all modes instead of per mode.

    Bug class: candidate grouping.  Where: vLLM model runner V2
    ``CudaGraphManager`` candidate table (vllm 0.32 groups candidates per
    mode, SPEC §3): token ranges are claimed once over every descriptor,
    FULL first, so token counts covered by a FULL uniform-decode group never
    list the PIECEWISE descriptors and a mixed batch falls back to eager.
    """

    def add_candidates(self, candidates, key, members):
        # BUG: one key space for all modes; the first mode to claim a key owns
        # it, later modes never get appended.
        if key not in candidates:
            candidates[key] = list(members)


@mutant(
    "range-off-by-one",
    caught_by="DISPATCH-COMPLETE",
    # A batch of exactly the capture size has no candidate list.
    example=lambda: _scenario([C(), D(Batch((1, 1)))], mode="PIECEWISE", capture_sizes=(2,)),
    fuzz=Fuzz({"DISPATCH-COMPLETE", "DISPATCH-ROUNDTRIP", "DISPATCH-PRIORITY"}),
)
class RangeOffByOne(ModelCudaGraphManager):
    """A candidate range off by one: ``range(start, tokens)`` drops the capture
    size itself, so a batch of exactly a captured size runs eagerly.

    Bug class: padding-table off-by-one.  Where: vLLM's padded-size lookup
    table (``bs_to_padded_graph_size`` in V1, the V2 candidate ranges) at the
    capture-size boundary.
    """

    def candidate_range(self, start, tokens):
        return range(start, tokens)  # BUG: tokens itself left out


@mutant(
    "nearest-group-candidates",
    caught_by="DISPATCH-PRIORITY",
    # Lengths 5 (1-2 requests) and 3 (3-4): three 3-token requests (9 tokens)
    # find only FULL(10, reqs=2, uniform=5) in their nearest group and go
    # PIECEWISE, though FULL(12, reqs=4, uniform=3) fits them.
    example=lambda: _scenario([C()], mode=FAP, capture_sizes=(1, 2, 4, 10, 16), max_num_reqs=4, decode_query_len=5,
                              spec_schedule=((1, 2, 4), (3, 4, 2))),
    # Several decode lengths, each with FULL graphs of its own.
    fuzz=Fuzz({"DISPATCH-PRIORITY", "DISPATCH-COMPLETE"},
              configs=lambda c: len(c.scheduler_decode_query_lens()) > 1 and c.mode.has_full()
              and c.attention_support >= AttentionSupport.UNIFORM_BATCH),
)
class NearestGroupCandidates(ModelCudaGraphManager):
    """Each token count lists only the nearest group of graphs of a mode.

    Bug class: candidate lists under several decode lengths.  Seen in vLLM
    model runner V2 0.29-0.32 (``CudaGraphManager._init_candidates`` keeps, per
    mode, the descriptors of the nearest captured token count; docs/findings.md
    #1): with dynamic speculative decoding the nearest FULL group may hold no
    graph of the batch's decode length while a larger one does, and the batch
    runs piecewise or eagerly.
    """

    def candidate_members(self, groups, i):
        return list(groups[i][1])  # BUG: the nearest group only


@mutant(
    "full-reuses-warmup-metadata",
    caught_by="FRESH-METADATA",
    # The FULL graph is captured with the warmup's metadata object.
    example=lambda: _scenario([C()], mode="FULL", capture_sizes=(2,)),
    fuzz=Fuzz({"FRESH-METADATA"}),
)
class FullReusesWarmupMetadata(ModelCudaGraphManager):
    """FULL (and breakable PIECEWISE) capture reuses the warmup's forward_fn
    and attention metadata instead of calling create_forward_fn(desc,
    warmup=False) again.

    Bug class: metadata freshness.  Where: vLLM model runner V2's capture
    loop (SPEC §2 capture protocol step 3, the create_forward_fn(desc,
    warmup=False) call around PR 48822); FlashInfer-style planners mutate or
    lazily build plan state during the warmup, and the graph bakes it in.
    """

    def capture(self, create_forward_fn):
        warm: dict[BatchDescriptor, object] = {}

        def reuse(desc, warmup):
            if warmup:
                warm[desc] = create_forward_fn(desc, True)
                return warm[desc]
            return warm[desc]  # BUG: no second create_forward_fn(desc, warmup=False)

        super().capture(reuse)


@mutant(
    "skip-attn-breakable",
    caught_by="SKIP-ATTN",
    # The breakable PIECEWISE capture runs with metadata None.
    example=lambda: _scenario([C()], mode="PIECEWISE", capture_sizes=(2,), breakable=True),
    fuzz=Fuzz({"SKIP-ATTN"}),
)
class SkipAttnBreakable(ModelCudaGraphManager):
    """Attention skipped (metadata None) for every PIECEWISE capture, also
    with breakable graphs whose pieces contain attention-like ops.

    Bug class: skip-attention rule.  Seen in vLLM PR 48822 (the Inkling
    sconv/SWA backend): ``skip_attn`` keyed on the mode alone, so breakable
    PIECEWISE graphs were captured without metadata.
    """

    def skip_attn(self, desc, warmup=False):
        return desc.cg_mode == P  # BUG: also for breakable PIECEWISE


@mutant(
    "full-before-piecewise",
    caught_by="CAPTURE-ORDER",
    example=lambda: _scenario([C()], mode=FAP, capture_sizes=(2,)),
    fuzz=Fuzz({"CAPTURE-ORDER"}),
)
class FullBeforePiecewise(ModelCudaGraphManager):
    """FULL graphs captured before PIECEWISE ones.

    Bug class: capture order / pool growth.  Where: vLLM's
    ``capture_model`` (V1 gpu_model_runner and model runner V2 capture
    PIECEWISE first so the smaller FULL activations reuse the shared pool,
    SPEC §2): FULL first grows the pool twice and costs memory.
    """

    def capture_order(self):
        return [d for mode in (F, P) for d in self._capture_descs.get(mode, [])]


@mutant(
    "missing-warmup",
    caught_by="WARMUP-FIRST",
    example=lambda: _scenario([C()], mode="FULL", capture_sizes=(2,)),
    fuzz=Fuzz({"WARMUP-FIRST"}),
)
class MissingWarmup(ModelCudaGraphManager):
    """No eager warmup forward before the capture.

    Bug class: warmup.  Where: vLLM's ``_capture_cudagraphs`` /
    ``_dummy_run`` (the ``cudagraph_num_of_warmups`` = 0 path) and SGLang's
    ``capture_one_batch_size``, which warms up before capturing for this
    reason: lazy initialisation (allocations, autotuning, library handles)
    otherwise happens inside the capture.
    """

    def capture(self, create_forward_fn):
        def no_warmup(desc, warmup):
            forward_fn = create_forward_fn(desc, warmup)
            if not warmup:
                return forward_fn
            first = [True]

            def forward(cg_mode):
                if first[0] and cg_mode == N:
                    first[0] = False  # BUG: the eager warmup pass is dropped
                    return
                forward_fn(cg_mode)

            return forward

        super().capture(no_warmup)


@mutant(
    "rebind-metadata",
    caught_by="METADATA-LIVE",
    # Metadata buffers reallocated after capture: the FULL replay reads stale ones.
    example=lambda: _scenario([C(), D(Batch((1, 1)))], mode="FULL", capture_sizes=(2,)),
    fuzz=Fuzz({"METADATA-LIVE", "REPLAY-EQUALS-EAGER"}),
)
class RebindMetadata(ModelCudaGraphManager):
    """Attention-metadata buffers rebound to new tensors after capture, so the
    runtime writes the new tensors and replayed graphs read stale ones.

    Bug class: metadata lifetime.  Where: vLLM attention metadata builders
    (FlashInfer / MLA ``build_for_cudagraph_capture`` and the persistent
    buffer rule "update in place, never reassign"; SPEC §2 attention
    metadata lifetime, §5 "metadata tensor rebound ... replay reads the old
    one").
    """

    def capture_model(self):
        super().capture_model()
        # BUG: "fresh" metadata buffers after capture; graphs keep reading the old ones.
        self.workload.builder.allocate_buffers()


@mutant(
    "dispatch-later-candidate",
    caught_by="DISPATCH-MINIMAL",
    # The two-token batch goes to the 4-token graph.
    example=lambda: _scenario([C(), D(Batch((1, 1)))], mode="PIECEWISE", capture_sizes=(2, 4)),
    fuzz=Fuzz({"DISPATCH-MINIMAL", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP"}),
)
class DispatchLaterCandidate(ModelCudaGraphManager):
    """Dispatch returns a later, larger compatible candidate instead of the
    first one.

    Bug class: dispatch minimal padding.  Where: vLLM's
    ``CudagraphDispatcher.dispatch`` / model runner V2 ``dispatch`` walking
    the priority-ordered candidate list: returning a later entry pads more
    than needed (wasted compute per step).
    """

    def dispatch(self, batch: Batch) -> BatchDescriptor:
        loras = self.effective_lora_case(batch.num_active_loras)
        key = (batch.num_tokens, loras)
        if self._graphs_captured and key in self._candidates:
            fits = [d for d in self._candidates[key] if compatible(d, batch, self.lora_cases)]
            if fits:
                # BUG: skips the first compatible candidate when there is another.
                return fits[1] if len(fits) > 1 else fits[0]
        return BatchDescriptor(N, batch.num_tokens, batch.num_reqs, num_active_loras=loras,
                               num_ubatches=batch.num_ubatches)


@mutant(
    "unpadded-breakable-metadata",
    caught_by="PAD-CONSISTENT",
    # Pieces captured for 4 padded requests, runtime metadata built for 2.
    example=lambda: _scenario([C(), D(Batch((1, 1)))], mode="PIECEWISE", capture_sizes=(4,), breakable=True),
    fuzz=Fuzz({"PAD-CONSISTENT"}, configs=lambda c: c.breakable, ruleset="pr48822"),
)
class UnpaddedBreakableMetadata(ModelCudaGraphManager):
    """Runtime attention metadata not padded for breakable PIECEWISE: it is
    built for the batch's real num_reqs while the pieces were captured with
    the descriptor's padded num_reqs.

    Bug class: capture/replay metadata size mismatch.  Seen in vLLM PR 48822
    (prepare-attention padding for breakable PIECEWISE).
    """

    def runtime_padding(self, batch, desc):
        num_reqs, num_tokens = super().runtime_padding(batch, desc)
        if desc.cg_mode == P:
            return batch.num_reqs, num_tokens  # BUG: real num_reqs, not the captured padding
        return num_reqs, num_tokens


@mutant(
    "lora-round-down",
    caught_by="DISPATCH-COMPLETE",
    # One active adapter mapped down to case 0: no compatible graph, eager fallback.
    example=lambda: _scenario([C(), D(Batch((1, 1), num_active_loras=1))], mode="PIECEWISE", capture_sizes=(2,), lora_cases=(0, 2)),
    fuzz=Fuzz({"DISPATCH-COMPLETE", "DISPATCH-ROUNDTRIP", "DISPATCH-PRIORITY"}, configs=lambda c: c.lora_cases == (0, 2, 4)),
)
class LoraRoundDown(ModelCudaGraphManager):
    """The active-LoRA count is rounded down (largest case <= count) instead
    of up (smallest case >= count).

    Bug class: LoRA case mapping.  Where: vLLM's LoRA cudagraph
    specialisation (``cudagraph_specialize_lora``, the active-LoRA count
    mapped to a captured case; SPEC §2 "smallest captured LoRA case >= it"):
    the batch is looked up under a case that cannot run all its adapters.
    """

    def effective_lora_case(self, num_active_loras):
        fitting = [c for c in self.lora_cases if c <= num_active_loras]
        return max(fitting) if fitting else self.lora_cases[0]  # BUG: rounds down


@mutant(
    "captured-flag-kept",
    caught_by="RELEASE-RECAPTURE",
    # After release the manager still says it is captured.
    example=lambda: _scenario([C(), R(), D(Batch((1, 1)))], mode="FULL", capture_sizes=(2,)),
    fuzz=Fuzz({"RELEASE-RECAPTURE", "BEFORE-CAPTURE"}, release=True),
)
class CapturedFlagKept(ModelCudaGraphManager):
    """The captured flag survives ``release_graphs``: graphs are cleared but
    dispatch still believes it may return FULL descriptors.

    Bug class: release / re-capture state.  Where: model runner V2
    ``release_graphs`` (sleep mode / weight reload release graphs and capture
    again, SPEC §4 RELEASE-RECAPTURE): a stale flag makes dispatch pick
    graphs that are gone.
    """

    def release_graphs(self):
        captured = self._graphs_captured
        super().release_graphs()
        self._graphs_captured = captured  # BUG: graphs gone, flag kept


@mutant(
    "key-drops-lora-count",
    caught_by="KEY-CONSISTENT",
    # Captured under (2, True, 2), looked up under (2, True, 1).
    example=lambda: _scenario([C(), D(Batch((1, 1), num_active_loras=2))], mode="PIECEWISE", capture_sizes=(2,), lora_cases=(0, 2)),
    fuzz=Fuzz({"KEY-CONSISTENT"}, configs=lambda c: max(c.lora_cases) >= 2),
)
class KeyDropsLoraCount(ModelCudaGraphManager):
    """The runtime looks piecewise graphs up under a key that keeps the
    has-LoRA flag but not the LoRA case, while capture keyed them by both.

    Bug class: piecewise key mismatch.  Where: vLLM's piecewise backend keys
    graphs by the forward context's BatchDescriptor; the capture path and the
    runtime path must build it the same way (LoRA flag and count, SPEC §4
    KEY-CONSISTENT).  A mismatch silently misses every graph of that case.
    """

    def piecewise_key(self, num_tokens, loras):
        if self.workload.phase == "runtime":
            return (num_tokens, loras > 0, int(loras > 0))  # BUG: count collapsed to the flag
        return super().piecewise_key(num_tokens, loras)


@mutant(
    "decode-lengths-all",
    caught_by="DECODE-LENGTHS",
    # q = 2: a FULL decode graph for length 1, which the scheduler never produces.
    example=lambda: _scenario([C()], mode=FAP, capture_sizes=(2,), decode_query_len=2),
    fuzz=Fuzz({"DECODE-LENGTHS", "CAPTURE-USEFUL"}, configs=lambda c: c.decode_query_len >= 2),
)
class DecodeLengthsAll(ModelCudaGraphManager):
    """FULL decode graphs captured for every query length 1..q instead of the
    lengths the scheduler can produce.

    Bug class: speculative-decoding decode lengths.  Where: vLLM dynamic
    speculative decoding support in the cudagraph dispatcher (SPEC §2/§4
    DECODE-LENGTHS: the schedule as the scheduler applies it): graphs for
    lengths the scheduler never emits cost capture time and memory.
    """

    def decode_query_lens(self):
        return list(range(1, self.decode_query_len + 1))  # BUG: every length up to q


@mutant(
    "private-graph-pools",
    caught_by="GRAPH-POOL-SHARED",
    # Two FULL graphs, each in a pool of its own: the pools reserve both captures' blocks.
    example=lambda: _scenario([C()], mode="FULL", capture_sizes=(1, 2)),
    fuzz=Fuzz({"GRAPH-POOL-SHARED"}, configs=lambda c: c.mode.has_full() and len(c.capture_sizes) >= 2),
)
class PrivateGraphPools(ModelCudaGraphManager):
    """Each FULL graph is captured into a private pool of its own instead of
    the manager's shared pool.

    Bug class: graph memory pools.  Where: the capture loop's
    ``torch.cuda.graph(graph, pool)`` (vLLM's CudaGraphManager passes the
    platform's global graph pool, SGLang its global graph memory pool): a
    capture without ``pool`` gets a fresh private pool, so no graph reuses
    the blocks a larger one freed and graph memory is the sum of every
    capture's activations instead of the largest, all of it taken from the
    KV cache.  Outputs stay right.
    """

    def capture(self, create_forward_fn):
        shared, self.pool = self.pool, None  # BUG: no pool given: each graph gets a private one
        try:
            super().capture(create_forward_fn)
        finally:
            self.pool = shared


@mutant(
    "max-size-graph-output",
    caught_by="GRAPH-MEMORY-FIT",
    # Graphs of 1 and 2 tokens each keep a staging output of the largest size, 8 tokens.
    example=lambda: _scenario([C()], mode="FULL", capture_sizes=(1, 2, 8)),
    fuzz=Fuzz({"GRAPH-MEMORY-FIT"}, configs=lambda c: c.mode.has_full()),
)
class MaxSizeGraphOutput(ModelCudaGraphManager):
    """Every FULL graph stages its output through a buffer allocated inside
    its capture at the largest capture size, kept as long as the graph.

    Bug class: oversized graph buffers.  Where: static outputs or scratch a
    runner allocates per graph inside the capture (the engines size what a
    graph keeps by the graph's own batch: SGLang's per-size output buffers,
    vLLM's outputs sliced to the graph's tokens); sized by max_num_tokens
    instead, every graph holds the largest graph's buffer in the pool, where
    no smaller capture can reuse it.  Outputs stay right.
    """

    def __init__(self, config, ruleset, backend, workload):
        super().__init__(config, ruleset, backend, workload)
        self._staging: dict[BatchDescriptor, object] = {}

    def make_create_forward_fn(self):
        base = super().make_create_forward_fn()
        hidden = self.workload.hidden_states

        def create_forward_fn(desc, warmup):
            forward_fn = base(desc, warmup)

            def staged(cg_mode):
                forward_fn(cg_mode)
                if warmup or desc.cg_mode != F or cg_mode != N:
                    return
                n = desc.num_tokens
                # BUG: sized for the largest graph, not this one's n tokens.
                buf = hidden.new_zeros((self.config.max_capture_size, hidden.shape[1]))
                buf[:n].copy_(hidden[:n])
                hidden[:n].copy_(buf[:n])
                self._staging[desc] = buf

            return staged

        return create_forward_fn

    def release_graphs(self):
        super().release_graphs()
        self._staging.clear()


@mutant(
    "capture-own-stream",
    caught_by="CAPTURE-STREAM-CONSISTENT",
    example=lambda: _scenario([C()], mode="FULL", capture_sizes=(2,)),
    fuzz=Fuzz({"CAPTURE-STREAM-CONSISTENT"}, configs=lambda c: c.mode.has_full()),
)
class CaptureOwnStream(ModelCudaGraphManager):
    """FULL graphs captured on torch.cuda.graph's own side stream, not on the
    stream the warm-up ran on.

    Bug class: capture stream.  Where: a ``torch.cuda.graph(graph, pool)``
    call without ``stream=``, as vLLM's CUDAGraphWrapper avoids by passing
    ``current_stream()`` (compilation/cuda_graph.py; model runner V2's
    ``_capture_stream``): the warm-up made the lazy per-stream state
    (cuBLAS workspaces) of another stream, so the capture stream's is
    allocated inside the graph and its pool kept alive for good.
    """

    def capture_one(self, desc, create_forward_fn, stream):
        super().capture_one(desc, create_forward_fn, None)  # BUG: torch.cuda.graph picks the stream


@mutant(
    "replay-side-stream",
    caught_by="CAPTURE-STREAM-CONSISTENT",
    example=lambda: _scenario([C(), D(Batch((1, 1)))], mode="FULL", capture_sizes=(2,)),
    fuzz=Fuzz({"CAPTURE-STREAM-CONSISTENT"}, configs=lambda c: c.mode.has_full()),
)
class ReplaySideStream(ModelCudaGraphManager):
    """FULL graphs replayed on a side stream of their own, not on the step's
    stream, with no wait between them.

    Bug class: replay stream ordering.  Where: a runner that replays on a
    dedicated stream (the capture stream kept, or an overlap scheduler's
    forward stream) without ``wait_stream`` on the stream its inputs were
    written on: on a GPU the replay reads half-written inputs and the caller
    reads outputs the replay has not produced yet.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replay_stream = self.backend.cuda.Stream()

    def run_fullgraph(self, desc):
        with self.backend.cuda.stream(self.replay_stream):  # BUG: no wait on the step's stream either way
            super().run_fullgraph(desc)


def mutant_names() -> list[str]:
    return list(MUTANTS)


FAMILY = TargetFamily(
    "mutant", "the reference manager with one real-engine bug injected",
    create=lambda variant: MUTANTS[variant](),
    variants=lambda: {n: m.summary for n, m in MUTANT_INFO.items()},
    cgsims_own=True,
)
