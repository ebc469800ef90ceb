"""The agreement corpus: 200+ Scenarios that must give the same verdicts and
dispatch decisions on the CPU mock as when the corpus was recorded, and, with
--cgsim-backend=cuda, the same verdicts, dispatch decisions and replayed
outputs (within OUTPUT_ATOL) on real CUDA graphs.  A disagreement is a mock
bug: fix the mock, then regenerate with tests/agreement/make_corpus.py."""

from __future__ import annotations

import json
import math
import os

import pytest

from cgsim.properties import check_scenario
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario

CORPUS = os.path.join(os.path.dirname(__file__), "agreement", "corpus.jsonl")
ENTRIES = [json.loads(line) for line in open(CORPUS, encoding="utf-8")]
# CPU and GPU float32 kernels differ in reduction order only; rows the mock
# poisoned (a target reading un-replayed memory) are compared by verdict alone.
OUTPUT_ATOL = 1e-3


def _observe(entry: dict, backend: str):
    scenario = Scenario.from_json(entry["scenario"])
    trace = run_scenario(scenario, entry["target"], backend, timeout=600)
    verdict = check_scenario(scenario, trace)
    dispatch = [[e.step, e.desc.to_json()] for e in trace.events if e.kind == "dispatch"]
    return sorted({v.property for v in verdict.violations}), dispatch, trace, verdict


def test_corpus_covers_what_it_must():
    assert len(ENTRIES) >= 200
    scenarios = [Scenario.from_json(e["scenario"]) for e in ENTRIES]
    assert {s.config.mode.value for s in scenarios} == {"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}
    assert {s.ruleset for s in scenarios} == {"pr48822", "vllm-0.32"}
    assert {s.config.breakable for s in scenarios} == {False, True}
    assert any(max(s.config.lora_cases) > 0 for s in scenarios)
    assert any(s.config.decode_query_len > 1 for s in scenarios)
    assert any(s.config.spec_schedule for s in scenarios)
    from cgsim.targets.mutants import MUTANTS

    assert {e["target"] for e in ENTRIES} >= {f"mutant:{m}" for m in MUTANTS} | {"reference"}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_agreement(entry):
    violations, dispatch, _, verdict = _observe(entry, "mock")
    messages = "\n".join(f"{v.property}: {v.message}" for v in verdict.violations)
    assert violations == entry["expected"]["violations"], messages
    assert dispatch == entry["expected"]["dispatch"]
    if os.environ.get("CGSIM_BACKEND") != "cuda":
        return
    mock_trace = _
    cuda_violations, cuda_dispatch, cuda_trace, cuda_verdict = _observe(entry, "cuda")
    cuda_messages = "\n".join(f"{v.property}: {v.message}" for v in cuda_verdict.violations)
    assert cuda_violations == violations, f"mock:\n{messages}\ncuda:\n{cuda_messages}"
    assert cuda_dispatch == dispatch
    for step, mock_out in mock_trace.outputs.items():
        gpu_out = cuda_trace.outputs.get(step)
        assert gpu_out is not None and gpu_out.shape == mock_out.shape, f"step {step}: output missing or reshaped on cuda"
        finite = mock_out.isfinite()
        if finite.any():
            err = float((gpu_out[finite] - mock_out[finite]).abs().max())
            assert math.isfinite(err) and err <= OUTPUT_ATOL, f"step {step}: mock and cuda outputs differ by {err}"
