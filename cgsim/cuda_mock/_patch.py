"""Installing the mock into ``torch.cuda`` (and the few Tensor methods whose CPU
implementations never reach the dispatcher)."""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, Iterator

import torch

from . import _capture, _errors, _memory, _runtime
from ._runtime import G

__all__ = ["patched_torch_cuda", "is_patched", "CUDA_NAMES", "ACCELERATOR_NAMES"]

# torch.cuda names the mock replaces.
CUDA_NAMES = {
    "CUDAGraph": _capture.CUDAGraph,
    "graph": _capture.graph,
    "graph_pool_handle": _capture.graph_pool_handle,
    "is_current_stream_capturing": _capture.is_current_stream_capturing,
    "synchronize": _runtime.synchronize,
    "Stream": _runtime.Stream,
    "ExternalStream": _runtime.ExternalStream,
    "Event": _runtime.Event,
    "StreamContext": _runtime.StreamContext,
    "current_stream": _runtime.current_stream,
    "default_stream": _runtime.default_stream,
    "stream": _runtime.stream,
    "set_stream": _runtime.set_stream,
    "empty_cache": _runtime.empty_cache,
    "current_blas_handle": _runtime.current_blas_handle,
    "is_available": _runtime.is_available,
    "is_initialized": _runtime.is_initialized,
    "init": _runtime.init,
    "device_count": _runtime.device_count,
    "current_device": _runtime.current_device,
    "set_device": _runtime.set_device,
    "device": _runtime.device,
    "get_device_name": _runtime.get_device_name,
    "get_device_capability": _runtime.get_device_capability,
    "get_device_properties": _runtime.get_device_properties,
    "get_rng_state": _runtime.get_rng_state,
    "set_rng_state": _runtime.set_rng_state,
    "mem_get_info": _runtime.mem_get_info,
    "memory_allocated": _runtime.memory_allocated,
    "memory_reserved": _runtime.memory_reserved,
    "max_memory_allocated": _runtime.max_memory_allocated,
    "reset_peak_memory_stats": _runtime.reset_peak_memory_stats,
}
# torch.accelerator's memory, cache and sync calls: on a CUDA machine they are
# torch.cuda's (engines call them around capture: empty_cache before each
# graph, get_memory_info to size pools).  Its device-type answers
# (is_available, current_accelerator) stay torch's: claiming an accelerator
# would send tensors to a "cuda" device a CPU build cannot hold.
ACCELERATOR_NAMES = {
    "synchronize": _runtime.synchronize,
    "empty_cache": _runtime.empty_cache,
    "empty_host_cache": _runtime.empty_host_cache,
    "get_memory_info": _runtime.mem_get_info,
    "memory_allocated": _runtime.memory_allocated,
    "memory_reserved": _runtime.memory_reserved,
    "max_memory_allocated": _runtime.max_memory_allocated,
    "reset_peak_memory_stats": _runtime.reset_peak_memory_stats,
}
# torch.cuda.make_graphed_callables looks these up in its own module.
GRAPHS_NAMES = {
    "CUDAGraph": _capture.CUDAGraph,
    "graph": _capture.graph,
    "graph_pool_handle": _capture.graph_pool_handle,
    "is_current_stream_capturing": _capture.is_current_stream_capturing,
}

_T = torch.Tensor
_orig = {name: getattr(_T, name) for name in ("cpu", "to", "tolist", "numpy", "pin_memory", "is_pinned")}
_orig_cpu = _orig["cpu"]
_orig_to = _orig["to"]
_orig_tolist = _orig["tolist"]
_orig_numpy = _orig["numpy"]


def _capturing_on_device(t: torch.Tensor) -> bool:
    cap = G.capture
    return cap is not None and not cap.host_depth and not _memory.is_host(t)


# On CPU these methods read memory directly, without an aten op the capture mode
# could see; on a GPU each is a device-to-host copy.
def _cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if _memory.is_host(self):
        return _orig_cpu(self, *args, **kwargs)
    if G.capture is not None and not G.capture.host_depth:
        raise _errors.host_copy_error()
    # A device-to-host copy makes new host memory; returning self would let the
    # caller write through to "device" memory.
    return _memory.host_buffer(self.clone(), pinned=False)


def _tolist(self: torch.Tensor) -> Any:
    if _capturing_on_device(self):
        raise _errors.host_copy_error()
    return _orig_tolist(self)


def _numpy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    if _capturing_on_device(self):
        raise TypeError(
            "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy "
            "the tensor to host memory first."
        )
    return _orig_numpy(self, *args, **kwargs)


