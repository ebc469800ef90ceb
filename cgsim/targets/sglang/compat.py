"""What differs between the sglang trees cgsim drives, read off the imported
code, and the one-line refusal of a tree it cannot drive.

``probe`` looks at the imported sglang: the runners and helpers the target
needs (``REQUIRED``: a tree that lacks one is exit 2 naming the piece), and
what the releases do differently where the driver must follow (the release
path, ``forward_context``'s keywords, how a forward batch binds its KV plan,
the DP attention set-up, the prefill token alignment helper, the LoRA
hooks, ``eager_on_graph``'s and the decode sizing's signatures, the parallel
override's names; ``shared_experts_config`` on demand).  This module is
the only place the tree's shape is probed (tests/cgsim/targets/test_tree_probes.py
scans the others).  ``DESIGNS`` keeps only what introspection cannot see:
which design (cgsim ruleset) a release follows, each row naming the release
and the sglang code it comes from.

``VALIDATION_INPUTS`` is how a launch reaches sglang's own start-up check
(``ServerArgs.check_server_args``) on a CPU host without a model: each row
names a field the check reads that sglang resolves only past the point where
it stops for ``--model-path dummy``, which sglang code cgsim runs for it, and
what cgsim presents where that code would probe a GPU or read the model.

``CGSIM_SGLANG_SOURCE`` (``--sglang-source``) names a source tree (a checkout's
``python/`` folder or an unpacked wheel) whose ``sglang`` package is imported
instead of the installed one; the stand-ins and the runtime packages stay
the environment's.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import random
import re
import subprocess
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from cgsim.targets.base import SourceOption
from cgsim.targets import releases
from cgsim.targets.releases import Design, version_key
# The errors are errors.py's; named here too for the target's callers.
from cgsim.targets.sglang.errors import SglangAdapterError, SglangEnvironmentError

__all__ = ["SglangEnvironmentError", "SglangAdapterError", "Design", "DESIGNS", "ValidationInput", "VALIDATION_INPUTS",
           "validation_inputs", "Tree", "REQUIRED", "SOURCE_ENV", "SOURCE_OPTION",
           "as_on_cpu_host", "INSTALL_HINT", "installed_version", "version_key", "design_for", "probe", "tree", "source_root",
           "apply_source", "tree_version",
           "shared_experts_config"]

SOURCE_ENV = "CGSIM_SGLANG_SOURCE"
# --sglang-source on every command; a finding records the tree (Tree.to_json).
SOURCE_OPTION = SourceOption(
    flag="--sglang-source", env=SOURCE_ENV,
    help="an sglang checkout (or its python/ folder) or unpacked wheel imported instead of the installed sglang "
         "(the environment's stand-ins stay); also CGSIM_SGLANG_SOURCE",
    summary="an sglang checkout (or its python/ folder) or unpacked wheel imported instead of the installed sglang",
    empty="give an sglang checkout or an unpacked sglang wheel", what="sglang", recorded_as="sglang_source")
INSTALL_HINT = "bash scripts/install_sglang.sh VENV [VERSION] (docs/sglang.md)"


# --------------------------------------------------------------------------
# Designs: what introspection cannot see
# --------------------------------------------------------------------------


DESIGNS: tuple[Design, ...] = (
    Design("0.5.20", "sglang-0.5.20",
           "runner/prefill_cuda_graph_runner.py PrefillCudaGraphRunner.__init__: capture_num_tokens = "
           "sorted(capture_tokens), not aligned; runner/decode_cuda_graph_runner.py __init__: "
           "record_nolora_graph only from its keyword, which capture_decode_graph never passes"),
    Design("0.5.22", "sglang-0.5.22",
           "runner/prefill_cuda_graph_runner.py get_prefill_num_tokens_to_capture aligns the prefill buckets "
           "like the decode bs list (get_cuda_graph_max_batch_size)"),
    Design("0.5.23", "sglang",
           "runner/decode_cuda_graph_runner.py __init__: record_nolora_graph = the keyword or "
           "_lora_backend_skips_inactive(model_runner) (a LoRA backend that skips inactive dense LoRA, "
           "--lora-backend triton_v2, records a base-only graph beside each LoRA graph)"),
)
OLDEST = DESIGNS[0].first


def design_for(version: str) -> Design | None:
    """The design of DESIGNS that ``version`` follows (None: older than cgsim drives)."""
    return releases.design_for(DESIGNS, version)


# --------------------------------------------------------------------------
# sglang's start-up check on a CPU host without a model
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidationInput:
    """A field ``ServerArgs.check_server_args`` reads that the resolution
    pipeline leaves unset for ``--model-path dummy`` (it returns before the
    model-dependent hooks), what resolves it on a real launch, and why cgsim's
    way of resolving it gives the value a GPU server would have."""

    name: str
    field: str
    why: str


# The launch path the check follows on every release cgsim drives (0.5.20-0.5.23,
# entrypoints/engine.py): resolve_once(), then server_args.check_server_args()
# (arg_groups/validation_hook.py check_server_args: check_two_batch_overlap, the
# LoRA checks of lora_hook.check_lora_server_args, ...).  With --model-path dummy,
# arg_groups/pipeline.py run_resolution_pipeline returns right after
# handle_hardware_runtime_validation, so four fields the check reads are unset
# (None): the check would raise TypeError on them, not refuse the launch.  The
# check's other platform probes (get_platform().is_hip in lora_hook._check_v2_lora_modes,
# .is_npu for --model-impl mindspore) answer on a CPU host what they answer on an
# NVIDIA GPU (False) and run unpatched.
VALIDATION_INPUTS: tuple[ValidationInput, ...] = (
    ValidationInput(
        "missing-defaults", "served_model_name",
        "serving_hook.handle_missing_default_values (the first hook past the dummy-model return that the check "
        "needs) is run as sglang runs it: served_model_name and tokenizer_path from --model-path (MODEL: no "
        "colon, as the check requires of a served name), a random seed, the draft quantization default. It "
        "reads no model. The seed is drawn from Python's random module; its state is put back afterwards, as "
        "a campaign's strategies (which run this check) must leave it."),
    ValidationInput(
        "device-probe", "device",
        "handle_missing_default_values resolves an unset --device by serving_hook.get_device(), which probes "
        "torch.cuda (and other accelerators) and says 'cpu' on a CPU host. cgsim's runners run on its CUDA "
        "device (the mock is torch.cuda; the agreement corpus runs them on H100/H200), so get_device answers "
        "'cuda' inside that hook only. The check reads device for --load-format instanttensor, the intel_xpu "
        "sampling backend, watermarking and quantized communications, none of which a cgsim launch sets."),
    ValidationInput(
        "page-size", "page_size",
        "overrides._page_size_default, a post-process pass the pipeline runs after the attention backend is "
        "chosen, is run as sglang runs it: without --page-size it answers 1 unless the platform is MUSA (64) or "
        "ROCm with the AITER 5D KV layout (64); a CPU host and a CUDA one both give 1. The check asserts "
        "chunked_prefill_size % page_size == 0."),
    ValidationInput(
        "chunked-prefill-size", "chunked_prefill_size",
        "memory_hook.handle_gpu_memory_settings picks it from the GPU's memory (get_device_memory_capacity) and "
        "then reads the model's config (model_config_of) for mem_fraction_static, so it cannot run here. cgsim "
        "presents its choice for the GPUs cgsim's CUDA runs use: 8192, for every capacity from 60 to 160 GB "
        "(H100 80 GB, H200 141 GB; 0.5.20-0.5.23 alike). The check reads it only against page_size (above)."),
)


def validation_inputs(server_args: Any) -> None:
    """Resolve ``VALIDATION_INPUTS`` on a ServerArgs that ``resolve_once``
    resolved for ``--model-path dummy``, before ``check_server_args``."""
    serving = importlib.import_module("sglang.srt.arg_groups.serving_hook")
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    run_hook = importlib.import_module("sglang.srt.arg_groups.resolution_hooks").run_hook
    probe_device = serving.get_device
    serving.get_device = lambda *_a, **_k: "cuda"  # device-probe
    state = random.getstate()
    try:
        run_hook(serving.handle_missing_default_values, server_args)  # missing-defaults
    finally:
        serving.get_device = probe_device
        random.setstate(state)
    overrides.run_post_process_pass(server_args, overrides._page_size_default)  # page-size
    if overrides.resolving_view(server_args).chunked_prefill_size is None:  # chunked-prefill-size
        overrides.declare_resolution(server_args, "cgsim: handle_gpu_memory_settings on an 80-141 GB GPU",
                                     chunked_prefill_size=8192)


# --------------------------------------------------------------------------
# What the target needs of a tree
# --------------------------------------------------------------------------

RUNNER = "sglang.srt.model_executor.runner"
DECODE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
PREFILL = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
SETUP = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup"
SIZING = "sglang.srt.model_executor.runner.base_cuda_graph_runner"
BREAKS = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph"

# (module, attribute, what the target does with it)
REQUIRED: tuple[tuple[str, str, str], ...] = (
    (RUNNER, "DecodeCudaGraphRunner", "the decode runner the target drives"),
    (RUNNER, "PrefillCudaGraphRunner", "the prefill runner the target drives"),
    (RUNNER, "ShapeKey", "the key graphs are stored under"),
    (RUNNER, "set_global_graph_memory_pool", "a fresh process's graph pool"),
    ("sglang.srt.model_executor.runner.base_cuda_graph_runner", "get_batch_sizes_to_capture",
     "the decode bs list the runner captures"),
    ("sglang.srt.model_executor.runner.base_cuda_graph_runner", "get_cuda_graph_batch_size_alignment",
     "the batch-size alignment the decode sizing applies, recorded into every trace"),
    ("sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend", "BreakableCudaGraphBackend",
     "the breakable backend"),
    ("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph", "eager_on_graph",
     "attention breaks of breakable graphs"),
    ("sglang.srt.model_executor.runner_utils.capture_mode", "get_is_capture_mode", "capture mode"),
    ("sglang.srt.model_executor.runner_utils.capture_mode", "get_capture_lora_variant",
     "which LoRA variant a capture records"),
    ("sglang.srt.model_executor.cuda_graph_config", "Backend", "the runner backends' names"),
    ("sglang.srt.model_executor.forward_batch_info", "ForwardBatch", "the batches the runners take"),
    ("sglang.srt.model_executor.forward_context", "forward_context", "the eager forward's context"),
    ("sglang.srt.model_executor.model_runner", "ModelRunner", "the model runner the fake one subclasses"),
    ("sglang.srt.model_executor.input_buffers", "_forward_input_buffer_pool", "shared input buffers per process"),
    ("sglang.srt.model_executor.graph_shared_output", "GraphSharedOutput", "the shared output buffer"),
    ("sglang.srt.runtime_context", "get_context", "the published server config"),
    ("sglang.srt.runtime_context", "get_parallel", "per-rank parallel settings"),
    ("sglang.srt.runtime_context", "get_resources", "the process's named streams, reset per scenario"),
    ("sglang.srt.managers.scheduler_components.dp_attn", "_local_decode_cuda_graph_vote",
     "the DP attention graph vote"),
    ("sglang.srt.batch_overlap.two_batch_overlap", "compute_split_seq_index", "the two-batch-overlap split"),
    ("sglang.srt.layers.dp_attention", "_DpGatheredBufferWrapper", "DP attention's gathered buffer"),
)


@dataclass(frozen=True)
class Tree:
    """What the driver reads off the imported sglang (one per process)."""

    version: str
    location: str  # the sglang package's folder
    source: str | None  # CGSIM_SGLANG_SOURCE, when a tree is laid over the install
    mutations: tuple[str, ...]  # CGSIM_SGLANG_MUTATIONS put into the tree (names)
    design: Design
    # cuda_graph_setup.drop_elastic_cuda_graph_state: sglang's own release path.
    release: bool
    # forward_context(ctx, *, forward_batch=...) (0.5.23) or forward_context(ctx).
    forward_context_takes_batch: bool
    # The KV-plan binding ForwardBatch.init_new does: "bind_own_plan" or "rebind_write_loc".
    kv_bind: str | None
    # layers.dp_attention.initialize_dp_attention_flags + init_dp_gathered_buffer (0.5.21+).
    dp_flag_helpers: bool
    # prefill_cuda_graph_runner.get_prefill_num_tokens_to_capture (0.5.22+).
    prefill_token_helper: bool
    # decode_cuda_graph_runner._lora_backend_skips_inactive (0.5.23+).
    nolora_from_backend: bool
    # breakable_cuda_graph.eager_on_graph(enable) is a decorator factory (before
    # 0.5.22); later trees take the function itself (eager_on_graph(fn)).
    eager_break_factory: bool = False
    # base_cuda_graph_runner.get_batch_sizes_to_capture takes gathered_buffer_required
    # (0.5.22+: the decode runner says whether DP gathers); older trees ask the process.
    decode_sizing_takes_gathers: bool = True
    # The names runtime_context's get_parallel().override takes: _parallel_fields()
    # or _PARALLEL_FIELDS, whichever the tree has (None: neither, so unknown).
    parallel_fields: frozenset[str] | None = None

    @property
    def ruleset(self) -> str:
        return self.design.ruleset

    def bind_kv_plan(self, mr: Any, fb: Any) -> None:
        """What ForwardBatch.init_new does with the KV index translator on this
        tree, for a ForwardBatch cgsim builds (``kv_bind``)."""
        if self.kv_bind is not None:
            getattr(mr.kv_index_translator, self.kv_bind)(fb)

    def to_json(self) -> dict:
        out = {"sglang_version": self.version, "sglang_design": self.ruleset}
        if self.source is not None:
            out["sglang_source"] = self.source
        if self.mutations:
            out["sglang_mutations"] = list(self.mutations)
        return out


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def source_root(path: str) -> str:
    """The folder holding the tree's ``sglang`` package: PATH itself or a
    checkout's PATH/python; SglangEnvironmentError naming what is missing."""
    for root in (path, os.path.join(path, "python")):
        if os.path.isfile(os.path.join(root, "sglang", "__init__.py")):
            return os.path.abspath(root)
    raise SglangEnvironmentError(
        f"--sglang-source {path}: no sglang package there (neither {path}/sglang/__init__.py nor "
        f"{path}/python/sglang/__init__.py); give an sglang checkout or an unpacked sglang wheel")


