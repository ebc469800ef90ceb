"""vLLM's own ``EncoderCudaGraphManager`` (v1/worker/encoder_cudagraph.py)
as an encoder handle: built from the VllmConfig vLLM's config path made of a
launch, with cgsim's toy encoder as the model (vLLM's own interface classes
from v1/worker/encoder_cudagraph_defs.py), on cgsim's backend, and called
the way the V2 runner's ``EncoderRunner.execute_mm_encoder`` calls it
(v1/worker/gpu/mm/encoder_runner.py: only when ``is_captured()``, eager
through the model when it returns nothing)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from cgsim.encoder.interface import EncoderClasses
from cgsim.encoder.runner import ManagedEncoder
from cgsim.encoder.targets import toy_for
from cgsim.encoder.values import EncoderScenario

__all__ = ["tree_design", "vllm_classes", "vllm_encoder_builder"]


def tree_design() -> str:
    """The encoder design of the imported tree, read off its manager:
    0.34 captures budgets sharing prefix buffers and replays once per path."""
    mod = importlib.import_module("vllm.v1.worker.encoder_cudagraph")
    return "vllm-encoder-0.34" if hasattr(mod.EncoderCudaGraphManager, "_share_prefix_compatible") \
        else "vllm-encoder-0.32"


def vllm_classes() -> EncoderClasses:
    defs = importlib.import_module("vllm.v1.worker.encoder_cudagraph_defs")
    return EncoderClasses(defs.EncoderItemSpec, defs.EncoderCudaGraphCaptureInputs,
                          defs.EncoderCudaGraphReplayBuffers, defs.EncoderCudaGraphConfig)


def vllm_encoder_builder(vllm_config: Any, scenario: EncoderScenario, backend: Any) -> Callable[[], ManagedEncoder]:
    """A function building vLLM's manager for ``vllm_config`` (a ValueError
    from its constructor is vLLM refusing the settings: counted, not judged)."""
    manager_cls = importlib.import_module("vllm.v1.worker.encoder_cudagraph").EncoderCudaGraphManager

    def build() -> ManagedEncoder:
        model = toy_for(scenario, backend.device, classes=vllm_classes())
        with backend.activate():
            manager = manager_cls(vllm_config=vllm_config, device=backend.device, dtype=torch.float32, model=model)
        return ManagedEncoder(manager, model, backend, guard_captured=True)

    return build
