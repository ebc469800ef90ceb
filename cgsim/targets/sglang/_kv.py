"""A writable toy KV cache for the SGLang target, so that where sglang's
runner tells the model to write KV, padded rows included, shows in the
outputs cgsim compares.

Each decode or verify forward of the target model (``_Rank.run_body``) runs
two kernels after the shared toy body, each one op the CUDA mock records:

- ``sgl_kv_write``: every token the forward runs writes a value derived from
  its input (token id, position) at ``forward_batch.out_cache_loc``, which
  inside a graph is the runner's static buffer, so a replay writes where the
  runner's buffer says.  Pool slot 0 is sglang's padding slot (its runner
  resets padded rows' out_cache_loc to 0): written freely, read by no request.
- ``sgl_kv_read``: each token adds to its hidden state (in place) the KV of its
  request's slots at positions up to its own, read from req_to_token at
  ``req_pool_indices`` as real backends do.

The pool is rebuilt from each step's layout before the forward (cgsim's steps
draw their batches independently; a request's context KV is a function of its
place in the batch and its positions), so a replay whose padded row writes a
live request's slot differs from eager in that step, where the request reads
it.  ``apply_reference`` runs the same kernels on a correctly written pool:
what the eager reference adds to the shared toy's output.

Slots are per request-pool row: row R position p is slot ``1 + (R-1) *
CONTEXT_LEN + p``.  Batch position k holds row ``n - k`` of an n-request batch:
rows stay with their requests, and when a batch shrinks the rows its dropped
positions held belong to requests still in it (sglang's filter_batch keeps the
survivors and their rows), so a stale slot of a dropped position is live.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from cgsim.workload.model import HIDDEN

__all__ = ["KvPool", "apply_reference", "applies", "attend"]

# The contribution's direction in hidden space (small: the toy's outputs stay in range).
_VEC = torch.linspace(0.05, -0.05, HIDDEN)


def _token_value(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return (input_ids * 7 + positions * 3).remainder(29).to(torch.float32) / 29 - 0.5


def _context_value(index: int, length: int) -> torch.Tensor:
    # A request's cached prefix; denominator 31 so it rarely equals a token's value.
    p = torch.arange(length, dtype=torch.int64)
    return (index * 11 + p * 5).remainder(31).to(torch.float32) / 31 - 0.5


def _write_kernel(kv: torch.Tensor, out_cache_loc: torch.Tensor, input_ids: torch.Tensor,
                  positions: torch.Tensor) -> None:
    t = input_ids.shape[0]
    kv.index_put_((out_cache_loc[:t].long(),), _token_value(input_ids[:t], positions[:t]))


def _read_kernel(x: torch.Tensor, kv: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                 positions: torch.Tensor, vec: torch.Tensor, width: int) -> None:
    t = x.shape[0]
    req = (torch.arange(t, device=x.device) // width).clamp(max=req_pool_indices.shape[0] - 1)
    slots = req_to_token.index_select(0, req_pool_indices.index_select(0, req).long()).long()
    seen = torch.arange(slots.shape[1], device=x.device).unsqueeze(0) <= positions[:t].unsqueeze(1)
    ctx = torch.where(seen, kv[slots], 0.0).sum(1)
    x.addcmul_(ctx.unsqueeze(1), vec)


def _write_meta(kv, out_cache_loc, input_ids, positions) -> None:
    return None


def _read_meta(x, kv, req_to_token, req_pool_indices, positions, vec, width) -> None:
    return None


_LIB = torch.library.Library("cgsim_sglang", "DEF")
_LIB.define("sgl_kv_write(Tensor(a!) kv, Tensor out_cache_loc, Tensor input_ids, Tensor positions) -> ()")
# In place on the hidden states: the capture takes no pool memory beyond the toy body's (GRAPH-MEMORY-FIT).
_LIB.define("sgl_kv_read(Tensor(a!) x, Tensor kv, Tensor req_to_token, Tensor req_pool_indices, Tensor positions, "
            "Tensor vec, int width) -> ()")
for _key in ("CPU", "CUDA"):
    _LIB.impl("sgl_kv_write", _write_kernel, _key)
    _LIB.impl("sgl_kv_read", _read_kernel, _key)
_LIB.impl("sgl_kv_write", _write_meta, "Meta")
_LIB.impl("sgl_kv_read", _read_meta, "Meta")
_write_op = torch.ops.cgsim_sglang.sgl_kv_write.default
_read_op = torch.ops.cgsim_sglang.sgl_kv_read.default


def applies(fb: Any) -> bool:
    """Forwards the toy KV runs in: decode and verify (uniform width; prefill
    graphs' padding is not modelled)."""
    mode = fb.forward_mode
    return not mode.is_extend() or mode.is_target_verify()


class KvPool:
    """A model runner's KV pool (one scalar per slot) and the view of it the
    toy's shared attention reads (each slot's row in its constant table)."""

    def __init__(self, table: torch.Tensor, device: str):
        rows, self.width = table.shape
        self.kv = torch.zeros(1 + rows * self.width, dtype=torch.float32, device=device)
        self.vec = _VEC.to(device)
        self.toy_rows: dict[int, int] = {}

    def slots(self, row: int, length: int) -> torch.Tensor:
        return 1 + (row - 1) * self.width + torch.arange(length, dtype=torch.int64)

    def load(self, table: torch.Tensor, contexts: Sequence[int], lens: Sequence[int],
             toy_slots: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Lay a batch out (host side, before the forward): each request's row
        of the request pool, its cached prefix's KV, the toy table rows of its
        new tokens.  Returns (req_pool_indices, out_cache_loc) on the host."""
        n = len(lens)
        if n >= table.shape[0]:
            raise ValueError(f"{n} requests exceed the request pool's {table.shape[0] - 1} rows")
        rows = [n - k for k in range(n)]
        new: list[torch.Tensor] = []
        i = 0
        for k, (row, c, q) in enumerate(zip(rows, contexts, lens)):
            slots = self.slots(row, c + q)
            table[row, : c + q] = slots.to(table.dtype).to(table.device)
            self.kv[slots[:c].to(self.kv.device)] = _context_value(k, c).to(self.kv.device)
            new.append(slots[c:])
            for s, toy in zip(slots[c:].tolist(), toy_slots[i:i + q]):
                self.toy_rows[s] = toy
            i += q
        loc = torch.cat(new) if new else torch.zeros(0, dtype=torch.int64)
        return torch.tensor(rows, dtype=torch.int64), loc

    def toy_row(self, slot: int) -> int:
        return self.toy_rows.get(slot, slot)


def attend(pool: KvPool, x: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor, fb: Any,
           req_to_token: torch.Tensor, width: int) -> torch.Tensor:
    """The two kernels on what sglang handed the model (static buffers inside a graph)."""
    _write_op(pool.kv, fb.out_cache_loc, input_ids, positions)
    _read_op(x, pool.kv, req_to_token, fb.req_pool_indices, positions, pool.vec, width)
    return x


def apply_reference(out: torch.Tensor, layout: Any, width: int, context_len: int, device: Any) -> torch.Tensor:
    """What the toy KV adds to a decode's eager output: the same kernels on a
    pool laid out and written for exactly this batch (``context_len``: the
    target's request-pool row width, so that each sum runs over as many slots)."""
    lens, contexts = layout.query_lens, layout.context_lens
    table = torch.zeros(len(lens) + 1, context_len, dtype=torch.int32, device=device)
    pool = KvPool(table, device)
    rows, loc = pool.load(table, contexts, lens, layout.slots)
    ids, pos = layout.input_ids.to(device), layout.positions.to(device)
    _write_kernel(pool.kv, loc.to(device), ids, pos)
    _read_kernel(out, pool.kv, table, rows.to(device), pos, pool.vec, width)
    return out
