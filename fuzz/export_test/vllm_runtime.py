"""Templates of the vLLM tests whose property is about what the model sees
while capture runs, or what a replay computes, rather than about the lists the
manager builds: FRESH-METADATA (the target's graphs, or the draft prefill
manager's driven through the speculator's own managers), SKIP-ATTN,
REPLAY-EQUALS-EAGER, DISPATCH-ROUNDTRIP (which needs the runner's own
uniform-count function), and NO-CRASH of a breakable re-capture after a
release (a graph double with the allocators' pool lifetimes).

Each test watches the real capture through doubles a vLLM test would use:
the toy model records, in every forward, the forward context's attention
metadata and whether a CUDA graph (plain or breakable) is being captured; a
CPU graph double records the toy model's in-graph work and replays it with the
values it read at capture time, which is what a CUDA graph does with a
kernel's launch arguments.

None of these tests holds a design's literals (no spec capture list, no
rounded sizes): what they assert holds under every ruleset, so the verdicts of
the ``RUNTIME_PROPERTIES`` are compared on every release
(``DESIGN_FREE_PROPERTIES``), and so is NO-CRASH of a breakable re-capture
(``design_free``).  The other NO-CRASH tests run the finding's steps on the
design's own capture list, and stay compared on its design only.
"""

from __future__ import annotations

from cgsim.modes import CUDAGraphMode
from fuzz.export_test import vllm_code as code
from fuzz.export_test.docs import ExportError
from fuzz.export_test.vllm_code import DUMMY_CAPTURE_INPUTS
from fuzz.export_test.vllm_parts import (MAX_ENUMERATED_SHAPES, Parts, count_partitions, fill, scheduler_constants,
                                         speculators_literal)
from fuzz.export_test.vllm_rules import ROUNDTRIP_ADAPTER, ROUNDTRIP_RULE

__all__ = ["RUNTIME_PROPERTIES", "DESIGN_FREE_PROPERTIES", "BREAKABLE_PROPERTIES", "RuntimeTemplates", "design_free"]

RUNTIME_PROPERTIES = ("DISPATCH-ROUNDTRIP", "FRESH-METADATA", "REPLAY-EQUALS-EAGER", "SKIP-ATTN")
# Properties whose test asserts nothing design-specific: compared on every release.
DESIGN_FREE_PROPERTIES = frozenset(RUNTIME_PROPERTIES)
# Properties whose test can drive breakable CUDA graphs (the CPU graph double
# and the breakable wrapper's weak references are set up for them).
BREAKABLE_PROPERTIES = frozenset({"FRESH-METADATA", "NO-CRASH", "REPLAY-EQUALS-EAGER", "SKIP-ATTN"})

F, P = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE


def design_free(prop: str, breakable: bool) -> bool:
    """Whether the exported test of a finding of ``prop`` holds no design's
    literals (its verdict is compared on every release): a runtime property's,
    or NO-CRASH with breakable graphs (always the re-capture template, which
    asserts only that the re-capture does not raise)."""
    return prop in DESIGN_FREE_PROPERTIES or (prop == "NO-CRASH" and breakable)


