"""Dispatch oracle: a brute force over the captured descriptors.

Deliberately not a candidate-list walk: it states what the best graph is
(FULL over PIECEWISE over NONE, then least padding) and can therefore disagree
with any implementation of candidate lists.
"""

from __future__ import annotations

from collections.abc import Iterable

from cgsim.descriptors import Batch, BatchDescriptor, lora_case
from cgsim.modes import CUDAGraphMode
from cgsim.spec.fit import dispatch_choices, padding_waste

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


def expected_dispatch(batch: Batch, captured: Iterable[BatchDescriptor], lora_cases: Iterable[int]) -> BatchDescriptor:
    lora_cases = tuple(lora_cases)
    choices = dispatch_choices(batch, captured, lora_cases)
    if not choices:
        return eager_descriptor(batch, lora_cases)
    from cgsim.spec.candidates import desc_sort_key

    return min(choices, key=desc_sort_key)
