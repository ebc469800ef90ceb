"""The model against vLLM's scheduler: every batch it scheduled must be in
``cgsim.spec.scheduler``'s producible set for the manager config vLLM built
from the same launch; a miss is a bug in the model.  Also counted: what the
run exercised, so that a run that schedules nothing interesting cannot pass
for evidence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from cgsim.config import ManagerConfig
from cgsim.spec.scheduler import decode_query_len, why_not_producible
from cgsim.targets.vllm.scheduling.batches import ScheduledBatch
from cgsim.targets.vllm.scheduling.driver import ScheduleRun

__all__ = ["Miss", "Exercised", "CrossCheck", "cross_check"]


@dataclass(frozen=True)
class Miss:
    """A scheduled batch the model says the scheduler never produces."""

    batch: ScheduledBatch
    reason: str


@dataclass(frozen=True)
class Exercised:
    """What a set of runs scheduled, by kind.

    ``carried_decodes``: pure decodes with a request that verifies all the
    drafts proposed for it, whose length is not the schedule's for the
    batch's request count (they were chosen for the batch of the step
    before, of another size).  ``short_decodes``: pure decodes with a
    request verifying fewer drafts than were proposed for it (near
    max_model_len).
    ``chunked_prefills``: requests whose prompt took more than one step.
    ``one_token_prefills``: prefilling requests that run as a decode."""

    batches: int = 0
    decodes: int = 0
    carried_decodes: int = 0
    short_decodes: int = 0
    prefills: int = 0
    chunked_prefills: int = 0
    one_token_prefills: int = 0
    lora_batches: int = 0
    most_loras: int = 0
    preemptions: int = 0
    async_runs: int = 0
    sync_runs: int = 0

    def __add__(self, other: "Exercised") -> "Exercised":
        return Exercised(**{f: (max if f == "most_loras" else int.__add__)(getattr(self, f), getattr(other, f))
                            for f in self.__dataclass_fields__})


@dataclass(frozen=True)
class CrossCheck:
    """``longest_decodes``: (request count, the longest query length of a
    pure decode of that many requests the scheduler produced), by count."""

    misses: tuple[Miss, ...]
    exercised: Exercised
    longest_decodes: tuple[tuple[int, int], ...] = ()


def _exercised(config: ManagerConfig, run: ScheduleRun) -> Exercised:
    decodes = carried = short = prefills = one_token = lora = most = 0
    prefilling_before: set[str] = set()
    chunked: set[str] = set()
    proposed: dict[str, int] = {}  # request -> drafts proposed for it after the last step it ran in
    for b in run.batches:
        if b.decode_graph_eligible and not b.has_prefill:
            decodes += 1
            tier = decode_query_len(config, b.num_reqs)
            fewer = [d < proposed.get(r, 0) for r, d in zip(b.req_ids, b.draft_lens)]
            short += any(fewer)
            carried += any(q != tier and not f for q, f in zip(b.query_lens, fewer))
        proposed.update(dict.fromkeys(b.req_ids, b.next_drafts))
        if b.has_prefill:
            prefills += 1
        one_token += sum(1 for p, q, d in zip(b.prefilling, b.query_lens, b.draft_lens) if p and q - d == 1
                         and b.decode_graph_eligible)
        now = {r for r, p in zip(b.req_ids, b.prefilling) if p}
        chunked |= now & prefilling_before
        prefilling_before = now
        lora += bool(b.loras)
        most = max(most, len(b.loras))
    is_async = run.scheduler == "AsyncScheduler"
    return Exercised(len(run.batches), decodes, carried, short, prefills, len(chunked), one_token, lora, most,
                     run.preemptions, int(is_async), int(not is_async))


def cross_check(config: ManagerConfig, runs: Iterable[ScheduleRun]) -> CrossCheck:
    """Every batch of ``runs`` against the model for ``config`` (the manager
    config vLLM built from the runs' launch: ``engine.reach``)."""
    misses: list[Miss] = []
    exercised = Exercised()
    longest: dict[int, int] = {}
    for run in runs:
        for b in run.batches:
            batch = b.batch()
            why = why_not_producible(config, batch)
            if why is not None:
                misses.append(Miss(b, why))
            if not batch.has_prefill:
                longest[b.num_reqs] = max(longest.get(b.num_reqs, 0), batch.max_query_len)
        exercised = exercised + _exercised(config, run)
    return CrossCheck(tuple(misses), exercised, tuple(sorted(longest.items())))
