"""One-line bugs put into sglang's own runner modules as they are imported.

What an engineer's change to sglang's graph runners looks like to cgsim,
without writing into the tree: ``CGSIM_SGLANG_MUTATIONS`` (JSON: a list of
{"module", "old", "new"}, or the name of a mutation of ``MUTATIONS``) names
lines of sglang modules and what they become, and a ``sys.meta_path`` finder
in front of the import system loads each named module from its own file
with the line replaced (``cgsim.targets.engine_mutation``).  A name no mutation
has is a broken environment (exit 2), as is a line that does not apply.

``MUTATIONS`` is the table ``benchmarks/bench_sglang.py --runner-mutations``
measures: one-line bugs across padding, buffer filling, replay inputs,
output slicing, warmup, LoRA, DP attention and the batch-size alignment
(two-batch overlap, attention TP), each in sglang 0.5.23's code.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from cgsim.targets import engine_mutation as _shared
from cgsim.targets.engine_mutation import Mutation
from cgsim.targets.sglang.errors import SglangEnvironmentError

__all__ = ["MUTATIONS_ENV", "Mutation", "MUTATIONS", "MutationError", "environment_for", "install_from_environment",
           "parse"]

MUTATIONS_ENV = "CGSIM_SGLANG_MUTATIONS"
RUNNER = "sglang.srt.model_executor.runner."
DECODE = RUNNER + "decode_cuda_graph_runner"
PREFILL = RUNNER + "prefill_cuda_graph_runner"
BASE = RUNNER + "base_cuda_graph_runner"
FULL = "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend"
REGISTRY = "sglang.srt.model_executor.cuda_graph_buffer_registry"
EAGLE_DRAFT = "sglang.srt.speculative.eagle_draft_cuda_graph_runner"
EAGLE_DRAFT_EXTEND = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(BASE, "        index = bisect.bisect_left(buckets, raw_size)",
             "        index = min(bisect.bisect_right(buckets, raw_size), len(buckets) - 1)",
             "pad-past-exact", "padding", "a batch of exactly a captured size pads to the next larger bucket"),
    Mutation(DECODE, "            else cuda_graph_bs <= self.max_bs",
             "            else cuda_graph_bs < self.max_bs",
             "largest-bs-eager", "padding", "a decode batch of the largest captured bs runs eagerly"),
    Mutation(DECODE, "            padded_num_tokens = bs * self.captured_req_width",
             "            padded_num_tokens = raw_bs * self.captured_req_width",
             "replay-tokens-unpadded", "padding", "a padded decode replay fills buffers and metadata for the raw "
             "token count, not the graph's"),
    Mutation(PREFILL, "        if padded_num_tokens > num_tokens * _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR:",
             "        if padded_num_tokens > num_tokens:",
             "prefill-exact-only", "padding", "a prefill batch replays only a bucket of exactly its tokens"),
    Mutation(PREFILL, "        if self._is_full_backend and batch_size > self._capture_req_slots:",
             "        if False:",
             "prefill-slots-unchecked", "padding", "a FULL prefill graph replays more requests than its slots"),
    Mutation(DECODE, "            raw_num_tokens=raw_num_token,",
             "            raw_num_tokens=0,",
             "fill-no-tokens", "buffer filling", "the replay copies none of the batch's per-token inputs into "
             "the graph's buffers"),
    Mutation(DECODE, "            raw_bs=raw_bs,\n            padded_bs=bs,\n            raw_num_tokens=raw_num_token,",
             "            raw_bs=0,\n            padded_bs=bs,\n            raw_num_tokens=raw_num_token,",
             "fill-no-requests", "buffer filling", "the replay copies none of the batch's per-request inputs "
             "(sequence lengths, request slots) into the graph's buffers"),
    Mutation(DECODE, "        self._init_replay_attn_metadata(\n            forward_batch,\n            raw_bs=raw_bs,",
             "        0 and self._init_replay_attn_metadata(\n            forward_batch,\n            raw_bs=raw_bs,",
             "replay-metadata-skipped", "replay inputs", "a decode replay runs on the attention metadata of the "
             "previous replay or the capture"),
    Mutation(DECODE, "            bs=bs,\n            num_tokens=padded_num_tokens,\n            glue_key=glue_key,",
             "            bs=raw_bs,\n            num_tokens=padded_num_tokens,\n            glue_key=glue_key,",
             "replay-metadata-raw-bs", "replay inputs", "the replay's attention metadata is prepared for the "
             "batch's requests, not the graph's padded ones"),
    Mutation(DECODE, "                hidden_states=(\n                    output.hidden_states[: self.raw_num_token]",
             "                hidden_states=(\n                    output.hidden_states[: self.bs * self.captured_req_width]",
             "hidden-rows-padded", "output slicing", "a decode replay hands back the graph's padded hidden-state "
             "rows"),
    Mutation(DECODE, "                    output.next_token_logits[: self.raw_num_token]",
             "                    output.next_token_logits",
             "logits-rows-padded", "output slicing", "a decode replay hands back the graph's padded logits rows"),
    Mutation(FULL, "        for warmup_step in range(2):",
             "        for warmup_step in range(0):",
             "no-warmup", "warmup", "graphs are captured without a warmup run"),
    Mutation(DECODE, '            return "lora"\n        return "nolora"',
             '            return "nolora"\n        return "nolora"',
             "lora-batch-on-base-graph", "LoRA", "a batch with an active adapter replays the base-only graph"),
    Mutation(DECODE, '        lora_variants = ("lora", "nolora") if self.record_nolora_graph else (None,)',
             '        lora_variants = ("nolora", "lora") if self.record_nolora_graph else (None,)',
             "nolora-captured-first", "LoRA", "the base-only graph of each bs is captured before its LoRA graph"),
    Mutation(DECODE, "        return max(request_counts)",
             "        return request_counts[0]",
             "dp-own-count", "DP", "under DP attention each rank pads to its own request count, not the "
             "group's largest"),
    Mutation(DECODE, "            cuda_graph_bs = self._max_dp_batch_size(forward_batch)",
             "            cuda_graph_bs = sum(forward_batch.original_global_num_tokens_cpu)",
             "dp-gate-sums", "DP", "under DP attention can_run_graph weighs the ranks' summed requests against the "
             "largest graph"),
    Mutation(BASE, "        alignment_width = 1",
             "        alignment_width = captured_req_width",
             "tbo-aligns-tokens", "alignment", "under two-batch overlap the bs list is aligned by tokens per "
             "request, dropping sizes the split could run"),
    Mutation(BASE, "    num_max_requests = ceil_align(num_max_requests, mul_base)",
             "    num_max_requests = num_max_requests",
             "pool-not-aligned", "alignment", "the request pool is not rounded up to the alignment, so the "
             "largest aligned bs is lost"),
    Mutation(BASE, "    capture_bs = [bs for bs in capture_bs if bs * alignment_width % mul_base == 0]",
             "    capture_bs = [bs for bs in capture_bs if bs * alignment_width % 1 == 0]",
             "unaligned-bs-kept", "alignment", "bs values the attention-TP / two-batch-overlap alignment rules out "
             "are captured"),
    Mutation(EAGLE_DRAFT, "            buffers.hidden_states[:raw_bs].copy_(forward_batch.spec_info.hidden_states)",
             "            pass",
             "draft-hidden-not-filled", "EAGLE draft", "an EAGLE draft decode replay does not copy the requests' "
             "hidden states into the graph's buffer (it drafts from the capture's or the previous batch's)"),
    Mutation(EAGLE_DRAFT_EXTEND, "        copy_srcs.append(select_index)",
             "        copy_srcs.append(buffers.select_index[:raw_bs])",
             "draft-extend-select-stale", "EAGLE draft", "an EAGLE draft extend replay keeps the graph's rows to "
             "keep from the capture or the previous batch, not the requests' accepted tokens"),
)
BY_NAME = {m.name: m for m in MUTATIONS}


class MutationError(SglangEnvironmentError):
    """A mutation does not apply to the module it names: exit 2."""


def environment_for(mutations: Sequence[Mutation]) -> dict[str, str]:
    """The environment that puts ``mutations`` into a job's processes."""
    return _shared.environment_for(MUTATIONS_ENV, mutations)


