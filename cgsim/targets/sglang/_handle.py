"""cgsim's ManagerUnderTest over sglang's CUDA-graph runners.

``capture()`` builds sglang's ``PrefillCudaGraphRunner`` and then its
``DecodeCudaGraphRunner`` (the order of ``capture_cuda_graphs``), which capture
in their constructors.  ``dispatch()`` asks the runner for the batch's forward
mode ``can_run_graph`` and then the key it pads to, with the helpers its
``load_batch`` uses (``_pad_to_bucket``, ``_max_dp_batch_size``,
``_resolve_lora_variant``); ``execute()`` calls the runner's ``execute`` (or
runs the model eagerly) and reports the key sglang actually replayed, read off
the backend's ``replay`` call.  ``release()`` is sglang's elastic release
(``drop_elastic_cuda_graph_state``) plus the prefill backend's ``cleanup``.

Recording goes through the backend interface only: each runner's backend
instance has ``capture_one`` / ``replay`` / ``cleanup`` wrapped before the
runner's capture loop starts (a runner subclass overriding the public
``capture()``), so every shape's capture goes through
``Workload.tap_create_forward_fn`` and every forward through the workload's
model.  Under DP attention every rank is a runner of its own; only rank 0
records into the scenario's trace, the workload hears every rank's decision.
"""

from __future__ import annotations

import contextlib
import importlib
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Sequence

import torch

from sglang.srt.batch_overlap.two_batch_overlap import compute_split_seq_index
from sglang.srt.managers.scheduler_components.dp_attn import _local_decode_cuda_graph_vote
from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext as SglForwardContext
from sglang.srt.model_executor.forward_context import forward_context
from sglang.srt.model_executor.runner import DecodeCudaGraphRunner, PrefillCudaGraphRunner, ShapeKey
from sglang.srt.model_executor.runner import decode_cuda_graph_runner as decode_module
from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture
from sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend import BreakableCudaGraphBackend
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import eager_on_graph
from sglang.srt.model_executor.runner_utils.capture_mode import get_capture_lora_variant, get_is_capture_mode

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape
from cgsim.modes import CUDAGraphMode
from cgsim.spec import sglang as rules
from cgsim.spec.scheduler import sweep_token_limit
from cgsim.targets.base import CandidateSnapshot, Execution, TargetUnsupported
from cgsim.targets.sglang import _draft, _kv, _world, compat
from cgsim.targets.sglang.alignment import decode_gathers, engine_alignment
from cgsim.targets.sglang.blame import guarded
from cgsim.trace import Trace
from cgsim.workload import Workload
from cgsim.workload.context import ForwardContext
from cgsim.workload.harness import ReferenceTerm

__all__ = ["SglangHandle", "driver_limits"]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
_BACKEND_NAMES = {rules.FULL_BACKEND: Backend.FULL, rules.BREAKABLE: Backend.BREAKABLE, rules.DISABLED: Backend.DISABLED}


def driver_limits(config: ManagerConfig) -> str | None:
    """What this driver does not run (sglang would)."""
    if rules.options(config).dp_size > 1:
        if config.mode.mixed_mode() != N:
            return "sglang.dp_size > 1: the driver runs DP attention ranks for decode graphs only (mixed part NONE)"
        if config.num_ubatches > 1 or len(config.lora_cases) > 1 or config.decode_query_len > 1:
            return "sglang.dp_size > 1: the driver's DP ranks run plain decode (no two-batch overlap, LoRA or verify)"
    return None


def _prefill_tokens(sizes: list[int]) -> list[int]:
    """The prefill runner's buckets as the tree computes them: its helper
    (0.5.22+), else the sizes as listed (its constructor sorts them)."""
    if compat.tree().prefill_token_helper:
        return list(importlib.import_module(compat.PREFILL).get_prefill_num_tokens_to_capture(sizes))
    return sorted(set(sizes))


def _rank_lens(query_lens: Sequence[int], num_reqs: int, width: int) -> list[int]:
    """A DP rank's requests: the step's first ``num_reqs``, or all of them and
    decodes of the graphs' width (a peer holding more requests than rank 0)."""
    lens = list(query_lens[:num_reqs])
    return lens + [width] * (num_reqs - len(lens))


def _decode_bs(mr: Any) -> list[int]:
    """The decode runner's bs list, from the function its constructor sizes
    itself with (0.5.22+ tell it whether DP gathers buffers; older trees ask
    the process themselves)."""
    gathers = decode_gathers(mr)
    kwargs = {} if gathers is None else {"gathered_buffer_required": gathers}
    sizes, _ = get_batch_sizes_to_capture(mr, mr.decode_num_tokens_per_req(), **kwargs)
    return list(sizes)


