"""Hypothesis strategies: manager configs, batches a scheduler can produce for a
config, and Scenarios.  Shrinking goes towards few capture sizes, few steps and
small batches, so a counterexample reads like a hand-written test."""

from __future__ import annotations

from typing import Callable

from hypothesis import reject, strategies as st

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.modes import AttentionSupport, CUDAGraphMode
from cgsim.scenario import Scenario, Served, Step
from cgsim.targets.base import TargetUnsupported
from cgsim.spec import scheduler
from cgsim.spec.engine_configs import vllm_lora_cases
from cgsim.spec.rulesets import rulesets_of

__all__ = ["capture_sizes", "configs", "engine_configs", "surviving_dynamic_sd_configs", "batches", "served_steps",
           "scenarios", "RULESET_NAMES"]

# The strategy picks among vLLM's designs; an engine's own ruleset is pinned
# (--ruleset, or the target's default), and a target whose engine is configured
# otherwise brings its configs (its ``config_strategy``).
RULESET_NAMES = rulesets_of("vllm")
MODES = tuple(CUDAGraphMode)

# Strategy objects are made once per argument tuple and reused: a fresh
# strategy costs Hypothesis its validation and property computations at every
# draw (a fifth of generation time), while drawing from the same object gives
# exactly the same choices, distribution and shrinking.
_made: dict[tuple, st.SearchStrategy] = {}


def _once(key: tuple, make: Callable[[], st.SearchStrategy]) -> st.SearchStrategy:
    strategy = _made.get(key)
    if strategy is None:
        if len(_made) > 4096:
            _made.clear()
        strategy = _made[key] = make()
    return strategy


def _ints(lo: int, hi: int) -> st.SearchStrategy:
    return _once(("ints", lo, hi), lambda: st.integers(lo, hi))


def _sampled(values: tuple) -> st.SearchStrategy:
    return _once(("sampled", values), lambda: st.sampled_from(values))


def _lists(elements: st.SearchStrategy, min_size: int = 0, max_size: int | None = None,
           unique: bool = False) -> st.SearchStrategy:
    return _once(("lists", id(elements), min_size, max_size, unique),
                 lambda: st.lists(elements, min_size=min_size, max_size=max_size, unique=unique))


_BOOLS = st.booleans()
_SUPPORTS = {mode: tuple(s for s in AttentionSupport if not (mode == CUDAGraphMode.FULL and s == AttentionSupport.NEVER))
             for mode in CUDAGraphMode}
# FULL over attention that is not ALWAYS resolves to a mode drawn anyway
# (FULL_DECODE_ONLY, FULL_AND_PIECEWISE); FULL over ALWAYS is a design of its
# own (mixed FULL graphs, their micro-batched twins: docs/findings.md #1, #8),
# so tiny configs draw it half the time.
_TINY_SUPPORTS = {**_SUPPORTS, CUDAGraphMode.FULL: _SUPPORTS[CUDAGraphMode.FULL] + (AttentionSupport.ALWAYS,) * 2}


@st.composite
def capture_sizes(draw, max_size: int = 512) -> tuple[int, ...]:
    """Tiny hand-picked lists most of the time; realistic ladders (1, 2, 4, 8,
    then steps of 8 or 16) up to ``max_size`` sometimes."""
    if draw(_ints(0, 9)) < 8:
        sizes = draw(_lists(_ints(1, min(32, max_size)), min_size=1, max_size=4, unique=True))
        return tuple(sorted(sizes))
    top = draw(_sampled(tuple(s for s in (16, 32, 64, 128, 256, 512) if s <= max_size) or (max_size,)))
    step = draw(_sampled((8, 16)))
    ladder = [s for s in (1, 2, 4, 8) if s <= top] + list(range(16, top + 1, step))
    return tuple(sorted(set(ladder)))