class RuntimeTemplates:
    """Mixed into the vLLM writer: one method per property, as the writer's
    own (``_<property>``), each returning the test's parts."""

    # -- DISPATCH-ROUNDTRIP -----------------------------------------------------------
    def _dispatch_roundtrip(self) -> Parts:
        c = self.cfg
        max_size = c.max_capture_size or max(c.capture_sizes)
        shapes = count_partitions(max_size, c.max_num_reqs)
        if shapes > MAX_ENUMERATED_SHAPES:
            raise ExportError(
                f"finding {self.f.id}: DISPATCH-ROUNDTRIP over {shapes} batch shapes (capture sizes up to {max_size}, "
                f"{c.max_num_reqs} requests) is too many to enumerate in a test; shrink the finding first")
        body = fill('''
    # Every batch the scheduler can produce that has exactly the shape of a
    # captured graph (no padded token, no padded request), dispatched with the
    # arguments the model runner computes for it.
    captured = recorder.captured(manager)
    failures = []
    for batch in every_producible_batch():
        exact = [d for d in captured if exact_shape(d, batch)]
        if not exact:
            continue
        target = max(exact, key=rank)
        desc = runner_dispatch(manager, batch)
        if not roundtrip_holds(desc, batch, target, captured):
            failures.append(f"{batch} -> {short(desc)} (exact: {short(target)})")
    assert not failures, (
        f"DISPATCH-ROUNDTRIP: {len(failures)} batch(es) have exactly the shape of "
        "a captured graph but are dispatched elsewhere: "
        + "; ".join(failures)
        + ". A batch with a prefill that replays a FULL graph captured for uniform "
        "decodes runs the decode kernels over prompt tokens (recurrent-state models "
        "skip their prompt state set-up). "
        <<seen>>
    )
''', seen=self._seen())
        return Parts(body, helpers=(code.HELPER_BATCH, code.HELPER_FITS, code.HELPER_SCHEDULER, HELPER_RUNNER_DISPATCH, HELPER_ROUNDTRIP),
                     constants=(scheduler_constants(c),), runs_checked_step=True)

    # -- FRESH-METADATA ---------------------------------------------------------------
    def _fresh_metadata(self) -> Parts:
        if self.f.manager == "draft-prefill":
            return self._fresh_metadata_draft_prefill()
        if self.f.manager is not None:
            raise ExportError(
                f"finding {self.f.id}: FRESH-METADATA of the draft decode manager is not exported (it builds its "
                "own metadata as the target's manager does); replay it with python -m fuzz replay")
        body = fill('''
    # A FULL (or breakable PIECEWISE) graph replays what its capture recorded.
    # A backend that sets up metadata lazily on first use (FlashMLA's tile
    # scheduler) does so in the eager warmup; the graph must be captured with
    # a fresh metadata object, or it never records that set-up.
    graphed = [
        d
        for d in dict.fromkeys(recorder.descs)
        if d.cg_mode == CUDAGraphMode.FULL or getattr(manager, "use_breakable_cg", False)
    ]
    assert graphed, "nothing was captured into a graph: the test does not apply"
    reused = []
    for desc in graphed:
        warmup = [id(m) for m in observer.metadata(desc, in_graph=False) if m is not None]
        for metadata in observer.metadata(desc, in_graph=True):
            if metadata is not None and id(metadata) in warmup:
                reused.append(short(desc))
    assert not reused, (
        f"FRESH-METADATA: the graph(s) for {sorted(set(reused))} were captured with "
        "the attention metadata object their eager warmup ran with (expected a "
        "fresh one built for the capture): lazily initialised metadata is set up in "
        "the warmup and never recorded in the graph, which then replays the dummy "
        "batch's plan. "
        <<seen>>
    )
''', seen=self._seen())
        return Parts(body, helpers=(code.HELPER_SHORT, HELPER_OBSERVER), fixtures=("observer",),
                     imports=("from vllm.forward_context import get_forward_context",), runs_checked_step=True)

    def _fresh_metadata_draft_prefill(self) -> Parts:
        if self.step is None or self.scenario.steps[self.step].kind != "capture" or self.cfg.decode_query_len < 2:
            raise ExportError(f"finding {self.f.id}: a draft prefill FRESH-METADATA finding is written for a "
                                "capture step of a config with speculative tokens")
        body = fill('''
    # capture_model: the target's graphs first, then the speculator's, whose
    # prefill manager (draft position 0) captures the target's batch shapes.
    target_states = capture(manager, recorder)  # step <<step>>: capture
    target_reused = reused_warmup_metadata(observer.forwards)
    # 0.20-0.22's draft managers take a graph pool of their own; CPU has none.
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    speculator = build_draft_managers(vllm_config, manager.cudagraph_mode)
    forwards = []  # the draft prefill's forwards: (descriptor, metadata, in a graph)

    def draft_prefill(num_reqs, num_tokens, attn_metadata, *args, **kwargs):
        forwards.append((recorder.descs[-1], attn_metadata, observer.in_graph))

    handed = capture_draft_prefill(
        speculator.prefill_cudagraph_manager, draft_prefill, target_states, recorder
    )
    if not handed and target_reused:
        pytest.skip(
            "this vLLM's draft prefill manager builds its own metadata through the "
            "shared capture loop, which warms up and captures every FULL graph with "
            "one metadata object (the target's too: a finding of its own)"
        )
    passes = {g for d, _, g in forwards if d.cg_mode == CUDAGraphMode.FULL}
    assert passes == {False, True}, (
        "the draft prefill manager warmed up and captured no FULL graph: the test "
        "does not apply"
    )
    reused = reused_warmup_metadata(forwards)
    how = (
        "the speculator hands it the target's attention states and it uses one "
        "state for both passes"
        if handed
        else "it built one metadata object for both passes"
    )
    assert not reused, (
        f"FRESH-METADATA: the draft prefill manager's FULL graph(s) for {reused} "
        "were captured with the attention metadata object their eager warmup ran "
        f"with: {how}, so a backend's lazily initialised metadata "
        "(FlashMLA's tile scheduler) is set up in the warmup and never recorded in "
        "the draft's graph, which then replays the dummy batch's plan. "
        <<seen>>
    )
''', step=str(self.step), seen=self._seen())
        return Parts(body, helpers=(code.HELPER_SHORT, HELPER_OBSERVER,
                                    fill(code.HELPER_DRAFT_MANAGERS, speculators=speculators_literal()),
                                    HELPER_DRAFT_PREFILL),
                     fixtures=("observer", "monkeypatch"),
                     imports=("from vllm.forward_context import get_forward_context",))

    # -- NO-CRASH of a breakable re-capture after a release -------------------------
    def _no_crash_breakable_recapture(self) -> Parts:
        steps = self.scenario.steps
        if (self.step is None or steps[self.step].kind != "capture"
                or not any(s.kind == "release" for s in steps[: self.step])
                or not any(s.kind == "capture" for s in steps[: self.step])):
            raise ExportError(
                f"finding {self.f.id}: NO-CRASH with breakable CUDA graphs is exported for a re-capture after a "
                "release only (the CPU graph double models the graph pools' lifetimes, nothing else of a GPU); "
                "replay it with python -m fuzz replay")
        preamble = '''
    if not hasattr(cudagraph_utils.CudaGraphManager, "release_graphs"):
        pytest.skip(
            "this vLLM's release never reaches the MRV2 manager's graphs (elastic EP's "
            "_release_cuda_graphs has no MRV2 branch before 0.32), so no graph pool "
            "is released before the re-capture"
        )
    if not HOST_GRAPH_POOLS:
        pytest.skip(
            f"torch {torch.__version__} keeps no graph pools in its pinned-host "
            "allocator (from 2.11 on): the re-capture has nothing to trip over"
        )
'''
        body = fill('''
    assert PoolGraph.begun, (
        "the first capture began no CUDA graph segment: the test does not apply"
    )
    error = None
    try:
        capture(manager, recorder)  # step <<step>>: capture
    except Exception as exc:  # a crash of vLLM's own capture, whatever its type
        error = f"{type(exc).__name__}: {exc}"
    cause = (
        "The breakable wrapper begins every segment with a bare "
        "CUDAGraph.capture_begin(pool=...) into the persistent global graph pool; "
        "destroying the released graphs left that pool id registered with the "
        "pinned-host allocator with no graph using it, which only the host cache's "
        "empty_cache erases, and vLLM empties the device cache only "
        "(torch.accelerator.empty_cache) before the re-capture. "
        if "CachingHostAllocator" in str(error)
        else ""
    )
    assert error is None, (
        f"NO-CRASH: re-capturing the breakable PIECEWISE graphs after "
        f"release_graphs() raised {error}. {cause}"
        <<seen>>
    )
''', step=str(self.step), seen=self._seen())
        return Parts(body, helpers=(HELPER_POOL_GRAPHS,), fixtures=("pool_graphs",), preamble=preamble)

    # -- SKIP-ATTN --------------------------------------------------------------------
    def _skip_attn(self) -> Parts:
        if not self.cfg.breakable:
            raise ExportError(
                f"finding {self.f.id}: SKIP-ATTN is exported for breakable PIECEWISE graphs only (whether a "
                "non-breakable PIECEWISE warmup builds metadata is a design choice of each release)")
        body = fill('''
    # Breakable CUDA graphs capture the whole forward as pieces split at
    # @eager_break_during_capture ops, so ops that read attention metadata sit
    # inside the pieces: every capture-time forward of a breakable PIECEWISE
    # graph must see the dummy batch's metadata.
    assert getattr(manager, "use_breakable_cg", False), (
        "the manager did not enable breakable CUDA graphs: the test does not apply"
    )
    skipped = sorted(
        {
            short(desc)
            for desc, metadata, in_graph in observer.forwards
            if desc.cg_mode == CUDAGraphMode.PIECEWISE and metadata is None
        }
    )
    assert not skipped, (
        f"SKIP-ATTN: capture-time forwards of the breakable PIECEWISE graph(s) "
        f"{skipped} ran with attention skipped (metadata None): the pieces record "
        "attention-reading ops with no metadata and replay whatever the dummy pass "
        "left. "
        <<seen>>
    )
''', seen=self._seen())
        return Parts(body, helpers=(code.HELPER_SHORT, HELPER_OBSERVER), fixtures=("observer",),
                     imports=("from vllm.forward_context import get_forward_context",), runs_checked_step=True)

    # -- REPLAY-EQUALS-EAGER ----------------------------------------------------------
    def _replay_equals_eager(self) -> Parts:
        b = self._checked_batch()
        c = self.cfg
        if not c.breakable or c.attention_split or c.compiled_piecewise:
            raise ExportError(
                f"finding {self.f.id}: REPLAY-EQUALS-EAGER is exported for breakable PIECEWISE graphs with "
                "attention inside the pieces only (the CPU graph double replays the toy model's own kernels; a "
                "torch-compiled model's piecewise graphs are not modelled); replay it with python -m fuzz replay")
        body = fill('''
<<batchline>>
    desc = dispatch(manager, batch)
    if desc.cg_mode != CUDAGraphMode.PIECEWISE:
        return  # this release does not replay a piecewise graph for the batch
    replayed = run_batch(graph_model, manager, vllm_config, batch, desc, replay=True)
    eager = run_batch(graph_model, manager, vllm_config, batch, desc, replay=False)
    error = (replayed - eager).abs().max().item()
    assert error <= 1e-5, (
        f"REPLAY-EQUALS-EAGER: replaying the breakable PIECEWISE graph {short(desc)} "
        f"for {batch} differs from the eager forward by {error:.6f} (max abs, over "
        "the real rows): the attention op inside the piece was recorded with the "
        "metadata its capture saw, and replays that. "
        <<seen>>
    )
''', batchline=self._batch_line(b), seen=self._seen())
        return Parts(body, helpers=(code.HELPER_BATCH, code.HELPER_SHORT, HELPER_REPLAY),
                     fixtures=("graph_model",), imports=(
                         "from vllm.forward_context import get_forward_context, set_forward_context",),
                     runs_checked_step=False)


