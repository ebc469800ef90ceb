"""Hypothesis strategies: manager configs, batches a scheduler can produce for a
config, and Scenarios.  Shrinking goes towards few capture sizes, few steps and
small batches, so a counterexample reads like a hand-written test."""

from __future__ import annotations

from hypothesis import strategies as st

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.modes import AttentionSupport, CUDAGraphMode
from cgsim.scenario import Scenario, Step
from cgsim.spec import scheduler
from cgsim.spec.rulesets import RULESETS

__all__ = ["capture_sizes", "configs", "batches", "scenarios", "RULESET_NAMES"]

RULESET_NAMES = tuple(RULESETS)
MODES = tuple(CUDAGraphMode)


@st.composite
def capture_sizes(draw, max_size: int = 512) -> tuple[int, ...]:
    """Tiny hand-picked lists most of the time; realistic ladders (1, 2, 4, 8,
    then steps of 8 or 16) up to ``max_size`` sometimes."""
    if draw(st.integers(0, 9)) < 8:
        sizes = draw(st.lists(st.integers(1, min(32, max_size)), min_size=1, max_size=4, unique=True))
        return tuple(sorted(sizes))
    top = draw(st.sampled_from([s for s in (16, 32, 64, 128, 256, 512) if s <= max_size] or [max_size]))
    step = draw(st.sampled_from((8, 16)))
    ladder = [s for s in (1, 2, 4, 8) if s <= top] + list(range(16, top + 1, step))
    return tuple(sorted(set(ladder)))


@st.composite
def spec_schedules(draw, max_spec_tokens: int, max_num_reqs: int):
    bounds = sorted(draw(st.lists(st.integers(1, max(1, max_num_reqs)), min_size=1, max_size=3, unique=True)))
    entries, start = [], 1
    for end in bounds:
        if end < start:
            continue
        entries.append((start, end, draw(st.integers(0, max_spec_tokens))))
        start = end + 1
    return tuple(entries) if entries else ((1, max(1, max_num_reqs), max_spec_tokens),)


@st.composite
def configs(draw, max_size: int = 512) -> ManagerConfig:
    mode = draw(st.sampled_from(MODES))
    supports = [s for s in AttentionSupport if not (mode == CUDAGraphMode.FULL and s == AttentionSupport.NEVER)]
    support = draw(st.sampled_from(supports))
    sizes = draw(capture_sizes(max_size))
    max_num_reqs = draw(st.integers(1, max(1, min(64, max(sizes)))))
    q = draw(st.integers(1, 5))
    breakable = draw(st.booleans())
    varlen = q > 1 and support == AttentionSupport.ALWAYS and draw(st.integers(0, 4)) == 0
    schedule = None
    if q > 1 and not varlen and draw(st.integers(0, 3)) == 0:
        schedule = draw(spec_schedules(q - 1, max_num_reqs))
    lora_cases = draw(st.sampled_from([(0,), (0,), (0,), (0, 1), (0, 1, 2), (0, 2, 4)]))
    num_ubatches = draw(st.sampled_from((1, 1, 1, 2)))
    ubatch_threshold = draw(st.sampled_from((4, 8, 32)))
    compiled = draw(st.integers(0, 4)) > 0
    split = draw(st.integers(0, 4)) > 0
    max_capture = max(sizes) + draw(st.sampled_from((0, 0, 0, 1, 8)))
    return ManagerConfig(
        mode=mode, capture_sizes=sizes, max_num_reqs=max_num_reqs, max_capture_size=max_capture,
        decode_query_len=q, spec_schedule=schedule, lora_cases=lora_cases, breakable=breakable,
        varlen_decode=varlen, num_ubatches=num_ubatches, ubatch_threshold=ubatch_threshold,
        attention_support=support, attention_split=split, compiled_piecewise=compiled,
    )


@st.composite
def batches(draw, config: ManagerConfig) -> Batch:
    """Batches the scheduler can produce for ``config`` (``cgsim.spec.scheduler``):
    never more requests than max_num_reqs; pure decodes with the length the
    (dynamic) speculative schedule gives their request count (any lengths up
    to it with varlen decode); batches with prefills of any shape; active
    LoRAs up to the largest case; micro-batched as the runner would."""
    max_tokens = (config.max_capture_size or 1) + 8
    kind = draw(st.sampled_from(("decode", "decode", "mixed", "prefill", "varlen")))
    max_reqs = config.max_num_reqs
    prefill = kind in ("mixed", "prefill") or (kind == "varlen" and not config.varlen_decode)
    if kind == "decode":
        r = draw(st.integers(1, max_reqs))
        q = scheduler.decode_query_len(config, r)
        r = max(1, min(r, max_tokens // q))
        lens = (scheduler.decode_query_len(config, r),) * r
    elif kind == "prefill":
        lens = (draw(st.integers(1, max_tokens)),)
    elif kind == "varlen":
        r = draw(st.integers(1, max_reqs))
        lens = tuple(draw(st.lists(st.integers(1, config.decode_query_len), min_size=1, max_size=r)))
    else:
        lens = tuple(draw(st.lists(st.integers(1, 16), min_size=1, max_size=max_reqs)))
    while sum(lens) > max_tokens and len(lens) > 1:
        lens = lens[:-1]
    if sum(lens) > max_tokens:
        lens = (max_tokens,)
    loras = draw(st.integers(0, max(config.lora_cases)))
    return scheduler.make_batch(config, lens, loras, has_prefill=prefill)


@st.composite
def scenarios(draw, ruleset: str | None = None, max_size: int = 128, config: ManagerConfig | None = None) -> Scenario:
    cfg = config if config is not None else draw(configs(max_size))
    rs = ruleset if ruleset is not None else draw(st.sampled_from(RULESET_NAMES))
    steps: list[Step] = []
    # Optional parts are drawn so that shrinking (towards 0) removes them.
    if draw(st.integers(0, 5)) == 5:
        steps.append(Step.dispatch(draw(batches(cfg))))
    steps.append(Step.capture())
    steps += [Step.dispatch(b) for b in draw(st.lists(batches(cfg), min_size=1, max_size=4))]
    if draw(st.integers(0, 3)) == 3:
        steps.append(Step.release())
        steps += [Step.dispatch(b) for b in draw(st.lists(batches(cfg), max_size=1))]
        steps.append(Step.capture())
        steps += [Step.dispatch(b) for b in draw(st.lists(batches(cfg), min_size=1, max_size=2))]
    return Scenario(config=cfg, steps=tuple(steps), ruleset=rs, seed=draw(st.integers(0, 3)))