@st.composite
def spec_schedules(draw, max_spec_tokens: int, max_num_reqs: int, halving_only: bool = False):
    """Dynamic speculative decoding as users set it: 2-4 tiers of batch sizes,
    fewer speculative tokens for larger batches (halved from tier to tier, or
    any fewer), each tier its own decode length (a schedule with one length
    is plain speculative decoding).  A schedule is written for batch sizes,
    not for this engine's max_num_seqs: a tier may lie past it (vLLM
    0.25-0.28 took decode lengths from such unreachable tiers,
    docs/findings.md #5).  ``halving_only``: the halving ladder always, so
    that no tier has K - 1 tokens."""
    tiers = min(draw(_ints(2, 4)), max_num_reqs, max_spec_tokens + 1)
    # Three times in four a tier for larger batches than this engine
    # schedules, with fewer tokens still: a schedule is usually written for
    # more engines than this one.  Its k is picked with the others (the next
    # halving, or one more value), so that a schedule whose reachable tiers
    # end at k = 0 has one too (vLLM 0.25-0.28 captured lengths from such
    # tiers, docs/findings.md #5; drawn only below the last reachable k, a
    # fifth of all schedules had one).  Where K leaves too few values for
    # both, the engine reaches one tier fewer.
    past = 1 if draw(_ints(0, 3)) else 0
    if not halving_only and draw(_BOOLS):
        # K - 1 tokens in one tier in four: on vLLM 0.25-0.31 that tier kills
        # every Eagle/MTP engine at start-up (#3), and drawn as freely as the
        # others it was in over half of all schedules, hiding what else they show.
        avoid = max_spec_tokens - 1 if max_spec_tokens > 1 and draw(_ints(0, 3)) else None
        values = tuple(k for k in range(max_spec_tokens + 1) if k != avoid)
        tiers = max(1, min(tiers, len(values) - past))
        n = min(tiers + past, len(values))
        ks = sorted(draw(_lists(_sampled(values), min_size=n, max_size=n, unique=True)), reverse=True)
    else:
        # Halving (4, 2, 1, 0) never schedules K - 1 tokens for K > 2: on vLLM
        # 0.25-0.31 such a tier kills every Eagle/MTP engine at start-up
        # (#3), hiding what else its schedule shows.
        ladder = sorted({max_spec_tokens >> i for i in range(8)}, reverse=True)
        tiers = max(1, min(tiers, len(ladder) - past))
        ks = ladder[:tiers + past]
    ks, past_ks = ks[:tiers], ks[tiers:]
    ends = sorted(draw(_lists(_ints(1, max_num_reqs - 1), min_size=len(ks) - 1, max_size=len(ks) - 1, unique=True))
                  if len(ks) > 1 else ())
    ends.append(max_num_reqs)
    entries, start = [], 1
    for end, k in zip(ends, ks):
        entries.append((start, end, k))
        start = end + 1
    for k in past_ks:
        entries.append((start, start - 1 + draw(_ints(1, 4 * max_num_reqs)), k))
    return tuple(entries)


# Modes as engines are configured, their default (FULL_AND_PIECEWISE) first.
ENGINE_MODES = (CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL,
                CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE)
EngineSizes = Callable[[int, int, "tuple | None"], tuple]
# A target's ``unsupported_reason``: why it cannot be given a config at all (None: it can).
Refusal = Callable[[ManagerConfig], "str | None"]
# A target's ``engine_config``: the config its engine builds from a drawn one (None: refused).
Engine = Callable[[ManagerConfig], "ManagerConfig | None"]
# A target's ``engine_settings``: a drawn config as settings its engine takes (None: none taken).
Settings = Callable[[ManagerConfig], "ManagerConfig | None"]
# A target's ``serve``: the batches its engine's scheduler schedules for a request trace, and their origin.
Serve = Callable[[ManagerConfig, object], "tuple[tuple[Batch, ...], Served]"]
# A target's ``config_strategy``: configs as its engine runs them, up to a largest size.
ConfigStrategy = Callable[[int], st.SearchStrategy[ManagerConfig]]
_MAX_NUM_SEQS = st.one_of(st.integers(1, 1024), st.sampled_from((8, 16, 32, 64, 128, 256, 512, 1024)))


