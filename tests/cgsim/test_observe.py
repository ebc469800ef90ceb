"""observe: what a run counts into the campaign's coverage besides its findings."""

from __future__ import annotations

from cgsim.config import ManagerConfig
from cgsim.observe import observe
from cgsim.scenario import Scenario, Step


def test_graph_memory_per_manager_is_counted_after_each_capture():
    sc = Scenario(ManagerConfig(mode="FULL", capture_sizes=(1, 2)), (Step.capture(), Step.release(), Step.capture()),
                  ruleset="pr48822")
    out = observe(sc, "reference", "mock")
    assert not out.findings
    assert [pair for pair in out.coverage if pair[0] == "graph_memory"] == [("graph_memory", "main: < 4 KiB")] * 2
    # A manager that plans no graph records no graph memory.
    eager = Scenario(ManagerConfig(mode="NONE"), (Step.capture(),), ruleset="pr48822")
    assert not [pair for pair in observe(eager, "reference", "mock").coverage if pair[0] == "graph_memory"]
