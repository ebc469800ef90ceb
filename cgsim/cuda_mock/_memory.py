"""Graph memory pools, host-buffer marks and poison values.

Why pools are modelled at all: the hazards the fidelity table lists for shared
pools (a later capture taking a block an earlier graph still writes at replay) only
exist because the caching allocator hands a freed block to the next allocation of
the same pool. The mock reproduces that with one rule taken from the real
allocator: a block is free once the last *user* storage on it is gone. The graph
itself does not count as a user: it holds its own alias of the block (a second
storage on the same bytes, owned by the pool), exactly as a real graph holds raw
device pointers and not tensors.

A block's bytes are owned by the pool; a pool lives while a graph captured into it
lives (the graph holds it), so graph-private memory stays valid for replay as long
as the graph does, like the real allocator's private pools.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import struct
import weakref
from dataclasses import dataclass

import torch

from . import _errors

__all__ = [
    "GraphMemory",
    "PoolMemory",
    "pool_memory",
    "Pool",
    "get_pool",
    "new_pool_id",
    "new_private_pool_id",
    "poison_value",
    "host_buffer",
    "is_host",
    "is_pinned_host",
    "host_count",
    "alias_of",
    "extent_bytes",
    "live_pool_bytes",
]

# Real caching allocator rounds small requests to 512 bytes; keeping the same
# granularity makes "same-sized tensors reuse each other's blocks" hold here too.
_ROUND = 512


def _round(nbytes: int) -> int:
    return max(_ROUND, (nbytes + _ROUND - 1) // _ROUND * _ROUND)


# --------------------------------------------------------------------------- pools

_pool_uids = itertools.count(1)
# Every live pool by id; a pool disappears when no graph holds it any more (the
# real allocator releases a private pool when its use count drops to zero).
_pools: "weakref.WeakValueDictionary[tuple[int, int], Pool]" = weakref.WeakValueDictionary()
# data_ptr of a block -> block, across all pools: lets a graph turn any tensor that
# lives in pool memory back into the pool-owned bytes it aliases.
_blocks_by_ptr: "weakref.WeakValueDictionary[int, _Block]" = weakref.WeakValueDictionary()


def new_pool_id() -> tuple[int, int]:
    """A fresh id in the form graph_pool_handle() returns: (0, n)."""
    return (0, next(_pool_uids))


def new_private_pool_id() -> tuple[int, int]:
    """A fresh id in the form a graph's private pool has: (n, 0)."""
    return (next(_pool_uids), 0)


def get_pool(pool_id: tuple[int, int]) -> "Pool":
    pool = _pools.get(pool_id)
    if pool is None:
        pool = Pool(pool_id)
        _pools[pool_id] = pool
    return pool


_ref_types: dict[int, type] = {}


def _ref_type(nbytes: int) -> type:
    # A ctypes array subclass (so instances take weak references) over a block's
    # bytes. torch.frombuffer keeps the instance alive for exactly as long as the
    # user's storage lives, so its death is the "block freed" signal.
    cls = _ref_types.get(nbytes)
    if cls is None:
        cls = type(f"_BlockRef{nbytes}", (ctypes.c_char * nbytes,), {})
        _ref_types[nbytes] = cls
    return cls


class _Block:
    __slots__ = ("pool", "nbytes", "data", "ptr", "in_use", "_user", "__weakref__")

    def __init__(self, pool: "Pool", nbytes: int) -> None:
        self.pool = pool
        self.nbytes = nbytes
        # torch's CPU allocator aligns to 64 bytes, enough for every dtype.
        self.data = torch.empty(nbytes, dtype=torch.uint8)
        self.ptr = self.data.data_ptr()
        self.in_use = False
        self._user: weakref.ref | None = None  # the user storage's bytes object, while in use
        _blocks_by_ptr[self.ptr] = self

    def _freed(self, _ref: weakref.ref) -> None:
        # The last user storage on this block is gone.  (A block that dies
        # first takes this weak reference with it: no callback then.)
        self._user = None
        _release(self)


# Pools whose graphs are all gone.  The real allocator's releasePool only
# marks such a pool freeable: it stays registered with use_count 0 until an
# empty_cache (release_cached_blocks) finds every block of it free and erases
# it, and a capture into a registered pool with use_count 0 trips the
# use_count > 0 assertion.  torch.cuda.graph() empties the cache on entry, so
# the assertion shows where a capture begins without one (CUDAGraph.
# capture_begin directly, e.g. a breakable wrapper with gc disabled) or where a
# tensor of the pool is still alive (measured on an H200, torch 2.11).
_released: "dict[tuple[int, int], Pool]" = {}


def _release(block: "_Block") -> None:
    block.in_use = False
    block.pool._free.append(block)