@st.composite
def engine_configs(draw, engine_sizes: EngineSizes) -> ManagerConfig:
    """Configs as engines run them: the engine's own capture sizes for
    max_num_seqs up to 1024, 1-7 speculative tokens with dynamic schedules of
    2-4 tiers, up to 8 LoRA adapters (the engine's LoRA capture cases), DBO
    thresholds.  Every parameter shrinks towards the smallest engine."""
    mode = draw(_sampled(ENGINE_MODES))
    support = draw(_sampled(_SUPPORTS[mode][::-1]))  # ALWAYS first
    max_num_seqs = draw(_MAX_NUM_SEQS)
    k = draw(_ints(0, 7))
    schedule = (draw(_once(("spec_schedules", k, max_num_seqs), lambda: spec_schedules(k, max_num_seqs)))
                if k >= 1 and draw(_BOOLS) else None)
    varlen = k >= 1 and schedule is None and support == AttentionSupport.ALWAYS and draw(_ints(0, 4)) == 4
    max_loras = draw(_ints(0, 8))
    lora_cases = vllm_lora_cases(max_loras, draw(_BOOLS)) if max_loras else (0,)
    sizes = tuple(engine_sizes(max_num_seqs, k + 1, schedule))
    return ManagerConfig(
        mode=mode, capture_sizes=sizes, max_num_reqs=max_num_seqs, max_capture_size=max(sizes),
        decode_query_len=k + 1, spec_schedule=schedule, lora_cases=lora_cases, breakable=draw(_BOOLS),
        varlen_decode=varlen, num_ubatches=draw(_sampled((1, 2))),
        ubatch_threshold=draw(_sampled((32, 64, 128, 256))), attention_support=support,
        attention_split=draw(_ints(0, 4)) > 0, compiled_piecewise=draw(_ints(0, 4)) > 0,
    )


