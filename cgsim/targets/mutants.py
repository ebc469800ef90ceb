"""Mutants: the reference manager with exactly one real-engine bug each.

Each mutant is a ``ReferenceTarget`` subclass whose ``manager_class`` overrides
the smallest method of ``ModelCudaGraphManager`` that reproduces one bug class
seen in real engines (the class docstring says which and where).  They exist so
cgsim can check itself: every mutant must be caught by at least one SPEC §4
property on the CPU mock with a small scenario (``tests/test_mutants.py``).

Targets are looked up as ``mutant:<name>`` (``cgsim.targets.get_target``).
"""

from __future__ import annotations


from cgsim.descriptors import Batch, BatchDescriptor, compatible
from cgsim.modes import CUDAGraphMode
from cgsim.targets.reference import ModelCudaGraphManager, ReferenceTarget

__all__ = ["MUTANTS", "mutant_names"]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


# ---------------------------------------------------------------------------
# candidate init
# ---------------------------------------------------------------------------
class InitBeforeBreakableManager(ModelCudaGraphManager):
    def set_flags(self) -> None:
        # The flag is not final yet when the base __init__ runs candidate init.
        self.use_breakable_cg = False

    def __init__(self, config, ruleset, backend, workload):
        super().__init__(config, ruleset, backend, workload)
        # ... and only now does it get its real value: too late for the descriptors.
        ModelCudaGraphManager.set_flags(self)


class InitBeforeBreakable(ReferenceTarget):
    """Candidate init runs before the breakable flag is final.

    Bug class: init ordering.  Seen in vLLM model runner V2 before PR 48822,
    which moved ``_init_candidates()`` after ``use_breakable_cg`` was set: with
    the old order the PIECEWISE descriptors were built as if graphs were not
    breakable (under ``pr48822`` their num_reqs is None instead of padded).
    """

    name = "mutant:init-before-breakable"
    manager_class = InitBeforeBreakableManager


class UnclampedNumReqsManager(ModelCudaGraphManager):
    def mixed_num_reqs(self, mixed_mode, size):
        if mixed_mode == F:
            return size  # not clamped to max_num_reqs
        return super().mixed_num_reqs(mixed_mode, size)


class UnclampedNumReqs(ReferenceTarget):
    """Request counts of mixed FULL descriptors not clamped to max_num_reqs.

    Bug class: descriptor bounds.  Where: vLLM model runner V2 candidate
    init / ``_dummy_run`` (the ``num_reqs = min(num_tokens, max_num_reqs)``
    clamp; SPEC §2 "num_reqs = min(size, max_num_reqs) for FULL"): capture
    sizes above max_num_seqs produce descriptors (and dummy batches) with more
    requests than the scheduler can ever send or the metadata buffers hold.
    """

    name = "mutant:unclamped-num-reqs"
    manager_class = UnclampedNumReqsManager


class GlobalCandidateRangesManager(ModelCudaGraphManager):
    def add_candidates(self, candidates, key, members):
        # BUG: one key space for all modes; the first mode to claim a key owns
        # it, later modes never get appended.
        if key not in candidates:
            candidates[key] = list(members)


class GlobalCandidateRanges(ReferenceTarget):
    """Candidate ranges keyed across all modes instead of per mode.

    Bug class: candidate grouping.  Where: vLLM model runner V2
    ``CudaGraphManager`` candidate table (vllm 0.32 groups candidates per
    mode, SPEC §3): token ranges are claimed once over every descriptor,
    FULL first, so token counts covered by a FULL uniform-decode group never
    list the PIECEWISE descriptors and a mixed batch falls back to eager.
    """

    name = "mutant:global-candidate-ranges"
    manager_class = GlobalCandidateRangesManager


class RangeOffByOneManager(ModelCudaGraphManager):
    def candidate_range(self, start, tokens):
        return range(start, tokens)  # BUG: tokens itself left out


class RangeOffByOne(ReferenceTarget):
    """A candidate range off by one: ``range(start, tokens)`` drops the capture
    size itself, so a batch of exactly a captured size runs eagerly.

    Bug class: padding-table off-by-one.  Where: vLLM's padded-size lookup
    table (``bs_to_padded_graph_size`` in V1, the V2 candidate ranges) at the
    capture-size boundary.
    """

    name = "mutant:range-off-by-one"
    manager_class = RangeOffByOneManager


