"""EAGLE's draft worker's graph runners as sub-managers of the sglang handle,
each judged in its own sub-trace: sglang's ``EAGLEDraftCudaGraphRunner``
("draft-decode", the round's draft steps) and ``EAGLEDraftExtendCudaGraphRunner``
("draft-extend", the draft model over the verified tokens).

sglang's code does the work: the runners' constructors (bs list, static
buffers, the capture loop they inherit from ``DecodeCudaGraphRunner``, their
``capture_one_shape``), ``can_run_graph``, ``execute`` (bisect padding,
buffer filling, the out-of-graph metadata preparation, the replay and the
slicing back to the real requests) and the ``FullCudaGraphBackend``.  cgsim
supplies the draft worker around them (``EagleDraftWorker``'s surface the
runners read: ``draft_runner``, ``speculative_num_steps``, ``draft_forward``,
``draft_extend_attn_backend``), the draft model runner (a fake ``ModelRunner``,
``is_draft_worker``) and the draft attention backends.

The draft model's computation is cgsim's.  Draft decode (``draft_steps``):
like ``EagleDraftWorker.draft_forward`` (speculative/eagle_worker_v2.py:742-923)
each of the ``speculative_num_steps - 1`` forwards reads the step's tokens,
positions and the attention metadata prepared out of graph, every step also
the request's top-k probabilities and carried hidden state, and positions
advance by one per step (undone by the runner's ``run_once``,
eagle_draft_cuda_graph_runner.py:524).  Draft extend (``extend_forward``): one
forward over the verified tokens with the target's hidden states, keeping
each request's last accepted row.  Every static buffer a runner fills thereby
reaches the output, so a graph replayed on buffers sglang did not refresh
gives other rows than the eager reference, the same computation run by cgsim
on the batch alone (``DraftReference``, ``ExtendReference``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner
from sglang.srt.speculative.eagle_info import EagleDraftExtendInput, EagleDraftInput

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape
from cgsim.modes import CUDAGraphMode
from cgsim.spec import sglang as rules
from cgsim.targets.base import CandidateSnapshot, Execution
from cgsim.targets.sglang import _world, compat
from cgsim.targets.sglang.alignment import engine_alignment
from cgsim.targets.sglang.blame import guarded
from cgsim.workload import EagerForward, Workload
from cgsim.workload.context import get_forward_context, set_forward_context
from cgsim.workload.model import HIDDEN, VOCAB

__all__ = ["DraftDecodeHandle", "DraftExtendHandle", "draft_limits", "draft_steps", "DraftReference",
           "ExtendReference"]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


def draft_limits(config: ManagerConfig) -> str | None:
    """Why the driver does not run the draft runners for ``config`` (None: it
    runs each one sglang builds)."""
    if rules.draft_decode_config(config) is None and rules.draft_extend_config(config) is None:
        return None
    if rules.runner_backends(config)[0] != rules.FULL_BACKEND:
        return "breakable draft runners are not driven"
    if config.num_ubatches > 1:
        return "the draft runners under two-batch overlap are not driven"
    return None


def draft_steps(w: Workload, md: Any, ids: torch.Tensor, positions: torch.Tensor, topk_p: torch.Tensor,
                hidden: torch.Tensor, steps: int, topk: int) -> torch.Tensor:
    """The draft model's ``steps - 1`` forwards over ``ids`` (bs x topk tokens):
    one row per token, each step's hidden states side by side.  ``positions``
    is advanced in place, as EagleDraftWorker.draft_forward advances
    forward_batch.positions (eagle_worker_v2.py:871-880)."""
    m = int(ids.shape[0])
    # The graph's batch already lives on the device (positions advanced in place there); the reference's on the host.
    dev = w.buffers.input_ids.device
    ids, positions, topk_p, hidden = ids.to(dev), positions.to(dev), topk_p.to(dev), hidden.to(dev)
    outs = []
    for i in range(steps - 1):
        w.buffers.input_ids[:m].copy_(ids)
        w.buffers.positions[:m].copy_(positions)
        w.buffers.lora_ids[:m].zero_()
        with set_forward_context(md, m, N, None, 0):
            # One recorded forward per draft_forward (the trace's capture pass);
            # the later steps read the same metadata.
            h = w.model_forward() if i == 0 else w.model.run_stages(get_forward_context())
        # The proposal's probabilities and the carried hidden state enter every
        # step, as the draft model's inputs do.
        h = h * topk_p.reshape(-1, 1) + hidden.repeat_interleave(topk, dim=0)
        outs.append(h)
        # Next step's tokens from the tokens alone: an argmax of float outputs
        # would flip on rounding noise between padded and unpadded rows.
        ids = (ids * 5 + 1 + i).remainder(VOCAB)
        positions.add_(1)
        hidden = h.reshape(-1, topk, HIDDEN)[:, 0]
    return torch.cat(outs, dim=1)


def _draft_inputs(layout: Any, num_reqs: int, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's top-k probabilities and carried hidden state (what the
    previous round's verify and draft extend left in spec_info), drawn from
    the batch's layout so that the graph's run and the reference agree."""
    def make() -> torch.Tensor:
        g = torch.Generator().manual_seed(int(layout.input_ids.sum()) * 131 + num_reqs)
        p = torch.rand(num_reqs, topk, generator=g) + 0.5
        h = torch.randn(num_reqs, HIDDEN, generator=g) * 0.1
        return torch.cat([p, h], dim=1)

    both = layout.derived(("sglang-draft-inputs", num_reqs, topk), make)
    return both[:, :topk].contiguous(), both[:, topk:].contiguous()


