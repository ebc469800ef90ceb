"""What candidate init must produce: capture descriptors per mode, the capture
order and the candidate lists (SPEC §2, parametrised by the ruleset).

Written from the rules, not from any manager's loop, so that a manager whose
loop is wrong disagrees with it.
"""

from __future__ import annotations

from collections import defaultdict

from cgsim.config import ManagerConfig
from cgsim.descriptors import BatchDescriptor
from cgsim.modes import CUDAGraphMode, resolve_mode
from cgsim.spec.rulesets import Ruleset, get_ruleset

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


def _ubatch_twin(desc: BatchDescriptor, config: ManagerConfig) -> BatchDescriptor | None:
    if config.num_ubatches < 2 or desc.cg_mode != F or desc.num_reqs is None:
        return None
    per_req, rem = divmod(desc.num_tokens, desc.num_reqs)
    if rem or desc.uniform_token_count not in (None, per_req):
        return None
    if desc.num_tokens < config.num_ubatches or desc.num_tokens < config.ubatch_threshold:
        return None
    return BatchDescriptor(
        F, desc.num_tokens, desc.num_reqs, per_req, desc.max_query_len, desc.num_active_loras, config.num_ubatches
    )


def expected_capture_descs(config: ManagerConfig, ruleset: "Ruleset | str") -> dict[CUDAGraphMode, tuple[BatchDescriptor, ...]]:
    """Descriptors captured per runtime mode, each list largest first."""
    rs = get_ruleset(ruleset)
    mode = resolved_mode(config)
    if mode == N:
        return {}
    decode_mode, mixed_mode = mode.decode_mode(), mode.mixed_mode()
    separate = mode.separate_routine()
    max_reqs, max_size = config.max_num_reqs, config.max_capture_size
    assert max_size is not None
    out: dict[CUDAGraphMode, set[BatchDescriptor]] = defaultdict(set)

    def add(desc: BatchDescriptor) -> None:
        out[desc.cg_mode].add(desc)
        if rs.ubatch_twins:
            twin = _ubatch_twin(desc, config)
            if twin is not None:
                out[desc.cg_mode].add(twin)

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
    if P in out and F in out:
        out[P] = set(drop_dead_piecewise(config, sorted(out[P], key=desc_sort_key), out[F]))
    return {m: tuple(sorted(ds, key=desc_sort_key)) for m, ds in out.items() if ds}


# Small piecewise graphs are checked exhaustively; above this every batch shape
# includes a single prefill no FULL graph can take (decode lengths are <= 5).
_DEAD_CHECK_LIMIT = 12


def _partitions(n: int, max_parts: int, largest: int | None = None):
    largest = n if largest is None else largest
    if n == 0:
        yield ()
        return
    if max_parts == 0:
        return
    for first in range(min(n, largest), 0, -1):
        for rest in _partitions(n - first, max_parts - 1, first):
            yield (first,) + rest


def drop_dead_piecewise(config: ManagerConfig, piecewise_descs, full_descs) -> list[BatchDescriptor]:
    """Mixed PIECEWISE descriptors minus the dead ones: those for which every
    batch shape that would land on them (more tokens than the next smaller
    piecewise graph) is served by a FULL graph.  A dead graph costs capture time
    and pool memory and never replays (CAPTURE-USEFUL); the classic case is the
    1-token piecewise graph beside a 1-token FULL decode graph."""
    from cgsim.descriptors import Batch, compatible

    kept: list[BatchDescriptor] = []
    ascending = sorted(piecewise_descs, key=lambda d: d.num_tokens)
    previous: dict[int, int] = {}
    for d in ascending:
        lo = previous.get(d.num_active_loras, 0)
        dead = d.num_tokens <= _DEAD_CHECK_LIMIT
        if dead:
            for n in range(lo + 1, d.num_tokens + 1):
                for lens in _partitions(n, config.max_num_reqs):
                    uniform = all(q == lens[0] for q in lens)
                    ub = config.num_ubatches if (config.num_ubatches > 1 and uniform and n >= max(config.ubatch_threshold, config.num_ubatches)) else 1
                    b = Batch(lens, num_active_loras=d.num_active_loras, num_ubatches=ub)
                    if not any(compatible(f, b, config.lora_cases) for f in full_descs):
                        dead = False
                        break
                if not dead:
                    break
        if not dead:
            kept.append(d)
            previous[d.num_active_loras] = d.num_tokens
    return kept


def expected_capture_order(config: ManagerConfig, ruleset: "Ruleset | str") -> tuple[BatchDescriptor, ...]:
    """All PIECEWISE descriptors, then all FULL ones: piecewise activations are
    larger, so FULL graphs fit in the pool memory the piecewise ones grew."""
    descs = expected_capture_descs(config, ruleset)
    return descs.get(P, ()) + descs.get(F, ())


def expected_candidate_tiers(
    config: ManagerConfig, ruleset: "Ruleset | str"
) -> dict[tuple[int, int], tuple[frozenset[BatchDescriptor], ...]]:
    """(num_tokens, LoRA case) -> priority tiers.  Dispatch tries the tiers in
    order; inside a tier the order is an implementation detail (all members
    have the same num_tokens)."""
    rs = get_ruleset(ruleset)
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
                larger = [g for t, g in groups if t >= n]
                if rs.candidate_lists == "nearest-group":
                    larger = larger[:1]
                tiers.extend(larger)
            if tiers:
                out[(n, lora)] = tuple(tiers)
    return out
