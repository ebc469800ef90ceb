"""The installed sglang's CUDA-graph runners as a cgsim target.

Runs where an sglang cgsim drives imports (the ``sglang`` tox env, built by
scripts/install_sglang.sh for any release 0.5.20+); elsewhere the module is
skipped with the reason, and with ``CGSIM_REQUIRE_SGLANG=1`` (the sglang CI
job) that is an error.  Every scenario goes through sglang's own runner
constructors, capture loops, can_run_graph, execute and release on the mock
backend, and is judged under the ruleset of the tree's own design.
"""

from __future__ import annotations

import glob
import os
from unittest import mock

import pytest

from tests.sglang_required import require_sglang_or_skip
from cgsim.targets.sglang import SglangTarget, installed_version
from cgsim.targets.sglang import compat

VERSION = require_sglang_or_skip()

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.descriptors import Batch, BatchDescriptor  # noqa: E402
from cgsim.modes import CUDAGraphMode  # noqa: E402
from cgsim.properties import check_scenario  # noqa: E402
from cgsim.runner import run_scenario  # noqa: E402
from cgsim.targets import get_target  # noqa: E402
from cgsim.scenario import Scenario, Step  # noqa: E402
from cgsim.spec import sglang as rules  # noqa: E402
from cgsim.spec.sglang_options import SglangOptions  # noqa: E402
from cgsim.targets.sglang.mutants import MUTANTS  # noqa: E402
from cgsim.trace import Candidates, CreateForwardFn, Forward, GraphOutput, RankDispatch, Replay  # noqa: E402

pytestmark = pytest.mark.sglang
TREE = compat.probe()
RULESET = TREE.ruleset

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
C, D, R = Step.capture(), Step.dispatch, Step.release()
BCG_DECODE_DEFECT = "Unsupported BCG output type"


def decode(n: int, width: int = 1, **kw) -> Batch:
    return Batch((width,) * n, **kw)


def prefill(*lens: int, **kw) -> Batch:
    return Batch(lens, has_prefill=True, **kw)


def run(config: ManagerConfig, *steps: Step, target: str = "sglang"):
    sc = Scenario(config, tuple(steps), ruleset=RULESET)
    trace = run_scenario(sc, target=target, timeout=300)
    return sc, trace, check_scenario(sc, trace)


def clean(config: ManagerConfig, *steps: Step):
    sc, trace, verdict = run(config, *steps)
    assert not trace.unsupported, trace.unsupported
    assert not trace.errors, trace.errors
    assert verdict.ok, [str(v) for v in verdict.violations]
    return trace


def replays(trace) -> dict[int, Replay]:
    return {r.step: r for r in trace.of(Replay)}


def cfg(**kw) -> ManagerConfig:
    kw.setdefault("mode", "FULL_DECODE_ONLY")
    kw.setdefault("capture_sizes", (1, 2, 4, 8, 12))
    kw.setdefault("max_num_reqs", 16)
    return ManagerConfig(**kw)


def sgl(**options) -> tuple[SglangOptions]:
    """A config's engine options holding these SGLang options."""
    return (SglangOptions(**options),)


# -- environment ----------------------------------------------------------------------------------


def test_the_tree_is_judged_by_its_own_design():
    assert installed_version() == VERSION == TREE.version
    assert SglangTarget().default_ruleset() == RULESET == compat.design_for(VERSION).ruleset
    assert SglangTarget().environment() == {"sglang_version": VERSION, "sglang_design": RULESET}
    assert rules.design_of(RULESET).ruleset == RULESET


def test_sglang_is_imported_as_on_a_cpu_host_on_either_backend():
    # On a GPU host sglang's modules would pick CUDA kernels and query the
    # device at import; the adapter drives the CPU choices, graphs come from
    # the backend (the agreement corpus compares the two: tests/agreement).
    import torch

    available = torch.cuda.is_available
    with compat.as_on_cpu_host():
        assert torch.cuda.is_available() is False
    assert torch.cuda.is_available is available
    assert {"mock", "cuda"} <= SglangTarget.capabilities