def _eager_break(fn: Callable) -> Callable:
    """``fn`` as an eager break of breakable graphs: eager_on_graph(fn) (0.5.22+)
    or the decorator factory eager_on_graph(enable)(fn) of older trees."""
    return eager_on_graph(True)(fn) if compat.tree().eager_break_factory else eager_on_graph(fn)


def _records_nolora(mr: Any) -> bool:
    """What the decode runner's constructor sets record_nolora_graph to when
    the server builds it (no keyword): the tree's rule where it has one."""
    return bool(decode_module._lora_backend_skips_inactive(mr)) if compat.tree().nolora_from_backend else False


def _drop_elastic_state(decode_runner: Any) -> None:
    """sglang's elastic release of the decode runner's graphs and the pool."""
    setup = importlib.import_module(compat.SETUP)
    setup.drop_elastic_cuda_graph_state(decode_runner=decode_runner, eager_runner=None)


# The handle whose server config sglang has published (one scenario at a time per process).
_published: list[Any] = [None, None]  # [handle id, override]


class _Rank:
    """One rank: its model runner, its runners and the workload its model runs on."""

    def __init__(self, handle: "SglangHandle", index: int, workload: Workload):
        self.h = handle
        self.index = index
        self.workload = workload
        self.parallel = _world.rank_parallel(index, handle.dp)
        self.mr: Any = None
        self.decode: Any = None
        self.prefill: Any = None
        # Keys each runner's backend captured, in capture order (minus cleanup).
        self.keys: dict[str, list] = {"decode": [], "prefill": []}
        self.capture_key: Any = None
        self.capture_kind: str | None = None
        self.capturing_breakable = False
        self.replayed: tuple[str, Any] | None = None
        self._break_ops: dict[str, Callable] = {}

    def context(self) -> Any:
        return _world.parallel_override(self.parallel)

    # -- the model, as sglang's runners call it ---------------------------------
    def run_body(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: Any) -> torch.Tensor:
        """The transformer body: sglang's inputs into the toy model's static
        inputs (inside a graph the copies read sglang's static buffers at every
        replay), then the workload's model under the metadata sglang prepared."""
        w = self.workload
        n = int(input_ids.shape[0])
        w.buffers.input_ids[:n].copy_(input_ids)
        w.buffers.positions[:n].copy_(positions)
        md = self.mr.attn_backend.forward_metadata
        lora = self.mr.lora_manager
        lora_case = 0
        if lora is not None:
            # Outside capture every adapter is live; a capture records the LoRA
            # kernels unless it is the base-only ("nolora") variant's.
            lora_case = self.h.lora_k if (not get_is_capture_mode() or get_capture_lora_variant() != "nolora") else 0
            w.buffers.lora_ids[:n].copy_(lora.token_slots[:n])
        else:
            w.buffers.lora_ids[:n].zero_()
        if self.capturing_breakable and torch.cuda.is_current_stream_capturing():
            key = self.h.piecewise_key(self.capture_kind, self.capture_key)
            hs = w.run_breakable(ForwardContext(md, n, P, key, lora_case), True, self._break_op)
        else:
            with _world.body_context(md, n, N, None, lora_case):
                hs = w.model_forward()
        if not _kv.applies(fb):
            return hs
        return _kv.attend(self.mr.toy_kv, hs, input_ids, positions, fb, self.mr.req_to_token_pool.req_to_token,
                          self.h.width)

    def _break_op(self, stage: Any) -> Callable:
        op = self._break_ops.get(stage.name)
        if op is None:
            backend = self.mr.attn_backend

            def run(x: torch.Tensor, out: torch.Tensor) -> None:
                # An attention break reads the metadata current when it runs:
                # at replay, what sglang prepared for the live batch, whose
                # tokens may be fewer than the bucket's rows; like a varlen
                # kernel it computes the rows its metadata describes and leaves
                # the padding rows as they came.
                md = backend.forward_metadata
                n = min(md.num_tokens, x.shape[0])
                out[:n].copy_(stage.fn(x[:n], ForwardContext(md, n, P)))
                out[n:].copy_(x[n:])

            run.__name__ = f"cgsim_{stage.name}"
            op = self._break_ops[stage.name] = _eager_break(run)
        return op


class _KvTerm(ReferenceTerm):
    """The toy KV's part of a decode's eager reference (see _kv)."""

    def __init__(self, handle: "SglangHandle"):
        self.h = handle

    def key(self, batch: Batch) -> Any:
        return ("sglang-kv", self.h.width, _world.CONTEXT_LEN, self.h._is_extend(batch))

    def apply(self, out: torch.Tensor, layout: Any, batch: Batch) -> torch.Tensor:
        if self.h._is_extend(batch):
            return out
        return _kv.apply_reference(out, layout, self.h.width, _world.CONTEXT_LEN, out.device)


