"""A toy decoder whose per-request outputs depend on the attention metadata.

Each layer: attention (a break point for piecewise graphs) reading query start
locations, sequence lengths and the slot mapping; for the Inkling-like backend
an ``sconv`` op that also reads metadata (inside the pieces when graphs are
breakable, a break point otherwise); then an MLP with LoRA deltas.  Stale,
rebound or wrongly padded metadata therefore changes real rows' outputs.

Each stage is one custom operator (``torch.ops.cgsim.*``), the way a real
model's attention and fused MLP are custom kernels: a capture records one
kernel per stage, whatever the kernel does inside, and replay runs it again
against the captured memory.  That keeps a capture of the toy model a handful
of recorded ops on the CPU mock (it was the bulk of cgsim's run time) while
the kernels still read every input through the tensors they were launched
with: static inputs and metadata buffers live, Python values frozen.

Every kernel is graph-capturable: static shapes, no host syncs, no
data-dependent shapes.  Python values a kernel branches on (the kernel kind,
max_query_len, the LoRA case) are launch parameters, frozen into a captured
graph exactly like those of real kernels.
"""

from __future__ import annotations

import ctypes
from typing import Callable

import torch
import torch.nn.functional as F

from cgsim.workload.attention import AttentionMetadata
from cgsim.workload.context import ForwardContext

__all__ = ["ToyModel", "Stage", "KERNELS", "HIDDEN", "VOCAB", "MAX_POS", "KV_ROWS"]

HIDDEN = 8
VOCAB = 64
MAX_POS = 64
KV_ROWS = 97  # prime; row -1 (the last) is the padding row and stays zero

# Attention kernel kinds (AttentionMetadata.kernel) as the kernels' launch parameter.
KERNELS = {"varlen": 0, "uniform": 1, "single-token": 2}
_VARLEN, _UNIFORM, _SINGLE = 0, 1, 2


# ------------------------------------------------------------------- kernels
# Plain torch on whatever device the tensors live on; registered below as the
# CPU and CUDA implementations of the cgsim operators.


def _embed_kernel(input_ids: torch.Tensor, positions: torch.Tensor, embed: torch.Tensor,
                  pos_embed: torch.Tensor) -> torch.Tensor:
    return torch.embedding(embed, input_ids) + torch.embedding(pos_embed, positions.remainder(MAX_POS))


def _attn_kernel(x: torch.Tensor, wvk: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                 slot_mapping: torch.Tensor, kv_table: torch.Tensor, ctx_vec: torch.Tensor, kernel: int,
                 max_query_len: int) -> torch.Tensor:
    """Each token attends to itself and to the first token of its request (an
    attention sink), reads the KV row its slot names, and sees its request's
    sequence length.

    Which request a token belongs to, and where that request starts, depends
    on the kernel: varlen reads query_start_loc, the uniform-batch kernel
    assumes every request has max_query_len tokens, the single-token kernel
    one token per request.  Tokens past the last request (padding) start at
    the end of the real tokens."""
    T = x.shape[0]
    tok = torch.arange(T, device=x.device)
    if kernel == _VARLEN:
        req = torch.searchsorted(query_start_loc[1:], tok, right=True)
        start = query_start_loc.index_select(0, req)
    elif kernel == _UNIFORM:
        req = torch.div(tok, max_query_len, rounding_mode="floor")
        start = req * max_query_len
    else:
        req = tok
        start = tok
    vk = torch.mm(x, wvk)
    v, k = vk[:, :HIDDEN], vk[:, HIDDEN:]
    # Stale or garbage metadata may point anywhere: clamped, it reads wrong
    # rows (and the outputs show it) instead of failing to index.
    first = v.index_select(0, start.clamp(0, T - 1))
    ctx_len = seq_lens.index_select(0, req.clamp(max=seq_lens.shape[0] - 1))
    kv = kv_table[slot_mapping[:T]]
    out = torch.addcmul(x, ctx_len.unsqueeze(1), ctx_vec)
    return out.add_(v).add_(first).addcmul_(k, kv)


def _sconv_kernel(x: torch.Tensor, wc: torch.Tensor, query_start_loc: torch.Tensor) -> torch.Tensor:
    """Short convolution over the previous token of the same request (varlen
    layout from query_start_loc)."""
    T = x.shape[0]
    tok = torch.arange(T, device=x.device)
    req = torch.searchsorted(query_start_loc[1:], tok, right=True)
    has_prev = (tok > query_start_loc.index_select(0, req)).to(x.dtype).unsqueeze(1)
    prev = F.pad(x[:-1], (0, 0, 1, 0))
    return torch.addcmul(x, has_prev, torch.mm(prev, wc), value=0.5)


