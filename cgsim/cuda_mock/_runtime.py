"""Streams, events and the device-level calls of the mocked torch.cuda surface.

There is one device and every stream executes synchronously on the host: the
stream objects exist so that capture code can create them, make them current and
wait on them, so that the one rule that depends on them holds (capturing on
the default stream is an error; is_current_stream_capturing() looks at the
current stream), and so that which stream a graph was captured on and which
stream each replay ran on can be told (``CUDAGraph.capture_stream``,
``take_replay_streams``).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from . import _errors, _memory

__all__ = [
    "CaptureRecord",
    "take_replay_streams",
    "Stream",
    "ExternalStream",
    "Event",
    "StreamContext",
    "stream",
    "current_stream",
    "default_stream",
    "set_stream",
    "reset_current_stream",
    "synchronize",
    "empty_cache",
    "empty_host_cache",
    "current_blas_handle",
    "is_available",
    "is_initialized",
    "init",
    "device_count",
    "current_device",
    "set_device",
    "device",
    "get_device_name",
    "get_device_capability",
    "get_device_properties",
    "DeviceProperties",
    "get_rng_state",
    "set_rng_state",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "reset_peak_memory_stats",
]

DEVICE_NAME = "cgsim mock GPU (CPU)"
TOTAL_MEMORY = 80 * 2**30


class CaptureRecord:
    """What the runtime knows about the capture under way (at most one per
    process, as with real graphs)."""

    __slots__ = ("graph", "stream", "invalidated", "host_depth")

    def __init__(self, graph: Any, stream: "Stream") -> None:
        self.graph = graph
        self.stream = stream
        self.invalidated = False
        self.host_depth = 0


class _State(threading.local):
    pass


class _Global:
    capture: CaptureRecord | None = None
    # The streams graph replays ran on, each once in the order first seen,
    # until taken (take_replay_streams): a replay runs on the stream current at replay().
    replay_streams: list["Stream"] = []
    # Which installation of the mock is current: each is one launch's device.
    installation: int = 0


G = _Global()
_tls = _State()
_stream_ids = itertools.count(1)


def take_replay_streams() -> tuple["Stream", ...]:
    """The streams graph replays ran on since the last call, each once, in
    the order first seen."""
    taken = tuple(G.replay_streams)
    G.replay_streams.clear()
    return taken


def capturing() -> CaptureRecord | None:
    return G.capture


def fail_if_capturing(what: str) -> None:
    """A synchronising call: illegal on a capturing stream; invalidates it."""
    cap = G.capture
    if cap is not None:
        cap.invalidated = True
        raise _errors.capture_unsupported_error(what)


class Stream:
    """A CUDA stream stand-in. Work on it runs immediately on the host."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        self = object.__new__(cls)
        self.device = torch.device("cuda", 0)
        self.priority = priority
        self.stream_id = next(_stream_ids)
        self.cuda_stream = self.stream_id
        return self

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<cgsim mock Stream id={self.stream_id}>"

    def wait_event(self, event: "Event") -> None:
        pass

    def wait_stream(self, stream: "Stream") -> None:
        pass

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        cap = G.capture
        if cap is not None and cap.stream is self:
            fail_if_capturing("Stream.synchronize()")

    def __enter__(self) -> None:
        self._ctx = StreamContext(self)
        self._ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


class ExternalStream(Stream):
    def __new__(cls, stream_ptr: int = 0, device: Any = None, **kwargs: Any) -> "ExternalStream":
        return super().__new__(cls)


_DEFAULT = Stream()
_DEFAULT.stream_id = 0
_DEFAULT.cuda_stream = 0


def current_stream(device: Any = None) -> Stream:
    return getattr(_tls, "stream", _DEFAULT)


def default_stream(device: Any = None) -> Stream:
    return _DEFAULT


def reset_current_stream() -> None:
    """The default stream current again on this thread, as in a fresh process."""
    _tls.stream = _DEFAULT


def set_stream(s: Stream | None) -> None:
    if s is not None:
        _tls.stream = s