# ---------------------------------------------------------------------------
# capture
# ---------------------------------------------------------------------------
class FullReusesWarmupMetadataManager(ModelCudaGraphManager):
    def capture(self, create_forward_fn):
        warm: dict[BatchDescriptor, object] = {}

        def reuse(desc, warmup):
            if warmup:
                warm[desc] = create_forward_fn(desc, True)
                return warm[desc]
            return warm[desc]  # BUG: no second create_forward_fn(desc, warmup=False)

        super().capture(reuse)


class FullReusesWarmupMetadata(ReferenceTarget):
    """FULL (and breakable PIECEWISE) capture reuses the warmup's forward_fn
    and attention metadata instead of calling create_forward_fn(desc,
    warmup=False) again.

    Bug class: metadata freshness.  Where: vLLM model runner V2's capture
    loop (SPEC §2 capture protocol step 3, the create_forward_fn(desc,
    warmup=False) call around PR 48822); FlashInfer-style planners mutate or
    lazily build plan state during the warmup, and the graph bakes it in.
    """

    name = "mutant:full-reuses-warmup-metadata"
    manager_class = FullReusesWarmupMetadataManager


class SkipAttnBreakableManager(ModelCudaGraphManager):
    def skip_attn(self, desc):
        return desc.cg_mode == P  # BUG: also for breakable PIECEWISE


class SkipAttnBreakable(ReferenceTarget):
    """Attention skipped (metadata None) for every PIECEWISE capture, also
    with breakable graphs whose pieces contain attention-like ops.

    Bug class: skip-attention rule.  Seen in vLLM PR 48822 (the Inkling
    sconv/SWA backend): ``skip_attn`` keyed on the mode alone, so breakable
    PIECEWISE graphs were captured without metadata.
    """

    name = "mutant:skip-attn-breakable"
    manager_class = SkipAttnBreakableManager


class FullBeforePiecewiseManager(ModelCudaGraphManager):
    def capture_order(self):
        return [d for mode in (F, P) for d in self._capture_descs.get(mode, [])]


class FullBeforePiecewise(ReferenceTarget):
    """FULL graphs captured before PIECEWISE ones.

    Bug class: capture order / pool growth.  Where: vLLM's
    ``capture_model`` (V1 gpu_model_runner and model runner V2 capture
    PIECEWISE first so the smaller FULL activations reuse the shared pool,
    SPEC §2): FULL first grows the pool twice and costs memory.
    """

    name = "mutant:full-before-piecewise"
    manager_class = FullBeforePiecewiseManager


class MissingWarmupManager(ModelCudaGraphManager):
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


class MissingWarmup(ReferenceTarget):
    """No eager warmup forward before the capture.

    Bug class: warmup.  Where: vLLM's ``_capture_cudagraphs`` /
    ``_dummy_run`` (the ``cudagraph_num_of_warmups`` = 0 path) and SGLang's
    ``capture_one_batch_size``, which warms up before capturing for this
    reason: lazy initialisation (allocations, autotuning, library handles)
    otherwise happens inside the capture.
    """

    name = "mutant:missing-warmup"
    manager_class = MissingWarmupManager


class RebindMetadataManager(ModelCudaGraphManager):
    def capture_model(self):
        super().capture_model()
        # BUG: "fresh" metadata buffers after capture; graphs keep reading the old ones.
        self.workload.builder.allocate_buffers()


class RebindMetadata(ReferenceTarget):
    """Attention-metadata buffers rebound to new tensors after capture, so the
    runtime writes the new tensors and replayed graphs read stale ones.

    Bug class: metadata lifetime.  Where: vLLM attention metadata builders
    (FlashInfer / MLA ``build_for_cudagraph_capture`` and the persistent
    buffer rule "update in place, never reassign"; SPEC §2 attention
    metadata lifetime, §5 "metadata tensor rebound ... replay reads the old
    one").
    """

    name = "mutant:rebind-metadata"
    manager_class = RebindMetadataManager


# ---------------------------------------------------------------------------
# dispatch, replay, release
# ---------------------------------------------------------------------------
class DispatchLaterCandidateManager(ModelCudaGraphManager):
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


class DispatchLaterCandidate(ReferenceTarget):
    """Dispatch returns a later, larger compatible candidate instead of the
    first one.

    Bug class: dispatch minimal padding.  Where: vLLM's
    ``CudagraphDispatcher.dispatch`` / model runner V2 ``dispatch`` walking
    the priority-ordered candidate list: returning a later entry pads more
    than needed (wasted compute per step).
    """

    name = "mutant:dispatch-later-candidate"
    manager_class = DispatchLaterCandidateManager


class UnpaddedBreakableMetadataManager(ModelCudaGraphManager):
    def runtime_padding(self, batch, desc):
        num_reqs, num_tokens = super().runtime_padding(batch, desc)
        if desc.cg_mode == P:
            return batch.num_reqs, num_tokens  # BUG: real num_reqs, not the captured padding
        return num_reqs, num_tokens


