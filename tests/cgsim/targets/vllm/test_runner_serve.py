"""Served scenarios through vLLM's own model runner (cgsim.targets.vllm.runner_serve):
vLLM's scheduler, execute_model and sample_tokens on the runner built for a
launch, graph replays on the mock, compared with the same launch eager.

Each serve runs in a child process (about 15-20 s on a 2-core host): slow.
"""

from __future__ import annotations

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.modes import CUDAGraphMode  # noqa: E402
from cgsim.targets.vllm.engine import launch_for  # noqa: E402
from cgsim.targets.vllm.compat import require_vllm  # noqa: E402
from cgsim.targets.vllm.mutation import MUTATIONS_ENV, SERVED_MUTATIONS, environment_for, in_tree  # noqa: E402
from cgsim.targets.vllm.runner_serve import (  # noqa: E402
    ServedRun,
    default_requests,
    eager_twin,
    graphs_equal_eager,
    serve_pair,
    serve_runner,
    served_consequence,
)

pytestmark = pytest.mark.vllm
LAUNCH = launch_for(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4), max_num_reqs=4))


def _run(tokens: dict, logprobs: dict) -> ServedRun:
    return ServedRun("0.32.0", "vllm serve x", tokens, logprobs, 5, 3)


def test_the_eager_twin_turns_graphs_off_and_keeps_the_rest() -> None:
    twin = eager_twin(LAUNCH)
    assert twin.kwargs()["compilation_config"] == {"cudagraph_mode": "NONE"}
    assert {k: v for k, v in twin.args if k != "compilation_config"} == \
        {k: v for k, v in LAUNCH.args if k != "compilation_config"}
    assert (twin.env, twin.attention) == (LAUNCH.env, LAUNCH.attention)


def test_graphs_equal_eager_names_other_tokens_and_log_probabilities_beyond_noise() -> None:
    eager = _run({"r0": [5, 6]}, {"r0": [-1.0, -2.0]})
    assert graphs_equal_eager(_run({"r0": [5, 6]}, {"r0": [-1.0, -2.01]}), eager) == []
    assert graphs_equal_eager(_run({"r0": [5, 7]}, {"r0": [-1.0, -2.0]}), eager) == \
        ["request r0: tokens [5, 7] with CUDA graphs, [5, 6] eager"]
    assert "differ by 0.500" in graphs_equal_eager(_run({"r0": [5, 6]}, {"r0": [-1.0, -2.5]}), eager)[0]


def test_a_request_reads_its_log_probabilities_from_its_own_rows_when_drafts_were_verified() -> None:
    """With drafts vLLM gives a request a row per logit (1 + its drafts), its
    rows starting at cu_num_generated_tokens: the next request's sampled
    token reads its own first row, not the previous one's rejected draft rows."""
    from types import SimpleNamespace  # noqa: PLC0415

    import cgsim.targets.vllm.runner_serve as runner_serve  # noqa: PLC0415

    rows = [[-1.0], [-9.0], [-9.0], [-2.0], [-3.0], [-9.0]]
    output = SimpleNamespace(req_ids=["a", "b"], sampled_token_ids=[[5], [6, 7]],
                             logprobs=SimpleNamespace(logprobs=rows, cu_num_generated_tokens=[0, 3, 6]))
    tokens: dict = {}
    logprobs: dict = {}
    per_step: dict = {}
    runner_serve._collect(output, tokens, logprobs, per_step)
    assert (tokens, logprobs, per_step) == ({"a": [5], "b": [6, 7]}, {"a": [-1.0], "b": [-2.0, -3.0]},
                                            {"a": [1], "b": [2]})


def test_a_pair_whose_time_runs_out_is_left_unserved_not_an_error(monkeypatch) -> None:
    """The graphs run took what was left of the share: the eager run's child
    times out, which is the budget's end (None), not an environment's fault."""
    import cgsim.targets.vllm.runner_serve as runner_serve  # noqa: PLC0415
    from cgsim.targets.vllm.compat import RunnerTimedOut  # noqa: PLC0415

    runs = iter([_run({"r0": [5]}, {"r0": [-1.0]})])

    def serve(launch, requests, timeout_s):
        run = next(runs, None)
        if run is None:
            raise RunnerTimedOut(f"serving took over {timeout_s:.0f} s")
        return run

    monkeypatch.setattr(runner_serve, "serve_runner", serve)
    assert serve_pair(LAUNCH, 60) is None
    runs = iter([])
    assert served_consequence(LAUNCH, 60) is None