class SglangHandle:
    """ManagerUnderTest over sglang's decode and prefill CUDA-graph runners."""

    @guarded
    def __init__(self, config: ManagerConfig, backend: Any, workload: Workload, version: str,
                 patches: Callable[[], Any] | None = None):
        reason = rules.unsupported_reason(config) or driver_limits(config)
        if reason is not None:
            raise TargetUnsupported(f"config not expressible to sglang {version}: {reason}")
        self.config = config
        self.backend = backend
        # Where sglang's model runner, buffers and batches live: the backend's device.
        self.device = backend.device
        self.workload = workload
        self.patches = patches
        self.opts = rules.options(config)
        self.dp = self.opts.dp_size
        self.width = config.decode_query_len
        self.lora_k = rules.lora_case_of(config)
        self.tbo = config.num_ubatches == 2
        self.decode_backend, self.prefill_backend = rules.runner_backends(config)
        self.resolved_mode = rules.resolved_mode(config)
        self.uses_breakable = rules.BREAKABLE in (self.decode_backend, self.prefill_backend)
        self.has_piecewise_runner = self.uses_breakable
        self.slots = rules.prefill_slots(config)
        self._captured = False
        self._captures = 0
        self._override: Any = None
        # EAGLE's draft worker's graph runners (draft decode, draft extend), in capture order.
        self.drafts: list[Any] = []
        self._zeros = torch.zeros(0, dtype=torch.int64)
        workload.reference_term = _KvTerm(self)
        with self._sglang():
            self.ranks = [_Rank(self, r, workload if r == 0 else self._peer_workload()) for r in range(self.dp)]
            for rank in self.ranks:
                with rank.context():
                    rank.mr = _world.FakeModelRunner(
                        rank=rank, pool_size=config.max_num_reqs, server_args=self.server_args,
                        speculative=self.width > 1,
                        lora=(_world.AdapterSlots(self._max_tokens(), str(self.device), self.opts.record_nolora_graph)
                              if self.lora_k else None),
                        attention=lambda mr, w=rank.workload: _world.ToyAttention(mr, w), device=str(self.device))
            with self.ranks[0].context():
                # sglang's own answer for the alignment (recorded into the trace's header).
                self.engine_alignment = engine_alignment(
                    decode_gathers(self.ranks[0].mr),
                    prefill=compat.tree().prefill_token_helper)
                try:
                    self._initial = self._predicted_descs(self.ranks[0])
                except AssertionError as exc:
                    # No bs of the list survives the alignment: sglang stops at
                    # start-up (get_batch_sizes_to_capture asserts).  Where sglang's
                    # rules leave sizes, the assertion is the tree's defect.
                    if self.decode_backend != rules.DISABLED and rules.decode_capture_bs(config):
                        raise
                    raise TargetUnsupported(f"sglang {version} refuses this config at start-up: "
                                            f"AssertionError: {exc}") from None
                # EAGLE's draft runners, where the server builds them and the driver runs them.
                if _draft.draft_limits(config) is None:
                    for make, config_of in ((_draft.DraftDecodeHandle, rules.draft_decode_config),
                                            (_draft.DraftExtendHandle, rules.draft_extend_config)):
                        sub_config = config_of(config)
                        if sub_config is not None:
                            self.drafts.append(make(self, sub_config))
        # Graphs pad past the config's sizes: the rounded request pool, bs x width tokens.
        reqs = max([self.config.max_num_reqs + 2] + [d.num_reqs or 0 for d in self._initial])
        # Every batch of the scenario fits too, whatever the graphs hold.
        tokens = max([self._max_tokens()] + [d.num_tokens for d in self._initial])
        self._zeros = torch.zeros(max(tokens, sweep_token_limit(config)) + 1, dtype=torch.int64)
        for rank in self.ranks:
            rank.workload.ensure_capacity(reqs, tokens)

    def _max_tokens(self) -> int:
        """The most tokens any graph or batch of the scenario holds (an upper
        bound: the rounded pool times the width, the largest prefill bucket,
        the largest swept batch)."""
        c = self.config
        # A DP peer may hold up to dp_size - 1 decodes more than rank 0's batch.
        peers = (self.dp - 1) * self.width
        return max(sweep_token_limit(c), (c.max_num_reqs + 2) * self.width, max(c.capture_sizes) + 2,
                   self.workload.max_tokens) + 1 + peers

    # -- sglang's process around the runners -------------------------------------------
    @contextlib.contextmanager
    def _sglang(self) -> Iterator[None]:
        with _world.sglang_process(), (self.patches() if self.patches is not None else contextlib.nullcontext()):
            self._publish()
            yield

    def _publish(self) -> None:
        """sglang reads its config from one published object per process:
        publish this scenario's (once), taking back the previous scenario's."""
        if _published[0] == id(self) and self._override is not None:
            return
        if _published[1] is not None:
            _published[1].restore()
            _published[:] = [None, None]
        fields = self._server_fields(list(self.config.capture_sizes))
        if self.opts.default_bs_list:
            # What the memory hook does at start-up without --cuda-graph-bs:
            # SGLang's default ladder up to --cuda-graph-max-bs.
            override, server_args = _world.install_server_args(fields)
            hook = importlib.import_module("sglang.srt.arg_groups.cuda_graph_hook")
            decode_bs = list(hook.generate_decode_cuda_graph_batch_sizes(server_args, max(self.config.capture_sizes)))
            override.restore()
            fields = self._server_fields(decode_bs)
        self._override, self.server_args = _world.install_server_args(fields)
        _published[:] = [id(self), self._override]

    def _server_fields(self, decode_bs: list[int]) -> dict:
        cfg, opts = self.config, self.opts
        prefill = PhaseConfig(backend=_BACKEND_NAMES[self.prefill_backend], bs=list(cfg.capture_sizes),
                              full_prefill_max_req=self.slots if self.prefill_backend == rules.FULL_BACKEND else None)
        fields: dict[str, Any] = dict(
            device=self.device.type, attention_backend="triton", chunked_prefill_size=-1, kv_cache_dtype="auto",
            disable_cuda_graph_padding=opts.disable_padding, enable_cudagraph_gc=False, enable_torch_compile=False,
            torch_compile_max_bs=0, enable_two_batch_overlap=self.tbo, enable_pdmux=False,
            enable_profile_cuda_graph=False, debug_cuda_graph=False, enable_memory_saver=False, pp_size=1,
            dp_size=self.dp, tp_size=self.dp, max_running_requests=cfg.max_num_reqs,
            # Full prefill graphs here capture no cached-prefix topology.
            disable_chunked_prefix_cache=True,
            cuda_graph_config=CudaGraphConfig(
                decode=PhaseConfig(backend=_BACKEND_NAMES[self.decode_backend], bs=list(decode_bs)), prefill=prefill),
        )
        if self.dp > 1:
            fields["enable_dp_attention"] = True
        if self.width > 1:
            fields.update(speculative_algorithm="EAGLE", speculative_num_draft_tokens=self.width,
                          speculative_num_steps=rules.eagle_steps(cfg), speculative_eagle_topk=rules.eagle_topk(cfg))
        return fields

    def _peer_workload(self) -> Workload:
        """A DP peer's own model and metadata (another process in a real
        deployment): nothing it does goes into the scenario's trace."""
        w = self.workload
        return Workload(self.config, self.backend, Trace("sglang-peer-rank", self.backend.name), w.seed,
                        w.max_tokens, w.builder.max_num_reqs)

    def _sync_peers(self) -> None:
        for rank in self.ranks[1:]:
            rank.workload.at(self.workload.step, self.workload.phase)

    # -- translating keys -----------------------------------------------------------
    def _loras_of(self, variant: str | None) -> int:
        if self.lora_k == 0 or variant == "nolora":
            return 0
        return self.lora_k

    def desc(self, kind: str, key: Any) -> BatchDescriptor:
        if kind == "decode":
            w = self.width
            mode = F if self.decode_backend == rules.FULL_BACKEND else P
            return BatchDescriptor(mode, key.size * w, key.size, w, None, self._loras_of(key.variant_label),
                                   2 if self.tbo else 1)
        if self.prefill_backend == rules.FULL_BACKEND:
            return BatchDescriptor(F, key.size, self.slots, None, None, self.lora_k)
        return BatchDescriptor(P, key.size, None, None, None, self.lora_k)

    @staticmethod
    def piecewise_key(kind: str | None, key: Any) -> tuple:
        return (kind, key.size, key.variant_label, key.attention_variant)

    def _predicted_descs(self, rank: _Rank) -> tuple[BatchDescriptor, ...]:
        """What the runners will capture, from the functions they size
        themselves with (in capture order: prefill runner, then decode runner)."""
        out: list[BatchDescriptor] = []
        if self.prefill_backend != rules.DISABLED:
            tokens = _prefill_tokens(list(self.config.capture_sizes))
            out += [self.desc("prefill", ShapeKey(size=n)) for n in sorted(tokens, reverse=True)]
        if self.decode_backend != rules.DISABLED:
            out += self._decode_descs(rank.mr, None)
        return tuple(out)

    def _decode_descs(self, mr: Any, runner: Any) -> list[BatchDescriptor]:
        if runner is not None:
            sizes, record_nolora = list(runner.capture_bs), runner.record_nolora_graph
        else:
            sizes = _decode_bs(mr)
            record_nolora = _records_nolora(mr)
        variants = ("lora", "nolora") if record_nolora and mr.lora_manager is not None else (None,)
        return [self.desc("decode", ShapeKey(size=bs, variant_label=v)) for bs in sorted(sizes, reverse=True)
                for v in variants]

    # -- capture ---------------------------------------------------------------------
    def _tapped(self, rank: _Rank, kind: str, runner_cls: type) -> type:
        handle = self

        class Tapped(runner_cls):  # type: ignore[misc, valid-type]
            def capture(self) -> None:
                handle._tap_backend(rank, kind, self.backend)
                return super().capture()

        Tapped.__name__ = Tapped.__qualname__ = "Cgsim" + runner_cls.__name__
        return Tapped

    def _tap_backend(self, rank: _Rank, kind: str, be: Any) -> None:
        """Wrap the backend instance's capture_one / replay / cleanup (sglang's
        own methods still do the work)."""
        if getattr(be, "_cgsim_tapped", False):
            return
        capture_one, replay, cleanup, can_run = be.capture_one, be.replay, be.cleanup, be.can_run
        breakable = isinstance(be, BreakableCudaGraphBackend)
        handle = self

        def tapped_capture_one(shape_key: Any, forward_fn: Callable, *args: Any, **kwargs: Any) -> Any:
            desc = handle.desc(kind, shape_key)
            create = rank.workload.tap_create_forward_fn(lambda _key, warmup=False: forward_fn, to_desc=lambda _k: desc)
            rank.capture_key, rank.capture_kind, rank.capturing_breakable = shape_key, kind, breakable
            try:
                # sglang prepares each shape once, then warms up twice and
                # captures once with the same forward_fn.
                result = capture_one(shape_key, create(shape_key, warmup=True), *args, **kwargs)
            finally:
                rank.capture_key, rank.capture_kind, rank.capturing_breakable = None, None, False
            rank.keys[kind].append(shape_key)
            return result

        def tapped_replay(shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
            rank.replayed = (kind, shape_key)
            if breakable:
                rank.workload.note_piecewise_lookup(handle.piecewise_key(kind, shape_key),
                                                    bool(can_run(static_forward_batch, shape_key)))
            return replay(shape_key, static_forward_batch, **kwargs)

        def tapped_cleanup() -> None:
            rank.keys[kind].clear()
            return cleanup()

        be.capture_one, be.replay, be.cleanup = tapped_capture_one, tapped_replay, tapped_cleanup
        be._cgsim_tapped = True

    @guarded
    def capture(self) -> None:
        if self._captured:
            return  # sglang captures once per runner; a second capture finds them built
        with self._sglang():
            self._sync_peers()
            for rank in self.ranks:
                with rank.context():
                    if self._captures == 0 or self.dp > 1:
                        # A fresh process (each fake rank is one); an elastic
                        # recapture keeps the process's shared input buffers.
                        _world.reset_process_state()
                    if self.prefill_backend != rules.DISABLED:
                        rank.prefill = self._tapped(rank, "prefill", PrefillCudaGraphRunner)(rank.mr)
                    if self.decode_backend != rules.DISABLED:
                        rank.decode = self._tapped(rank, "decode", DecodeCudaGraphRunner)(rank.mr)
            # The draft worker captures after the target worker, in its process.
            for draft in self.drafts:
                with self.ranks[0].context():
                    draft.build()
        self._captured = True
        self._captures += 1

    # -- forward batches -------------------------------------------------------------
    def _forward_batch(self, rank: _Rank, lens: Sequence[int], contexts: Sequence[int], input_ids: torch.Tensor,
                       positions: torch.Tensor, slots: Sequence[int] | None, loras: int, ubatches: int,
                       prefill: bool, dp: dict | None) -> Any:
        """The ForwardBatch ForwardBatch.init_new would hand the runner for these
        requests (rows 0..n-1 of the request pool; ``slots`` None: a batch that is
        only asked about, not run, built on the host: the runners decide from host
        fields alone, and a sweep of thousands of device-side probes made a 4-worker
        CUDA campaign on one H200 time scenarios out)."""
        n = len(lens)
        mr = rank.mr
        seq = [c + q for c, q in zip(contexts, lens)]
        total = int(sum(lens))
        rows, out_cache_loc = torch.arange(n, dtype=torch.int64), torch.zeros(total, dtype=torch.int64)
        if slots is not None:
            # ForwardBatch.init_new's request rows and allocated slots, the prefix's KV in the pool.
            rows, out_cache_loc = mr.toy_kv.load(mr.req_to_token_pool.req_to_token, contexts, lens, slots)
        dev = self.device if slots is not None else torch.device("cpu")
        # The workload lays a batch out on the host; ForwardBatch.init_new hands the runner device tensors.
        input_ids, positions = input_ids.to(dev), positions.to(dev)
        seq_cpu = torch.tensor(seq, dtype=torch.int64)
        seq_t = seq_cpu.to(dev)
        lora_ids = ([f"a{(r % loras) + 1}" if loras else None for r in range(n)] if mr.lora_manager is not None
                    else None)
        spec = self.width > 1
        common: dict[str, Any] = dict(
            batch_size=n, input_ids=input_ids, req_pool_indices=rows.to(dev),
            seq_lens=seq_t, out_cache_loc=out_cache_loc.to(dev), seq_lens_sum=int(sum(seq)),
            seq_lens_cpu=seq_cpu, positions=positions, spec_algorithm=mr.spec_algorithm,
            capture_hidden_mode=CaptureHiddenMode.FULL if spec else CaptureHiddenMode.NULL, lora_ids=lora_ids,
        )
        if dp is not None:
            common.update(dp)
        if prefill:
            starts = [0]
            for q in lens[:-1]:
                starts.append(starts[-1] + q)
            fb = ForwardBatch(
                forward_mode=ForwardMode.EXTEND, orig_seq_lens=seq_t.clone(), extend_num_tokens=total,
                extend_seq_lens=torch.tensor(list(lens), dtype=torch.int64, device=dev),
                extend_prefix_lens=torch.tensor(list(contexts), dtype=torch.int64, device=dev),
                extend_start_loc=torch.tensor(starts, dtype=torch.int64, device=dev), extend_seq_lens_cpu=list(lens),
                extend_prefix_lens_cpu=list(contexts), extend_logprob_start_lens_cpu=list(lens),
                global_forward_mode=ForwardMode.EXTEND, global_num_token_non_padded_cpu=total, return_logprob=False,
                **common)
        else:
            mode = ForwardMode.TARGET_VERIFY if spec else ForwardMode.DECODE
            fb = ForwardBatch(forward_mode=mode, spec_info=self._verify_info(dev) if spec else None, **common)
            if self.tbo:
                # The scheduler's split; None = this step runs without two-batch overlap.
                fb.tbo_split_seq_index = (compute_split_seq_index(mode, total, None, self.width) if ubatches == 2
                                          else None)
        compat.tree().bind_kv_plan(mr, fb)
        return fb

    def _verify_info(self, dev: torch.device) -> Any:
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        return EagleVerifyInput(
            draft_token=None, custom_mask=torch.ones(1, dtype=torch.bool, device=dev), positions=None, retrieve_index=None,
            retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
            spec_steps=rules.eagle_steps(self.config), topk=rules.eagle_topk(self.config), draft_token_num=self.width,
            capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None, seq_lens_cpu=None)

    def _dp_fields(self, sizes: Sequence[int], prefill: bool) -> dict | None:
        """What the scheduler's MLP-sync exchange stamps on every rank's batch:
        the min-reduced graph vote and the gathered per-rank counts."""
        if self.dp == 1:
            return None
        mode = ForwardMode.EXTEND if prefill else ForwardMode.DECODE
        vote = min(_local_decode_cuda_graph_vote(local_batch=SimpleNamespace(forward_mode=mode), disable_cuda_graph=False)
                   for _ in sizes)
        counts = list(sizes)
        return dict(can_run_decode_cuda_graph=bool(vote), global_num_tokens_cpu=[max(counts)] * len(counts),
                    original_global_num_tokens_cpu=counts, global_num_tokens_for_logprob_cpu=counts)

    def _zeros_for(self, n: int) -> torch.Tensor:
        if self._zeros.shape[0] < n:
            self._zeros = torch.zeros(2 * n, dtype=torch.int64)
        return self._zeros[:n]

    def _is_extend(self, batch: Batch) -> bool:
        """sglang runs anything but a decode of the graphs' width as an extend."""
        return batch.has_prefill or batch.uniform_token_count != self.width

    def _probe_batch(self, rank: _Rank, shape: Batch, num_reqs: int, dp: dict | None, extend: bool) -> Any:
        """A batch of ``shape``'s kind and counts (rank's share) for asking only."""
        lens = _rank_lens(shape.query_lens, num_reqs, self.width)
        total = int(sum(lens))
        ids = self._zeros_for(total)
        return self._forward_batch(rank, lens, [0] * len(lens), ids, ids, None,
                                   min(shape.num_active_loras, len(lens)), shape.num_ubatches, extend, dp)

    # -- dispatch ----------------------------------------------------------------------
    def _eager(self, b: Any) -> BatchDescriptor:
        return BatchDescriptor(N, b.num_tokens, b.num_reqs, num_active_loras=b.num_active_loras,
                               num_ubatches=b.num_ubatches)

    def _decide(self, rank: _Rank, fb: Any, prefill: bool) -> BatchDescriptor | None:
        """can_run_graph, then the key load_batch will pad to (None: eager)."""
        if prefill:
            runner = rank.prefill
            if runner is None or not runner.can_run_graph(fb):
                return None
            size = runner._pad_to_bucket(int(fb.input_ids.shape[0]), runner.capture_num_tokens)
            return self.desc("prefill", ShapeKey(size=size))
        runner = rank.decode
        if runner is None or not runner.can_run_graph(fb):
            return None
        bs = runner._max_dp_batch_size(fb) if runner.require_mlp_tp_gather else int(fb.batch_size)
        size = runner._pad_to_bucket(bs, runner.capture_bs)
        return self.desc("decode", ShapeKey(size=size, variant_label=runner._resolve_lora_variant(fb)))

    def _dispatch_many(self, items: Sequence[Batch | BatchShape]) -> list[BatchDescriptor]:
        """Every rank decides for every batch (rank by rank: entering a rank's
        parallel context costs more than a decision)."""
        if not self._captured:
            return [self._eager(b) for b in items]
        batches = [b if isinstance(b, Batch) else b.example() for b in items]
        extend = [self._is_extend(b) for b in batches]
        sizes = [rules.dp_rank_sizes(b.num_reqs, self.dp, self.config.max_num_reqs) for b in batches]
        dp = [self._dp_fields(n, e) for n, e in zip(sizes, extend)]
        decided: list[list[BatchDescriptor | None]] = []
        for rank in self.ranks:
            with rank.context():
                decided.append([
                    self._decide(rank, self._probe_batch(rank, b, n[rank.index], f, e), e)
                    for b, n, f, e in zip(batches, sizes, dp, extend)])
        out = []
        for i, b in enumerate(batches):
            if self.dp > 1:
                self.workload.note_rank_dispatch(b.shape, tuple((sizes[i][r], decided[r][i]) for r in range(self.dp)))
            out.append(decided[0][i] or self._eager(items[i]))
        return out

    @guarded
    def dispatch(self, batch: Batch) -> BatchDescriptor:
        with self._sglang():
            return self._dispatch_many([batch])[0]

    @guarded
    def dispatch_all(self, shapes: Sequence[BatchShape]) -> list[BatchDescriptor]:
        with self._sglang():  # one process context for the whole sweep
            return self._dispatch_many(shapes)

    # -- execute -----------------------------------------------------------------------
    @guarded
    def execute(self, batch: Batch, desc: BatchDescriptor) -> Execution:
        """What ModelRunner.forward does after its can_run_graph check: the
        runner's execute (load_batch, replay, slice), or the eager forward."""
        with self._sglang(), torch.inference_mode():
            self._sync_peers()
            extend = self._is_extend(batch)
            sizes = rules.dp_rank_sizes(batch.num_reqs, self.dp, self.config.max_num_reqs)
            dp = self._dp_fields(sizes, extend)
            result: Execution | None = None
            for rank, n in zip(self.ranks, sizes):
                rank_batch = batch if n == batch.num_reqs else Batch(_rank_lens(batch.query_lens, n, self.width),
                                                                    min(batch.num_active_loras, n),
                                                                    batch.num_ubatches, batch.has_prefill)
                with rank.context():
                    layout = rank.workload.load_batch(rank_batch, rank_batch.num_tokens)
                    # The toy model must see only what sglang loads into its own
                    # static buffers (the graph copies them in at every replay).
                    for t in rank.workload.buffers.view(rank.workload.max_tokens):
                        t.zero_()
                    fb = self._forward_batch(rank, layout.query_lens, layout.context_lens, layout.input_ids,
                                             layout.positions, layout.slots, rank_batch.num_active_loras,
                                             rank_batch.num_ubatches, extend, dp)
                    if rank.mr.lora_manager is not None:
                        rank.mr.lora_manager.prepare_lora_batch(fb)  # ForwardBatch.init_new does this
                    graph = desc.cg_mode != N if rank.index == 0 else self._decide(rank, fb, extend) is not None
                    with rank.workload.serving(desc if rank.index == 0 else None):
                        rows = desc.num_tokens if extend and desc.cg_mode == F else None
                        out = self._replay(rank, fb, rank_batch, extend, rows) if graph else self._run_eager(rank, fb)
                if rank.index == 0:
                    result = out
            assert result is not None
            return result

    def _replay(self, rank: _Rank, fb: Any, batch: Batch, extend: bool, full_prefill_rows: int | None) -> Execution:
        runner = rank.prefill if extend else rank.decode
        rank.replayed = None
        backend = rank.mr.attn_backend
        backend.graph_rows = full_prefill_rows
        try:
            out = runner.execute(fb)
        finally:
            backend.graph_rows = None
        if rank.replayed is None:
            raise RuntimeError(f"{type(runner).__name__}.execute returned without replaying a graph")
        kind, key = rank.replayed
        graph = self.desc(kind, key)
        hs = out.hidden_states
        md = rank.mr.attn_backend.forward_metadata
        rank.workload.note_graph_output(
            graph, rows=int(hs.shape[0]), real_rows=batch.num_tokens, padded_rows=graph.num_tokens, output="hidden_states",
            captured_hidden=runner.capture_hidden_mode.name, runtime_hidden=fb.capture_hidden_mode.name)
        logits = out.next_token_logits
        if not extend and logits is not None:
            # A decode's logits have a row per token, sliced by sglang like the hidden states.
            rank.workload.note_graph_output(graph, rows=int(logits.shape[0]), real_rows=batch.num_tokens,
                                            padded_rows=graph.num_tokens, output="next_token_logits")
        if graph.cg_mode == F:
            return Execution(hs.clone(), "full", md.id if md is not None else None, graph)
        return Execution(hs.clone(), "piecewise", md.id if md is not None else None, self.piecewise_key(kind, key))

    def _run_eager(self, rank: _Rank, fb: Any) -> Execution:
        """ModelRunner's eager forward: metadata for the live batch, then the model."""
        be = rank.mr.attn_backend
        kwargs = {"forward_batch": fb} if compat.tree().forward_context_takes_batch else {}
        with forward_context(SglForwardContext(attn_backend=be), **kwargs):
            be.init_forward_metadata(fb)
            out = rank.mr.model.forward(fb.input_ids, fb.positions, fb)
        return Execution(out.hidden_states.clone(), "eager", be.forward_metadata.id)

    # -- release ------------------------------------------------------------------------
    @guarded
    def release(self) -> None:
        """sglang's elastic release (decode runner's backend cleanup, the global
        graph pool dropped), and the prefill backend's cleanup."""
        with self._sglang():
            for rank in self.ranks:
                with rank.context():
                    _drop_elastic_state(rank.decode)
                    if rank.prefill is not None:
                        rank.prefill.backend.cleanup()
                rank.decode = rank.prefill = None
            for draft in self.drafts:
                with self.ranks[0].context():
                    draft.drop()
        self._captured = False

    # -- what the manager holds --------------------------------------------------------
    def captured_flag(self) -> bool:
        return self._captured

    def sub_managers(self) -> dict[str, Any]:
        """EAGLE's draft runners, for the runner to record (base.SubManager)."""
        from cgsim.targets.base import SubManager  # noqa: PLC0415

        return {d.name: SubManager(d, d.workload, d.config, d.batch_for) for d in self.drafts}

    @guarded
    def stored_graphs(self) -> tuple[BatchDescriptor, ...]:
        rank = self.ranks[0]
        out = []
        for kind, runner in (("prefill", rank.prefill), ("decode", rank.decode)):
            if runner is None:
                continue
            for key in rank.keys[kind]:
                d = self.desc(kind, key)
                if d.cg_mode == F and runner.backend.can_run(None, key):
                    out.append(d)
        return tuple(out)

    def candidates(self) -> CandidateSnapshot:
        return CandidateSnapshot(self._initial, ())

    @guarded
    def recomputed_candidates(self) -> CandidateSnapshot:
        """The finished runners' own lists (capture_num_tokens, capture_bs)."""
        rank = self.ranks[0]
        out: list[BatchDescriptor] = []
        if rank.prefill is not None:
            out += [self.desc("prefill", ShapeKey(size=n)) for n in sorted(rank.prefill.capture_num_tokens, reverse=True)]
        if rank.decode is not None:
            out += self._decode_descs(rank.mr, rank.decode)
        return CandidateSnapshot(tuple(out), ())


def warm_up(version: str) -> None:
    """Pay sglang's lazy imports and first-capture costs (a few seconds) once
    per process, outside any scenario's deadline: a capture, a replay of
    each runner and a release on a throwaway workload."""
    from cgsim.backends import get_backend  # noqa: PLC0415

    backend = get_backend("mock")
    config = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(2,), max_num_reqs=2)
    with backend.activate(), torch.inference_mode():
        workload = Workload(config, backend, Trace("sglang-warm-up", backend.name))
        try:
            handle = SglangHandle(config, backend, workload, version)
            workload.at(0, "capture")
            handle.capture()
            workload.at(0, "runtime")
            for batch in (Batch((1, 1)), Batch((2,), has_prefill=True)):
                handle.execute(batch, handle.dispatch(batch))
            if compat.tree().release:
                handle.release()
        except compat.SglangEnvironmentError:
            raise
        except Exception:  # noqa: BLE001 - sglang's own failure: a defect its scenarios find (NO-CRASH)
            return
