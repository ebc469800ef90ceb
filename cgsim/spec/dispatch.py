"""Dispatch oracle: a brute force over the captured descriptors.

Deliberately not a candidate-list walk: it states what the best graph is
(FULL over PIECEWISE over NONE, then least padding) and can therefore disagree
with any implementation of candidate lists.
"""

from __future__ import annotations

from collections.abc import Iterable

from cgsim.descriptors import Batch, BatchDescriptor, compatible, lora_case, padding_waste
from cgsim.modes import RUNTIME_RANK, CUDAGraphMode

__all__ = ["dispatch_choices", "expected_dispatch", "eager_descriptor", "padding_key"]


def padding_key(desc: BatchDescriptor, batch: Batch) -> tuple[int, int]:
    return padding_waste(desc, batch)


def eager_descriptor(batch: Batch, lora_cases: Iterable[int]) -> BatchDescriptor:
    return BatchDescriptor(
        CUDAGraphMode.NONE,
        batch.num_tokens,
        batch.num_reqs,
        num_active_loras=lora_case(batch.num_active_loras, lora_cases),
        num_ubatches=batch.num_ubatches,
    )


def dispatch_choices(batch: Batch, captured: Iterable[BatchDescriptor], lora_cases: Iterable[int]) -> frozenset[BatchDescriptor]:
    """Every descriptor dispatch may correctly return for ``batch``: the
    compatible captured ones of the highest mode that pad least.  Empty when
    nothing captured fits (dispatch must then run eagerly)."""
    lora_cases = tuple(lora_cases)
    fits = [d for d in captured if compatible(d, batch, lora_cases)]
    if not fits:
        return frozenset()
    best_rank = max(RUNTIME_RANK[d.cg_mode] for d in fits)
    fits = [d for d in fits if RUNTIME_RANK[d.cg_mode] == best_rank]
    least = min(padding_key(d, batch) for d in fits)
    return frozenset(d for d in fits if padding_key(d, batch) == least)


def expected_dispatch(batch: Batch, captured: Iterable[BatchDescriptor], lora_cases: Iterable[int]) -> BatchDescriptor:
    lora_cases = tuple(lora_cases)
    choices = dispatch_choices(batch, captured, lora_cases)
    if not choices:
        return eager_descriptor(batch, lora_cases)
    from cgsim.spec.candidates import desc_sort_key

    return min(choices, key=desc_sort_key)