# The pinned-host allocator keeps graph pools of its own, one per pool id a
# capture used (torch >= 2.11: CachingHostAllocator.h begin_allocate_to_pool at
# every capture_begin, whether or not the capture pins any memory).  Its
# release_pool also only marks a pool freeable, but only the *host* empty_cache
# (torch.accelerator.empty_host_cache, torch._C._host_emptyCache) erases it:
# torch.cuda.empty_cache does not.  Measured on an H200 (torch 2.11): capture,
# destroy the graph, torch.cuda.empty_cache, capture into the same id -> the
# host allocator's use_count > 0 assertion; with the host cache emptied too the
# capture works.  torch.cuda.graph() empties both caches on entry.
HOST_GRAPH_POOLS = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 11)
_host_released: "set[tuple[int, int]]" = set()


def erase_host_pools() -> None:
    """The host empty_cache's part for graph pools: every host pool no graph
    uses any more is erased."""
    _host_released.clear()


def erase_freeable_pools() -> None:
    """empty_cache's part for graph pools: erase every released pool none of
    whose blocks is in use (its id then names a fresh pool)."""
    for pool_id, pool in list(_released.items()):
        pool.reap()
        if pool.allocated_bytes == 0:
            del _released[pool_id]
            if _pools.get(pool_id) is pool:
                del _pools[pool_id]


def get_pool_for_capture(pool_id: tuple[int, int]) -> "Pool":
    """The pool a capture allocates from, with the real use-count rules."""
    pool = _released.get(pool_id)
    if pool is not None:
        raise RuntimeError(_errors.POOL_RELEASED)
    # capture_begin asks the device allocator first, then the host one.
    if pool_id in _host_released:
        raise RuntimeError(_errors.HOST_POOL_RELEASED)
    pool = get_pool(pool_id)
    pool.use_count += 1
    return pool


def release_pool(pool: "Pool") -> None:
    """A graph that captured into ``pool`` is reset or destroyed."""
    pool.use_count -= 1
    if pool.use_count == 0:
        pool.reap()
        _released[pool.id] = pool
        if HOST_GRAPH_POOLS:
            _host_released.add(pool.id)


@dataclass(frozen=True)
class GraphMemory:
    """What one graph's capture took from its pool.  ``taken_bytes``: the
    blocks it was handed (fresh or reused), i.e. the memory its captured work
    runs in; ``pool_growth``: by how much its capture grew the pool (a
    capture into a shared pool reuses what earlier captures freed)."""

    pool: tuple[int, int]
    taken_bytes: int
    pool_growth: int


@dataclass(frozen=True)
class PoolMemory:
    """A pool's bytes: ``reserved_bytes`` it holds from the device (what graph
    memory costs the KV cache), ``allocated_bytes`` of them in use by live tensors."""

    pool: tuple[int, int]
    reserved_bytes: int
    allocated_bytes: int


class Pool:
    """One graph memory pool: blocks handed out during captures into it."""

    def __init__(self, pool_id: tuple[int, int]) -> None:
        self.id = pool_id
        self.use_count = 0  # graphs that captured into this pool and are still alive
        self._blocks: list[_Block] = []
        self._free: list[_Block] = []
        self._taken = 0  # bytes of every block ever handed out, for GraphMemory

    def mark(self) -> tuple[int, int]:
        """Where the pool's accounts stand (a capture's start)."""
        return self._taken, self.reserved_bytes

    def since(self, mark: tuple[int, int]) -> GraphMemory:
        """What was taken from the pool since ``mark``."""
        taken, reserved = mark
        return GraphMemory(self.id, self._taken - taken, self.reserved_bytes - reserved)

    def __repr__(self) -> str:
        used = sum(b.nbytes for b in self._blocks if b.in_use)
        total = sum(b.nbytes for b in self._blocks)
        return f"<cgsim mock Pool {self.id}: {len(self._blocks)} blocks, {used}/{total} bytes in use>"

    def reap(self) -> None:
        """Free every block whose user storage is gone but was never seen go.
        When a manager, its graphs and their tensors die together as one
        reference cycle, the collector clears the blocks' weak references
        without calling them (the blocks are part of the same garbage); the
        graphs' finalizers then release the pool and bring it and its blocks
        back, still marked in use.  Without this every such pool stayed
        registered as released for good, and each empty_cache scanned all of
        them (a campaign of thousands of scenarios slowed down as it ran)."""
        for blk in self._blocks:
            if blk.in_use and (blk._user is None or blk._user() is None):
                blk._user = None
                _release(blk)

    @property
    def reserved_bytes(self) -> int:
        return sum(b.nbytes for b in self._blocks)

    @property
    def allocated_bytes(self) -> int:
        return sum(b.nbytes for b in self._blocks if b.in_use)

    def _take(self, nbytes: int) -> _Block:
        need = _round(nbytes)
        best = None
        free = self._free
        for i, blk in enumerate(free):
            if blk.in_use or blk.nbytes < need:
                continue
            if best is None or blk.nbytes < free[best].nbytes:
                best = i
                if blk.nbytes == need:
                    break
        if best is not None:
            blk = free.pop(best)
        else:
            blk = _Block(self, need)
            self._blocks.append(blk)
        blk.in_use = True
        self._taken += blk.nbytes
        return blk

    def alloc(self, size, stride, dtype: torch.dtype, nbytes: int | None = None) -> torch.Tensor:
        """A user tensor of this geometry on a block of this pool (``nbytes``:
        its extent_bytes, when the caller knows it)."""
        if nbytes is None:
            nbytes = extent_bytes(size, stride, dtype)
        if nbytes == 0:
            return torch.empty_strided(size, stride, dtype=dtype)
        blk = self._take(nbytes)
        ref = _ref_type(blk.nbytes).from_address(blk.ptr)
        # The user storage keeps the bytes alive even if the pool goes first.
        ref._owner = blk.data
        blk._user = weakref.ref(ref, blk._freed)
        storage = torch.frombuffer(ref, dtype=torch.uint8).untyped_storage()
        return torch.empty(0, dtype=dtype).set_(storage, 0, size, stride)