# ---------------------------------------------------------------------------
# The generated code's parts
# ---------------------------------------------------------------------------

HELPER_RUNNER_DISPATCH = '''
def runner_uniform_token_count(batch):
    """The uniform token count the model runner passes dispatch, from the
    runner's own function: get_uniform_decode_token_count (0.28+: decodes only;
    its last argument is has_prefill, from 0.32 decode_graph_eligible), else
    cudagraph_utils.get_uniform_token_count (every batch of equal lengths)."""
    try:
        from vllm.v1.worker.utils import get_uniform_decode_token_count as count
    except ImportError:
        count = None
    max_query_len = max(batch.query_lens)
    if count is None:
        return cudagraph_utils.get_uniform_token_count(
            batch.num_reqs, batch.num_tokens, max_query_len
        )
    flag = list(inspect.signature(count).parameters)[3]
    value = batch.has_prefill if flag == "has_prefill" else not batch.has_prefill
    return count(batch.num_reqs, batch.num_tokens, max_query_len, value)


def runner_dispatch(manager, batch):
    """dispatch() with the arguments the model runner computes for ``batch``."""
    return manager.dispatch(
        batch.num_reqs,
        batch.num_tokens,
        runner_uniform_token_count(batch),
        **accepted_kwargs(
            manager.dispatch,
            num_active_loras=batch.num_active_loras,
            max_query_len=batch.max_query_len,
            num_ubatches=batch.num_ubatches,
        ),
    )
'''

