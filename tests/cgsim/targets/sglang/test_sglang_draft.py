"""EAGLE's draft decode runner (sglang's EAGLEDraftCudaGraphRunner) driven as
the sglang target's "draft-decode" sub-manager and judged in its sub-trace:
which bs it captures (and at which width), which graph a draft batch replays,
replay equals the eager draft for the real requests, and what sglang does
not build.  Configs reach it as launches with --speculative-* flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import pytest

from tests.sglang_required import require_sglang_or_skip

from cgsim.targets import TargetEnvironmentError
from cgsim.targets.sglang import compat

VERSION = require_sglang_or_skip()

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.descriptors import Batch  # noqa: E402
from cgsim.properties import check_scenario  # noqa: E402
from cgsim.runner import run_scenario  # noqa: E402
from cgsim.scenario import Scenario, Step  # noqa: E402
from cgsim.spec import sglang as rules  # noqa: E402
from cgsim.spec.sglang_options import SglangOptions  # noqa: E402
from cgsim.targets.sglang.launch import launch_for  # noqa: E402
from cgsim.targets.sglang.mutation import MUTATIONS_ENV, Mutation, environment_for  # noqa: E402
from cgsim.trace import Candidates, CreateForwardFn, Forward, GraphOutput, Replay  # noqa: E402

pytestmark = pytest.mark.sglang
RULESET = compat.probe().ruleset
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
C, D, R = Step.capture(), Step.dispatch, Step.release()
DRAFT = rules.DRAFT_DECODE
DRAFT_MODULE = "sglang.srt.speculative.eagle_draft_cuda_graph_runner"


def verify(n: int, width: int) -> Batch:
    return Batch((width,) * n)


def cfg(**kw) -> ManagerConfig:
    kw.setdefault("mode", "FULL_DECODE_ONLY")
    kw.setdefault("capture_sizes", (1, 2, 4))
    kw.setdefault("max_num_reqs", 4)
    kw.setdefault("decode_query_len", 3)
    return ManagerConfig(**kw)


def sgl(**options) -> tuple[SglangOptions]:
    """A config's engine options holding these SGLang options."""
    return (SglangOptions(**options),)


def run(config: ManagerConfig, *steps: Step):
    sc = Scenario(config, tuple(steps), ruleset=RULESET)
    trace = run_scenario(sc, target="sglang", timeout=300)
    return trace, check_scenario(sc, trace)


def clean(config: ManagerConfig, *steps: Step):
    trace, verdict = run(config, *steps)
    assert not trace.unsupported and not trace.errors, (trace.unsupported, trace.errors)
    assert verdict.ok, [str(v) for v in verdict.violations]
    return trace


def draft_replays(trace) -> dict[int, tuple[str, int]]:
    return {r.step: (r.path, r.desc.num_reqs) for r in trace.managers[DRAFT].of(Replay)}


def test_draft_runner_captures_the_bs_list_largest_first_and_pads_draft_batches():
    trace = clean(cfg(capture_sizes=(1, 2, 4, 8), max_num_reqs=6), C, *(D(verify(n, 3)) for n in (1, 3, 5, 6)))
    sub = trace.managers[DRAFT]
    assert sub.config["decode_query_len"] == 1  # topk 1: one token per request per draft step
    # The pool (6) is added to the list and 8 dropped (get_batch_sizes_to_capture).
    assert [e.desc.num_reqs for e in sub.of(CreateForwardFn)] == [6, 4, 2, 1]
    assert [f.in_graph for f in sub.of(Forward) if f.phase == "capture" and f.desc.num_reqs == 4] == [False, False, True]
    assert draft_replays(trace) == {1: ("full", 1), 2: ("full", 4), 3: ("full", 6), 4: ("full", 6)}
    # The draft runner hands back one row per real request.
    assert [(e.rows, e.real_rows, e.padded_rows) for e in sub.of(GraphOutput)] == [(1, 1, 1), (3, 3, 4), (5, 5, 6),
                                                                                   (6, 6, 6)]
    # Every replayed row equals the eager draft, and the sub-trace was judged by sglang's rules.
    assert all(r.outputs_ok for r in sub.of(Replay))
    _, verdict = run(cfg(capture_sizes=(1, 2, 4, 8), max_num_reqs=6), C, D(verify(3, 3)))
    assert {"SGL-CAND-ORDER", "SGL-DISPATCH-MINIMAL", "REPLAY-EQUALS-EAGER"} <= set(verdict.checked)


