"""The sglang ruleset's spec and properties, without sglang: the sizing and
dispatch rules (``cgsim.spec.sglang``), the ruleset's replacements, the
SGLang-only config part and strategy, and every SGL-* property on traces
written by hand (each one shown to fail where it should)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from cgsim.config import ConfigError, ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape
from cgsim.modes import CUDAGraphMode
from cgsim.properties import PROPERTIES, check_scenario
from cgsim.scenario import Scenario, Step
from cgsim.spec import sglang as rules
from cgsim.spec.sglang import LATEST
from cgsim.spec.rulesets import RULESETS, get_ruleset
from cgsim.spec.sglang_options import SglangOptions
from cgsim.trace import (
    Candidates,
    CaptureDone,
    CreateForwardFn,
    Dispatch,
    EngineAlignment,
    GraphOutput,
    GraphStored,
    RankDispatch,
    Trace,
    TraceHeader,
)
from cgsim.targets.sglang import SglangTarget
from cgsim.targets.sglang.strategies import sglang_configs
from fuzz.strategies import RULESET_NAMES, scenarios

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
BS = (1, 2, 3, 4, 8, 12, 16, 24, 32)


def cfg(**kw) -> ManagerConfig:
    kw.setdefault("mode", "FULL_DECODE_ONLY")
    kw.setdefault("capture_sizes", BS)
    return ManagerConfig(**kw)


def sgl(**options) -> tuple[SglangOptions]:
    """A config's engine options holding these SGLang options."""
    return (SglangOptions(**options),)


# -- sizing rules (the table of get_batch_sizes_to_capture seen in sglang 0.5.23) --------------


@pytest.mark.parametrize("kw,want", [
    (dict(max_num_reqs=64), BS),
    (dict(max_num_reqs=20), (1, 2, 3, 4, 8, 12, 16, 20)),  # clamped, the pool appended
    (dict(max_num_reqs=6), (1, 2, 3, 4, 6)),
    (dict(max_num_reqs=64, num_ubatches=2), (2, 4, 8, 12, 16, 24, 32)),  # two-batch overlap: even sizes
    (dict(max_num_reqs=7, num_ubatches=2), (2, 4, 8)),  # the pool 7 rounds up to 8
    (dict(max_num_reqs=64, decode_query_len=4), BS),
])
def test_decode_capture_sizes(kw, want):
    assert rules.decode_capture_bs(cfg(**kw)) == want


def test_default_ladder_always_holds_the_max_bs():
    assert rules.default_decode_bs(20, False, False) == [1, 2, 4, 8, 12, 16, 20]
    spec = rules.default_decode_bs(13, False, True)
    assert spec[:8] == list(range(1, 9)) and spec[-1] == 13
    assert rules.default_decode_bs(5, True, False) == [1, 2, 3, 4, 5]
    c = cfg(capture_sizes=(20,), max_num_reqs=64, engine_options=sgl(default_bs_list=True))
    assert rules.decode_capture_bs(c) == (1, 2, 4, 8, 12, 16, 20)


def test_prefill_buckets_align_and_keep_their_order():
    assert rules.prefill_capture_tokens(cfg(capture_sizes=(3, 8, 5)), LATEST) == (3, 5, 8)
    assert rules.prefill_capture_tokens(cfg(capture_sizes=(3, 8, 5), num_ubatches=2), LATEST) == (4, 6, 8)