def test_no_launch_starts_with_less_time_left_than_the_longest_serve_so_far(monkeypatch) -> None:
    """Launches come cheapest first: one started with less time than the
    last took would run out and waste the rest of the share."""
    import time  # noqa: PLC0415

    import cgsim.targets.vllm.runner_serve as runner_serve  # noqa: PLC0415

    monkeypatch.setattr(runner_serve, "MIN_SERVE_S", 0.0)
    started: list[str] = []

    def serve(launch, left):
        started.append(launch)
        time.sleep(0.3)
        return {"graphs": {}, "eager": {}}

    results = runner_serve._within(["a", "b"], 1, lambda: False, 0.45, serve)
    assert (started, results) == (["a"], [{"graphs": {}, "eager": {}}, None])
    started.clear()  # time enough for both: both start
    assert runner_serve._within(["a", "b"], 1, lambda: False, 5.0, serve)[1] is not None and started == ["a", "b"]


@pytest.mark.slow
@pytest.mark.parametrize("mode,breakable,sizes", [(CUDAGraphMode.FULL_DECODE_ONLY, False, (1, 2, 4)),
                                                  (CUDAGraphMode.PIECEWISE, False, (1,)),
                                                  (CUDAGraphMode.PIECEWISE, True, (1, 2, 4))],
                         ids=["FULL_DECODE_ONLY", "PIECEWISE", "PIECEWISE-breakable"])
def test_requests_served_with_graphs_give_what_vllm_gives_eager(mode: CUDAGraphMode, breakable: bool,
                                                                 sizes: tuple[int, ...]) -> None:
    """vLLM's scheduler, execute_model and sample_tokens run every step; the
    decode steps replay graphs on the mock (FULL: one a step; PIECEWISE: one
    a piece; breakable: graph segments around attention run eagerly with the
    live batch's metadata), and the tokens and log-probabilities are eager's.
    PIECEWISE captures size 1 only: the model's first forward must still be
    the worker's profile run (torch.compile specialised on a first trace of
    one token, and every prefill raised)."""
    launch = launch_for(ManagerConfig(mode=mode, capture_sizes=sizes, max_num_reqs=max(sizes), breakable=breakable))
    requests = default_requests()
    graphs = serve_runner(launch, requests)
    eager = serve_runner(eager_twin(launch), requests)
    assert graphs.raised is None and eager.raised is None, (graphs.raised, eager.raised)
    assert graphs.replays >= 3 and eager.replays == 0
    assert [len(graphs.tokens[f"r{i}"]) for i in range(len(requests))] == [r.max_tokens for r in requests]
    assert len({lp for lps in eager.logprobs.values() for lp in lps}) > 3  # the toy's output moves with its context
    assert graphs_equal_eager(graphs, eager) == []


# An EAGLE launch (three drafts a step) whose draft model has FULL decode graphs of its own.
EAGLE = launch_for(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4, 8, 16), max_num_reqs=4,
                                 decode_query_len=4))
# The DFlash draft manager's bugs share one eager run in test_runner_dflash.py; data-parallel padding needs a MoE
# launch on two ranks (test_runner_moe.py).
IN_TREE = [m for m in in_tree(SERVED_MUTATIONS, require_vllm().location)
           if m.area not in ("DFlash draft manager", "data-parallel padding")]
# The launch whose draft manager a mutation of each draft area breaks (others: LAUNCH, no drafts).
LAUNCH_OF_AREA = {"draft manager": EAGLE}


@pytest.mark.slow
def test_an_eagle_launch_drafts_with_graphs_what_it_drafts_eager() -> None:
    """The draft model's own graphs (Triton kernels in them replayed too):
    every step's drafts, not only the verified tokens, are eager's."""
    graphs = serve_runner(EAGLE, default_requests())
    eager = serve_runner(eager_twin(EAGLE), default_requests())
    assert graphs.raised is None and eager.raised is None, (graphs.raised, eager.raised)
    assert graphs.replays > 0 and all(len(d) > 1 for d in graphs.drafts.values()), graphs.drafts
    assert graphs_equal_eager(graphs, eager) == []


@pytest.mark.slow
@pytest.mark.parametrize("mutation", IN_TREE, ids=[m.name for m in IN_TREE])
def test_a_bug_in_the_runners_own_paths_shows_as_other_tokens_served(mutation, monkeypatch) -> None:
    """A one-line bug in a path only vLLM's runner takes (put into the tree as
    it is imported, in the serving child): the same launch that serves
    eager's tokens (and drafts) above serves other ones with its graphs."""
    monkeypatch.setenv(MUTATIONS_ENV, environment_for([mutation])[MUTATIONS_ENV])
    said = served_consequence(LAUNCH_OF_AREA.get(mutation.area, LAUNCH), 600)
    assert said.get("error") is None and said["raised"] is None, said
    assert said["differences"], said
    if mutation.area not in LAUNCH_OF_AREA:
        assert said["wrong_output"], said
    else:
        # The EAGLE draft's bug changes only the drafts: greedy verification keeps the tokens and their
        # log-probabilities.
        assert not said["wrong_output"], said
