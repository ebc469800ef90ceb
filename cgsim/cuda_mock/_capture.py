"""Capture and replay: the mock CUDAGraph, the ``graph`` context and the
dispatch mode that records a capture.

A real capture enqueues no work: kernels are written into the graph and run only
at replay, against the memory addresses they saw at capture. The mock keeps to
that by recording every aten call made while capturing (below autograd, through a
TorchDispatchMode) instead of running it:

* view ops run for real (aliasing is metadata, and a real capture computes it on
  the host too);
* functional ops get outputs of the right shape, dtype and strides from the
  graph's pool, filled with poison (see _memory.poison_value) so that reading an
  output before the first replay is loud; at replay their results land in those
  same bytes;
* mutating ops (in-place, ``out=``, copies) are recorded and not applied;
* data-dependent ops and synchronising calls fail as on the device and invalidate
  the capture.

The graph keeps aliases of the tensors it read and wrote (same bytes, its own
tensor objects), never the caller's objects, for the reasons a real graph holds
raw pointers: rebinding a Python name after capture is invisible to replay, while
in-place updates are seen; and a caller dropping its last reference to a pool
tensor frees the block for later captures in the pool.

One module: the recording mode, the graph object and its replay share the
format of a recorded op and the invariants above.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, ContextManager, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _errors, _memory, _runtime, _triton
from ._runtime import G

__all__ = [
    "CUDAGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "host_ops",
    "replay_state",
]

aten = torch.ops.aten
Tensor = torch.Tensor

_VIEW, _META, _MUTATE, _FUNCTIONAL, _ALLOC = range(5)

# Allocation without a kernel: a real capture records nothing for these.
_ALLOC_ONLY = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.empty_permuted.default,
}
_INDEX_PUT = {aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


class _OpInfo:
    __slots__ = (
        "kind", "illegal", "seeded", "ret_alias", "out_op", "out_names", "has_device", "schema_args", "decompose",
    )

    def __init__(self, func: torch._ops.OpOverload) -> None:
        schema = func._schema
        tags = func.tags
        self.schema_args = [a.name for a in schema.arguments]
        self.has_device = "device" in self.schema_args
        self.seeded = torch.Tag.nondeterministic_seeded in tags
        self.illegal = (
            torch.Tag.data_dependent_output in tags
            or torch.Tag.dynamic_output_shape in tags
            or func in _INDEX_PUT
        )
        self.ret_alias: list[int | None] = []
        self.out_op = None
        self.out_names: list[str] = []
        # Composite ops reach the mode whole where autograd is off (inference
        # mode). Record what they decompose into, as a GPU would run it:
        # `to`/`reshape`/`contiguous` may alias or copy, and a composite can hide
        # a synchronising op.
        name = func.name()
        self.decompose = torch._C._dispatch_has_kernel_for_dispatch_key(
            name, torch._C.DispatchKey.CompositeImplicitAutograd
        ) and not torch._C._dispatch_has_kernel_for_dispatch_key(name, torch._C.DispatchKey.CPU)
        if name.endswith("::weak_ref_tensor"):
            # vLLM's weak_ref_tensor: a non-owning alias of its input, made on
            # the host (used on graph outputs so their blocks can be reused).
            self.kind = _VIEW
            self.decompose = False
        elif torch.Tag.inplace_view in tags:
            # set_, resize_, t_, ...: metadata changes, done on the host at capture.
            self.kind = _META
        elif func.is_view:
            self.kind = _VIEW
        elif func in _ALLOC_ONLY:
            self.kind = _ALLOC
        elif schema.is_mutable:
            self.kind = _MUTATE
            for r in schema.returns:
                idx = None
                if r.alias_info is not None and r.alias_info.is_write:
                    for i, a in enumerate(schema.arguments):
                        if a.alias_info is not None and a.alias_info.before_set == r.alias_info.before_set:
                            idx = i
                            break
                self.ret_alias.append(idx)
        else:
            self.kind = _FUNCTIONAL
            self._find_out(func)

    def _find_out(self, func: torch._ops.OpOverload) -> None:
        # Replay through the op's out= overload when it has one with the same
        # inputs: results go straight into the captured outputs, no copy.
        want = [(a.name, str(a.type)) for a in func._schema.arguments]
        nret = len(func._schema.returns)
        if not all(str(r.type) == "Tensor" for r in func._schema.returns):
            return
        packet = func.overloadpacket
        for name in packet.overloads():
            ov = getattr(packet, name)
            args = ov._schema.arguments
            outs = [a.name for a in args if a.is_out]
            if len(outs) != nret or not outs:
                continue
            if [(a.name, str(a.type)) for a in args if not a.is_out] == want:
                self.out_op = ov._op
                self.out_names = outs
                return

    def is_illegal(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
        if func is aten.index.Tensor:
            # Integer indexing has a static output shape; a boolean mask goes
            # through nonzero, which synchronises.
            return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])
        if func is aten.repeat_interleave.Tensor:
            return kwargs.get("output_size") is None
        if func in _INDEX_PUT:
            return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])
        return self.illegal


_infos: dict[Any, _OpInfo] = {}


def _info(func: torch._ops.OpOverload) -> _OpInfo:
    info = _infos.get(func)
    if info is None:
        info = _infos[func] = _OpInfo(func)
    return info


# ----------------------------------------------------------- output inference

# (func, argument signature) -> output layout; what makes a second capture of
# the same shapes cheap.
_layouts: dict[Any, Any] = {}


def _sig(x: Any) -> Any:
    if isinstance(x, Tensor):
        return (x.dtype, x.shape, x.stride())
    if isinstance(x, (list, tuple)):
        return tuple(_sig(i) for i in x)
    return x


def _args_sig(args: tuple) -> tuple:
    # _sig(args) without the recursion for the common flat case.
    out = []
    for a in args:
        if isinstance(a, Tensor):
            out.append((a.dtype, a.shape, a.stride()))
        elif isinstance(a, (list, tuple)):
            out.append(_sig(a))
        else:
            out.append(a)
    return tuple(out)


def _layout(x: Any) -> Any:
    if isinstance(x, Tensor):
        return (tuple(x.shape), x.stride(), x.dtype, _memory.extent_bytes(x.shape, x.stride(), x.dtype))
    if isinstance(x, (list, tuple)):
        return [_layout(i) for i in x]
    return ("value", x)


def _to_meta(x: Any) -> Any:
    if isinstance(x, Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(i) for i in x)
    return x


def _infer(func: torch._ops.OpOverload, info: _OpInfo, args: tuple, kwargs: dict) -> Any:
    try:
        key = (func, _args_sig(args), _sig(tuple(kwargs.items())) if kwargs else ())
        hash(key)
    except TypeError:
        key = None
    if key is not None:
        layout = _layouts.get(key)
        if layout is not None:
            return layout
    result = None
    if not info.seeded:
        # Running the op on the host is the cheapest exact shape oracle (meta
        # kernels go through Python refs, ~1 ms each). Inputs may hold poison,
        # which some kernels reject (indices out of range): then use meta.
        try:
            result = func(*args, **kwargs)
        except Exception:
            result = None
    if result is None:
        margs = _to_meta(args)
        mkwargs = {k: _to_meta(v) for k, v in kwargs.items()}
        if info.has_device:
            mkwargs["device"] = "meta"
            mkwargs.pop("pin_memory", None)
        try:
            result = func(*margs, **mkwargs)
        except Exception as e:
            raise RuntimeError(
                f"cgsim mock: cannot work out the output of {func} during capture "
                f"(neither the CPU kernel nor the meta kernel ran: {e}). Capture this op "
                "on a real GPU, or report it so the mock can learn it."
            ) from e
    layout = _layout(result)
    if key is not None:
        _layouts[key] = layout
    return layout


# ----------------------------------------------------------------- recording


def _tensors(args: tuple, kwargs: dict) -> Iterator[Tensor]:
    for a in args:
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Tensor):
                    yield b
    for a in kwargs.values():
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Tensor):
                    yield b


def _mark_host(x: Any) -> None:
    if isinstance(x, Tensor):
        if not _memory.is_host(x):
            _memory.host_buffer(x, pinned=False)
    elif isinstance(x, (list, tuple)):
        for i in x:
            _mark_host(i)


# Graph-side aliases by the memory they name (address, geometry, dtype),
# shared between graphs: a model's weights and static buffers appear in every
# capture.  An alias pins its bytes (the caller's storage, or the pool
# block's, never the caller's tensor object), so while an entry exists no
# other tensor can be given the same address and the key stays exact.  Bounded
# (cleared when full): what it pins beyond the graphs' own lifetime is at most
# that many small tensors, and pinned pool bytes are not "in use", so the
# allocator's reuse rules are untouched.
_SHARED_ALIASES = 1024
_shared_aliases: dict[Any, Tensor] = {}


class _Recorder:
    """Per-capture bookkeeping of one CUDAGraph."""

    def __init__(self, pool: _memory.Pool) -> None:
        self.pool = pool
        self.ops: list[tuple] = []
        self.funcs: list[Any] = []  # the aten op behind each entry of ops, for introspection
        self._aliases: dict[Any, Tensor] = {}

    def alias(self, t: Tensor) -> Tensor:
        key = (t.data_ptr(), t.shape, t.stride(), t.dtype)
        a = self._aliases.get(key)
        if a is None:
            a = _shared_aliases.get(key)
            if a is None:
                if len(_shared_aliases) >= _SHARED_ALIASES:
                    _shared_aliases.clear()
                a = _shared_aliases[key] = _memory.alias_of(t)
            self._aliases[key] = a
        return a

    def alias_all(self, x: Any) -> Any:
        if isinstance(x, Tensor):
            return self.alias(x)
        if isinstance(x, (list, tuple)):
            for i in x:
                if isinstance(i, Tensor):
                    return type(x)([self.alias(i) if isinstance(i, Tensor) else self.alias_all(i) for i in x])
        return x

    def new_output(self, layout: Any) -> Any:
        if isinstance(layout, tuple) and layout and layout[0] == "value":
            return layout[1]
        if isinstance(layout, list):
            return [self.new_output(i) for i in layout]
        size, stride, dtype, nbytes = layout
        t = self.pool.alloc(size, stride, dtype, nbytes)
        t.fill_(_memory.poison_value(dtype))
        return t


def _handle(mode: "_CaptureMode", func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    cap = G.capture
    graph_ = cap.graph if cap is not None else None
    rec: _Recorder | None = getattr(graph_, "_recorder", None)
    if rec is None:  # mode outlived its capture (should not happen): be transparent
        return func(*args, **kwargs)
    if cap.invalidated:
        raise _errors.capture_invalidated_error(str(func))
    if func is aten.lift_fresh.default:
        # torch.tensor(...) builds its data on the host: host (pageable) memory,
        # as on a GPU before any .to(device).
        res = func(*args, **kwargs)
        _mark_host(res)
        return res
    info = _infos.get(func) or _info(func)
    if info.decompose:
        with mode:
            res = func.decompose(*args, **kwargs)
        if res is not NotImplemented:
            return res
    kind = info.kind
    if kind is _VIEW or kind is _META:
        return func(*args, **kwargs)
    if _off_device(info, args, kwargs):
        return func(*args, **kwargs)  # meta tensors: shapes only, nothing to capture

    if cap.host_depth or _memory.host_count():
        res = _host_op(cap, func, info, args, kwargs)
        if type(res) is _Rewrite:
            args, kwargs = res.args, res.kwargs
        elif res is not _NOT_HOST:
            return res

    if info.illegal and info.is_illegal(func, args, kwargs):
        cap.invalidated = True
        raise _errors.capture_unsupported_error(str(func))

    if kind is _MUTATE:
        ret_alias = info.ret_alias
        fresh = any(i is None for i in ret_alias)
        if fresh:
            layout = _infer(func, info, args, kwargs)
        a_args = rec.alias_all(args)
        a_kwargs = {k: rec.alias_all(v) for k, v in kwargs.items()}
        names = info.schema_args
        outs = []
        for n, idx in enumerate(ret_alias):
            if idx is None:
                outs.append(rec.new_output(layout[n] if len(ret_alias) > 1 else layout))
            elif idx < len(args):
                outs.append(args[idx])
            else:
                outs.append(kwargs[names[idx]])
        if fresh:
            # A mutating op whose schema does not say what it returns (vLLM IR's
            # maybe_inplace overloads return their inputs or new tensors): on a GPU
            # later kernels read whatever memory it returned at capture, so the
            # replayed results must land in the outputs handed out now.
            a_outs = [rec.alias(o) if idx is None else None for o, idx in zip(outs, ret_alias)]
            entry = (_copy_back, (func._op, a_args, a_kwargs, a_outs, len(ret_alias) > 1), {})
        else:
            entry = (func._op, a_args, a_kwargs)
        rec.ops.append(_kept_state(func, entry))
        rec.funcs.append(func)
        if not ret_alias:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    layout = _infer(func, info, args, kwargs)
    out = rec.new_output(layout)
    if kind is _ALLOC:
        return out
    a_args = rec.alias_all(args)
    a_kwargs = {k: rec.alias_all(v) for k, v in kwargs.items()}
    multi = isinstance(out, list)
    outs = out if multi else [out]
    a_outs = [rec.alias(o) if isinstance(o, Tensor) else None for o in outs]
    if info.out_op is not None and all(o is not None for o in a_outs):
        for name, o in zip(info.out_names, a_outs):
            a_kwargs[name] = o
        entry = (info.out_op, a_args, a_kwargs)
    else:
        entry = (_copy_back, (func._op, a_args, a_kwargs, a_outs, multi), {})
    rec.ops.append(_kept_state(func, entry))
    rec.funcs.append(func)
    return tuple(out) if multi and func._schema.returns and len(func._schema.returns) > 1 else out


def _off_device(info: _OpInfo, args: tuple, kwargs: dict) -> bool:
    if info.has_device:
        d = kwargs.get("device")
        if d is not None and torch.device(d).type == "meta":
            return True
    for t in _tensors(args, kwargs):
        return t.is_meta
    return False


def _copy_back(op: Any, args: tuple, kwargs: dict, outs: list, multi: bool) -> None:
    res = op(*args, **kwargs)
    if not multi:
        outs[0].copy_(res)
        return
    for o, r in zip(outs, res):
        if o is not None:
            o.copy_(r)


def _kept_state(func: Any, entry: tuple) -> tuple:
    """A recorded op, run at replay under the replay state of an engine's op (_REPLAY_STATE)."""
    if func.namespace in ("aten", "prims") or not _REPLAY_STATE:
        return entry
    state = tuple(f for f in (p() for p in _REPLAY_STATE) if f is not None)
    return (_run_in, (state, *entry), {}) if state else entry


