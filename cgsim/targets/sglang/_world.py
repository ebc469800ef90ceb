"""What an SGLang model-runner process supplies to its CUDA-graph runners, on
CPU and over cgsim's workload: a ModelRunner with the attributes the runners
read, an attention backend whose metadata comes from the workload's tracked
builder, a model whose body is the workload's toy model, a LoRA manager and
the process patches that let sglang's capture code reach the mock.

Nothing in sglang is changed.  The runners (``DecodeCudaGraphRunner``,
``PrefillCudaGraphRunner``), their backends, buffers, capture loops, padding,
``can_run_graph`` and replay are sglang's own code; this module is the world
around them, as sglang's own test kit builds it for its runner tests.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import sys
import types
from types import SimpleNamespace
from typing import Any, Callable, Iterator
from unittest import mock

import torch
from torch import nn

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput
from sglang.srt.model_executor.input_buffers import _forward_input_buffer_pool
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.runner import set_global_graph_memory_pool
from sglang.srt.model_executor.runner_utils.capture_mode import get_is_capture_mode
from sglang.srt.runtime_context import get_context, get_parallel, get_resources
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from cgsim.modes import CUDAGraphMode
from cgsim.targets.sglang import compat
from cgsim.targets.sglang._kv import KvPool
from cgsim.workload.context import set_forward_context
from cgsim.workload.model import HIDDEN

__all__ = ["ToyAttention", "ToyCausalLM", "AdapterSlots", "FakeModelRunner", "ViewLayout", "sglang_process",
           "rank_parallel", "reset_process_state", "install_server_args", "parallel_override", "body_context",
           "CONTEXT_LEN"]

# Longest sequence a request may reach (the request pool's row width).
CONTEXT_LEN = 1024
_KV_POOL = 4096


class ToyAttention(AttentionBackend):
    """An attention backend whose metadata is the workload's.

    Graph contract as sglang's GPU backends: ``init_forward_metadata_out_graph``
    runs outside the graph (before each capture and each replay) and writes
    the padded view it is given into persistent buffers, the workload
    builder's, which a captured graph reads in place; the eager
    ``init_forward_metadata`` builds the same from the live batch (it is also
    what breakable prefill graphs use at their attention breaks).  Each
    request's token slots are read from the request pool at its positions,
    as real backends build KV indices from req_to_token."""

    def __init__(self, model_runner: "FakeModelRunner", workload: Any):
        self.model_runner = model_runner
        self.workload = workload
        self.forward_metadata: Any = None
        # Rows of the FULL prefill graph a replay is about to run: its kernels'
        # grid was fixed at capture (the real backends plan the live requests
        # into capture-stable wrappers), whether or not the tree's padded view
        # carries the graph's static input_ids (0.5.21+) or the live ones (0.5.20).
        self.graph_rows: int | None = None

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        # The workload's builder already holds buffers for the largest graph.
        return None

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        self.forward_metadata = self._build(forward_batch, for_capture=in_capture)

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        return None  # everything the toy kernels read is prepared out of graph

    def init_forward_metadata(self, forward_batch: Any) -> None:
        self.forward_metadata = self._build(forward_batch, for_capture=get_is_capture_mode())

    def _build(self, fb: Any, for_capture: bool) -> Any:
        bs = int(fb.batch_size)
        num_tokens = int(fb.input_ids.shape[0])
        if self.graph_rows is not None and not for_capture:
            num_tokens = max(num_tokens, self.graph_rows)
        seq_lens = [int(s) for s in fb.seq_lens[:bs].tolist()]
        mode = fb.forward_mode
        if mode.is_extend() and not mode.is_target_verify():
            query_lens = [int(q) for q in fb.extend_seq_lens[:bs].tolist()]
        else:
            width = max(1, num_tokens // max(bs, 1))
            query_lens = [width] * bs
        rows = [int(r) for r in fb.req_pool_indices[:bs].tolist()]
        table = self.model_runner.req_to_token_pool.req_to_token
        toy_row = self.model_runner.toy_kv.toy_row  # the shared toy's constant KV table row of a pool slot
        slots: list[int] = []
        for row, s, q in zip(rows, seq_lens, query_lens):
            for pos in range(s - q, s):
                slots.append(toy_row(int(table[row, max(pos, 0)])) if 0 <= row < table.shape[0] else 0)
        if sum(query_lens) > num_tokens:
            # What sglang handed the backend contradicts itself: a GPU backend
            # would plan more query tokens than the graph's input rows hold.
            from cgsim.targets.sglang.blame import EngineCallError  # noqa: PLC0415

            raise EngineCallError(f"sglang prepared attention metadata for a {mode.name} view of {bs} requests and "
                                  f"{sum(query_lens)} query tokens over {num_tokens} input rows")
        layout = ViewLayout(query_lens, seq_lens, slots)
        return self.workload.prepare_attn(layout, bs, num_tokens, max(query_lens + [1]), for_capture=for_capture)


class ViewLayout:
    """The requests of a view sglang prepared metadata for, as
    ``Workload.prepare_attn`` reads a request layout (made once per view)."""

    __slots__ = ("query_lens", "seq_lens", "slots")

    def __init__(self, query_lens: list[int], seq_lens: list[int], slots: list[int]):
        self.query_lens, self.seq_lens, self.slots = query_lens, seq_lens, slots

    def derived(self, key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        return make()


class AdapterSlots:
    """The LoRA manager surface the graph runners call.  ``prepare_lora_batch``
    (host side, before a capture or a replay) writes each token's adapter id
    into a static buffer of the largest token count, which the LoRA kernels
    captured in a graph read in place (as sglang's decode and prefill LoRA
    batch info does); adapter "aJ" is the workload's LoRA id J.
    ``skip_inactive``: the LoRA backend skips inactive dense LoRA, which makes
    the decode runner record a base-only graph beside each LoRA graph."""

    def __init__(self, max_tokens: int, device: str, skip_inactive: bool):
        self.token_slots = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.lora_backend = SimpleNamespace(skip_inactive_dense_lora=skip_inactive, skip_inactive_lora_batches=False)
        self.attn_dp_enabled = False
        self.enable_dp_attention = False  # 0.5.21's name for attn_dp_enabled
        self.supports_prefill_cuda_graph = True

    def init_decode_cuda_graph_batch_info(self, max_bs_in_cuda_graph: int, num_tokens_per_req: int = 1) -> None:
        return None

    def init_cuda_graph_batch_info(self, max_bs_in_cuda_graph: int, num_tokens_per_req: int = 1) -> None:
        return None  # 0.5.20-0.5.22's name of the decode hook above

    def init_prefill_cuda_graph_batch_info(self, **kwargs: Any) -> None:
        return None

    def init_cuda_graph_moe_buffers(self, *args: Any, **kwargs: Any) -> None:
        return None

    def can_use_prefill_cuda_graph(self, forward_batch: Any) -> bool:
        return True

    def reset_routing_cache(self) -> None:
        return None

    def prepare_lora_batch(self, forward_batch: Any) -> None:
        ids = [0 if u is None else int(str(u)[1:]) for u in (forward_batch.lora_ids or [])]
        mode = forward_batch.forward_mode
        if mode.is_extend() and not mode.is_target_verify():
            lens = [int(n) for n in forward_batch.extend_seq_lens[: len(ids)].tolist()]
        else:
            width = int(forward_batch.input_ids.shape[0]) // max(len(ids), 1)
            lens = [width] * len(ids)
        per_token = [a for a, n in zip(ids, lens) for _ in range(n)]
        self.token_slots.zero_()  # padding tokens: no adapter
        if per_token:
            self.token_slots[: len(per_token)].copy_(torch.tensor(per_token, dtype=torch.int64))  # host to device


class _Body(nn.Module):
    """The transformer body (what prefill graphs capture): the workload's toy
    model, fed from the inputs sglang hands it."""

    def __init__(self, rank: Any):
        super().__init__()
        self.layers = nn.ModuleList()  # sglang finds the layer model by its .layers
        self._rank = rank

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, *args: Any,
                **kwargs: Any) -> torch.Tensor:
        return self._rank.run_body(input_ids, positions, forward_batch)


class ToyCausalLM(nn.Module):
    """``model.forward(input_ids, positions, forward_batch)`` -> LogitsProcessorOutput:
    every token's hidden state, and as logits the rows sglang's logits
    processor keeps (every token for decode and verify, each request's last
    token for an extend)."""

    def __init__(self, rank: Any):
        super().__init__()
        self.model = _Body(rank)
        shared_experts = compat.shared_experts_config()
        if shared_experts is not None:  # 0.5.23 reads the model's shared-experts config
            self.shared_experts_config = shared_experts()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any,
                **kwargs: Any) -> LogitsProcessorOutput:
        # Through the attribute: prefill replay swaps model.forward for its graph.
        hs = self.model.forward(input_ids, positions, forward_batch)
        mode = forward_batch.forward_mode
        if mode.is_extend() and not mode.is_target_verify():
            bs = int(forward_batch.batch_size)
            last = forward_batch.extend_start_loc[:bs] + forward_batch.extend_seq_lens[:bs] - 1
            logits = hs[last.long()]
        else:
            logits = hs
        return LogitsProcessorOutput(next_token_logits=logits, hidden_states=hs)

    def get_input_embeddings(self) -> Callable:
        return lambda ids: torch.zeros(ids.shape[0], HIDDEN, device=ids.device)


class _ModelConfig:
    """The model_config fields the runners read."""

    def __init__(self) -> None:
        self.hidden_size = HIDDEN
        self.vocab_size = HIDDEN
        self.dtype = torch.float32
        self.context_len = CONTEXT_LEN
        self.is_encoder_decoder = False
        self.is_multimodal = False
        self.is_generation = True
        self.num_attention_heads = 1
        self.num_key_value_heads = 1
        self.head_dim = HIDDEN
        self.num_hidden_layers = 1
        self.spec_hidden_size = HIDDEN
        self.model_is_mrope = False
        self.hf_config = SimpleNamespace(architectures=["CgsimToyForCausalLM"], hidden_size=HIDDEN,
                                         vocab_size=HIDDEN, num_hidden_layers=1, model_type="cgsim-toy")
        self.hf_config.get_text_config = lambda: self.hf_config
        self.hf_text_config = self.hf_config


class FakeModelRunner(ModelRunner):
    """The ModelRunner attributes the graph runners read, set directly (its
    own __init__ loads a model and allocates GPU pools).  sglang's methods
    that derive capture widths, gather needs and dummy batches are inherited
    unchanged.  ``server_args`` is the installed override's.  ``device``: the
    backend's ("cpu" under the mock, whose graphs hold CPU tensors; "cuda" on a GPU)."""

    def __init__(self, *, rank: Any, pool_size: int, server_args: Any, speculative: bool,
                 lora: AdapterSlots | None, attention: Callable[["FakeModelRunner"], ToyAttention],
                 device: str = "cpu"):
        self.device = device
        self.gpu_id = torch.device(device).index or 0
        self.dtype = torch.float32
        # The rank's placement, as ModelRunner.__init__ copies it (0.5.21 as
        # flat attributes, 0.5.20 as its ParallelState ``ps``).
        placement = rank_placement(rank.parallel)
        self.__dict__.update(placement)
        self.ps = SimpleNamespace(**placement)
        self.model_config = _ModelConfig()
        self.is_generation = True
        self.is_draft_worker = False
        self.spec_algorithm = SpeculativeAlgorithm.EAGLE if speculative else SpeculativeAlgorithm.NONE
        self.page_size = 1
        self.max_running_requests = pool_size
        self.canary_manager = None
        self.hisparse_coordinator = None
        self.lora_manager = lora
        self.device_timer = None
        self.forward_stream = None
        self.capture_head_hooks: list = []
        self.capture_tail_hooks: list = []
        self.shared_read_done_event = None
        self._kernel_warmed_up = True  # BaseRunner.warmup: no kernels to autotune here
        self.layer_info = SimpleNamespace(start_layer=0, end_layer=1)
        self.pp_group = SimpleNamespace(world_size=1, rank_in_group=0, is_first_rank=True, is_last_rank=True)
        self.ngram_embedding_manager = SimpleNamespace(enabled=False, table=None)
        self.decode_attn_backend_group: list = []
        self.attention_layers: list = []
        self.mha_companion_layers: list = []
        self.moe_layers: list = []
        self.moe_fusions: list = []
        self.server_args = server_args
        self.req_to_token_pool = ReqToTokenPool(size=pool_size, max_context_len=CONTEXT_LEN, device=self.device,
                                                enable_memory_saver=False)
        self.token_to_kv_pool = SimpleNamespace(size=_KV_POOL, layer_transfer_counter=None)
        self.toy_kv = KvPool(self.req_to_token_pool.req_to_token, self.device)
        self.token_to_kv_pool_allocator = SimpleNamespace(page_size=1, get_kvcache=lambda: self.token_to_kv_pool)
        self.init_kv_index_translator()
        self.attn_backend = attention(self)
        self.model = ToyCausalLM(rank)
        self.graph_shared_output = GraphSharedOutput(device=self.device, max_rows=4 * _KV_POOL)
        _init_dp_attention(server_args, self.model_config, torch.device(device))

    # Computed from a loaded model in the real class.
    hybrid_gdn_config = mambaish_config = mamba2_config = None
    linear_attn_model_spec = kimi_linear_config = hybrid_lightning_config = None


