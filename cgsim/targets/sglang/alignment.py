"""sglang's own answer for the batch-size alignment of a launch.

The SGLang handles (the target's decode and prefill runners, EAGLE's draft
runners) ask the imported tree's ``get_cuda_graph_batch_size_alignment``
(``sglang/srt/utils/common.py``) inside the published server config and the
rank's parallel state, as the runners' sizing asks it, and hand the answer to
the recorder as ``engine_alignment`` (``cgsim.trace.EngineAlignment``, written
once into the trace's header).  The alignment properties judge the graphs by
that answer; ``cgsim.spec.sglang.batch_size_alignment`` is cgsim's copy of the
rule, held to this answer by tests/cgsim/targets/sglang/test_sglang_alignment.py.
"""

from __future__ import annotations

from typing import Any, Callable

from sglang.srt.model_executor.runner import DecodeCudaGraphRunner
from sglang.srt.model_executor.runner import base_cuda_graph_runner as base_module

from cgsim.targets.sglang import compat
from cgsim.trace import EngineAlignment

__all__ = ["alignment_helper", "engine_alignment", "decode_gathers"]


def alignment_helper() -> Callable[..., int]:
    """sglang's get_cuda_graph_batch_size_alignment, as the decode sizing looks
    it up (base_cuda_graph_runner's global, imported from sglang.srt.utils:
    a tree that rebinds or edits it is asked what it says)."""
    return base_module.get_cuda_graph_batch_size_alignment


def engine_alignment(gathers: bool | None, prefill: bool) -> EngineAlignment:
    """What sglang's own helper answers for the published launch (two-batch
    overlap, attention TP and CP, DP attention's gathered buffers), asked as
    the runners ask it: the decode sizing (get_batch_sizes_to_capture,
    base_cuda_graph_runner.py 0.5.23: 82-84) with the runner's gather need
    where the tree passes it (``gathers``, ``decode_gathers``; None: the helper decides,
    as older trees and the draft runners have it), the prefill bucket helper
    (get_prefill_num_tokens_to_capture -> get_cuda_graph_max_batch_size,
    utils/common.py: 4185) without one, only where the tree aligns prefill
    buckets (``prefill``)."""
    helper = alignment_helper()
    decode = int(helper(gathered_buffer_required=gathers) if gathers is not None else helper())
    return EngineAlignment(decode=decode, prefill=int(helper()) if prefill else None,
                           helper=f"{helper.__module__}.{helper.__name__}")


def decode_gathers(mr: Any) -> bool | None:
    """The gather need the decode runner passes to its sizing (0.5.22+), None
    where the tree's sizing asks the process itself."""
    if compat.tree().decode_sizing_takes_gathers:
        return any(DecodeCudaGraphRunner.decode_graph_gather_requirements(mr))
    return None
