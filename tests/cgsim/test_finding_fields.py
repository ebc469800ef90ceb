"""A violation's structured fields, as a Finding stores them and readers take
them; findings written before the fields existed load upgraded."""

from __future__ import annotations

import json
from pathlib import Path

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.finding import Finding, facts_of_old_finding
from cgsim.modes import CUDAGraphMode
from cgsim.properties import check_scenario
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _old(name: str) -> dict:
    return json.loads((DOCS / name).read_text())


def test_an_old_dispatch_finding_without_facts_loads_with_its_batch_got_and_expected():
    data = _old("findings/dispatch-priority-29225784ff.json")
    assert "facts" not in data
    f = Finding.from_json(data)
    steps = data["scenario"]["steps"]
    assert f.batch == Batch.from_json(steps[f.step]["batch"]).shape
    assert f.got is not None and f.got.cg_mode is CUDAGraphMode.PIECEWISE and f.got.short() in f.message
    assert f.expected and all(d.cg_mode is CUDAGraphMode.FULL for d in f.expected)
    assert f.manager is None and f.overflow is None


def test_an_old_finding_with_facts_under_earlier_names_loads_with_the_fields():
    data = _old("findings/dispatch-complete-955d42685b.json")
    assert isinstance(data["facts"]["batch"], str) and isinstance(data["facts"]["got"], str)  # short texts then
    f = Finding.from_json(data)
    assert f.batch == Batch.from_json(data["scenario"]["steps"][f.step]["batch"]).shape
    assert f.got is not None and f.got.short() == data["facts"]["got"]
    assert f.fact("fit_in_candidates") == data["facts"]["fit_in_candidates"] and "fits" not in f.facts
    # The names between: the batch's shape and the dispatched descriptor.
    middle = {**f.to_json(), "facts": {"batch_shape": f.batch.to_json(), "dispatched": f.got.to_json()}}
    g = Finding.from_json(middle)
    assert (g.batch, g.got) == (f.batch, f.got) and not {"batch_shape", "dispatched"} & set(g.facts)
    # Written back, it is a finding of this cgsim: loading it again changes nothing.
    again = Finding.from_json(f.to_json())
    assert again == f and facts_of_old_finding(f.to_json()) == dict(f.facts)


def test_old_findings_name_their_manager_graph_and_what_the_engine_raised():
    assert Finding.from_json(_old("findings/fresh-metadata-2f61040c3e.json")).manager == "draft-prefill"
    useful = Finding.from_json(_old("findings/capture-useful-c3e5a31f32.json"))
    assert BatchDescriptor.from_json(useful.fact("graph")).num_ubatches == 2
    crash = Finding.from_json(_old("findings/no-crash-437debb11d.json"))
    assert "already captured" in crash.fact("raised") and not crash.fact("raised").startswith("target")
    bcg = Finding.from_json(_old("sglang-findings/sglang-no-crash-52cea3c636.json"))
    assert bcg.fact("raised").startswith("TypeError: Unsupported BCG output type")


def test_a_dispatch_step_is_judged_as_a_sweep_of_its_one_batch():
    """The step's violation names its batch, what it got and what fits, with
    the step's own words (no sweep count) and no ``swept_after``."""
    config = ManagerConfig(mode=CUDAGraphMode.FULL_AND_PIECEWISE, capture_sizes=(1, 2, 4, 8), max_num_reqs=8)
    batch = Batch((1,) * 4)
    scenario = Scenario(config, (Step.capture(), Step.dispatch(batch)))
    verdict = check_scenario(scenario, run_scenario(scenario, "mutant:range-off-by-one"))
    at_step = [v for v in verdict.violations if v.step == 1]
    assert at_step, verdict.violations
    for v in at_step:
        assert v.batch == batch.shape.to_json() and v.got is not None, v
        assert "dispatch sweep" not in v.message and "swept_after" not in dict(v.facts), v
        f = Finding.from_violation(v, scenario.to_json(), "mutant:range-off-by-one", "mock")
        assert Finding.from_json(f.to_json()).facts == f.facts
    complete = [v for v in at_step if v.property == "DISPATCH-COMPLETE"]
    assert complete and complete[0].expected and complete[0].message.startswith(batch.short())