def _init_dp_attention(server_args: Any, model_config: Any, device: torch.device) -> None:
    """What ModelRunner.__init__ derives for DP attention: the runtime flag and
    the gathered buffer's metadata (0.5.21+: two helpers; 0.5.20 does both in
    initialize_dp_attention, which also places the rank through
    torch.distributed, so its two steps are taken here on their own)."""
    dp_attention = importlib.import_module("sglang.srt.layers.dp_attention")
    if compat.tree().dp_flag_helpers:
        dp_attention.initialize_dp_attention_flags(server_args)
        dp_attention.init_dp_gathered_buffer(model_config)
        return
    flags = dp_attention.get_flags().dp
    flags.max_len_with_idle = getattr(model_config.hf_config, "hybrid_override_pattern", None) is not None
    flags.enabled = get_parallel().enable_dp_attention
    dp_attention._DpGatheredBufferWrapper.set_metadata(hidden_size=model_config.hidden_size,
                                                       dtype=model_config.dtype, device=device)


# -- the process around the runners -----------------------------------------------


class _TpGroup:
    """A rank's TP group: backends call barrier() before each warmup; the fake
    ranks run one after another, so there is nothing to wait for."""

    ca_comm = None

    def __init__(self, rank: int, world_size: int):
        self.rank_in_group, self.world_size = rank, world_size

    def barrier(self) -> None:
        return None