def tree_version(root: str) -> str:
    """The tree's release: its sglang/_version.py (wheels, built checkouts), else
    ``git describe`` of a checkout, else "unknown"."""
    text = ""
    try:
        with open(os.path.join(root, "sglang", "_version.py"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        pass
    m = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", text)
    if m:
        return m.group(1)
    try:
        out = subprocess.run(["git", "-C", root, "describe", "--tags", "--always"], capture_output=True, text=True,
                             timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    m = re.search(r"v?(\d+\.\d+\.\d+\S*)", out)
    return m.group(1) if m else "unknown"


def apply_source() -> str | None:
    """Put CGSIM_SGLANG_SOURCE's sglang in front of the installed one (before
    sglang is first imported); returns its root, or None without one."""
    path = os.environ.get(SOURCE_ENV)
    if not path:
        return None
    root = source_root(path)
    loaded = sys.modules.get("sglang")
    if loaded is not None:
        where = os.path.dirname(os.path.abspath(getattr(loaded, "__file__", "") or ""))
        if where != os.path.join(root, "sglang"):
            raise SglangEnvironmentError(f"--sglang-source {path}: sglang was already imported from {where}; "
                                         "give the source tree before anything imports sglang")
        return root
    if root not in sys.path:
        sys.path.insert(0, root)
    return root


def _has(module: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def _missing_piece() -> str | None:
    for module, name, why in REQUIRED:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and (exc.name == module or module.startswith(exc.name + ".")):
                return f"module {module} ({why}: {name})"
            raise
        if not hasattr(mod, name):
            return f"{module}.{name} ({why})"
    return None


_TREE: Tree | None = None


@contextmanager
def as_on_cpu_host() -> Iterator[None]:
    """sglang imported (and warmed up) as on a machine without a GPU, on a GPU
    host too: at import its modules pick the platform and kernels by
    torch.cuda.is_available() (and query the device, which would start CUDA in
    a process that forks the agreement check's children); the adapter drives
    the CPU choices on either backend, its graphs come from the backend."""
    import torch  # noqa: PLC0415

    available = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        yield
    finally:
        torch.cuda.is_available = available


def probe() -> Tree:
    """Import sglang (the source tree's with CGSIM_SGLANG_SOURCE) and read what
    the driver needs.  Raises SglangEnvironmentError naming a missing piece;
    other import errors propagate (the caller says which)."""
    if _TREE is not None:
        return _TREE
    with warnings.catch_warnings(), as_on_cpu_host():
        # sglang's import warns that CUDA-only quantization kernels are missing on CPU.
        warnings.simplefilter("ignore")
        return _probe()


def _probe() -> Tree:
    global _TREE
    source = apply_source()
    from cgsim.targets.sglang import mutation  # noqa: PLC0415

    mutations = mutation.install_from_environment()  # after the overlay: a mutated line is the tree's
    version = tree_version(source) if source is not None else installed_version()
    if version is None or importlib.util.find_spec("sglang") is None:
        raise SglangEnvironmentError(f"sglang is not installed in this environment; install it with {INSTALL_HINT}")
    design = design_for(version)
    if design is None:
        raise SglangEnvironmentError(
            f"sglang {version} is older than every design cgsim knows (the oldest is {OLDEST}: "
            f"{DESIGNS[0].code.split(':')[0]}); install {OLDEST} or later with {INSTALL_HINT}")
    missing = _missing_piece()
    if missing is not None:
        raise SglangEnvironmentError(
            f"sglang {version} cannot be driven: it lacks {missing}; cgsim drives sglang {OLDEST} and later "
            f"({INSTALL_HINT})")
    import sglang  # noqa: PLC0415

    fc = importlib.import_module("sglang.srt.model_executor.forward_context").forward_context
    model_runner = importlib.import_module("sglang.srt.model_executor.model_runner")
    translator = importlib.import_module("sglang.srt.mem_cache.kv_index_translator") if importlib.util.find_spec(
        "sglang.srt.mem_cache.kv_index_translator") else None
    kv_bind = None
    for name in ("bind_own_plan", "rebind_write_loc"):
        if translator is not None and any(hasattr(c, name) for c in vars(translator).values() if isinstance(c, type)):
            kv_bind = name
            break
    del model_runner
    _TREE = Tree(
        version=version,
        location=os.path.dirname(os.path.abspath(sglang.__file__)),
        source=os.environ.get(SOURCE_ENV) or None,
        mutations=tuple(m.name or m.old.strip() for m in mutations),
        design=design,
        release=_has(SETUP, "drop_elastic_cuda_graph_state"),
        forward_context_takes_batch="forward_batch" in inspect.signature(fc).parameters,
        kv_bind=kv_bind,
        dp_flag_helpers=_has("sglang.srt.layers.dp_attention", "initialize_dp_attention_flags"),
        prefill_token_helper=_has(PREFILL, "get_prefill_num_tokens_to_capture"),
        nolora_from_backend=_has(DECODE, "_lora_backend_skips_inactive"),
        eager_break_factory=_first_param(importlib.import_module(BREAKS).eager_on_graph) == "enable",
        decode_sizing_takes_gathers="gathered_buffer_required" in inspect.signature(
            importlib.import_module(SIZING).get_batch_sizes_to_capture).parameters,
        parallel_fields=_parallel_fields(),
    )
    return _TREE


def _first_param(fn: Any) -> str | None:
    return next(iter(inspect.signature(fn).parameters), None)


def _parallel_fields() -> frozenset[str] | None:
    """The names get_parallel().override takes in this tree (None: unknown)."""
    rc = importlib.import_module("sglang.srt.runtime_context")
    fields = getattr(rc, "_parallel_fields", None)
    if callable(fields):
        return frozenset(fields())
    fields = getattr(rc, "_PARALLEL_FIELDS", None)
    return frozenset(fields) if fields is not None else None


def shared_experts_config() -> type | None:
    """configs.shared_experts.SharedExpertsConfig, which 0.5.23's model runner
    reads off the model (None where the tree has no such config)."""
    try:
        return getattr(importlib.import_module("sglang.srt.configs.shared_experts"), "SharedExpertsConfig", None)
    except ImportError:
        return None


def tree() -> Tree:
    """The probed tree (probe() must have run in this process)."""
    if _TREE is None:
        return probe()
    return _TREE
