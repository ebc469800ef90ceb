"""The reference manager against the executable spec (SPEC §2-§3), and the
seed cases of vLLM PR 48822."""

from hypothesis import given, settings, strategies as st

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.modes import AttentionSupport as S, CUDAGraphMode as M
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step
from cgsim.spec import (
    dispatch_choices,
    expected_candidate_tiers,
    expected_capture_descs,
    expected_capture_plan,
    expected_dispatch,
)
from cgsim.trace import Candidates, CreateForwardFn, Dispatch, Forward, GraphStored
from fuzz.strategies import batches, configs

RULESETS = ("pr48822", "vllm-0.32")


def capture_events(trace):
    """(create/forward) events of the first capture, as plan-like tuples."""
    out = []
    for e in trace.events:
        if isinstance(e, CreateForwardFn):
            out.append(("create_forward_fn", e.desc, e.warmup))
        elif isinstance(e, Forward) and e.phase == "capture" and e.step == 0:
            out.append(("forward", e.desc, e.mode, e.in_graph, e.metadata is None))
        elif isinstance(e, GraphStored):
            break
    return out


def plan_tuples(config, ruleset):
    out = []
    for s in expected_capture_plan(config, ruleset):
        if s.action == "create_forward_fn":
            out.append(("create_forward_fn", s.desc, s.warmup))
        elif s.action == "forward":
            out.append(("forward", s.desc, s.mode, s.in_graph, s.skip_attn))
    return out


def test_seed_breakable_piecewise_capture_uses_fresh_metadata():
    config = ManagerConfig(mode=M.PIECEWISE, capture_sizes=(4,), max_num_reqs=4, breakable=True,
                           attention_support=S.UNIFORM_BATCH)
    trace = run_scenario(Scenario(config, (Step.capture(),)))
    creates = trace.of(CreateForwardFn)
    assert [c.warmup for c in creates] == [True, False]
    forwards = [f for f in trace.of(Forward) if f.phase == "capture"]
    assert [f.mode for f in forwards] == [M.NONE, M.PIECEWISE]
    warm, captured = forwards[0].metadata, forwards[1].metadata
    assert warm is not None and captured is not None and warm != captured
    assert set(trace.metadata[warm].state).isdisjoint(trace.metadata[captured].state)


def test_seed_nonbreakable_piecewise_skips_attention_under_pr48822():
    config = ManagerConfig(mode=M.PIECEWISE, capture_sizes=(4,), max_num_reqs=4, breakable=False)
    for ruleset, skipped in (("pr48822", True), ("vllm-0.32", False)):
        trace = run_scenario(Scenario(config, (Step.capture(),), ruleset=ruleset))
        assert [c.warmup for c in trace.of(CreateForwardFn)] == [True]
        forwards = [f for f in trace.of(Forward) if f.phase == "capture"]
        assert [f.mode for f in forwards] == [M.NONE, M.PIECEWISE]
        assert all((f.metadata is None) == skipped for f in forwards)


@settings(max_examples=40)
@given(configs(max_size=32), st.sampled_from(RULESETS))
def test_reference_capture_descriptors_and_plan_match_spec(config, ruleset):
    trace = run_scenario(Scenario(config, (Step.capture(),), ruleset=ruleset))
    assert not trace.errors, trace.errors
    initial = trace.of(Candidates)[0]
    expected = expected_capture_descs(config, ruleset)
    for mode in (M.PIECEWISE, M.FULL):
        got = [d for d in initial.capture_descs if d.cg_mode == mode]
        assert set(got) == set(expected.get(mode, ()))
        assert [d.num_tokens for d in got] == [d.num_tokens for d in expected.get(mode, ())]
    got, want = capture_events(trace), plan_tuples(config, ruleset)
    # Descriptors of equal size may be captured in any order; each one's own
    # steps and the size sequence must match exactly.
    assert [(s[1].cg_mode, s[1].num_tokens) for s in got] == [(s[1].cg_mode, s[1].num_tokens) for s in want]
    for desc in {s[1] for s in want}:
        assert [s for s in got if s[1] == desc] == [s for s in want if s[1] == desc]
    stored = {e.desc for e in trace.of(GraphStored)}
    assert stored == set(expected.get(M.FULL, ()))
    tiers = expected_candidate_tiers(config, ruleset)
    got_cands = dict(initial.candidates)
    assert set(got_cands) == set(tiers)
    for key, tier_list in tiers.items():
        flat = got_cands[key]
        pos = 0
        for tier in tier_list:
            assert frozenset(flat[pos:pos + len(tier)]) == tier, (key, flat, tier_list)
            pos += len(tier)
        assert pos == len(flat)


