"""Served scenarios through vLLM's own model runner, end to end.

For a launch, ``serve_runner`` builds the runner as ``runner_build`` does
(in a fresh child process), captures through ``capture_model()``, then runs
requests as the engine core does: vLLM's own scheduler (the class the launch
picks) schedules them, the runner's ``execute_model`` and ``sample_tokens``
run each step (input preparation, padding, dispatch, replay or the eager
forward are vLLM's), and the scheduler takes the output
(``update_from_output``).  What comes back (``ServedRun``) is what a user
sees: each request's tokens and their log-probabilities, and how many graph
replays ran.

``graphs_equal_eager`` is the property (SERVED-EQUALS-EAGER, its rule in
``cgsim.properties.lifecycle``): the same requests on the same launch with
CUDA graphs off (``cudagraph_mode`` NONE, vLLM's eager path) give the same
tokens, and log-probabilities within bf16 noise.  A replay that reads
a stale buffer, a padded row's wrong value or metadata the graph did not
keep shows here as other tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator

from cgsim.targets.vllm.compat import dummy_weight_initializers, runner_hands_draft_tokens
from cgsim.targets.vllm.engine import EngineLaunch
from cgsim.targets.vllm.scheduling.driver import FIRST_TOKEN, VOCAB

__all__ = ["ServedRequest", "ServedRun", "serve_runner", "serve_here", "eager_twin", "graphs_equal_eager",
           "default_requests", "serve_pair", "served_consequence", "serve_confirmed", "serve_scenarios",
           "serve_dp_runners", "serve_ranks", "rank_requests"]


@dataclass(frozen=True)
class ServedRequest:
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_step: int = 0


def default_requests(n: int = 4, seed: int = 0) -> tuple[ServedRequest, ...]:
    """``n`` requests of different prompt lengths and output lengths, the
    second half arriving two steps after the first: the decode batch grows
    with a prefill beside it, then shrinks one request at a time, so a
    launch's graphs are replayed for several batch sizes, padded and not."""
    return tuple(ServedRequest(tuple(FIRST_TOKEN + (seed * 31 + 7 * i + 3 * j) % (VOCAB - FIRST_TOKEN)
                                     for j in range(4 + 3 * i)), 3 + 2 * i, 0 if 2 * i < n else 2)
                 for i in range(n))


