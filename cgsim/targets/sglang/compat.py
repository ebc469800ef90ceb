"""What differs between the sglang trees cgsim drives, read off the imported
code, and the one-line refusal of a tree it cannot drive.

``probe`` looks at the imported sglang: the runners and helpers the target
needs (``REQUIRED``: a tree that lacks one is exit 2 naming the piece), and
what the releases do differently where the driver must follow (the release
path, ``forward_context``'s keywords, how a forward batch binds its KV plan,
the DP attention set-up, the prefill token alignment helper, the LoRA
hooks).  ``DESIGNS`` keeps only what introspection cannot see: which design
(cgsim ruleset) a release follows, each row naming the release and the sglang
code it comes from.

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

__all__ = ["SglangEnvironmentError", "SglangAdapterError", "Design", "DESIGNS", "Tree", "REQUIRED", "SOURCE_ENV", "SOURCE_OPTION",
           "as_on_cpu_host", "INSTALL_HINT", "installed_version", "version_key", "design_for", "probe", "tree", "source_root",
           "apply_source", "tree_version"]

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
# What the target needs of a tree
# --------------------------------------------------------------------------

RUNNER = "sglang.srt.model_executor.runner"
DECODE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
PREFILL = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
SETUP = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup"

# (module, attribute, what the target does with it)
REQUIRED: tuple[tuple[str, str, str], ...] = (
    (RUNNER, "DecodeCudaGraphRunner", "the decode runner the target drives"),
    (RUNNER, "PrefillCudaGraphRunner", "the prefill runner the target drives"),
    (RUNNER, "ShapeKey", "the key graphs are stored under"),
    (RUNNER, "set_global_graph_memory_pool", "a fresh process's graph pool"),
    ("sglang.srt.model_executor.runner.base_cuda_graph_runner", "get_batch_sizes_to_capture",
     "the decode bs list the runner captures"),
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
    )
    return _TREE


def tree() -> Tree:
    """The probed tree (probe() must have run in this process)."""
    if _TREE is None:
        return probe()
    return _TREE