def test_tree_drafts_hold_bs_times_topk_tokens():
    c = cfg(decode_query_len=4, engine_options=sgl(eagle_topk=2, eagle_steps=3))
    trace = clean(c, C, D(verify(3, 4)), D(verify(1, 4)))
    sub = trace.managers[DRAFT]
    assert {(d.num_tokens, d.num_reqs, d.uniform_token_count) for d in sub.of(Candidates)[0].capture_descs} == {
        (8, 4, 2), (4, 2, 2), (2, 1, 2)}
    assert draft_replays(trace) == {1: ("full", 4), 2: ("full", 1)}
    assert "--speculative-eagle-topk 2" in launch_for(c).line() and "--speculative-num-steps 3" in launch_for(c).line()


def test_padding_disabled_replays_exact_sizes_only():
    trace = clean(cfg(engine_options=sgl(disable_padding=True)), C, D(verify(3, 3)), D(verify(2, 3)))
    assert draft_replays(trace) == {1: ("eager", 3), 2: ("full", 2)}


def test_release_and_recapture_rebuild_the_draft_runner():
    steps = (C, D(verify(3, 3)), R, D(verify(3, 3)), C, D(verify(2, 3)))
    if not compat.probe().release:  # a tree without sglang's elastic release path: no launch releases
        assert run(cfg(), *steps)[0].unsupported
        return
    trace = clean(cfg(), *steps)
    assert draft_replays(trace) == {1: ("full", 4), 3: ("eager", 3), 5: ("full", 2)}


@pytest.mark.parametrize("kw, why", [
    (dict(decode_query_len=2), "one draft step: no draft decode runner (speculative_num_steps == 1)"),
    (dict(mode="NONE"), "decode backend disabled"),
    (dict(decode_query_len=1), "no EAGLE"),
    (dict(num_ubatches=2), "the driver does not run it under two-batch overlap"),
])
def test_configs_without_a_driven_draft_runner(kw, why):
    trace = clean(cfg(**kw), C, D(verify(1, kw.get("decode_query_len", 3))))
    assert DRAFT not in trace.managers, why


def test_a_chain_whose_steps_contradict_its_draft_tokens_is_unsupported():
    # With topk 1 sglang sets the draft tokens to steps + 1: such a config is not what it builds.
    trace, verdict = run(cfg(engine_options=sgl(eagle_steps=3)), C)
    assert trace.unsupported and "steps + 1" in trace.unsupported and verdict.ok


def test_the_draft_sub_trace_is_judged_by_the_dispatch_rules():
    """Sensitivity: a draft runner padding every batch to its largest graph
    violates SGL-DISPATCH-MINIMAL on the draft-decode manager."""
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    with mock.patch.object(EAGLEDraftCudaGraphRunner, "_pad_to_bucket", staticmethod(lambda raw, buckets: buckets[-1])):
        _, verdict = run(cfg(), C, D(verify(1, 3)))
    assert any(v.property == "SGL-DISPATCH-MINIMAL" and v.message.startswith(f"{DRAFT} manager:")
               for v in verdict.violations), [str(v) for v in verdict.violations]


def test_the_graph_reads_what_the_draft_runner_prepared():
    """Sensitivity: skipping the draft runner's out-of-graph metadata
    preparation at replay changes the replayed rows."""
    from cgsim.targets.sglang._draft import DraftAttention

    prepare = DraftAttention.init_forward_metadata_out_graph
    with mock.patch.object(DraftAttention, "init_forward_metadata_out_graph",
                           lambda self, fb, in_capture=False: prepare(self, fb, True) if in_capture else None):
        _, verdict = run(cfg(), C, D(verify(3, 3)), D(verify(1, 3)))
    assert any(v.property == "REPLAY-EQUALS-EAGER" and DRAFT in v.message for v in verdict.violations)


