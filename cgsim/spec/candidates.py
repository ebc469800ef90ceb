"""What candidate init must produce: capture descriptors per mode, the capture
order and the candidate lists (SPEC §2, parametrised by the ruleset).

Written from the rules, not from any manager's loop, so that a manager whose
loop is wrong disagrees with it.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

from cgsim.config import ManagerConfig
from cgsim.descriptors import BatchDescriptor
from cgsim.spec.fit import empty_second_ubatch
from cgsim.modes import CUDAGraphMode, resolve_mode
from cgsim.spec.engine_configs import decode_shapes, varlen_token_grid
from cgsim.spec.rulesets import Ruleset, get_ruleset
from cgsim.spec.vllm_options import decode_sizes_of

__all__ = [
    "resolved_mode",
    "expected_capture_descs",
    "expected_capture_order",
    "expected_candidate_tiers",
    "desc_sort_key",
    "decode_query_lens",
]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


def resolved_mode(config: ManagerConfig) -> CUDAGraphMode:
    return resolve_mode(
        config.mode,
        config.attention_support,
        config.decode_query_len,
        config.attention_split,
        config.piecewise_available,
    )


def decode_query_lens(config: ManagerConfig) -> tuple[int, ...]:
    """Decode query lengths FULL decode graphs are captured for: every length the
    scheduler can produce (dynamic speculative decoding: its schedule)."""
    return config.scheduler_decode_query_lens()


def desc_sort_key(d: BatchDescriptor) -> tuple:
    """Canonical order inside a mode: largest first; ties in a fixed order so
    two correct implementations can be compared element by element."""
    return (
        -d.num_tokens,
        d.uniform_token_count is None,
        d.uniform_token_count or 0,
        d.max_query_len or 0,
        d.num_reqs if d.num_reqs is not None else -1,
        d.num_active_loras,
        d.num_ubatches,
    )


def _ubatch_twin(desc: BatchDescriptor, config: ManagerConfig, varlen_twins: bool = True) -> BatchDescriptor | None:
    if config.num_ubatches < 2 or desc.cg_mode != F or desc.num_reqs is None:
        return None
    if desc.max_query_len is not None and not varlen_twins:  # a varlen decode descriptor
        return None
    per_req, rem = divmod(desc.num_tokens, desc.num_reqs)
    if rem or desc.uniform_token_count not in (None, per_req):
        return None
    # Only pure decodes are micro-batched as uniform batches; a twin whose
    # per-request length is no decode length would never be dispatched.
    if per_req not in config.scheduler_decode_query_lens():
        return None
    if desc.num_tokens < config.num_ubatches or desc.num_tokens < config.ubatch_threshold:
        return None
    return BatchDescriptor(
        F, desc.num_tokens, desc.num_reqs, per_req, desc.max_query_len, desc.num_active_loras, config.num_ubatches
    )


def expected_capture_descs(config: ManagerConfig, ruleset: "Ruleset | str") -> dict[CUDAGraphMode, tuple[BatchDescriptor, ...]]:
    """Descriptors captured per runtime mode, each list largest first.
    ``config`` as given or as the ruleset's design sees it (its effective
    config: rounded capture sizes, the adaptive-verification route); raises
    RulesetRejects (a ValueError) for a config the design refuses."""
    # Cached, per effective config: a run plans its dispatch sweep around
    # them and its checks ask again; each caller gets its own dict.
    rs = get_ruleset(ruleset)
    return dict(_expected_capture_descs(rs.effective_config(config), rs))


@lru_cache(maxsize=256)
def _expected_capture_descs(config: ManagerConfig,
                            rs: "Ruleset") -> tuple[tuple[CUDAGraphMode, tuple[BatchDescriptor, ...]], ...]:
    # ``config``: the ruleset's effective config (``effective_config`` is idempotent).
    mode = resolved_mode(config)
    if mode == N:
        return ()
    decode_mode, mixed_mode = mode.decode_mode(), mode.mixed_mode()
    separate = mode.separate_routine()
    max_reqs, max_size = config.max_num_reqs, config.max_capture_size
    assert max_size is not None
    out: dict[CUDAGraphMode, set[BatchDescriptor]] = defaultdict(set)

    def add(desc: BatchDescriptor) -> None:
        out[desc.cg_mode].add(desc)
        if rs.ubatch_twins:
            twin = _ubatch_twin(desc, config, rs.varlen_ubatch_twins)
            if twin is not None:
                out[desc.cg_mode].add(twin)

    if rs.decode_shapes and separate and decode_mode == F:
        q_max = config.decode_query_len
        for lora in config.lora_cases:
            if config.varlen_decode:
                top = max(decode_sizes_of(config) or (0,)) * q_max
                for size in varlen_token_grid(top):
                    add(BatchDescriptor(F, size, min(size, max_reqs), None, q_max, lora))
                continue
            limits = {q: min(r, max_reqs) for q, r in config.scheduler_decode_limits.items()}
            for n, q in decode_shapes(decode_sizes_of(config) or (), limits, max_size):
                add(BatchDescriptor(F, n * q, n, q, None, lora))
        separate = False  # the token-keyed graphs below are the mixed ones only
    for lora in config.lora_cases:
        for size in config.capture_sizes:
            if separate and decode_mode == F:
                if config.varlen_decode:
                    if size <= max_reqs * config.decode_query_len:
                        add(BatchDescriptor(F, size, min(size, max_reqs), None, config.decode_query_len, lora))
                else:
                    for q in decode_query_lens(config):
                        tokens = -(-size // q) * q
                        reqs = tokens // q
                        if tokens > max_reqs * config.decode_query_len or tokens > max_size or reqs > max_reqs:
                            continue
                        add(BatchDescriptor(F, tokens, reqs, q, None, lora))
            if mixed_mode != N:
                if mixed_mode == F:
                    reqs = min(size, max_reqs)
                elif rs.pad_breakable_piecewise_reqs and config.breakable:
                    reqs = min(size, max_reqs)
                else:
                    reqs = None
                add(BatchDescriptor(mixed_mode, size, reqs, None, None, lora))
    if F in out:
        out[F] = set(drop_unscheduled_decode(config, out[F]))
    return tuple((m, tuple(sorted(ds, key=desc_sort_key))) for m, ds in out.items() if ds)


def drop_unscheduled_decode(config: ManagerConfig, full_descs) -> list[BatchDescriptor]:
    """FULL uniform-decode descriptors minus those no scheduled batch reaches.

    With dynamic speculative decoding the scheduler picks the drafts from the
    request count of the step before, so a graph for length q and R requests
    is only reached by pure decodes of r requests, r in (R', R], that verify
    drafts chosen for a batch of at least r requests, i.e. r at most the most
    requests the schedule gives length q (R' the request count of the next
    smaller graph for q; a batch that shrank keeps its drafts: vLLM's
    scheduler, tests/cgsim/targets/vllm/test_vllm_scheduler.py); batches with a prefill never
    reach decode graphs.  Without a schedule every request count gets the
    same length and nothing is dropped."""
    if config.spec_schedule is None:
        return list(full_descs)
    kept: list[BatchDescriptor] = []
    previous: dict[tuple, int] = {}
    most = config.scheduler_decode_limits
    for d in sorted(full_descs, key=lambda d: (d.num_tokens, d.num_reqs or 0)):
        if d.uniform_token_count is None or d.num_reqs is None:
            kept.append(d)
            continue
        group = (d.uniform_token_count, d.num_active_loras, d.num_ubatches)
        lo = previous.get(group, 0)
        # A micro-batched graph only sees batches at or above the DBO
        # threshold, and none it would leave an empty second micro-batch
        # (those run eagerly: empty_second_ubatch).
        least = max(config.ubatch_threshold, config.num_ubatches) if d.num_ubatches > 1 else 1
        if any(
            r <= most.get(d.uniform_token_count, 0) and r * d.uniform_token_count >= least
            and not empty_second_ubatch(d.num_tokens, r * d.uniform_token_count, d.num_ubatches)
            for r in range(lo + 1, d.num_reqs + 1)
        ):
            kept.append(d)
            previous[group] = d.num_reqs
    return kept


def expected_capture_order(config: ManagerConfig, ruleset: "Ruleset | str") -> tuple[BatchDescriptor, ...]:
    """All PIECEWISE descriptors, then all FULL ones: piecewise activations are
    larger, so FULL graphs fit in the pool memory the piecewise ones grew."""
    descs = expected_capture_descs(config, ruleset)
    return descs.get(P, ()) + descs.get(F, ())


def expected_candidate_tiers(
    config: ManagerConfig, ruleset: "Ruleset | str"
) -> dict[tuple[int, int], tuple[frozenset[BatchDescriptor], ...]]:
    """(num_tokens, LoRA case) -> priority tiers: FULL graphs first, then
    PIECEWISE, each by increasing size.  Dispatch tries the tiers in order;
    inside a tier the order is an implementation detail (same num_tokens)."""
    rs = get_ruleset(ruleset)
    config = rs.effective_config(config)
    descs = expected_capture_descs(config, rs)
    if not descs:
        return {}
    max_size = config.max_capture_size
    assert max_size is not None
    out: dict[tuple[int, int], tuple[frozenset[BatchDescriptor], ...]] = {}
    for lora in config.lora_cases:
        groups_by_mode = []
        for mode in (F, P):
            by_tokens: dict[int, set[BatchDescriptor]] = defaultdict(set)
            for d in descs.get(mode, ()):
                if d.num_active_loras == lora:
                    by_tokens[d.num_tokens].add(d)
            groups_by_mode.append(sorted((t, frozenset(g)) for t, g in by_tokens.items()))
        for n in range(0, max(d.num_tokens for ds in descs.values() for d in ds) + 1):
            tiers: list[frozenset[BatchDescriptor]] = []
            for groups in groups_by_mode:
                # Every larger graph of the mode, smallest first.  vLLM 0.32 lists
                # only the nearest token group; where a larger graph would have
                # fit, DISPATCH-PRIORITY / DISPATCH-COMPLETE judge the difference.
                tiers.extend(g for t, g in groups if t >= n)
            if tiers:
                out[(n, lora)] = tuple(tiers)
    return out
