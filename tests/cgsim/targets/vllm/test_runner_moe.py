"""The MoE toy (vLLM's Mixtral on toy/moe's config) through vLLM's own model
runner: one rank, and two data-parallel ranks with expert parallelism joined
in one gloo world (runner_build.build_dp_runners, runner_serve.serve_dp_runners).

Each build or serve runs in child processes (one per DP rank), ~35-75 s on a
2-core host: slow.
"""

from __future__ import annotations

import json

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.modes import CUDAGraphMode  # noqa: E402
from cgsim.targets.vllm.compat import VllmEnvironmentError  # noqa: E402
from cgsim.targets.vllm.engine import MOE, EngineLaunch, launch_for  # noqa: E402
from cgsim.targets.vllm.runner_build import build_dp_runners, build_runner  # noqa: E402
from cgsim.targets.vllm.runner_serve import (  # noqa: E402
    default_requests,
    eager_twin,
    graphs_equal_eager,
    serve_dp_runners,
    serve_pair,
)

pytestmark = pytest.mark.vllm

DECODE_GRAPHS = ["F:t1:r1:u1", "F:t2:r2:u1", "F:t4:r4:u1"]


def _moe(config: ManagerConfig, **args: object) -> EngineLaunch:
    """``vllm serve mistralai/Mixtral-8x7B-Instruct-v0.1`` (the MoE toy) for ``config``, with ``args``."""
    launch = launch_for(config)
    attention = None if launch.attention is None else (launch.attention[0], json.loads(launch.attention[1]))
    return EngineLaunch.of(MOE, {**launch.kwargs(), **args}, dict(launch.env), attention)


ONE_RANK = _moe(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4), max_num_reqs=4,
                              compiled_piecewise=False))
DP_EP = _moe(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4), max_num_reqs=4,
                           compiled_piecewise=False), data_parallel_size=2, enable_expert_parallel=True)


@pytest.mark.slow
def test_the_moe_toy_captures_one_uniform_decode_graph_per_size_on_one_rank() -> None:
    built = build_runner(ONE_RANK)
    assert built.raised is None, built.raised
    assert built.main is not None and built.main.mode == "FULL_DECODE_ONLY"
    assert [g.short() for g in built.main.graphs] == DECODE_GRAPHS


@pytest.mark.slow
def test_the_moe_toy_served_with_graphs_equals_eager_on_one_rank() -> None:
    pair = serve_pair(ONE_RANK, 600)
    assert "error" not in pair, pair
    from cgsim.targets.vllm.runner_serve import ServedRun  # noqa: PLC0415

    graphs, eager = ServedRun.from_json(pair["graphs"]), ServedRun.from_json(pair["eager"])
    assert graphs.raised is None and graphs.replays > 0
    assert graphs_equal_eager(graphs, eager) == []


@pytest.mark.slow
def test_two_data_parallel_ranks_with_expert_parallelism_each_capture_the_decode_graphs() -> None:
    ranks = build_dp_runners(DP_EP)
    assert len(ranks) == 2
    for built in ranks:
        assert built.raised is None, built.raised
        assert [g.short() for g in built.main.graphs] == DECODE_GRAPHS
        assert not built.has_ubatch_runner  # no --enable-dbo
    assert build_runner(DP_EP).main == ranks[0].main  # a finding's confirmation builds every rank, reads rank 0


@pytest.mark.slow
def test_two_data_parallel_ranks_served_in_lockstep_equal_eager() -> None:
    # Rank 1 has fewer, shorter requests: the runner pads to the busier rank's count, then rank 1 runs dummy batches.
    requests = (default_requests(4, seed=0), default_requests(2, seed=1))
    graphs = serve_dp_runners(DP_EP, requests)
    eager = serve_dp_runners(eager_twin(DP_EP), requests)
    for rank, (g, e) in enumerate(zip(graphs, eager)):
        assert g.raised is None and e.raised is None, (rank, g.raised, e.raised)
        assert g.replays > 0 and g.steps == e.steps
        assert graphs_equal_eager(g, e) == [], rank


@pytest.mark.slow
def test_micro_batching_needs_deepep_which_the_cpu_device_lacks() -> None:
    # DBO (--enable-dbo) exists only with DP > 1 and, by vLLM's config, a DeepEP/NIXL-EP all2all backend.
    launch = launch_for(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4), max_num_reqs=4,
                                      compiled_piecewise=False, num_ubatches=2, ubatch_threshold=2))
    assert launch.model == MOE and launch.kwargs()["all2all_backend"] == "deepep_low_latency"
    with pytest.raises(VllmEnvironmentError, match="deepep_low_latency all2all backend needs its kernels"):
        build_dp_runners(launch)