def _mlp_kernel(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, lora_tables: torch.Tensor,
                lora_ids: torch.Tensor, lora_case: int) -> torch.Tensor:
    """MLP with a LoRA delta per token.  The kernel handles as many adapters as
    its LoRA case: ``lora_tables[case]`` holds zeros for adapter ids above it."""
    out = torch.addmm(x, torch.relu_(torch.mm(x, w1)), w2)
    if lora_case:
        out += torch.embedding(lora_tables[lora_case], lora_ids)
    return out


def _meta(kernel: Callable) -> Callable:
    # Shape inference (the mock uses it when a kernel cannot run on the inputs
    # it sees during capture): run the kernel on zeros of the same shapes, so
    # a shape mismatch fails here exactly as it would on real data.
    def meta(*args):
        real = [torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in args]
        out = kernel(*real)
        return torch.empty(out.shape, dtype=out.dtype, device="meta")

    return meta


# The attention kernels are pure functions of their inputs' bytes and launch
# parameters, and a fuzz campaign runs the same ones over and over (every
# capture size warms up on the same dummy batch; seeds repeat across
# scenarios): on the CPU their results are remembered by exact input bytes.
# A hit returns a fresh copy of what the kernel computed for the same bytes,
# so graph replays and eager runs see exactly what a recomputation gives.
# Weights are keyed by address: they are never written and never freed (see
# _make_weights), so an address names their bytes.  Bounded by bytes held;
# cleared when full.  (The MLP and embedding kernels cost less than a lookup.)
_MEMO_BYTES = 64 * 2**20
_memo: dict[tuple, torch.Tensor] = {}
_memo_size = [0]
_immortal: set[int] = set()  # data pointers of weight tensors


def _remembered(kernel: Callable) -> Callable:
    def run(*args):
        key: list = [kernel]
        nbytes = 0
        for a in args:
            if isinstance(a, torch.Tensor):
                if not a.is_cpu or not a.is_contiguous():
                    return kernel(*args)
                ptr = a.data_ptr()
                if ptr in _immortal:
                    key += (ptr, a.shape)
                    continue
                n = a.nbytes
                key += (a.dtype, a.shape, ctypes.string_at(ptr, n) if n else b"")
                nbytes += n
            else:
                key.append(a)
        k = tuple(key)
        out = _memo.get(k)
        if out is None:
            out = kernel(*args)
            _memo_size[0] += nbytes + out.nbytes
            if _memo_size[0] > _MEMO_BYTES:
                _memo.clear()
                _memo_size[0] = 0
            _memo[k] = out
        return out.clone()

    return run


_LIB = torch.library.Library("cgsim", "DEF")
_SCHEMAS = {
    "toy_embed": ("(Tensor input_ids, Tensor positions, Tensor embed, Tensor pos_embed) -> Tensor", _embed_kernel),
    "toy_attn": ("(Tensor x, Tensor wvk, Tensor query_start_loc, Tensor seq_lens, Tensor slot_mapping, "
                 "Tensor kv_table, Tensor ctx_vec, int kernel, int max_query_len) -> Tensor", _attn_kernel),
    "toy_sconv": ("(Tensor x, Tensor wc, Tensor query_start_loc) -> Tensor", _sconv_kernel),
    "toy_mlp": ("(Tensor x, Tensor w1, Tensor w2, Tensor lora_tables, Tensor lora_ids, int lora_case) -> Tensor",
                _mlp_kernel),
}
for _name, (_schema, _kernel) in _SCHEMAS.items():
    _LIB.define(_name + _schema)
    _LIB.impl(_name, _remembered(_kernel) if _name in ("toy_attn", "toy_sconv") else _kernel, "CPU")
    _LIB.impl(_name, _kernel, "CUDA")
    _LIB.impl(_name, _meta(_kernel), "Meta")

_embed_op = torch.ops.cgsim.toy_embed.default
_attn_op = torch.ops.cgsim.toy_attn.default
_sconv_op = torch.ops.cgsim.toy_sconv.default
_mlp_op = torch.ops.cgsim.toy_mlp.default


# -------------------------------------------------------------------- weights

_weights: dict[tuple, dict] = {}


