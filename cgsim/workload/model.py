"""A toy decoder whose per-request outputs depend on the attention metadata.

Each layer: attention (a break point for piecewise graphs) reading query start
locations, sequence lengths and the slot mapping; for the Inkling-like backend
an ``sconv`` op that also reads metadata (inside the pieces when graphs are
breakable, a break point otherwise); then an MLP with LoRA deltas.  Stale,
rebound or wrongly padded metadata therefore changes real rows' outputs.

Every op is graph-capturable: static shapes, no host syncs, no
data-dependent shapes.  Python values a kernel branches on (the kernel kind,
max_query_len, the LoRA case) are frozen into a captured graph, exactly like
launch parameters of real kernels.
"""

from __future__ import annotations

from typing import Callable

import torch

from cgsim.workload.attention import AttentionMetadata
from cgsim.workload.context import ForwardContext

__all__ = ["ToyModel", "Stage"]

HIDDEN = 8
VOCAB = 64
MAX_POS = 64
KV_ROWS = 97  # prime; row -1 (the last) is the padding row and stays zero


class Stage:
    __slots__ = ("name", "fn", "breaks")

    def __init__(self, name: str, fn: Callable[[torch.Tensor, ForwardContext], torch.Tensor], breaks: bool):
        self.name = name
        self.fn = fn
        # A break stage runs eagerly between piecewise graphs.
        self.breaks = breaks


class ToyModel:
    def __init__(self, num_layers: int, device: torch.device, seed: int, in_graph_metadata_op: bool,
                 sconv_in_pieces: bool, max_loras: int, static_inputs: Callable[[int], tuple[torch.Tensor, ...]]):
        g = torch.Generator().manual_seed(1234 + seed)
        rnd = lambda *shape: (torch.randn(*shape, generator=g) * 0.3).to(device)  # noqa: E731
        self.device = device
        self.embed = rnd(VOCAB, HIDDEN)
        self.pos_embed = rnd(MAX_POS, HIDDEN)
        kv = rnd(KV_ROWS, HIDDEN)
        kv[-1] = 0.0
        self.kv_table = kv
        self.layers = [
            {name: rnd(HIDDEN, HIDDEN) for name in ("wq", "wk", "wv", "w1", "w2", "wc")} for _ in range(num_layers)
        ]
        self.ctx_vec = rnd(HIDDEN)
        self.lora = rnd(max(max_loras, 1) + 1, HIDDEN)
        self._static_inputs = static_inputs
        self.stages: list[Stage] = [Stage("embed", self._embed, breaks=False)]
        for i, layer in enumerate(self.layers):
            self.stages.append(Stage(f"attn{i}", self._attn(layer), breaks=True))
            if in_graph_metadata_op:
                self.stages.append(Stage(f"sconv{i}", self._sconv(layer), breaks=not sconv_in_pieces))
            self.stages.append(Stage(f"mlp{i}", self._mlp(layer), breaks=False))

    # -- stages ---------------------------------------------------------------
    def _embed(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        input_ids, positions, _ = self._static_inputs(ctx.num_tokens)
        return self.embed[input_ids] + self.pos_embed[positions.remainder(MAX_POS)]

    @staticmethod
    def _request_index(md: AttentionMetadata, num_tokens: int, device: torch.device) -> torch.Tensor:
        tok = torch.arange(num_tokens, device=device)
        if md.kernel == "uniform":
            # Uniform-batch kernel: every request has max_query_len tokens.
            return torch.div(tok, md.max_query_len, rounding_mode="floor")
        if md.kernel == "single-token":
            return tok
        return torch.searchsorted(md.query_start_loc[1:], tok, right=True)

    def _attn(self, layer: dict) -> Callable:
        def attn(x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
            md = ctx.attn_metadata
            if md is None:
                # Attention skipped (profiling / non-breakable piecewise capture):
                # it runs outside the pieces, so its output is not captured.
                return x
            T = x.shape[0]
            req = self._request_index(md, T, x.device)
            tok = torch.arange(T, device=x.device)
            same = (req.unsqueeze(1) == req.unsqueeze(0)) & (tok.unsqueeze(0) <= tok.unsqueeze(1))
            w = same.to(x.dtype)
            v = x @ layer["wv"]
            mixed = (w @ v) / w.sum(dim=1, keepdim=True).clamp(min=1.0)
            seq = torch.cat([md.seq_lens, md.seq_lens.new_zeros(1)])
            nreq = seq.shape[0] - 1
            ctx_len = seq[req.clamp(max=nreq)].to(x.dtype)
            kv = self.kv_table[md.slot_mapping[:T]]
            k = x @ layer["wk"]
            return x + torch.tanh(mixed + (k * kv) + 0.01 * ctx_len.unsqueeze(1) * self.ctx_vec)

        return attn

    def _sconv(self, layer: dict) -> Callable:
        def sconv(x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
            md = ctx.attn_metadata
            if md is None:
                return x
            T = x.shape[0]
            tok = torch.arange(T, device=x.device)
            req = torch.searchsorted(md.query_start_loc[1:], tok, right=True)
            starts = torch.cat([md.query_start_loc, md.query_start_loc[-1:]])[req.clamp(max=md.query_start_loc.shape[0] - 1)]
            has_prev = (tok > starts).to(x.dtype).unsqueeze(1)
            prev = torch.cat([x.new_zeros(1, x.shape[1]), x[:-1]])
            return x + 0.5 * has_prev * (prev @ layer["wc"])

        return sconv

    def _mlp(self, layer: dict) -> Callable:
        def mlp(x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
            _, _, lora_ids = self._static_inputs(x.shape[0])
            h = torch.nn.functional.gelu(x @ layer["w1"]) @ layer["w2"]
            # The LoRA kernel handles as many adapters as the captured case.
            for j in range(1, ctx.lora_case + 1):
                h = h + (lora_ids == j).to(x.dtype).unsqueeze(1) * self.lora[j]
            return x + h

        return mlp

    # -- running ----------------------------------------------------------------
    def run_stages(self, ctx: ForwardContext) -> torch.Tensor:
        x = torch.empty(0, device=self.device)
        for stage in self.stages:
            x = stage.fn(x, ctx)
        return x

    def pieces(self) -> list[list[Stage] | Stage]:
        """Group stages for piecewise execution: runs of non-break stages become
        one piece (one graph); break stages stand alone and run eagerly."""
        out: list = []
        for stage in self.stages:
            if stage.breaks:
                out.append(stage)
            elif out and isinstance(out[-1], list):
                out[-1].append(stage)
            else:
                out.append([stage])
        return out
