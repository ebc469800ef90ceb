"""SPEC §4 properties on hand-made traces.

A correct run is simulated from the spec (``good_trace``: the capture plan,
candidate tiers and dispatch oracle); each test then breaks one thing and
checks that exactly the property about it speaks up, naming what it saw.
No torch, no targets, no runner.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import AttentionSupport, CUDAGraphMode
from cgsim.properties import (
    ALL_PROPERTIES,
    PROPERTIES,
    Verdict,
    Violation,
    check_scenario,
    property_ids,
    resolve_alias,
    useless_descriptors,
)
from cgsim.properties.registry import FAMILIES, InvalidProperty, declare
from cgsim.scenario import Scenario, Step
from cgsim.spec import (
    desc_sort_key,
    eager_descriptor,
    expected_candidate_tiers,
    expected_capture_descs,
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
    Error,
    Forward,
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
                    trace.add(Forward(d, ps.mode, md, ps.in_graph, d.num_tokens, "capture", step, key))
                    if ps.mode == P:
                        trace.add(PiecewiseCapture(key, md, step))
                        graph_md[d], graph_step[d] = md, step
                    if ps.in_graph:
                        graph_md[d] = md
                else:
                    trace.add(GraphStored(d, step))
                    graph_step[d] = step
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
                trace.add(Replay(step, b, d, "full", graph_md[d], rt, True, 0.0, True, graph_step[d]))
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
                trace.add(Replay(step, b, d, "piecewise", gid, rt, alive, 0.0, True, graph_step[d]))
            else:
                trace.add(Forward(d, N, None, False, b.num_tokens, "runtime", step))
                trace.add(Replay(step, b, d, "eager", None, None, None, 0.0, True))
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


def _producible(config: ManagerConfig, steps) -> tuple:
    """The workflow's batches as the scheduler would hand them in for
    ``config``: a shape that is no decode it schedules carries a prefill."""
    from cgsim.spec.scheduler import is_decode_batch as _decode_producible

    out = []
    for st in steps:
        b = st.batch
        if b is not None and not b.has_prefill and not _decode_producible(config, b.query_lens):
            st = Step.dispatch(replace(b, has_prefill=True))
        out.append(st)
    return tuple(out)


@pytest.mark.parametrize("name,config,ruleset", GOOD_CONFIGS, ids=[c[0] for c in GOOD_CONFIGS])
def test_good_trace_has_no_violation(name, config, ruleset):
    extra = (disp(2, 2, loras=min(1, max(config.lora_cases))), disp(4, 4, 4, 4, ubatches=2) if config.num_ubatches > 1 else disp(2))
    sc = scenario(config, *_producible(config, WORKFLOW + extra),
                  ruleset=ruleset)
    verdict = check_scenario(sc, good_trace(sc))
    spec_descs = {d for ds in expected_capture_descs(config, ruleset).values() for d in ds}
    dead = KNOWN_DEAD_IN_SPEC.get(name, set()) & spec_descs  # the spec may drop them
    rest = [v for v in verdict.violations if not (v.property == "CAPTURE-USEFUL" and any(d.short() + " " in v.message for d in dead))]
    assert not rest, "\n".join(map(str, rest))
    assert len(verdict.violations) == len(dead)
    assert "NO-CRASH" in verdict.checked and "INIT-TOTAL" in verdict.checked


# Capture descriptors of the spec (as first written) that CAPTURE-USEFUL finds
# dead; see test_dead_graphs_of_the_first_spec.
KNOWN_DEAD_IN_SPEC = {
    # q=3 for 1-2 requests, q=2 for 3-8: candidate init builds every decode
    # length for every size, so q=3 with 3 requests never runs (q=2 with 2
    # does, after a batch of 3 or more shrinks).
    "dyn-spec": {BatchDescriptor(F, 9, 3, 3)},
}


@pytest.mark.parametrize("name,config,ruleset", GOOD_CONFIGS[:10], ids=[c[0] for c in GOOD_CONFIGS[:10]])
def test_partial_traces_never_crash_a_property(name, config, ruleset):
    sc = scenario(config, *WORKFLOW, ruleset=ruleset)
    full = good_trace(sc)
    for cut in range(len(full.events) + 1):
        events = full.events[:cut]
        step = max((getattr(e, "step", 0) for e in events), default=0)
        events = events + [Error(step, "capture", "crash", "RuntimeError", "boom")]
        partial = Trace.from_header(full.header, events, full.metadata)
        verdict = check_scenario(sc, partial)
        assert "NO-CRASH" in ids(verdict.violations)


def test_property_table_covers_spec_and_has_one_line_statements():
    spec_ids = (
        "CAND-ORDER", "CAND-BOUNDS", "CAPTURE-ORDER", "CAPTURE-ONCE", "WARMUP-FIRST", "FRESH-METADATA",
        "SKIP-ATTN", "METADATA-LIVE", "PAD-CONSISTENT", "KEY-CONSISTENT", "CAPTURE-USEFUL", "DECODE-LENGTHS",
        "INIT-TOTAL", "NO-ILLEGAL-OP", "DISPATCH-SOUND", "DISPATCH-PRIORITY", "DISPATCH-COMPLETE",
        "DISPATCH-MINIMAL", "DISPATCH-ROUNDTRIP", "BEFORE-CAPTURE", "REPLAY-EQUALS-EAGER", "MODE-RESOLUTION",
        "RELEASE-RECAPTURE",
    )
    assert set(spec_ids) | {"NO-CRASH", "NO-HANG"} <= set(property_ids())
    families = [p.family for p in PROPERTIES.values()]
    assert families == sorted(families, key=FAMILIES.index), "the table is grouped by family, in family order"
    for pid, prop in PROPERTIES.items():
        assert prop.id == pid and prop.statement and "\n" not in prop.statement
    assert ALL_PROPERTIES["CHECK-CRASH"].harness_only and "CHECK-CRASH" not in PROPERTIES
    assert resolve_alias("TARGET-HANG") == "NO-HANG" and resolve_alias("TARGET-CRASH") == "NO-CRASH"


@pytest.mark.parametrize("pid,statement,kw,match", [
    ("capture-order", "x", {"family": "capture"}, "upper-case"),
    ("CAPTURE-ORDER", "x", {"family": "capture"}, "declared twice"),
    ("NEW-ONE", "", {"family": "capture"}, "one non-empty line"),
    ("NEW-ONE", "two\nlines", {"family": "capture"}, "one non-empty line"),
    ("NEW-ONE", "x" * 300, {"family": "capture"}, "at most"),
    ("NEW-ONE", "x", {"family": "nope"}, "family 'nope' is unknown"),
    ("NEW-ONE", "x", {"family": "capture", "applies": lambda a, b: True}, "exactly one"),
    ("NEW-ONE", "x", {"family": "capture", "kind": "boom"}, "kind 'boom'"),
])
def test_malformed_property_declarations_fail_at_definition(pid, statement, kw, match):
    with pytest.raises(InvalidProperty, match=match):
        declare(pid, statement, **kw)(lambda run: [])
    assert "NEW-ONE" not in ALL_PROPERTIES


def test_a_check_must_take_one_run_view():
    with pytest.raises(InvalidProperty, match="exactly one"):
        declare("NEW-TWO", "x", family="capture")(lambda scenario, trace: [])


def test_only_restricts_and_unknown_ids_are_refused():
    sc = scenario(BASE, cap(), disp(1))
    verdict = check_scenario(sc, good_trace(sc), only=["DISPATCH-SOUND", "CAND-ORDER"])
    assert verdict.checked == ("CAND-ORDER", "DISPATCH-SOUND")
    with pytest.raises(ValueError, match="NOPE"):
        check_scenario(sc, good_trace(sc), only=["NOPE"])


def test_dispatch_properties_do_not_apply_without_dispatch_steps():
    sc = scenario(BASE, cap())
    verdict = check_scenario(sc, good_trace(sc))
    assert verdict.ok
    for pid in ("DISPATCH-SOUND", "DISPATCH-PRIORITY", "DISPATCH-COMPLETE", "DISPATCH-MINIMAL",
                "DISPATCH-ROUNDTRIP", "REPLAY-EQUALS-EAGER", "METADATA-LIVE", "RELEASE-RECAPTURE"):
        assert pid not in verdict.checked
    assert "CAPTURE-USEFUL" in verdict.checked


# --------------------------------------------------------------------------
# CAND-ORDER
# --------------------------------------------------------------------------
def test_cand_order_holds():
    sc = scenario(C(breakable=True))
    assert_holds("CAND-ORDER", sc, good_trace(sc))


def test_cand_order_recomputed_differs():
    sc = scenario()
    t = mutate(good_trace(sc), is_(Candidates, phase="recomputed"),
               lambda c: replace(c, capture_descs=tuple(d for d in c.capture_descs if d != FD(8, 8, 1))))
    assert_violates("CAND-ORDER", sc, t, "recomputed vs initial", "FULL: missing", FD(8, 8, 1).short())


def test_cand_order_recomputed_candidate_lists_differ():
    sc = scenario()
    t = mutate(good_trace(sc), is_(Candidates, phase="recomputed"),
               lambda c: replace(c, candidates=tuple((k, tuple(reversed(v))) for k, v in c.candidates)))
    assert_violates("CAND-ORDER", sc, t, "candidate lists differ", "num_tokens=")


def test_cand_order_pr48822_bug_piecewise_built_as_if_not_breakable():
    cfg = C(breakable=True)
    sc = scenario(cfg)
    stale = expected_capture_order(C(breakable=False), "pr48822")  # PIECEWISE num_reqs None
    t = mutate(good_trace(sc), is_(Candidates, phase="initial"), lambda c: replace(c, capture_descs=stale))
    vs = assert_violates("CAND-ORDER", sc, t, "differ from the spec", "PIECEWISE: missing", PD(8, 8).short(),
                         "unexpected", PD(8).short(), "PR 48822")
    assert any("recomputed vs initial" in v.message for v in vs)  # recomputing on the final state disagrees too


# --------------------------------------------------------------------------
# CAND-BOUNDS
# --------------------------------------------------------------------------
def test_cand_bounds_holds():
    sc = scenario(C(decode_query_len=3, max_num_reqs=4, capture_sizes=(2, 4, 8, 12)))
    assert_holds("CAND-BOUNDS", sc, good_trace(sc))


@pytest.mark.parametrize("bad,words", [
    (FD(16, 8), ("num_tokens 16 outside 1..8",)),
    (FD(4, 6), ("num_reqs 6 > min(num_tokens 4",)),
    (FD(6, 2, 2), ("num_reqs x uniform_token_count = 2 x 2, has 6",)),
    (FD(8, 8, 1), ("appears 2 times",)),
])
def test_cand_bounds_violations(bad, words):
    sc = scenario()
    t = mutate(good_trace(sc), is_(Candidates, phase="initial"), lambda c: replace(c, capture_descs=c.capture_descs + (bad,)))
    assert_violates("CAND-BOUNDS", sc, t, bad.short(), *words)


def test_cand_bounds_candidate_list_holds_foreign_descriptor():
    sc = scenario()
    t = mutate(good_trace(sc), is_(Candidates, phase="initial"),
               lambda c: replace(c, candidates=(((8, 0), (FD(4, 4, 1),)),) + c.candidates[1:]))
    assert_violates("CAND-BOUNDS", sc, t, "candidate list (num_tokens=8, lora=0)", "fewer tokens than the key")


# --------------------------------------------------------------------------
# CAPTURE-ORDER
# --------------------------------------------------------------------------
def test_capture_order_holds():
    sc = scenario(C(lora_cases=(0, 1)))
    assert_holds("CAPTURE-ORDER", sc, good_trace(sc))


def test_capture_order_full_before_piecewise():
    sc = scenario()
    order = expected_capture_order(BASE, "pr48822")
    full_first = [d for d in order if d.cg_mode == F] + [d for d in order if d.cg_mode == P]
    assert_violates("CAPTURE-ORDER", sc, good_trace(sc, full_first), "PIECEWISE", "captured after FULL", PD(8).short())


def test_capture_order_smallest_first():
    sc = scenario()
    order = expected_capture_order(BASE, "pr48822")
    ascending = sorted([d for d in order if d.cg_mode == P], key=lambda d: d.num_tokens) + [d for d in order if d.cg_mode == F]
    assert_violates("CAPTURE-ORDER", sc, good_trace(sc, ascending), PD(4).short(), "after the smaller", PD(2).short())


# --------------------------------------------------------------------------
# CAPTURE-ONCE
# --------------------------------------------------------------------------
def test_capture_once_holds():
    sc = scenario(BASE, cap(), rel(), cap())
    assert_holds("CAPTURE-ONCE", sc, good_trace(sc))


def test_capture_once_full_captured_twice():
    sc = scenario()
    t = good_trace(sc)
    f = first(t, lambda e: isinstance(e, Forward) and e.in_graph and e.desc == FD(4, 4, 1))
    t.events.insert(t.events.index(f), f)
    assert_violates("CAPTURE-ONCE", sc, t, FD(4, 4, 1).short(), "captured 2 times")


def test_capture_once_graph_not_stored():
    sc = scenario()
    t = mutate(good_trace(sc), is_(GraphStored, desc=FD(2, 2, 1)), lambda e: None)
    assert_violates("CAPTURE-ONCE", sc, t, FD(2, 2, 1).short(), "no graph was stored")


def test_capture_once_extra_graph_stored():
    sc = scenario()
    t = good_trace(sc)
    t.events.insert(t.events.index(first(t, is_(CaptureDone))), GraphStored(FD(6, 6, 1), 0))
    assert_violates("CAPTURE-ONCE", sc, t, "stored without a capture pass", "not in the manager's FULL capture list", FD(6, 6, 1).short())


# --------------------------------------------------------------------------
# WARMUP-FIRST
# --------------------------------------------------------------------------
def test_warmup_first_holds():
    sc = scenario(C(breakable=True))
    assert_holds("WARMUP-FIRST", sc, good_trace(sc))


def test_warmup_first_full_without_warmup():
    sc = scenario()
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.desc == FD(8, 8, 1) and not e.in_graph, lambda e: None)
    assert_violates("WARMUP-FIRST", sc, t, FD(8, 8, 1).short(), "inside a FULL graph before its warmup")


def test_warmup_first_piecewise_without_create():
    sc = scenario()
    t = mutate(good_trace(sc), is_(CreateForwardFn, desc=PD(4), warmup=True), lambda e: None)
    assert_violates("WARMUP-FIRST", sc, t, PD(4).short(), "as PIECEWISE before its warmup", "no create_forward_fn(warmup=True)")


# --------------------------------------------------------------------------
# FRESH-METADATA
# --------------------------------------------------------------------------
def test_fresh_metadata_holds_full_and_breakable_piecewise():
    sc = scenario(C(breakable=True))
    assert_holds("FRESH-METADATA", sc, good_trace(sc))


def _warmup_md(t: Trace, d: BatchDescriptor) -> int:
    return first(t, lambda e: isinstance(e, Forward) and e.desc == d and e.mode == N and not e.in_graph).metadata


def test_fresh_metadata_full_reuses_warmup_object():
    sc = scenario()
    t = good_trace(sc)
    w = _warmup_md(t, FD(4, 4, 1))
    t = mutate(t, lambda e: isinstance(e, Forward) and e.in_graph and e.desc == FD(4, 4, 1), lambda e: replace(e, metadata=w))
    assert_violates("FRESH-METADATA", sc, t, "FULL graph", FD(4, 4, 1).short(), f"warmup's metadata object #{w}")


def test_fresh_metadata_breakable_piecewise_shares_state():
    sc = scenario(C(breakable=True))
    t = good_trace(sc)
    w = _warmup_md(t, PD(8, 8))
    c = first(t, lambda e: isinstance(e, Forward) and e.mode == P and e.desc == PD(8, 8)).metadata
    t.metadata[c] = replace(t.metadata[c], state=t.metadata[w].state)
    assert_violates("FRESH-METADATA", sc, t, "breakable PIECEWISE capture", PD(8, 8).short(), "shares mutable state",
                    f"#{w}")


# --------------------------------------------------------------------------
# SKIP-ATTN
# --------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,ruleset", [(BASE, "pr48822"), (BASE, "vllm-0.32"), (C(breakable=True), "pr48822")])
def test_skip_attn_holds(cfg, ruleset):
    sc = scenario(cfg, ruleset=ruleset)
    assert_holds("SKIP-ATTN", sc, good_trace(sc))


def test_skip_attn_nonbreakable_piecewise_built_metadata_under_pr48822():
    sc = scenario()
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.mode == P, lambda e: replace(e, metadata=77))
    assert_violates("SKIP-ATTN", sc, t, "PIECEWISE capture forward", PD(8).short(), "built attention metadata #77")


def test_skip_attn_full_capture_skipped_attention():
    sc = scenario()
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.in_graph, lambda e: replace(e, metadata=None))
    assert_violates("SKIP-ATTN", sc, t, "FULL graph capture forward", FD(8, 8, 1).short(), "metadata None")


def test_skip_attn_piecewise_skipped_under_vllm_032():
    sc = scenario(ruleset="vllm-0.32")
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.mode == P, lambda e: replace(e, metadata=None))
    assert_violates("SKIP-ATTN", sc, t, "ruleset vllm-0.32 builds metadata", PD(8).short())


# --------------------------------------------------------------------------
# METADATA-LIVE
# --------------------------------------------------------------------------
def test_metadata_live_holds():
    sc = scenario(C(breakable=True), cap(), disp(1, 1), disp(3, 1))
    assert_holds("METADATA-LIVE", sc, good_trace(sc))


def test_metadata_live_dead_metadata():
    sc = scenario(BASE, cap(), disp(1, 1))
    t = mutate(good_trace(sc), is_(Replay), lambda r: replace(r, metadata_alive=False))
    assert_violates("METADATA-LIVE", sc, t, "no longer alive", FD(2, 2, 1).short(), "reqs=2 tokens=2")


def test_metadata_live_rebound_buffers():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = good_trace(sc)
    r = first(t, is_(Replay))
    t.metadata[r.runtime_metadata] = replace(t.metadata[r.runtime_metadata], buffers=(901, 902, 999))
    assert_violates("METADATA-LIVE", sc, t, "rebound to new buffers [999]", FD(4, 4, 1).short())


# --------------------------------------------------------------------------
# PAD-CONSISTENT
# --------------------------------------------------------------------------
def test_pad_consistent_holds():
    sc = scenario(C(breakable=True), cap(), disp(1, 1, 1), disp(3, 1))
    assert_holds("PAD-CONSISTENT", sc, good_trace(sc))


def test_pad_consistent_unpadded_runtime_metadata():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = good_trace(sc)
    r = first(t, is_(Replay))
    t.metadata[r.runtime_metadata] = replace(t.metadata[r.runtime_metadata], num_reqs=3, num_tokens=3)
    assert_violates("PAD-CONSISTENT", sc, t, "num_reqs=4 num_tokens=4", "num_reqs=3 num_tokens=3", FD(4, 4, 1).short())


def test_pad_consistent_breakable_piecewise_unpadded_under_pr48822_only():
    cfg = C(breakable=True)
    for ruleset, judged in (("pr48822", True), ("vllm-0.32", False)):
        sc = scenario(cfg, cap(), disp(3, 1), ruleset=ruleset)
        t = good_trace(sc)
        r = first(t, is_(Replay))
        assert r.path == "piecewise"
        t.metadata[r.runtime_metadata] = replace(t.metadata[r.runtime_metadata], num_reqs=2, num_tokens=4)
        t.metadata[r.graph_metadata] = replace(t.metadata[r.graph_metadata], num_reqs=4, num_tokens=4)
        if judged:
            assert_violates("PAD-CONSISTENT", sc, t, "num_reqs=4 num_tokens=4", "num_reqs=2", r.desc.short())
        else:
            assert "PAD-CONSISTENT" not in ids(run(sc, t).violations)


def test_pad_consistent_graph_max_query_len_too_small():
    sc = scenario(C(mode=CUDAGraphMode.FULL), cap(), disp(3, 1))
    t = good_trace(sc)
    r = first(t, is_(Replay))
    t.metadata[r.graph_metadata] = replace(t.metadata[r.graph_metadata], max_query_len=1)
    assert_violates("PAD-CONSISTENT", sc, t, "max_query_len=1 < the batch's max_query_len 3", "query_lens=[3, 1]")


# --------------------------------------------------------------------------
# KEY-CONSISTENT
# --------------------------------------------------------------------------
def test_key_consistent_holds():
    sc = scenario(C(lora_cases=(0, 1)), cap(), disp(3, 1), disp(3, 1, loras=1))
    assert_holds("KEY-CONSISTENT", sc, good_trace(sc))


def test_key_consistent_lookup_drops_lora_count():
    sc = scenario(C(lora_cases=(0, 1)), cap(), disp(3, 1, loras=1))
    t = good_trace(sc)
    dropped = lambda k: k[:3] + (0,)  # noqa: E731  the runtime key forgets the LoRA count
    t = mutate(t, is_(PiecewiseLookup, step=1), lambda e: replace(e, key=dropped(e.key)))
    t = mutate(t, lambda e: isinstance(e, Forward) and e.phase == "runtime", lambda e: replace(e, key=dropped(e.key)))
    assert_violates("KEY-CONSISTENT", sc, t, PD(4, lora=1).short(), "looked up under key ('pw', 4, None, 0)",
                    "captured under [('pw', 4, None, 1)]")


def test_key_consistent_lookup_missed():
    sc = scenario(BASE, cap(), disp(3, 1))
    t = good_trace(sc)
    t = mutate(t, is_(PiecewiseLookup, step=1), lambda e: replace(e, hit=False))
    assert_violates("KEY-CONSISTENT", sc, t, "missed", PD(4).short(), "reqs=2 tokens=4")


# --------------------------------------------------------------------------
# CAPTURE-USEFUL
# --------------------------------------------------------------------------
@pytest.mark.parametrize("name,config,ruleset", GOOD_CONFIGS[:6], ids=[c[0] for c in GOOD_CONFIGS[:6]])
def test_capture_useful_holds(name, config, ruleset):
    sc = scenario(config, ruleset=ruleset)
    assert_holds("CAPTURE-USEFUL", sc, good_trace(sc))


def test_capture_useful_dead_decode_graph():
    cfg = C(mode=CUDAGraphMode.FULL)
    sc = scenario(cfg)
    dead = FD(8, 8, 3)  # q=1: no batch the scheduler produces prefers a uniform-3 graph
    t = good_trace(sc)
    done = first(t, is_(CaptureDone))
    t.events[t.events.index(done):t.events.index(done)] = [
        CreateForwardFn(dead, True), Forward(dead, N, 1, False, 8, "capture", 0),
        CreateForwardFn(dead, False), Forward(dead, N, 2, True, 8, "capture", 0), GraphStored(dead, 0)]
    vs = assert_violates("CAPTURE-USEFUL", sc, t, dead.short(), "never the unique dispatch choice")
    assert len(vs) == 1


def test_capture_useful_keeps_piecewise_size_1():
    """FULL_AND_PIECEWISE with q=1: a 1-token decode goes to the FULL graph, but
    a 1-token prompt chunk has a prefill and goes to the PIECEWISE one."""
    cfg = C(capture_sizes=(1, 2, 4, 8))
    captured = [FD(s, s, 1) for s in (1, 2, 4, 8)] + [PD(s) for s in (1, 2, 4, 8)]
    assert set(useless_descriptors(cfg, captured)) == set()


def test_dead_graphs_of_the_first_spec():
    dyn = next(c for n, c, r in GOOD_CONFIGS if n == "dyn-spec")
    # q=3 for 1-2 requests, q=2 for 3-8 requests
    dyn_captured = [FD(t, t // q, q) for q in (2, 3) for t in (q, 2 * q, 3 * q, 4 * q, 6 * q, 8 * q) if t <= 16 and t // q <= 8]
    dyn_captured += [PD(s) for s in (1, 2, 4, 8, 16)]
    # Prompt chunks carry a prefill, so only pure decodes reach decode graphs.
    # q=3 with 3-4 requests is never scheduled; q=2 with 1-2 requests is, once
    # a batch of 3 or more shrinks (vLLM's scheduler: tests/test_vllm_scheduler.py).
    assert set(useless_descriptors(dyn, dyn_captured)) == {FD(9, 3, 3), FD(12, 4, 3)}
    varlen = next(c for n, c, r in GOOD_CONFIGS if n == "varlen")
    vdesc = lambda t: BatchDescriptor(F, t, t, None, 2)  # noqa: E731
    # varlen FULL decode graphs take every pure decode of up to 2 tokens, but a
    # 2-token prompt chunk has a prefill and runs on the PIECEWISE graph.
    assert set(useless_descriptors(varlen, [vdesc(2), vdesc(4), vdesc(8), PD(2), PD(4), PD(8)])) == set()


def test_capture_useful_dynamic_spec_decode_graph_for_unscheduled_length():
    # The schedule gives 2 spec tokens (q=3) only to batches of 1-2 requests:
    # a q=3 decode graph for 4 requests is never used.
    cfg = C(mode=CUDAGraphMode.FULL_DECODE_ONLY, decode_query_len=3, spec_schedule=((1, 2, 2), (3, 8, 1)),
                     capture_sizes=(3, 6, 12))
    captured = [FD(12, 4, 3), FD(6, 2, 3), FD(12, 6, 2)]
    dead = useless_descriptors(cfg, captured)
    assert set(dead) == {FD(12, 4, 3)}


# --------------------------------------------------------------------------
# DECODE-LENGTHS
# --------------------------------------------------------------------------
DYN = C(decode_query_len=3, spec_schedule=((1, 2, 2), (3, 8, 1)), capture_sizes=(1, 2, 4, 8, 16))


def test_decode_lengths_holds_with_dynamic_schedule():
    sc = scenario(DYN)
    assert_holds("DECODE-LENGTHS", sc, good_trace(sc))


def test_decode_lengths_schedule_ignored():
    sc = scenario(DYN)
    static = good_trace(scenario(C(decode_query_len=3, capture_sizes=(1, 2, 4, 8, 16))))  # graphs for q=3 only
    assert_violates("DECODE-LENGTHS", sc, static, "no FULL decode graph for query length(s) [2]",
                    "the scheduler produces [2, 3]", "dynamic schedule")


def test_decode_lengths_length_never_scheduled():
    sc = scenario(BASE)
    t = good_trace(scenario(C(decode_query_len=2)))
    assert_violates("DECODE-LENGTHS", sc, t, "query length(s) [2] the scheduler never produces", "uniform=2")


def test_decode_lengths_does_not_apply_to_varlen_or_plain_full():
    for cfg in (C(varlen_decode=True), C(mode=CUDAGraphMode.FULL)):
        sc = scenario(cfg)
        assert "DECODE-LENGTHS" not in check_scenario(sc, good_trace(sc)).checked


# --------------------------------------------------------------------------
# INIT-TOTAL
# --------------------------------------------------------------------------
def test_init_total_holds():
    sc = scenario(DYN)
    assert_holds("INIT-TOTAL", sc, good_trace(sc))


def test_init_total_build_crash_on_valid_config():
    sc = scenario()
    t = Trace("test", "mock", events=[Error(0, "build", "crash", "AttributeError", "'NoneType' has no attribute 'breakable'")])
    assert_violates("INIT-TOTAL", sc, t, "building the manager failed", "AttributeError", "FULL_AND_PIECEWISE")


def test_init_total_rejected_config_may_fail_to_build():
    sc = scenario(C(mode=CUDAGraphMode.FULL, attention_support=AttentionSupport.NEVER))
    t = Trace("test", "mock", events=[Error(0, "build", "crash", "ModeResolutionError", "needs full graphs")])
    assert_holds("INIT-TOTAL", sc, t)
    hung = Trace("test", "mock", events=[Error(0, "build", "timeout", "TimeoutError", "hung")])
    assert_violates("INIT-TOTAL", sc, hung, "timeout")


def test_init_total_insane_descriptor():
    sc = scenario()
    bad = FD(8, 2, 4)  # uniform 4 > the largest decode query length 1
    t = mutate(good_trace(sc), is_(Candidates, phase="initial"), lambda c: replace(c, capture_descs=c.capture_descs + (bad,)))
    assert_violates("INIT-TOTAL", sc, t, bad.short(), "uniform_token_count 4 outside 1..1")


# --------------------------------------------------------------------------
# NO-ILLEGAL-OP and NO-CRASH
# --------------------------------------------------------------------------
def test_no_illegal_op_holds():
    sc = scenario()
    assert_holds("NO-ILLEGAL-OP", sc, good_trace(sc))


def test_no_illegal_op_reports_the_error():
    sc = scenario()
    t = good_trace(sc)
    t.events = t.events[:5] + [Error(0, "capture", "illegal-op", "RuntimeError", "operation not permitted when stream is capturing")]
    vs = assert_violates("NO-ILLEGAL-OP", sc, t, "during capture", "operation not permitted")
    assert vs[0].step == 0
    assert "NO-CRASH" not in ids(run(sc, t).violations)


def test_no_crash_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("NO-CRASH", sc, good_trace(sc))


def test_no_crash_reports_crash_in_dispatch():
    sc = scenario(BASE, cap(), disp(1))
    t = good_trace(sc)
    t.events = [e for e in t.events if not isinstance(e, (Replay, Dispatch))] + [
        Error(1, "dispatch", "crash", "KeyError", "(8, 0)")]
    assert_violates("NO-CRASH", sc, t, "raised during dispatch", "KeyError")
    assert "INIT-TOTAL" not in ids(run(sc, t).violations)


# --------------------------------------------------------------------------
# DISPATCH-*
# --------------------------------------------------------------------------
def _redispatch(t: Trace, step: int, desc: BatchDescriptor, path: str | None = None) -> Trace:
    t = mutate(t, is_(Dispatch, step=step), lambda e: replace(e, desc=desc))
    return mutate(t, is_(Replay, step=step), lambda e: replace(e, desc=desc, path=path or e.path))


def test_dispatch_sound_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("DISPATCH-SOUND", sc, good_trace(sc))


def test_dispatch_sound_incompatible_descriptor():
    sc = scenario(BASE, cap(), disp(3, 1))
    t = _redispatch(good_trace(sc), 1, FD(4, 4, 1), "full")
    assert_violates("DISPATCH-SOUND", sc, t, FD(4, 4, 1).short(), "uniform_token_count 1 != batch's None", "query_lens=[3, 1]")


def test_dispatch_sound_full_without_stored_graph():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = mutate(good_trace(sc), is_(GraphStored, desc=FD(4, 4, 1)), lambda e: None)
    assert_violates("DISPATCH-SOUND", sc, t, "no graph is stored", FD(4, 4, 1).short())


def test_dispatch_sound_piecewise_without_runner():
    sc = scenario(BASE, cap(), disp(3, 1))
    t = good_trace(sc)
    t = Trace.from_header(replace(t.header, has_piecewise_runner=False), t.events, t.metadata)
    assert_violates("DISPATCH-SOUND", sc, t, "nothing runs piecewise graphs", PD(4).short())


def test_dispatch_priority_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("DISPATCH-PRIORITY", sc, good_trace(sc))


def test_dispatch_priority_piecewise_over_full():
    sc = scenario(BASE, cap(), disp(1, 1))
    t = _redispatch(good_trace(sc), 1, PD(2), "piecewise")
    assert_violates("DISPATCH-PRIORITY", sc, t, PD(2).short(), "captured FULL", FD(2, 2, 1).short())


def test_dispatch_complete_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("DISPATCH-COMPLETE", sc, good_trace(sc))


def test_dispatch_complete_eager_fallback():
    sc = scenario(BASE, cap(), disp(3, 1))
    b = Batch((3, 1))
    t = _redispatch(good_trace(sc), 1, eager_descriptor(b, (0,)), "eager")
    assert_violates("DISPATCH-COMPLETE", sc, t, "ran eagerly", "query_lens=[3, 1]", PD(4).short())


def test_dispatch_minimal_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("DISPATCH-MINIMAL", sc, good_trace(sc))


def test_dispatch_minimal_pads_too_much():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = _redispatch(good_trace(sc), 1, FD(8, 8, 1))
    assert_violates("DISPATCH-MINIMAL", sc, t, FD(8, 8, 1).short(), "(5, 5)", FD(4, 4, 1).short(), "(1, 1)")


def test_dispatch_roundtrip_holds():
    sc = scenario(BASE, cap(), disp(1, 1, 1, 1), disp(3, 1), disp(2, 2, 2, 2))
    assert_holds("DISPATCH-ROUNDTRIP", sc, good_trace(sc))


def test_dispatch_roundtrip_allows_full_with_request_padding():
    # varlen FULL (8 tokens, 8 reqs, max_q 2) over the exact PIECEWISE 8: same tokens, higher priority.
    sc = scenario(C(varlen_decode=True, decode_query_len=2), cap(), disp(2, 2, 2, 2))
    t = good_trace(sc)
    assert first(t, is_(Dispatch)).desc.cg_mode == F
    assert_holds("DISPATCH-ROUNDTRIP", sc, t)


def test_dispatch_roundtrip_higher_priority_pads_tokens_only_as_the_oracle_chooses():
    # A 4-token batch with an exact PIECEWISE graph and two larger FULL ones:
    # the smaller FULL graph is what DISPATCH-PRIORITY and the oracle ask for
    # (FULL over PIECEWISE, then least padding), so it is no roundtrip
    # failure; the larger one is.
    sc = scenario(C(mode=CUDAGraphMode.FULL_AND_PIECEWISE), cap(), disp(3, 1))
    t = mutate(good_trace(sc), lambda e: True, lambda e: e)
    t.events.insert(0, GraphStored(FD(8, 8), 0))  # FULL mixed graphs of 8 and 6 tokens
    t.events.insert(0, GraphStored(FD(6, 6), 0))
    assert_violates("DISPATCH-ROUNDTRIP", sc, _redispatch(t, 1, FD(8, 8), "full"), "exactly the shape of captured",
                    PD(4).short(), FD(8, 8).short())
    assert_holds("DISPATCH-ROUNDTRIP", sc, _redispatch(t, 1, FD(6, 6), "full"))


def test_dispatch_roundtrip_exact_shape_goes_elsewhere():
    sc = scenario(BASE, cap(), disp(1, 1, 1, 1))
    t = _redispatch(good_trace(sc), 1, FD(8, 8, 1))
    assert_violates("DISPATCH-ROUNDTRIP", sc, t, "exactly the shape of captured", FD(4, 4, 1).short(), FD(8, 8, 1).short())


def test_before_capture_holds():
    sc = scenario(BASE, disp(1), cap(), disp(1), rel(), disp(1))
    t = good_trace(sc)
    assert [d.desc.cg_mode for d in t.of(Dispatch)] == [N, F, N]
    assert_holds("BEFORE-CAPTURE", sc, t)


def test_before_capture_dispatch_returns_graph_before_capture():
    sc = scenario(BASE, disp(1, 1), cap())
    t = _redispatch(good_trace(sc), 0, FD(2, 2, 1))
    assert_violates("BEFORE-CAPTURE", sc, t, "before any successful capture", FD(2, 2, 1).short(), "reqs=2 tokens=2")


def test_before_capture_dispatch_returns_graph_after_release():
    sc = scenario(BASE, cap(), rel(), disp(1, 1))
    t = _redispatch(good_trace(sc), 2, FD(2, 2, 1))
    assert_violates("BEFORE-CAPTURE", sc, t, "after a release", FD(2, 2, 1).short())


def test_before_capture_flag_not_set_after_capture():
    sc = scenario()
    t = mutate(good_trace(sc), is_(CaptureDone), lambda e: replace(e, captured_flag=False))
    assert_violates("BEFORE-CAPTURE", sc, t, "not marked captured")


# --------------------------------------------------------------------------
# REPLAY-EQUALS-EAGER
# --------------------------------------------------------------------------
def test_replay_equals_eager_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("REPLAY-EQUALS-EAGER", sc, good_trace(sc))


def test_replay_equals_eager_wrong_output():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = mutate(good_trace(sc), is_(Replay), lambda r: replace(r, outputs_ok=False, max_abs_err=0.25))
    assert_violates("REPLAY-EQUALS-EAGER", sc, t, "full run of", FD(4, 4, 1).short(), "max abs error 0.25", "reqs=3")


# --------------------------------------------------------------------------
# MODE-RESOLUTION
# --------------------------------------------------------------------------
def test_mode_resolution_holds_inkling_seed():
    cfg = C(mode=CUDAGraphMode.PIECEWISE, attention_support=AttentionSupport.UNIFORM_BATCH)
    sc = scenario(cfg)
    t = good_trace(sc)
    assert t.resolved_mode == P
    assert_holds("MODE-RESOLUTION", sc, t)


def test_mode_resolution_wrong_mode():
    cfg = C(attention_support=AttentionSupport.UNIFORM_SINGLE_TOKEN_DECODE, decode_query_len=2)
    sc = scenario(cfg)
    t = good_trace(sc)
    t = Trace.from_header(replace(t.header, resolved_mode=CUDAGraphMode.FULL_AND_PIECEWISE), t.events, t.metadata)
    assert_violates("MODE-RESOLUTION", sc, t, "resolved to FULL_AND_PIECEWISE, expected PIECEWISE",
                    "needs attention support UNIFORM_BATCH > declared UNIFORM_SINGLE_TOKEN_DECODE")


def test_mode_resolution_rejected_config_resolved_anyway():
    sc = scenario(C(mode=CUDAGraphMode.FULL, attention_support=AttentionSupport.NEVER))
    t = Trace.from_header(TraceHeader("test", "mock", resolved_mode=CUDAGraphMode.FULL))
    assert_violates("MODE-RESOLUTION", sc, t, "the spec rejects this config", "resolved it to FULL")


# --------------------------------------------------------------------------
# RELEASE-RECAPTURE
# --------------------------------------------------------------------------
def test_release_recapture_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("RELEASE-RECAPTURE", sc, good_trace(sc))


def test_release_recapture_release_keeps_graphs():
    sc = scenario(BASE, cap(), rel())
    t = mutate(good_trace(sc), is_(Release), lambda e: replace(e, graphs_after=3, captured_flag_after=True))
    assert_violates("RELEASE-RECAPTURE", sc, t, "left 3 graph(s)", "left the manager marked captured")


def test_release_recapture_replays_old_graph():
    sc = scenario(BASE, cap(), rel(), cap(), disp(1, 1))
    t = mutate(good_trace(sc), is_(Replay), lambda r: replace(r, graph_from_step=0))
    assert_violates("RELEASE-RECAPTURE", sc, t, "graph from capture step 0", "released at step 1", FD(2, 2, 1).short())


# --------------------------------------------------------------------------
# traces laid out the way cgsim.runner and the targets record them
# --------------------------------------------------------------------------
def as_runner_layout(t: Trace) -> Trace:
    """The runner's layout: the "initial" candidates once at build (step -1),
    "recomputed" once after the first capture, and GraphStored read off the
    manager after each capture (every graph it holds, carried-over ones too)."""
    initial = first(t, is_(Candidates, phase="initial"))
    recomputed = first(t, is_(Candidates, phase="recomputed"))
    events, pending, held, seen_done = [replace(initial, step=-1)], [], [], False
    for e in t.events:
        if isinstance(e, Candidates):
            continue
        if isinstance(e, GraphStored):
            pending.append(e)
            continue
        if isinstance(e, CaptureDone):
            fresh = [g.desc for g in pending]
            events += [GraphStored(d, e.step) for d in held if d not in fresh] + pending
            held += [d for d in fresh if d not in held]
            pending = []
            events.append(e)
            if not seen_done:
                events.append(recomputed)
                seen_done = True
            continue
        if isinstance(e, Release):
            held = []
        events.append(e)
    return Trace.from_header(t.header, events, dict(t.metadata))


@pytest.mark.parametrize("name,config,ruleset", GOOD_CONFIGS[:8], ids=[c[0] for c in GOOD_CONFIGS[:8]])
def test_runner_layout_has_no_violation(name, config, ruleset):
    sc = scenario(config, *WORKFLOW, ruleset=ruleset)
    verdict = check_scenario(sc, as_runner_layout(good_trace(sc)))
    assert verdict.ok, "\n".join(map(str, verdict.violations))


def test_second_capture_without_release_that_captures_nothing():
    """capture() again with every graph already there: the runner still reads
    the held graphs off the manager; they are not new, unwarmed captures, and
    replaying them is not stale."""
    sc = scenario(C(mode=CUDAGraphMode.FULL), cap(), cap(), disp(1, 1))
    t = good_trace(scenario(C(mode=CUDAGraphMode.FULL), cap(), disp(1, 1)))
    done = first(t, is_(CaptureDone))
    at = t.events.index(done) + 1
    t.events[at:at] = [CaptureDone(1, True, True)]
    t = mutate(t, lambda e: isinstance(e, (Dispatch, Replay, PiecewiseLookup)) or (isinstance(e, Forward) and e.phase == "runtime"),
               lambda e: replace(e, step=2))
    t = as_runner_layout(t)
    full = expected_capture_descs(sc.config, sc.ruleset)[F]
    assert len(t.of(GraphStored)) == 2 * len(full)  # read off after each capture
    verdict = check_scenario(sc, t)
    assert verdict.ok, "\n".join(map(str, verdict.violations))


def test_stale_graph_after_recapture_without_release():
    sc = scenario(C(mode=CUDAGraphMode.FULL), cap(), cap(), disp(1, 1))
    t = good_trace(sc)
    t = mutate(t, is_(Replay), lambda r: replace(r, graph_from_step=0))
    assert_violates("RELEASE-RECAPTURE", sc, t, "stale graph from capture step 0", "latest capture was at step 1")


def test_breakable_piecewise_capture_reported_in_graph():
    """The vLLM adapter marks a breakable PIECEWISE capture pass in_graph (its
    pieces are graphs): still a PIECEWISE capture, not a FULL one."""
    sc = scenario(C(mode=CUDAGraphMode.PIECEWISE, breakable=True))
    t = mutate(good_trace(sc), lambda e: isinstance(e, Forward) and e.mode == P, lambda e: replace(e, in_graph=True))
    verdict = check_scenario(sc, t)
    assert verdict.ok, "\n".join(map(str, verdict.violations))
    assert "FRESH-METADATA" in verdict.checked


def test_timeout_while_building_counts_for_init_total():
    # The runner stamps a timeout with the workload's phase, "capture" before any step ran.
    sc = scenario(BASE, cap())
    t = Trace("test", "mock", events=[Error(0, "capture", "timeout", "ScenarioTimeout", "scenario exceeded its 5s timeout")])
    verdict = check_scenario(sc, t)
    # A hang is a hang wherever it happens; while building it is INIT-TOTAL too.
    assert ids(verdict.violations) == {"INIT-TOTAL", "NO-HANG"}
    assert "timeout" in verdict.violations[0].message


def test_pad_consistent_breakable_piecewise_max_query_len():
    sc = scenario(C(breakable=True), cap(), disp(3, 1))
    t = good_trace(sc)
    r = first(t, is_(Replay))
    assert r.path == "piecewise"
    t.metadata[r.graph_metadata] = replace(t.metadata[r.graph_metadata], max_query_len=1)
    assert_violates("PAD-CONSISTENT", sc, t, "piecewise replay", "max_query_len=1 < the batch's max_query_len 3")


def test_key_consistent_leaves_dispatch_after_release_to_before_capture():
    sc = scenario(C(mode=CUDAGraphMode.PIECEWISE), cap(), rel(), disp(3, 1))
    t = good_trace(scenario(C(mode=CUDAGraphMode.PIECEWISE), cap(), disp(3, 1)))
    t = mutate(t, lambda e: getattr(e, "step", None) == 1 and not isinstance(e, (GraphStored, CaptureDone)),
               lambda e: replace(e, step=2))
    t = mutate(t, is_(PiecewiseLookup), lambda e: replace(e, hit=False))
    t.events.insert(t.events.index(first(t, is_(Dispatch))), Release(1, False, 0))
    verdict = check_scenario(sc, t)
    assert "BEFORE-CAPTURE" in ids(verdict.violations)
    assert "KEY-CONSISTENT" not in ids(verdict.violations)


def test_dispatch_stable_compares_a_dispatch_with_the_sweep_after_its_capture():
    from dataclasses import replace as _replace

    from cgsim.runner import run_scenario
    from cgsim.trace import Sweep

    sc = scenario(BASE, cap(), disp(1, 1), disp(1, 1, 1))
    trace = run_scenario(sc)
    verdict = check_scenario(sc, trace)
    assert "DISPATCH-STABLE" in verdict.checked and "DISPATCH-STABLE" not in ids(verdict.violations)
    # The sweep after the capture said something else for the batch of step 1.
    shape = sc.steps[1].batch.shape
    events = []
    for e in trace.events:
        if isinstance(e, Sweep) and e.step == 0:
            i = e.batches.index(shape)
            other = next(d for d in e.descs if d != e.descs[i])
            e = _replace(e, descs=e.descs[:i] + (other,) + e.descs[i + 1:])
        events.append(e)
    changed = Trace.from_header(trace.header, events, trace.metadata)
    stable = [v for v in check_scenario(sc, changed).violations if v.property == "DISPATCH-STABLE"]
    assert stable and "in the dispatch sweep after the capture at step 0" in stable[0].message


def test_dispatch_stable_tells_prefill_splits_by_their_longest_request():
    # vLLM 0.20-0.27 pass every batch's longest request to their uniform count,
    # so [2, 2] + prefill and [3, 1] + prefill are different questions there:
    # a sweep answer for the one says nothing about the other.
    from dataclasses import replace as _replace

    from cgsim.runner import run_scenario
    from cgsim.trace import Sweep

    sc = scenario(BASE, cap(), Step.dispatch(Batch((2, 2), has_prefill=True)))
    trace = run_scenario(sc)
    shape = sc.steps[1].batch.shape
    events = []
    for e in trace.events:
        if isinstance(e, Sweep) and e.step == 0:
            step_desc = next(x.desc for x in trace.events if isinstance(x, Dispatch) and x.step == 1)
            other = next(d for d in e.descs if d != step_desc)
            split = _replace(shape, max_query_len=3)
            e = _replace(e, batches=e.batches + (split,), descs=e.descs + (other,))
        events.append(e)
    changed = Trace.from_header(trace.header, events, trace.metadata)
    assert "DISPATCH-STABLE" not in ids(check_scenario(sc, changed).violations)


def test_a_sweep_answer_that_is_no_descriptor_is_a_corrupt_state_naming_its_batch(monkeypatch):
    from cgsim.runner import run_scenario
    from cgsim.targets import reference

    handle = next(c for c in vars(reference).values() if isinstance(c, type) and "dispatch_all" in vars(c))
    real = handle.dispatch_all

    def dispatch_all(self, shapes):
        out = real(self, shapes)
        return out[:-1] + ["not a descriptor"] if self.m._graphs_captured else out

    monkeypatch.setattr(handle, "dispatch_all", dispatch_all)
    sc = scenario(BASE, cap(), disp(1, 1))
    trace = run_scenario(sc)
    errors = [e for e in trace.events if getattr(e, "kind", "") == "error"]
    assert errors and errors[0].exc_type == "CorruptState"
    assert "dispatch returned 'not a descriptor' for" in errors[0].message


def test_a_sweep_judged_again_under_other_captured_graphs_gets_its_own_best_fits():
    """Best fits are cached per (plan, captured graphs): the same swept
    batches judged with one graph fewer stored are judged against that."""
    from cgsim.runner import run_scenario

    sc = scenario(BASE, cap(), disp(1, 1))
    trace = run_scenario(sc)
    assert not check_scenario(sc, trace).violations
    stored = [e for e in trace.events if isinstance(e, GraphStored)]
    dropped = max(stored, key=lambda e: e.desc.num_tokens).desc
    events = [e for e in trace.events if not (isinstance(e, GraphStored) and e.desc == dropped)]
    fewer = Trace.from_header(trace.header, events, trace.metadata)
    sound = [v for v in check_scenario(sc, fewer).violations if v.property == "DISPATCH-SOUND"]
    assert sound and f"dispatched to FULL {dropped.short()}, but no graph is stored for it" in sound[0].message
    # ... and judged again as recorded, nothing.
    assert not check_scenario(sc, trace).violations


# -- what readers take from a violation instead of its message ---------------------------------------


def test_the_count_cap_note_and_a_sub_managers_violations_say_so_as_fields():
    import json
    import os

    from cgsim.finding import Finding
    from cgsim.properties.registry import Violation
    from cgsim.properties.view import MAX_PER_GROUP, group

    many = [Violation("DISPATCH-SOUND", f"batch {i}", 1) for i in range(4 * MAX_PER_GROUP + 3)]
    kept = group(many)
    note = Finding.from_violation(kept[-1], {"config": {}}, "reference", "mock")
    assert note.overflow == 3 and note.manager is None
    assert not any(Finding.from_violation(v, {}, "reference", "mock").overflow for v in kept[:-1])
    sub = Finding.from_violation(Violation("CAPTURE-ONCE", "draft-decode manager: twice", 0, manager="draft-decode"),
                                 {}, "vllm", "mock")
    assert sub.manager == "draft-decode" and Finding.from_json(sub.to_json()).manager == "draft-decode"
    # A finding recorded before the field existed is upgraded as it loads (the export reads its manager).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = json.load(open(os.path.join(root, "docs", "findings", "fresh-metadata-2f61040c3e.json")))
    assert "facts" not in data
    assert Finding.from_json(data).manager == "draft-prefill"


def test_a_sub_managers_violation_carries_its_manager_as_a_fact():
    from unittest import mock

    from cgsim.properties.view import RunView
    from cgsim.runner import run_scenario

    config = ManagerConfig(mode=CUDAGraphMode.FULL_AND_PIECEWISE, capture_sizes=(1, 2, 4, 8), max_num_reqs=8)
    scenario = Scenario(config, (Step.capture(), Step.dispatch(Batch((1,) * 3))))
    buggy = RunView(scenario, run_scenario(scenario, "mutant:range-off-by-one"))
    # The buggy run judged as the draft decode manager of a clean one.
    with mock.patch.object(RunView, "manager_views", lambda self: {} if self is buggy else {"draft-decode": buggy}):
        verdict = check_scenario(scenario, run_scenario(scenario, "reference"))
    assert verdict.violations
    assert all(v.manager == "draft-decode" and v.message.startswith("draft-decode manager: ")
               for v in verdict.violations)