def _make_weights(num_layers: int, seed: int, max_loras: int, device: torch.device) -> dict:
    """The model's parameters, a pure function of (layers, seed, LoRA count,
    device): shared by every model built with the same ones (nothing writes
    them), so a scenario does not pay for drawing them again."""
    key = (num_layers, seed, max_loras, str(device))
    w = _weights.get(key)
    if w is not None:
        return w
    g = torch.Generator().manual_seed(1234 + seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g) * 0.3  # noqa: E731
    kv = rnd(KV_ROWS, HIDDEN)
    kv[-1] = 0.0
    lora = rnd(max_loras + 1, HIDDEN)
    lora[0] = 0.0  # adapter id 0: no adapter
    # tables[c]: the rows a kernel built for LoRA case c reads; adapters above c get nothing.
    tables = torch.stack([torch.where(torch.arange(max_loras + 1).unsqueeze(1) <= c, lora, 0.0)
                          for c in range(max_loras + 1)])
    layers = []
    for _ in range(num_layers):
        layers.append({"wvk": rnd(HIDDEN, 2 * HIDDEN), "w1": rnd(HIDDEN, HIDDEN), "w2": rnd(HIDDEN, HIDDEN),
                       "wc": rnd(HIDDEN, HIDDEN)})
    w = {"embed": rnd(VOCAB, HIDDEN), "pos_embed": rnd(MAX_POS, HIDDEN), "kv_table": kv,
         "ctx_vec": rnd(HIDDEN) * 0.01, "lora_tables": tables, "layers": layers}
    w = _to_device(w, device)
    _weights[key] = w
    _immortal.update(t.data_ptr() for t in _tensors_of(w))
    return w


def _tensors_of(w):
    if isinstance(w, torch.Tensor):
        yield w
    elif isinstance(w, dict):
        for v in w.values():
            yield from _tensors_of(v)
    else:
        for v in w:
            yield from _tensors_of(v)


def _to_device(w, device):
    if isinstance(w, torch.Tensor):
        return w.to(device)
    if isinstance(w, dict):
        return {k: _to_device(v, device) for k, v in w.items()}
    return [_to_device(v, device) for v in w]


# ---------------------------------------------------------------------- model


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
        self.device = device
        self.max_loras = max(max_loras, 1)
        w = _make_weights(num_layers, seed, self.max_loras, device)
        self.embed = w["embed"]
        self.pos_embed = w["pos_embed"]
        self.kv_table = w["kv_table"]
        self.ctx_vec = w["ctx_vec"]
        self.lora_tables = w["lora_tables"]
        self.layers = w["layers"]
        self._static_inputs = static_inputs
        self._no_input = torch.empty(0, device=device)  # what the first stage is given (it reads the static inputs)
        self._pieces: list | None = None
        self.stages: list[Stage] = [Stage("embed", self._embed, breaks=False)]
        for i, layer in enumerate(self.layers):
            self.stages.append(Stage(f"attn{i}", self._attn(layer), breaks=True))
            if in_graph_metadata_op:
                self.stages.append(Stage(f"sconv{i}", self._sconv(layer), breaks=not sconv_in_pieces))
            self.stages.append(Stage(f"mlp{i}", self._mlp(layer), breaks=False))

    # -- stages ---------------------------------------------------------------
    def _embed(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        input_ids, positions, _ = self._static_inputs(ctx.num_tokens)
        return _embed_op(input_ids, positions, self.embed, self.pos_embed)

    def _attn(self, layer: dict) -> Callable:
        wvk = layer["wvk"]

        def attn(x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
            md: AttentionMetadata | None = ctx.attn_metadata
            if md is None:
                # Attention skipped (profiling / non-breakable piecewise capture):
                # it runs outside the pieces, so its output is not captured.
                return x
            return _attn_op(x, wvk, md.query_start_loc, md.seq_lens, md.slot_mapping, self.kv_table, self.ctx_vec,
                            KERNELS[md.kernel], md.max_query_len)

        return attn

    def _sconv(self, layer: dict) -> Callable:
        wc = layer["wc"]

        def sconv(x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
            md = ctx.attn_metadata
            if md is None:
                return x
            return _sconv_op(x, wc, md.query_start_loc)

        return sconv

    def _mlp(self, layer: dict) -> Callable:
        w1, w2 = layer["w1"], layer["w2"]

        def mlp(x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
            lora_ids = self._static_inputs(x.shape[0])[2]
            return _mlp_op(x, w1, w2, self.lora_tables, lora_ids, ctx.lora_case)

        return mlp

    # -- running ----------------------------------------------------------------
    def run_stages(self, ctx: ForwardContext) -> torch.Tensor:
        x = self._no_input
        for stage in self.stages:
            x = stage.fn(x, ctx)
        return x

    def pieces(self) -> list[list[Stage] | Stage]:
        """Group stages for piecewise execution: runs of non-break stages become
        one piece (one graph); break stages stand alone and run eagerly."""
        if self._pieces is None:
            self._pieces = self._group()
        return self._pieces

    def _group(self) -> list[list[Stage] | Stage]:
        out: list = []
        for stage in self.stages:
            if stage.breaks:
                out.append(stage)
            elif out and isinstance(out[-1], list):
                out[-1].append(stage)
            else:
                out.append([stage])
        return out
