"""The batches vLLM's scheduler hands the model runner, as the V2 runner
reads them (``GPUModelRunner.gather_batch_req_state``): request order,
query lengths, draft lengths, which requests are still prefilling, whether
the batch may replay a decode graph, the active LoRA adapters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cgsim.descriptors import Batch

if TYPE_CHECKING:
    from cgsim.targets.vllm.compat import Capabilities

__all__ = ["ScheduledBatch", "RunnerView"]


@dataclass(frozen=True)
class ScheduledBatch:
    """One step's batch as the model runner receives it.

    ``draft_lens``: the drafts each request verifies this step (its query
    length is 1 + that for a decode).  ``prefilling``: whether the runner
    counts the request as prefilling (its computed tokens below its prefill
    length).  ``decode_graph_eligible``: the runner's flag that lets a batch
    replay a uniform decode graph; it is also true for a batch whose
    prefilling requests each compute one prompt token over a cached prefix.
    ``next_drafts``: how many drafts the runner proposes after this step for
    every request of it (the scheduler's ``num_spec_tokens_to_schedule``)."""

    step: int
    req_ids: tuple[str, ...]
    query_lens: tuple[int, ...]
    draft_lens: tuple[int, ...]
    prefilling: tuple[bool, ...]
    decode_graph_eligible: bool
    loras: tuple[int, ...]
    next_drafts: int
    num_ubatches: int = 1

    @property
    def has_prefill(self) -> bool:
        return any(self.prefilling)

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    def batch(self) -> Batch:
        """The batch as cgsim's dispatch sees it.  The runner dispatches a
        batch with a uniform count only where it is decode graph eligible,
        and with a max_query_len only where no request is prefilling: an
        eligible batch with one-token prefills is a cgsim decode where its
        lengths are uniform (its uniform count is what dispatch reads; only
        a varlen graph would see the max_query_len it lacks), else a cgsim
        prefill (neither count reaches dispatch)."""
        uniform = len(set(self.query_lens)) == 1
        decode = self.decode_graph_eligible and (uniform or not self.has_prefill)
        return Batch(self.query_lens, len(self.loras), self.num_ubatches, has_prefill=not decode)

    def to_json(self) -> dict:
        return {"step": self.step, "req_ids": list(self.req_ids), "query_lens": list(self.query_lens), "draft_lens": list(self.draft_lens),
                "prefilling": list(self.prefilling), "decode_graph_eligible": self.decode_graph_eligible,
                "loras": list(self.loras), "next_drafts": self.next_drafts, "num_ubatches": self.num_ubatches}


class RunnerView:
    """The request state the V2 runner keeps between steps, fed only from
    the scheduler's outputs (``add_requests`` / ``update_requests``): each
    request's prefill length (prompt, or all its tokens when it resumes
    after a preemption) and computed tokens."""

    def __init__(self, decode_query_len: int, caps: Capabilities):
        self.decode_query_len = decode_query_len
        # 0.32+ (gather_batch_req_state's prefill_runs_as_decode); before, any prefill bars decode graphs.
        self.one_token_prefill_as_decode = caps.one_token_prefill_as_decode
        self.prefill_len: dict[str, int] = {}
        self.lora: dict[str, int] = {}
        self._order = caps.order_requests  # the tree's runner's request order
        self.spec_tokens_to_schedule = caps.spec_tokens_to_schedule

    def receive(self, step: int, so: Any) -> ScheduledBatch | None:
        """What ``execute_model`` gathers for ``so`` (None: nothing scheduled)."""
        for rid in so.finished_req_ids:
            self.prefill_len.pop(rid, None)
            self.lora.pop(rid, None)
        computed: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            tokens = new.prefill_token_ids if new.prefill_token_ids is not None else new.prompt_token_ids
            self.prefill_len[new.req_id] = len(tokens)
            self.lora[new.req_id] = new.lora_request.lora_int_id if new.lora_request is not None else 0
            computed[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for rid, n in zip(cached.req_ids, cached.num_computed_tokens):
            computed[rid] = n
        tokens_per_req = so.num_scheduled_tokens
        if not tokens_per_req:
            return None
        drafts = so.scheduled_spec_decode_tokens
        order = self._order(tokens_per_req, drafts, self.decode_query_len)
        query = tuple(tokens_per_req[r] for r in order)
        draft = tuple(len(drafts.get(r, ())) for r in order)
        prefilling = tuple(min(computed[r], self.prefill_len[r]) < self.prefill_len[r] for r in order)
        # gather_batch_req_state: a prefilling request computing one prompt
        # token over existing context (placeholder drafts aside) runs as a decode.
        eligible = all(not p or (self.one_token_prefill_as_decode and q - d == 1 and computed[r] > 0)
                       for r, q, d, p in zip(order, query, draft, prefilling))
        loras = tuple(sorted({self.lora[r] for r in order} - {0}))
        next_drafts = int(so.num_spec_tokens_to_schedule if self.spec_tokens_to_schedule else self.decode_query_len - 1)
        return ScheduledBatch(step, tuple(order), query, draft, prefilling, eligible, loras, next_drafts)
