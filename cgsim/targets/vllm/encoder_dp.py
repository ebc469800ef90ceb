"""vLLM's encoder manager data-parallel over the tensor-parallel ranks
(``mm_encoder_tp_mode="data"``, ``tensor_parallel_size`` > 1): one manager
per rank, each run on its own thread, and the three collectives
``v1/worker/encoder_cudagraph.py`` calls (``get_tensor_model_parallel_rank``,
``..._world_size``, ``tensor_model_parallel_all_gather``) answered by a fake
group in this process.  Ranks run one at a time (a lock held except while a
rank waits in all_gather), so a run is deterministic."""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator

import torch

from cgsim.encoder.runner import ASKS_CAPTURED, CallSite, manager_captured
from cgsim.encoder.trace import PlanRead

__all__ = ["FakeGroup", "GroupAborted", "DataParallelEncoder"]


class GroupAborted(Exception):
    """Another rank raised before the collective: this rank's wait ends (a real group would hang)."""


class FakeGroup:
    """A tensor-parallel group of ``size`` ranks played by threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.turn = threading.Lock()
        self._local = threading.local()
        self._cond = threading.Condition()
        self._posted: dict[int, torch.Tensor] = {}
        self._results: dict[int, torch.Tensor] = {}
        self._round = 0
        self._aborted = False

    def abort(self) -> None:
        """A rank failed: every rank waiting in a collective stops waiting."""
        with self._cond:
            self._aborted = True
            self._cond.notify_all()

    def rank(self) -> int:
        return getattr(self._local, "rank", 0)

    def set_rank(self, rank: int) -> None:
        self._local.rank = rank

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim`` in rank order (as vLLM's all_gather).
        Called holding ``turn``; a rank that is not the last gives it up while it waits."""
        with self._cond:
            if self._aborted:
                raise GroupAborted()
            my_round = self._round
            self._posted[self.rank()] = tensor.clone()
            if len(self._posted) == self.size:
                self._results[my_round] = torch.cat([self._posted[r] for r in range(self.size)], dim=dim)
                self._posted = {}
                self._round += 1
                self._cond.notify_all()
                return self._results[my_round]
        self.turn.release()
        try:
            with self._cond:
                self._cond.wait_for(lambda: self._round != my_round or self._aborted)
                if self._round == my_round:
                    raise GroupAborted()
                return self._results[my_round]
        finally:
            self.turn.acquire()


@contextlib.contextmanager
def _collectives(group: FakeGroup) -> Iterator[None]:
    mod = importlib.import_module("vllm.v1.worker.encoder_cudagraph")
    names = {"get_tensor_model_parallel_rank": group.rank,
             "get_tensor_model_parallel_world_size": lambda: group.size,
             "tensor_model_parallel_all_gather": group.all_gather}
    saved = {n: getattr(mod, n) for n in names}
    for n, fn in names.items():
        setattr(mod, n, fn)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(mod, n, fn)


@dataclass
class DataParallelEncoder:
    """The ranks' managers as one handle: capture on every rank, encode on
    every rank at once (each returns the gathered batch; rank 0's is the
    result, and a rank whose result differs is reported as an error).  The
    runner holds and calls every rank's manager as ``call_site`` says
    (cgsim.encoder.runner.CallSite); ``rebuild`` makes fresh ranks' managers."""

    managers: list
    model: Any  # one toy shared by the ranks: its log is every rank's, in the order they ran
    backend: Any
    engine_context: Callable[[], ContextManager] = contextlib.nullcontext
    capture_context: Callable[[], ContextManager] = contextlib.nullcontext
    call_site: CallSite = ASKS_CAPTURED
    rebuild: Callable[[], list] | None = None
    held: bool = field(init=False)
    cleared: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.held = not self.call_site.held_from_capture

    def plan(self) -> PlanRead:
        m = self.managers[0]
        return PlanRead(tuple(m.token_budgets), int(m.max_batch_size), int(m.max_frames_per_batch))

    def capture(self) -> None:
        if self.cleared and self.call_site.held_from_capture and self.rebuild is not None:
            with self.backend.activate():
                self.managers = self.rebuild()
            self.cleared = False
        self.held = True
        with self.backend.activate(), self.engine_context(), self.capture_context():
            for rank, m in enumerate(self.managers):
                self.model.log.append(("rank", rank))  # the runner records each rank's capture on its own
                m.capture(graph_pool=self.backend.cuda.graph_pool_handle())

    def is_captured(self) -> bool:
        return self.held and all(manager_captured(m) for m in self.managers)

    def clear(self) -> None:
        with self.backend.activate():
            for m in self.managers:
                m.clear()
        self.cleared = True
        if self.call_site.held_from_capture:
            self.held = False

    def encode(self, mm_kwargs: dict) -> list[torch.Tensor]:
        if not all(self.call_site.hands_batch(self.held, m, self.model, mm_kwargs) for m in self.managers):
            return list(self.model.embed_multimodal(**mm_kwargs))  # the runner's call site: eager through the model
        group = FakeGroup(len(self.managers))
        results: dict[int, Any] = {}

        def run(rank: int) -> None:
            group.set_rank(rank)
            with group.turn:
                self.model.log.append(("rank", rank))  # what the toy logs next is this rank's
                try:
                    results[rank] = self.managers[rank].execute(mm_kwargs)
                except BaseException as exc:  # noqa: BLE001 - carried to the caller's thread
                    results[rank] = exc
                    group.abort()

        with self.backend.activate(), self.engine_context(), _collectives(group):
            threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(group.size)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
        failures = [results[r] for r in range(group.size)
                    if isinstance(results.get(r), BaseException) and not isinstance(results[r], GroupAborted)]
        if failures:
            raise failures[0]  # the rank that failed first in rank order; the others only stopped waiting
        for rank in range(group.size):
            if rank not in results:
                raise RuntimeError(f"rank {rank} of {group.size} never finished its encoder step (a collective hang)")
        first = results[0]
        for rank in range(1, group.size):
            if len(results[rank]) != len(first) or any(not torch.equal(a, b) for a, b in zip(results[rank], first)):
                raise RuntimeError(f"rank {rank} gathered other outputs than rank 0")
        return list(first)