class DraftReference(EagerForward):
    """The draft steps run eagerly by cgsim on exactly the batch (its own
    workload, buffers and metadata): what the replay's real rows must equal."""

    def __init__(self, steps: int, topk: int):
        self.steps, self.topk = steps, topk
        self.key = ("sglang-eagle-draft-decode", steps, topk)

    def run(self, workload: Workload, batch: Batch) -> torch.Tensor:
        layout = workload.load_batch(batch, batch.num_tokens)
        md = workload.prepare_attn(layout, batch.num_reqs, batch.num_tokens, self.topk, for_capture=False)
        topk_p, hidden = _draft_inputs(layout, batch.num_reqs, self.topk)
        return draft_steps(workload, md, layout.input_ids.clone(), layout.positions.clone(), topk_p, hidden,
                           self.steps, self.topk)


class DraftAttention(_world.ToyAttention):
    """The multi-step draft attention backend's surface the runner uses
    (``attn_backends`` per step, ``init_cuda_graph_state``, the out-of-graph
    preparation before each capture and replay, ``init_forward_metadata`` for
    the eager draft).  One view serves every step: the toy kernels read the
    same KV slots at each step."""

    def __init__(self, model_runner: Any, workload: Workload, steps: int, width: int):
        super().__init__(model_runner, workload)
        self.width = width
        self.attn_backends = [self] * max(steps, 1)

    def _build(self, fb: Any, for_capture: bool) -> Any:
        bs = int(fb.batch_size)
        num_tokens = bs * self.width
        seq_lens = [int(s) for s in fb.seq_lens[:bs].tolist()]
        rows = [int(r) for r in fb.req_pool_indices[:bs].tolist()]
        table = self.model_runner.req_to_token_pool.req_to_token
        slots = [int(table[row, max(pos, 0)]) if 0 <= row < table.shape[0] else 0
                 for row, s in zip(rows, seq_lens) for pos in range(s - self.width, s)]
        layout = _world.ViewLayout([self.width] * bs, seq_lens, slots)
        return self.workload.prepare_attn(layout, bs, num_tokens, self.width, for_capture=for_capture)