def _to_target(args: tuple, kwargs: dict) -> tuple[bool, torch.dtype | None, bool]:
    """(names a device?, dtype, non_blocking) of a Tensor.to call."""
    device = "device" in kwargs
    dtype = kwargs.get("dtype")
    rest = list(args)
    if rest and isinstance(rest[0], (str, torch.device, int)) and not isinstance(rest[0], bool):
        device = True
        rest.pop(0)
        if rest and isinstance(rest[0], torch.dtype):
            dtype = rest.pop(0)
    elif rest and isinstance(rest[0], torch.Tensor):
        device = True
        dtype = rest.pop(0).dtype
    elif rest and isinstance(rest[0], torch.dtype):
        dtype = rest.pop(0)
    non_blocking = kwargs.get("non_blocking", rest[0] if rest else False)
    return device, dtype, bool(non_blocking)


def _host_to_device(src: torch.Tensor, dtype: torch.dtype | None, non_blocking: bool) -> torch.Tensor:
    # A factory with no tensor argument: device memory from the graph's pool
    # (empty_like(src) would count as a host op, src being host memory).
    dst = torch.empty(src.shape, dtype=dtype or src.dtype)
    dst.copy_(src, non_blocking=non_blocking)  # the capture mode applies the host-copy rules
    return dst


def _to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    cap = G.capture
    if cap is not None and not cap.host_depth and _memory.host_count() and _memory.is_host(self):
        device, dtype, non_blocking = _to_target(args, kwargs)
        if device:
            return _host_to_device(self, dtype, non_blocking)
    return _orig_to(self, *args, **kwargs)


def _cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> torch.Tensor:
    if not _memory.is_host(self):
        return self
    if G.capture is not None and not G.capture.host_depth:
        return _host_to_device(self, None, non_blocking)
    return self.clone()


def _pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if _memory.is_pinned_host(self):
        return self
    return _memory.host_buffer(self.clone(), pinned=True)


def _is_pinned(self: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
    return _memory.is_pinned_host(self)


def _record_stream(self: torch.Tensor, stream: Any) -> None:
    pass


TENSOR_METHODS = {
    "cpu": _cpu,
    "cuda": _cuda,
    "to": _to,
    "tolist": _tolist,
    "numpy": _numpy,
    "pin_memory": _pin_memory,
    "is_pinned": _is_pinned,
    "record_stream": _record_stream,
}

_MISSING = object()
_lock = threading.RLock()
_depth = 0
_saved: list[tuple[Any, str, Any]] = []


def is_patched() -> bool:
    return _depth > 0


def _install() -> None:
    import torch.cuda.graphs as graphs_mod

    _runtime.G.installation += 1

    targets = [(torch.cuda, CUDA_NAMES), (graphs_mod, GRAPHS_NAMES), (_T, TENSOR_METHODS)]
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        targets.append((accelerator, {k: v for k, v in ACCELERATOR_NAMES.items() if hasattr(accelerator, k)}))
    # torch 2.11 has no torch.accelerator.empty_host_cache: this is its only way in.
    if hasattr(torch._C, "_host_emptyCache"):
        targets.append((torch._C, {"_host_emptyCache": _runtime.empty_host_cache}))
    for obj, names in targets:
        for name, value in names.items():
            # Only what the object defines itself: restoring must not turn an
            # inherited attribute (Tensor.cpu lives on TensorBase) into an own one.
            _saved.append((obj, name, obj.__dict__.get(name, _MISSING)))
            setattr(obj, name, value)


def _uninstall() -> None:
    if _capture.abort_capture():
        warnings.warn(
            "cgsim mock: a CUDA graph capture was still under way when the mock was "
            "uninstalled (capture_begin without capture_end); it was discarded.",
            RuntimeWarning,
            stacklevel=3,
        )
    _runtime.take_replay_streams()  # replays of this block are not the next one's
    # A stream left current (torch's graph context leaves its stream current
    # when capture_end fails) is not the next block's: it starts as a process does.
    _runtime.reset_current_stream()
    while _saved:
        obj, name, value = _saved.pop()
        if value is _MISSING:
            try:
                delattr(obj, name)
            except AttributeError:
                pass
        else:
            setattr(obj, name, value)


@contextlib.contextmanager
def patched_torch_cuda() -> Iterator[None]:
    """Install the mock into ``torch.cuda`` for the duration of the block.

    Re-entrant: only the outermost block installs and uninstalls, so an inner
    block ending (normally or by an exception) leaves the outer one's mock in
    place. Everything is restored when the outermost block ends, also on error.
    Inside, ordinary CPU tensors play device memory; see host_buffer for host
    memory.
    """
    global _depth
    with _lock:
        if _depth == 0:
            try:
                _install()
            except BaseException:
                _uninstall()
                raise
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _uninstall()