@settings(max_examples=40)
@given(st.data(), configs(max_size=32), st.sampled_from(RULESETS))
def test_reference_dispatch_matches_oracle(data, config, ruleset):
    """The reference's dispatch is one of the oracle's best choices."""
    batch_list = data.draw(st.lists(batches(config), min_size=1, max_size=3))
    trace = run_scenario(Scenario(config, (Step.capture(),) + tuple(Step.dispatch(b) for b in batch_list), ruleset=ruleset))
    assert not trace.errors, trace.errors
    captured = [e.desc for e in trace.of(GraphStored)]
    if trace.has_piecewise_runner:
        captured += [d for d in trace.of(Candidates)[0].capture_descs if d.cg_mode == M.PIECEWISE]
    for d in trace.of(Dispatch):
        choices = dispatch_choices(d.batch, captured, config.lora_cases)
        assert d.desc in choices or (not choices and d.desc == expected_dispatch(d.batch, captured, config.lora_cases))


def test_pr48822_ordering_case_changes_piecewise_descriptors():
    """Candidate init before the breakable flag is final builds PIECEWISE
    descriptors as if not breakable (PR 48822)."""
    from cgsim.targets.reference import ModelCudaGraphManager, ReferenceTarget

    class EarlyInit(ModelCudaGraphManager):
        def set_flags(self):
            self.use_breakable_cg = False  # candidate init runs now ...

        def _init_candidates(self):
            super()._init_candidates()
            # ... and only afterwards the flag becomes final.
            self.use_breakable_cg = self.config.breakable and self.cudagraph_mode.has_piecewise()

    class EarlyInitTarget(ReferenceTarget):
        name = "early-init"
        manager_class = EarlyInit

    config = ManagerConfig(mode=M.PIECEWISE, capture_sizes=(2, 4), max_num_reqs=4, breakable=True,
                           attention_support=S.UNIFORM_BATCH)
    scenario = Scenario(config, (Step.capture(), Step.dispatch(Batch((1, 1)))), ruleset="pr48822")
    trace = run_scenario(scenario, target=EarlyInitTarget())
    initial, recomputed = trace.of(Candidates)[:2]
    assert {d.num_reqs for d in initial.capture_descs} == {None}
    assert {d.num_reqs for d in recomputed.capture_descs} == {2, 4}
    try:
        from cgsim.properties import check_scenario
    except ImportError:  # properties land separately
        return
    assert "CAND-ORDER" in {v.property for v in check_scenario(scenario, trace).violations}


def test_a_sweep_plan_says_whether_the_seed_chose_its_shapes():
    """The runner makes a plan the seed did not shape once for every scenario
    seed of its config (a campaign runs one config under many seeds)."""
    from cgsim.runner import _plan
    from cgsim.spec.scheduler import sweep_plan

    small = ManagerConfig(capture_sizes=(1, 2, 4, 8), max_num_reqs=4)
    assert sweep_plan(small, seed=3).coverage == "exhaustive" and not sweep_plan(small, seed=3).seeded
    assert _plan(small, "pr48822", (), 3, False) is _plan(small, "pr48822", (), 5, False)
    big = ManagerConfig(capture_sizes=tuple(range(8, 2049, 8)), max_num_reqs=1024, lora_cases=(0, 1, 2, 4, 8),
                        decode_query_len=4)
    one, other = sweep_plan(big, seed=1), sweep_plan(big, seed=2)
    assert one.coverage == "boundary+sample" and one.seeded and one.shapes != other.shapes
    assert _plan(big, "pr48822", (), 1, False).shapes != _plan(big, "pr48822", (), 2, False).shapes