class _DraftWorker:
    """EagleDraftWorker as the draft runner reads it (the V2 worker: no
    ``model_runner`` attribute, the draft model runner as ``draft_runner``)."""

    def __init__(self, handle: "_DraftRunnerHandle", runner: Any):
        self.h = handle
        self.draft_runner = runner
        self.speculative_num_steps = handle.steps
        self.topk = handle.topk
        self.seed_dsa_topk_from_draft_extend = False
        self.dsa_seed_topk_width = 0
        self.speculative_algorithm = runner.spec_algorithm
        self.hot_token_id = None  # no reduced draft vocabulary
        self.draft_extend_attn_backend = getattr(runner, "draft_extend_attn_backend", None)

    def draft_forward(self, forward_batch: Any) -> tuple:
        """(parent_list, top_scores_index, draft_tokens, draft_probs) in
        draft_forward's shape (a row per request, sliced by the runner); the
        draft steps' hidden states stand in for the proposal."""
        spec = forward_batch.spec_info
        bs = int(forward_batch.batch_size)
        md = self.draft_runner.draft_attn_backend.forward_metadata
        out = draft_steps(self.h.workload, md, spec.topk_index.reshape(-1), forward_batch.positions, spec.topk_p,
                          spec.hidden_states, self.h.steps, self.h.topk)
        return out.reshape(bs, -1), None, None, None