@contextlib.contextmanager
def _single_rank_graph_capture(stream: Any = None) -> Iterator[SimpleNamespace]:
    # parallel_state.graph_capture enters the TP/PP group coordinators, which
    # exist only after torch.distributed is initialised (sglang's test kit
    # uses the same one-rank stand-in).  What the coordinator does on one rank
    # stays: the stream is sglang's where it names one, ordered after the
    # current stream and made current, so warm-ups run where captures do.
    stream = stream if stream is not None else torch.cuda.Stream()
    current = torch.cuda.current_stream()
    if current != stream:
        stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield SimpleNamespace(stream=stream)


def _device_module(original: Callable) -> Callable:
    def get_device_module(device: Any = None) -> Any:
        # The runners use torch.get_device_module(device) for graphs, streams
        # and synchronize; for "cpu" that is torch.cpu, which has no graph API,
        # so route it to torch.cuda (cgsim's mock while a scenario runs).
        name = device.type if isinstance(device, torch.device) else device
        if name is None or str(name).startswith("cpu"):
            return torch.cuda
        return original(device)

    return get_device_module


@contextlib.contextmanager
def _frozen_gc(enable_cudagraph_gc: bool) -> Iterator[None]:
    """sglang's freeze_gc without its two full collections: objects alive at
    the start of a capture are frozen (a collection during capture cannot
    destroy an earlier graph, which would invalidate the capture), as sglang
    does; the collections only reclaim memory and take about a second each in
    a process holding sglang."""
    if enable_cudagraph_gc:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _QuietProgress:
    """tqdm.tqdm for the capture loops: iterates, shows nothing."""

    def __init__(self, iterable: Any = (), *args: Any, **kwargs: Any):
        self._iterable = iterable

    def __iter__(self) -> Iterator:
        return iter(self._iterable)

    def set_description(self, *args: Any, **kwargs: Any) -> None:
        return None