class UnpaddedBreakableMetadata(ReferenceTarget):
    """Runtime attention metadata not padded for breakable PIECEWISE: it is
    built for the batch's real num_reqs while the pieces were captured with
    the descriptor's padded num_reqs.

    Bug class: capture/replay metadata size mismatch.  Seen in vLLM PR 48822
    (prepare-attention padding for breakable PIECEWISE).
    """

    name = "mutant:unpadded-breakable-metadata"
    manager_class = UnpaddedBreakableMetadataManager


class LoraRoundDownManager(ModelCudaGraphManager):
    def effective_lora_case(self, num_active_loras):
        fitting = [c for c in self.lora_cases if c <= num_active_loras]
        return max(fitting) if fitting else self.lora_cases[0]  # BUG: rounds down


class LoraRoundDown(ReferenceTarget):
    """The active-LoRA count is rounded down (largest case <= count) instead
    of up (smallest case >= count).

    Bug class: LoRA case mapping.  Where: vLLM's LoRA cudagraph
    specialisation (``cudagraph_specialize_lora``, the active-LoRA count
    mapped to a captured case; SPEC §2 "smallest captured LoRA case >= it"):
    the batch is looked up under a case that cannot run all its adapters.
    """

    name = "mutant:lora-round-down"
    manager_class = LoraRoundDownManager


class CapturedFlagKeptManager(ModelCudaGraphManager):
    def release_graphs(self):
        captured = self._graphs_captured
        super().release_graphs()
        self._graphs_captured = captured  # BUG: graphs gone, flag kept


class CapturedFlagKept(ReferenceTarget):
    """The captured flag survives ``release_graphs``: graphs are cleared but
    dispatch still believes it may return FULL descriptors.

    Bug class: release / re-capture state.  Where: model runner V2
    ``release_graphs`` (sleep mode / weight reload release graphs and capture
    again, SPEC §4 RELEASE-RECAPTURE): a stale flag makes dispatch pick
    graphs that are gone.
    """

    name = "mutant:captured-flag-kept"
    manager_class = CapturedFlagKeptManager


class KeyDropsLoraCountManager(ModelCudaGraphManager):
    def piecewise_key(self, num_tokens, loras):
        if self.workload.phase == "runtime":
            return (num_tokens, loras > 0, int(loras > 0))  # BUG: count collapsed to the flag
        return super().piecewise_key(num_tokens, loras)


class KeyDropsLoraCount(ReferenceTarget):
    """The runtime looks piecewise graphs up under a key that keeps the
    has-LoRA flag but not the LoRA case, while capture keyed them by both.

    Bug class: piecewise key mismatch.  Where: vLLM's piecewise backend keys
    graphs by the forward context's BatchDescriptor; the capture path and the
    runtime path must build it the same way (LoRA flag and count, SPEC §4
    KEY-CONSISTENT).  A mismatch silently misses every graph of that case.
    """

    name = "mutant:key-drops-lora-count"
    manager_class = KeyDropsLoraCountManager


class DecodeLengthsAllManager(ModelCudaGraphManager):
    def decode_query_lens(self):
        return list(range(1, self.decode_query_len + 1))  # BUG: every length up to q


class DecodeLengthsAll(ReferenceTarget):
    """FULL decode graphs captured for every query length 1..q instead of the
    lengths the scheduler can produce.

    Bug class: speculative-decoding decode lengths.  Where: vLLM dynamic
    speculative decoding support in the cudagraph dispatcher (SPEC §2/§4
    DECODE-LENGTHS: the schedule as the scheduler applies it): graphs for
    lengths the scheduler never emits cost capture time and memory.
    """

    name = "mutant:decode-lengths-all"
    manager_class = DecodeLengthsAllManager


_ALL = (
    InitBeforeBreakable,
    FullReusesWarmupMetadata,
    SkipAttnBreakable,
    UnpaddedBreakableMetadata,
    RebindMetadata,
    GlobalCandidateRanges,
    RangeOffByOne,
    DispatchLaterCandidate,
    FullBeforePiecewise,
    MissingWarmup,
    UnclampedNumReqs,
    LoraRoundDown,
    CapturedFlagKept,
    KeyDropsLoraCount,
    DecodeLengthsAll,
)

MUTANTS: dict[str, type] = {cls.name.split(":", 1)[1]: cls for cls in _ALL}


def mutant_names() -> list[str]:
    return list(MUTANTS)