def test_each_scenario_captures_on_a_stream_of_its_own_backend():
    # sglang caches its capture stream by name per process; one left by an earlier
    # scenario on another backend (a mock stream in the parent a CUDA check forks
    # from) failed every real capture: 'Stream' object has no attribute 'device_index'.
    from sglang.srt.model_executor.runner_utils.pool import get_or_create_global_graph_capture_stream
    from sglang.srt.runtime_context import get_resources

    from cgsim import cuda_mock

    stale = object()
    get_resources().streams["cuda_graph_capture"] = stale
    clean(cfg(capture_sizes=(1, 2)), C, D(decode(1)))
    assert isinstance(get_or_create_global_graph_capture_stream(), cuda_mock.Stream)


def test_breakable_segments_can_weak_ref_their_inputs_on_either_backend():
    # sglang's weak_ref_tensor module refuses to import where sglang saw a CPU host,
    # which is every host under cgsim (on an H200 every breakable capture raised).
    import importlib
    import importlib.util
    import sys

    import torch

    from cgsim.targets.sglang import _world

    name = "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor"
    if name not in sys.modules:
        # Trees before breakable captures (0.5.20) have no such module at all.
        has_module = importlib.util.find_spec(name.rpartition(".")[0]) is not None and \
            importlib.util.find_spec(name) is not None
        with pytest.raises(NotImplementedError if has_module else ModuleNotFoundError):
            importlib.import_module(name)
    with _world.sglang_process():
        t = torch.ones(3)
        assert importlib.import_module(name).weak_ref_tensors(t) is t
    assert name not in sys.modules


# -- the decode runner ----------------------------------------------------------------------------


def test_warmups_run_on_the_stream_sglang_captures_on():
    # sglang's graph_capture() makes its capture stream current, so the two
    # warm-ups of each shape run where the shape is captured; replays run on
    # the step's stream (the default one here).
    trace = clean(cfg(capture_sizes=(1, 2)), C, D(decode(1)), D(decode(2)))
    streams = {(f.in_graph, f.stream) for f in trace.of(Forward) if f.phase == "capture"}
    assert len({s for _, s in streams}) == 1 and {g for g, _ in streams} == {False, True}
    assert 0 not in {s for _, s in streams}
    assert [(r.step_stream, r.replay_streams) for r in replays(trace).values()] == [(0, (0,)), (0, (0,))]


def test_decode_runner_captures_largest_first_and_replays_padded_batches():
    trace = clean(cfg(), C, D(decode(1)), D(decode(3)), D(decode(5)), D(decode(11)), D(decode(13)))
    creates = [e.desc.num_reqs for e in trace.of(CreateForwardFn)]
    assert creates == [12, 8, 4, 2, 1]
    # Two eager warmups, then one forward inside the graph, per shape.
    per_shape = [f for f in trace.of(Forward) if f.phase == "capture" and f.desc.num_reqs == 8]
    assert [f.in_graph for f in per_shape] == [False, False, True]
    got = {s: (r.path, r.desc.num_reqs) for s, r in replays(trace).items()}
    assert got == {1: ("full", 1), 2: ("full", 4), 3: ("full", 8), 4: ("full", 12), 5: ("eager", 13)}
    # Only the real rows come back.
    outputs = trace.of(GraphOutput)
    for name in ("hidden_states", "next_token_logits"):  # sglang slices both to the real rows
        assert [(e.rows, e.padded_rows) for e in outputs if e.output == name] == [(1, 1), (3, 4), (5, 8), (11, 12)]


