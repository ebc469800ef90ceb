"""vLLM's own scheduler in the loop: the batches it really schedules.

Modules: ``workload`` (request traces), ``driver`` (the scheduler as the
engine core drives it, with a fake model runner), ``batches`` (each step's
batch as the V2 model runner receives it), ``crosscheck`` (those batches
against cgsim's model, ``cgsim.spec.scheduler``), ``serve`` (them as a
scenario's dispatch steps), ``survey`` (engine-like
launches scheduled and checked).
"""

from cgsim.targets.vllm.scheduling.batches import ScheduledBatch
from cgsim.targets.vllm.scheduling.driver import ScheduleRun, run_scheduler, scheduler_launch
from cgsim.targets.vllm.scheduling.workload import RequestSpec, Workload, random_workload

__all__ = ["RequestSpec", "Workload", "random_workload", "ScheduledBatch", "ScheduleRun", "run_scheduler",
           "scheduler_launch"]