def test_an_adapter_failure_in_the_draft_world_is_exit_2_not_a_finding():
    from cgsim.targets.sglang._draft import DraftAttention

    def broken(self, fb, for_capture):
        # cgsim's own code fails (the workload handed a layout it cannot read).
        return self.workload.prepare_attn(None, 1, 1, 1, for_capture)

    with mock.patch.object(DraftAttention, "_build", broken), pytest.raises(TargetEnvironmentError,
                                                                             match="adapter failed"):
        run(cfg(), C, D(verify(1, 3)))


def test_sglang_asking_the_draft_worker_for_what_it_lacks_is_exit_2():
    from cgsim.targets.sglang._draft import _DraftWorker

    with mock.patch.object(_DraftWorker, "__init__", lambda self, handle, runner: None), \
            pytest.raises(TargetEnvironmentError, match="_DraftWorker"):
        run(cfg(), C, D(verify(1, 3)))


# -- the mutant: a one-line bug in sglang's draft runner -----------------------------------------

_EXAMPLE = """
import json, sys
from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.properties import check_scenario
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step
from cgsim.targets import get_target
from cgsim.targets.sglang.compat import probe

get_target("sglang").prepare_environment()
config = ManagerConfig.from_json(json.loads(sys.argv[1]))
steps = [Step.capture()] + [Step.dispatch(Batch(tuple(q))) for q in json.loads(sys.argv[2])]
scenario = Scenario(config, tuple(steps), ruleset=probe().ruleset)
trace = run_scenario(scenario, "sglang", timeout=300)
verdict = check_scenario(scenario, trace)
print(json.dumps([[v.property, v.message] for v in verdict.violations] + [["errors", str(trace.errors)]]))
"""
DRAFTED = {"mode": "FULL_DECODE_ONLY", "capture_sizes": [1, 2, 4], "max_num_reqs": 4, "decode_query_len": 3}


def violations_under(env: dict, config: dict, batches: list) -> list[list[str]]:
    full = {k: v for k, v in os.environ.items() if k != MUTATIONS_ENV}
    full.update(PYTHONPATH=REPO, **env)
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", _EXAMPLE, json.dumps(config), json.dumps(batches)],
                         capture_output=True, text=True, env=full, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_draft_hidden_not_filled_is_found_where_the_clean_tree_passes():
    batches = [[3, 3, 3], [3]]
    clean_run = violations_under({}, DRAFTED, batches)
    assert clean_run == [["errors", "[]"]], clean_run
    mutated = violations_under({MUTATIONS_ENV: json.dumps(["draft-hidden-not-filled"])}, DRAFTED, batches)
    assert any(p == "REPLAY-EQUALS-EAGER" and m.startswith(f"{DRAFT} manager:") for p, m in mutated), mutated


def test_a_draft_runner_crash_in_sglangs_code_is_a_finding():
    # A line of sglang's draft runner raising at replay: sglang's failure (recorded in the sub-trace), not exit 2.
    crash = Mutation(DRAFT_MODULE, "        raw_num_token = raw_bs * self.captured_req_width",
                     "        raw_num_token = raw_bs * self.captured_req_width + [][0]", "draft-replay-crash")
    out = violations_under(environment_for([crash]), DRAFTED, [[3, 3, 3]])
    assert any(p in ("NO-CRASH", "NO-ILLEGAL-OP") and "IndexError" in m and DRAFT in m for p, m in out), out


