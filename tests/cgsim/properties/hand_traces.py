"""SPEC §4 properties on hand-made traces.

A correct run is simulated from the spec (``good_trace``: the capture plan,
candidate tiers and dispatch oracle); each test then breaks one thing and
checks that exactly the property about it speaks up, naming what it saw.
No torch, no targets, no runner.
"""

from __future__ import annotations

import itertools

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import AttentionSupport, CUDAGraphMode
from cgsim.properties import Verdict, Violation, check_scenario
from cgsim.scenario import Scenario, Step
from cgsim.spec import (
    desc_sort_key,
    eager_descriptor,
    expected_candidate_tiers,
    expected_capture_order,
    expected_capture_plan,
    expected_dispatch,
    get_ruleset,
    resolved_mode,
    skip_attn_for,
    uses_breakable,
)
from cgsim.trace import (
    Candidates,
    CaptureDone,
    CreateForwardFn,
    Dispatch,
    Forward,
    GraphBytes,
    GraphStored,
    MetadataRecord,
    PiecewiseCapture,
    PiecewiseLookup,
    Release,
    Replay,
    Trace,
    TraceHeader,
)

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


BUFFERS = (901, 902, 903)  # the persistent buffers every metadata object reads
TOKEN_BYTES = 512  # what the model's forward takes from the pool per token of a graph
CAPTURE_STREAM = 1  # warm-ups and captures run on one side stream; steps and their replays on the default (0)


# Size 1 is left out on purpose: with q=1 and a separate FULL decode routine the
# PIECEWISE size-1 graph is dead (see test_capture_useful_flags_piecewise_size_1).
BASE_KW = dict(mode=CUDAGraphMode.FULL_AND_PIECEWISE, capture_sizes=(2, 4, 8), max_num_reqs=8)


def C(**changes) -> ManagerConfig:
    """BASE with changes (ManagerConfig.with_ keeps the resolved max_capture_size)."""
    return ManagerConfig(**{**BASE_KW, **changes})


BASE = C()


# --------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------
def scenario(config: ManagerConfig = BASE, *steps: Step, ruleset: str = "pr48822") -> Scenario:
    return Scenario(config=config, steps=tuple(steps) or (Step.capture(),), ruleset=ruleset)


def cap() -> Step:
    return Step.capture()


def rel() -> Step:
    return Step.release()


def disp(*query_lens: int, loras: int = 0, ubatches: int = 1) -> Step:
    return Step.dispatch(Batch(tuple(query_lens), loras, ubatches))


def pw_key(d: BatchDescriptor) -> tuple:
    return ("pw", d.num_tokens, d.num_reqs, d.num_active_loras)


def candidate_lists(config: ManagerConfig, ruleset: str) -> tuple:
    tiers = expected_candidate_tiers(config, ruleset)
    return tuple(
        (key, tuple(d for tier in tiers[key] for d in sorted(tier, key=desc_sort_key))) for key in sorted(tiers)
    )