def _run_in(state: tuple, fn: Any, args: tuple, kwargs: dict) -> None:
    with contextlib.ExitStack() as stack:
        for enter in state:
            stack.enter_context(enter())
        fn(*args, **kwargs)


_NOT_HOST = object()


def _host_op(cap: _runtime.CaptureRecord, func: Any, info: _OpInfo, args: tuple, kwargs: dict) -> Any:
    """Ops on host memory run now (CPU work is not captured); copies between host
    and device memory follow the host-copy rules."""
    if cap.host_depth:
        res = func(*args, **kwargs)
        _mark_host(res)
        return res
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
        dst_host, src_host = _memory.is_host(dst), _memory.is_host(src)
        if dst_host and src_host:
            return func(*args, **kwargs)
        if dst_host or src_host:
            host = dst if dst_host else src
            if not _memory.is_pinned_host(host):
                raise _errors.host_copy_error()  # checked before any CUDA call: capture stays valid
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            if not non_blocking:
                # cudaMemcpyAsync followed by cudaStreamSynchronize.
                cap.invalidated = True
                raise _errors.capture_unsupported_error("blocking host copy (copy_ with non_blocking=False)")
        return _NOT_HOST
    tensors = list(_tensors(args, kwargs))
    flags = [_memory.is_host(t) for t in tensors]
    if not any(flags):
        return _NOT_HOST
    if all(flags):
        res = func(*args, **kwargs)
        _mark_host(res)
        return res
    # A device kernel given host tensors: CUDA accepts only 0-dim CPU tensors,
    # read on the host at launch, so their value is frozen into the graph.
    if any(t.dim() != 0 for t, h in zip(tensors, flags) if h):
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
            f"(cgsim mock: {func} got host memory and device memory during capture)"
        )
    return _Rewrite(_freeze_scalars(args), {k: _freeze_scalars(v) for k, v in kwargs.items()})


