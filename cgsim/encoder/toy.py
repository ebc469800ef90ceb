"""cgsim's toy vision encoder: a model implementing the encoder CUDA-graph
model interface (vLLM's ``SupportsEncoderCudaGraph``, the method names the
managers call) whose outputs depend on every input row of an item, on which
rows form a frame and which frames form an item, so that a padding row, a
stale buffer or a wrong slice changes a real item's output.

The graph's buffers follow Qwen3-VL's (model_executor/models/qwen3_vl.py
``prepare_encoder_cudagraph_capture_inputs``): patch rows sized by the token
budget, per-frame metadata for ``spec.encoder.frame_slots`` frames, with padding logics that send padding to a trash slot
(a zero-filled pad would join frame 0 and item 0, as an unpadded cu_seqlens
would in Qwen's attention).

It records what the manager asks of it into ``log`` (plain tuples, read by
``cgsim.encoder.runner``): captures, the item groups the manager selects,
replays and eager forwards, and the rows each group's output had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from cgsim.encoder.interface import CGSIM_CLASSES, EncoderClasses
from cgsim.encoder.values import MERGE, EncoderItem, EncoderScenario
from cgsim.spec.encoder import frame_slots

__all__ = ["ToyVisionEncoder", "toy_for", "ITEM_IDS", "PIXELS", "GRID", "BUFFER_KEYS", "HIDDEN", "IN_DIM"]

HIDDEN = 8
IN_DIM = 6
ITEM_IDS, PIXELS, GRID = "cgsim_item_ids", "pixel_values", "grid_thw"
ROW_FRAME, FRAME_ITEM = "row_frame", "frame_item"
BUFFER_KEYS = [PIXELS, ROW_FRAME, FRAME_ITEM]


@dataclass(frozen=True)
class _Slots:
    tokens: int  # output rows (the token budget)
    frames: int  # frame slots; index ``frames`` is the trash frame
    items: int  # item slots; index ``items`` is the trash item


def _forward(values: dict[str, torch.Tensor], slots: _Slots, weight: torch.Tensor) -> torch.Tensor:
    """One forward over (possibly padded) buffers: per output token, its
    merged patches plus the mean of its frame and the mean of its item."""
    x = values[PIXELS] @ weight
    merged = x.view(slots.tokens, MERGE, HIDDEN).sum(1)
    tok_frame = values[ROW_FRAME].view(slots.tokens, MERGE)[:, 0]
    ones = torch.ones(slots.tokens, dtype=merged.dtype, device=merged.device)
    fsum = torch.zeros(slots.frames + 1, HIDDEN, dtype=merged.dtype, device=merged.device).index_add_(0, tok_frame, merged)
    fcnt = torch.zeros(slots.frames + 1, dtype=merged.dtype, device=merged.device).index_add_(0, tok_frame, ones)
    fmean = fsum / fcnt.clamp(min=1).unsqueeze(1)
    tok_item = values[FRAME_ITEM][tok_frame]
    isum = torch.zeros(slots.items + 1, HIDDEN, dtype=merged.dtype, device=merged.device).index_add_(0, tok_item, merged)
    icnt = torch.zeros(slots.items + 1, dtype=merged.dtype, device=merged.device).index_add_(0, tok_item, ones)
    imean = isum / icnt.clamp(min=1).unsqueeze(1)
    return torch.tanh(0.5 * merged + fmean[tok_frame] + imean[tok_item])


def _select(mm_kwargs: dict[str, Any], indices: Sequence[int]) -> dict[str, Any]:
    """The items at ``indices``, in that order (pixel rows concatenated)."""
    grid = mm_kwargs[GRID]
    sizes = (grid[:, 0] * grid[:, 1] * grid[:, 2]).tolist()
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)
    rows = [mm_kwargs[PIXELS][starts[i]:starts[i + 1]] for i in indices]
    pixels = torch.cat(rows) if rows else mm_kwargs[PIXELS][:0]
    idx = torch.tensor(list(indices), dtype=torch.long, device=grid.device)
    return {PIXELS: pixels, GRID: grid[idx], ITEM_IDS: mm_kwargs[ITEM_IDS][idx]}


class ToyVisionEncoder:
    """The model a manager is built with.  ``classes`` make the interface's
    values (``EncoderCudaGraphConfig``, item specs, capture and replay
    buffers): vLLM's own classes, or cgsim's stand-ins for the reference."""

    supports_encoder_cudagraph = True

    def __init__(self, *, min_budget: int, max_budget: int, max_frames_per_video: int, device: torch.device,
                 classes: EncoderClasses = CGSIM_CLASSES, video: bool = True, seed: int = 0) -> None:
        self.min_budget, self.max_budget = min_budget, max_budget
        self.max_frames_per_video = max_frames_per_video
        self.device = device
        self.video = video
        gen = torch.Generator().manual_seed(1234 + seed)
        self.weight = (torch.randint(-4, 5, (IN_DIM, HIDDEN), generator=gen).float() / 8).to(device)
        self.classes = classes
        self.log: list[tuple] = []
        # Per captured buffer length (patch rows): its graph's trash frame; and the item slots of every graph.
        self._trash_rows: dict[int, int] = {}
        self._item_slots = 0

    # ---- the interface the manager calls ------------------------------------------------

    def get_encoder_cudagraph_config(self) -> Any:
        return self.classes.graph_config(
            modalities=["image", "video"] if self.video else ["image"],
            buffer_keys=list(BUFFER_KEYS),
            out_hidden_size=HIDDEN,
            padding_logics={ROW_FRAME: self._pad_row_frame, FRAME_ITEM: self._pad_frame_item},
            max_frames_per_video=self.max_frames_per_video,
        )

    def get_input_modality(self, mm_kwargs: dict[str, Any]) -> str:
        return "video" if bool((mm_kwargs[GRID][:, 0] > 1).any()) else "image"

    def get_max_frames_per_video(self) -> int:
        return self.max_frames_per_video

    def get_encoder_cudagraph_budget_range(self, vllm_config: Any = None) -> tuple[int, int]:
        return self.min_budget, self.max_budget

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: dict[str, Any]) -> list:
        return [self.classes.item_spec(input_size=int(t * h * w), output_tokens=int(t * h * w) // MERGE)
                for t, h, w in mm_kwargs[GRID].tolist()]

    def encoder_item_frames(self, mm_kwargs: dict[str, Any]) -> list[int]:
        """Frames per item (cgsim's reference manager asks; an engine's cannot)."""
        return [int(t) for t in mm_kwargs[GRID][:, 0].tolist()]

    def select_encoder_cudagraph_items(self, mm_kwargs: dict[str, Any], indices: list[int]) -> dict[str, Any]:
        selected = _select(mm_kwargs, indices)
        self.log.append(("select", tuple(int(i) for i in selected[ITEM_IDS].tolist())))
        return selected

    def prepare_encoder_cudagraph_capture_inputs(self, token_budget: int, max_batch_size: int,
                                                  max_frames_per_batch: int, device: Any, dtype: Any,
                                                  path: str = "default", axis_keys: Any = None) -> Any:
        slots = self._slots(token_budget, max_batch_size, max_frames_per_batch)
        rows = token_budget * MERGE
        values = {
            PIXELS: torch.zeros(rows, IN_DIM, device=self.device),
            ROW_FRAME: torch.full((rows,), slots.frames, dtype=torch.long, device=self.device),
            FRAME_ITEM: torch.full((slots.frames + 1,), slots.items, dtype=torch.long, device=self.device),
        }
        self._trash_rows[rows] = slots.frames
        self._item_slots = slots.items
        self.log.append(("capture_inputs", token_budget, max_batch_size, max_frames_per_batch, path))
        return self.classes.capture_inputs(values=values)

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs: dict[str, Any], max_batch_size: int,
                                                  max_frames_per_batch: int, path: str = "default") -> Any:
        row_frame, frame_item = self._metadata(mm_kwargs[GRID])
        ids = tuple(int(i) for i in mm_kwargs[ITEM_IDS].tolist())
        self.log.append(("replay", ids, max_batch_size, max_frames_per_batch, path))
        return self.classes.replay_buffers(values={PIXELS: mm_kwargs[PIXELS], ROW_FRAME: row_frame, FRAME_ITEM: frame_item})

    def encoder_cudagraph_forward(self, values: dict[str, torch.Tensor], path: str = "default") -> torch.Tensor:
        rows = values[PIXELS].shape[0]
        # Sizes from shapes only: reading a buffer's values would synchronise inside a capture.
        slots = _Slots(rows // MERGE, values[FRAME_ITEM].shape[0] - 1, self._item_slots)
        self.log.append(("graph_forward", rows // MERGE, path))
        return _forward(values, slots, self.weight)

    def encoder_eager_forward(self, mm_kwargs: dict[str, Any], path: str = "default") -> torch.Tensor:
        ids = tuple(int(i) for i in mm_kwargs[ITEM_IDS].tolist())
        self.log.append(("eager", ids, path))
        return self.eager_rows(mm_kwargs)

    def postprocess_encoder_output(self, outputs: dict[str, torch.Tensor], indices: list[int],
                                   per_item_out_tokens: list[int], dest: Any, clone: bool = False,
                                   batch_mm_kwargs: dict[str, Any] | None = None) -> None:
        out = outputs["default"] if isinstance(outputs, dict) else outputs  # vLLM before 0.27 hands the buffer itself
        ids = tuple(int(i) for i in batch_mm_kwargs[ITEM_IDS].tolist()) if batch_mm_kwargs is not None else ()
        self.log.append(("output", ids, int(out.shape[0])))
        offset = 0
        for i in indices:
            n = per_item_out_tokens[i]
            piece = out[offset:offset + n]
            dest[i] = piece.clone() if clone else piece
            offset += n

    def embed_multimodal(self, **mm_kwargs: Any) -> list[torch.Tensor]:
        """The engine's eager path when no graph runs (one forward over the batch)."""
        ids = tuple(int(i) for i in mm_kwargs[ITEM_IDS].tolist())
        self.log.append(("eager", ids, "embed_multimodal"))
        rows = self.eager_rows(mm_kwargs)
        sizes = [int(t * h * w) // MERGE for t, h, w in mm_kwargs[GRID].tolist()]
        return list(rows.split(sizes))

    # ---- what cgsim uses ---------------------------------------------------------------------

    def inputs(self, items: Sequence[EncoderItem], seed: int) -> dict[str, torch.Tensor]:
        """mm_kwargs for ``items`` (item i has id i): small multiples of 1/8,
        so sums over rows are exact in float32 whatever the order."""
        gen = torch.Generator().manual_seed(seed)
        pixels = torch.randint(-8, 9, (sum(i.input_size for i in items), IN_DIM), generator=gen).float() / 8
        grid = torch.tensor([[i.frames, i.height, i.width] for i in items], dtype=torch.long)
        ids = torch.arange(len(items), dtype=torch.long)
        return {PIXELS: pixels.to(self.device), GRID: grid.to(self.device), ITEM_IDS: ids.to(self.device)}

    def eager_rows(self, mm_kwargs: dict[str, Any]) -> torch.Tensor:
        """The batch without padding: exactly its frames and items."""
        row_frame, frame_item = self._metadata(mm_kwargs[GRID])
        tokens = mm_kwargs[PIXELS].shape[0] // MERGE
        items = mm_kwargs[GRID].shape[0]
        frames = frame_item.shape[0]
        values = {PIXELS: mm_kwargs[PIXELS],
                  ROW_FRAME: row_frame,
                  FRAME_ITEM: torch.cat([frame_item, frame_item.new_tensor([items])])}
        return _forward(values, _Slots(tokens, frames, items), self.weight)

    def reference(self, mm_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """Each item encoded alone, eagerly: what any batching must give."""
        out = []
        for i in range(mm_kwargs[GRID].shape[0]):
            one = _select(mm_kwargs, [i])
            out.append(self.eager_rows(one))
        return out

    # ---- buffers -------------------------------------------------------------------------------

    def _slots(self, token_budget: int, max_batch_size: int, max_frames_per_batch: int) -> _Slots:
        return _Slots(token_budget, frame_slots(max_batch_size, max_frames_per_batch), max_batch_size)

    def _metadata(self, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per patch row its frame in the batch; per frame its item."""
        row_frame: list[torch.Tensor] = []
        frame_item: list[int] = []
        for item, (t, h, w) in enumerate(grid.tolist()):
            for _ in range(t):
                row_frame.append(torch.full((h * w,), len(frame_item), dtype=torch.long))
                frame_item.append(item)
        rf = torch.cat(row_frame) if row_frame else torch.zeros(0, dtype=torch.long)
        return rf.to(self.device), torch.tensor(frame_item, dtype=torch.long, device=self.device)

    def _pad_frame_item(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        # Padding frames belong to the trash item, the last item slot.
        dst.fill_(self._item_slots)
        dst[: src.shape[0]].copy_(src)

    def _pad_row_frame(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        # Padding rows belong to the trash frame, the last slot of this graph's frame_item buffer.
        dst.fill_(self._trash_rows.get(dst.shape[0], 0))
        dst[: src.shape[0]].copy_(src)


def toy_for(scenario: EncoderScenario, device: Any, **kw: Any) -> ToyVisionEncoder:
    """The toy a scenario's manager is built with (every encoder target's)."""
    c = scenario.config
    return ToyVisionEncoder(min_budget=c.min_budget, max_budget=c.max_num_batched_tokens,
                            max_frames_per_video=c.max_frames_per_video, device=device, video=c.video,
                            seed=scenario.seed, **kw)