_QUIET_TQDM = SimpleNamespace(tqdm=_QuietProgress)
# The release path's collection; nothing a graph depends on (see _frozen_gc).
_NO_COLLECT_GC = SimpleNamespace(collect=lambda *a, **k: 0)


@contextlib.contextmanager
def _sglang_logs_quiet() -> Iterator[None]:
    # sglang logs capture failures before re-raising them; cgsim records the
    # exception itself, and a campaign's console is no place for the log.
    logger = logging.getLogger("sglang")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _patch(st: contextlib.ExitStack, owner: Any, name: str, value: Any, required: bool = True) -> None:
    """One process patch; a tree without the patched name is the adapter not
    fitting it (exit 2) unless the patch only matters where the name exists."""
    if not hasattr(owner, name):
        if not required:
            return
        from cgsim.targets.sglang.compat import SglangAdapterError  # noqa: PLC0415

        where = getattr(owner, "__name__", type(owner).__name__)
        raise SglangAdapterError(f"the sglang process patch of {where}.{name} does not fit this tree (it has no "
                                 f"{name}); cgsim's sglang adapter needs updating for it")
    st.enter_context(mock.patch.object(owner, name, value))


_WEAK_REF = "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor"


def _strong_weak_refs(st: contextlib.ExitStack) -> None:
    """Breakable captures weak-ref each segment's CUDA inputs through
    sgl_kernel's compiled op, whose module refuses to import on a host sglang
    saw as CPU (seen on an H200: NotImplementedError at the first segment).
    A plain reference stands in: only the pool's reuse between segments
    differs, not the values a replay reads (the mock's CPU tensors never
    reach it, so both backends now run the same path)."""
    if _WEAK_REF in sys.modules:
        return
    standin = types.ModuleType(_WEAK_REF)
    standin.weak_ref_tensor = lambda tensor: tensor
    standin.weak_ref_tensors = lambda tensors: tensors
    sys.modules[_WEAK_REF] = standin
    st.callback(lambda: sys.modules.get(_WEAK_REF) is standin and sys.modules.pop(_WEAK_REF))


