"""vLLM's front door for the vision encoder's CUDA graphs (issue 39): what a
user types for them, the VllmConfig vLLM's own ``EngineArgs.create_engine_config``
builds from it, and what ``EncoderCudaGraphManager`` (v1/worker/encoder_cudagraph.py)
reads off that config.

An ``EncoderLaunchSettings`` stands for a ``vllm serve`` launch of a
Qwen2.5-VL checkpoint with ``cudagraph_mm_encoder`` on (``encoder_launch``).
vLLM validates it (``encoder_engine_config``): what it refuses is
``EngineRefused`` with vLLM's words.  What it accepts is read back the way the
manager and the model runner read it (``encoder_manager_inputs``).  The model
is cgsim's toy vision architecture, registered with vLLM's model registry and
its multimodal registry: no graph decision reads weights, so the launch line
names the public checkpoint of the same family.  Its ``toy/vision/config.json``
is Qwen2.5-VL-7B's language model as a plain qwen2 config: the heads vLLM
checks tensor parallelism against and the max_position_embeddings that
become max_model_len (which Qwen2.5-VL's largest encoder budget reads).  The
decode graphs' front door is ``engine.py``; this module reuses its launch,
environment and refusal handling.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass, fields
from typing import Any

from cgsim.targets.vllm.engine import (V2_RUNNER_ENV, VISION, EngineLaunch, EngineRefused, engine_config,
                                      v2_runner_env)

__all__ = ["EncoderLaunchSettings", "encoder_launch", "encoder_engine_config", "encoder_manager_inputs",
           "register_toy_vision_model", "v2_runner_builds_encoder_manager", "VISION_ARCHITECTURE", "EngineRefused"]

VISION_ARCHITECTURE = "CgsimToyVisionForConditionalGeneration"
# Qwen2-VL's modalities, each unlimited (models/qwen2_vl.py Qwen2VLProcessingInfo.get_supported_mm_limits).
SUPPORTED_MM_LIMITS = {"image": None, "video": None}


@dataclass(frozen=True)
class EncoderLaunchSettings:
    """What a user types for the encoder's graphs (config/compilation.py's
    ``encoder_cudagraph_*`` fields and the multimodal engine arguments).

    ``token_budgets`` empty, ``max_vision_items`` 0 and ``max_frames_per_batch``
    None: the manager infers them.  ``max_token_budget`` None leaves the field
    out of the launch (only 0.34+ has it; its default there is 5120)."""

    token_budgets: tuple[int, ...]
    max_vision_items: int
    max_frames_per_batch: int | None
    max_token_budget: int | None
    max_num_batched_tokens: int
    image_limit: int
    video_limit: int
    tensor_parallel_size: int
    mm_encoder_tp_mode: str
    enforce_eager: bool = False

    def to_json(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}

    @classmethod
    def from_json(cls, data: Any) -> "EncoderLaunchSettings":
        if not isinstance(data, dict):
            raise ValueError(f"encoder launch settings must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not an encoder launch setting; use only {', '.join(sorted(known))}")
        values = dict(data)
        if "token_budgets" in values:
            values["token_budgets"] = tuple(int(b) for b in values["token_budgets"])
        return cls(**values)


def encoder_launch(settings: EncoderLaunchSettings) -> EngineLaunch:
    """The ``vllm serve`` line for ``settings``: a field left to the manager
    (empty, 0, None) is left out, as a user who wants it inferred types it.
    The toy is registered meanwhile, so engine.py's functions build the launch too."""
    from cgsim.targets.vllm.compat import require_vllm  # noqa: PLC0415

    require_vllm()  # the environment depends on the tree's runners: the tree is laid over the install first
    register_toy_vision_model()
    compilation: dict[str, Any] = {"cudagraph_mm_encoder": True}
    if settings.token_budgets:
        compilation["encoder_cudagraph_token_budgets"] = list(settings.token_budgets)
    if settings.max_vision_items:
        compilation["encoder_cudagraph_max_vision_items_per_batch"] = settings.max_vision_items
    if settings.max_frames_per_batch is not None:
        compilation["encoder_cudagraph_max_frames_per_batch"] = settings.max_frames_per_batch
    if settings.max_token_budget is not None:
        compilation["encoder_cudagraph_max_token_budget"] = settings.max_token_budget
    args: dict[str, Any] = {
        "compilation_config": compilation,
        "limit_mm_per_prompt": {"image": settings.image_limit, "video": settings.video_limit},
        "mm_encoder_tp_mode": settings.mm_encoder_tp_mode,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
    }
    if settings.enforce_eager:
        args["enforce_eager"] = True
    if v2_runner_builds_encoder_manager():
        return EngineLaunch.of(VISION, args, v2_runner_env())
    return _on_v1_runner(EngineLaunch.of(VISION, args, {}))


