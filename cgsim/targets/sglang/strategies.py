"""Hypothesis strategies for configs as sglang runs them (the ``sglang``
ruleset's engine): the modes that name sglang's two runners' backends, small
bs lists or sglang's default ladder, the request pool, a verify width, LoRA
with one adapter case, two-batch overlap, DP attention and padding disabled
and EAGLE's draft shape (``cgsim.config.SglangOptions``).  Shrinking goes towards one decode runner,
no options and few sizes."""

from __future__ import annotations

from hypothesis import strategies as st

from cgsim.config import ManagerConfig, SglangOptions
from cgsim.modes import CUDAGraphMode

__all__ = ["sglang_configs", "SGLANG_MODES"]

M = CUDAGraphMode
# The decode runner alone first (what shrinking reaches), then with a
# breakable or full prefill runner, prefill and decode both breakable, none.
# Both breakable is rare: in 0.5.23 its decode runner cannot capture
# (docs/sglang.md), and a worker restarts after every failed capture.
SGLANG_MODES = (M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE, M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE, M.FULL,
                M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE, M.FULL, M.NONE, M.PIECEWISE, M.FULL, M.FULL)


@st.composite
def sglang_configs(draw, max_size: int = 64) -> ManagerConfig:
    mode = draw(st.sampled_from(SGLANG_MODES))
    sizes = tuple(sorted(draw(st.lists(st.integers(1, max_size), min_size=1, max_size=5, unique=True))))
    top = max(sizes)
    num_ubatches = draw(st.sampled_from((1, 1, 2)))
    # Servers usually admit more requests than their largest graph holds.  Under
    # two-batch overlap the pool is rounded up to an even count: odd pools below
    # the largest size often, where the rounding decides the largest graph.
    pools = [st.integers(1, max(1, min(32, top + 4))), st.integers(top, top + 8)]
    if num_ubatches == 2:
        pools.append(st.integers(0, max(0, (top - 2) // 2)).map(lambda k: 2 * k + 1))
    max_num_reqs = draw(st.one_of(*pools))
    # The driver's DP ranks run without two-batch overlap (cgsim.targets.sglang).
    dp = draw(st.sampled_from((1, 1, 1, 2, 3))) if num_ubatches == 1 else 1
    # Two-batch overlap aligns verify graphs by requests, not tokens: draw it with a verify width often.
    # 3 and 4 draft tokens: EAGLE with more than one draft step, where the server builds a draft decode runner.
    q = draw(st.sampled_from((1, 2, 4, 2) if num_ubatches == 2 else (1, 1, 1, 2, 3, 4)))
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
        record_nolora_graph=draw(st.booleans()),
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
        sglang=options,
    )