class _Rewrite:
    __slots__ = ("args", "kwargs")

    def __init__(self, args: Any, kwargs: dict) -> None:
        self.args = args
        self.kwargs = kwargs


def _freeze_scalars(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.clone() if _memory.is_host(x) else x
    if isinstance(x, (list, tuple)) and any(isinstance(i, Tensor) for i in x):
        return type(x)(_freeze_scalars(i) for i in x)
    return x


class _CaptureMode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in a dynamo-disable shim: that
        # imports torch._dynamo on the first captured op (seconds) and costs
        # every op a frame. Captures are never traced by dynamo, so skip it.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _handle(self, func, args, kwargs or {})


# ------------------------------------------------------------------- public


def is_current_stream_capturing() -> bool:
    cap = G.capture
    return cap is not None and _runtime.current_stream() is cap.stream


def capturing_graph() -> "CUDAGraph | None":
    """The graph whose capture is under way, None outside a capture."""
    cap = G.capture
    return cap.graph if cap is not None else None


def graph_pool_handle() -> tuple[int, int]:
    """An opaque token naming a fresh memory pool, to share between captures."""
    return _memory.new_pool_id()


@contextlib.contextmanager
def host_ops() -> Iterator[None]:
    """Within a capture, run the enclosed ops on the host now, and treat their
    outputs as (pageable) host memory: the mock's way to say "this is CPU work",
    e.g. a CPU tensor allocated inside a capture. Outside a capture: no effect."""
    cap = G.capture
    if cap is None:
        yield
        return
    cap.host_depth += 1
    try:
        yield
    finally:
        cap.host_depth -= 1


# Ops recorded whole (an engine's custom op) may read Python state when they
# run: vLLM's attention ops read their forward context for the metadata and
# KV cache.  A real graph keeps what its kernels were given at capture, so a
# replay re-runs such ops under the state they were captured with.  Each
# provider, asked as such an op is recorded, returns a factory of that
# state's context manager (None: nothing to keep).
_REPLAY_STATE: list[Callable[[], Callable[[], ContextManager] | None]] = []


@contextlib.contextmanager
def replay_state(provider: Callable[[], Callable[[], ContextManager] | None]) -> Iterator[None]:
    """While open, an op recorded whole keeps ``provider()``'s state for its replays."""
    _REPLAY_STATE.append(provider)
    try:
        yield
    finally:
        _REPLAY_STATE.remove(provider)


_ERROR_MODES = ("default", "global", "thread_local", "relaxed")


def abort_capture() -> bool:
    """End a capture that nobody ended (capture_begin without capture_end),
    discarding it. Returns whether there was one. Used when the mock is
    uninstalled, so that one broken test does not leave every later op of the
    process being recorded."""
    cap = G.capture
    if cap is None:
        return False
    g = cap.graph
    G.capture = None
    mode, g._mode = g._mode, None
    g._recorder = None
    if mode is not None:
        try:
            mode.__exit__(None, None, None)
        except Exception:
            pass
    return True


class CUDAGraph:
    """Mock of torch.cuda.CUDAGraph: records aten ops at capture, re-runs them at
    replay against the captured memory."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._ops: tuple | None = None
        self._funcs: tuple = ()
        self._recorder: _Recorder | None = None
        self._mode: _CaptureMode | None = None
        self._pool: _memory.Pool | None = None
        self._pool_id: tuple[int, int] = (0, 0)
        self._capture_stream: _runtime.Stream | None = None
        self._memory_mark: tuple[int, int] = (0, 0)
        self._memory: _memory.GraphMemory | None = None
        self._installation = G.installation

    def __repr__(self) -> str:
        state = "captured" if self._ops is not None else ("capturing" if self._recorder else "empty")
        return f"<cgsim mock CUDAGraph {state} pool={self._pool_id}>"

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global", check_input_liveness: bool = False) -> None:
        if self._ops is not None:
            raise RuntimeError(_errors.ALREADY_CAPTURED)
        if capture_error_mode not in _ERROR_MODES:
            raise RuntimeError(
                f"Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got {capture_error_mode}"
            )
        s = _runtime.current_stream()
        if s is _runtime.default_stream():
            raise RuntimeError(_errors.DEFAULT_STREAM_CAPTURE)
        if G.capture is not None:
            raise RuntimeError(
                "cgsim mock: a capture is already under way in this process "
                f"(graph {G.capture.graph!r}); nested or concurrent captures are not modelled. "
                "End the first capture before beginning another."
            )
        # A graph holds its pool for as long as it lives: that is what keeps
        # graph-private memory valid for replay.
        self._pool_id = tuple(pool) if pool is not None else _memory.new_private_pool_id()
        self._pool = _memory.get_pool_for_capture(self._pool_id)
        self._memory_mark = self._pool.mark()
        self._capture_stream = s
        self._recorder = _Recorder(self._pool)
        _triton.record_interpreted_launches()
        G.capture = _runtime.CaptureRecord(self, s)
        self._mode = _CaptureMode()
        self._mode.__enter__()

    def capture_end(self) -> None:
        cap = G.capture
        if cap is None or cap.graph is not self:
            raise RuntimeError("Capture must end on the same stream it began on.")
        if _runtime.current_stream() is not cap.stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        mode, self._mode = self._mode, None
        rec, self._recorder = self._recorder, None
        self._memory = self._pool.since(self._memory_mark)
        G.capture = None
        mode.__exit__(None, None, None)
        if cap.invalidated:
            raise _errors.capture_invalidated_error()
        if not rec.ops:
            warnings.warn(
                "The CUDA Graph is empty. This usually means that the graph was attempted "
                "to be captured on wrong device or stream.",
                UserWarning,
                stacklevel=2,
            )
        self._ops = tuple(rec.ops)
        self._funcs = tuple(rec.funcs)

    def instantiate(self) -> None:
        pass

    def replay(self) -> None:
        ops = self._ops
        if ops is None:
            raise RuntimeError(_errors.REPLAY_WITHOUT_CAPTURE)
        cap = G.capture
        if cap is not None and cap.invalidated:
            raise _errors.capture_invalidated_error("CUDAGraph.replay()")
        # A GPU launches the graph on the stream current at replay(), ordered
        # after that stream's earlier work only: which one it was is recorded
        # (each stream once until taken, so a long run's replays add nothing).
        stream = _runtime.current_stream()
        if stream not in G.replay_streams:
            G.replay_streams.append(stream)
        with torch.inference_mode():
            for fn, a, k in ops:
                fn(*a, **k)

    def reset(self) -> None:
        self._ops = None
        self._drop_pool()

    def _drop_pool(self) -> None:
        # A graph holds its pool's use count until it is reset or destroyed.
        pool, self._pool = self._pool, None
        if pool is not None:
            _memory.release_pool(pool)

    def __del__(self) -> None:
        try:
            cap = G.capture
            # A graph left from an earlier installation belongs to a launch
            # that has ended (a process of its own on a GPU): collecting it
            # later is cgsim's leftover, not the capturing engine's doing.
            same_launch = self._installation == G.installation
            if self._ops is not None and cap is not None and cap.graph is not self and same_launch:
                # Destroying a graph frees its executable and memory, which the
                # driver refuses while a stream captures; torch only warns, and
                # the capture under way is invalidated (seen on an H200 when
                # Python's GC collected an old graph in the middle of a capture).
                warnings.warn(
                    "CUDA warning: operation not permitted when stream is capturing (function reset)",
                    RuntimeWarning,
                    stacklevel=2,
                )
                cap.invalidated = True
            self._drop_pool()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def pool(self) -> tuple[int, int]:
        return self._pool_id

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, debug_path: str) -> None:
        pass

    def raw_cuda_graph(self) -> int:
        raise RuntimeError("cgsim mock graphs have no cudaGraph_t")

    def raw_cuda_graph_exec(self) -> int:
        raise RuntimeError("cgsim mock graphs have no cudaGraphExec_t")

    # Introspection for tests and the runner (not part of torch's API).
    @property
    def capture_stream(self) -> "_runtime.Stream | None":
        """The stream the graph was captured on (None before a capture)."""
        return self._capture_stream

    @property
    def num_recorded_ops(self) -> int:
        return 0 if self._ops is None else len(self._ops)

    @property
    def recorded_ops(self) -> list[str]:
        """Names of the aten ops replay runs, in order."""
        return [] if self._ops is None else [str(f) for f in self._funcs]

    @property
    def memory(self) -> _memory.GraphMemory | None:
        """What this graph's capture took from its pool: so far while it
        captures, in all once it ended; None before a capture."""
        if self._recorder is not None and self._pool is not None:
            return self._pool.since(self._memory_mark)
        return self._memory


class graph:
    """Mock of torch.cuda.graph: capture the enclosed work into ``cuda_graph``.

    Mirrors torch's context manager line for line, including its quirk that a
    failing capture_end leaves the capture stream current.
    """

    default_capture_stream: _runtime.Stream | None = None

    def __init__(
        self,
        cuda_graph: CUDAGraph,
        pool: Any = None,
        stream: _runtime.Stream | None = None,
        capture_error_mode: str = "global",
        enable_annotations: bool = False,
        check_input_liveness: bool = False,
    ) -> None:
        if stream is None and self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = _runtime.Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = _runtime.stream(self.capture_stream)
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        _runtime.synchronize()
        _runtime.empty_cache()
        _runtime.empty_host_cache()  # torch >= 2.11 empties both caches here
        self.stream_ctx.__enter__()
        self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, *args: object) -> None:
        self.cuda_graph.capture_end()
        self.stream_ctx.__exit__(*args)