def good_trace(sc: Scenario, capture_order: list[BatchDescriptor] | None = None) -> Trace:
    """What a correct manager, runner and workload record for ``sc``."""
    cfg, rs = sc.config, get_ruleset(sc.ruleset)
    mode = resolved_mode(cfg)
    breakable = uses_breakable(cfg)
    trace = Trace.from_header(TraceHeader("test", "mock", resolved_mode=mode, uses_breakable=breakable,
                                          has_piecewise_runner=mode.has_piecewise() and cfg.piecewise_available))
    ids = itertools.count(1)

    def new_md(phase: str, num_reqs: int, num_tokens: int, max_q: int) -> int:
        i = next(ids)
        trace.metadata[i] = MetadataRecord(i, num_reqs, num_tokens, max_q, phase == "capture", BUFFERS, (5000 + i,), phase)
        return i

    def capture_sizes(d: BatchDescriptor) -> tuple[int, int, int]:
        reqs = d.num_reqs if d.num_reqs is not None else min(d.num_tokens, cfg.max_num_reqs)
        return reqs, d.num_tokens, d.uniform_token_count or d.max_query_len or d.num_tokens

    plan = list(expected_capture_plan(cfg, rs))
    if capture_order is not None:
        groups: dict[BatchDescriptor, list] = {}
        for ps in plan:
            groups.setdefault(ps.desc, []).append(ps)
        plan = [ps for d in capture_order for ps in groups[d]]
    order = expected_capture_order(cfg, rs)
    cands = candidate_lists(cfg, sc.ruleset)

    captured: set[BatchDescriptor] | None = None
    graph_md: dict[BatchDescriptor, int | None] = {}
    graph_step: dict[BatchDescriptor, int] = {}
    for step, st in enumerate(sc.steps):
        if st.kind == "capture":
            md: int | None = None
            for ps in plan:
                d = ps.desc
                if ps.action == "create_forward_fn":
                    trace.add(CreateForwardFn(d, ps.warmup))
                    md = None if skip_attn_for(d, cfg, rs) else new_md("capture", *capture_sizes(d))
                elif ps.action == "forward":
                    key = pw_key(d) if ps.mode == P else None
                    trace.add(Forward(d, ps.mode, md, ps.in_graph, d.num_tokens, "capture", step, key,
                                      CAPTURE_STREAM))
                    if ps.mode == P:
                        trace.add(PiecewiseCapture(key, md, step, CAPTURE_STREAM))
                        graph_md[d], graph_step[d] = md, step
                    if ps.in_graph:
                        graph_md[d] = md
                else:
                    trace.add(GraphStored(d, step))
                    graph_step[d] = step
            # Every FULL graph in the manager's one pool, which holds the largest capture.
            full = [d for d in order if d.cg_mode == F]
            for d in full:
                trace.add(GraphBytes(step, d, 0, TOKEN_BYTES * d.num_tokens, TOKEN_BYTES * d.num_tokens,
                                     TOKEN_BYTES * max(g.num_tokens for g in full)))
            trace.add(Candidates("initial", order, cands, step))
            trace.add(Candidates("recomputed", order, cands, step))
            trace.add(CaptureDone(step, True, True))
            captured = {d for d in order if d.cg_mode == F or trace.has_piecewise_runner}
        elif st.kind == "dispatch":
            b = st.batch
            d = expected_dispatch(b, captured, cfg.lora_cases) if captured is not None else eager_descriptor(b, cfg.lora_cases)
            trace.add(Dispatch(step, b, d, captured is not None))
            if d.cg_mode == F:
                g = trace.metadata[graph_md[d]]
                rt = new_md("runtime", g.num_reqs, g.num_tokens, g.max_query_len)
                trace.add(Forward(d, N, rt, False, d.num_tokens, "runtime", step))
                trace.add(Replay(step, b, d, "full", graph_md[d], rt, True, 0.0, True, graph_step[d], 0, (0,)))
            elif d.cg_mode == P:
                gid = graph_md.get(d)
                if gid is not None and breakable and rs.pad_breakable_piecewise_metadata:
                    g = trace.metadata[gid]
                    rt = new_md("runtime", g.num_reqs, g.num_tokens, g.max_query_len)
                else:
                    rt = new_md("runtime", b.num_reqs, b.num_tokens, b.max_query_len)
                trace.add(Forward(d, P, rt, False, d.num_tokens, "runtime", step, pw_key(d)))
                trace.add(PiecewiseLookup(pw_key(d), True, step))
                alive = True if gid is not None else None
                trace.add(Replay(step, b, d, "piecewise", gid, rt, alive, 0.0, True, graph_step[d], 0, (0,)))
            else:
                trace.add(Forward(d, N, None, False, b.num_tokens, "runtime", step))
                trace.add(Replay(step, b, d, "eager", None, None, None, 0.0, True, None, 0))
        else:
            trace.add(Release(step, False, 0))
            captured = None
    return trace