@dataclass(frozen=True)
class ServedRun:
    """What the user of one served launch sees: per request, its tokens and
    their log-probabilities, how many tokens each step gave it (more than
    one: drafts accepted) and, with speculative decoding, the drafts the
    runner proposed for it each step; the steps, the graph replays, and what
    vLLM raised (None: nothing)."""

    vllm_version: str
    launch_line: str
    tokens: dict[str, list[int]]
    logprobs: dict[str, list[float]]
    steps: int
    replays: int
    raised: str | None = None
    seconds: float = 0.0
    per_step: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    drafts: dict[str, list[list[int]]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "ServedRun":
        return cls(**d)


def eager_twin(launch: EngineLaunch) -> EngineLaunch:
    """The same launch with CUDA graphs off (vLLM's eager path)."""
    args = launch.kwargs()
    compilation = dict(args.get("compilation_config") or {})
    compilation["cudagraph_mode"] = "NONE"
    for key in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
        compilation.pop(key, None)
    args["compilation_config"] = compilation
    attention = None if launch.attention is None else (launch.attention[0], json.loads(launch.attention[1]))
    return EngineLaunch.of(launch.model, args, dict(launch.env), attention)


def graphs_equal_eager(graphs: ServedRun, eager: ServedRun) -> list[str]:
    """Where the graph run differs from the eager one ([]: nowhere), by
    SERVED-EQUALS-EAGER's rule (``cgsim.properties.lifecycle``)."""
    from cgsim.properties.lifecycle import served_violations  # noqa: PLC0415

    return [v.message for v in served_violations(graphs.to_json(), eager.to_json())]


def serve_pair(launch: EngineLaunch, timeout_s: float) -> dict:
    """``default_requests`` served on ``launch`` with its graphs and eager,
    within ``timeout_s``: ``graphs`` and ``eager`` (``ServedRun.to_json``)
    and the ``launch`` served (``EngineLaunch.to_json``), or ``error``: why
    it could not be served here (the environment's, or vLLM refused); None
    where ``timeout_s`` ran out first (left unserved).  A data-parallel
    launch is served on all its ranks (``serve_ranks``), one run of them all."""
    from cgsim.targets.vllm.compat import RunnerTimedOut, VllmEnvironmentError  # noqa: PLC0415
    from cgsim.targets.vllm.engine import EngineRefused  # noqa: PLC0415

    requests = default_requests()
    serve = serve_ranks if launch.data_parallel_size > 1 else serve_runner
    started = time.monotonic()
    deadline = started + timeout_s
    try:
        graphs = serve(launch, requests, timeout_s)
        eager = serve(eager_twin(launch), requests, max(1.0, deadline - time.monotonic()))
    except RunnerTimedOut:
        return None  # the time given ran out, as for a launch never started
    except (EngineRefused, VllmEnvironmentError) as exc:
        return {"error": str(exc).splitlines()[0][:300]}
    served = sum(map(len, rank_requests(requests, launch.data_parallel_size)))
    return {"launch_line": launch.line(), "launch": launch.to_json(), "requests": served,
            "graphs": graphs.to_json(), "eager": eager.to_json(), "seconds": round(time.monotonic() - started, 1)}


def served_consequence(launch: EngineLaunch, timeout_s: float) -> dict | None:
    """What a user of ``launch`` sees when serving (``serve_pair``, in
    ``cgsim.served.consequence``'s words): ``differences`` ([]: the same
    tokens), what vLLM raised with graphs (``raised``) and eager
    (``eager_raised``); or ``error``: why it could not be served here; None
    where ``timeout_s`` ran out first."""
    from cgsim.served import consequence  # noqa: PLC0415

    pair = serve_pair(launch, timeout_s)
    if pair is None:
        return None
    return {"error": pair["error"]} if "error" in pair else consequence(pair)


# A served pair (graphs and eager) of a small launch takes about 40 s on a
# 2-core host: one is not started with less time left.
MIN_SERVE_S = 30.0


def serve_scenarios(launches: list[EngineLaunch], jobs: int, stopped: Any = lambda: False,
                    budget_s: float = 900) -> list[dict | None]:
    """Each of ``launches`` served (``serve_pair``), ``jobs`` at a time, in
    order; None for one that ``stopped()`` or the end of ``budget_s`` left
    unserved (none starts with less than ``MIN_SERVE_S`` left)."""
    from cgsim.targets.vllm.runner_build import unloadable  # noqa: PLC0415

    def serve_loadable(launch: EngineLaunch, left: float) -> dict:
        why = unloadable(launch.model) or _not_one_rank(launch)  # known without starting a child
        return {"error": why} if why is not None else serve_pair(launch, left)

    return _within(launches, jobs, stopped, budget_s, serve_loadable)


def serve_confirmed(findings: list[dict], verdicts: dict, jobs: int, stopped: Any = lambda: False,
                    budget_s: float = 900) -> dict:
    """``verdicts`` (``runner_build.confirm_findings``'s) with each confirmed
    finding's launch served (``served_consequence``, once per launch, ``jobs``
    at a time) as its ``served``: what a user of that launch sees.  Nothing
    starts once ``stopped()`` or ``budget_s`` is spent."""
    from cgsim.targets.vllm.runner_build import finding_launch, launch_key  # noqa: PLC0415

    keyed: dict[str, str] = {}  # confirmed finding id -> its launch's key
    launches: dict[str, EngineLaunch] = {}
    for f in findings:
        fid = str(f.get("id"))
        if fid in verdicts and verdicts[fid].verdict == "confirmed":
            launch = finding_launch(f)
            keyed[fid] = launch_key(launch)
            launches.setdefault(keyed[fid], launch)
    served = dict(zip(launches, _within(list(launches.values()), jobs, stopped, budget_s, served_consequence)))
    out = dict(verdicts)
    for fid, key in keyed.items():
        if served[key] is not None:
            out[fid] = dataclasses.replace(verdicts[fid], served=served[key])
    return out


def _not_one_rank(launch: EngineLaunch) -> str | None:
    """Why the runner share does not serve ``launch`` (None: it does): a
    data-parallel launch's pair runs a child per rank, twice (``serve_ranks``),
    and the launches the share draws with more than one rank are micro-batched
    ones, whose all2all kernels the CPU device lacks."""
    size = launch.data_parallel_size
    return None if size == 1 else (f"the runner share serves one-rank launches; this one has {size} "
                                   "data-parallel ranks")


def _within(launches: list[EngineLaunch], jobs: int, stopped: Any, budget_s: float, serve: Any) -> list[dict | None]:
    """``serve(launch, seconds left)`` for each launch, ``jobs`` at a time,
    None where ``stopped()`` or too little of ``budget_s`` was left to start,
    or a stop ended it (its children are killed: ``each_until_stopped``).
    Too little is under ``MIN_SERVE_S`` or under the longest serve so far,
    which the next is likely to take (the share's launches come cheapest first)."""
    from cgsim.targets.vllm.runner_build import each_until_stopped  # noqa: PLC0415

    deadline = time.monotonic() + budget_s
    longest = [MIN_SERVE_S]  # shared by the pool's threads (list.append is atomic)

    def serve_once(launch: EngineLaunch) -> dict | None:
        left = deadline - time.monotonic()
        if stopped() or left < max(longest):
            return None
        began = time.monotonic()
        result = serve(launch, left)
        if result is not None and "error" not in result:
            longest.append(time.monotonic() - began)
        return None if stopped() else result

    return each_until_stopped(serve_once, launches, jobs, stopped)


# --------------------------------------------------------------------------
# The front: one child process per served launch
# --------------------------------------------------------------------------


def serve_runner(launch: EngineLaunch, requests: tuple[ServedRequest, ...], timeout_s: float = 900) -> ServedRun:
    """``requests`` served by vLLM's runner built for ``launch``, in a fresh
    child process.  EngineRefused / VllmEnvironmentError as ``build_runner``."""
    from cgsim.targets.vllm.runner_build import launch_to_json, in_child  # noqa: PLC0415

    payload = {"launch": launch_to_json(launch), "requests": [dataclasses.asdict(r) for r in requests]}
    return ServedRun.from_json(in_child("cgsim.targets.vllm.runner_serve", payload, timeout_s,
                                        "serving through vLLM's model runner"))


def serve_dp_runners(launch: EngineLaunch, requests: tuple[tuple[ServedRequest, ...], ...],
                     timeout_s: float = 900) -> tuple[ServedRun, ...]:
    """A data-parallel MoE launch served: DP rank i (one child each, joined
    in one world: runner_build.build_dp_runners) serves ``requests[i]``, the
    ranks in lockstep as vLLM's DP engine cores run (an idle rank runs the
    worker's dummy batch while another has work); by rank."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from cgsim.targets.vllm.runner_build import free_port_run, in_child, launch_to_json  # noqa: PLC0415

    port = free_port_run(len(requests) + 4)
    payloads = [{"launch": launch_to_json(launch), "requests": [dataclasses.asdict(r) for r in mine],
                 "dp": [rank, port]} for rank, mine in enumerate(requests)]
    with ThreadPoolExecutor(max_workers=len(payloads)) as pool:
        results = list(pool.map(lambda p: in_child("cgsim.targets.vllm.runner_serve", p, timeout_s,
                                                   f"serving DP rank {p['dp'][0]} through vLLM's model runner"),
                                payloads))
    return tuple(ServedRun.from_json(r) for r in results)


def rank_requests(requests: tuple[ServedRequest, ...], ranks: int) -> tuple[tuple[ServedRequest, ...], ...]:
    """What each of ``ranks`` data-parallel ranks serves of ``requests``: rank
    0 them all, each further rank the first half of the previous rank's (at
    least one)."""
    out, mine = [], requests
    for _ in range(ranks):
        out.append(mine)
        mine = mine[:max(1, len(mine) // 2)]
    return tuple(out)


def serve_ranks(launch: EngineLaunch, requests: tuple[ServedRequest, ...], timeout_s: float = 900) -> ServedRun:
    """``requests`` served on a data-parallel launch's ranks
    (``serve_dp_runners``), as ``rank_requests`` shares them out, so the
    busier rank's batches set the padding the others run to; one run whose request ids
    name their rank (``dp1:r0``), its replays summed, its steps the most
    any rank took, what the first rank that raised raised."""
    runs = serve_dp_runners(launch, rank_requests(requests, launch.data_parallel_size), timeout_s)

    def keyed(field: str) -> dict:
        return {f"dp{rank}:{rid}": value for rank, run in enumerate(runs) for rid, value in getattr(run, field).items()}

    first = runs[0]
    return ServedRun(first.vllm_version, first.launch_line, keyed("tokens"), keyed("logprobs"),
                     max(r.steps for r in runs), sum(r.replays for r in runs),
                     next((r.raised for r in runs if r.raised is not None), None),
                     max(r.seconds for r in runs), keyed("per_step"), keyed("drafts"))


def _serve_payload(data: dict) -> dict:
    from cgsim.targets.vllm.runner_build import DataParallelRank, launch_from_json  # noqa: PLC0415

    requests = tuple(ServedRequest(tuple(r["prompt"]), r["max_tokens"], r.get("arrival_step", 0))
                     for r in data["requests"])
    dp = DataParallelRank(*data["dp"]) if data.get("dp") else None
    return serve_here(launch_from_json(data["launch"]), requests, dp=dp).to_json()


# --------------------------------------------------------------------------
# In the child
# --------------------------------------------------------------------------


def serve_here(launch: EngineLaunch, requests: tuple[ServedRequest, ...], max_steps: int = 64,
               dp: Any = None) -> ServedRun:
    """Build, capture and serve in this process (a fresh one: ``serve_runner``);
    ``dp`` (runner_build.DataParallelRank): as that rank of a data-parallel
    launch, stepping in lockstep with the other ranks as DPEngineCoreProc's
    busy loop does (v1/engine/core.py run_busy_loop): a rank with nothing
    scheduled runs the worker's dummy batch (Worker.execute_dummy_batch)
    while any rank has work, which an all-reduce over the DP group decides
    each step (ParallelConfig.has_unfinished_dp)."""
    from cgsim.targets.vllm import runner_build as rb  # noqa: PLC0415
    from cgsim.targets.vllm.scheduling.driver import block_hasher  # noqa: PLC0415

    state: dict[str, Any] = {}
    replays = [0]
    t0 = time.perf_counter()
    raised = None
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list[float]] = {}
    per_step: dict[str, list[int]] = {}
    drafts: dict[str, list[list[int]]] = {}
    steps = 0
    with rb.runner_world(launch, dp) as (caps, vc, backend), _counting_replays(replays), _toy_weights_that_tell():
        try:
            runner = rb.build_model_runner(vc, backend, state)
            proposed = _recording_drafts(runner)
            with rb.vllm_frames("capture_model"):
                runner.capture_model()
            proposed.clear()  # the capture's dummy runs drafted too
            scheduler = _scheduler(vc, state["kv_cache_config"], launch)
            hasher = block_hasher(vc, vc.cache_config.block_size)
            pending = sorted(enumerate(requests), key=lambda x: (x[1].arrival_step, x[0]))
            any_rank_busy = _any_rank_busy(vc) if dp is not None else (lambda busy: busy)
            while any_rank_busy(bool(pending or scheduler.has_requests())) and steps < max_steps:
                while pending and pending[0][1].arrival_step <= steps:
                    index, r = pending.pop(0)
                    scheduler.add_request(_request(f"r{index}", r, hasher))
                steps += 1
                if not scheduler.has_requests():
                    _idle_rank_step(dp, state)
                    continue
                so = scheduler.schedule()
                with rb.vllm_frames("execute_model"):
                    output = runner.execute_model(so)
                    if output is None:
                        output = runner.sample_tokens(None)
                    if hasattr(output, "get_output"):
                        output = output.get_output()
                _collect(output, tokens, logprobs, per_step)
                for rid in output.req_ids:
                    if rid in proposed and per_step.get(rid):
                        drafts.setdefault(rid, []).append(proposed[rid])
                proposed.clear()
                scheduler.update_from_output(so, output)
                if so.total_num_scheduled_tokens == 0:  # nothing ran (EngineCore.step: not executed)
                    _idle_rank_step(dp, state)
        except rb.VllmRaised as exc:
            raised = exc.text
    return ServedRun(caps.version, launch.line(), tokens, logprobs, steps, replays[0], raised,
                     round(time.perf_counter() - t0, 2), per_step, drafts)


def _idle_rank_step(dp: Any, state: dict) -> None:
    """A step that ran no forward here: a DP rank runs the worker's dummy
    batch (its DP sync and expert collectives meet the busy ranks')."""
    if dp is None:
        return
    from cgsim.targets.vllm import runner_build as rb  # noqa: PLC0415

    with rb.vllm_frames("Worker.execute_dummy_batch"):
        state["worker"].execute_dummy_batch()


def _any_rank_busy(vc: Any) -> Any:
    """Whether any DP rank has work, asked of all (the OR DPEngineCoreProc's
    _has_global_unfinished_reqs takes, over the worker's DP group here)."""
    parallel = importlib.import_module("vllm.config.parallel").ParallelConfig
    group = importlib.import_module("vllm.distributed.parallel_state").get_dp_group().cpu_group
    return lambda busy: parallel.has_unfinished_dp(group, busy)


def _recording_drafts(runner: Any) -> dict[str, list[int]]:
    """The drafts the runner hands its draft-token handler each step, by
    request id (``DraftTokensHandler.set_draft_tokens``, 0.20-0.34, given the
    batch and its drafts); filled as it runs, cleared by the caller."""
    proposed: dict[str, list[int]] = {}
    if not runner_hands_draft_tokens():
        return proposed
    handler = runner.draft_tokens_handler
    hand = handler.set_draft_tokens

    def set_draft_tokens(input_batch: Any, draft_tokens: Any) -> None:
        proposed.update(zip(input_batch.req_ids, draft_tokens.tolist()))
        hand(input_batch, draft_tokens)

    handler.set_draft_tokens = set_draft_tokens
    return proposed


class _counting_replays:  # noqa: N801 - a context manager, named for what it does
    """Counts the mock graphs' replays for the duration."""

    def __init__(self, count: list[int]):
        self.count = count

    def __enter__(self) -> None:
        from cgsim.cuda_mock import CUDAGraph  # noqa: PLC0415

        self.cls, self.orig = CUDAGraph, CUDAGraph.replay
        count, orig = self.count, self.orig

        def replay(graph: Any) -> None:
            count[0] += 1
            orig(graph)

        self.cls.replay = replay

    def __exit__(self, *exc: object) -> None:
        self.cls.replay = self.orig


# vLLM's dummy weights (uniform in +-1e-3) make the toy's next-token
# distribution flat: greedy tokens are then ties broken by rounding noise,
# and no wrong input shows.  Wider weights make the output depend on it.
TOY_WEIGHT_RANGE = 0.3


@contextlib.contextmanager
def _toy_weights_that_tell() -> Iterator[None]:
    loader = importlib.import_module("vllm.model_executor.model_loader.dummy_loader")
    orig = loader.initialize_single_dummy_weight

    def wider(param: Any, low: Any = None, high: Any = None, seed: int = 1234, **rest: Any) -> None:
        if param.dim() == 1 and param.is_floating_point():
            # The toy's only 1-D weights are its RMS norms': at 1, as trained norms are about, a
            # norm passes its input on at full scale instead of shrinking it to noise.
            param.data.fill_(1.0)
            return
        # Only the range is cgsim's; what else a release passes (0.34: the tensor's name) goes on.
        orig(param, -TOY_WEIGHT_RANGE, TOY_WEIGHT_RANGE, seed, **rest)

    def wider_each(layer: Any, model_config: Any = None, *args: Any, **kwargs: Any) -> None:
        # 0.20-0.29 initialise a layer's whole state dict through weight_utils, past the name above.
        for param in layer.state_dict().values():
            wider(param)

    patched = {"initialize_single_dummy_weight": wider, "initialize_dummy_weights": wider_each}
    origs = {name: getattr(loader, name) for name in dummy_weight_initializers()}
    for name in origs:
        setattr(loader, name, patched[name])
    try:
        yield
    finally:
        for name, fn in origs.items():
            setattr(loader, name, fn)


def _scheduler(vc: Any, kv_cache_config: Any, launch: EngineLaunch) -> Any:
    """The scheduler EngineCore.__init__ builds for the launch, over the KV
    cache the engine core planned."""
    from cgsim.targets.vllm.engine import launched  # noqa: PLC0415

    if isinstance(kv_cache_config, tuple):  # releases that return (gpu blocks, cpu blocks, config)
        kv_cache_config = kv_cache_config[-1]
    som = importlib.import_module("vllm.v1.structured_output")
    block_size = vc.cache_config.block_size
    with launched(launch):
        cls = vc.scheduler_config.get_scheduler_cls()
        return cls(vllm_config=vc, kv_cache_config=kv_cache_config,
                   structured_output_manager=som.StructuredOutputManager(vc), block_size=block_size,
                   hash_block_size=block_size, log_stats=False)


def _request(rid: str, r: ServedRequest, hasher: Any) -> Any:
    request_cls = importlib.import_module("vllm.v1.request").Request
    params_cls = importlib.import_module("vllm.sampling_params").SamplingParams
    # Greedy, the sampled token's log-probability returned (logprobs=0).
    params = params_cls(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0, logprobs=0)
    return request_cls(request_id=rid, prompt_token_ids=list(r.prompt), sampling_params=params, pooling_params=None,
                       arrival_time=float(r.arrival_step), block_hasher=hasher)


def _collect(output: Any, tokens: dict, logprobs: dict, per_step: dict) -> None:
    lp = getattr(output, "logprobs", None)
    rows = lp.logprobs if lp is not None else None
    # With drafts a request's rows are one per logit it had (1 + its drafts), of which its sampled tokens
    # read the first: where each starts is vLLM's cu_num_generated_tokens (Scheduler's slice_request).
    starts = lp.cu_num_generated_tokens if lp is not None else None
    row = 0
    for index, (rid, sampled) in enumerate(zip(output.req_ids, output.sampled_token_ids)):
        if starts is not None:
            row = int(starts[index])
        sampled = [int(t) for t in sampled]
        tokens.setdefault(rid, []).extend(sampled)
        if sampled:
            per_step.setdefault(rid, []).append(len(sampled))
        if rows is not None and sampled:
            for _ in sampled:
                logprobs.setdefault(rid, []).append(float(rows[row][0]) if row < len(rows) else float("nan"))
                row += 1


if __name__ == "__main__":
    from cgsim.targets.vllm.runner_build import child_main

    sys.exit(child_main(sys.argv[1], sys.argv[2], _serve_payload, "runner serve"))
