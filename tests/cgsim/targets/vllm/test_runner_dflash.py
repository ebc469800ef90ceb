"""DFlash launches through vLLM's own model runner: the toy DFlash draft
(vLLM's DFlashQwen3ForCausalLM on toy/dflash's config) behind
``--speculative-config '{"method":"dflash",...}'``, the DFlash speculator's
query graphs (DFlashCudaGraphManager) captured by ``capture_model()`` and
served against the same launch eager.

Each build or serve runs in a child process (~12 s a build, ~30 s a served
pair on a 2-core host): slow.
"""

from __future__ import annotations

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.properties.lifecycle import served_violations  # noqa: E402
from cgsim.scenario import Scenario, Step  # noqa: E402
from cgsim.modes import CUDAGraphMode  # noqa: E402
from cgsim.targets.vllm.compat import has_dflash_query_graphs, require_vllm  # noqa: E402
from cgsim.targets.vllm.engine import (  # noqa: E402
    DFLASH_CHECKPOINT,
    drafts_with_dflash,
    launch_for,
    served_with_dflash,
    with_dflash_draft,
)
from cgsim.targets.vllm.mutation import MUTATIONS_ENV, SERVED_MUTATIONS, environment_for, in_tree  # noqa: E402
from cgsim.targets.vllm.runner_build import build_runner  # noqa: E402
from cgsim.targets.vllm.runner_serve import default_requests, eager_twin, graphs_equal_eager, serve_runner  # noqa: E402

pytestmark = pytest.mark.vllm

# Three drafts a step: every query graph holds 1 + 3 tokens a request.
DFLASH = with_dflash_draft(launch_for(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY,
                                                    capture_sizes=(1, 2, 4, 8, 16), max_num_reqs=4,
                                                    decode_query_len=4)))


def _needs_dflash() -> None:
    if not has_dflash_query_graphs():
        pytest.skip(f"vLLM {require_vllm().version} has no DFlash query graphs in MRV2")


def test_a_dflash_launch_names_the_public_dflash_draft_and_keeps_the_number_of_drafts() -> None:
    spec = DFLASH.kwargs()["speculative_config"]
    assert (spec["method"], spec["num_speculative_tokens"]) == ("dflash", 3)
    assert DFLASH_CHECKPOINT in DFLASH.line() and "toy" not in DFLASH.line()
    assert drafts_with_dflash(DFLASH) and not drafts_with_dflash(launch_for(ManagerConfig(decode_query_len=4)))


@pytest.mark.slow
def test_the_dflash_speculator_captures_its_query_graphs_through_vllms_runner() -> None:
    """vLLM's runner builds the DFlash speculator from the launch, and its
    query manager captures FULL graphs of 1 + 3 tokens a request, one per
    decode batch size the main manager has."""
    _needs_dflash()
    built = build_runner(DFLASH)
    assert built.raised is None, built.raised
    query, main = built.manager("draft-query"), built.main
    assert query is not None and query.cls == "DFlashCudaGraphManager", [m.name for m in built.managers]
    assert query.mode == "FULL_DECODE_ONLY" and query.graphs, query
    assert {(g.mode, g.uniform_token_count, g.num_tokens // g.num_reqs) for g in query.graphs} == {("FULL", 4, 4)}
    assert {g.num_reqs for g in query.graphs} == {g.num_reqs for g in main.graphs}


# The DFlash draft manager's one-line bugs in this tree (test_runner_serve.py has the other areas').
DFLASH_BUGS = [m for m in in_tree(SERVED_MUTATIONS, require_vllm().location) if m.area == "DFlash draft manager"]


@pytest.mark.slow
def test_a_dflash_launch_drafts_with_graphs_what_it_drafts_eager_and_each_bug_drafts_otherwise(monkeypatch) -> None:
    """The query graphs replayed (the context step and vLLM's Triton kernels
    in them too): every step's drafts and tokens are eager's.  Each one-line
    bug of the DFlash draft manager (put into the tree as the serving child
    imports it) drafts other tokens with graphs; eager is served once, from
    the tree without bugs: each bug is in a path only a replay takes."""
    _needs_dflash()
    graphs = serve_runner(DFLASH, default_requests())
    eager = serve_runner(eager_twin(DFLASH), default_requests())
    assert graphs.raised is None and eager.raised is None, (graphs.raised, eager.raised)
    assert graphs.replays > 0 and eager.replays == 0
    assert all(len(d) > 1 and all(len(step) == 3 for step in d[:-1]) for d in graphs.drafts.values()), graphs.drafts
    assert graphs_equal_eager(graphs, eager) == []
    for bug in DFLASH_BUGS:
        with monkeypatch.context() as patched:
            patched.setenv(MUTATIONS_ENV, environment_for([bug])[MUTATIONS_ENV])
            buggy = serve_runner(DFLASH, default_requests())
        assert buggy.raised is None and buggy.replays > 0, (bug.name, buggy.raised)
        # Other drafts (the tokens too in some runs: not asserted either way).
        differing = served_violations(buggy.to_json(), eager.to_json())
        assert any("drafts" in dict(v.facts) for v in differing), (bug.name, [v.message for v in differing])


def _configs(**settings: object) -> list[ManagerConfig]:
    return [ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4, 8), max_num_reqs=reqs,
                          decode_query_len=q, **settings) for reqs in (1, 2, 3, 4, 6, 8) for q in (1, 2, 3, 4)]


def test_the_runner_share_serves_some_plain_speculative_configs_with_dflash_the_same_ones_each_time() -> None:
    _needs_dflash()
    chosen = [c for c in _configs() if served_with_dflash(c)]
    speculative = [c for c in _configs() if c.decode_query_len > 1]
    assert 0 < len(chosen) < len(speculative) and all(c.decode_query_len > 1 for c in chosen)
    assert chosen == [c for c in _configs() if served_with_dflash(c)]
    # What DFlash launches were not checked with keeps its EAGLE draft.
    assert not any(served_with_dflash(c) for c in _configs(varlen_decode=True) + _configs(lora_cases=(0, 1, 2)))


def test_the_vllm_target_serves_the_chosen_scenarios_launches_with_the_dflash_draft(monkeypatch) -> None:
    """The share's launches (what runner_serve.serve_scenarios is handed):
    DFlash's where served_with_dflash chose the config, else the search's."""
    _needs_dflash()
    import cgsim.targets.vllm.runner_serve as runner_serve  # noqa: PLC0415
    from cgsim.targets.vllm.target import VllmTarget  # noqa: PLC0415

    monkeypatch.setattr(runner_serve, "serve_scenarios", lambda launches, jobs, stopped, budget_s: launches)
    scenarios = [Scenario(c, (Step.capture(),)) for c in _configs() if c.decode_query_len > 1]
    methods = [launch.kwargs()["speculative_config"]["method"]
               for launch in VllmTarget().triage.serve_scenarios(scenarios, 1, lambda: False, 60.0)]
    assert methods == ["dflash" if served_with_dflash(s.config) else "eagle" for s in scenarios]
    assert {"dflash", "eagle"} <= set(methods)
