"""The value classes of the encoder CUDA-graph model interface the toy
encoder hands a manager: the engine's own (vLLM's
``v1/worker/encoder_cudagraph_defs.py``) when cgsim drives the engine's
manager, cgsim's stand-ins with the same fields for the reference manager."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["ItemSpec", "CaptureInputs", "ReplayBuffers", "GraphConfig", "EncoderClasses", "CGSIM_CLASSES"]


@dataclass
class ItemSpec:
    input_size: int
    output_tokens: int
    path_output_tokens: dict[str, int] = field(default_factory=dict)

    def get_path_output_tokens(self, path: str) -> int:
        if path == "default" and not self.path_output_tokens:
            return self.output_tokens
        return self.path_output_tokens.get(path, 0)


@dataclass
class CaptureInputs:
    values: dict[str, Any]


@dataclass
class ReplayBuffers:
    values: dict[str, Any]


@dataclass
class GraphConfig:
    modalities: list[str]
    buffer_keys: list[str]
    out_hidden_size: int
    padding_logics: dict[str, Callable] = field(default_factory=dict)
    max_frames_per_video: int = 1


@dataclass(frozen=True)
class EncoderClasses:
    """Constructors of the interface's values (each called with keywords)."""

    item_spec: Callable[..., Any]
    capture_inputs: Callable[..., Any]
    replay_buffers: Callable[..., Any]
    graph_config: Callable[..., Any]


CGSIM_CLASSES = EncoderClasses(ItemSpec, CaptureInputs, ReplayBuffers, GraphConfig)