def test_capture_order_prefill_first_largest_first_lora_before_base():
    c = cfg(mode="FULL_AND_PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4, lora_cases=(0, 2))
    got = [(d.cg_mode, d.num_tokens, d.num_active_loras) for d in rules.expected_capture_descs(c, LATEST)]
    assert got == [(P, 4, 2), (P, 2, 2), (F, 4, 2), (F, 4, 0), (F, 2, 2), (F, 2, 0)]
    single = cfg(capture_sizes=(2,), max_num_reqs=4, lora_cases=(0, 2), engine_options=sgl(record_nolora_graph=False))
    assert [d.num_active_loras for d in rules.expected_capture_descs(single, LATEST)] == [2]


def test_modes_name_the_two_runners():
    assert rules.runner_backends(cfg(mode="FULL")) == ("full", "full")
    assert rules.runner_backends(cfg(mode="FULL_AND_PIECEWISE")) == ("full", "breakable")
    assert rules.runner_backends(cfg(mode="PIECEWISE")) == ("breakable", "breakable")
    # No piecewise capture: the breakable runners are off (SPEC §2's drop).
    off = cfg(mode="FULL_AND_PIECEWISE", compiled_piecewise=False, breakable=False)
    assert rules.runner_backends(off) == ("full", "disabled") and rules.resolved_mode(off) == CUDAGraphMode.FULL_DECODE_ONLY


def test_configs_sglang_has_no_counterpart_for():
    assert rules.unsupported_reason(cfg()) is None
    assert "support" in rules.unsupported_reason(cfg(attention_support="UNIFORM_BATCH"))
    assert "lora_cases" in rules.unsupported_reason(cfg(lora_cases=(0, 1, 2)))
    assert "varlen" in rules.unsupported_reason(cfg(decode_query_len=2, varlen_decode=True))


# -- the dispatch oracle --------------------------------------------------------------------


def dispatch(c: ManagerConfig, batch):
    return rules.expected_dispatch(c, rules.Graphs.of(rules.expected_capture_descs(c, LATEST)), batch, LATEST)


def test_decode_bisects_to_the_smallest_captured_bs():
    c = cfg(capture_sizes=(1, 2, 4, 8, 12), max_num_reqs=16)
    assert dispatch(c, Batch((1,) * 5)) == BatchDescriptor(F, 8, 8, 1)
    assert dispatch(c, Batch((1,) * 12)) == BatchDescriptor(F, 12, 12, 1)
    assert dispatch(c, Batch((1,) * 13)) is None  # above the largest graph: eager
    assert dispatch(c, Batch((3,), has_prefill=True)) is None  # no prefill runner


def test_padding_disabled_replays_exact_keys_only():
    c = cfg(capture_sizes=(1, 2, 4, 8), max_num_reqs=8, engine_options=sgl(disable_padding=True))
    assert dispatch(c, Batch((1,) * 4)) == BatchDescriptor(F, 4, 4, 1)
    assert dispatch(c, Batch((1,) * 3)) is None


def test_two_batch_overlap_needs_the_split():
    c = cfg(capture_sizes=(2, 4), max_num_reqs=4, num_ubatches=2, ubatch_threshold=2)
    assert dispatch(c, Batch((1,) * 3, num_ubatches=2)) == BatchDescriptor(F, 4, 4, 1, num_ubatches=2)
    assert dispatch(c, Batch((1,) * 3)) is None


def test_dp_attention_pads_to_the_max_over_ranks():
    assert rules.dp_rank_sizes(5, 3, 8) == (5, 6, 7) and rules.dp_rank_sizes(8, 3, 8) == (8, 1, 2)
    assert rules.dp_rank_sizes(1, 2, 1) == (1, 1)
    c = cfg(capture_sizes=(4, 8), max_num_reqs=8, engine_options=sgl(dp_size=2))
    assert dispatch(c, Batch((1,) * 5)) == BatchDescriptor(F, 8, 8, 1)
    assert dispatch(c, Batch((1,) * 4)) == BatchDescriptor(F, 8, 8, 1)  # the peer holds 5


def test_lora_variant_follows_the_adapters():
    c = cfg(capture_sizes=(4,), max_num_reqs=4, lora_cases=(0, 2))
    assert dispatch(c, Batch((1,) * 3)).num_active_loras == 0
    assert dispatch(c, Batch((1,) * 3, num_active_loras=1)).num_active_loras == 2
    one = cfg(capture_sizes=(4,), max_num_reqs=4, lora_cases=(0, 2), engine_options=sgl(record_nolora_graph=False))
    assert dispatch(one, Batch((1,) * 3)).num_active_loras == 2


def test_prefill_bucket_rules():
    c = cfg(mode="FULL_AND_PIECEWISE", capture_sizes=(8, 16), max_num_reqs=4)
    assert dispatch(c, Batch((5,), has_prefill=True)) == BatchDescriptor(P, 8)
    assert dispatch(c, Batch((3,), has_prefill=True)) is None  # bucket 8 > 2 x 3
    assert dispatch(c, Batch((17,), has_prefill=True)) is None
    # A "decode" of another width is an extend for sglang.
    assert dispatch(c, Batch((2, 2, 2))) == BatchDescriptor(P, 8)
    full = cfg(mode="FULL", capture_sizes=(8,), max_num_reqs=4, engine_options=sgl(full_prefill_max_req=2))
    assert dispatch(full, Batch((3, 3), has_prefill=True)) == BatchDescriptor(F, 8, 2)
    assert dispatch(full, Batch((2, 2, 2), has_prefill=True)) is None  # more requests than slots


# -- config, ruleset, strategy ---------------------------------------------------------------------


def test_sglang_options_round_trip_and_stay_out_of_other_json():
    c = cfg(engine_options=sgl(dp_size=2, disable_padding=True))
    assert ManagerConfig.from_json(json.loads(json.dumps(c.to_json()))) == c
    assert "sglang" not in cfg().to_json()
    with pytest.raises(ConfigError, match="sglang.dp"):
        ManagerConfig.from_json({"sglang": {"dp": 2}})
    with pytest.raises(ConfigError, match="sglang.dp_size"):
        SglangOptions(dp_size=0)


def test_ruleset_replacements_are_declared_properties():
    rs = get_ruleset("sglang")
    assert rs.engine == "sglang" and "sglang" not in RULESET_NAMES and set(RULESET_NAMES) < set(RULESETS)
    for universal, own in rs.replaces:
        assert universal in PROPERTIES and own in PROPERTIES
        assert not rs.judges(universal) and rs.judges(own)
    for universal, why in rs.waives:
        assert universal in PROPERTIES and why and not rs.judges(universal)
    assert all(get_ruleset(name).judges(pid) for name in RULESET_NAMES for pid in PROPERTIES if not pid.startswith("SGL-"))


@settings(max_examples=60, deadline=None)
@given(sglang_configs())
def test_strategy_draws_configs_sglang_maps(c):
    assert rules.unsupported_reason(c) is None
    if rules.options(c).dp_size > 1:
        assert c.mode == CUDAGraphMode.FULL_DECODE_ONLY and c.decode_query_len == 1


@settings(max_examples=20, deadline=None)
@given(scenarios(ruleset="sglang", config_strategy=SglangTarget().drawing.config_strategy))
def test_sglang_scenarios_carry_the_sglang_part(sc):
    assert sc.ruleset == "sglang" and sc.config.options(SglangOptions) is not None


# -- SGL-* properties on hand-written traces ---------------------------------------------------------


def judge(c: ManagerConfig, steps, events, only, alignment: EngineAlignment | None = None) -> list[str]:
    """The violations of ``only``; ``alignment``: what the engine answered, as the sglang target records it."""
    sc = Scenario(c, tuple(steps), ruleset="sglang")
    trace = Trace.from_header(TraceHeader("sglang", "mock", resolved_mode=rules.resolved_mode(c), alignment=alignment),
                              events)
    verdict = check_scenario(sc, trace, only=only)
    assert set(only) <= set(verdict.checked)
    return [v.message for v in verdict.violations]


def captured(c: ManagerConfig, descs=None):
    descs = tuple(rules.expected_capture_descs(c, LATEST) if descs is None else descs)
    events = [Candidates("initial", descs, (), -1)]
    for d in descs:
        events.append(CreateForwardFn(d, True))
    events += [GraphStored(d, 0) for d in descs if d.cg_mode == F]
    events.append(CaptureDone(0, True, True))
    return events


SMALL = cfg(capture_sizes=(1, 2, 4), max_num_reqs=4)


def test_cand_order_and_bounds_hold_for_the_spec_and_fail_without_the_largest():
    ok = captured(SMALL)
    assert judge(SMALL, [Step.capture()], ok, ["SGL-CAND-ORDER", "SGL-CAND-BOUNDS", "SGL-CAPTURE-ALIGNED"]) == []
    short = captured(SMALL, rules.expected_capture_descs(SMALL, LATEST)[1:])  # bs 4 missing
    msgs = judge(SMALL, [Step.capture()], short, ["SGL-CAND-ORDER", "SGL-CAND-BOUNDS"])
    assert any("missing" in m for m in msgs) and any("largest decode graph is bs 2" in m for m in msgs)
    big = captured(SMALL, rules.expected_capture_descs(SMALL, LATEST) + (BatchDescriptor(F, 9, 9, 1),))
    assert any("outside 1..4" in m for m in judge(SMALL, [Step.capture()], big, ["SGL-CAND-BOUNDS"]))


def test_capture_aligned_fails_for_an_odd_bs_under_two_batch_overlap():
    c = cfg(capture_sizes=(2, 4), max_num_reqs=4, num_ubatches=2)
    odd = captured(c, rules.expected_capture_descs(c, LATEST) + (BatchDescriptor(F, 3, 3, 1, num_ubatches=2),))
    assert any("not a multiple of the alignment 2" in m for m in judge(c, [Step.capture()], odd, ["SGL-CAPTURE-ALIGNED"]))


def engine(decode: int, prefill: int | None = None) -> EngineAlignment:
    return EngineAlignment(decode, prefill, rules.ALIGNMENT_HELPER)


ALIGN_IDS = ["SGL-CAND-ORDER", "SGL-CAND-BOUNDS", "SGL-CAPTURE-ALIGNED"]


def test_the_alignment_properties_judge_by_the_engines_recorded_answer():
    # Two-batch overlap: cgsim's copy says 2.  An engine answering 4 (attention
    # TP 2 with gathered buffers, which no cgsim config says) makes bs 2 and the
    # pool 3 rounded to 4 wrong / right by its answer, not by the copy.
    c = cfg(mode="FULL", capture_sizes=(2, 4, 6), max_num_reqs=3, num_ubatches=2)
    by_copy = captured(c)  # bs 2, 4; prefill buckets 2, 4, 6
    assert judge(c, [Step.capture()], by_copy, ALIGN_IDS) == []
    msgs = judge(c, [Step.capture()], by_copy, ALIGN_IDS, engine(4, 4))
    assert any("bs 2 x 1 = 2 is not a multiple of the alignment 4 (sglang's get_cuda_graph_batch_size_alignment)"
               in m for m in msgs), msgs
    assert any("6 tokens = 6 is not a multiple of the alignment 4" in m for m in msgs), msgs
    assert any("unexpected" in m and "alignment 4 (sglang's" in m for m in msgs), msgs  # SGL-CAND-ORDER
    descs = rules.expected_capture_descs(c, LATEST, 4, 4)
    assert {d.num_reqs for d in descs if rules.is_decode_desc(d)} == {4}
    assert {d.num_tokens for d in descs if not rules.is_decode_desc(d)} == {4, 8}
    by_engine = captured(c, descs)
    assert judge(c, [Step.capture()], by_engine, ALIGN_IDS, engine(4, 4)) == []
    # The same graphs judged by the copy fail: the engine's answer, where recorded, is the rule.
    assert judge(c, [Step.capture()], by_engine, ALIGN_IDS)


def test_an_engine_answering_one_alignment_per_runner_is_judged_per_runner():
    c = cfg(mode="FULL", capture_sizes=(1, 2, 3), max_num_reqs=3)
    descs = rules.expected_capture_descs(c, LATEST, 1, 2)  # decode 1..3, prefill buckets 2, 4
    assert judge(c, [Step.capture()], captured(c, descs), ALIGN_IDS, engine(1, 2)) == []
    msgs = judge(c, [Step.capture()], captured(c), ["SGL-CAPTURE-ALIGNED"], engine(1, 2))
    assert msgs and all("tokens" in m and "alignment 2" in m for m in msgs), msgs
    # Without a prefill answer (a tree that aligns no prefill buckets) the copy judges them.
    assert judge(c, [Step.capture()], captured(c), ALIGN_IDS, engine(1)) == []


@pytest.mark.parametrize("tbo", [False, True])
@pytest.mark.parametrize("gathered", [False, True])
@pytest.mark.parametrize("tp,cp,want_plain", [(1, 1, 1), (2, 1, 2), (4, 1, 4), (1, 2, 2), (2, 2, 2), (1, 3, 3),
                                              (2, 3, 6)])
def test_batch_size_alignment_is_sglangs_formula(tbo, gathered, tp, cp, want_plain):
    # utils/common.py get_cuda_graph_batch_size_alignment (0.5.23: 4168-4182), by hand; the target's
    # tests hold it to sglang's own function over the same grid.
    a = (2 if tbo else 1) * (tp if gathered else 1)
    want = a if a % cp == 0 else a * cp
    assert rules.batch_size_alignment(tbo, gathered, tp, cp) == want
    if not tbo and gathered:
        assert want == want_plain


def test_capture_order_fails_for_decode_before_prefill_and_base_before_lora():
    c = cfg(mode="FULL_AND_PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4, lora_cases=(0, 2))
    descs = rules.expected_capture_descs(c, LATEST)
    assert judge(c, [Step.capture()], captured(c), ["SGL-CAPTURE-ORDER"]) == []
    wrong = captured(c, descs[2:] + descs[:2])
    assert any("captured after decode" in m for m in judge(c, [Step.capture()], wrong, ["SGL-CAPTURE-ORDER"]))
    base_first = captured(c, descs[:2] + (descs[3], descs[2]) + descs[4:])
    assert any("LoRA graph" in m for m in judge(c, [Step.capture()], base_first, ["SGL-CAPTURE-ORDER"]))


DISPATCH_IDS = ["SGL-DISPATCH-SOUND", "SGL-DISPATCH-COMPLETE", "SGL-DISPATCH-MINIMAL", "SGL-DISPATCH-ROUNDTRIP"]


def run_dispatch(c: ManagerConfig, batch: Batch, desc: BatchDescriptor) -> list[str]:
    steps = [Step.capture(), Step.dispatch(batch)]
    return judge(c, steps, captured(c) + [Dispatch(1, batch, desc, True)], DISPATCH_IDS)


def test_dispatch_properties_hold_for_the_bisect_and_name_each_failure():
    b3, b4 = Batch((1,) * 3), Batch((1,) * 4)
    assert run_dispatch(SMALL, b3, BatchDescriptor(F, 4, 4, 1)) == []
    assert run_dispatch(SMALL, Batch((2,), has_prefill=True), BatchDescriptor(N, 2, 1)) == []
    eager = run_dispatch(SMALL, b4, BatchDescriptor(N, 4, 4))
    assert any("ran eagerly" in m for m in eager) and any("exactly the size" in m for m in eager)
    wide = cfg(capture_sizes=(1, 2, 4, 8), max_num_reqs=8)
    assert any("bisect pads it" in m for m in run_dispatch(wide, b3, BatchDescriptor(F, 8, 8, 1)))
    assert any("2 graph tokens < the batch's 3" in m for m in run_dispatch(SMALL, b3, BatchDescriptor(F, 2, 2, 1)))
    nopad = cfg(capture_sizes=(1, 2, 4), max_num_reqs=4, engine_options=sgl(disable_padding=True))
    assert any("rules run it eagerly" in m for m in run_dispatch(nopad, b3, BatchDescriptor(F, 4, 4, 1)))


def test_capture_useful_flags_a_graph_no_batch_reaches():
    c = cfg(capture_sizes=(1, 2, 4), max_num_reqs=4, engine_options=sgl(disable_padding=True))
    dead = BatchDescriptor(F, 8, 8, 1)
    msgs = judge(c, [Step.capture()], captured(c, rules.expected_capture_descs(c, LATEST) + (dead,)), ["SGL-CAPTURE-USEFUL"])
    assert len(msgs) == 1 and "tokens=8" in msgs[0]


def test_dp_agree_needs_one_choice_per_step():
    c = cfg(capture_sizes=(4,), max_num_reqs=4, engine_options=sgl(dp_size=2))
    g = BatchDescriptor(F, 4, 4, 1)
    shape = Batch((1,) * 3).shape
    agree = captured(c) + [RankDispatch(0, shape, ((3, g), (2, g)))]
    assert judge(c, [Step.capture()], agree, ["SGL-DP-AGREE"]) == []
    split = captured(c) + [RankDispatch(0, shape, ((3, g), (2, None)))]
    assert any("ranks disagree" in m for m in judge(c, [Step.capture()], split, ["SGL-DP-AGREE"]))


def output_case(c: ManagerConfig, dispatched: BatchDescriptor, **out) -> list[str]:
    batch = Batch((1,) * 3)
    fields = dict(graph=dispatched, rows=3, real_rows=3, padded_rows=4, output="logits", captured_hidden="NULL",
                  runtime_hidden="NULL")
    fields.update(out)
    events = captured(c) + [Dispatch(1, batch, dispatched, True), GraphOutput(step=1, **fields)]
    return judge(c, [Step.capture(), Step.dispatch(batch)], events, ["SGL-REPLAY-KEY", "SGL-OUTPUT-ROWS", "SGL-HIDDEN-MODE"])


def test_replay_output_properties():
    g4 = BatchDescriptor(F, 4, 4, 1)
    assert output_case(SMALL, g4) == []
    assert output_case(SMALL, g4, rows=4, output="proxy") == []  # sent on padded, by design
    assert any("handed back 4 logits rows" in m for m in output_case(SMALL, g4, rows=4))
    assert any("replayed Desc(FULL tokens=2" in m for m in output_case(SMALL, g4, graph=BatchDescriptor(F, 2, 2, 1)))
    assert any("hidden states FULL" in m for m in output_case(SMALL, g4, runtime_hidden="FULL"))


def test_sweep_decisions_are_judged_too():
    from cgsim.trace import Sweep

    shapes = (BatchShape(3, 3, 1, 1, False), BatchShape(4, 4, 1, 1, False))
    descs = (BatchDescriptor(F, 4, 4, 1), BatchDescriptor(N, 4, 4))
    events = captured(SMALL) + [Sweep(0, True, shapes, descs, "boundary", 2)]
    msgs = judge(SMALL, [Step.capture()], events, ["SGL-DISPATCH-COMPLETE"])
    assert len(msgs) == 1 and "reqs=4" in msgs[0] and "dispatch sweep" in msgs[0]


# -- EAGLE's draft decode runner ---------------------------------------------------------------------


def test_draft_decode_config_follows_the_eagle_shape():
    assert rules.draft_decode_config(cfg(decode_query_len=1)) is None  # no EAGLE
    assert rules.draft_decode_config(cfg(decode_query_len=2)) is None  # one draft step: no draft decode runner
    assert rules.draft_decode_config(cfg(mode="NONE", decode_query_len=3)) is None  # decode backend disabled
    d = rules.draft_decode_config(cfg(decode_query_len=3, max_num_reqs=20, engine_options=sgl(disable_padding=True)))
    assert (d.mode, d.decode_query_len, d.max_num_reqs, d.lora_cases, d.num_ubatches) == (
        CUDAGraphMode.FULL_DECODE_ONLY, 1, 20, (0,), 1)
    assert d.options(SglangOptions).disable_padding and rules.decode_capture_bs(d) == (1, 2, 3, 4, 8, 12, 16, 20)
    tree = rules.draft_decode_config(cfg(decode_query_len=4, max_num_reqs=4, engine_options=sgl(eagle_topk=2, eagle_steps=3)))
    assert [(x.num_tokens, x.num_reqs) for x in rules.expected_capture_descs(tree, LATEST)] == [(8, 4), (6, 3), (4, 2),
                                                                                                 (2, 1)]
    # The default ladder is the speculative server's, resolved into the draft's list.
    ladder = rules.draft_decode_config(cfg(decode_query_len=3, capture_sizes=(12,), max_num_reqs=16,
                                           engine_options=sgl(default_bs_list=True)))
    assert ladder.capture_sizes == tuple(rules.default_decode_bs(12, False, True)) and not rules.options(ladder).default_bs_list


def test_eagle_options_are_validated_and_a_chain_follows_its_steps():
    with pytest.raises(ConfigError, match="sglang.eagle_topk"):
        SglangOptions(eagle_topk=0)
    with pytest.raises(ConfigError, match="sglang.eagle_steps"):
        SglangOptions(eagle_steps=0)
    assert rules.eagle_steps(cfg(decode_query_len=4)) == 3
    assert "steps + 1" in rules.unsupported_reason(cfg(decode_query_len=3, engine_options=sgl(eagle_steps=3)))
    assert rules.unsupported_reason(cfg(decode_query_len=3, engine_options=sgl(eagle_topk=2, eagle_steps=3))) is None


def test_a_draft_sub_trace_is_judged_under_the_rulesets_replacements():
    c = cfg(capture_sizes=(1, 2, 4), max_num_reqs=4, decode_query_len=3)
    draft = rules.draft_decode_config(c)

    def with_draft(descs) -> list[str]:
        sc = Scenario(c, (Step.capture(),), ruleset="sglang")
        trace = Trace.from_header(TraceHeader("sglang", "mock", resolved_mode=rules.resolved_mode(c)), captured(c))
        sub = Trace.from_header(TraceHeader("sglang", "mock", config=draft.to_json(),
                                            resolved_mode=rules.resolved_mode(draft)), captured(draft, descs))
        trace.managers[rules.DRAFT_DECODE] = sub
        only = ["CAND-ORDER", "CAND-BOUNDS", "SGL-CAND-ORDER", "SGL-CAND-BOUNDS"]
        return [str(v) for v in check_scenario(sc, trace, only=only).violations]

    # The spec's capture passes: the universal CAND-ORDER / CAND-BOUNDS sglang replaces are not judged there.
    assert with_draft(None) == []
    short = with_draft(rules.expected_capture_descs(draft, LATEST)[1:])  # bs 4 missing
    assert any(m.startswith("SGL-CAND-ORDER") and f"{rules.DRAFT_DECODE} manager:" in m for m in short), short
    assert not any(m.startswith("CAND-ORDER") for m in short), short


def test_draft_extend_config_exists_for_every_eagle_step_count():
    assert rules.draft_extend_config(cfg(decode_query_len=1)) is None
    assert rules.draft_extend_config(cfg(mode="NONE", decode_query_len=3)) is None
    one_step = rules.draft_extend_config(cfg(decode_query_len=2, max_num_reqs=6))
    assert (one_step.decode_query_len, one_step.max_num_reqs) == (2, 6) and rules.draft_decode_config(
        cfg(decode_query_len=2)) is None
    assert [(d.num_tokens, d.num_reqs) for d in rules.expected_capture_descs(one_step, LATEST)] == [
        (12, 6), (8, 4), (6, 3), (4, 2), (2, 1)]