class _DraftRunnerHandle:
    """One of the draft worker's graph runners as a sub-manager (base.SubManager):
    captured after the target's runners, dispatched for a verify step's
    requests, released with the target.  Subclasses name the runner and its
    batch."""

    name = ""
    runner_cls: Any = None

    def __init__(self, parent: Any, config: ManagerConfig, reference: EagerForward):
        self.parent = parent
        self.config = config
        self.steps = rules.eagle_steps(parent.config)
        self.topk = rules.eagle_topk(parent.config)
        self.width = config.decode_query_len
        self.workload = parent.workload.for_manager(self.name, config, reference=reference)
        self.resolved_mode = rules.resolved_mode(config)
        self.uses_breakable = False
        self.has_piecewise_runner = False
        self.runner: Any = None
        self.replayed: Any = None
        self.keys: list = []
        self.mr = _world.FakeModelRunner(
            rank=parent.ranks[0], pool_size=parent.config.max_num_reqs, server_args=parent.server_args,
            speculative=True, lora=None, attention=lambda mr: _world.ToyAttention(mr, self.workload),
            device=str(parent.device))
        # The draft worker's model runner (TpModelWorker(is_draft_worker=True)).
        self.mr.is_draft_worker = True
        self.worker = _DraftWorker(self, self.mr)
        # sglang's own alignment, as the draft runners' sizing asks it (no gather
        # argument, no prefill buckets: get_batch_sizes_to_capture(model_runner)).
        self.engine_alignment = engine_alignment(None, prefill=False)
        self.setup()
        self._initial = tuple(self.desc(bs) for bs in sorted(self._bs_list(), reverse=True))
        reqs = max([parent.config.max_num_reqs + 2] + [d.num_reqs or 0 for d in self._initial])
        tokens = max([parent._max_tokens() * self.width] + [d.num_tokens for d in self._initial])
        self.workload.ensure_capacity(reqs, tokens)

    def setup(self) -> None:
        """What the worker sets up for this runner before building it."""

    def _bs_list(self) -> list[int]:
        """The bs list the runner's constructor takes: get_batch_sizes_to_capture
        of the draft model runner, default width (eagle_draft_cuda_graph_runner.py:157)."""
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

        sizes, _ = get_batch_sizes_to_capture(self.mr)
        return list(sizes)

    def desc(self, bs: int) -> BatchDescriptor:
        return rules.decode_desc(self.config, bs, 0)

    # -- capture (inside the parent's) ------------------------------------------------
    def build(self) -> None:
        """EagleDraftWorker._capture_cuda_graphs: the runner class called with the worker."""
        handle = self

        class Tapped(self.runner_cls):  # type: ignore[misc, name-defined]
            def capture(self) -> None:
                handle._tap_backend(self.backend)
                return super().capture()

        Tapped.__name__ = Tapped.__qualname__ = "Cgsim" + self.runner_cls.__name__
        self.keys = []
        self.workload.current_desc = None
        self.runner = Tapped(self.worker)

    def _tap_backend(self, be: Any) -> None:
        capture_one, replay, cleanup = be.capture_one, be.replay, be.cleanup
        handle = self

        def tapped_capture_one(shape_key: Any, forward_fn: Any, *args: Any, **kwargs: Any) -> Any:
            desc = handle.desc(shape_key.size)
            create = handle.workload.tap_create_forward_fn(lambda _key, warmup=False: forward_fn, to_desc=lambda _k: desc)
            result = capture_one(shape_key, create(shape_key, warmup=True), *args, **kwargs)
            handle.keys.append(shape_key)
            return result

        def tapped_replay(shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
            handle.replayed = shape_key
            return replay(shape_key, static_forward_batch, **kwargs)

        def tapped_cleanup() -> None:
            handle.keys.clear()
            return cleanup()

        be.capture_one, be.replay, be.cleanup = tapped_capture_one, tapped_replay, tapped_cleanup

    def drop(self) -> None:
        """The driver's teardown of the draft runner at a release (sglang's
        elastic release, cuda_graph_setup.py:379-388, reaches only the target's
        decode runner): its backend's cleanup, as a restarted process would."""
        if self.runner is not None:
            self.runner.backend.cleanup()
        self.runner = None

    # -- the batch the draft is asked about ---------------------------------------------
    def batch_for(self, batch: Batch) -> Batch | None:
        """A verify step's requests at this runner's width (EAGLEWorkerV2.forward_batch_generation:
        verify, draft extend of the verified tokens, then the next round's draft);
        a step with a prefill reaches neither runner here."""
        if not rules.is_decode_batch(self.parent.config, batch):
            return None
        return Batch.uniform(batch.num_reqs, self.width)

    def _is_draft_batch(self, b: Any) -> bool:
        return not b.has_prefill and b.uniform_token_count is not None

    # -- dispatch ----------------------------------------------------------------------
    def _eager(self, b: Any) -> BatchDescriptor:
        return BatchDescriptor(N, b.num_tokens, b.num_reqs, num_active_loras=b.num_active_loras,
                               num_ubatches=b.num_ubatches)

    def _decide(self, b: Any) -> BatchDescriptor | None:
        """can_run_graph, then the bs execute pads to (None: eager).  A batch
        with a prefill never reaches the draft decode runner."""
        runner = self.runner
        if runner is None or not self._is_draft_batch(b):
            return None
        fb = self._probe(list(b.query_lens))
        if not runner.can_run_graph(fb):
            return None
        return self.desc(runner._pad_to_bucket(int(fb.batch_size), runner.capture_bs))

    @guarded
    def dispatch(self, batch: Batch) -> BatchDescriptor:
        with self.parent._sglang():
            return self._decide(batch) or self._eager(batch)

    @guarded
    def dispatch_all(self, shapes: Sequence[BatchShape]) -> list[BatchDescriptor]:
        with self.parent._sglang():
            out = []
            for s in shapes:
                b = s if isinstance(s, Batch) else s.example()
                out.append(self._decide(b) or self._eager(s))
            return out

    # -- what the manager holds --------------------------------------------------------
    def capture(self) -> None:  # captured by the parent's capture(), after the target's runners
        raise RuntimeError("a draft runner is captured with the target's runners")

    def release(self) -> None:
        raise RuntimeError("a draft runner is released with the target's runners")

    def captured_flag(self) -> bool:
        return self.runner is not None

    @guarded
    def stored_graphs(self) -> tuple[BatchDescriptor, ...]:
        if self.runner is None:
            return ()
        return tuple(self.desc(k.size) for k in self.keys if self.runner.backend.can_run(None, k))

    def candidates(self) -> CandidateSnapshot:
        return CandidateSnapshot(self._initial, ())

    @guarded
    def recomputed_candidates(self) -> CandidateSnapshot:
        """The finished runner's own list (capture_bs)."""
        if self.runner is None:
            return CandidateSnapshot((), ())
        return CandidateSnapshot(tuple(self.desc(bs) for bs in sorted(self.runner.capture_bs, reverse=True)), ())


class DraftDecodeHandle(_DraftRunnerHandle):
    """EAGLEDraftCudaGraphRunner: the draft steps of a round at width topk."""

    name = rules.DRAFT_DECODE
    runner_cls = EAGLEDraftCudaGraphRunner

    def __init__(self, parent: Any, config: ManagerConfig):
        super().__init__(parent, config, DraftReference(rules.eagle_steps(parent.config), rules.eagle_topk(parent.config)))

    def setup(self) -> None:
        self.mr.draft_attn_backend = DraftAttention(self.mr, self.workload, self.steps, self.topk)

    def _probe(self, lens: list[int]) -> Any:
        ids = torch.zeros(int(sum(lens)), dtype=torch.int64)
        return self._forward_batch(lens, [0] * len(lens), ids, ids, None, None, None)

    # -- forward batches ------------------------------------------------------------------
    def _forward_batch(self, query_lens: Sequence[int], contexts: Sequence[int], ids: torch.Tensor,
                       positions: torch.Tensor, slots: Sequence[int] | None, topk_p: torch.Tensor | None,
                       hidden: torch.Tensor | None) -> Any:
        """What prepare_for_draft hands the runner (eagle_worker_common.py:241-361):
        a DECODE batch of the requests, topk tokens each, spec_info an
        EagleDraftInput of width num_tokens_per_req."""
        n = len(query_lens)
        width = int(query_lens[0]) if n else self.topk
        seq = [c + q for c, q in zip(contexts, query_lens)]
        if slots is not None:
            table = self.mr.req_to_token_pool.req_to_token
            i = 0
            for r, (c, q) in enumerate(zip(contexts, query_lens)):
                table[r, c:c + q] = torch.tensor(slots[i:i + q], dtype=table.dtype, device=table.device)
                i += q
        # prepare_for_draft hands the runner device tensors (seq_lens_cpu stays on the host); a batch
        # only asked about (no slots) stays on the host, as the target's probes do.
        dev = self.parent.device if slots is not None else torch.device("cpu")
        ids, positions = ids.to(dev), positions.to(dev)
        seq_cpu = torch.tensor(seq, dtype=torch.int64)
        seq_t = seq_cpu.to(dev)
        total = int(sum(query_lens))
        spec = EagleDraftInput(
            topk_p=topk_p.to(dev) if topk_p is not None else torch.ones(n, width, device=dev),
            topk_index=(ids.reshape(n, -1) if total == n * width
                        else torch.zeros(n, width, dtype=torch.int64, device=dev)),
            hidden_states=hidden.to(dev) if hidden is not None else torch.zeros(n, HIDDEN, device=dev),
            capture_hidden_mode=CaptureHiddenMode.LAST)
        spec.num_tokens_per_req = width
        spec.num_tokens_for_logprob_per_req = width
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=n, input_ids=ids,
            req_pool_indices=torch.arange(n, dtype=torch.int64, device=dev), seq_lens=seq_t, seq_lens_cpu=seq_cpu,
            seq_lens_sum=int(sum(seq)), out_cache_loc=torch.zeros(total * self.steps, dtype=torch.int64, device=dev),
            positions=positions,
            spec_algorithm=self.mr.spec_algorithm, spec_info=spec, capture_hidden_mode=CaptureHiddenMode.LAST)
        compat.tree().bind_kv_plan(self.mr, fb)
        return fb

    # -- execute -----------------------------------------------------------------------
    @guarded
    def execute(self, batch: Batch, desc: BatchDescriptor) -> Execution:
        """EagleDraftWorker.draft (eagle_worker_v2.py:660-724): the runner's
        execute where can_run_graph allowed it, else the eager draft (the
        backend's init_forward_metadata, then draft_forward)."""
        with self.parent._sglang(), torch.inference_mode():
            w = self.workload
            layout = w.load_batch(batch, batch.num_tokens)
            topk_p, hidden = _draft_inputs(layout, batch.num_reqs, self.topk)
            fb = self._forward_batch(layout.query_lens, layout.context_lens, layout.input_ids.clone(),
                                     layout.positions.clone(), layout.slots, topk_p, hidden)
            be = self.mr.draft_attn_backend
            with w.serving(desc if desc.cg_mode != N else None):
                if desc.cg_mode != N:
                    self.replayed = None
                    out = self.runner.execute(fb)[0]
                    if self.replayed is None:
                        raise RuntimeError("EAGLEDraftCudaGraphRunner.execute returned without replaying a graph")
                    graph = self.desc(self.replayed.size)
                    w.note_graph_output(graph, rows=int(out.shape[0]), real_rows=batch.num_reqs,
                                        padded_rows=graph.num_reqs or 0, output="draft_tokens")
                    md = be.forward_metadata
                    return Execution(out.reshape(batch.num_tokens, -1).clone(), "full",
                                     md.id if md is not None else None, graph)
                be.init_forward_metadata(fb)
                out = self.worker.draft_forward(fb)[0]
                return Execution(out.reshape(batch.num_tokens, -1).clone(), "eager", be.forward_metadata.id)


