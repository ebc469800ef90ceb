"""vLLM's own ``EncoderCudaGraphManager`` (v1/worker/encoder_cudagraph.py)
as an encoder handle: built from the VllmConfig vLLM's config path made of a
launch, with cgsim's toy encoder as the model (vLLM's own interface classes
from v1/worker/encoder_cudagraph_defs.py), on cgsim's backend, and called
the way the tree's runner calls it (``call_site``): the V2 runner's
``EncoderRunner.execute_mm_encoder`` (0.28+, v1/worker/gpu/mm/encoder_runner.py:
only when ``is_captured()``), or before 0.28 the V1 ``GPUModelRunner``
(built at capture, asked ``supports_modality``); eager through the model
when it returns nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
from typing import Any, Callable, Iterator

import torch

from cgsim.encoder.interface import EncoderClasses
from cgsim.encoder.runner import ASKS_CAPTURED, BUILT_AT_CAPTURE, CallSite, ManagedEncoder, gc_held
from cgsim.encoder.toy import toy_for
from cgsim.encoder.values import EncoderConfig, EncoderScenario
from cgsim.targets.base import Drawing, EncoderHooks, Tooling, Triage
from cgsim.targets.vllm.compat import Patch
from cgsim.targets.vllm.encoder_engine import (EncoderLaunchSettings, EngineRefused, encoder_engine_config,
                                               encoder_launch, encoder_manager_inputs,
                                               v2_runner_builds_encoder_manager)

__all__ = ["tree_design", "missing_model_interface", "vllm_classes", "call_site", "vllm_encoder_builder", "launch_settings", "reached_config",
           "VllmEncoderTarget", "MM_LIMIT", "ENCODER_PATCHES", "encoder_patches", "capture_stream"]

# Items per prompt the launch allows (any positive limit: the manager reads only whether videos are allowed).
MM_LIMIT = 4


ENCODER_PATCHES = (
    Patch(
        "encoder-capture-stream",
        "EncoderCudaGraphManager._capture_budget_graph passes vllm.utils.torch_utils.current_stream() to "
        "torch.cuda.graph (0.30+); on the CPU platform that is a _StreamPlaceholder a real CUDA graph cannot "
        "capture on. Replaced (in encoder_cudagraph only) by the backend's current stream; earlier releases pass "
        "no stream (torch.cuda.graph's own side stream) and are not patched.",
    ),
    Patch(
        "encoder-quiet-logs",
        "The manager logs at INFO when built and after each capture; vLLM's logger is at ERROR while cgsim "
        "drives it, as PATCHES' quiet-logs has it for the decode manager (a campaign's output is cgsim's).",
    ),
    Patch(
        "encoder-graph-capture-stream",
        "The V2 runner's EncoderRunner.capture runs the manager's capture inside "
        "vllm.distributed.parallel_state.graph_capture, which makes a side stream current (a CUDA graph cannot "
        "capture on the legacy default stream); without a TP group here, the side stream is made current directly.",
    ),
)


@contextlib.contextmanager
def encoder_patches(backend: Any) -> Iterator[None]:
    """ENCODER_PATCHES' encoder-capture-stream (where the tree passes a
    stream) and encoder-quiet-logs for the duration (inside the backend's activate())."""
    import logging  # noqa: PLC0415

    from cgsim.targets.vllm.compat import encoder_capture_stream, set_vllm_level  # noqa: PLC0415

    mod = importlib.import_module("vllm.v1.worker.encoder_cudagraph")
    with contextlib.ExitStack() as stack:
        vlog = logging.getLogger("vllm")
        if vlog.level != logging.ERROR:
            stack.callback(set_vllm_level, vlog, vlog.level)
            set_vllm_level(vlog, logging.ERROR)
        if encoder_capture_stream():
            cuda = backend.cuda
            stack.callback(setattr, mod, "current_stream", mod.current_stream)
            mod.current_stream = lambda: cuda.current_stream()
        yield


@contextlib.contextmanager
def capture_stream(backend: Any) -> Iterator[None]:
    """What the model runner's capture_model sets around EncoderRunner.capture:
    no gc cycle during the capture (v1/worker/gpu/model_runner.py captures under
    utils/gc_utils.py freeze_gc_for_cudagraph_capture; its two full collections
    per call are left out, a scenario captures once per step), and
    ENCODER_PATCHES' encoder-graph-capture-stream: a side stream current."""
    cuda = backend.cuda
    with gc_held(), cuda.stream(cuda.Stream()):
        yield


def tree_design() -> str:
    """The encoder design of the imported tree, read off its manager:
    0.34 captures budgets sharing prefix buffers and replays once per path."""
    from cgsim.targets.vllm.compat import encoder_shares_prefix, require_vllm  # noqa: PLC0415

    require_vllm()  # vLLM imported by cgsim, so that its platform is cgsim's device
    return "vllm-encoder-0.34" if encoder_shares_prefix() else "vllm-encoder-0.32"


def missing_model_interface() -> str | None:
    """What of the model interface cgsim's toy speaks (0.23+: item specs,
    padding logics, capture inputs as ``values``) this tree's manager lacks:
    0.19-0.22 ask for per-item token lists and capture inputs as
    ``mm_kwargs`` and ``buffers``, and zero-pad every buffer."""
    from cgsim.targets.vllm.compat import encoder_model_interface_gap, require_vllm  # noqa: PLC0415

    require_vllm()  # vLLM imported by cgsim, so that its platform is cgsim's device
    return encoder_model_interface_gap()


def vllm_classes() -> EncoderClasses:
    defs = importlib.import_module("vllm.v1.worker.encoder_cudagraph_defs")
    return EncoderClasses(defs.EncoderItemSpec, defs.EncoderCudaGraphCaptureInputs,
                          defs.EncoderCudaGraphReplayBuffers, defs.EncoderCudaGraphConfig)


def call_site() -> CallSite:
    """How the tree's runner holds and calls the manager: the V2 runner's
    EncoderRunner (0.28+) asks is_captured(); before, the V1 runner builds it
    at capture and asks supports_modality (encoder_engine.v2_runner_builds_encoder_manager)."""
    return ASKS_CAPTURED if v2_runner_builds_encoder_manager() else BUILT_AT_CAPTURE


def vllm_encoder_builder(vllm_config: Any, scenario: EncoderScenario, backend: Any) -> Callable[[], ManagedEncoder]:
    """A function building vLLM's manager for ``vllm_config`` (a ValueError
    from its constructor is vLLM refusing the settings: counted, not judged)."""
    manager_cls = importlib.import_module("vllm.v1.worker.encoder_cudagraph").EncoderCudaGraphManager
    site = call_site()

    def build() -> Any:
        model = toy_for(scenario, backend.device, classes=vllm_classes())

        def managers() -> list:
            with backend.activate(), encoder_patches(backend):
                return [manager_cls(vllm_config=vllm_config, device=backend.device, dtype=torch.float32, model=model)
                        for _ in range(scenario.config.tp_size if scenario.config.use_dp else 1)]

        built = managers()
        contexts = {"engine_context": functools.partial(encoder_patches, backend),
                    "capture_context": functools.partial(capture_stream, backend)}
        if len(built) > 1:
            from cgsim.targets.vllm.encoder_dp import DataParallelEncoder  # noqa: PLC0415

            return DataParallelEncoder(built, model, backend, call_site=site, rebuild=managers, **contexts)
        return ManagedEncoder(built[0], model, backend, call_site=site, rebuild=lambda: managers()[0], **contexts)

    return build


def launch_settings(config: EncoderConfig) -> EncoderLaunchSettings:
    """The engine arguments ``config`` stands for (a Qwen2.5-VL-like model:
    its smallest budget and frames per video are the model's, not settings)."""
    return EncoderLaunchSettings(
        token_budgets=config.token_budgets, max_vision_items=config.max_vision_items,
        max_frames_per_batch=config.max_frames_per_batch, max_token_budget=config.max_token_budget,
        max_num_batched_tokens=config.max_num_batched_tokens, image_limit=MM_LIMIT,
        video_limit=MM_LIMIT if config.video else 0, tensor_parallel_size=config.tp_size,
        mm_encoder_tp_mode="data" if config.dp_encoder else "weights")


def reached_config(config: EncoderConfig, inputs: dict) -> EncoderConfig:
    """The config the manager gets: what vLLM built (``encoder_manager_inputs``);
    the largest budget as Qwen2.5-VL's get_encoder_cudagraph_budget_range
    reads it (max_num_batched_tokens, at most max_model_len)."""
    return dataclasses.replace(
        config, token_budgets=inputs["token_budgets"], max_vision_items=inputs["max_vision_items"],
        max_frames_per_batch=inputs["max_frames_per_batch"], max_token_budget=inputs["max_token_budget"],
        max_num_batched_tokens=min(inputs["max_num_batched_tokens"], inputs["max_model_len"]),
        video=inputs["video_enabled"], tp_size=inputs["tensor_parallel_size"],
        dp_encoder=inputs["mm_encoder_tp_mode"] == "data")


class VllmEncoderTarget:
    """``vllm-encoder``: vLLM's manager as its V2 runner builds and calls it."""

    name = "vllm-encoder"

    def __init__(self, adapter_check: Callable[[], None] | None = None) -> None:
        # The doctor's encoder checks (``doctor.encoder_self_check``), handed in by the encoder registry: the
        # doctor runs this target, so this module does not import the doctor.
        self._adapter_check = adapter_check
        self.drawing, self.triage = Drawing(), Triage()
        self.tooling = Tooling(self_check=self._self_check)
        self.encoder = EncoderHooks(takes_max_token_budget=self._takes_max_token_budget, classify=self._classify)

    def default_ruleset(self) -> str:
        return tree_design()

    def prepare_environment(self) -> None:
        from cgsim.targets.vllm.compat import require_vllm  # noqa: PLC0415
        from cgsim.targets.vllm.source import apply_source, source_from_environment  # noqa: PLC0415

        source = source_from_environment()
        if source:
            apply_source(source)
        require_vllm()
        from cgsim.targets.base import TargetEnvironmentError  # noqa: PLC0415

        try:
            importlib.import_module("vllm.v1.worker.encoder_cudagraph")
        except ImportError as exc:
            raise TargetEnvironmentError(
                f"this vLLM has no encoder CUDA-graph manager (vllm.v1.worker.encoder_cudagraph: {exc}); "
                "the vllm-encoder target needs a release that has one") from None
        missing = missing_model_interface()
        if missing:
            raise TargetEnvironmentError(
                f"vLLM {require_vllm().version}'s encoder CUDA-graph manager asks its model for an older interface "
                f"({missing}), which cgsim's toy vision encoder does not speak; the vllm-encoder target drives "
                "vLLM 0.23 and later") from None

    def _self_check(self) -> None:
        """The encoder half of the adapter's self-check (``encoder_doctor``):
        TargetEnvironmentError, one line, where a mechanism broke; a
        violation of the clean scenarios is left to the campaign to find."""
        if self._adapter_check is not None:
            self._adapter_check()

    def environment(self) -> dict:
        from cgsim.targets.vllm.compat import require_vllm  # noqa: PLC0415

        return require_vllm().summary()

    def _takes_max_token_budget(self) -> bool:
        """Whether this vLLM has encoder_cudagraph_max_token_budget (0.34+: config/compilation.py)."""
        from cgsim.targets.vllm.compat import encoder_max_token_budget, require_vllm  # noqa: PLC0415

        require_vllm()
        return encoder_max_token_budget()

    def reach(self, scenario: EncoderScenario) -> tuple[EncoderScenario, dict]:
        """The scenario with the config vLLM builds, and its launch line
        (EngineRefused where vLLM refuses the settings or builds no manager)."""
        settings = launch_settings(scenario.config)
        inputs = encoder_manager_inputs(encoder_engine_config(settings))
        if not inputs["runner_builds_manager"]:
            raise EngineRefused("vLLM's runner builds no encoder CUDA-graph manager for these arguments")
        reached = dataclasses.replace(scenario, config=reached_config(scenario.config, inputs),
                                      ruleset=tree_design())
        return reached, {"line": encoder_launch(settings).line(), "settings": settings.to_json()}

    def _classify(self, scenario: EncoderScenario, trace: Any, violation: Any) -> dict:
        """Which documented defect (cgsim.targets.vllm.encoder_known) the violation is; {} for a new one."""
        from cgsim.targets.vllm.encoder_known import encoder_defect  # noqa: PLC0415

        defect = encoder_defect(scenario, trace, violation)
        return {"known_defect": defect} if defect else {}

    def builder(self, scenario: EncoderScenario, backend: Any) -> Callable[[], ManagedEncoder]:
        settings = launch_settings(scenario.config)
        return vllm_encoder_builder(encoder_engine_config(settings), scenario, backend)
