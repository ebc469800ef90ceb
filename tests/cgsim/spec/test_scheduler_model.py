"""cgsim's model of the batches a scheduler produces (``cgsim.spec.scheduler``),
as vLLM's scheduler showed it (``tests/cgsim/targets/vllm/test_vllm_scheduler.py`` runs it):
a decode request verifies the drafts chosen for the batch of the step
before, which may have been larger, or fewer near max_model_len."""

from __future__ import annotations

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.properties.dispatch import useless_descriptors
from cgsim.spec.scheduler import is_decode_batch, longest_decode_len, sweep_plan, why_not_producible

F = CUDAGraphMode.FULL
# 1-2 requests draft 3 tokens (length 4), 3-8 requests 1 token (length 2).
HALVING = ManagerConfig(capture_sizes=(1, 2, 4, 8, 16), max_num_reqs=8, decode_query_len=4,
                        spec_schedule=((1, 2, 3), (3, 8, 1)))
# 1-2 requests draft 1 token (length 2), 3-8 requests 3 tokens (length 4).
RISING = HALVING.with_(spec_schedule=((1, 2, 1), (3, 8, 3)))
# docs/findings.md #6: 1 request drafts nothing, 2 requests one token.
FINDING_6 = ManagerConfig(mode="FULL", capture_sizes=(1, 2), max_num_reqs=2, decode_query_len=4,
                          spec_schedule=((1, 1, 0), (2, 2, 1)))


def test_a_decode_may_carry_the_drafts_of_a_larger_batch():
    # Three requests drafted 1 token; one finished: two verify length 2.
    assert is_decode_batch(HALVING, (2, 2)) and is_decode_batch(RISING, (4, 4))
    # No batch of 3 or more requests drafts 3 tokens under HALVING.
    assert not is_decode_batch(HALVING, (4, 4, 4))
    assert [longest_decode_len(HALVING, n) for n in range(1, 9)] == [4, 4, 2, 2, 2, 2, 2, 2]
    assert [longest_decode_len(RISING, n) for n in range(1, 9)] == [4] * 8


def test_a_decode_request_near_max_model_len_verifies_fewer_drafts():
    static = ManagerConfig(capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=4)
    assert is_decode_batch(static, (4, 4, 2)) and is_decode_batch(static, (1,))
    why = why_not_producible(static, Batch((5,)))
    assert why is not None and "at most 4 tokens long" in why
    plain = ManagerConfig(capture_sizes=(1, 2, 4), max_num_reqs=4)
    assert is_decode_batch(plain, (1, 1)) and not is_decode_batch(plain, (2,))
    assert why_not_producible(plain, Batch((2,), has_prefill=True)) is None


def test_the_sweep_asks_decodes_that_carry_a_larger_batchs_drafts():
    shapes = sweep_plan(HALVING).shapes
    two_of_length_2 = [s for s in shapes if (s.num_reqs, s.uniform_token_count, s.has_prefill) == (2, 2, False)]
    assert two_of_length_2
    assert not [s for s in shapes if (s.num_reqs, s.uniform_token_count, s.has_prefill) == (3, 4, False)]


def test_a_graph_a_shrunk_batch_lands_on_is_useful():
    # vLLM 0.32 captures both lengths at both sizes; after two requests
    # shrink to one, that one verifies its 1 draft on FULL(2, r1, u2).
    captured = [BatchDescriptor(F, 1, 1, 1), BatchDescriptor(F, 2, 2, 1), BatchDescriptor(F, 2, 1, 2)]
    assert useless_descriptors(FINDING_6, captured) == {}
    # Under HALVING no batch of 3 requests verifies 3 drafts, and the graph
    # for 2 takes the smaller ones: the graph for 3 stays dead.
    dead = BatchDescriptor(F, 12, 3, 4)
    captured = [dead, BatchDescriptor(F, 8, 2, 4), BatchDescriptor(F, 16, 8, 2)]
    assert set(useless_descriptors(HALVING, captured)) == {dead}