def test_a_campaign_finds_draft_hidden_not_filled(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != MUTATIONS_ENV}
    env.update(PYTHONPATH=REPO, **{MUTATIONS_ENV: json.dumps(["draft-hidden-not-filled"])})
    res = subprocess.run([sys.executable, "-m", "fuzz", "run", "--target", "sglang", "--report-dir",
                          str(tmp_path / "reports"), "--quiet", "--budget", "30s", "--seed", "1", "--workers", "1"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert res.returncode == 1, res.stderr[-2000:]
    found = []
    for root, _, files in os.walk(tmp_path / "reports"):
        if os.path.basename(root) == "findings":
            found += [json.load(open(os.path.join(root, f))) for f in files if f.endswith(".json")]
    draft = [f for f in found if f["property"] == "REPLAY-EQUALS-EAGER" and f["message"].startswith(f"{DRAFT} manager:")]
    assert draft, [(f["property"], f["message"][:120]) for f in found]
    assert draft[0]["sglang_mutations"] == ["draft-hidden-not-filled"]
    assert "--speculative-num-steps" in draft[0]["launch"]["line"]


# -- EAGLE's draft extend runner -------------------------------------------------------------------

EXTEND = rules.DRAFT_EXTEND
EXTEND_MODULE = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"


def test_draft_extend_runner_captures_at_the_draft_tokens_width_and_keeps_a_row_per_request():
    c = cfg(capture_sizes=(1, 2, 4, 8), max_num_reqs=6, decode_query_len=2)  # one draft step: no draft decode runner
    trace = clean(c, C, *(D(verify(n, 2)) for n in (1, 3, 6)))
    assert DRAFT not in trace.managers
    sub = trace.managers[EXTEND]
    assert sub.config["decode_query_len"] == 2
    assert [(e.desc.num_tokens, e.desc.num_reqs) for e in sub.of(CreateForwardFn)] == [(12, 6), (8, 4), (4, 2), (2, 1)]
    assert {r.step: (r.path, r.desc.num_reqs) for r in sub.of(Replay)} == {1: ("full", 1), 2: ("full", 4),
                                                                           3: ("full", 6)}
    assert [(e.rows, e.padded_rows) for e in sub.of(GraphOutput)] == [(1, 1), (3, 4), (6, 6)]
    assert all(r.outputs_ok for r in sub.of(Replay))


def test_draft_extend_is_captured_after_draft_decode_and_both_follow_padding_disabled():
    trace = clean(cfg(decode_query_len=4, engine_options=sgl(disable_padding=True)), C, D(verify(3, 4)), D(verify(2, 4)))
    assert list(trace.managers) == [DRAFT, EXTEND]
    assert {r.step: r.path for r in trace.managers[EXTEND].of(Replay)} == {1: "eager", 2: "full"}


def test_draft_extend_hidden_not_filled_is_found_where_the_clean_tree_passes():
    skip = Mutation(EXTEND_MODULE, "            buffers.hidden_states[:num_tokens].copy_(\n"
                                   "                forward_batch.spec_info.hidden_states\n            )",
                    "            pass", "draft-extend-hidden-not-filled")
    batches = [[3, 3, 3], [3]]
    assert violations_under({}, DRAFTED, batches) == [["errors", "[]"]]
    mutated = violations_under(environment_for([skip]), DRAFTED, batches)
    assert any(p == "REPLAY-EQUALS-EAGER" and m.startswith(f"{EXTEND} manager:") for p, m in mutated), mutated
    assert not any(m.startswith(f"{DRAFT} manager:") for _, m in mutated), mutated


def test_draft_extend_select_stale_is_found_where_the_clean_tree_passes():
    # The table's draft extend mutant (replay inputs): the rows kept are the capture's, not the accepted tokens'.
    batches = [[3, 3, 3], [3]]
    assert violations_under({}, DRAFTED, batches) == [["errors", "[]"]]
    mutated = violations_under({MUTATIONS_ENV: json.dumps(["draft-extend-select-stale"])}, DRAFTED, batches)
    assert any(p == "REPLAY-EQUALS-EAGER" and m.startswith(f"{EXTEND} manager:") for p, m in mutated), mutated
    assert not any(m.startswith(f"{DRAFT} manager:") for _, m in mutated), mutated
