"""Hypothesis strategies for configs as sglang runs them (the ``sglang``
ruleset's engine): the modes that name sglang's two runners' backends, small
bs lists or sglang's default ladder, the request pool, a verify width, LoRA
with one adapter case, DP attention and padding disabled and EAGLE's draft
shape (``cgsim.spec.sglang_options.SglangOptions``).  Shrinking goes towards one decode
runner, no options and few sizes.

Only what sglang's own start-up check takes (``launch.engine_graph_config``:
``ServerArgs.check_server_args``) is drawn.  Two-batch overlap is not: sglang
takes it only with attention DP or an all-to-all MoE backend
(``validation_hook.check_two_batch_overlap``), and the driver runs neither
with it (its DP ranks run plain decode; an a2a backend puts the runners on
the gathered-buffer path, ``require_attn_tp_gather``, which one fake rank
does not stand for).  Every two-batch-overlap config the driver runs is a
launch sglang refuses."""

from __future__ import annotations

from hypothesis import strategies as st

from cgsim.config import ManagerConfig
from cgsim.modes import CUDAGraphMode
from cgsim.spec.sglang_options import SglangOptions

__all__ = ["sglang_configs", "SGLANG_MODES"]

M = CUDAGraphMode
# The decode runner alone first (what shrinking reaches), then with a
# breakable or full prefill runner, prefill and decode both breakable, none.
# Both breakable is rare: in 0.5.23 its decode runner cannot capture
# (docs/sglang.md), and a worker restarts after every failed capture.
SGLANG_MODES = (M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE, M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE, M.FULL,
                M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE, M.FULL, M.NONE, M.PIECEWISE, M.FULL, M.FULL)


@st.composite
def sglang_configs(draw, max_size: int = 64, lora_skips_inactive: bool = True) -> ManagerConfig:
    """``lora_skips_inactive``: the tree has a LoRA backend that skips inactive
    dense LoRA (``--lora-backend triton_v2``, ``compat.Tree.nolora_from_backend``);
    without it that choice is refused by sglang's parser and not drawn."""
    mode = draw(st.sampled_from(SGLANG_MODES))
    sizes = tuple(sorted(draw(st.lists(st.integers(1, max_size), min_size=1, max_size=5, unique=True))))
    top = max(sizes)
    # No two-batch overlap: sglang refuses every such launch the driver runs (above).
    num_ubatches = 1
    # Servers usually admit more requests than their largest graph holds.
    max_num_reqs = draw(st.one_of(st.integers(1, max(1, min(32, top + 4))), st.integers(top, top + 8)))
    dp = draw(st.sampled_from((1, 1, 1, 2, 3)))
    # 3 and 4 draft tokens: EAGLE with more than one draft step, where the server builds a draft decode runner.
    q = draw(st.sampled_from((1, 1, 1, 2, 3, 4)))
    lora_cases = draw(st.sampled_from(((0,), (0,), (0, 1), (0, 3))))
    # EAGLE's draft shape: a chain (topk 1, draft tokens - 1 steps) mostly, else
    # topk > 1 trees with their own step count; the launch decides what sglang takes.
    topk = draw(st.sampled_from((1, 1, 1, 2, 4))) if q > 1 and dp == 1 else 1
    steps = draw(st.one_of(st.none(), st.integers(1, 4))) if q > 1 and dp == 1 and topk > 1 else None
    threshold = draw(st.sampled_from((2, 4, 8)))
    options = SglangOptions(
        dp_size=dp,
        disable_padding=draw(st.integers(0, 3)) == 3,
        default_bs_list=draw(st.integers(0, 3)) == 3,
        record_nolora_graph=draw(st.booleans()) if lora_skips_inactive else False,
        # Few request slots often: a FULL prefill graph must refuse batches of more requests.
        full_prefill_max_req=draw(st.one_of(st.none(), st.integers(1, min(max_num_reqs, 3)),
                                            st.integers(1, max_num_reqs))),
        eagle_topk=topk,
        eagle_steps=steps,
    )
    if dp > 1:
        # The driver's DP ranks run plain decode graphs (cgsim.targets.sglang).
        mode, q, lora_cases, num_ubatches = M.FULL_DECODE_ONLY, 1, (0,), 1
    # Decode graphs hold bs x width tokens: the sweep and the batches reach them all.
    max_capture = max(max(sizes), min(max(sizes), max_num_reqs + 1) * q)
    return ManagerConfig(
        mode=mode, capture_sizes=sizes, max_num_reqs=max_num_reqs, max_capture_size=max_capture,
        decode_query_len=q, lora_cases=lora_cases, num_ubatches=num_ubatches, ubatch_threshold=threshold,
        engine_options=(options,),
    )