# cgsim's DISPATCH-ROUNDTRIP rule generated from its source, with its adapter (vllm_rules.py).
HELPER_ROUNDTRIP = ROUNDTRIP_RULE + ROUNDTRIP_ADAPTER

HELPER_OBSERVER = '''
class ForwardObserver:
    """What the model saw in every forward capture() ran: the descriptor being
    captured, the forward context's attention metadata object, and whether a
    CUDA graph (plain or breakable) was being captured at that moment."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.forwards = []
        self.in_graph = False

    def record(self):
        metadata = get_forward_context().attn_metadata
        desc = self.recorder.descs[-1] if self.recorder.descs else None
        self.forwards.append((desc, metadata, self.in_graph or breakable_capturing()))

    def metadata(self, desc, in_graph):
        return [m for d, m, g in self.forwards if d == desc and g == in_graph]


def breakable_capturing():
    try:
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
    except ImportError:
        return False
    return BreakableCUDAGraphCapture.current() is not None


@pytest.fixture
def observer(monkeypatch, cpu_graphs, recorder):
    observer = ForwardObserver(recorder)
    plain_graph = torch.cuda.graph  # cpu_graphs' double

    @contextmanager
    def observed_graph(*args, **kwargs):
        observer.in_graph = True
        try:
            with plain_graph(*args, **kwargs):
                yield
        finally:
            observer.in_graph = False

    monkeypatch.setattr(torch.cuda, "graph", observed_graph)
    model_forward = ToyModel.forward

    def observed_forward(self, *args, **kwargs):
        observer.record()
        return model_forward(self, *args, **kwargs)

    monkeypatch.setattr(ToyModel, "forward", observed_forward)
    return observer
'''

