"""cgsim's reference encoder CUDA-graph manager, written from the spec
(``cgsim.spec.encoder``, design "encoder"), not from an engine: it plans
its budgets with its own code, captures one graph per budget, and replays a
batch once on the smallest budget that fits it, or runs it eagerly.

It has the public face of vLLM's ``EncoderCudaGraphManager`` (``capture``,
``execute``, ``clear``, ``is_captured``, ``token_budgets``,
``max_batch_size``, ``max_frames_per_batch``) so that one handle drives
both; mutants (``cgsim.encoder.mutants``) override one method each.
"""

from __future__ import annotations

from typing import Any

import torch

from cgsim.encoder.values import EncoderConfig
from cgsim.spec.encoder import frame_slots

__all__ = ["ReferenceEncoderManager"]


class ReferenceEncoderManager:
    def __init__(self, config: EncoderConfig, model: Any, device: torch.device, cuda: Any) -> None:
        self.model, self.device, self.cuda = model, device, cuda
        self.graph_config = model.get_encoder_cudagraph_config()
        self.token_budgets, self.max_batch_size = self._plan_budgets(config)
        if not config.video:
            self.max_frames_per_batch = 0
        elif config.max_frames_per_batch is not None:
            self.max_frames_per_batch = config.max_frames_per_batch
        else:
            self.max_frames_per_batch = self.max_batch_size * self.graph_config.max_frames_per_video
        self.graphs: dict[int, tuple[Any, dict[str, torch.Tensor], torch.Tensor]] = {}
        self.graph_pool: Any = None

    def _plan_budgets(self, config: EncoderConfig) -> tuple[list[int], int]:
        lo, hi = self.model.get_encoder_cudagraph_budget_range(None)
        items = config.max_vision_items
        if config.token_budgets and items > 0:
            budgets = sorted(set(config.token_budgets))
            if items > budgets[0]:
                raise ValueError(f"max_vision_items {items} exceeds the smallest budget {budgets[0]}")
            return budgets, items
        if lo > hi:
            raise ValueError(f"budget range [{lo}, {hi}] is empty")
        if items > 0:
            return self._doubling(max(lo, items), hi), items
        budgets = sorted(set(config.token_budgets)) or self._doubling(lo, hi)
        return budgets, min(hi // lo, budgets[0])

    @staticmethod
    def _doubling(lo: int, hi: int) -> list[int]:
        budgets = []
        b = lo
        while b <= hi:
            budgets.append(b)
            b *= 2
        if not budgets or budgets[-1] != hi:
            budgets.append(hi)
        return budgets

    def is_captured(self) -> bool:
        return self.graph_pool is not None

    def clear(self) -> None:
        self.graphs.clear()
        self.graph_pool = None

    def capture(self, graph_pool: Any) -> None:
        self.graph_pool = graph_pool
        for budget in sorted(self.token_budgets, reverse=True):
            self._capture_one(budget)

    def _capture_one(self, budget: int) -> None:
        values = self.model.prepare_encoder_cudagraph_capture_inputs(
            budget, self.max_batch_size, self.max_frames_per_batch, self.device, torch.float32).values
        with torch.inference_mode():
            warm = self.model.encoder_cudagraph_forward(dict(values))
            out = torch.empty_like(warm)
        graph = self.cuda.CUDAGraph()
        with torch.inference_mode(), self.cuda.graph(graph, pool=self.graph_pool):
            out.copy_(self.model.encoder_cudagraph_forward(dict(values)))
        self.graphs[budget] = (graph, values, out)

    def _frame_slots(self) -> int:
        return frame_slots(self.max_batch_size, self.max_frames_per_batch)

    def _budget_for(self, tokens: int, items: int, frames: int) -> int | None:
        if items > self.max_batch_size or frames > self._frame_slots():
            return None
        for b in sorted(self.graphs):
            if tokens <= b:
                return b
        return None

    def _replay(self, budget: int, mm_kwargs: dict[str, Any]) -> torch.Tensor:
        graph, buffers, out = self.graphs[budget]
        replay = self.model.prepare_encoder_cudagraph_replay_buffers(
            mm_kwargs, self.max_batch_size, self.max_frames_per_batch)
        for key, buf in buffers.items():
            src = replay.values.get(key)
            if src is None:
                continue
            self._fill(key, buf, src)
        graph.replay()
        return out

    def _fill(self, key: str, buf: torch.Tensor, src: torch.Tensor) -> None:
        pad = self.graph_config.padding_logics.get(key)
        if pad is not None:
            pad(buf, src)
        else:
            buf.zero_()
            buf[: src.shape[0]].copy_(src)

    def execute(self, mm_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        specs = self.model.get_encoder_cudagraph_item_specs(mm_kwargs)
        tokens = [s.output_tokens for s in specs]
        if not specs:
            return []
        order = list(range(len(specs)))
        batch = self.model.select_encoder_cudagraph_items(mm_kwargs, order)
        # Frames are not in the item specs: the reference asks the toy (an engine's manager cannot).
        frames = sum(self.model.encoder_item_frames(mm_kwargs))
        budget = self._budget_for(sum(tokens), len(specs), frames)
        if budget is None:
            with torch.inference_mode():
                out = self.model.encoder_eager_forward(batch)
        else:
            out = self._replay(budget, batch)
        dest: dict[int, torch.Tensor] = {}
        self.model.postprocess_encoder_output({"default": out}, order, tokens, dest, clone=True, batch_mm_kwargs=batch)
        return [dest[i] for i in range(len(specs))]