def test_a_light_sweep_of_a_small_config_sweeps_every_batch_with_its_capture_sweeps_plan():
    """Before the first capture and after a release a small config's sweep
    is its capture sweeps' exhaustive plan (made once), a large one's the
    boundary classes; so is every sweep of a manager that plans no graph
    (it has no capture sweep to share a plan with)."""
    from cgsim.runner import LIGHT_EXHAUSTIVE_BOUND, _plan

    small = ManagerConfig(capture_sizes=(1, 2, 4, 8), max_num_reqs=4)
    known = tuple(d for ds in expected_capture_descs(small, "pr48822").values() for d in ds)
    light, full = _plan(small, "pr48822", known, 3, True), _plan(small, "pr48822", known, 3, False)
    assert light is full and light.coverage == "exhaustive" and len(light.shapes) <= LIGHT_EXHAUSTIVE_BOUND
    nothing = _plan(small, "pr48822", (), 3, True)
    assert nothing.coverage == "boundary" and set(nothing.shapes) < set(full.shapes)
    big = ManagerConfig(capture_sizes=tuple(range(8, 257, 8)), max_num_reqs=64, lora_cases=(0, 1, 2))
    known = tuple(d for ds in expected_capture_descs(big, "pr48822").values() for d in ds)
    light, full = _plan(big, "pr48822", known, 3, True), _plan(big, "pr48822", known, 3, False)
    assert light.coverage == "boundary" and set(light.shapes) < set(full.shapes)
    assert len(full.shapes) > LIGHT_EXHAUSTIVE_BOUND


@settings(max_examples=60)
@given(configs(max_size=48), st.lists(st.integers(1, 40), max_size=5))
def test_a_plans_request_splits_are_those_of_each_token_count(config, marks):
    """The splits a plan counts and adds, made once for every token count,
    are ``_prefill_reqs`` of each."""
    from cgsim.spec.scheduler import _prefill_reqs, _prefill_splits, sweep_token_limit

    limit = sweep_token_limit(config)
    splits = _prefill_splits(config, limit, tuple(marks))
    assert len(splits) == limit
    assert all(splits[t - 1] == tuple(_prefill_reqs(config, t, marks)) for t in range(1, limit + 1))


def test_varlen_decode_graphs_get_micro_batched_twins_only_where_the_design_makes_them():
    """vLLM 0.30+ twins uniform decode and mixed FULL descriptors, never a
    varlen decode one (adaptive verification): under its ruleset the spec and
    the reference capture none, so a vLLM without them shows no CAND-ORDER;
    under a design with varlen twins, the full-length varlen graph gets one."""
    from cgsim.spec import expected_capture_descs

    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(8, 16, 32, 40), max_num_reqs=8, decode_query_len=5,
                        varlen_decode=True, num_ubatches=2, ubatch_threshold=32, attention_support=S.ALWAYS)
    for ruleset, twinned in (("vllm-0.32", False), ("vllm-0.25", True)):
        spec = expected_capture_descs(cfg, ruleset).get(M.FULL, ())
        varlen_twins = [d for d in spec if d.num_ubatches > 1 and d.max_query_len is not None]
        assert bool(varlen_twins) == twinned, (ruleset, spec)
        trace = run_scenario(Scenario(cfg, (Step.capture(),), ruleset=ruleset), target="reference")
        stored = [e.desc for e in trace.of(GraphStored)]
        assert bool([d for d in stored if d.num_ubatches > 1 and d.max_query_len is not None]) == twinned, stored