HELPER_REPLAY = '''
HIDDEN = 4


class CpuGraph:
    \"\"\"torch.cuda.CUDAGraph on CPU: between capture_begin and capture_end it
    records the kernels the toy model launches; replay() runs them again with
    the arguments they were launched with, as a CUDA graph replays its kernels
    with their captured launch parameters (tensors by address).\"\"\"

    capturing = None

    def __init__(self, *args, **kwargs):
        self.kernels = []

    def capture_begin(self, *args, **kwargs):
        CpuGraph.capturing = self

    def capture_end(self):
        CpuGraph.capturing = None

    def replay(self):
        for kernel in self.kernels:
            kernel()


def launch(kernel):
    \"\"\"Run a kernel now; a graph being captured records it.\"\"\"
    kernel()
    if CpuGraph.capturing is not None:
        CpuGraph.capturing.kernels.append(kernel)


class GraphModel:
    \"\"\"The toy model's persistent buffers and its forward: an embedding, then
    causal attention within each request, both inside the graph (attention is
    not split out of the pieces).  The attention kernel takes the query start
    offsets by address and the request count as a launch argument; without
    attention metadata it launches nothing, as vLLM's attention layers do.\"\"\"

    def __init__(self):
        self.hidden = torch.zeros(MAX_NUM_BATCHED_TOKENS, HIDDEN)
        self.out = torch.zeros(MAX_NUM_BATCHED_TOKENS, HIDDEN)
        self.query_start_loc = torch.zeros(MAX_NUM_REQS + 1, dtype=torch.int64)
        self.weight = torch.arange(1, HIDDEN + 1, dtype=torch.float32)
        self.inputs = {}  # num_tokens -> the input_ids view a capture ran with
        self.keys = {}  # num_tokens -> the BatchDescriptor a PIECEWISE capture ran under

    def metadata(self, num_reqs):
        return {"toy_attn": SimpleNamespace(query_start_loc=self.query_start_loc, num_reqs=num_reqs)}

    def forward(self, input_ids=None, positions=None, **kwargs):
        context = get_forward_context()
        num_tokens = input_ids.shape[0]
        self.inputs.setdefault(num_tokens, input_ids)
        if context.cudagraph_runtime_mode == CUDAGraphMode.PIECEWISE:
            self.keys.setdefault(num_tokens, context.batch_descriptor)
        hidden, out, weight = self.hidden, self.out, self.weight

        def embed():
            hidden[:num_tokens] = (input_ids[:num_tokens, None].float() + 1) * weight

        launch(embed)
        metadata = context.attn_metadata
        attn = metadata.get("toy_attn") if isinstance(metadata, dict) else None
        if attn is not None:
            starts, num_reqs = attn.query_start_loc, attn.num_reqs

            def attend():
                for r in range(num_reqs):
                    s, e = int(starts[r]), int(starts[r + 1])
                    steps = torch.arange(1, e - s + 1, dtype=torch.float32)[:, None]
                    out[s:e] = hidden[s:e].cumsum(0) / steps

            launch(attend)
        return out[:num_tokens]


@pytest.fixture
def graph_model(monkeypatch, cpu_graphs, recorder):
    \"\"\"CUDA graphs that replay (CpuGraph), and the toy model replaced by
    GraphModel's forward; capture's metadata describes the dummy batch.\"\"\"
    model = GraphModel()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", CpuGraph)

    @contextmanager
    def cuda_graph(graph, pool=None, stream=None, **kwargs):
        graph.capture_begin()
        try:
            yield
        finally:
            graph.capture_end()

    monkeypatch.setattr(torch.cuda, "graph", cuda_graph)
    monkeypatch.setattr(ToyModel, "forward", lambda self, *a, **k: model.forward(*a, **k))
    record = CaptureRecorder.prepare_attn

    def prepare_attn(self, input_batch, *args, **kwargs):
        record(self, input_batch, *args, **kwargs)
        lens = torch.as_tensor(input_batch.num_scheduled_tokens).to(torch.int64)
        model.query_start_loc.fill_(int(lens.sum()))
        model.query_start_loc[0] = 0
        model.query_start_loc[1 : len(lens) + 1] = lens.cumsum(0)
        return model.metadata(len(lens))

    monkeypatch.setattr(CaptureRecorder, "prepare_attn", prepare_attn)
    return model


def run_batch(model, manager, vllm_config, batch, desc, replay):
    \"\"\"The runner's execute path for ``batch`` on the PIECEWISE ``desc``: its
    tokens into the persistent input buffer the capture used, its query start
    offsets into the metadata buffer, then the graph's replay (``replay``) or
    the eager model.  The real rows of the output.\"\"\"
    num_tokens = desc.num_tokens
    input_ids = model.inputs[num_tokens]
    input_ids.zero_()
    input_ids[: batch.num_tokens] = torch.arange(batch.num_tokens) % 7 + 1
    lens = torch.tensor(batch.query_lens, dtype=torch.int64)
    model.query_start_loc.fill_(batch.num_tokens)
    model.query_start_loc[0] = 0
    model.query_start_loc[1 : batch.num_reqs + 1] = lens.cumsum(0)
    model.out.zero_()  # what the dummy passes left does not matter to the eager run
    mode = CUDAGraphMode.PIECEWISE if replay else CUDAGraphMode.NONE
    key = model.keys.get(num_tokens) if replay else None
    if replay:
        runner = manager.breakable_cg_runner
        entry = runner.entries.get(key) if runner is not None else None
        if entry is None or entry.capture is None:  # the test broke: no verdict
            pytest.fail(f"no breakable graph was captured for {short(desc)} (key {key})")
    with set_forward_context(
        model.metadata(batch.num_reqs),
        vllm_config,
        num_tokens=num_tokens,
        cudagraph_runtime_mode=mode,
        batch_descriptor=key,
    ):
        inputs = {"input_ids": input_ids, "positions": None}
        if replay:
            out = manager.run_pw_graph(ToyModel(), inputs)
        else:
            out = ToyModel()(**inputs)
    return out[: batch.num_tokens].clone()
'''

