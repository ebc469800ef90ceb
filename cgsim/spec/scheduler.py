"""The one model of which batches a scheduler can produce for a config.

Strategies draw from it, scenarios are validated against it, and the
properties that reason about "every batch the scheduler can produce"
(CAPTURE-USEFUL, the dispatch sweep) enumerate it.  What it encodes, from
vLLM's scheduler and model runner:

- never more requests than max_num_reqs (max_num_seqs), never more active
  LoRA adapters than the largest LoRA case (max_loras);
- a request of a pure decode batch verifies the drafts the runner proposed
  for it after the last step it ran in, as many as the dynamic schedule gives
  *that* step's batch (``v1/core/sched/scheduler.py``
  ``num_spec_tokens_to_schedule``, never trimmed when the batch shrinks), or
  fewer near max_model_len (the scheduler caps a request's tokens there), or
  fewer with varlen decode (adaptive verification): so each request's query
  length is at most the longest decode length of a batch of at least as many
  requests (``longest_decode_len``), usually the schedule's length for the
  request count or for a larger batch that shrank (requests finished, were
  preempted or skipped); in a decode whose lengths differ, the longest of any
  batch size (a request at max_model_len sat out steps and rejoined:
  ``longest_mixed_decode_len``); checked against vLLM's own scheduler by
  ``tests/cgsim/targets/vllm/test_vllm_scheduler.py`` and every served scenario;
- a batch with a prefill may have any shape, and is never decode-graph
  eligible (the runner passes no uniform length and no max_query_len for it);
- micro-batching (DBO) splits uniform decode batches of at least the DBO
  threshold (and at least one token per micro-batch).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from itertools import groupby
from typing import Iterable

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape

__all__ = [
    "decode_query_len",
    "decode_query_lens",
    "longest_decode_len",
    "longest_mixed_decode_len",
    "ubatches_for",
    "make_batch",
    "why_unschedulable",
    "why_not_producible",
    "is_decode_batch",
    "decode_shapes",
    "producible_batches",
    "probe_shapes",
    "SWEEP_BOUND",
    "SweepPlan",
    "sweep_token_limit",
    "sweep_plan",
]


def decode_query_len(config: ManagerConfig, num_reqs: int) -> int:
    """The query length each request of a pure decode of ``num_reqs`` requests gets."""
    return config.scheduler_decode_query_len(num_reqs)


def decode_query_lens(config: ManagerConfig) -> tuple[int, ...]:
    """Every decode query length the scheduler can produce, sorted."""
    return config.scheduler_decode_query_lens()


def longest_decode_len(config: ManagerConfig, num_reqs: int) -> int:
    """The longest query length a request of a pure decode of ``num_reqs``
    requests can have (every length from 1 up to it is producible)."""
    return config.scheduler_longest_decode_len(num_reqs)


def ubatches_for(config: ManagerConfig, query_lens: tuple[int, ...]) -> int:
    """How many micro-batches the runner splits a batch into (DBO): every
    batch of at least ``ubatch_threshold`` tokens.  vLLM's runner holds
    uniform decodes of the full speculative length to
    dbo_decode_token_threshold and every other batch (prefills, shorter
    decodes) to dbo_prefill_token_threshold (``dp_utils``, 0.30+); cgsim's
    config has one threshold, and the vLLM target sets both to it."""
    return _eligible_ubatches(config, sum(query_lens))[-1]


def make_batch(config: ManagerConfig, query_lens: Iterable[int], num_active_loras: int = 0,
               has_prefill: bool = False) -> Batch:
    """The batch the scheduler hands in for these requests, micro-batch count included."""
    lens = tuple(query_lens)
    return Batch(lens, num_active_loras, ubatches_for(config, lens), has_prefill=has_prefill)


def why_unschedulable(config: ManagerConfig, batch: Batch) -> str | None:
    """Why the scheduler never hands in ``batch`` for ``config`` (None: it can)."""
    if batch.num_reqs > config.max_num_reqs:
        return (f"the batch has {batch.num_reqs} requests but max_num_reqs is {config.max_num_reqs}; "
                "the scheduler never schedules more, so shrink the batch or raise max_num_reqs")
    max_loras = max(config.lora_cases)
    if batch.num_active_loras > max_loras:
        return (f"the batch has {batch.num_active_loras} active LoRAs but the largest LoRA case is {max_loras} "
                "(max_loras); add a larger case to lora_cases or use fewer adapters")
    return None


def why_not_producible(config: ManagerConfig, batch: Batch) -> str | None:
    """Why ``batch`` is outside the set the model says the scheduler
    produces for ``config`` (None: inside): the limits of
    ``why_unschedulable``, a decode batch's query lengths
    (``is_decode_batch``), and the micro-batch counts the runner may use."""
    why = why_unschedulable(config, batch)
    if why is not None:
        return why
    if not batch.has_prefill and not is_decode_batch(config, batch.query_lens):
        mixed = len(set(batch.query_lens)) > 1
        longest = (longest_mixed_decode_len if mixed else longest_decode_len)(config, batch.num_reqs)
        return (f"the decode batch of {batch.num_reqs} requests has a request of {batch.max_query_len} tokens, but "
                f"the model's {'mixed-length ' if mixed else ''}decodes of that many requests are at most "
                f"{longest} tokens long")
    if batch.num_ubatches not in _eligible_ubatches(config, batch.num_tokens):
        return (f"{batch.num_ubatches} micro-batches for {batch.num_tokens} tokens: the model splits only batches of "
                f"at least {_ubatch_floor(config)} tokens, into {config.num_ubatches}")
    return None


def longest_mixed_decode_len(config: ManagerConfig, num_reqs: int) -> int:
    """The longest query length in a pure decode of ``num_reqs`` requests
    whose lengths differ: the longest of any batch size.  A request at
    max_model_len verifies fewer drafts, and under async scheduling sits out
    the steps its in-flight tokens may finish it in
    (``Scheduler.schedule``: ``num_new_tokens == 0``); when it rejoins, the
    others verify the drafts chosen for the smaller batch they ran in
    meanwhile (seen: vLLM 0.32, two requests, one drafting two tokens alone:
    Batch(query_lens=[3, 1]))."""
    return longest_decode_len(config, 1) if num_reqs > 1 else longest_decode_len(config, num_reqs)


def is_decode_batch(config: ManagerConfig, lens: tuple[int, ...]) -> bool:
    """Whether the scheduler can hand in ``lens`` as a pure decode batch:
    every length at most the longest decode length of its request count
    (of any batch size where the lengths differ)."""
    if len(set(lens)) > 1:
        return max(lens) <= longest_mixed_decode_len(config, len(lens))
    return max(lens) <= longest_decode_len(config, len(lens))


def decode_shapes(config: ManagerConfig) -> set[tuple[int, ...]]:
    """Every uniform decode batch (as query lengths) within the largest capture size."""
    shapes = set()
    for r in range(1, min(config.max_num_reqs, config.max_capture_size) + 1):
        for q in range(1, min(longest_decode_len(config, r), config.max_capture_size // r) + 1):
            shapes.add((q,) * r)
    return shapes


def producible_batches(config: ManagerConfig, shapes: Iterable[tuple[int, ...]], lora: int,
                       ubatches: int) -> list[Batch]:
    """Every shape as a batch with a prefill (any shape can be prompt chunks),
    and as a decode batch where the scheduler can produce it as one, with
    ``ubatches`` micro-batches where the runner can split it that way."""
    out = []
    for lens in shapes:
        if len(lens) > config.max_num_reqs:
            continue
        for prefill in (False, True):
            if not prefill and not is_decode_batch(config, lens):
                continue
            if ubatches == 1:
                # A batch the runner may also run whole (DBO is the runner's
                # choice per step, e.g. when another DP rank cannot split).
                out.append(Batch(lens, lora, 1, has_prefill=prefill))
            elif ubatches_for(config, lens) == ubatches:
                out.append(make_batch(config, lens, lora, has_prefill=prefill))
    return out


def _nonuniform(r: int, t: int, mq: int) -> tuple[int, ...] | None:
    """r positive query lengths summing to t, the largest exactly mq, not all equal."""
    if r < 2 or mq < 2 or r > t or mq > t - (r - 1) or r * mq <= t:
        return None
    rest, n = t - mq, r - 1
    base, extra = divmod(rest, n)
    lens = (mq,) + (base + 1,) * extra + (base,) * (n - extra)
    if base < 1 or max(lens) != mq or len(set(lens)) < 2:
        return None
    return lens


def probe_shapes(config: ManagerConfig, d: BatchDescriptor) -> set[tuple[int, ...]]:
    """Query-length tuples the scheduler can produce that fit ``d`` most
    tightly: the batches on which ``d`` has its best chance to be chosen.

    Producible: one request of any length; uniform decode batches of any
    length up to the longest decode length of their request count;
    equal-length batches whose length is no decode length at all (prefill
    chunks); non-uniform batches.  An equal-length batch whose length is a
    decode length longer than any batch of that many requests verifies is
    not producible: that is how a decode graph for a length the schedule
    never gives that many requests shows as dead.

    Compatibility only tightens as a batch grows towards ``d`` (more tokens,
    more requests, a larger max_query_len exclude competitors), so the
    corners are: ``d``'s own token count (and one less), the most requests
    ``d`` admits (and one less), max_query_len at ``d``'s bound or as large as
    the batch allows.
    """
    max_size, max_reqs = config.max_capture_size, config.max_num_reqs
    shapes: set[tuple[int, ...]] = set()
    for t in {d.num_tokens, d.num_tokens - 1, d.uniform_token_count or 0, d.max_query_len or 0}:
        if 1 <= t <= max_size:
            shapes.add((t,))  # one request: a prefill chunk (or decode) of t tokens
    if d.uniform_token_count is not None:
        return shapes
    r_cap = min(max_reqs, d.num_reqs if d.num_reqs is not None else max_reqs)
    decode_lens = set(decode_query_lens(config))
    t = min(d.num_tokens, max_size)
    for r in {min(r_cap, t), min(r_cap, t) - 1}:
        if r >= 2:
            u = t // r
            # Equal-length requests: a decode batch when r requests may verify
            # u tokens each, else a prefill that happens to be even.
            if u not in decode_lens or u <= longest_decode_len(config, r):
                shapes.add((u,) * r)
    for t in (d.num_tokens, d.num_tokens - 1):
        if t < 3 or t > max_size:
            continue
        for r in {min(r_cap, t - 1), min(r_cap, t - 1) - 1}:
            if r < 2:
                continue
            lo = -(-t // r) + (1 if t % r == 0 else 0)
            for mq in {lo, t - r + 1, d.max_query_len or lo}:
                lens = _nonuniform(r, t, mq)
                if lens is not None:
                    shapes.add(lens)
    return shapes


# -- the dispatch sweep --------------------------------------------------------------
# Up to this many distinct dispatch inputs a sweep asks them all; above it,
# every boundary class and a seeded sample (SweepPlan.exhaustive says which).
SWEEP_BOUND = 20_000


@dataclass(frozen=True)
class SweepPlan:
    shapes: tuple[BatchShape, ...]
    coverage: str  # "exhaustive" | "boundary" | "boundary+sample"
    space: int  # distinct dispatch inputs the scheduler can produce for the config
    seeded: bool = False  # whether the seed chose any of the shapes (a sample, or a subset of the boundaries)


def sweep_token_limit(config: ManagerConfig) -> int:
    """Token counts a sweep covers: past the largest capture size, far enough
    that the first eager batch of every decode length is in."""
    return config.max_capture_size + config.decode_query_len + 1


def _ubatch_floor(config: ManagerConfig) -> int | None:
    """The fewest tokens the runner micro-batches (None: no DBO)."""
    return max(config.ubatch_threshold, config.num_ubatches) if config.num_ubatches > 1 else None


def _eligible_ubatches(config: ManagerConfig, tokens: int) -> tuple[int, ...]:
    floor = _ubatch_floor(config)
    if floor is None or tokens < floor:
        return (1,)
    # The runner may also run an eligible batch whole (DP ranks that cannot split).
    return (1, config.num_ubatches)


def _decode_shapes(config: ManagerConfig, limit: int, reqs: Iterable[int]) -> list[tuple[int, int, int, int | None]]:
    """(num_reqs, num_tokens, max_query_len, uniform) of pure decodes: every
    length up to the longest of the request count, uniform, and mixed with
    shorter ones (dispatch sees the count, the total and the longest
    request; the fewest tokens stand for them)."""
    out = []
    for r in reqs:
        uniform = longest_decode_len(config, r)
        for m in range(1, max(uniform, longest_mixed_decode_len(config, r)) + 1):
            if m <= uniform and r * m <= limit:
                out.append((r, r * m, m, m))
            if r >= 2 and m >= 2 and m + r - 1 <= limit:
                out.append((r, m + r - 1, m, None))
    return out


def _lora_counts(config: ManagerConfig, r: int, exhaustive: bool) -> list[int]:
    top = min(r, max(config.lora_cases))
    if exhaustive:
        return list(range(top + 1))
    wanted = {0, 1, top} | set(config.lora_cases) | {c + 1 for c in config.lora_cases}
    return sorted(a for a in wanted if 0 <= a <= top)


def _prefill_reqs(config: ManagerConfig, t: int, marks: Iterable[int] = ()) -> list[int]:
    """Representative request splits of t tokens with a prefill: one prompt;
    every running request decoding plus one prompt chunk; as many requests
    as allowed; and the request counts at which dispatch may change (each
    ``marks`` value and one past it)."""
    R = config.max_num_reqs
    top = min(R, t)
    wanted = {1, top, min(R, 1 + (t - 1) // config.decode_query_len)}
    for m in marks:
        wanted |= {m, m + 1}
    return sorted(r for r in wanted if 1 <= r <= top)


@lru_cache(maxsize=256)
def _prefill_splits(config: ManagerConfig, limit: int, marks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """``_prefill_reqs`` of every token count from 1 to ``limit`` (index t - 1).
    Cached: a plan counts its space with them and then adds them."""
    R, q = config.max_num_reqs, config.decode_query_len
    # A token count's splits depend on (the most requests, the chunk's) only,
    # and past max_num_reqs * q both are max_num_reqs: few distinct tuples.
    made: dict[tuple[int, int], tuple[int, ...]] = {}
    out: list[tuple[int, ...]] = []
    for t in range(1, min(limit, max(R, (R - 1) * q + 1)) + 1):
        key = (min(R, t), min(R, 1 + (t - 1) // q))
        reqs = made.get(key)
        if reqs is None:
            reqs = made[key] = tuple(_prefill_reqs(config, t, marks))
        out.append(reqs)
    # From here on both are max_num_reqs.
    out += [out[-1]] * (limit - len(out))
    return tuple(out)


@lru_cache(maxsize=256)
def _space(config: ManagerConfig, limit: int, marks: tuple[int, ...]) -> int:
    # Cached: a config's light and full plans (and every plan of a config a
    # campaign draws again) count the same space.
    L = max(config.lora_cases)
    split = _ubatch_floor(config) or limit + 1  # from here on, whole and micro-batched
    # Inputs per request count: each LoRA count it can carry.
    loras = [min(r, L) + 1 for r in range(config.max_num_reqs + 1)].__getitem__
    prefill, first = 0, 1
    # Runs of token counts with the same splits (see _prefill_splits): long
    # ones; those of the run at or past ``split`` count twice.
    for reqs, run in groupby(_prefill_splits(config, limit, marks)):
        k = len(list(run))
        prefill += sum(map(loras, reqs)) * (k + max(0, first + k - max(first, split)))
        first += k
    decode = sum(loras(r) * (1 + (t >= split))
                 for r, t, _, u in _decode_shapes(config, limit, range(1, config.max_num_reqs + 1)))
    return prefill + decode


# Shapes are values, and the plans of a campaign's configs share most of
# theirs (small token counts especially): each is built once.  Bounded, so a
# long campaign of huge configs does not keep every shape it ever swept.
_SHAPES: dict[tuple, BatchShape] = {}
_SHAPES_BOUND = 500_000


def _space_at_most(config: ManagerConfig, limit: int, marks: int) -> int:
    """An upper bound of ``_space``, counted from the config's sizes alone."""
    decode = config.max_num_reqs * (2 * config.decode_query_len - 1)
    prefill = limit * (3 + 2 * marks)
    return (decode + prefill) * (max(config.lora_cases) + 1) * (2 if _ubatch_floor(config) is not None else 1)


