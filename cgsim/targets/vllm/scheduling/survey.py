"""Engine-like launches scheduled by vLLM's own scheduler, each batch
checked against cgsim's model (``crosscheck``): vLLM's default capture
ladder, static and dynamic speculative decoding (shrinking, halving and
rising schedules), LoRA, chunked prefill, preemption from a small KV cache,
requests that end at max_model_len, sync and async scheduling."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cgsim.config import ManagerConfig
from cgsim.targets.vllm.compat import require_vllm
from cgsim.targets.vllm.engine import MAX_MODEL_LEN, default_capture_sizes, reach
from cgsim.targets.vllm.scheduling.crosscheck import CrossCheck, Exercised, Miss, cross_check
from cgsim.targets.vllm.scheduling.driver import run_scheduler
from cgsim.targets.vllm.scheduling.workload import random_workload

__all__ = ["SurveyCase", "CASES", "SurveyResult", "survey", "summary"]

# A KV cache of little more than one max_model_len request: preemptions.
SMALL_KV_TOKENS = MAX_MODEL_LEN + 1024


@dataclass(frozen=True)
class SurveyCase:
    name: str
    max_num_seqs: int
    decode_query_len: int = 1
    spec_schedule: tuple | None = None
    lora_cases: tuple[int, ...] = (0,)
    adapters: int = 0  # distinct adapters the requests use
    capture_sizes: tuple[int, ...] | None = None  # None: vLLM's default ladder
    given: ManagerConfig | None = None  # a finding's config, taken as it is

    @classmethod
    def of(cls, name: str, config: ManagerConfig) -> "SurveyCase":
        """A case of ``config`` (LoRA adapters up to its largest case)."""
        return cls(name, config.max_num_reqs, adapters=max(config.lora_cases) + 1, given=config)

    def config(self) -> ManagerConfig:
        if self.given is not None:
            return self.given
        sizes = self.capture_sizes or default_capture_sizes(self.max_num_seqs, self.decode_query_len, self.spec_schedule)
        return ManagerConfig(capture_sizes=sizes, max_num_reqs=self.max_num_seqs, decode_query_len=self.decode_query_len,
                             spec_schedule=self.spec_schedule, lora_cases=self.lora_cases)


CASES = (
    SurveyCase("default-ladder", 32),
    SurveyCase("static-sd", 32, 4),
    SurveyCase("dynamic-sd-halving", 32, 4, ((1, 4, 3), (5, 12, 1), (13, 32, 0))),
    SurveyCase("dynamic-sd-rising", 16, 4, ((1, 2, 1), (3, 16, 3))),
    # docs/findings.md #6: 1 request drafts nothing, 2 requests one token.
    SurveyCase("finding-6", 2, 4, ((1, 1, 0), (2, 2, 1)), capture_sizes=(1, 2)),
    SurveyCase("lora", 32, lora_cases=(0, 5), adapters=6),
    # One request drafts a token, two draft none: vLLM 0.25-0.33 capture FULL(4, r2, u2) all the same.
    SurveyCase("dynamic-sd-dead-graph", 2, 2, ((1, 1, 1), (2, 2, 0)), capture_sizes=(1, 2, 4)),
)


@dataclass(frozen=True)
class SurveyResult:
    case: str
    launch: str
    config: ManagerConfig  # the manager config vLLM built from the launch
    check: CrossCheck


# (KV cache tokens, async scheduling) of successive runs, in turn: a large
# cache and vLLM's choice (async), a small cache, the same synchronously,
# and a large cache synchronously.
SETTINGS = ((None, None), (SMALL_KV_TOKENS, None), (SMALL_KV_TOKENS, False), (None, False))


def survey(min_batches: int, cases: tuple[SurveyCase, ...] = CASES, requests: int = 80, seed: int = 0) -> list[SurveyResult]:
    """Rounds over ``cases`` (one run each, a new seeded workload per run)
    until ``min_batches`` batches were scheduled, every case checked
    against the model of the manager config vLLM builds for it."""
    require_vllm()  # before the ladder's launch imports vLLM: a source tree is laid over the install first
    runs: dict[str, list] = {c.name: [] for c in cases}
    total = 0
    for n in itertools.count():
        case = cases[n % len(cases)]
        kv, async_scheduling = SETTINGS[n % len(SETTINGS)]
        workload = random_workload(seed + n, num_requests=requests, loras=case.adapters, kv_tokens=kv,
                                   async_scheduling=async_scheduling, context_limit=MAX_MODEL_LEN)
        run = run_scheduler(case.config(), workload)
        runs[case.name].append(run)
        total += len(run.batches)
        if total >= min_batches and n + 1 >= len(cases):
            break
    built = {c.name: reach(c.config()) for c in cases}
    return [SurveyResult(c.name, runs[c.name][0].launch, built[c.name], cross_check(built[c.name], runs[c.name]))
            for c in cases if runs[c.name]]


def summary(results: list[SurveyResult]) -> tuple[Exercised, tuple[Miss, ...]]:
    """What all the results exercised together, and every miss."""
    exercised, misses = Exercised(), ()
    for r in results:
        exercised = exercised + r.check.exercised
        misses += r.check.misses
    return exercised, misses