def ids(violations) -> set[str]:
    return {v.property for v in violations}


def run(sc: Scenario, trace: Trace, *only: str) -> Verdict:
    return check_scenario(sc, trace, only or None)


def violations_of(pid: str, sc: Scenario, trace: Trace) -> list[Violation]:
    verdict = run(sc, trace, pid)
    assert pid in verdict.checked, f"{pid} did not apply"
    return list(verdict.violations)


def assert_violates(pid: str, sc: Scenario, trace: Trace, *words: str) -> list[Violation]:
    vs = violations_of(pid, sc, trace)
    assert vs, f"{pid} saw nothing"
    assert all(v.property == pid for v in vs)
    text = " | ".join(v.message for v in vs)
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"
    return vs


def assert_holds(pid: str, sc: Scenario, trace: Trace) -> None:
    vs = violations_of(pid, sc, trace)
    assert not vs, "\n".join(map(str, vs))


def mutate(trace: Trace, pred, fn) -> Trace:
    """A copy of ``trace`` whose events matching ``pred`` are replaced by fn(event) (None drops it)."""
    events = []
    for e in trace.events:
        if pred(e):
            new = fn(e)
            if new is not None:
                events.append(new)
        else:
            events.append(e)
    return Trace.from_header(trace.header, events, dict(trace.metadata))


def first(trace: Trace, pred):
    return next(e for e in trace.events if pred(e))


def is_(cls, **attrs):
    return lambda e: isinstance(e, cls) and all(getattr(e, k) == v for k, v in attrs.items())


FD = lambda t, r, u=None, lora=0: BatchDescriptor(F, t, r, u, None, lora)  # noqa: E731


PD = lambda t, r=None, lora=0: BatchDescriptor(P, t, r, None, None, lora)  # noqa: E731


WORKFLOW = (cap(), disp(1, 1, 1), disp(3, 1), disp(2, 2, 2, 2), disp(5, 1, 1), rel(), disp(1), cap(), disp(1, 1))


# --------------------------------------------------------------------------
# the whole table on good traces
# --------------------------------------------------------------------------
GOOD_CONFIGS = [
    ("f&p", BASE, "pr48822"),
    ("f&p-0.32", BASE, "vllm-0.32"),
    ("f&p-breakable", C(breakable=True), "pr48822"),
    ("f&p-breakable-0.32", C(breakable=True), "vllm-0.32"),
    ("full", C(mode=CUDAGraphMode.FULL), "pr48822"),
    ("full-decode-only", C(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4, 8)), "pr48822"),
    ("piecewise", C(mode=CUDAGraphMode.PIECEWISE, capture_sizes=(1, 2, 4, 8)), "pr48822"),
    ("piecewise-breakable", C(mode=CUDAGraphMode.PIECEWISE, breakable=True), "pr48822"),
    ("spec-q3", C(decode_query_len=3, capture_sizes=(1, 2, 4, 8, 16), max_num_reqs=4), "pr48822"),
    ("dyn-spec", C(decode_query_len=3, spec_schedule=((1, 2, 2), (3, 8, 1)), capture_sizes=(1, 2, 4, 8, 16)), "pr48822"),
    ("lora", C(lora_cases=(0, 1, 2)), "pr48822"),
    ("lora-0.32", C(lora_cases=(0, 2)), "vllm-0.32"),
    ("varlen", C(varlen_decode=True, decode_query_len=2), "pr48822"),
    ("dbo-0.32", C(mode=CUDAGraphMode.FULL, capture_sizes=(4, 8, 16), max_num_reqs=16, num_ubatches=2, ubatch_threshold=8), "vllm-0.32"),
    ("inkling", C(mode=CUDAGraphMode.PIECEWISE, attention_support=AttentionSupport.UNIFORM_BATCH, decode_query_len=2), "pr48822"),
    ("none", C(mode=CUDAGraphMode.NONE), "pr48822"),
]
