"""Toy attention backends at each support level and a metadata builder that
tracks the lifetime of every metadata object it hands out.

Why the builder keeps persistent buffers: a FULL graph bakes in the addresses
of the tensors its kernels read.  Metadata handed to a capture is a set of
views into the builder's persistent buffers; at runtime the builder writes the
real batch into the *same* buffers so the replayed graph sees it.  Rebinding a
buffer to a new tensor after capture leaves the graph reading the old memory
(stale), which is the METADATA-LIVE bug class.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Callable

import torch

from cgsim.modes import AttentionSupport
from cgsim.trace import MetadataRecord

__all__ = ["AttentionBackendSpec", "ATTENTION_BACKENDS", "backend_for", "AttentionMetadata", "MetadataBuilder"]


@dataclass(frozen=True)
class AttentionBackendSpec:
    name: str
    support: AttentionSupport
    # An attention-like op (Inkling's sconv) that runs inside the piecewise
    # pieces when graphs are breakable, reading metadata captured with them.
    in_graph_metadata_op: bool = False


ATTENTION_BACKENDS = {
    b.name: b
    for b in (
        AttentionBackendSpec("eager-only", AttentionSupport.NEVER),
        AttentionBackendSpec("single-token-decode", AttentionSupport.UNIFORM_SINGLE_TOKEN_DECODE),
        AttentionBackendSpec("uniform-batch", AttentionSupport.UNIFORM_BATCH),
        AttentionBackendSpec("inkling", AttentionSupport.UNIFORM_BATCH, in_graph_metadata_op=True),
        AttentionBackendSpec("flash", AttentionSupport.ALWAYS),
    )
}


def backend_for(support: AttentionSupport, breakable: bool) -> AttentionBackendSpec:
    """The toy backend a config's declared support level stands for.  With
    breakable graphs and UNIFORM_BATCH support we use the Inkling-like one."""
    if support == AttentionSupport.UNIFORM_BATCH and breakable:
        return ATTENTION_BACKENDS["inkling"]
    for spec in ATTENTION_BACKENDS.values():
        if spec.support == support and not spec.in_graph_metadata_op:
            return spec
    raise ValueError(f"no toy attention backend for support {support!r}")


class AttentionMetadata:
    """One metadata object.  Tensors are views of the builder's persistent
    buffers; ``plan`` is per-object state the backend fills lazily during the
    first forward (as FlashInfer-style planners do), which is why a capture must
    not reuse the warmup's object."""

    __slots__ = (
        "id", "num_reqs", "num_tokens", "max_query_len", "for_capture", "kernel",
        "query_start_loc", "seq_lens", "slot_mapping", "plan", "__weakref__",
    )

    def __init__(self, id: int, num_reqs: int, num_tokens: int, max_query_len: int, for_capture: bool, kernel: str,
                 query_start_loc: torch.Tensor, seq_lens: torch.Tensor, slot_mapping: torch.Tensor, plan: torch.Tensor):
        self.id = id
        self.num_reqs = num_reqs
        self.num_tokens = num_tokens
        self.max_query_len = max_query_len
        self.for_capture = for_capture
        self.kernel = kernel
        self.query_start_loc = query_start_loc
        self.seq_lens = seq_lens
        self.slot_mapping = slot_mapping
        self.plan = plan