# -- EAGLE's draft extend runner (EAGLEDraftExtendCudaGraphRunner) ------------------------


def _extend_inputs(layout: Any, num_reqs: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The verified tokens' hidden states from the target (a row per token) and
    each request's last accepted token (the row the draft extend keeps), from
    the batch's layout so that the graph's run and the reference agree."""
    def make() -> torch.Tensor:
        g = torch.Generator().manual_seed(int(layout.input_ids.sum()) * 137 + num_reqs)
        return torch.randn(num_reqs * width, HIDDEN, generator=g) * 0.1

    hidden = layout.derived(("sglang-draft-extend-hidden", num_reqs, width), make)
    accepted = [1 + (i * 7 + int(layout.input_ids[i * width])) % width for i in range(num_reqs)]
    select = torch.tensor([i * width + a - 1 for i, a in enumerate(accepted)], dtype=torch.int64)
    return hidden, select


def extend_forward(w: Workload, md: Any, ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
                   select: torch.Tensor) -> torch.Tensor:
    """The draft model over the verified tokens (bs x draft tokens): one forward
    reading the tokens, positions, metadata and the target's hidden states;
    the row of each request's last accepted token comes back (the draft
    extend's logits processor keeps those, select_index)."""
    m = int(ids.shape[0])
    dev = w.buffers.input_ids.device
    w.buffers.input_ids[:m].copy_(ids)
    w.buffers.positions[:m].copy_(positions)
    w.buffers.lora_ids[:m].zero_()
    with set_forward_context(md, m, N, None, 0):
        h = w.model_forward()
    return (h + hidden[:m].to(dev))[select.to(dev)]


class ExtendReference(EagerForward):
    """The draft extend run eagerly by cgsim on exactly the batch."""

    def __init__(self, width: int):
        self.width = width
        self.key = ("sglang-eagle-draft-extend", width)

    def run(self, workload: Workload, batch: Batch) -> torch.Tensor:
        layout = workload.load_batch(batch, batch.num_tokens)
        md = workload.prepare_attn(layout, batch.num_reqs, batch.num_tokens, self.width, for_capture=False)
        hidden, select = _extend_inputs(layout, batch.num_reqs, self.width)
        return extend_forward(workload, md, layout.input_ids.clone(), layout.positions.clone(), hidden, select)


class _DraftExtendModel(torch.nn.Module):
    """The draft model as the draft extend runner calls it:
    ``model.forward(input_ids, positions, forward_batch)`` -> LogitsProcessorOutput
    of the selected rows."""

    def __init__(self, handle: "DraftExtendHandle"):
        super().__init__()
        self.h = handle
        shared_experts = compat.shared_experts_config()
        if shared_experts is not None:  # 0.5.23 reads the model's shared-experts config
            self.shared_experts_config = shared_experts()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any,
                **kwargs: Any) -> LogitsProcessorOutput:
        spec = forward_batch.spec_info
        md = self.h.worker.draft_extend_attn_backend.forward_metadata
        out = extend_forward(self.h.workload, md, input_ids, positions, spec.hidden_states, spec.select_index)
        return LogitsProcessorOutput(next_token_logits=out, hidden_states=out)


