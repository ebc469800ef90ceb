"""vLLM's own scheduler (``vllm.v1.core.sched``) on CPU, driven as the
engine core drives it, with a fake model runner.

The scheduler is the class vLLM picks for the launch
(``SchedulerConfig.get_scheduler_cls``: ``AsyncScheduler`` where async
scheduling is on), built from the VllmConfig of the same engine arguments
the CUDA-graph manager is built from (``engine.launch_for``), plus the
settings only the scheduler reads (the KV cache's size, async scheduling).
The loop is ``EngineCore.step`` + ``post_step`` (sync) or
``EngineCore.step_with_batch_queue`` (async, a queue of
``max_concurrent_batches``).  The fake runner returns what the V2 runner
returns: one sampled token per request that finishes its prefill chunk or
decodes, plus the drafts the target accepted, and (sync) after every step
``num_spec_tokens_to_schedule`` drafts for every request of the batch
(``GPUModelRunner.sample_tokens``, ``DraftTokensHandler.get_draft_tokens``).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from cgsim.config import ManagerConfig
from cgsim.targets.base import TargetUnsupported
from cgsim.targets.vllm.compat import Capabilities, require_vllm
from cgsim.targets.vllm.engine import EngineLaunch, engine_config, launch_for, launched
from cgsim.targets.vllm.scheduling.batches import RunnerView, ScheduledBatch
from cgsim.targets.vllm.scheduling.workload import RequestSpec, Workload

__all__ = ["ScheduleRun", "scheduler_launch", "run_scheduler"]

# The toy model's attention layers (cgsim/targets/vllm/toy/dense/config.json:
# 2 layers, 2 KV heads of 64 / 4 dims).
TOY_LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
TOY_KV_HEADS, TOY_HEAD_SIZE = 2, 16
# Token ids of a prompt: above the toy's special tokens, below its vocabulary.
FIRST_TOKEN, VOCAB = 3, 256
SAMPLED_TOKEN = 7
# Blocks when the workload does not size the KV cache: more than any trace fills.
AMPLE_BLOCKS = 1 << 16


@dataclass(frozen=True)
class ScheduleRun:
    """What the scheduler did with a workload: every non-empty batch in
    order, the engine steps it took (idle ones waiting for arrivals
    included), preemptions, finished and unfinished requests, and the
    launch line it ran under."""

    launch: str
    scheduler: str
    batches: tuple[ScheduledBatch, ...]
    steps: int
    preemptions: int
    finished: int
    unfinished: int
    stalled: bool = False  # requests were left that the scheduler would never schedule (a KV cache too small)

    def to_json(self) -> dict:
        return {"launch": self.launch, "scheduler": self.scheduler, "steps": self.steps,
                "preemptions": self.preemptions, "finished": self.finished, "unfinished": self.unfinished,
                "stalled": self.stalled, "batches": [b.to_json() for b in self.batches]}


def scheduler_launch(config: ManagerConfig, workload: Workload) -> EngineLaunch:
    """``config``'s launch with the settings only the scheduler reads."""
    launch = launch_for(config)
    args = dict(launch.args)
    if workload.kv_tokens is not None:
        block_size = engine_config(launch).cache_config.block_size
        args["num_gpu_blocks_override"] = json.dumps(-(-workload.kv_tokens // block_size))
    if workload.async_scheduling is not None:
        args["async_scheduling"] = json.dumps(workload.async_scheduling)
    return dataclasses.replace(launch, args=tuple(sorted(args.items())))


def _kv_cache_config(vc: Any, num_blocks: int) -> Any:
    """One full-attention group over the toy's layers, as
    EngineCore._initialize_kv_caches resolves it for a dense decoder (and as
    vLLM's tests/v1/core/utils.py create_scheduler builds it)."""
    import torch  # noqa: PLC0415

    kvi = importlib.import_module("vllm.v1.kv_cache_interface")
    spec = kvi.FullAttentionSpec(block_size=vc.cache_config.block_size, num_kv_heads=TOY_KV_HEADS,
                                 head_size=TOY_HEAD_SIZE, dtype=torch.bfloat16)
    group = kvi.KVCacheGroupSpec(list(TOY_LAYERS), spec)
    return kvi.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[group])


def block_hasher(vc: Any, hash_block_size: int) -> Any:
    """EngineCore's request block hasher (None without prefix caching)."""
    if not vc.cache_config.enable_prefix_caching:
        return None
    kvu = importlib.import_module("vllm.v1.core.kv_cache_utils")
    hash_fn = importlib.import_module("vllm.utils.hashing").get_hash_fn_by_name(
        vc.cache_config.prefix_caching_hash_algo)
    kvu.init_none_hash(hash_fn)
    extra = (vc.num_hash_lookahead_tokens,) if require_vllm().hasher_lookahead else ()
    return kvu.get_request_block_hasher(hash_block_size, hash_fn, *extra)


def _build(launch: EngineLaunch) -> tuple[Any, Any, int]:
    """(scheduler, block hasher, steps in flight) as EngineCore.__init__ makes them."""
    vc = copy.deepcopy(engine_config(launch))
    kv_blocks = int(vc.cache_config.num_gpu_blocks_override or AMPLE_BLOCKS)
    block_size = vc.cache_config.block_size
    # check_enough_kv_cache_memory: vLLM does not start unless one request of max_model_len fits.
    need = -(-vc.model_config.max_model_len // block_size)
    if kv_blocks < need:
        raise TargetUnsupported(f"a KV cache of {kv_blocks} blocks of {block_size} tokens cannot hold one request of "
                         f"max_model_len {vc.model_config.max_model_len} and vLLM refuses to start with it: give it "
                         f"at least {need * block_size} tokens")
    som = importlib.import_module("vllm.v1.structured_output")
    kv_config = _kv_cache_config(vc, kv_blocks)
    vc.cache_config.num_gpu_blocks = kv_blocks
    with launched(launch):  # the runner choice (use_v2_model_runner) is read here, under the launch's environment
        cls = vc.scheduler_config.get_scheduler_cls()
        scheduler = cls(vllm_config=vc, kv_cache_config=kv_config,
                        structured_output_manager=som.StructuredOutputManager(vc),
                        block_size=block_size, hash_block_size=block_size, log_stats=False)
        # EngineCore's batch queue: as many steps in flight as the config runs concurrently.
        concurrent = vc.scheduler_config.async_scheduling and require_vllm().concurrent_batches
        in_flight = int(vc.max_concurrent_batches) if concurrent else 1
    return scheduler, block_hasher(vc, block_size), in_flight


def _prompt(spec: RequestSpec, index: int, seed: int) -> list[int]:
    shared = [FIRST_TOKEN + (spec.prefix_group * 31 + i) % (VOCAB - FIRST_TOKEN) for i in range(spec.prefix)]
    rng = random.Random(seed * 1_000_003 + index)
    return shared + [rng.randrange(FIRST_TOKEN, VOCAB) for _ in range(spec.prompt_len - spec.prefix)]


def _request(spec: RequestSpec, index: int, seed: int, hasher: Any, lora_enabled: bool) -> Any:
    Request = importlib.import_module("vllm.v1.request").Request  # noqa: N806
    SamplingParams = importlib.import_module("vllm.sampling_params").SamplingParams  # noqa: N806
    lora = None
    if spec.lora and not lora_enabled:
        # v1/engine/input_processor.py refuses it before it reaches the scheduler.
        raise TargetUnsupported(f"request {index} asks for LoRA adapter {spec.lora} but the launch does not enable LoRA: "
                         "give the config a LoRA case above 0 or drop the request's adapter")
    if spec.lora:
        LoRARequest = importlib.import_module("vllm.lora.request").LoRARequest  # noqa: N806
        lora = LoRARequest(lora_name=f"adapter-{spec.lora}", lora_int_id=spec.lora,
                           lora_path=f"/cgsim/adapter-{spec.lora}")  # never loaded: the scheduler reads the id
    params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
    return Request(request_id=f"r{index}", prompt_token_ids=_prompt(spec, index, seed), sampling_params=params,
                   pooling_params=None, arrival_time=float(spec.arrival_step), lora_request=lora,
                   block_hasher=hasher)


class _FakeRunner:
    """The model runner's outputs for a scheduled step, decided when the
    step is scheduled (an async engine schedules the next step first)."""

    def __init__(self, acceptance: float, seed: int, caps: Capabilities):
        self.acceptance = acceptance
        self.rng = random.Random(seed)
        self.output_req_index = caps.output_req_index  # ModelRunnerOutput takes req_id_to_index
        self.spec_tokens_to_schedule = caps.spec_tokens_to_schedule

    def outputs(self, so: Any, requests: dict[str, Any]) -> Any:
        outputs = importlib.import_module("vllm.v1.outputs")
        ids = list(so.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in ids:
            request = requests[rid]
            # A request whose prompt is not computed after this chunk samples nothing.
            if request.is_prefill_chunk:
                sampled.append([])
                continue
            drafts = len(so.scheduled_spec_decode_tokens.get(rid, ()))
            accepted = 0
            while accepted < drafts and self.rng.random() < self.acceptance:
                accepted += 1
            sampled.append([SAMPLED_TOKEN] * (1 + accepted))
        extra = {}
        if self.output_req_index:  # before 0.34
            extra["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
        return outputs.ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **extra)

    def drafts(self, so: Any, num_spec_tokens: int) -> Any:
        """Sync scheduling: the drafts the runner proposes for every request of the step."""
        outputs = importlib.import_module("vllm.v1.outputs")
        k = int(so.num_spec_tokens_to_schedule if self.spec_tokens_to_schedule else num_spec_tokens)
        ids = list(so.num_scheduled_tokens)
        return outputs.DraftTokenIds(ids, [[-1] * k for _ in ids])


def run_scheduler(config: ManagerConfig, workload: Workload) -> ScheduleRun:
    """Schedule ``workload`` with vLLM's scheduler for the launch ``config``
    stands for, until every request finishes (or ``workload.max_steps``)."""
    caps = require_vllm()  # before anything imports vLLM: a source tree is laid over the install first
    launch = scheduler_launch(config, workload)
    scheduler, hasher, queue_size = _build(launch)
    view = RunnerView(config.decode_query_len, caps)
    runner = _FakeRunner(workload.acceptance, workload.seed, caps)
    async_mode = queue_size > 1
    spec_decoding = config.decode_query_len > 1
    arrivals = sorted(enumerate(workload.requests), key=lambda x: (x[1].arrival_step, x[0]))
    pending = deque(arrivals)
    batches: list[ScheduledBatch] = []
    queue: deque = deque()
    preemptions = finished = idle = 0
    step = 0
    lora_enabled = max(config.lora_cases) > 0
    stalled = False
    while step < workload.max_steps and (pending or scheduler.has_requests() or queue):
        while pending and pending[0][1].arrival_step <= step:
            index, spec = pending.popleft()
            scheduler.add_request(_request(spec, index, workload.seed, hasher, lora_enabled))
        step += 1
        if not scheduler.has_requests() and not queue:
            continue  # idle until the next arrival
        if scheduler.has_requests():
            so = scheduler.schedule()
            preemptions += len(so.preempted_req_ids)
            batch = view.receive(step, so)
            if batch is not None:
                batches.append(batch)
            # Nothing scheduled, nothing in flight, nothing to arrive: it never will be.
            idle = idle + 1 if batch is None and not pending and not any(q.num_scheduled_tokens for q, _ in queue) else 0
            if idle > queue_size:
                stalled = True
                break
            queue.appendleft((so, runner.outputs(so, scheduler.requests)))
            executed = so.total_num_scheduled_tokens > 0
            if async_mode and len(queue) < queue_size and (executed or scheduler.has_requests()):
                continue
        done, output = queue.pop()
        for engine_outputs in scheduler.update_from_output(done, output).values():
            finished += sum(1 for o in engine_outputs.outputs if o.finished)
        if not async_mode and spec_decoding and done.total_num_scheduled_tokens > 0:
            scheduler.update_draft_token_ids(runner.drafts(done, config.decode_query_len - 1))
    return ScheduleRun(launch.line(), type(scheduler).__name__, tuple(batches), step, preemptions, finished,
                       scheduler.get_num_unfinished_requests(), stalled)