def parse(text: str) -> tuple[Mutation, ...]:
    """CGSIM_SGLANG_MUTATIONS: a JSON list of {module, old, new[, name]} or of names."""
    try:
        data = json.loads(text)
        if not isinstance(data, list):
            raise TypeError("not a list")
        out = []
        for item in data:
            if isinstance(item, str):
                if item not in BY_NAME:
                    raise MutationError(f"{MUTATIONS_ENV}: no mutation is named {item!r}; the table has "
                                        f"{', '.join(BY_NAME)}")
                out.append(BY_NAME[item])
            else:
                out.append(Mutation.from_json(item))
        return tuple(out)
    except MutationError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise MutationError(f"{MUTATIONS_ENV} is not a JSON list of mutation names or {{module, old, new}} objects "
                            f"({exc}); e.g. '[\"no-warmup\"]'") from None


def install_from_environment() -> tuple[Mutation, ...]:
    """Put the mutations CGSIM_SGLANG_MUTATIONS names in front of the import
    system (once per process; before sglang's runners are imported)."""
    text = os.environ.get(MUTATIONS_ENV)
    if not text or _shared.installed(MUTATIONS_ENV):
        return ()
    mutations = parse(text)
    _shared.install(MUTATIONS_ENV, mutations, MutationError)
    return mutations
