"""The values of an encoder scenario: what a vision encoder's CUDA-graph
manager is configured with, the items of an encoder batch, and the steps of
a lifecycle.  Frozen, JSON-serialisable, engine-neutral: a target turns an
``EncoderConfig`` into its engine's settings (vLLM: engine arguments)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from cgsim.spec.encoder import design

__all__ = ["MERGE", "EncoderItem", "EncoderConfig", "EncoderStep", "EncoderScenario", "EncoderScenarioError",
           "ENCODER_STEP_KINDS", "ENCODER_SCHEMA_VERSION"]

# Patches merged into one output token (a 2x2 spatial merge, as Qwen-VL's).
MERGE = 4
ENCODER_SCHEMA_VERSION = 1
ENCODER_STEP_KINDS = ("capture", "encode", "clear")


class EncoderScenarioError(ValueError):
    """An encoder scenario (or its JSON) is malformed; the message says where and how to fix it."""


@dataclass(frozen=True)
class EncoderItem:
    """One image (``frames`` 1) or video: a grid of ``frames`` x ``height`` x
    ``width`` patches; every 2x2 block of a frame is one output token."""

    frames: int
    height: int
    width: int
    video: bool = False

    def __post_init__(self) -> None:
        if self.frames < 1 or self.height < 2 or self.width < 2 or self.height % 2 or self.width % 2:
            raise EncoderScenarioError(
                f"item {self.frames}x{self.height}x{self.width}: frames must be >= 1 and height, width even and >= 2")
        if self.frames > 1 and not self.video:
            raise EncoderScenarioError(f"an image has one frame, got {self.frames}; mark it video=True")

    @property
    def modality(self) -> str:
        return "video" if self.video else "image"

    @property
    def input_size(self) -> int:
        return self.frames * self.height * self.width

    @property
    def output_tokens(self) -> int:
        return self.input_size // MERGE

    def to_json(self) -> list:
        return [self.frames, self.height, self.width, self.video]

    @classmethod
    def from_json(cls, data: Any) -> "EncoderItem":
        frames, height, width, video = data
        return cls(int(frames), int(height), int(width), bool(video))

    def short(self) -> str:
        return f"{'v' if self.video else 'i'}{self.frames}x{self.height}x{self.width}"


@dataclass(frozen=True)
class EncoderConfig:
    """What the manager is built from: the user's settings (empty / 0 / None:
    the manager infers them) and what the model answers.

    ``token_budgets``, ``max_vision_items``, ``max_frames_per_batch``,
    ``max_token_budget``: the user's settings (vLLM's
    ``compilation_config.encoder_cudagraph_*``); ``max_num_batched_tokens``:
    the largest budget the model proposes (vLLM's models return it);
    ``min_budget``: the smallest budget the model proposes (its smallest
    item); ``max_frames_per_video``: the model's; ``video``: whether videos
    are allowed at all; ``tp_size`` with ``dp_encoder``: the encoder runs
    data-parallel over the tensor-parallel ranks."""

    token_budgets: tuple[int, ...] = ()
    max_vision_items: int = 0
    max_frames_per_batch: int | None = None
    max_token_budget: int | None = None
    max_num_batched_tokens: int = 256
    min_budget: int = 16
    max_frames_per_video: int = 4
    video: bool = True
    tp_size: int = 1
    dp_encoder: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_budgets", tuple(int(b) for b in self.token_budgets))
        if self.min_budget < 1 or self.max_num_batched_tokens < 1 or self.max_frames_per_video < 1 or self.tp_size < 1:
            raise EncoderScenarioError(
                f"min_budget, max_num_batched_tokens, max_frames_per_video and tp_size must be >= 1, got {self}")

    @property
    def use_dp(self) -> bool:
        return self.dp_encoder and self.tp_size > 1

    def to_json(self) -> dict:
        return {"token_budgets": list(self.token_budgets), "max_vision_items": self.max_vision_items,
                "max_frames_per_batch": self.max_frames_per_batch, "max_token_budget": self.max_token_budget,
                "max_num_batched_tokens": self.max_num_batched_tokens, "min_budget": self.min_budget,
                "max_frames_per_video": self.max_frames_per_video, "video": self.video, "tp_size": self.tp_size,
                "dp_encoder": self.dp_encoder}

    @classmethod
    def from_json(cls, data: Any) -> "EncoderConfig":
        if not isinstance(data, dict):
            raise EncoderScenarioError("an encoder config must be a JSON object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise EncoderScenarioError(f"encoder config has unknown fields {sorted(unknown)}")
        return cls(**{**data, "token_budgets": tuple(data.get("token_budgets", ()))})

    def short(self) -> str:
        user = [f"budgets={list(self.token_budgets)}" if self.token_budgets else "",
                f"items={self.max_vision_items}" if self.max_vision_items else "",
                f"frames={self.max_frames_per_batch}" if self.max_frames_per_batch is not None else "",
                f"cap={self.max_token_budget}" if self.max_token_budget is not None else "",
                f"dp{self.tp_size}" if self.use_dp else ""]
        model = f"model=[{self.min_budget},{self.max_num_batched_tokens}]x{self.max_frames_per_video}f"
        return " ".join([u for u in user if u] + [model] + ([] if self.video else ["no-video"]))


@dataclass(frozen=True)
class EncoderStep:
    """``capture`` (capture every budget graph), ``encode`` (run ``items``
    through the manager as the engine's encoder runner does) or ``clear``
    (drop the graphs)."""

    kind: str
    items: tuple[EncoderItem, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", tuple(self.items))
        if self.kind not in ENCODER_STEP_KINDS:
            raise EncoderScenarioError(f"step kind {self.kind!r} is unknown; use one of {', '.join(ENCODER_STEP_KINDS)}")
        if (self.kind == "encode") != bool(self.items):
            raise EncoderScenarioError(f"a {self.kind!r} step {'needs' if self.kind == 'encode' else 'takes no'} items")

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind}
        if self.items:
            out["items"] = [i.to_json() for i in self.items]
        return out

    def short(self) -> str:
        return self.kind if not self.items else f"encode [{' '.join(i.short() for i in self.items)}]"


@dataclass(frozen=True)
class EncoderScenario:
    """An encoder config, the design it is judged by and a lifecycle."""

    config: EncoderConfig
    steps: tuple[EncoderStep, ...]
    ruleset: str = "encoder"
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        # The spec owns the designs: it validates the ruleset name.
        try:
            design(self.ruleset)
        except ValueError as exc:
            raise EncoderScenarioError(str(exc)) from None
        if not self.config.video:
            for i, step in enumerate(self.steps):
                if any(item.video for item in step.items):
                    raise EncoderScenarioError(f"step {i}: a video in a config that allows none")
        for i, step in enumerate(self.steps):
            if len({item.video for item in step.items}) > 1:
                # vLLM's runner groups a step's items by modality (group_and_batch_mm_kwargs) before the manager.
                raise EncoderScenarioError(f"step {i}: images and videos in one batch; the engine encodes each "
                                           "modality in its own batch")
            if any(item.frames > self.config.max_frames_per_video for item in step.items):
                raise EncoderScenarioError(
                    f"step {i}: a video longer than the model's {self.config.max_frames_per_video} frames")

    def to_json(self) -> dict:
        return {"schema_version": ENCODER_SCHEMA_VERSION, "kind": "encoder", "ruleset": self.ruleset,
                "seed": self.seed, "config": self.config.to_json(), "steps": [s.to_json() for s in self.steps]}

    def dumps(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_json(), indent=indent)

    @classmethod
    def from_json(cls, data: Any) -> "EncoderScenario":
        if not isinstance(data, dict) or data.get("kind") != "encoder":
            raise EncoderScenarioError("an encoder scenario is a JSON object with kind 'encoder'")
        if data.get("schema_version") != ENCODER_SCHEMA_VERSION:
            raise EncoderScenarioError(
                f"encoder scenario schema_version is {data.get('schema_version')!r}, this cgsim reads "
                f"{ENCODER_SCHEMA_VERSION}; regenerate it with this cgsim")
        try:
            steps = tuple(EncoderStep(s["kind"], tuple(EncoderItem.from_json(i) for i in s.get("items", ())))
                          for s in data["steps"])
            return cls(EncoderConfig.from_json(data["config"]), steps, data.get("ruleset", "encoder"),
                       int(data.get("seed", 0)))
        except KeyError as exc:
            raise EncoderScenarioError(f"encoder scenario JSON lacks the field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, EncoderScenarioError):
                raise
            raise EncoderScenarioError(f"encoder scenario JSON is malformed: {exc}") from None

    def short(self) -> str:
        return f"EncoderScenario({self.config.short()}, ruleset={self.ruleset}, steps={[s.short() for s in self.steps]})"