def test_graph_reads_what_sglang_prepared():
    """Sensitivity: skipping sglang's replay-time metadata preparation, or its
    static-input fill, changes the replayed rows."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    from cgsim.targets.sglang._world import ToyAttention

    steps = (C, D(decode(3)), D(decode(5)))
    if hasattr(DecodeCudaGraphRunner, "_init_replay_attn_metadata"):
        skipped = mock.patch.object(DecodeCudaGraphRunner, "_init_replay_attn_metadata", lambda *a, **k: None)
    else:  # the preparation is inline in load_batch: the backend call it makes outside capture does nothing
        prepare = ToyAttention.init_forward_metadata_out_graph
        skipped = mock.patch.object(ToyAttention, "init_forward_metadata_out_graph",
                                    lambda self, fb, in_capture=False: prepare(self, fb, True) if in_capture else None)
    with skipped:
        _, _, verdict = run(cfg(), *steps)
    assert "REPLAY-EQUALS-EAGER" in {v.property for v in verdict.violations}
    from sglang.srt.model_executor.cuda_graph_buffer_registry import CudaGraphBufferRegistry

    with mock.patch.object(CudaGraphBufferRegistry, "fill_from", lambda *a, **k: None):
        _, _, verdict = run(cfg(), *steps)
    assert "REPLAY-EQUALS-EAGER" in {v.property for v in verdict.violations}


def test_verify_graphs_hold_bs_times_the_draft_width():
    trace = clean(cfg(decode_query_len=3, capture_sizes=(1, 2, 4), max_num_reqs=4), C, D(decode(3, 3)), D(decode(4, 3)))
    assert [(r.desc.num_tokens, r.desc.num_reqs) for r in replays(trace).values()] == [(12, 4), (12, 4)]
    assert {(e.captured_hidden, e.runtime_hidden) for e in trace.of(GraphOutput)
            if e.output == "hidden_states"} == {("FULL", "FULL")}


def test_two_batch_overlap_aligns_sizes_and_needs_the_split():
    c = cfg(num_ubatches=2, ubatch_threshold=2, capture_sizes=(1, 2, 3, 4, 8), max_num_reqs=7)
    trace = clean(c, C, D(decode(3, num_ubatches=2)), D(decode(3)), D(decode(7, num_ubatches=2)))
    assert sorted({d.num_reqs for d in trace.of(Candidates)[0].capture_descs}) == [2, 4, 8]
    assert {s: r.path for s, r in replays(trace).items()} == {1: "full", 2: "eager", 3: "full"}


@pytest.mark.parametrize("record_nolora", [True, False])
def test_lora_variants(record_nolora):
    c = cfg(capture_sizes=(2, 4), max_num_reqs=4, lora_cases=(0, 2), engine_options=sgl(record_nolora_graph=record_nolora))
    trace = clean(c, C, D(decode(3)), D(decode(3, num_active_loras=2)), D(decode(2, num_active_loras=1)))
    loras = [r.desc.num_active_loras for r in replays(trace).values()]
    # Only a design that takes the rule from the LoRA backend records base-only graphs.
    assert loras == ([0, 2, 2] if record_nolora and TREE.nolora_from_backend else [2, 2, 2])


def test_padding_disabled_replays_exact_sizes_only():
    c = cfg(capture_sizes=(1, 2, 4), max_num_reqs=4, engine_options=sgl(disable_padding=True))
    trace = clean(c, C, D(decode(4)), D(decode(3)))
    assert [r.path for r in replays(trace).values()] == ["full", "eager"]


def test_default_ladder_up_to_the_max_bs():
    c = cfg(capture_sizes=(20,), max_num_reqs=24, engine_options=sgl(default_bs_list=True))
    trace = clean(c, C, D(decode(17)))
    assert [d.num_reqs for d in trace.of(Candidates)[0].capture_descs] == [20, 16, 12, 8, 4, 2, 1]
    assert replays(trace)[1].desc.num_reqs == 20


def test_dp_attention_ranks_vote_and_replay_one_key():
    c = cfg(capture_sizes=(1, 2, 4, 8), max_num_reqs=8, engine_options=sgl(dp_size=2))
    from cgsim.spec.scheduler import sweep_token_limit

    # The last batch: one prompt of the most tokens a batch holds; its peer holds it and one decode more.
    big = prefill(sweep_token_limit(c))
    trace = clean(c, C, D(decode(3)), D(decode(8)), D(prefill(3)), D(decode(4)), D(big))
    step = {e.step: e for e in trace.of(RankDispatch) if e.step >= 1}
    assert [n for n, _ in step[1].ranks] == [3, 4] and {d.num_reqs for _, d in step[1].ranks} == {4}
    # The peer holds 5: every rank, rank 0 with its 4, replays the group's bucket 8.
    assert [n for n, _ in step[4].ranks] == [4, 5] and {d.num_reqs for _, d in step[4].ranks} == {8}
    assert {d for _, d in step[3].ranks} == {None}  # a prefill rank votes the group out of graphs


# -- the prefill runner ----------------------------------------------------------------------------


def test_breakable_prefill_graphs():
    c = cfg(mode="FULL_AND_PIECEWISE", capture_sizes=(4, 8, 16), max_num_reqs=8)
    trace = clean(c, C, D(prefill(7)), D(prefill(3, 2, 1)), D(prefill(3)), D(prefill(1, 1)), D(decode(5)))
    got = {s: (r.path, r.desc.cg_mode, r.desc.num_tokens) for s, r in replays(trace).items()}
    assert got == {1: ("piecewise", P, 8), 2: ("piecewise", P, 8), 3: ("piecewise", P, 4), 4: ("piecewise", P, 4),
                   5: ("full", F, 8)}
    assert trace.uses_breakable


def test_lora_in_breakable_prefill_graphs_reads_every_request_adapter():
    # Found by a campaign: the toy LoRA kernels once mapped tokens to requests
    # through the capture-sized metadata view (one request), a cgsim bug.
    c = cfg(mode="FULL_AND_PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4, lora_cases=(0, 3),
            engine_options=sgl(record_nolora_graph=False))
    trace = clean(c, C, D(prefill(1, 1, num_active_loras=2)), D(prefill(2, 1, 1, num_active_loras=3)))
    assert [r.path for r in replays(trace).values()] == ["piecewise", "piecewise"]


def test_padding_disabled_with_two_batch_overlap_captures_a_graph_no_batch_uses():
    """A (minor) defect of sglang's runners, manager-level only (docs/sglang.md
    #2): the request pool is rounded up to the alignment also when padding is
    disabled; no launch sglang accepts gives the runners this config."""
    from cgsim.targets import TargetUnsupported

    c = cfg(capture_sizes=(2,), max_num_reqs=1, num_ubatches=2, ubatch_threshold=2, engine_options=sgl(disable_padding=True))
    _, trace, verdict = run(c, C, D(decode(1)))
    assert not trace.errors
    assert [v.property for v in verdict.violations] == ["SGL-CAPTURE-USEFUL"]
    with pytest.raises(TargetUnsupported, match="check_server_args"):
        SglangTarget().drawing.engine_config(c)


def test_two_batch_overlap_without_attention_dp_or_a2a_is_not_reachable_with_sglangs_reason():
    """sglang's start-up check decides what is reachable: two-batch overlap
    needs attention DP or an all-to-all MoE backend (check_two_batch_overlap,
    called by ServerArgs.check_server_args on every launch)."""
    from cgsim.targets import TargetUnsupported
    from cgsim.targets.sglang.launch import engine_graph_config

    tbo = cfg(capture_sizes=(2, 4), max_num_reqs=4, num_ubatches=2, ubatch_threshold=2)
    with pytest.raises(TargetUnsupported) as info:
        SglangTarget().drawing.engine_config(tbo)
    reason = str(info.value)
    assert "check_server_args: ValueError: When enabling two batch overlap without an EP a2a backend" in reason
    assert "--enable-two-batch-overlap" in reason and "\n" not in reason
    # With attention DP sglang's check takes it (the driver does not run DP ranks with two-batch overlap).
    built = engine_graph_config(cfg(capture_sizes=(2, 4), max_num_reqs=4, num_ubatches=2, ubatch_threshold=2,
                                    engine_options=sgl(dp_size=2)), VERSION)
    assert list(built.decode.bs) == [2, 4]


def test_documented_findings_launches_and_sglangs_check():
    """#1's launch passes sglang's start-up check; #2's is refused by it
    (manager-level only, docs/sglang.md)."""
    import json

    from cgsim.targets import TargetUnsupported
    from cgsim.targets.sglang.known import KNOWN_DEFECTS

    root = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "docs", "sglang-findings")
    verdicts = {}
    for path in sorted(glob.glob(os.path.join(root, "*.json"))):
        with open(path, encoding="utf-8") as fh:
            c = ManagerConfig.from_json(json.load(fh)["scenario"]["config"])
        try:
            SglangTarget().drawing.engine_config(c)
            verdicts[os.path.basename(path)] = "accepted"
        except TargetUnsupported as exc:
            verdicts[os.path.basename(path)] = str(exc)
    assert verdicts["sglang-no-crash-52cea3c636.json"] == "accepted"
    assert "two batch overlap" in verdicts["sglang-sgl-capture-useful-b29347f218.json"]
    assert [d.reachable_in(VERSION) for d in KNOWN_DEFECTS] == [True, False]


def test_a_check_that_fails_on_what_cgsim_gave_it_is_the_adapters_failure(monkeypatch):
    """Without compat.VALIDATION_INPUTS sglang's check reads fields the
    dummy-model path leaves unset: a TypeError there is exit 2, never a refusal."""
    from cgsim.targets.sglang import launch

    assert all(row.why and row.field for row in compat.VALIDATION_INPUTS)
    monkeypatch.setattr(launch, "validation_inputs", lambda server_args: None)
    launch._graph_config.cache_clear()
    try:
        with pytest.raises(compat.SglangAdapterError, match="check_server_args failed on what cgsim gave it"):
            launch.engine_graph_config(cfg(capture_sizes=(2,), max_num_reqs=2), VERSION)
    finally:
        launch._graph_config.cache_clear()


def test_full_prefill_graphs_have_request_slots():
    c = cfg(mode="FULL", capture_sizes=(8, 16), max_num_reqs=8, engine_options=sgl(full_prefill_max_req=2))
    trace = clean(c, C, D(prefill(5, 2)), D(prefill(3, 3, 2)), D(prefill(9)))
    got = {s: (r.path, r.desc.num_tokens, r.desc.num_reqs) for s, r in replays(trace).items()}
    assert got == {1: ("full", 8, 2), 2: ("eager", 8, 3), 3: ("full", 16, 2)}


def test_breakable_decode_fails_at_capture_for_every_generation_model():
    """A real defect of sglang 0.5.23 (docs/sglang.md): the breakable backend
    allocates its shared output with _alloc_full_buffer, which rejects the
    LogitsProcessorOutput a last-rank model returns."""
    _, trace, verdict = run(cfg(mode="PIECEWISE", capture_sizes=(2,), max_num_reqs=2), C, D(decode(1)))
    assert [e.phase for e in trace.errors] == ["capture"]
    assert BCG_DECODE_DEFECT in trace.errors[0].message
    assert {v.property for v in verdict.violations} == {"NO-CRASH"}


# -- lifecycle -------------------------------------------------------------------------------------


def test_release_and_recapture():
    c = cfg(mode="FULL_AND_PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4)
    steps = (D(decode(2)), C, D(decode(3)), R, D(decode(3)), C, D(decode(3)), D(prefill(3)))
    if not TREE.release:
        # No launch releases graphs on this tree: campaigns count such a scenario, never judge it.
        reason = get_target("sglang").drawing.unreachable(Scenario(c, steps, ruleset=RULESET))
        assert reason and "no elastic release path" in reason, reason
        return
    trace = clean(c, *steps)
    got = {s: (r.path, r.graph_from_step) for s, r in replays(trace).items()}
    assert got == {0: ("eager", None), 2: ("full", 1), 4: ("eager", None), 6: ("full", 5), 7: ("piecewise", 5)}


def test_configs_sglang_cannot_express_are_unsupported():
    for c in (cfg(lora_cases=(0, 1, 2)), cfg(attention_support="UNIFORM_BATCH"),
              cfg(mode="FULL_AND_PIECEWISE", engine_options=sgl(dp_size=2)),
              cfg(num_ubatches=2, capture_sizes=(3,))):  # no even bs left: sglang asserts at start-up
        _, trace, verdict = run(c, C)
        assert trace.unsupported and verdict.ok


# -- mutants ---------------------------------------------------------------------------------------

EXAMPLES = {
    "nopad-raw-key": (cfg(capture_sizes=(1, 2, 4), max_num_reqs=4, engine_options=sgl(disable_padding=True)), (C, D(decode(4)))),
    "dp-sum-tokens": (cfg(capture_sizes=(4, 8), max_num_reqs=8, engine_options=sgl(dp_size=2)), (C, D(decode(6)))),
    "max-bs-not-captured": (cfg(capture_sizes=(20,), max_num_reqs=24, engine_options=sgl(default_bs_list=True)),
                            (C, D(decode(18)))),
    # Graph 8 twice: the 6-request replay's padded rows keep slots of requests it still runs (_kv's rows).
    "stale-out-cache-loc": (cfg(capture_sizes=(1, 2, 4, 8), max_num_reqs=8), (C, D(decode(8)), D(decode(6)))),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught_where_sglang_passes(name):
    config, steps = EXAMPLES[name]
    clean(config, *steps)
    _, _, verdict = run(config, *steps, target=f"sglang-mutant:{name}")
    assert MUTANTS[name].caught_by in {v.property for v in verdict.violations}, [str(v) for v in verdict.violations]


def test_the_toy_kv_sees_a_padded_row_writing_a_live_slot():
    import torch
    from types import SimpleNamespace

    from cgsim.targets.sglang import _kv
    from cgsim.workload.model import HIDDEN

    table = torch.zeros(3, 16, dtype=torch.int32)
    pool = _kv.KvPool(table, "cpu")
    # Two decodes at positions 3 and 2 (rows 2 and 1), and a graph's padded row.
    rows, loc = pool.load(table, [3, 2], [1, 1], [5, 6])
    fb = SimpleNamespace(out_cache_loc=torch.cat([loc, torch.zeros(1, dtype=torch.int64)]),
                         req_pool_indices=torch.cat([rows, torch.zeros(1, dtype=torch.int64)]))
    ids, pos = torch.tensor([5, 9, 0]), torch.tensor([3, 2, 0])
    clean = _kv.attend(pool, torch.zeros(3, HIDDEN), ids, pos, fb, table, 1)
    layout = SimpleNamespace(query_lens=[1, 1], context_lens=[3, 2], slots=[5, 6], input_ids=ids[:2],
                             positions=pos[:2])
    assert torch.equal(clean[:2], _kv.apply_reference(torch.zeros(2, HIDDEN), layout, 1, 16, "cpu"))
    pool.load(table, [3, 2], [1, 1], [5, 6])
    fb.out_cache_loc[2] = int(table[2, 1])  # stale: a slot of request 0's prefix
    stale = _kv.attend(pool, torch.zeros(3, HIDDEN), ids, pos, fb, table, 1)
    assert not torch.equal(stale[0], clean[0]) and torch.equal(stale[1], clean[1])


def test_every_mutant_has_an_example():
    assert set(EXAMPLES) == set(MUTANTS)
    # An SGL-* property, or the outputs (a padding bug whose harm is a wrong value, not a wrong decision).
    assert all((m.caught_by.startswith("SGL-") or m.caught_by == "REPLAY-EQUALS-EAGER") and m.summary
               for m in MUTANTS.values())


def test_descriptors_are_the_spec_mapping():
    c = cfg(mode="FULL", capture_sizes=(2, 4), max_num_reqs=4, decode_query_len=2, engine_options=sgl(full_prefill_max_req=3))
    trace = clean(c, C)
    assert trace.of(Candidates)[0].capture_descs == rules.expected_capture_descs(c, rules.design_of(RULESET))
    assert BatchDescriptor(F, 8, 4, 2) in trace.of(Candidates)[0].capture_descs


SGLANG_FINDINGS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))),
                                                "docs", "sglang-findings", "*.json")))


@pytest.mark.parametrize("path", SGLANG_FINDINGS, ids=[os.path.basename(p)[:-5] for p in SGLANG_FINDINGS])
def test_every_documented_sglang_finding_reproduces(path):
    # docs/sglang.md documents each with its cause in sglang's code; this is
    # what `fuzz replay` does for them (exit 1 while the defect is there).
    from cgsim.replay import reproduce
    from cgsim.report.findings import load_finding

    finding = load_finding(path)
    assert finding.target == "sglang"
    result = reproduce(finding, timeout=300)
    assert result.reproduced, result.lines()
    # ... and judged by this release's own design.
    from cgsim.observe import observe

    scenario = Scenario.from_json(dict(finding.scenario, ruleset=RULESET))
    assert observe(scenario, "sglang", "mock", 300).first(finding.property) is not None


def test_the_documented_sglang_findings_are_there():
    assert len(SGLANG_FINDINGS) == 2


# -- launches --------------------------------------------------------------------------------------


def test_every_config_reads_as_a_launch_line_sglang_takes():
    from cgsim.targets.sglang.launch import engine_graph_config

    c = cfg(mode="FULL", capture_sizes=(4, 8), max_num_reqs=5, lora_cases=(0, 2),
            engine_options=sgl(full_prefill_max_req=2, disable_padding=True, record_nolora_graph=False))
    line = SglangTarget().triage.launch(Scenario(c, (C,), ruleset=RULESET))["line"]
    assert line.startswith("python -m sglang.launch_server --model-path MODEL ")
    for flag in ("--cuda-graph-backend-decode full", "--cuda-graph-backend-prefill full", "--cuda-graph-bs-decode 4 8",
                 "--max-running-requests 5", "--disable-cuda-graph-padding", '"full_prefill_max_req":2',
                 "--enable-lora --max-loras-per-batch 2 --lora-backend triton --max-lora-rank 16 "
                 "--lora-target-modules all"):
        assert flag in line
    tbo = cfg(num_ubatches=2, ubatch_threshold=2)
    assert "--enable-two-batch-overlap" in SglangTarget().triage.launch(Scenario(tbo, (C,), ruleset=RULESET))["line"]
    built = engine_graph_config(c, VERSION)  # what sglang's own parser and hooks build from it
    assert (built.decode.backend, list(built.decode.bs)) == ("full", [4, 8])
    assert (built.prefill.backend, built.prefill.full_prefill_max_req) == ("full", 2)
    default = engine_graph_config(cfg(capture_sizes=(20,), max_num_reqs=24, engine_options=sgl(default_bs_list=True)), VERSION)
    assert default.decode.max_bs == 20
    assert SglangTarget().drawing.engine_config(c) == c


def test_a_launch_sglang_refuses_is_unsupported_with_its_reason():
    from cgsim.targets import TargetUnsupported

    lora = cfg(capture_sizes=(2, 4), max_num_reqs=4, lora_cases=(0, 2), engine_options=sgl(record_nolora_graph=True))
    if TREE.nolora_from_backend:  # --lora-backend triton_v2 exists where the rule reads it
        assert SglangTarget().drawing.engine_config(lora) == lora
    else:
        with pytest.raises(TargetUnsupported, match="invalid choice: 'triton_v2'") as info:
            SglangTarget().drawing.engine_config(lora)
        assert "--lora-backend triton_v2" in str(info.value) and "\n" not in str(info.value)