HELPER_DRAFT_PREFILL = '''
def reused_warmup_metadata(forwards):
    \"\"\"The FULL descriptors whose in-graph forward saw the very metadata object
    their eager warmup saw (``forwards``: (descriptor, metadata, in a graph)).\"\"\"
    reused = []
    for desc in dict.fromkeys(d for d, _, _ in forwards):
        if desc.cg_mode != CUDAGraphMode.FULL:
            continue
        warmup = {id(m) for d, m, g in forwards if d == desc and not g and m is not None}
        if any(id(m) in warmup for d, m, g in forwards if d == desc and g and m is not None):
            reused.append(short(desc))
    return reused


def capture_draft_prefill(prefill_manager, forward_fn, target_states, recorder):
    \"\"\"Speculator.capture's prefill capture in this release's API.  0.21-0.25's
    prefill manager is handed the attention states the target's capture
    returned (0.21-0.22: one state per descriptor; 0.23-0.25: warmup/captured
    pairs); 0.20's and 0.26+'s build their own dummy metadata through the
    target runner's model state.  Returns whether it was handed the target's.\"\"\"
    params = inspect.signature(prefill_manager.capture).parameters
    if "full_cg_attn_states" in params or "attn_states" in params:
        prefill_manager.capture(forward_fn, target_states)
        return True
''' + DUMMY_CAPTURE_INPUTS + '''    prefill_manager.capture(
        forward_fn, model_state, input_buffers, block_tables, [[]], kv_cache_config
    )
    return False
'''