@contextlib.contextmanager
def sglang_process() -> Iterator[None]:
    """The process patches sglang's capture path needs on CPU (each says which
    sglang call fails without it, or what it spares).  cgsim's mock must
    already be in torch.cuda."""
    with contextlib.ExitStack() as st:
        st.enter_context(_sglang_logs_quiet())
        _patch(st, torch, "get_device_module", _device_module(torch.get_device_module))
        _strong_weak_refs(st)
        for name in ("sglang.srt.model_executor.runner.decode_cuda_graph_runner",
                     "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"):
            module = sys.modules[name]
            _patch(st, module, "graph_capture", _single_rank_graph_capture)
            # Only the capture progress text reads it; on "cpu" it asks psutil.
            _patch(st, module, "get_available_gpu_memory", lambda *a, **k: 0.0, required=False)
            _patch(st, module, "freeze_gc", _frozen_gc)
            _patch(st, module, "tqdm", _QUIET_TQDM, required=False)
        setup = sys.modules["sglang.srt.model_executor.model_runner_components.cuda_graph_setup"]
        # The release path's collection (trees without one import no gc there).
        _patch(st, setup, "gc", _NO_COLLECT_GC, required=False)
        bcg = sys.modules["sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"]
        # BreakableCUDAGraphCapture enters get_device_module().stream(capture
        # stream); resolved per platform it is torch.cpu and the capture would
        # start on the default stream, which the mock (like CUDA) rejects.
        _patch(st, bcg, "get_device_module", lambda: torch.cuda)
        import torch._dynamo.config as dynamo_config

        # sglang helpers decorated with @torch.compile would trace with dynamo,
        # which queries CUDA device properties because the mock reports CUDA.
        _patch(st, dynamo_config, "disable", True)
        yield