@st.composite
def configs(draw, max_size: int = 512, engine_sizes: EngineSizes | None = None) -> ManagerConfig:
    """Tiny configs that shrink well; with ``engine_sizes`` (a target's
    ``engine_capture_sizes``) one in sixteen is a config as engines run them.

    One in sixteen, not more: an engine config captures hundreds of graphs
    and costs about forty tiny ones (vLLM 0.28-0.32 on CPU: a median 1.1 s
    against 30 ms), so at one in eight they took 55-75 % of a vLLM
    campaign's CPU, and every documented defect that the detection runs
    found slowly (docs/findings.md #1, #5, #8) shows in tiny configs.  At
    one in sixteen each kind gets about half."""
    if engine_sizes is not None and draw(_ints(0, 15)) == 15:
        return draw(_once(("engine_configs", engine_sizes), lambda: engine_configs(engine_sizes)))
    if draw(_ints(0, 15)) == 15 and max_size >= 20:
        return draw(_once(("surviving_dynamic_sd_configs", max_size), lambda: surviving_dynamic_sd_configs(max_size)))
    mode = draw(_sampled(MODES))
    support = draw(_sampled(_TINY_SUPPORTS[mode]))
    sizes = draw(_once(("capture_sizes", max_size), lambda: capture_sizes(max_size)))
    q = draw(_ints(1, 5))
    big = max(sizes)
    low, top = -(-big // q), big - q - 1
    if q > 1 and low <= top and draw(_ints(0, 3)) == 3:  # shrinks to without it
        # A quarter of the speculative engines capture only sizes past their
        # request limit plus a decode (their largest within a decode of
        # max_num_reqs x q tokens).  On vLLM 0.25-0.31 only these keep the
        # draft decode manager alive with a dynamic schedule: its lengths
        # k + 1 - K <= 0 leave no descriptor past max_num_reqs tokens, and
        # give one of non-positive size (a crash, #3) below it; so only
        # here (and in surviving_dynamic_sd_configs) do #1 and #6 show there.
        max_num_reqs = draw(_ints(low, top))
        sizes = tuple(s for s in sizes if s > max_num_reqs + q)
    else:
        max_num_reqs = draw(_ints(1, max(1, min(64, big))))
    breakable = draw(_BOOLS)
    # Adaptive verification routes decodes of its own (a design of its own:
    # docs/findings.md #13), so a third of the configs that allow it have it.
    varlen = q > 1 and support == AttentionSupport.ALWAYS and draw(_ints(0, 2)) == 0
    schedule = None
    if q > 1 and not varlen and draw(_ints(0, 2)) == 0:
        schedule = draw(_once(("spec_schedules", q - 1, max_num_reqs), lambda: spec_schedules(q - 1, max_num_reqs)))
    if q > 1 and draw(_ints(0, 1)) == 1:
        # Speculative-decoding engines add the uniform-decode sizes (requests
        # x query length) to their ladder; the largest, the full decode batch,
        # is the graph a micro-batched decode misses when its nearest size
        # holds none of its shape (docs/findings.md #1).
        sizes = tuple(sorted(set(sizes) | {max_num_reqs * q}))
    if draw(_ints(0, 3)) == 3 and 2 * max_num_reqs * q <= 64:  # shrinks to without it
        # vLLM's default largest size is 2 x max_num_seqs x q: its mixed FULL
        # graph spans twice the decode length per request, and micro-batched
        # it becomes a twin no decode batch can use (docs/findings.md #8).
        sizes = tuple(sorted(set(sizes) | {2 * max_num_reqs * q}))
    return ManagerConfig(
        mode=mode, capture_sizes=sizes, max_num_reqs=max_num_reqs, decode_query_len=q, spec_schedule=schedule,
        breakable=breakable, varlen_decode=varlen, attention_support=support,
        **draw(_once(("tiny_extras", max(sizes)), lambda: _tiny_extras(max(sizes)))),
    )


@st.composite
def _tiny_extras(draw, largest_size: int) -> dict:
    """The fields a tiny config draws last: LoRA cases, micro-batching, how
    attention is compiled, and a max_capture_size at or past its largest size."""
    return dict(
        lora_cases=draw(_sampled(((0,), (0,), (0,), (0, 1), (0, 1, 2), (0, 2, 4)))),
        num_ubatches=draw(_sampled((1, 1, 2))), ubatch_threshold=draw(_sampled((4, 8, 32))),
        compiled_piecewise=draw(_ints(0, 4)) > 0, attention_split=draw(_ints(0, 4)) > 0,
        max_capture_size=largest_size + draw(_sampled((0, 0, 0, 1, 8))),
    )


@st.composite
def surviving_dynamic_sd_configs(draw, max_size: int = 128) -> ManagerConfig:
    """Tiny dynamic speculative-decoding engines that vLLM 0.25-0.31 can start.

    There the Eagle/MTP draft decode manager (decode_query_len 1) takes the
    target's tiers as decode lengths k + 1 - K (docs/findings.md #3): a tier
    of K - 1 tokens divides by zero at start-up, and a smaller k gives a
    negative length whose rounded sizes become graphs of negative size
    unless every capture size lies past max_num_reqs + K.  Drawn freely,
    few tiny configs survive that with FULL decode graphs of two lengths
    (one in about 600), so what those releases do wrong behind #3 (the
    dispatch of #1, the graphs of #6) went unseen for minutes.  Every draw
    here survives: K of 3-6 with a halving schedule (never K - 1 tokens,
    two lengths of at least two tokens), FULL decode graphs over attention
    that allows uniform batches, and sizes from max_num_reqs + K + 1 up to
    the full decode batch, where two lengths round one size apart (the
    request limit past K + 1: below it no size reaches a 2-token graph)."""
    # Within max_size: K + 2 requests of K + 1 tokens, at least.
    k = draw(_ints(3, max(k for k in range(3, 7) if (k + 2) * (k + 1) <= max_size)))
    max_num_reqs = draw(_ints(k + 2, min(16, max_size // (k + 1))))
    schedule = draw(_once(("spec_schedules", k, max_num_reqs, True),
                          lambda: spec_schedules(k, max_num_reqs, halving_only=True)))
    # The full decode batch is the largest size, as speculative engines add
    # it: vLLM drops every rounded size past the largest, so without a larger
    # one no size could round up to another length's graph.
    low, top = max_num_reqs + k + 1, max_num_reqs * (k + 1)
    sizes = tuple(sorted({top, *draw(_lists(_ints(low, top - 1), min_size=1, max_size=3, unique=True))}))
    extras = draw(_once(("tiny_extras", max(sizes)), lambda: _tiny_extras(max(sizes))))
    return ManagerConfig(
        mode=draw(_sampled((CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE))),
        attention_support=draw(_sampled((AttentionSupport.ALWAYS, AttentionSupport.UNIFORM_BATCH))),
        capture_sizes=sizes, max_num_reqs=max_num_reqs, decode_query_len=k + 1, spec_schedule=schedule,
        # An engine that starts: vLLM asserts max_capture_size ==
        # max(capture_sizes), and 0.25-0.29 have no micro-batching (a config
        # the target refuses is drawn again from all configs, not from these).
        breakable=draw(_BOOLS), **{**extras, "max_capture_size": max(sizes), "num_ubatches": 1},
    )


@st.composite
def batches(draw, config: ManagerConfig) -> Batch:
    """Batches the scheduler can produce for ``config`` (``cgsim.spec.scheduler``):
    never more requests than max_num_reqs; pure decodes with the length the
    (dynamic) speculative schedule gives their request count (any lengths up
    to it with varlen decode); batches with prefills of any shape; active
    LoRAs up to the largest case; micro-batched as the runner would."""
    max_tokens = (config.max_capture_size or 1) + 8
    kind = draw(_sampled(("decode", "decode", "mixed", "prefill", "varlen")))
    max_reqs = config.max_num_reqs
    prefill = kind in ("mixed", "prefill") or (kind == "varlen" and not config.varlen_decode)
    if kind == "decode":
        r = draw(_ints(1, max_reqs))
        q = scheduler.decode_query_len(config, r)
        r = max(1, min(r, max_tokens // q))
        lens = (scheduler.decode_query_len(config, r),) * r
    elif kind == "prefill":
        lens = (draw(_ints(1, max_tokens)),)
    elif kind == "varlen":
        r = draw(_ints(1, max_reqs))
        lens = tuple(draw(_lists(_ints(1, config.decode_query_len), min_size=1, max_size=min(r, 32))))
    else:
        # Long request lists cost generation time; the dispatch sweep covers every request count.
        lens = tuple(draw(_lists(_ints(1, 16), min_size=1, max_size=min(max_reqs, 32))))
    while sum(lens) > max_tokens and len(lens) > 1:
        lens = lens[:-1]
    if sum(lens) > max_tokens:
        lens = (max_tokens,)
    loras = draw(_ints(0, max(config.lora_cases)))
    return scheduler.make_batch(config, lens, loras, has_prefill=prefill)


def _built(drawn: st.SearchStrategy[ManagerConfig], engine: Engine | None) -> st.SearchStrategy[ManagerConfig]:
    """``drawn`` as the engine builds them (``engine`` None: as drawn); refused ones are not drawn."""
    if engine is None:
        return drawn
    return drawn.map(engine).filter(lambda built: built is not None)


def _takes(refusal: Refusal) -> Callable[[ManagerConfig], bool]:
    return lambda config: refusal(config) is None


def _engine_configs(max_size: int, engine_sizes: EngineSizes | None, refusal: Refusal | None,
                    engine: Engine | None, settings: Settings | None = None) -> st.SearchStrategy[ManagerConfig]:
    drawn = configs(max_size, engine_sizes)
    if settings is not None:
        # Drawn as settings the engine takes (what it refuses in combination left out), not discarded.
        drawn = drawn.map(settings).filter(lambda taken: taken is not None)
    if refusal is not None:
        drawn = drawn.filter(_takes(refusal))
    if engine is not None:
        drawn = drawn.map(engine).filter(lambda built: built is not None)
    return drawn


@st.composite
def served_steps(draw, config: ManagerConfig, serve: Serve) -> tuple[tuple[Step, ...], Served]:
    """A capture, then every batch the engine's scheduler schedules for a
    drawn request trace (``serve``: a target's hook).  Shrinking goes towards
    fewer, shorter requests arriving together: a small request trace."""
    from fuzz.workloads import workloads

    adapters = max(config.lora_cases)
    requests = draw(workloads(loras=adapters + 1 if adapters else 0))
    try:
        stream, served = serve(config, requests)
    except TargetUnsupported:
        reject()  # a trace the engine refuses (a KV cache it will not start with) is not drawn
    if not stream:
        reject()
    return (Step.capture(), *(Step.dispatch(b) for b in stream)), served


@st.composite
def scenarios(draw, ruleset: str | None = None, max_size: int = 128, config: ManagerConfig | None = None,
              engine_sizes: EngineSizes | None = None, refusal: Refusal | None = None,
              engine: Engine | None = None, serve: Serve | None = None,
              config_strategy: ConfigStrategy | None = None, settings: Settings | None = None) -> Scenario:
    """Scenarios of a config (``config``, or drawn); with ``refusal`` (a
    target's ``unsupported_reason``) only configs the target can be given: a
    scenario it refuses costs a run and judges nothing (on vLLM, tiny configs
    whose max_capture_size exceeds their largest size were a third of all).
    With ``engine`` (a target's ``engine_config``, None where the engine
    refuses) a drawn config stands for the engine settings it is drawn as, and
    the scenario judges the config the engine builds from them; with
    ``settings`` (a target's ``engine_settings``, None where nothing is
    taken) a drawn config first becomes settings the engine takes.  With
    ``serve`` (a target's hook) about a third of the draws are served: their
    batches are the ones the engine's own scheduler schedules for a drawn
    request trace, not the model's.  With ``config_strategy`` (a target's
    hook) configs are drawn from it instead of cgsim's own."""
    if config is None and config_strategy is not None:
        config = draw(_once(("own-configs", max_size, config_strategy, engine),
                            lambda: _built(config_strategy(max_size), engine)))
    cfg = config if config is not None else draw(_once(
        ("configs", max_size, engine_sizes, refusal, engine, settings),
        lambda: _engine_configs(max_size, engine_sizes, refusal, engine, settings)))
    rs = ruleset if ruleset is not None else draw(_sampled(RULESET_NAMES))
    if serve is not None and draw(_ints(0, 2)) == 2:
        steps, served = draw(served_steps(cfg, serve))
        return Scenario(config=cfg, steps=steps, ruleset=rs, seed=draw(_ints(0, 3)), served=served)
    batch = batches(cfg)  # one strategy object for every batch of this scenario
    steps: list[Step] = []
    # Optional parts are drawn so that shrinking (towards 0) removes them.
    if draw(_ints(0, 5)) == 5:
        steps.append(Step.dispatch(draw(batch)))
    steps.append(Step.capture())
    steps += [Step.dispatch(b) for b in draw(st.lists(batch, min_size=1, max_size=4))]
    if draw(_ints(0, 3)) == 3:
        steps.append(Step.release())
        steps += [Step.dispatch(b) for b in draw(st.lists(batch, max_size=1))]
        steps.append(Step.capture())
        steps += [Step.dispatch(b) for b in draw(st.lists(batch, min_size=1, max_size=2))]
    return Scenario(config=cfg, steps=tuple(steps), ruleset=rs, seed=draw(_ints(0, 3)))