def _on_v1_runner(launch: EngineLaunch) -> EngineLaunch:
    """``launch`` as it reaches the V1 runner, the only one that builds the
    encoder manager before 0.28: where vLLM's routing
    (VllmConfig.use_v2_model_runner) would give it the V2 runner, which
    builds none (0.25-0.27 route dense generate models there by default),
    the launch sets VLLM_USE_V2_MODEL_RUNNER=0, as a user must."""
    from cgsim.targets.vllm.engine import runs_v2_runner  # noqa: PLC0415

    if not runs_v2_runner(launch):
        return launch
    return dataclasses.replace(launch, env=((V2_RUNNER_ENV, "0"),))


@functools.lru_cache(maxsize=1)
def v2_runner_builds_encoder_manager() -> bool:
    """Whether the tree's V2 model runner builds the encoder manager
    (v1/worker/gpu/model_states/interface.py, 0.28+; the runner whose calls
    cgsim follows where it does).  Before, only the V1 GPUModelRunner does,
    and it is the runner a launch gets without VLLM_USE_V2_MODEL_RUNNER."""
    from cgsim.targets.vllm.compat import require_vllm, v2_runner_encoder_manager  # noqa: PLC0415

    require_vllm()  # vLLM imported by cgsim, so that its platform is cgsim's device
    return v2_runner_encoder_manager()


# --------------------------------------------------------------------------
# vLLM builds the config
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def register_toy_vision_model() -> None:
    """cgsim's toy vision architecture in vLLM's model registry, with a
    multimodal processor registered: vLLM makes a multimodal_config only for
    a model that declares SupportsMultiModal (config/model.py), and counts its
    modalities (model_config.supports_multimodal_inputs, which decides
    whether the runner has an encoder at all) only through the processing
    info of a registered processor (multimodal/registry.py get_processing_info)."""
    import torch  # noqa: PLC0415

    registry = importlib.import_module("vllm.model_executor.models.registry").ModelRegistry
    if VISION_ARCHITECTURE in registry.get_supported_archs():
        return
    interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
    processing = importlib.import_module("vllm.multimodal.processing")
    mm_registry = importlib.import_module("vllm.multimodal").MULTIMODAL_REGISTRY

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("cgsim's toy vision architecture is never loaded and processes no input")

    def placeholder(_cls: type, modality: str, _i: int) -> str:
        # model_executor/models/qwen2_5_vl.py get_placeholder_str.
        return f"<|vision_start|><|{'video' if modality.startswith('video') else 'image'}_pad|><|vision_end|>"

    info = type("CgsimToyVisionProcessingInfo", (processing.BaseProcessingInfo,),
                {"get_supported_mm_limits": lambda self: dict(SUPPORTED_MM_LIMITS)})
    namespace = {
        # Qwen2.5-VL takes --mm-encoder-tp-mode data; vLLM turns "data" into "weights" for a model that does not.
        "supports_encoder_tp_data": True,
        "__init__": lambda self, *, vllm_config=None, prefix="": torch.nn.Module.__init__(self),
        "get_placeholder_str": classmethod(placeholder),
        "forward": lambda self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None: refuse(),
        "embed_multimodal": lambda self, **kwargs: refuse(),
        "embed_input_ids": lambda self, input_ids, *args, **kwargs: refuse(),
        "get_input_embeddings": lambda self, input_ids, *args, **kwargs: refuse(),
        "compute_logits": lambda self, hidden_states: refuse(),
    }
    model = type(VISION_ARCHITECTURE, (torch.nn.Module, interfaces.SupportsMultiModal), namespace)
    model = mm_registry.register_processor(refuse, info=info, dummy_inputs=refuse)(model)
    registry.register_model(VISION_ARCHITECTURE, model)