def _exhaustive(config: ManagerConfig, limit: int, marks: tuple[int, ...]) -> tuple[BatchShape, ...]:
    """Every dispatch input the scheduler can produce, in ``sweep_plan``'s
    order: decodes by request count, then prefills by token count, each
    with every LoRA count it can carry and every micro-batch count.  No
    input comes twice (decodes and prefills differ in has_prefill, a token
    count's splits are distinct), so their number is the space."""
    L = max(config.lora_cases)
    floor = _ubatch_floor(config)
    keys: list[tuple] = []
    append = keys.append
    if L == 0 and floor is None:  # one input per shape: no LoRA, no micro-batching
        for r, t, m, u in _decode_shapes(config, limit, range(1, config.max_num_reqs + 1)):
            append((r, t, m, u, False, 0, 1))
        for t, reqs in enumerate(_prefill_splits(config, limit, marks), 1):
            for r in reqs:
                append((r, t, t - r + 1, None, True, 0, 1))
        return _shapes(keys)
    whole, split = (1,), (1, config.num_ubatches)
    for r, t, m, u in _decode_shapes(config, limit, range(1, config.max_num_reqs + 1)):
        for a in range(min(r, L) + 1):
            for ub in (whole if floor is None or t < floor else split):
                append((r, t, m, u, False, a, ub))
    for t, reqs in enumerate(_prefill_splits(config, limit, marks), 1):
        ubs = whole if floor is None or t < floor else split
        for r in reqs:
            for a in range(min(r, L) + 1):
                for ub in ubs:
                    append((r, t, t - r + 1, None, True, a, ub))
    return _shapes(keys)


