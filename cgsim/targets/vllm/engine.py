"""vLLM's front door: a config as the engine arguments and environment a user
types, the VllmConfig vLLM's own ``EngineArgs.create_engine_config`` builds
from them, and the manager config the model runner hands its CUDA-graph
manager from that VllmConfig.

A cgsim ``ManagerConfig`` stands for a ``vllm serve`` launch
(``launch_for``).  vLLM validates it (``engine_config``): what it refuses, or
sends to another model runner, is not reachable (``EngineRefused``, never
judged).  What it accepts is read back the way the runner reads it
(``manager_config``), so a campaign judges the config vLLM builds, not the one
drawn (``reach``).  The model is cgsim's toy, registered with vLLM's model
registry under architectures of its own (a dense decoder, and a MoE one for
elastic expert parallelism); the launch line names a public checkpoint of the
same family, since no capture or dispatch decision reads the weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import os
import shlex
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

from cgsim.config import ManagerConfig
from cgsim.modes import AttentionSupport, CUDAGraphMode
from cgsim.spec.vllm_options import VllmOptions, decode_sizes_of
from cgsim.targets.base import TargetUnsupported
from cgsim.targets.vllm.compat import (
    LORA_UTILS,
    builds_ubatch_runner,
    has_dflash_query_graphs,
    require_vllm,
    worker_config,
)
from cgsim.text import first_line

__all__ = ["EngineLaunch", "EngineRefused", "launch_for", "engine_config", "manager_config", "reach", "check_reached",
           "check_launch",
           "token_sizes", "default_capture_sizes", "takes_dynamic_schedule", "runs_v2_runner", "launched",
           "v2_runner_env", "with_dflash_draft", "drafts_with_dflash", "served_with_dflash", "TOY_ROOT", "CHECKPOINTS"]

DENSE, MOE, VISION = "dense", "moe", "vision"
TOY_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy")
TOY_ARCHITECTURES = {DENSE: "CgsimToyForCausalLM", MOE: "CgsimToyMoeForCausalLM"}
# The checkpoints a launch line names: public models of the toy's families.
# (The vision toy is registered by encoder_engine.py, the encoder graphs' front door.)
CHECKPOINTS = {DENSE: "meta-llama/Llama-3.1-8B-Instruct", MOE: "mistralai/Mixtral-8x7B-Instruct-v0.1",
               VISION: "Qwen/Qwen2.5-VL-7B-Instruct"}
DRAFT_CHECKPOINT = "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"
# DFlash's draft (a Qwen3-style block-diffusion head over the target's hidden states): its own toy
# folder and architecture, named so vLLM's EAGLEConfig keeps the name (it prefixes "DFlash" otherwise).
DFLASH = "dflash"
DFLASH_ARCHITECTURE = "CgsimToyDFlash"
DFLASH_CHECKPOINT = "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"
# The attention backend whose metadata builder declares each support level on
# a Hopper GPU (v1/attention/backends: FA3 ALWAYS, FA2 UNIFORM_BATCH, FlashInfer
# without TRTLLM decode UNIFORM_SINGLE_TOKEN_DECODE); none of a dense decoder's
# declares NEVER.
ATTENTION_BACKENDS: dict[AttentionSupport, tuple[str, dict] | None] = {
    AttentionSupport.ALWAYS: ("FLASH_ATTN", {}),
    AttentionSupport.UNIFORM_BATCH: ("FLASH_ATTN", {"flash_attn_version": 2}),
    AttentionSupport.UNIFORM_SINGLE_TOKEN_DECODE: ("FLASHINFER", {}),
    AttentionSupport.NEVER: None,
}
MAX_MODEL_LEN = 4096
MIN_BATCHED_TOKENS = 2048
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
BREAKABLE_ENV = "VLLM_USE_BREAKABLE_CUDAGRAPH"


class EngineRefused(TargetUnsupported):
    """vLLM's own config path refuses the launch, or builds another manager
    config from it: not reachable from settings a user can type."""


@dataclass(frozen=True)
class EngineLaunch:
    """``vllm serve CHECKPOINT`` with engine arguments and environment.

    ``args``: (EngineArgs field, JSON text of its value), sorted; ``env``:
    (variable, value).  ``attention``: the backend the line names for the
    declared attention support (None: no backend of this model declares it)."""

    model: str
    args: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    attention: tuple[str, str] | None = None  # (backend, JSON of its attention config)

    @classmethod
    def of(cls, model: str, args: dict[str, Any], env: dict[str, str],
           attention: tuple[str, dict] | None = None) -> "EngineLaunch":
        """A launch from plain values (a finding's recorded ``launch``, say)."""
        return cls(model, tuple(sorted((k, _text(v)) for k, v in args.items())), tuple(sorted(env.items())),
                   None if attention is None else (attention[0], _text(attention[1])))

    def kwargs(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self.args}

    @property
    def data_parallel_size(self) -> int:
        """Its --data-parallel-size (1 where it names none)."""
        return int(self.kwargs().get("data_parallel_size") or 1)

    def line(self) -> str:
        """The command line, as a user would type it."""
        parts = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        parts += ["vllm", "serve", CHECKPOINTS[self.model]]
        for name, text in self.args:
            value = json.loads(text)
            flag = "--" + name.replace("_", "-")
            if value is True:
                parts.append(flag)
            elif value is False:  # argparse's BooleanOptionalAction, as vLLM's CLI declares its switches
                parts.append("--no-" + name.replace("_", "-"))
            elif isinstance(value, (dict, list)):
                parts += [flag, shlex.quote(json.dumps(_public(name, value), separators=(",", ":")))]
            else:
                parts += [flag, shlex.quote(str(value))]
        if self.attention is not None:
            backend, config = self.attention
            parts += ["--attention-backend", backend]
            if json.loads(config):
                parts += ["--attention-config", shlex.quote(config)]
        return " ".join(parts)

    def to_json(self) -> dict:
        return {"engine": "vllm", "checkpoint": CHECKPOINTS[self.model], "toy_model": self.model,
                "args": self.kwargs(), "env": dict(self.env),
                "attention_backend": self.attention[0] if self.attention else None, "line": self.line()}


def _public(name: str, value: Any) -> Any:
    """The speculative config names the public draft checkpoint, not the toy's folder."""
    if name == "speculative_config" and isinstance(value, dict) and "model" in value:
        return {**value, "model": DFLASH_CHECKPOINT if value.get("method") == DFLASH else DRAFT_CHECKPOINT}
    return value


def with_dflash_draft(launch: EngineLaunch) -> EngineLaunch:
    """``launch`` with its speculative config's EAGLE draft replaced by the
    toy DFlash draft (``method: "dflash"``, the same number of drafts)."""
    args = launch.kwargs()
    spec = args.get("speculative_config")
    if not isinstance(spec, dict):
        raise ValueError("a DFlash launch needs a launch with a speculative config")
    args["speculative_config"] = {**spec, "method": DFLASH, "model": os.path.join(TOY_ROOT, DFLASH)}
    attention = None if launch.attention is None else (launch.attention[0], json.loads(launch.attention[1]))
    return EngineLaunch.of(launch.model, args, dict(launch.env), attention)


def drafts_with_dflash(launch: EngineLaunch) -> bool:
    """Whether ``launch``'s speculative config names the DFlash method."""
    spec = launch.kwargs().get("speculative_config")
    return isinstance(spec, dict) and spec.get("method") == DFLASH


def served_with_dflash(config: ManagerConfig) -> bool:
    """Whether the runner share serves ``config``'s speculative launch with
    the toy DFlash draft in place of EAGLE (``with_dflash_draft``): one plain
    speculative config in two (no per-batch-size schedule, adaptive
    verification, LoRA or micro-batching, none of which DFlash launches were
    checked with), chosen by its settings so a replay serves the same launch,
    where this tree's runner has DFlash query graphs."""
    plain = (config.decode_query_len > 1 and config.spec_schedule is None and not config.varlen_decode
             and max(config.lora_cases) == 0 and config.num_ubatches == 1)
    if not plain or zlib.crc32(_text(config.to_json()).encode()) % 2:
        return False
    return has_dflash_query_graphs()


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def lora_settings(cases: tuple[int, ...]) -> tuple[int, bool] | None:
    """(max_loras, specialize_active_lora) for a config's LoRA capture cases:
    vLLM captures [0, max_loras + 1], or with specialize_active_lora the
    powers of two up to max_loras and max_loras + 1
    (lora/utils.py get_captured_lora_counts); None without LoRA."""
    top = max(cases)
    if top == 0:
        return None
    return max(top - 1, 1), len(cases) > 2


def launch_for(config: ManagerConfig, release: bool = False) -> EngineLaunch:
    """What a user types for ``config`` (``release``: graphs are released
    and captured again, which only elastic expert parallelism does)."""
    size = int(config.max_capture_size or max(config.capture_sizes))
    q = config.decode_query_len
    compilation: dict[str, Any] = {"cudagraph_mode": config.mode.value}
    decode_sizes = decode_sizes_of(config)
    if decode_sizes is None:
        compilation.update(cudagraph_capture_sizes=sorted(config.capture_sizes), max_cudagraph_capture_size=size)
    else:  # 0.34+: token sizes of prefill graphs, request counts of decode graphs
        compilation.update(prefill_cudagraph_capture_token_sizes=sorted(config.capture_sizes),
                           decode_cudagraph_capture_request_sizes=sorted(decode_sizes))
    if not config.compiled_piecewise:
        compilation["mode"] = 0  # CompilationMode.NONE: no torch.compile pieces
    if not config.attention_split:
        compilation["splitting_ops"] = []
    args: dict[str, Any] = {
        "max_num_seqs": config.max_num_reqs,
        "max_num_batched_tokens": max(MIN_BATCHED_TOKENS, size, config.max_num_reqs * q),
        "max_model_len": MAX_MODEL_LEN,
        "compilation_config": compilation,
    }
    if q > 1:
        spec: dict[str, Any] = {"method": "eagle", "model": os.path.join(TOY_ROOT, DENSE),
                                "num_speculative_tokens": q - 1}
        if config.spec_schedule is not None:
            spec["num_speculative_tokens_per_batch_size"] = [list(e) for e in config.spec_schedule]
        if config.varlen_decode:
            spec["enable_adaptive_verification"] = True
        args["speculative_config"] = spec
    lora = lora_settings(config.lora_cases)
    if lora is not None:
        args["enable_lora"] = True
        args["max_loras"] = lora[0]
        if lora[1]:
            args["specialize_active_lora"] = True
    if config.num_ubatches > 1:
        if config.num_ubatches == 2:
            args["enable_dbo"] = True
        else:
            args["ubatch_size"] = config.num_ubatches
        args["dbo_decode_token_threshold"] = config.ubatch_threshold
        args["dbo_prefill_token_threshold"] = config.ubatch_threshold
        args["all2all_backend"] = "deepep_low_latency"  # the micro-batching all2all backends
    model = DENSE
    if config.num_ubatches > 1 or release:
        # Micro-batches need a second data-parallel rank (ubatch_utils.py maybe_build_ubatch_runner), and
        # only a MoE model's ranks stay one engine (v1/engine/core.py: a dense model's run independently).
        model = MOE
        args.update(enable_expert_parallel=True, data_parallel_size=2)
    if release:
        args.update(enable_eplb=True, enable_elastic_ep=True, eplb_config={"use_async": False})
    env = v2_runner_env()
    if config.breakable:
        env[BREAKABLE_ENV] = "1"
    return EngineLaunch.of(model, args, env, ATTENTION_BACKENDS[config.attention_support])


def v2_runner_env() -> dict[str, str]:
    """The environment a launch sets for the V2 model runner (whose managers
    cgsim drives): nothing where the tree has no other runner.  Trees with
    the V1 GPU model runner pick a runner per config, and the V2 one is asked
    for with VLLM_USE_V2_MODEL_RUNNER=1; 0.34 removed V1 (and warns that the
    variable is redundant)."""
    return {V2_RUNNER_ENV: "1"} if require_vllm().v1_runner else {}


# --------------------------------------------------------------------------
# vLLM builds the config
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def register_toy_models() -> None:
    """cgsim's toy architectures in vLLM's model registry (in-process, so
    vLLM inspects them without its model-inspection subprocess)."""
    import torch  # noqa: PLC0415

    registry = importlib.import_module("vllm.model_executor.models.registry").ModelRegistry
    interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
    bases = (torch.nn.Module, interfaces.SupportsLoRA)

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("cgsim's toy architectures are never loaded: the target runs its own toy model")

    namespace = {
        "packed_modules_mapping": {}, "embedding_modules": {},
        "__init__": lambda self, *, vllm_config=None, prefix="": torch.nn.Module.__init__(self),
        "forward": lambda self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None: refuse(),
        "embed_input_ids": lambda self, input_ids: refuse(),
        "get_input_embeddings": lambda self, input_ids: refuse(),
        "compute_logits": lambda self, hidden_states: refuse(),
    }
    for arch in (*TOY_ARCHITECTURES.values(), "Eagle" + TOY_ARCHITECTURES[DENSE], DFLASH_ARCHITECTURE):
        if arch not in registry.get_supported_archs():
            registry.register_model(arch, type(arch, bases, dict(namespace)))


@contextlib.contextmanager
def _launch_environment(launch: EngineLaunch) -> Iterator[None]:
    """The launch's environment for the duration, with vLLM quiet: it
    configures its loggers anew while it builds a config, so a level set on
    "vllm" does not hold (nothing below ERROR meanwhile, from any logger)."""
    from cgsim.targets.vllm.compat import clear_envs_cache, warnings_off  # noqa: PLC0415

    saved = {k: os.environ.get(k) for k in (V2_RUNNER_ENV, BREAKABLE_ENV)}
    wanted = dict(launch.env)
    try:
        for k in saved:
            if k in wanted:
                os.environ[k] = wanted[k]
            else:
                os.environ.pop(k, None)
        clear_envs_cache()
        with warnings_off():
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        clear_envs_cache()


@contextlib.contextmanager
def _device_has_triton() -> Iterator[None]:
    """The device cgsim presents has Triton (every CUDA GPU vLLM supports
    does): vLLM's V2-runner routing reads HAS_TRITON (config/vllm.py 0.22-0.33),
    which on a CPU host without triton-cpu is False."""
    mod = importlib.import_module("vllm.config.vllm")
    if not require_vllm().config_has_triton or mod.HAS_TRITON:
        yield
        return
    mod.HAS_TRITON = True
    try:
        yield
    finally:
        mod.HAS_TRITON = False


_REFUSALS = (ValueError, AssertionError, NotImplementedError, TypeError)


@functools.lru_cache(maxsize=512)
def engine_config(launch: EngineLaunch) -> Any:
    """The VllmConfig vLLM builds from ``launch`` (EngineRefused: refused)."""
    require_vllm()
    register_toy_models()
    arg_utils = importlib.import_module("vllm.engine.arg_utils")
    kwargs = launch.kwargs()
    with _launch_environment(launch), _device_has_triton():
        try:
            args = arg_utils.EngineArgs(model=os.path.join(TOY_ROOT, launch.model), skip_tokenizer_init=True,
                                        load_format="dummy", **kwargs)
            return args.create_engine_config()
        except _REFUSALS as exc:
            raise EngineRefused(f"vLLM refuses these engine arguments: {_reason(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - before the manager: the install or the platform, never a finding
            from cgsim.targets.vllm.compat import VllmEnvironmentError  # noqa: PLC0415

            raise VllmEnvironmentError(
                f"vLLM's config path failed here ({type(exc).__name__}: {first_line(exc, 200)}), before any "
                "CUDA-graph code ran: the install or cgsim's platform, not the manager") from None


def _reason(exc: BaseException) -> str:
    """vLLM's own words: pydantic wraps them in 'Value error, ... [type=...'."""
    text = " ".join(str(exc).split())
    for marker in ("Value error, ", "Assertion failed, "):
        if marker in text:
            text = text.split(marker, 1)[1]
    return first_line(text.split(" [type=")[0], 300)


# --------------------------------------------------------------------------
# What the model runner hands the manager
# --------------------------------------------------------------------------


def manager_config(vc: Any, requested: ManagerConfig) -> ManagerConfig:
    """The manager config the runner builds from ``vc``: mode, capture sizes,
    request limit, speculative schedule, LoRA capture cases
    (v1/worker/gpu/lora_utils.py get_lora_capture_cases), micro-batching and
    how piecewise graphs are made, read off vLLM's config.  What the config
    path does not decide (the attention backend's support level) is
    ``requested``'s."""
    caps = require_vllm()
    cc, pc, sc = vc.compilation_config, vc.parallel_config, vc.speculative_config
    mode = CUDAGraphMode.parse(cc.cudagraph_mode.name)
    changes: dict[str, Any] = {"mode": mode, "max_num_reqs": int(vc.scheduler_config.max_num_seqs)}
    options: tuple[Any, ...] = ()
    if mode != CUDAGraphMode.NONE and (cc.cudagraph_capture_sizes or _prefill_token_sizes(cc) is not None):
        changes["capture_sizes"], changes["max_capture_size"] = token_sizes(cc, requested.capture_sizes)
        if caps.split_capture_sizes:  # 0.34+: decode graphs by request count
            options = (VllmOptions(decode_sizes=tuple(sorted(cc.decode_cudagraph_capture_request_sizes or ()))),)
    k = int(sc.num_speculative_tokens) if sc is not None else 0
    changes["decode_query_len"] = 1 + k
    schedule = sc.num_speculative_tokens_per_batch_size if sc is not None and caps.spec_schedule_config else None
    changes["spec_schedule"] = tuple(tuple(int(x) for x in e) for e in schedule) if schedule else None
    changes["varlen_decode"] = bool(sc is not None and caps.spec_adaptive_config and sc.enable_adaptive_verification)
    changes["lora_cases"] = _lora_cases(vc, requested)
    use_ubatching = bool(pc.use_ubatching or pc.enable_dbo)
    runner_builds = builds_ubatch_runner(worker_config(vc))
    if runner_builds is not None:  # the runner's own decision, on the config its engine core hands it
        use_ubatching = runner_builds
    changes["num_ubatches"] = int(pc.num_ubatches) if use_ubatching else 1
    if use_ubatching:
        changes["ubatch_threshold"] = int(pc.dbo_decode_token_threshold)
    changes["attention_split"] = bool(cc.splitting_ops_contain_attention())
    vllm_compile = importlib.import_module("vllm.config.compilation").CompilationMode.VLLM_COMPILE
    changes["compiled_piecewise"] = cc.mode == vllm_compile
    return dataclasses.replace(requested, **changes).with_options(*options)


def token_sizes(cc: Any, fallback: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """(token sizes of the token-keyed graphs, the most tokens a graph holds)
    as the manager reads them: 0.34+ keys prefill graphs by
    prefill_cudagraph_capture_token_sizes and records the largest of every
    graph's tokens, which for FULL_DECODE_ONLY (no prefill graphs) may lie
    below the prefill sizes: those are then cut to it (they size nothing)."""
    split = _prefill_token_sizes(cc)
    sizes = tuple(sorted((split if split is not None else cc.cudagraph_capture_sizes) or fallback))
    top = int(cc.max_cudagraph_capture_size or max(sizes))
    if max(sizes) > top:
        sizes = tuple(s for s in sizes if s <= top) or (top,)
    return sizes, top


def _prefill_token_sizes(cc: Any) -> Any:
    """The token sizes of 0.34+'s prefill graphs (None: not split, or not set)."""
    return cc.prefill_cudagraph_capture_token_sizes if require_vllm().split_capture_sizes else None


def _lora_cases(vc: Any, requested: ManagerConfig) -> tuple[int, ...]:
    if vc.lora_config is None:
        return (0,)
    if not require_vllm().runner_lora_cases:
        # Trees before get_lora_capture_cases: the runner's list as the launch asked for it.
        return requested.lora_cases
    fn = importlib.import_module(LORA_UTILS).get_lora_capture_cases
    return tuple(sorted(set(fn(vc.lora_config, vc.compilation_config))))


# The fields a manager's behaviour depends on, compared after each side's mode
# resolution: two configs equal on these build the same manager.
def _projection(config: ManagerConfig) -> tuple:
    from cgsim.spec.candidates import resolved_mode  # noqa: PLC0415

    try:
        mode: Any = resolved_mode(config)
    except ValueError as exc:
        mode = f"unresolvable: {exc}"
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    # The decode sizes beside the shared fields; other engines' options stay as they are.
    fields["engine_options"] = tuple(o for o in config.engine_options if not isinstance(o, VllmOptions))
    fields["decode_sizes"] = decode_sizes_of(config)
    fields.pop("mode")
    # What these two decide is in the resolved mode (breakable graphs leave the
    # splitting ops empty in vLLM's config, and break at attention themselves).
    fields.pop("compiled_piecewise")
    fields.pop("attention_split")
    if mode == CUDAGraphMode.NONE:  # nothing is captured: no size matters
        for name in ("capture_sizes", "max_capture_size", "decode_sizes"):
            fields.pop(name)
    if config.num_ubatches == 1:
        fields.pop("ubatch_threshold")
    if fields.get("decode_sizes") is None:
        fields.pop("decode_sizes", None)
    return (mode, tuple(sorted(fields.items(), key=lambda kv: kv[0])))


@functools.lru_cache(maxsize=4096)
def reach(config: ManagerConfig, release: bool = False) -> ManagerConfig:
    """The manager config vLLM builds from the launch ``config`` stands for
    (EngineRefused: vLLM refuses it)."""
    return manager_config(engine_config(launch_for(config, release)), config)


def check_reached(config: ManagerConfig, release: bool = False) -> Any:
    """The VllmConfig of ``config``'s launch, where vLLM builds ``config``'s
    manager from it; EngineRefused naming the difference where it builds
    another one."""
    return _built_as_asked(engine_config(launch_for(config, release)), reach(config, release), config)


def check_launch(launch: EngineLaunch, config: ManagerConfig) -> Any:
    """The VllmConfig of ``launch`` (a finding's recorded one, say), where
    vLLM builds ``config``'s manager from it; EngineRefused naming the
    difference where it builds another one."""
    vc = engine_config(launch)
    return _built_as_asked(vc, manager_config(vc, config), config)


def _built_as_asked(vc: Any, reached: ManagerConfig, config: ManagerConfig) -> Any:
    from cgsim.spec.rulesets import RulesetRejects, get_ruleset  # noqa: PLC0415

    design = get_ruleset(require_vllm().ruleset)
    try:
        # Both as the design sees them (the runner's adaptive-verification
        # route, rounded sizes, decode sizes derived from the capture sizes).
        expected, built = design.effective_config(config), design.effective_config(reached)
    except RulesetRejects as exc:
        raise EngineRefused(f"not reachable: {exc}") from None
    if _projection(built) != _projection(expected):
        raise EngineRefused(f"not reachable: from these engine arguments vLLM builds {_difference(expected, built)}"
                            + _why_no_ubatches(vc, expected, built))
    return vc


def _why_no_ubatches(vc: Any, expected: ManagerConfig, built: ManagerConfig) -> str:
    """vLLM's reason where the launch asks for micro-batching its runner does not build."""
    if expected.num_ubatches == 1 or built.num_ubatches != 1 or not vc.parallel_config.use_ubatching:
        return ""
    return ("; the model runner builds no micro-batch runner for it (v1/worker/gpu/ubatch_utils.py "
            "maybe_build_ubatch_runner: micro-batching needs the data-parallel handshake, so more than one "
            "data-parallel rank of one engine, which a dense model's ranks are not: v1/engine/core.py)")


def _difference(config: ManagerConfig, reached: ManagerConfig) -> str:
    a, b = config.to_json(), reached.to_json()
    diff = [f"{k}={b.get(k)!r} (not {a.get(k)!r})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return ", ".join(diff) if diff else "a manager that resolves to another mode"


@functools.lru_cache(maxsize=256)
def default_capture_sizes(max_num_seqs: int, decode_query_len: int, spec_schedule: tuple | None) -> tuple[int, ...]:
    """The capture sizes vLLM picks when the launch names none
    (VllmConfig._set_cudagraph_sizes, through the front door)."""
    base = ManagerConfig(capture_sizes=(1,), max_num_reqs=max_num_seqs, decode_query_len=decode_query_len,
                         spec_schedule=spec_schedule)
    launch = launch_for(base)
    args = launch.kwargs()
    for name in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
        args["compilation_config"].pop(name)
    args["max_num_batched_tokens"] = 8192
    vc = engine_config(EngineLaunch.of(launch.model, args, dict(launch.env)))
    cc = vc.compilation_config
    split = _prefill_token_sizes(cc)
    return tuple(sorted(split if split is not None else cc.cudagraph_capture_sizes))


@functools.lru_cache(maxsize=1)
def takes_dynamic_schedule() -> bool:
    """Whether vLLM's config path takes num_speculative_tokens_per_batch_size
    (dynamic speculative decoding): a launch with one, built by vLLM."""
    config = ManagerConfig(capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3,
                           spec_schedule=((1, 2, 2), (3, 4, 1)))
    try:
        engine_config(launch_for(config))
    except EngineRefused:
        return False
    return True


def runs_v2_runner(launch: EngineLaunch) -> bool:
    """Whether vLLM runs ``launch`` on the V2 model runner (whose manager
    cgsim drives): its own routing (VllmConfig.use_v2_model_runner) under the
    launch's environment; trees without the V1 runner have no other, and
    trees without the routing (before 0.22) run V2 only when the variable says so."""
    vc = engine_config(launch)
    caps = require_vllm()
    if not caps.v2_runner_route:
        return not caps.v1_runner or dict(launch.env).get(V2_RUNNER_ENV) == "1"
    with _launch_environment(launch), _device_has_triton():
        return bool(vc.use_v2_model_runner)


@contextlib.contextmanager
def launched(launch: EngineLaunch) -> Iterator[None]:
    """The process as ``launch`` starts vLLM: its environment, and the
    device's Triton (what vLLM's runner routing reads)."""
    with _launch_environment(launch), _device_has_triton():
        yield
