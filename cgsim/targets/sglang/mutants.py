"""Bugs from sglang's history, put back into the installed sglang in-process.

Each mutant patches one sglang function for the duration of every call the
target makes into sglang (``unittest.mock.patch.object``; nothing on disk
changes) and names the pull request or issue where the bug was found and
fixed, and the property that finds it:

- ``nopad-raw-key``: with --disable-cuda-graph-padding, ``can_run_graph``
  looks the graph up by the raw batch size instead of the ShapeKey capture
  stored it under, so every batch, exactly captured sizes included, runs
  eagerly (sgl-project/sglang PR 30752, fixed by PR 31273 after the ShapeKey
  migration of PR 27857).  SGL-DISPATCH-ROUNDTRIP.
- ``dp-sum-tokens``: under DP attention ``can_run_graph`` compares the sum of
  the ranks' request counts with the largest captured bs, although graphs are
  per rank and replayed at the max over ranks, so DP groups silently leave
  graphs (issue 5527, PR 6092).  SGL-DISPATCH-COMPLETE.
- ``max-bs-not-captured``: the default bs ladder omits an off-stride
  --cuda-graph-max-bs, so the largest batches run eagerly (PR 21005, which
  added ``capture_bs.append(max_bs)``).  SGL-CAND-ORDER, SGL-CAND-BOUNDS.
- ``stale-out-cache-loc``: a padded decode replay leaves the padded rows'
  ``out_cache_loc`` as the previous, larger batch wrote them, so the padding
  tokens write their KV into slots of requests still running (sglang 0.5.23
  resets them: the decode buffer registry's ``out_cache_loc`` slot has
  ``PaddingPolicy.ZERO``, "padded rows must point at slot 0"; before the
  registry, ``replay_prepare`` did ``if bs != raw_bs: ... self.out_cache_loc.zero_()``;
  the SWA twin's reset beside it says why: "Padded SWA indices left over from
  a previous replay would point into real SWA slots, so set_kv_buffer on
  padded tokens would corrupt active requests' KV").  REPLAY-EQUALS-EAGER through the SGLang target's writable toy
  KV (``_kv``): a live request reads the overwritten slot in that step.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator
from unittest import mock

__all__ = ["SglangMutant", "MUTANTS"]


@dataclass(frozen=True)
class SglangMutant:
    name: str
    summary: str
    caught_by: str
    patch: Callable[[], ContextManager[None]]


def _decode_runner_cls():
    return importlib.import_module("sglang.srt.model_executor.runner.decode_cuda_graph_runner").DecodeCudaGraphRunner


@contextlib.contextmanager
def _nopad_raw_key() -> Iterator[None]:
    cls = _decode_runner_cls()
    original = cls.can_run_graph

    def can_run_graph(self, forward_batch):
        # The pre-fix lookup: a bare size where capture stored _make_graph_key(...).
        self._make_graph_key = lambda size, *args, **kwargs: size
        try:
            return original(self, forward_batch)
        finally:
            del self._make_graph_key

    with mock.patch.object(cls, "can_run_graph", can_run_graph):
        yield


@contextlib.contextmanager
def _dp_sum_tokens() -> Iterator[None]:
    cls = _decode_runner_cls()
    original = cls.can_run_graph

    def can_run_graph(self, forward_batch):
        # The pre-fix gate: every rank's requests together against max_bs.
        self._max_dp_batch_size = lambda fb: sum(fb.original_global_num_tokens_cpu)
        try:
            return original(self, forward_batch)
        finally:
            del self._max_dp_batch_size

    with mock.patch.object(cls, "can_run_graph", can_run_graph):
        yield


@contextlib.contextmanager
def _max_bs_not_captured() -> Iterator[None]:
    hook = importlib.import_module("sglang.srt.arg_groups.cuda_graph_hook")
    original = hook.generate_decode_cuda_graph_batch_sizes

    def generate(server_args, max_bs):
        # The pre-fix list: the ladder's steps up to max_bs, without max_bs
        # itself (4096 lies on every ladder, so nothing is appended there).
        return [bs for bs in original(server_args, 4096) if bs <= max_bs]

    with mock.patch.object(hook, "generate_decode_cuda_graph_batch_sizes", generate):
        yield


@contextlib.contextmanager
def _stale_out_cache_loc() -> Iterator[None]:
    registry = importlib.import_module("sglang.srt.model_executor.cuda_graph_buffer_registry")
    original = registry.GraphSlot.reset_padding

    def reset_padding(self, raw_n, padded_n):
        # The bug: out_cache_loc's padded tail is not reset (it keeps the last, larger batch's slots).
        if self.name == "out_cache_loc":
            return None
        return original(self, raw_n, padded_n)

    with mock.patch.object(registry.GraphSlot, "reset_padding", reset_padding):
        yield


MUTANTS: dict[str, SglangMutant] = {
    m.name: m
    for m in (
        SglangMutant("nopad-raw-key", "disable-padding lookup by the raw bs, not the ShapeKey (PR 30752/31273)",
                     "SGL-DISPATCH-ROUNDTRIP", _nopad_raw_key),
        SglangMutant("dp-sum-tokens", "DP attention can_run sums the ranks' requests (issue 5527, PR 6092)",
                     "SGL-DISPATCH-COMPLETE", _dp_sum_tokens),
        SglangMutant("max-bs-not-captured", "default bs ladder omits an off-stride max bs (PR 21005)",
                     "SGL-CAND-ORDER", _max_bs_not_captured),
        SglangMutant("stale-out-cache-loc", "padded decode rows keep the last batch's out_cache_loc (KV slots)",
                     "REPLAY-EQUALS-EAGER", _stale_out_cache_loc),
    )
}
