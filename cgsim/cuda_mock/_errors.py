"""The exceptions the mock raises, with the messages the real stack prints.

The texts are PyTorch's (aten/src/ATen/cuda/CUDAGraph.cpp, Copy.cu) and the CUDA
runtime's (cudaGetErrorString) so that code which matches on them, and tests that
run on both backends, see the same thing on CPU and on a GPU.
"""

from __future__ import annotations

import torch

__all__ = [
    "CUDA_ERROR_TYPE",
    "CAPTURE_UNSUPPORTED",
    "CAPTURE_INVALIDATED",
    "HOST_COPY",
    "REPLAY_WITHOUT_CAPTURE",
    "ALREADY_CAPTURED",
    "DEFAULT_STREAM_CAPTURE",
    "capture_unsupported_error",
    "capture_invalidated_error",
    "host_copy_error",
]

# CUDA runtime errors surface as torch.AcceleratorError (a RuntimeError subclass)
# from torch 2.8 on; older releases raised a plain RuntimeError.
CUDA_ERROR_TYPE: type[RuntimeError] = getattr(torch, "AcceleratorError", RuntimeError)

# cudaErrorStreamCaptureUnsupported: a synchronising call (stream/device sync,
# blocking D2H copy behind .item(), nonzero, ...) on a capturing stream.
CAPTURE_UNSUPPORTED = "operation not permitted when stream is capturing"
# cudaErrorStreamCaptureInvalidated: what every later call on the stream, and
# cudaStreamEndCapture, return once the capture sequence has been invalidated.
CAPTURE_INVALIDATED = "operation failed due to a previous error during capture"

HOST_COPY = (
    "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the "
    "CPU tensor is pinned. Please use tensor.pin_memory() or allocate the tensor "
    "with pin_memory=True."
)
REPLAY_WITHOUT_CAPTURE = "Called CUDAGraph::replay without a preceding successful capture."
# c10's CUDACachingAllocator when a capture reuses a pool whose graphs are all
# gone while tensors allocated from it are still alive (measured on an H200,
# torch 2.11: a manager that released its graphs and recaptured into the same
# pool handle).
POOL_RELEASED = (
    'it->second->use_count > 0 INTERNAL ASSERT FAILED at "/pytorch/c10/cuda/CUDACachingAllocator.cpp":2799, '
    "please report a bug to PyTorch. "
)
HOST_POOL_RELEASED = (
    'it->second->use_count > 0 INTERNAL ASSERT FAILED at "/pytorch/aten/src/ATen/core/CachingHostAllocator.h":773, '
    "please report a bug to PyTorch. "
)
ALREADY_CAPTURED = (
    "This CUDAGraph instance already owns a captured graph. To capture a new graph, "
    "create a new instance."
)
DEFAULT_STREAM_CAPTURE = (
    "CUDA graphs must be captured on a non-default stream. (However, after capture, "
    "it's ok to replay them on the default stream.)"
)

# c10's C10_CUDA_CHECK appends this to every CUDA error.
_CUDA_ERROR_TAIL = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so "
    "the stacktrace below might be incorrect.\nFor debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
    "assertions.\n"
)


def _cuda_error(text: str, what: str | None) -> RuntimeError:
    msg = f"CUDA error: {text}{_CUDA_ERROR_TAIL}"
    if what:
        msg += f"(cgsim mock: raised by {what} during capture)\n"
    return CUDA_ERROR_TYPE(msg)


def capture_unsupported_error(what: str | None = None) -> RuntimeError:
    return _cuda_error(CAPTURE_UNSUPPORTED, what)


def capture_invalidated_error(what: str | None = None) -> RuntimeError:
    return _cuda_error(CAPTURE_INVALIDATED, what)


def host_copy_error() -> RuntimeError:
    return RuntimeError(HOST_COPY)