class DraftExtendHandle(_DraftRunnerHandle):
    """EAGLEDraftExtendCudaGraphRunner: the draft model over a verify step's
    tokens (width speculative_num_draft_tokens), keeping each request's last
    accepted row."""

    name = rules.DRAFT_EXTEND
    runner_cls = EAGLEDraftExtendCudaGraphRunner

    def __init__(self, parent: Any, config: ManagerConfig):
        super().__init__(parent, config, ExtendReference(config.decode_query_len))

    def setup(self) -> None:
        self.mr.model = _DraftExtendModel(self)
        backend = DraftAttention(self.mr, self.workload, 1, self.width)
        self.mr.draft_extend_attn_backend = self.worker.draft_extend_attn_backend = backend

    def _probe(self, lens: list[int]) -> Any:
        ids = torch.zeros(int(sum(lens)), dtype=torch.int64)
        return self._forward_batch(lens, [0] * len(lens), ids, ids, None, torch.zeros(int(sum(lens)), HIDDEN))

    def _forward_batch(self, query_lens: Sequence[int], contexts: Sequence[int], ids: torch.Tensor,
                       positions: torch.Tensor, slots: Sequence[int] | None, hidden: torch.Tensor) -> Any:
        """What prepare_for_draft_extend hands the runner (eagle_worker_common.py:112-238):
        a DRAFT_EXTEND_V2 batch of the verified tokens, seq_lens past them,
        spec_info an EagleDraftExtendInput of width num_tokens_per_req."""
        n = len(query_lens)
        width = int(query_lens[0]) if n else self.width
        seq = [c + q for c, q in zip(contexts, query_lens)]
        if slots is not None:
            table = self.mr.req_to_token_pool.req_to_token
            i = 0
            for r, (c, q) in enumerate(zip(contexts, query_lens)):
                table[r, c:c + q] = torch.tensor(slots[i:i + q], dtype=table.dtype, device=table.device)
                i += q
        # prepare_for_draft_extend hands the runner device tensors (the _cpu fields stay on the host); a
        # batch only asked about (no slots) stays on the host.
        dev = self.parent.device if slots is not None else torch.device("cpu")
        ids, positions, hidden = ids.to(dev), positions.to(dev), hidden.to(dev)
        seq_cpu = torch.tensor(seq, dtype=torch.int64)
        seq_t = seq_cpu.to(dev)
        total = int(sum(query_lens))
        accepted = torch.full((n,), width, dtype=torch.int32, device=dev)
        spec = EagleDraftExtendInput(hidden_states=hidden, num_correct_drafts=accepted - 1,
                                     num_accept_tokens=accepted, num_tokens_per_req=width,
                                     num_tokens_for_logprob_per_req=1)
        fb = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=n, input_ids=ids,
            req_pool_indices=torch.arange(n, dtype=torch.int64, device=dev), seq_lens=seq_t, seq_lens_cpu=seq_cpu,
            seq_lens_sum=int(sum(seq)), extend_seq_lens=torch.tensor(list(query_lens), dtype=torch.int32, device=dev),
            extend_seq_lens_cpu=list(query_lens), out_cache_loc=torch.zeros(total, dtype=torch.int64, device=dev),
            positions=positions,
            spec_algorithm=self.mr.spec_algorithm, spec_info=spec, capture_hidden_mode=CaptureHiddenMode.LAST)
        compat.tree().bind_kv_plan(self.mr, fb)
        return fb

    @guarded
    def execute(self, batch: Batch, desc: BatchDescriptor) -> Execution:
        """EagleDraftWorker._draft_extend_for_decode: the runner's execute where
        can_run_graph allowed it, else the draft model run eagerly."""
        with self.parent._sglang(), torch.inference_mode():
            w = self.workload
            layout = w.load_batch(batch, batch.num_tokens)
            hidden, select = _extend_inputs(layout, batch.num_reqs, self.width)
            fb = self._forward_batch(layout.query_lens, layout.context_lens, layout.input_ids.clone(),
                                     layout.positions.clone(), layout.slots, hidden)
            be = self.worker.draft_extend_attn_backend
            with w.serving(desc if desc.cg_mode != N else None):
                if desc.cg_mode != N:
                    self.replayed = None
                    out = self.runner.execute(fb, select.to(self.parent.device)).hidden_states
                    if self.replayed is None:
                        raise RuntimeError("EAGLEDraftExtendCudaGraphRunner.execute returned without replaying a graph")
                    graph = self.desc(self.replayed.size)
                    w.note_graph_output(graph, rows=int(out.shape[0]), real_rows=batch.num_reqs,
                                        padded_rows=graph.num_reqs or 0, output="hidden_states")
                    md = be.forward_metadata
                    return Execution(out.clone(), "full", md.id if md is not None else None, graph)
                fb.spec_info.select_index = select.to(self.parent.device)
                be.init_forward_metadata(fb)
                out = self.mr.model.forward(fb.input_ids, fb.positions, fb).hidden_states
                return Execution(out.clone(), "eager", be.forward_metadata.id)
