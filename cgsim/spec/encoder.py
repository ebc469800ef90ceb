"""The encoder CUDA-graph spec (docs/encoder.md): which token budgets a
vision encoder's manager must capture for a config, which graph an encoder
batch may replay, and the designs engines chose where the rule is theirs.

Universal rules (every design):

- a group of items replayed on a graph fits it: its output tokens at most
  the graph's budget, its items at most ``max_batch_size``, its frames at
  most the graph's frame slots;
- it replays the smallest captured budget that holds its tokens;
- a group that fits a captured graph never runs eagerly;
- every item of a batch is encoded exactly once, and its output equals the
  item encoded alone, eagerly (padding and earlier replays never show);
- before a capture and after a clear nothing replays.

A design (``EncoderDesign``) adds the engine's own choices: how the budget
grid is generated, and whether a batch is packed into several groups or
replayed once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the values validate their ruleset against DESIGNS here
    from cgsim.encoder.values import EncoderConfig

__all__ = ["EncoderDesign", "EncoderPlan", "DESIGNS", "design", "frame_slots", "plan", "EncoderConfigRefused", "Group",
           "fits", "smallest_fitting", "doubling_grid", "subdivided_grid"]


class EncoderConfigRefused(ValueError):
    """The manager refuses the config at construction (vLLM raises ValueError); not judged."""


@dataclass(frozen=True)
class EncoderDesign:
    """``grid``: "doubling" (the smallest budget doubled up to the largest,
    the largest always included: vLLM 0.23-0.33 ``_generate_budgets``) or
    "subdivided" (quarter octaves to 1024, steps of 128 to 2560, then 1/8
    octaves rounded up to 128, capped by ``max_token_budget``: vLLM 0.34).
    ``packing``: "greedy" (items sorted by tokens, packed into groups that
    fit the largest budget and ``max_batch_size``: vLLM 0.23-0.33) or
    "single" (one replay per batch, the whole batch or eager: vLLM 0.34).
    ``frames_capped_by_budget``: a graph's frame slots are
    min(max_frames_per_batch, budget) (vLLM 0.34)."""

    name: str
    grid: str
    packing: str
    frames_capped_by_budget: bool
    why: str


DESIGNS = {d.name: d for d in (
    EncoderDesign("encoder", "doubling", "single", False,
                  "cgsim's reference manager: doubling budgets, one replay per batch"),
    EncoderDesign("vllm-encoder-0.32", "doubling", "greedy", False,
                  "vLLM 0.23-0.33 v1/worker/encoder_cudagraph.py: _generate_budgets doubles; _execute_local packs "
                  "greedily into groups"),
    EncoderDesign("vllm-encoder-0.34", "subdivided", "single", True,
                  "vLLM 0.34 v1/worker/encoder_cudagraph.py: subdivided grid with encoder_cudagraph_max_token_budget; "
                  "_execute_local replays once per path; frame slots capped by the budget"),
)}


def frame_slots(max_batch_size: int, max_frames_per_batch: int) -> int:
    """Frames a graph's per-frame metadata holds: Qwen3-VL pads cu_seqlens to
    max_frames_per_batch for videos and to max_batch_size for images, and
    captures at least one sequence per item (qwen3_vl.py
    prepare_encoder_metadata, prepare_encoder_cudagraph_capture_inputs)."""
    return max(max_batch_size, max_frames_per_batch)


def design(name: str) -> EncoderDesign:
    try:
        return DESIGNS[name]
    except KeyError:
        raise ValueError(f"encoder ruleset {name!r} is unknown; use one of {', '.join(DESIGNS)}") from None


def doubling_grid(lo: int, hi: int) -> list[int]:
    out, b = [], lo
    while b <= hi:
        out.append(b)
        b *= 2
    if not out or out[-1] < hi:
        out.append(hi)
    return out


def subdivided_grid(lo: int, hi: int, cap: int | None) -> list[int]:
    if cap is not None:
        hi = min(hi, max(cap, lo))
    points = {lo, hi}
    base = 1
    while base < min(hi, 1024):
        for k in range(4):
            point = base + k * (base // 4)
            if lo <= point <= hi:
                points.add(point)
        base *= 2
    points.update(p for p in range(1024, min(hi, 2560) + 1, 128) if p >= lo)
    point = 2560
    while point < hi:
        point = -(-int(point * 2 ** (1 / 8)) // 128) * 128
        if lo <= point <= hi:
            points.add(point)
    return sorted(points)


@dataclass(frozen=True)
class EncoderPlan:
    """What a manager must capture: one graph per budget (ascending), each
    for ``max_batch_size`` items and its frame slots."""

    budgets: tuple[int, ...]
    max_batch_size: int
    max_frames_per_batch: int
    use_dp: bool

    def frame_slots(self, budget: int, d: EncoderDesign) -> int:
        """Frames a graph of ``budget`` holds (the model's rule, ``frame_slots``)."""
        frames = min(self.max_frames_per_batch, budget) if d.frames_capped_by_budget else self.max_frames_per_batch
        return frame_slots(self.max_batch_size, frames)


def plan(config: EncoderConfig, ruleset: str) -> EncoderPlan:
    """The plan of ``ruleset``'s design for ``config`` (EncoderConfigRefused where it refuses it)."""
    d = design(ruleset)
    user, items = sorted(set(config.token_budgets)), config.max_vision_items
    lo, hi = config.min_budget, config.max_num_batched_tokens

    def grid(low: int) -> list[int]:
        return doubling_grid(low, hi) if d.grid == "doubling" else subdivided_grid(low, hi, config.max_token_budget)

    if user and items > 0:
        if items > user[0]:
            raise EncoderConfigRefused(f"max_vision_items {items} exceeds the smallest budget {user[0]}")
        budgets, mbs = user, items
    else:
        if lo > hi:
            raise EncoderConfigRefused(f"budget range [{lo}, {hi}] is empty")
        if items > 0:
            budgets, mbs = grid(max(lo, items)), items
        else:
            budgets = user or grid(lo)
            mbs = min(hi // lo, budgets[0])
    if not config.video:
        frames = 0
    elif config.max_frames_per_batch is not None:
        frames = config.max_frames_per_batch
    else:
        frames = mbs * config.max_frames_per_video
    return EncoderPlan(tuple(budgets), mbs, frames, config.use_dp)


@dataclass(frozen=True)
class Group:
    """Items encoded together: their output tokens, count and frames."""

    tokens: int
    items: int
    frames: int


def fits(group: Group, budget: int, plan_: EncoderPlan, d: EncoderDesign) -> bool:
    return (group.tokens <= budget and group.items <= plan_.max_batch_size
            and group.frames <= plan_.frame_slots(budget, d))


def smallest_fitting(group: Group, budgets: tuple[int, ...], plan_: EncoderPlan, d: EncoderDesign) -> int | None:
    """The smallest captured budget that ``group`` fits (None: none; it runs eagerly)."""
    fitting = [b for b in sorted(set(budgets)) if fits(group, b, plan_, d)]
    return fitting[0] if fitting else None