def rank_parallel(rank: int, dp_size: int) -> dict:
    """get_parallel() values of one rank: a single rank, or DP attention over
    dp_size ranks with attention TP 1 (sglang validates tp == attn_tp x attn_dp)."""
    if dp_size == 1:
        return dict(attn_cp_size=1, tp_rank=0, attn_tp_rank=0, tp_group=_TpGroup(0, 1))
    return dict(enable_dp_attention=True, attn_dp_enabled=True, dp_size=dp_size, num_dp_ranks=dp_size,
                attn_dp_size=dp_size, tp_size=dp_size, attn_tp_size=1, attn_tp_rank=0, attn_dp_rank=rank,
                dp_rank=rank, tp_rank=rank, attn_cp_size=1, moe_ep_size=1, moe_dp_size=1, moe_tp_size=dp_size,
                tp_group=_TpGroup(rank, dp_size))


def rank_placement(parallel: dict) -> dict:
    """A rank's placement fields (ModelRunner's copies of get_parallel())."""
    dp = parallel.get("dp_size", 1)
    return dict(tp_rank=parallel.get("tp_rank", 0), tp_size=parallel.get("tp_size", 1), dp_size=dp,
                dp_rank=parallel.get("dp_rank", 0), attn_dp_size=parallel.get("attn_dp_size", 1),
                attn_dp_rank=parallel.get("attn_dp_rank", 0), attn_tp_size=parallel.get("attn_tp_size", 1),
                attn_tp_rank=parallel.get("attn_tp_rank", 0), pp_rank=0, pp_size=1, attn_cp_rank=0,
                attn_cp_size=1, attn_dcp_rank=0, attn_dcp_size=1, moe_ep_size=1, tp_group=parallel["tp_group"])


def reset_process_state() -> None:
    """A fresh process's graph pool, named streams and shared input buffers
    (sglang's test kit resets the pool and buffers between runners that stand
    for separate processes).  The capture stream is cached by name: one made
    by an earlier scenario on another backend (the mock's, in a parent a CUDA
    check forks from) would reach real CUDA graph capture."""
    set_global_graph_memory_pool(None)
    get_resources().streams.clear()
    _forward_input_buffer_pool.clear()


def install_server_args(fields: dict) -> tuple[Any, Any]:
    """Publish a server config carrying ``fields`` (sglang's scoped test
    override); returns (override, server_args)."""
    override = get_context().override_server_args(**fields)
    return override, override.install()


def parallel_override(values: dict) -> Any:
    """A rank's parallel values; those this tree does not take as overrides it
    derives from the published server config (dp_size, enable_dp_attention)."""
    known = compat.tree().parallel_fields
    if known is not None:
        values = {k: v for k, v in values.items() if k in known}
    return get_parallel().override(**values)


def body_context(md: Any, num_tokens: int, mode: CUDAGraphMode, key: tuple | None, lora_case: int) -> Any:
    return set_forward_context(md, num_tokens, mode, key, lora_case)