def extent_bytes(size, stride, dtype: torch.dtype) -> int:
    """Bytes a tensor of this geometry spans from its first element."""
    if 0 in size:
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(size, stride))) * dtype.itemsize


def live_pool_bytes() -> tuple[int, int]:
    """(allocated, reserved) bytes over all live pools."""
    pools = list(_pools.values())
    return sum(p.allocated_bytes for p in pools), sum(p.reserved_bytes for p in pools)


def pool_memory(pool_id: tuple[int, int]) -> PoolMemory:
    """The bytes the pool ``pool_id`` (``CUDAGraph.pool()``, ``graph_pool_handle()``)
    holds now; zero for a pool that no longer exists."""
    pool = _pools.get(tuple(pool_id))
    if pool is None:
        return PoolMemory(tuple(pool_id), 0, 0)
    return PoolMemory(pool.id, pool.reserved_bytes, pool.allocated_bytes)


def alias_of(t: torch.Tensor) -> torch.Tensor:
    """A tensor on the same bytes as ``t`` that does not keep ``t``'s storage alive
    when those bytes belong to a pool block (graph-side handle), and otherwise
    shares ``t``'s storage but not the Python object (so rebinding or dropping the
    user's object is seen by the user, not by the graph)."""
    storage = t.untyped_storage()
    blk = _blocks_by_ptr.get(storage.data_ptr())
    if blk is not None:
        storage = blk.data.untyped_storage()
    return torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.size(), t.stride())


# ------------------------------------------------------------------------- poison


def _int_pattern(dtype: torch.dtype) -> int:
    # Every byte 0xA5: for signed types a large negative number, for unsigned a
    # large positive one. Out of range as an index, obviously not a token id.
    n = dtype.itemsize
    raw = bytes([0xA5]) * n
    fmt = {1: "b", 2: "h", 4: "i", 8: "q"}[n]
    if not dtype.is_signed:
        fmt = fmt.upper()
    return struct.unpack("<" + fmt, raw)[0]


_poison_cache: dict[torch.dtype, object] = {}


def poison_value(dtype: torch.dtype):
    """What the mock writes into memory that a capture produced but no replay has
    computed yet: NaN for floating and complex types, True for bool, the byte
    pattern 0xA5.. for integer types (e.g. int64 -6510615555426900571,
    int32 -1515870811, uint8 165)."""
    v = _poison_cache.get(dtype)
    if v is None:
        if dtype == torch.bool:
            v = True
        elif dtype.is_floating_point or dtype.is_complex:
            v = math.nan
        else:
            v = _int_pattern(dtype)
        _poison_cache[dtype] = v
    return v


# -------------------------------------------------------------------- host memory

# storage data_ptr -> pinned flag. Keyed by storage so that views and slices of a
# host buffer are host memory too; the entry goes when the storage dies (storage
# Python objects are preserved for the storage's lifetime).
_host: dict[int, bool] = {}


def _unmark(ptr: int) -> None:
    _host.pop(ptr, None)


def host_buffer(tensor: torch.Tensor, pinned: bool) -> torch.Tensor:
    """Mark ``tensor`` (a CPU tensor) as *host* memory, pinned or pageable, and
    return it. Unmarked CPU tensors play device memory while the mock is active.

    Copies between host and device memory during a capture follow the host-copy
    rows of SPEC §5: pageable -> RuntimeError, the capture stays valid; pinned with
    non_blocking=True -> recorded, and replay reads the buffer's current contents.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"host_buffer expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(
            f"host_buffer marks CPU tensors as host memory; got a tensor on {tensor.device}. "
            "With the cuda backend use GraphBackend.host_buffer, which pins instead."
        )
    storage = tensor.untyped_storage()
    ptr = storage.data_ptr()
    if ptr == 0:  # empty storage: nothing to copy, nothing to mark
        return tensor
    if ptr not in _host:
        weakref.finalize(storage, _unmark, ptr)
    _host[ptr] = bool(pinned)
    return tensor


def host_count() -> int:
    return len(_host)


def is_host(t: torch.Tensor) -> bool:
    return bool(_host) and t.untyped_storage().data_ptr() in _host


def is_pinned_host(t: torch.Tensor) -> bool:
    return bool(_host) and _host.get(t.untyped_storage().data_ptr(), False)