class MetadataBuilder:
    """Builds attention metadata into persistent buffers and records each object."""

    def __init__(self, backend: AttentionBackendSpec, max_num_reqs: int, max_num_tokens: int, device: torch.device,
                 record: Callable[[MetadataRecord], None]):
        self.backend = backend
        self.device = device
        self._record = record
        self._ids = itertools.count(1)
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.generation = 0
        self.allocate_buffers()
        self._objects: dict[int, weakref.ref] = {}
        self._buffer_refs: dict[int, tuple] = {}

    def allocate_buffers(self) -> None:
        r, t = self.max_num_reqs, self.max_num_tokens
        self.generation += 1
        # One allocation, three buffers: a batch is written with a single copy
        # (see build); each buffer is still its own tensor a graph reads.
        flat = torch.zeros(2 * r + 1 + t, dtype=torch.int64, device=self.device)
        flat[2 * r + 1:] = -1
        self._flat = flat
        self.query_start_loc = flat[: r + 1]
        self.seq_lens = flat[r + 1: 2 * r + 1]
        self.slot_mapping = flat[2 * r + 1:]
        self._views = (self.query_start_loc, self.seq_lens, self.slot_mapping)

    def buffer_contents(self, query_lens: list[int], seq_lens: list[int], slots: list[int]) -> torch.Tensor:
        """What the three buffers hold for a batch, padding included, as one
        host tensor in the builder's layout (build writes it with one copy)."""
        r, t = self.max_num_reqs, self.max_num_tokens
        nr, nt = len(query_lens), len(slots)
        qsl = [0]
        for q in query_lens:
            qsl.append(qsl[-1] + q)
        qsl += [qsl[-1]] * (r - nr)
        return torch.tensor(qsl + list(seq_lens) + [0] * (r - nr) + list(slots) + [-1] * (t - nt), dtype=torch.int64)

    def kernel_for(self, for_capture: bool) -> str:
        """Which attention kernel a metadata object selects.  Captured metadata
        selects the backend's graph kernel, which is only right for the batch
        shapes the declared support level covers."""
        if not for_capture:
            return "varlen"
        support = self.backend.support
        if support == AttentionSupport.ALWAYS:
            return "varlen"
        if support == AttentionSupport.UNIFORM_BATCH:
            return "uniform"
        return "single-token"

    def build(self, query_lens: list[int], seq_lens: list[int], slots: list[int], num_reqs_padded: int,
              num_tokens_padded: int, max_query_len: int, for_capture: bool, phase: str,
              contents: torch.Tensor | None = None) -> AttentionMetadata:
        """Write a (padded) batch into the persistent buffers and return a
        metadata object viewing them.  Padding requests are empty; padding
        tokens get slot -1 (the KV table's padding row).  ``contents``: the
        batch's ``buffer_contents`` when the caller has them already."""
        nr, nt = len(query_lens), sum(query_lens)
        if num_reqs_padded < nr or num_tokens_padded < nt:
            raise ValueError(f"metadata padding below the batch: reqs {num_reqs_padded} < {nr} or tokens {num_tokens_padded} < {nt}")
        if num_reqs_padded > self.max_num_reqs or num_tokens_padded > self.max_num_tokens:
            raise ValueError(
                f"metadata for {num_reqs_padded} requests / {num_tokens_padded} tokens exceeds the builder's buffers "
                f"({self.max_num_reqs} / {self.max_num_tokens})"
            )
        if contents is None:
            contents = self.buffer_contents(query_lens, seq_lens, slots)
        # The whole buffer is rewritten, padding included: a graph captured with a
        # longer view than this batch's (vLLM 0.32's unpadded breakable pieces)
        # must read empty requests and -1 slots there, not the last batch's rows.
        current = (self.query_start_loc, self.seq_lens, self.slot_mapping)
        if all(a is b for a, b in zip(current, self._views)):
            self._flat.copy_(contents)
        else:  # a buffer was rebound on its own: write each where it is now
            r = self.max_num_reqs
            for buf, part in zip(current, (contents[: r + 1], contents[r + 1: 2 * r + 1], contents[2 * r + 1:])):
                buf.copy_(part[: buf.shape[0]])
        md_id = next(self._ids)
        md = AttentionMetadata(
            md_id, num_reqs_padded, num_tokens_padded, max_query_len, for_capture, self.kernel_for(for_capture),
            self.query_start_loc[: num_reqs_padded + 1], self.seq_lens[:num_reqs_padded],
            self.slot_mapping[:num_tokens_padded], torch.zeros(1, device=self.device),
        )
        self._objects[md_id] = weakref.ref(md)
        # The graph keeps reading these storages, not the Python object.
        self._buffer_refs[md_id] = tuple(weakref.ref(t) for t in (self.query_start_loc, self.seq_lens, self.slot_mapping))
        self._record(
            MetadataRecord(
                id=md_id, num_reqs=num_reqs_padded, num_tokens=num_tokens_padded, max_query_len=max_query_len,
                for_capture=for_capture,
                # Buffer identities by allocation generation: data pointers of
                # freed CPU tensors get reused and would hide a rebind.
                buffers=tuple(self.generation * 3 + i for i in range(3)),
                state=(md_id,), phase=phase,
            )
        )
        return md

    def buffers_alive(self, md_id: int) -> bool:
        """Whether the buffers metadata ``md_id`` viewed are still the ones the
        builder writes (not freed, not rebound)."""
        refs = self._buffer_refs.get(md_id)
        if refs is None:
            return False
        current = (self.query_start_loc, self.seq_lens, self.slot_mapping)
        return all(r() is not None and r() is cur for r, cur in zip(refs, current))