def encoder_engine_config(settings: EncoderLaunchSettings) -> Any:
    """The VllmConfig vLLM builds from ``settings``' launch (EngineRefused:
    vLLM refuses it, in its words)."""
    return engine_config(encoder_launch(settings))


# --------------------------------------------------------------------------
# What the manager reads
# --------------------------------------------------------------------------


def encoder_manager_inputs(vc: Any) -> dict[str, Any]:
    """What ``EncoderCudaGraphManager.__init__`` reads off ``vc``, read the way
    it reads it (v1/worker/encoder_cudagraph.py), and whether the runner
    builds one at all: the V2 runner (v1/worker/gpu/model_states/interface.py,
    the same in 0.28-0.34) for an encoder, cudagraph_mm_encoder and not
    enforce_eager; the V1 runner (gpu_model_runner.py before 0.28)
    in capture_model, skipped when cudagraph_mode is NONE, for
    cudagraph_mm_encoder and multimodal inputs.  The model's
    SupportsEncoderCudaGraph, which Qwen2.5-VL has, is assumed.

    ``max_token_budget`` None: no cap on generated budgets (releases before 0.34 have no
    such field).  ``max_num_batched_tokens`` and ``max_model_len`` are what
    Qwen2.5-VL's get_encoder_cudagraph_budget_range reads for the largest budget."""
    from cgsim.targets.vllm.compat import encoder_max_token_budget, model_config_says_multimodal  # noqa: PLC0415

    cc, mc = vc.compilation_config, vc.model_config
    mm = mc.multimodal_config
    tp = int(vc.parallel_config.tensor_parallel_size)
    tp_mode = mm.mm_encoder_tp_mode if mm is not None else None
    video_limit = int(mm.get_limit_per_prompt("video")) if mm is not None else 0
    # An encoder (cache) only where multimodal inputs can arrive: V2's model_runner.py asks the
    # model config; V1's gpu_model_runner.py asks the multimodal registry (the config has no such property there).
    has_encoder = bool(mc.supports_multimodal_inputs) if model_config_says_multimodal(type(mc)) \
        else bool(importlib.import_module("vllm.multimodal").MULTIMODAL_REGISTRY.supports_multimodal_inputs(mc))
    if v2_runner_builds_encoder_manager():
        builds = has_encoder and bool(cc.cudagraph_mm_encoder) and not mc.enforce_eager
    else:
        builds = has_encoder and bool(cc.cudagraph_mm_encoder) and cc.cudagraph_mode.name != "NONE"
    max_frames = cc.encoder_cudagraph_max_frames_per_batch
    max_token_budget = cc.encoder_cudagraph_max_token_budget if encoder_max_token_budget() else None
    return {
        "cudagraph_mm_encoder": bool(cc.cudagraph_mm_encoder),
        "token_budgets": tuple(sorted(int(b) for b in cc.encoder_cudagraph_token_budgets or ())),
        "max_vision_items": int(cc.encoder_cudagraph_max_vision_items_per_batch),
        "max_frames_per_batch": None if max_frames is None else int(max_frames),
        "max_token_budget": None if max_token_budget is None else int(max_token_budget),
        "max_num_batched_tokens": int(vc.scheduler_config.max_num_batched_tokens),
        "max_model_len": int(mc.max_model_len),
        "image_limit": int(mm.get_limit_per_prompt("image")) if mm is not None else 0,
        "video_limit": video_limit,
        "video_enabled": video_limit != 0,
        "mm_encoder_tp_mode": tp_mode,
        "tensor_parallel_size": tp,
        "use_dp": mm is not None and tp_mode == "data" and tp > 1,
        "enforce_eager": bool(mc.enforce_eager),
        "supports_mm_inputs": has_encoder,
        "runner_builds_manager": builds,
    }
