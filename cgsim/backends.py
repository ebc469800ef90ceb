"""Where graphs live: the CPU mock or real CUDA, behind one small interface.

Targets and the runner never branch on the backend's name: they allocate on
``backend.device``, call the graph API through ``backend.cuda`` inside
``backend.activate()``, and make host buffers with ``backend.host_buffer``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

import torch

__all__ = ["BACKENDS", "BackendUnavailable", "GraphBackend", "get_backend"]

BACKENDS = ("mock", "cuda")


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run on this machine."""


@dataclass(frozen=True)
class GraphBackend:
    """One place graphs can live.

    name: "mock" | "cuda".
    device: where "device" tensors go (cpu for the mock, cuda for cuda).
    cuda: the torch.cuda surface to call (CUDAGraph, graph, graph_pool_handle,
        is_current_stream_capturing, synchronize, Stream, stream, ...). For the
        mock this is torch.cuda itself: read it inside activate().
    """

    name: str
    device: torch.device
    cuda: Any
    _activate: Callable[[], ContextManager[None]]
    _host_buffer: Callable[[torch.Tensor, bool], torch.Tensor]
    _host_ops: Callable[[], ContextManager[None]]
    _take_replay_streams: Callable[[], tuple[Any, ...]]
    # Whether a failed capture may leave the process unable to capture again
    # (the campaign worker then restarts).  On a GPU it may: an invalidated
    # capture can leave a sticky error in the CUDA context that no API reports
    # as recovered.  The mock cannot: leaving activate() aborts a capture nobody
    # ended (cuda_mock's uninstall), so the next scenario starts clean.
    capture_failure_poisons: bool = False
    # Graph memory as the backend accounts it (the mock does; a GPU's caching
    # allocator is not asked): the graph under capture, whose ``memory`` says
    # what its capture took so far, and a pool's bytes.  None: not accounted.
    capturing_graph: Callable[[], Any] | None = None
    pool_memory: Callable[[Any], Any] | None = None

    def activate(self) -> ContextManager[None]:
        """Context in which ``torch.cuda`` is this backend (mock: patched in)."""
        return self._activate()

    def host_buffer(self, t: torch.Tensor, pinned: bool) -> torch.Tensor:
        """A host (CPU) buffer with ``t``'s contents, pinned or pageable. Use the
        return value: the cuda backend pins by copying."""
        return self._host_buffer(t, pinned)

    def host_ops(self) -> ContextManager[None]:
        """Context whose ops are host (CPU) work even inside a capture; the mock
        needs to be told, a GPU knows from the tensors' device."""
        return self._host_ops()

    def take_replay_streams(self) -> tuple[Any, ...]:
        """The streams graph replays ran on since the last call, each once in
        the order first seen (inside activate())."""
        return self._take_replay_streams()

    def __repr__(self) -> str:
        return f"GraphBackend({self.name!r}, device={self.device})"


def _mock() -> GraphBackend:
    from . import cuda_mock

    return GraphBackend(
        name="mock",
        device=torch.device("cpu"),
        cuda=torch.cuda,
        _activate=cuda_mock.patched_torch_cuda,
        _host_buffer=cuda_mock.host_buffer,
        _host_ops=cuda_mock.host_ops,
        capturing_graph=cuda_mock.capturing_graph,
        pool_memory=cuda_mock.pool_memory,
        _take_replay_streams=cuda_mock.take_replay_streams,
    )


def _cuda_host_buffer(t: torch.Tensor, pinned: bool) -> torch.Tensor:
    t = t.cpu()
    return t.pin_memory() if pinned else t


_CUDA_REPLAY_STREAMS: list[Any] = []
_cuda_tap_depth = 0


@contextlib.contextmanager
def _cuda_replay_tap() -> Iterator[None]:
    # torch.cuda.CUDAGraph keeps no record of the stream a replay ran on: the
    # tap notes torch.cuda.current_stream() and replays, nothing else.  Only
    # the outermost block installs it, as the mock's patch.
    global _cuda_tap_depth
    graph_cls = torch.cuda.CUDAGraph
    if _cuda_tap_depth:
        _cuda_tap_depth += 1
        try:
            yield
        finally:
            _cuda_tap_depth -= 1
        return
    own = graph_cls.__dict__.get("replay")
    replay = graph_cls.replay

    def noted_replay(graph: Any) -> None:
        stream = torch.cuda.current_stream()
        if stream not in _CUDA_REPLAY_STREAMS:  # each stream once until taken: replays add nothing
            _CUDA_REPLAY_STREAMS.append(stream)
        replay(graph)

    graph_cls.replay = noted_replay
    _cuda_tap_depth = 1
    try:
        yield
    finally:
        _cuda_tap_depth = 0
        if own is None:
            del graph_cls.replay
        else:
            graph_cls.replay = own
        _CUDA_REPLAY_STREAMS.clear()


def _cuda_take_replay_streams() -> tuple[Any, ...]:
    taken = tuple(_CUDA_REPLAY_STREAMS)
    _CUDA_REPLAY_STREAMS.clear()
    return taken


def _cuda() -> GraphBackend:
    from .cuda_mock import is_patched

    if is_patched():
        raise BackendUnavailable(
            "backend 'cuda' was requested while the cgsim CPU mock is installed into "
            "torch.cuda (inside cuda_mock.patched_torch_cuda()), so torch.cuda is not the "
            "real device. Ask for the cuda backend outside the mock's activate() block, "
            "or use the mock backend (--backend mock / --cgsim-backend=mock)."
        )
    if not torch.cuda.is_available():
        raise BackendUnavailable(
            "backend 'cuda' was requested, but torch.cuda.is_available() is False on this "
            f"machine (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). "
            "Run on a machine with an NVIDIA GPU and a CUDA build of torch, or use "
            "the mock backend (--backend mock, or --cgsim-backend=mock under pytest: the CPU mock of the CUDA graph API)."
        )
    return GraphBackend(
        name="cuda",
        device=torch.device("cuda", torch.cuda.current_device()),
        cuda=torch.cuda,
        _activate=_cuda_replay_tap,
        _host_buffer=_cuda_host_buffer,
        _host_ops=contextlib.nullcontext,
        _take_replay_streams=_cuda_take_replay_streams,
        capture_failure_poisons=True,
    )


def get_backend(name: str) -> GraphBackend:
    """The backend called ``name`` ("mock" or "cuda").

    Raises ValueError for an unknown name and BackendUnavailable for "cuda" on a
    machine without a usable GPU (never a silent fallback to the mock).
    """
    if name == "mock":
        return _mock()
    if name == "cuda":
        return _cuda()
    raise ValueError(f"unknown graph backend {name!r}; choose one of {', '.join(BACKENDS)}")