HELPER_POOL_GRAPHS = '''
HOST_GRAPH_POOLS = tuple(
    int(part) for part in torch.__version__.split("+")[0].split(".")[:2]
) >= (2, 11)
GLOBAL_GRAPH_POOL = (0, 1)  # the persistent pool id get_global_graph_pool() hands out
ALLOCATOR_SOURCES = {
    "device": "c10/cuda/CUDACachingAllocator.cpp",
    "host": "aten/src/ATen/core/CachingHostAllocator.h",
}


class PoolGraph:
    \"\"\"torch.cuda.CUDAGraph on CPU with the graph-pool lifetimes of torch's two
    caching allocators; capture records nothing and replay does nothing.

    Why: on an H200 (torch 2.11) a capture into a pool, the graph destroyed,
    torch.cuda.empty_cache(), then a capture into the same pool id asserted
    use_count > 0 in CachingHostAllocator.h; with the host cache emptied first
    it worked.  capture_begin registers the pool id with the device allocator
    and, from torch 2.11, with the pinned-host allocator too
    (create_or_incref_pool_under_lock), whether or not the capture pins memory.
    A graph's destruction drops its reference (release_pool), which only marks
    a pool no graph uses freeable: it stays registered until that allocator's
    own empty_cache erases it, and capturing into it before then asserts.
    torch.cuda.graph() empties both caches on entry; a bare capture_begin does
    not.\"\"\"

    pools = {"device": {}, "host": {}}  # allocator -> pool id -> graphs using it
    begun = 0  # capture_begin calls

    def __init__(self, *args, **kwargs):
        self.pool = None

    @classmethod
    def allocators(cls):
        return [a for a in cls.pools if a == "device" or HOST_GRAPH_POOLS]

    def capture_begin(self, pool=None, *args, **kwargs):
        pool = ("private", id(self)) if pool is None else pool
        for allocator in self.allocators():
            if self.pools[allocator].get(pool) == 0:
                raise RuntimeError(
                    "it->second->use_count > 0 INTERNAL ASSERT FAILED at "
                    f"{ALLOCATOR_SOURCES[allocator]}: capture into graph pool {pool}, "
                    f"which the {allocator} allocator still holds with no graph "
                    "using it (released, not yet emptied)"
                )
        for allocator in self.allocators():
            self.pools[allocator][pool] = self.pools[allocator].get(pool, 0) + 1
        self.pool = pool
        PoolGraph.begun += 1

    def capture_end(self):
        pass

    def replay(self):
        pass

    def reset(self):
        if self.pool is not None:
            for pools in self.pools.values():
                if self.pool in pools:
                    pools[self.pool] -= 1
            self.pool = None

    __del__ = reset

    @classmethod
    def empty_cache(cls, allocator):
        \"\"\"An allocator's empty_cache erases its pools no graph uses.\"\"\"
        pools = cls.pools[allocator]
        for pool in [p for p, users in pools.items() if users == 0]:
            del pools[pool]


@pytest.fixture
def pool_graphs(monkeypatch, cpu_graphs):
    \"\"\"CUDA graphs whose pools live as the allocators keep them, around vLLM's
    persistent global graph pool.\"\"\"
    PoolGraph.pools = {"device": {}, "host": {}}
    PoolGraph.begun = 0
    monkeypatch.setattr(torch.cuda, "CUDAGraph", PoolGraph)

    @contextmanager
    def cuda_graph(graph, pool=None, stream=None, **kwargs):
        PoolGraph.empty_cache("device")
        PoolGraph.empty_cache("host")
        graph.capture_begin(pool=pool)
        try:
            yield
        finally:
            graph.capture_end()

    monkeypatch.setattr(torch.cuda, "graph", cuda_graph)
    # torch.cuda.empty_cache and torch.accelerator.empty_cache empty the device
    # allocator only; the host one has its own.
    empty_device = lambda: PoolGraph.empty_cache("device")  # noqa: E731
    empty_host = lambda: PoolGraph.empty_cache("host")  # noqa: E731
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_device)
    monkeypatch.setattr(torch.accelerator, "empty_cache", empty_device)
    monkeypatch.setattr(torch._C, "_host_emptyCache", empty_host, raising=False)
    if hasattr(torch.accelerator, "empty_host_cache"):
        monkeypatch.setattr(torch.accelerator, "empty_host_cache", empty_host)
    monkeypatch.setattr(
        cudagraph_utils.current_platform,
        "get_global_graph_pool",
        lambda: GLOBAL_GRAPH_POOL,
    )
    yield
    # A capture that raised in capture_begin leaves the breakable capture's
    # thread-local marker set (its __exit__ never ran).
    try:
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
    except ImportError:
        return
    BreakableCUDAGraphCapture._tls.active = None
'''