def test_a_micro_batched_decode_graph_that_only_half_empty_batches_reach_is_not_captured():
    # Dynamic speculative decoding gives q = 5 to at most 7 requests (35
    # tokens), and a 35-token batch would leave the second micro-batch of an
    # 80-token graph empty (it runs eagerly): a micro-batched FULL(80, 16
    # requests, q = 5) would be reached by no batch, and the reference must
    # not capture it (it did: CAPTURE-USEFUL on the reference, 1 scenario in
    # 2000 of the throughput benchmark).
    from cgsim.properties import check_scenario

    sc = Scenario.from_json({'schema_version': 1, 'ruleset': 'vllm-0.21', 'workload': 'toy', 'seed': 0, 'config': {'mode': 'FULL', 'capture_sizes': [17, 24, 80], 'max_num_reqs': 16, 'max_capture_size': 88, 'decode_query_len': 5, 'spec_schedule': [[1, 7, 4], [8, 14, 2], [15, 16, 1]], 'lora_cases': [0], 'breakable': True, 'varlen_decode': False, 'num_ubatches': 2, 'ubatch_threshold': 32, 'attention_support': 'ALWAYS', 'attention_split': False, 'compiled_piecewise': True}, 'steps': [{'kind': 'capture'}, {'kind': 'dispatch', 'batch': {'query_lens': [4, 4], 'num_active_loras': 0, 'num_ubatches': 1, 'has_prefill': True}}, {'kind': 'release'}, {'kind': 'capture'}, {'kind': 'dispatch', 'batch': {'query_lens': [5], 'num_active_loras': 0, 'num_ubatches': 1, 'has_prefill': False}}, {'kind': 'dispatch', 'batch': {'query_lens': [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], 'num_active_loras': 0, 'num_ubatches': 2, 'has_prefill': False}}]})
    assert not check_scenario(sc, run_scenario(sc)).violations


# -- the reference's own copies of the spec's rules (written apart, so a bug in either shows) ----------


def test_the_reference_fit_check_is_the_spec_fit_rule():
    from itertools import product

    from cgsim.descriptors import BatchDescriptor
    from cgsim.spec.fit import fits_in_case
    from cgsim.targets.reference import _runs

    descs = [BatchDescriptor(mode, tokens, reqs, uniform, mql, 0, ub)
             for mode, tokens, reqs, uniform, mql, ub in product(
                 (M.FULL, M.PIECEWISE), (1, 3, 4, 8), (None, 1, 2, 4), (None, 1, 2), (None, 2), (1, 2))
             if not (uniform is not None and mql is not None)]
    shapes = [Batch(lens, num_ubatches=ub, has_prefill=prefill)
              for lens, ub, prefill in product(((1,), (2,), (1, 1), (2, 2), (3, 1), (1, 1, 1, 1), (4, 4)),
                                               (1, 2), (False, True))]
    pairs = [(d, b) for d in descs for b in shapes]
    assert [_runs(d, b) for d, b in pairs] == [fits_in_case(d, b) for d, b in pairs]
    assert 0 < sum(fits_in_case(d, b) for d, b in pairs) < len(pairs)


@settings(max_examples=150, deadline=None)
@given(configs())
def test_the_reference_drops_the_decode_graphs_the_spec_drops(config):
    from cgsim.modes import CUDAGraphMode
    from cgsim.spec.candidates import drop_unscheduled_decode
    from cgsim.targets.reference import ModelCudaGraphManager

    from cgsim.descriptors import BatchDescriptor

    # Every uniform decode graph the config could ask for, before either drops any.
    full = [BatchDescriptor(CUDAGraphMode.FULL, r * q, r, q, None, lora, ub)
            for q in range(1, config.decode_query_len + 1) for r in range(1, min(config.max_num_reqs, 24) + 1)
            for lora in config.lora_cases for ub in sorted({1, config.num_ubatches})]
    manager = ModelCudaGraphManager.__new__(ModelCudaGraphManager)
    manager.config = config
    assert manager._scheduled_decode_graphs(full) == drop_unscheduled_decode(config, full)
