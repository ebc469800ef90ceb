"""The MoE toy (vLLM's Mixtral on toy/moe's config) through vLLM's own model
runner: one rank, and two data-parallel ranks with expert parallelism joined
in one gloo world (runner_build.build_dp_runners; runner_serve.serve_pair serves
every rank: serve_ranks, serve_dp_runners).

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
from cgsim.targets.vllm.compat import VllmEnvironmentError, require_vllm  # noqa: E402
from cgsim.targets.vllm.engine import MOE, EngineLaunch, launch_for  # noqa: E402
from cgsim.targets.vllm.mutation import MUTATIONS_ENV, SERVED_MUTATIONS, environment_for, in_tree  # noqa: E402
from cgsim.targets.vllm.runner_build import build_dp_runners, build_runner  # noqa: E402
from cgsim.targets.vllm.runner_serve import (  # noqa: E402
    graphs_equal_eager,
    ServedRun,
    serve_pair,
    served_consequence,
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
def test_micro_batching_needs_deepep_which_the_cpu_device_lacks() -> None:
    # DBO (--enable-dbo) exists only with DP > 1 and, by vLLM's config, a DeepEP/NIXL-EP all2all backend.
    launch = launch_for(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4), max_num_reqs=4,
                                      compiled_piecewise=False, num_ubatches=2, ubatch_threshold=2))
    assert launch.model == MOE and launch.kwargs()["all2all_backend"] == "deepep_low_latency"
    with pytest.raises(VllmEnvironmentError, match="deepep_low_latency all2all backend needs its kernels"):
        build_dp_runners(launch)


DP_BUGS = [m for m in in_tree(SERVED_MUTATIONS, require_vllm().location) if m.area == "data-parallel padding"]


@pytest.mark.slow
def test_two_data_parallel_ranks_served_in_lockstep_equal_eager() -> None:
    # serve_pair (a confirmation's, a finding's replay) serves a DP launch on all its ranks: rank 1 has half of rank
    # 0's requests, so the runner pads it to the busier rank's count, then it runs dummy batches.
    pair = serve_pair(DP_EP, 900)
    assert "error" not in pair, pair
    graphs, eager = ServedRun.from_json(pair["graphs"]), ServedRun.from_json(pair["eager"])
    assert graphs.raised is None and eager.raised is None, (graphs.raised, eager.raised)
    assert sorted(graphs.tokens) == ["dp0:r0", "dp0:r1", "dp0:r2", "dp0:r3", "dp1:r0", "dp1:r1"]
    assert graphs.replays > 0 and eager.replays == 0 and graphs.steps == eager.steps
    assert graphs_equal_eager(graphs, eager) == []


@pytest.mark.slow
@pytest.mark.parametrize("mutation", DP_BUGS, ids=[m.name for m in DP_BUGS])
def test_a_bug_in_the_data_parallel_padding_shows_when_the_ranks_are_served(mutation, monkeypatch) -> None:
    """Put into the serving children's vLLM as it is imported: the ranks no
    longer agree on the padded batch, and the graph run fails where eager
    serves."""
    monkeypatch.setenv(MUTATIONS_ENV, environment_for([mutation])[MUTATIONS_ENV])
    said = served_consequence(DP_EP, 900)
    assert said.get("error") is None and said["eager_raised"] is None, said
    assert said["raised"] is not None or said["differences"], said