def _shapes(keys: Iterable[tuple]) -> tuple[BatchShape, ...]:
    if len(_SHAPES) > _SHAPES_BOUND:
        _SHAPES.clear()
    get, out = _SHAPES.get, []
    for k in keys:
        shape = get(k)
        if shape is None:
            shape = _SHAPES[k] = BatchShape(*k)
        out.append(shape)
    return tuple(out)


def sweep_plan(config: ManagerConfig, descriptors: Iterable[BatchDescriptor] = (), bound: int = SWEEP_BOUND,
               seed: int = 0, light: bool = False) -> SweepPlan:
    """Every batch the scheduler can produce for ``config``, as distinct
    dispatch inputs (``BatchShape``): uniform decodes of every schedulable
    length and request count; prefill and mixed batches of every token count
    up to past the largest capture size, with representative request splits
    (one prompt; decodes plus one prompt chunk; as many requests as allowed;
    each descriptor's request count and one past it); every active-LoRA
    count a batch can carry (at most its requests and max_loras); every
    micro-batch count the runner may use.

    Above ``bound`` inputs (or with ``light``, for a sweep that only checks
    that nothing is captured): every boundary class (1, 2 and the maximum;
    each capture size and one past it; each descriptor's token and request
    count and one past it; the LoRA cases and one past them; the dynamic
    schedule's tier edges), plus, unless light, a seeded sample of the rest.
    ``descriptors`` (the spec's and the target's) supply the boundaries."""
    limit = sweep_token_limit(config)
    R = config.max_num_reqs
    descs = list(descriptors)
    reqs_marks = sorted({d.num_reqs for d in descs if d.num_reqs is not None})
    if not light and _space_at_most(config, limit, len(reqs_marks)) <= bound:
        # Most fuzzed configs: every input, without counting them first.
        shapes = _exhaustive(config, limit, tuple(reqs_marks))
        return SweepPlan(shapes, "exhaustive", len(shapes))
    space = _space(config, limit, tuple(reqs_marks))
    exhaustive = space <= bound and not light
    # Plain tuples until the end: a plan adds most shapes more than once, and
    # a tuple hashes far faster than a dataclass.
    shapes: dict[tuple, None] = {}
    # Per request count and per token count: a plan asks them for every shape.
    lora_counts: dict[int, list[int]] = {}
    ubatch_counts: dict[int, tuple[int, ...]] = {}

    def add(r: int, t: int, m: int, uniform: int | None, prefill: bool, loras: Iterable[int] | None = None) -> None:
        if loras is None:
            loras = lora_counts.get(r)
            if loras is None:
                loras = lora_counts[r] = _lora_counts(config, r, exhaustive)
        ubs = ubatch_counts.get(t)
        if ubs is None:
            ubs = ubatch_counts[t] = _eligible_ubatches(config, t)
        for a in loras:
            for ub in ubs:
                shapes[(r, t, m, uniform, prefill, a, ub)] = None

    if exhaustive:
        return SweepPlan(_exhaustive(config, limit, tuple(reqs_marks)), "exhaustive", space)

    sizes = set(config.capture_sizes) | {d.num_tokens for d in descs}
    tokens = sorted(t for t in {1, 2, limit} | sizes | {s + 1 for s in sizes} if 1 <= t <= limit)
    decode_reqs = {1, 2, R} | set(reqs_marks) | {x + 1 for x in reqs_marks}
    for start, end, _ in config.spec_schedule or ():
        decode_reqs |= {start, end, end + 1}
    for q in range(1, config.decode_query_len + 1):
        decode_reqs |= {s // q for s in sizes} | {s // q + 1 for s in sizes}
    for r, t, m, u in _decode_shapes(config, limit, sorted(r for r in decode_reqs if 1 <= r <= R)):
        add(r, t, m, u, False)
    by_tokens = sorted(descs, key=lambda d: d.num_tokens)
    for t in tokens:
        # The request counts that decide where t tokens go: those of the
        # smallest graphs that still fit t tokens.
        near = [d.num_reqs for d in by_tokens if d.num_tokens >= t and d.num_reqs is not None][:4]
        for r in _prefill_reqs(config, t, near):
            add(r, t, t - r + 1, None, True)
    rng = random.Random(seed)
    if not light:
        decode_all = _decode_shapes(config, limit, range(1, R + 1))
        for _ in range(bound // 4):
            if decode_all and rng.random() < 0.3:
                r, t, m, u = rng.choice(decode_all)
                prefill = False
            else:
                t = rng.randint(1, limit)
                r = rng.randint(1, min(R, t))
                m, u, prefill = t - r + 1, None, True
            add(r, t, m, u, prefill, loras=[rng.randint(0, min(r, max(config.lora_cases)))])
    out = list(shapes)
    if len(out) > bound:  # the boundary classes of a huge config: a seeded subset of them
        out = rng.sample(out, bound)
    return SweepPlan(_shapes(out), "boundary" if light else "boundary+sample", space,
                     seeded=not light or len(shapes) > bound)