class StreamContext:
    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream
        self.prev: Stream | None = None

    def __enter__(self) -> Stream | None:
        if self.stream is None:
            return None
        self.prev = current_stream()
        _tls.stream = self.stream
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None and self.prev is not None:
            _tls.stream = self.prev


def stream(s: Stream | None) -> StreamContext:
    return StreamContext(s)


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None
        self._recorded_in_capture = False

    def record(self, stream: Stream | None = None) -> None:
        self._t = time.perf_counter()
        self._recorded_in_capture = G.capture is not None

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if G.capture is not None:
            fail_if_capturing("Event.synchronize()")

    def elapsed_time(self, end_event: "Event") -> float:
        if self._t is None or end_event._t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._t - self._t) * 1000.0


def synchronize(device: Any = None) -> None:
    fail_if_capturing("torch.cuda.synchronize()")


def empty_cache() -> None:
    # Cached-but-free blocks of pools that graphs still use stay with their
    # pools (the real empty_cache does not release those either); pools no
    # graph uses any more are erased once nothing of theirs is alive.
    _memory.erase_freeable_pools()


def empty_host_cache() -> None:
    # torch.accelerator.empty_host_cache: the pinned-host allocator's cached
    # blocks, and the graph pools of its own that no graph uses any more.
    _memory.erase_host_pools()


def current_blas_handle() -> int:
    # No cuBLAS here: engines call this to create a stream's workspace before
    # a capture (on a GPU, a first matmul inside one would put it in the pool).
    return 0


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    pass


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def _index(d: Any) -> int:
    if d is None:
        return 0
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        d = torch.device(d)
    if isinstance(d, torch.device):
        return 0 if d.index is None else d.index
    raise TypeError(f"invalid device {d!r}")


def set_device(d: Any) -> None:
    i = _index(d)
    if i not in (0, -1):
        raise RuntimeError(f"cgsim mock has one device (index 0); set_device({d!r}) asked for {i}")


class device:
    """torch.cuda.device(idx) context manager (one device: a no-op)."""

    def __init__(self, device: Any) -> None:
        self.idx = _index(device)

    def __enter__(self) -> None:
        set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        pass


def get_device_name(device: Any = None) -> str:
    return DEVICE_NAME


def get_device_capability(device: Any = None) -> tuple[int, int]:
    return (9, 0)


@dataclass(frozen=True)
class DeviceProperties:
    """``torch.cuda.get_device_properties``'s answer for the mock device: an
    H100's shape (torch.compile's cache key and engines' kernel choices read
    it), its memory the mock's."""

    name: str = DEVICE_NAME
    major: int = 9
    minor: int = 0
    total_memory: int = TOTAL_MEMORY
    multi_processor_count: int = 132
    warp_size: int = 32
    max_threads_per_multi_processor: int = 2048
    max_threads_per_block: int = 1024
    regs_per_multiprocessor: int = 65536
    shared_memory_per_block: int = 49152
    shared_memory_per_block_optin: int = 232448
    shared_memory_per_multiprocessor: int = 233472
    L2_cache_size: int = 50 * 2**20
    is_integrated: bool = False
    is_multi_gpu_board: bool = False
    gcnArchName: str = "NVIDIA H100"
    uuid: str = "cgsim-mock-0"
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0


def get_device_properties(device: Any = None) -> DeviceProperties:
    return DeviceProperties()


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    # The mock device's tensors live on the CPU, so its generator is the CPU's
    # (torch.compile saves and restores it around every frame it converts).
    return torch.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    torch.set_rng_state(new_state)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    _, reserved = _memory.live_pool_bytes()
    return (TOTAL_MEMORY - reserved, TOTAL_MEMORY)


def memory_allocated(device: Any = None) -> int:
    return _memory.live_pool_bytes()[0]


def memory_reserved(device: Any = None) -> int:
    return _memory.live_pool_bytes()[1]


def max_memory_allocated(device: Any = None) -> int:
    return _memory.live_pool_bytes()[0]


def reset_peak_memory_stats(device: Any = None) -> None:
    pass
