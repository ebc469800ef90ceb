"""A CPU mock of the torch.cuda graph API, faithful to SPEC §5.

``patched_torch_cuda()`` installs it into ``torch.cuda`` so that capture code
written for GPUs (vLLM's CudaGraphManager, ``torch.cuda.make_graphed_callables``)
runs unchanged on CPU. Inside, ordinary CPU tensors play device memory and
``host_buffer(t, pinned)`` marks a CPU tensor as host memory.

What it reproduces (every row of the SPEC §5 fidelity table): capture runs no
computation; replay re-runs what was recorded against the captured memory (static
inputs and in-place updates read live, Python scalars frozen, rebound names
stale, outputs in the same memory every replay, views alias as in eager); graph
memory pools, shared pools, a pool's lifetime once its graphs are gone (the
device allocator's and, from torch 2.11, the pinned-host allocator's, which
only torch.accelerator.empty_host_cache erases), and the overwrite hazard
when a later capture takes a block an earlier graph still writes; the two classes of illegal operation with
the real exception types and messages (synchronising / data-dependent ops
invalidate the capture; pageable host copies raise and leave it valid); random
ops drawing new numbers at each replay; the reset / double capture / replay
without capture errors; is_current_stream_capturing.

Graph memory is accounted as plain frozen values: ``CUDAGraph.memory`` (a
``GraphMemory``: the bytes of the blocks its capture was handed in its pool,
and by how much its capture grew that pool), ``pool_memory(pool_id)`` (a
``PoolMemory``: the bytes a pool reserves and has in use) and
``capturing_graph()`` (the graph under capture, so that code running inside
a capture can measure its own share).  Bytes are the mock's blocks (rounded
to 512 bytes, reused best-fit, see below), so they compare one capture with
another, not with a GPU's numbers.  A custom operator
(``torch.library``) is recorded whole, as one kernel: replay runs it again
on the captured memory, as a GPU relaunches a custom kernel (cgsim's toy
model is built from such operators, so a capture of it is a handful of ops).
A Triton kernel launched under Triton's interpreter (``TRITON_INTERPRET=1``,
which runs kernels on CPU tensors behind the dispatcher) is recorded too: not
run at capture, run at each replay on the tensors it was given.

Where it is deliberately stricter than a GPU: memory a capture produced holds
poison until the first replay (NaN for floating types, True for bool, bytes
0xA5 for integers), where a GPU shows whatever the fresh pool memory held
(measured: zeros). A capture-logic bug that reads un-replayed output is then loud
instead of silently reading zeros.

What a CPU mock cannot show, and this one does not pretend to:

* asynchrony and races: every op runs to completion, in program order, so a
  missing stream wait or event, or a host buffer overwritten before an async copy
  read it, goes unnoticed;
* several streams: work is not ordered per stream and cross-stream
  dependencies (wait_stream, events) are not checked, inside a capture or out,
  and work from other threads during a capture is neither captured nor
  rejected.  What streams do carry is identity: capturing on the default
  stream raises, is_current_stream_capturing looks at the current stream, a
  graph keeps the stream it was captured on (``CUDAGraph.capture_stream``) and
  each replay notes the stream current at ``replay()``
  (``take_replay_streams``), so a graph captured on another stream than its
  warm-up ran on, or replayed on another stream than the step's, shows as
  plain data; whether the missing wait would have raced it cannot;
* lazy library initialisation during capture (cuBLAS/cuDNN handles, workspace
  allocation, Triton autotuning) that fails only on a first call inside a
  capture; a stream's first matmul inside a capture also puts its cuBLAS
  workspaces (32 MiB + 1 MiB on an H200) into the graph pool, where they keep
  the pool alive for good;
* kernels that bypass PyTorch's dispatcher (custom CUDA extensions called
  directly, compiled Triton kernels, DLPack): the mock sees and records only
  aten ops, custom operators and interpreted Triton launches;
* the caching allocator's exact choices: block sizes are rounded to 512 bytes
  and reused best-fit within a pool, without splitting, so *whether* a later
  capture takes a particular freed block can differ from a GPU (the hazard itself
  is modelled);
* a graph keeps the memory of the tensors it reads alive, where a real graph
  would read freed (and possibly reused) memory after the caller dropped them;
* which CPU tensors are "host": only those marked (host_buffer, pin_memory(),
  a factory given pin_memory=True inside pinned_host_factories(), .cpu(),
  torch.tensor(...) built during a capture, results of ops on host tensors,
  ops under host_ops()). Any other CPU tensor is device memory, so a
  CPU tensor made outside a capture without marking it (torch.from_numpy,
  torch.tensor) and copied to the device inside a capture is a silent
  device-to-device copy here where a GPU raises the pageable-copy error.
  Outside a capture nothing is checked.
"""

from ._capture import (
    CUDAGraph,
    capturing_graph,
    graph,
    graph_pool_handle,
    host_ops,
    is_current_stream_capturing,
    replay_state,
)
from ._errors import (
    ALREADY_CAPTURED,
    CAPTURE_INVALIDATED,
    CAPTURE_UNSUPPORTED,
    CUDA_ERROR_TYPE,
    HOST_COPY,
    REPLAY_WITHOUT_CAPTURE,
)
from ._memory import GraphMemory, PoolMemory, host_buffer, poison_value, pool_memory
from ._patch import is_patched, patched_torch_cuda
from ._pinned import pinned_host_factories
from ._runtime import (
    DEVICE_NAME,
    Event,
    Stream,
    current_device,
    current_stream,
    default_stream,
    device_count,
    empty_cache,
    empty_host_cache,
    get_device_capability,
    is_available,
    set_device,
    stream,
    synchronize,
    take_replay_streams,
)

__all__ = [
    "patched_torch_cuda",
    "is_patched",
    "host_buffer",
    "pinned_host_factories",
    "host_ops",
    "replay_state",
    "poison_value",
    "CUDAGraph",
    "graph",
    "graph_pool_handle",
    "capturing_graph",
    "GraphMemory",
    "PoolMemory",
    "pool_memory",
    "is_current_stream_capturing",
    "synchronize",
    "take_replay_streams",
    "Stream",
    "Event",
    "current_stream",
    "default_stream",
    "stream",
    "empty_cache",
    "empty_host_cache",
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "get_device_capability",
    "DEVICE_NAME",
    "CUDA_ERROR_TYPE",
    "CAPTURE_UNSUPPORTED",
    "CAPTURE_INVALIDATED",
    "HOST_COPY",
    "REPLAY_WITHOUT_CAPTURE",
    "ALREADY_CAPTURED",
]
