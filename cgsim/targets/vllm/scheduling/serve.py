"""Served scenarios: the batches vLLM's scheduler schedules for a request
trace become a scenario's dispatch steps (the vLLM target's ``drawing.serve`` hook).

The steps are plain batches, so a served scenario replays anywhere (another
backend, the reference target, a repro script) without the scheduler; its
``Served`` value keeps the request trace and the launch that produced them.
Every batch is checked against cgsim's model of producible batches first:
a batch the model leaves out is a bug in the model (``ModelMiss``), never
judged, because the sweep and CAPTURE-USEFUL rest on that model.
"""

from __future__ import annotations

import json

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.scenario import Served
from cgsim.targets.base import TargetError
from cgsim.targets.vllm.scheduling.crosscheck import cross_check
from cgsim.targets.vllm.scheduling.driver import run_scheduler
from cgsim.targets.vllm.scheduling.workload import Workload

__all__ = ["MAX_SERVED_STEPS", "ModelMiss", "served_stream"]

# Dispatch steps a served scenario holds (each replays): a request trace the
# strategies draw schedules a few dozen distinct batches.
MAX_SERVED_STEPS = 48


class ModelMiss(TargetError):
    """vLLM's scheduler produced a batch that ``cgsim.spec.scheduler`` says
    it never produces: cgsim's model is wrong (exit 2, with the trace that
    shows it)."""

    exit_code = 2


def _folded(batches: list[Batch]) -> tuple[Batch, ...]:
    """A run of identical neighbours as one batch (the same dispatch again)."""
    out: list[Batch] = []
    for b in batches:
        if not out or out[-1] != b:
            out.append(b)
    return tuple(out[:MAX_SERVED_STEPS])


def served_stream(config: ManagerConfig, requests: Workload) -> tuple[tuple[Batch, ...], Served]:
    """The batches vLLM's scheduler schedules for ``requests`` under the
    launch ``config`` stands for (``config``: as vLLM builds it), in order,
    and where they came from.  TargetUnsupported where vLLM refuses the
    trace (a KV cache it will not start with, an adapter without LoRA)."""
    run = run_scheduler(config, requests)
    trace = json.dumps(requests.to_json(), sort_keys=True)
    misses = cross_check(config, [run]).misses
    if misses:
        miss = misses[0]
        raise ModelMiss(f"vLLM's {run.scheduler} scheduled {miss.batch.batch().short()} (step {miss.batch.step}) under "
                        f"`{run.launch}`, which cgsim's model of producible batches leaves out ({miss.reason}): a bug "
                        f"in cgsim.spec.scheduler; the request trace that shows it: {trace}")
    return _folded([b.batch() for b in run.batches]), Served(run.scheduler, run.launch, trace, len(run.batches))
