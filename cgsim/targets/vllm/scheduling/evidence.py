"""What vLLM's own scheduler says about a finding's claim, recorded with it.

A finding's batch (a dispatch finding) or its "never used" graph
(CAPTURE-USEFUL) comes from cgsim's model of the batches the scheduler
produces, unless its scenario was served (its batches are the scheduler's).
For a model's batch, vLLM's scheduler runs engine-like request mixes for the
finding's launch (the survey's settings: large and small KV caches, sync
and async) and the finding says whether such a batch was scheduled, and
whether any scheduled batch dispatches to the graph it calls unused.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from cgsim.descriptors import BatchDescriptor, BatchShape
from cgsim.scenario import Scenario
from cgsim.spec.dispatch import dispatch_choices
from cgsim.targets.vllm.engine import MAX_MODEL_LEN
from cgsim.targets.vllm.scheduling.driver import run_scheduler
from cgsim.targets.vllm.scheduling.survey import SETTINGS
from cgsim.targets.vllm.scheduling.workload import random_workload

__all__ = ["EVIDENCE_REQUESTS", "EVIDENCE_STEPS", "scheduler_evidence"]

# Requests and engine steps of each run: a few hundred batches a run, about
# a second a finding (a one-request launch would otherwise take thousands).
EVIDENCE_REQUESTS = 48
EVIDENCE_STEPS = 300


def scheduler_evidence(scenario: Scenario, facts: Mapping[str, Any]) -> dict | None:
    """The scheduler's word on the batch (``facts["batch"]``) or graph
    (``facts["graph"]`` among ``facts["captured"]``) a finding rests on; None
    where it rests on neither."""
    shape, graph = facts.get("batch"), facts.get("graph")
    if shape is None and graph is None:
        return None
    served = scenario.served
    # A served scenario's own dispatch steps are the scheduler's; its sweeps' batches are the model's.
    if served is not None and graph is None and BatchShape(**shape) in {b.shape for b in scenario.batches}:
        return {"batches_from": "scheduler", "scheduler": served.scheduler,
                "requests": len(json.loads(served.requests)["requests"]), "batch_scheduled": True}
    config = scenario.config
    adapters = max(config.lora_cases) + 1 if max(config.lora_cases) else 0
    runs = [run_scheduler(config, dataclasses.replace(
        random_workload(seed, num_requests=EVIDENCE_REQUESTS, loras=adapters, kv_tokens=kv,
                        async_scheduling=async_scheduling, context_limit=MAX_MODEL_LEN), max_steps=EVIDENCE_STEPS))
            for seed, (kv, async_scheduling) in enumerate(SETTINGS)]
    scheduled = {b.batch().shape for run in runs for b in run.batches}
    out: dict[str, Any] = {"batches_from": "model", "runs": len(runs),
                           "scheduled": sum(len(run.batches) for run in runs), "launch": runs[0].launch}
    if shape is not None:
        out["batch_scheduled"] = BatchShape(**shape) in scheduled
    if graph is not None:
        wanted = BatchDescriptor.from_json(graph)
        captured = [BatchDescriptor.from_json(d) for d in facts.get("captured", [graph])]
        out["graph_used"] = any(dispatch_choices(s.example(), captured, config.lora_cases) == {wanted}
                                for s in scheduled)
    return out
