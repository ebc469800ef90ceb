"""The contract every system under test implements.

A ``Target`` builds a ``ManagerUnderTest`` for (config, ruleset, backend,
workload); the runner drives it step by step.  Properties never look at a
target, only at the Trace, so adding a target never touches them.

The recording contract (checked for every registered target by
``tests/test_target_conformance.py``):

1. A target never writes the Trace.  The runner records what the handle
   returns (candidates, stored graphs, dispatch decisions, executions,
   release results, errors); the workload records what the code under test
   does with it (``Workload.tap_create_forward_fn``, ``model_forward``,
   ``run_breakable``, ``note_piecewise_lookup``, the metadata builder).
2. Every create_forward_fn call of the capture loop goes through
   ``Workload.tap_create_forward_fn``; every model forward through
   ``Workload.model_forward`` (or ``run_breakable`` for breakable piecewise
   graphs), inside the forward context the code under test set.
3. Attention metadata comes from ``Workload.prepare_attn`` (capture and
   runtime alike), so its identity, sizes and buffers are tracked.
4. ``execute`` returns an ``Execution``: the real rows' outputs, the path
   ("full" | "piecewise" | "eager"), the runtime metadata's id and the key of
   the graph that ran (the descriptor for "full", the piecewise key for
   "piecewise").  Which metadata that graph was captured with, and when, the
   workload knows.
5. A config the engine itself would refuse raises ``TargetUnsupported`` from
   ``build`` (not judged); a broken environment raises
   ``TargetEnvironmentError`` from ``prepare_environment`` (exit 2, never a
   finding).
6. A capture that fails leaves no process-wide capture state behind (vLLM's
   thread-local BreakableCUDAGraphCapture marker, a global capture flag): on
   the mock the campaign worker runs the next scenario in the same process.
   On a GPU it restarts (``GraphBackend.capture_failure_poisons``).

A handle may drive other managers beside the main one (a draft model's):
its optional ``sub_managers()`` returns ``{name: SubManager}``; the runner
records each one's candidates, stored graphs, captures, sweeps, dispatches and
replays into ``trace.managers[name]`` (the sub-trace its workload, made with
``Workload.for_manager``, records into).  Their capture happens inside the
main ``capture()`` and their release inside ``release()``, as in the engine.

Optional hooks (looked up with ``getattr``; a target without them works):
``classify(finding) -> dict`` (what a campaign writes into a finding's extra:
which documented defect of the code under test it is) and ``self_check()``
(a fixed set of scenarios with known outcomes, run before a campaign and by
``python -m fuzz doctor``; raises TargetEnvironmentError naming what drifted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape
from cgsim.modes import CUDAGraphMode
from cgsim.spec.rulesets import Ruleset

__all__ = [
    "Execution",
    "CandidateSnapshot",
    "ManagerUnderTest",
    "Target",
    "TargetError",
    "TargetEnvironmentError",
    "TargetUnsupported",
    "UnknownTarget",
    "CAPABILITIES",
    "SubManager",
]

# What a target can declare it supports (``Target.capabilities``).
CAPABILITIES = {
    "mock": "runs on the CPU mock backend",
    "cuda": "runs on real CUDA graphs",
    "release": "release_graphs() and a second capture",
}


class TargetError(RuntimeError):
    """The target cannot be used as asked (a bug in how it was named or set up)."""


class TargetEnvironmentError(TargetError):
    """The environment cannot run this target (a package missing, an untested
    release, a source tree that does not import).  One line; exit code 2,
    never a finding."""

    exit_code = 2


class UnknownTarget(ValueError):
    pass


class TargetUnsupported(ValueError):
    """The target's own validation rejects this config (the real engine would
    refuse to start with it).  Not a finding: the scenario does not apply."""


@dataclass(frozen=True)
class Execution:
    """What running one dispatched batch produced."""

    outputs: torch.Tensor | None  # hidden states of the batch's real rows
    path: str  # "full" | "piecewise" | "eager"
    runtime_metadata: int | None  # metadata prepared for this batch
    # The graph that ran: its descriptor ("full") or piecewise key ("piecewise"); None for eager.
    graph_key: Any = None


@dataclass(frozen=True)
class SubManager:
    """Another manager a handle drives (see the module docstring)."""

    handle: Any  # a ManagerUnderTest (capture and release happen through the main handle)
    workload: Any  # the Workload made with Workload.for_manager for it
    config: ManagerConfig  # the config that manager works with
    # The batch that manager is asked about when the main one serves ``batch``
    # (None: it is not asked, e.g. no draft decode step for one speculative token).
    batch_for: Callable[[Batch], Batch | None]


@dataclass(frozen=True)
class CandidateSnapshot:
    capture_descs: tuple[BatchDescriptor, ...]
    candidates: tuple[tuple[tuple[int, int], tuple[BatchDescriptor, ...]], ...]


class ManagerUnderTest(Protocol):
    resolved_mode: CUDAGraphMode
    uses_breakable: bool
    has_piecewise_runner: bool

    def capture(self) -> None: ...
    def dispatch(self, batch: Batch) -> BatchDescriptor: ...
    # The dispatch sweep: every schedulable shape, no replay.  Dispatch reads
    # only a batch's counts, which a BatchShape has.
    def dispatch_all(self, shapes: Sequence[BatchShape]) -> list[BatchDescriptor]: ...
    def execute(self, batch: Batch, desc: BatchDescriptor) -> Execution: ...
    def release(self) -> None: ...
    def captured_flag(self) -> bool: ...
    def stored_graphs(self) -> tuple[BatchDescriptor, ...]: ...
    def candidates(self) -> CandidateSnapshot: ...
    def recomputed_candidates(self) -> CandidateSnapshot: ...


class Target(Protocol):
    name: str
    capabilities: frozenset[str]
    # Optional: the engine whose designs it follows (a Ruleset's ``engine``);
    # without it, its default ruleset's engine, else "vllm".  Only rulesets of
    # that engine may judge it.
    # engine: str

    def default_ruleset(self) -> str | None:
        """The ruleset of the design this target follows (None: the strategy picks)."""

    def prepare_environment(self) -> None:
        """Make this process ready to run the target (an engine's adapter lays
        a source tree over its install, starts coverage, imports and warms the
        engine), or raise TargetEnvironmentError (one line) where it cannot."""

    def environment(self) -> dict[str, Any]:
        """What findings and summaries should record about the code under test (versions, source)."""

    def engine_capture_sizes(self, max_num_seqs: int, decode_query_len: int,
                             spec_schedule: tuple | None) -> tuple[int, ...]:
        """The capture sizes the engine picks by default for such a config (the
        strategies draw configs as engines run them from this)."""

    def unsupported_reason(self, config: ManagerConfig) -> str | None:
        """Optional: why this target cannot be given ``config`` at all, known
        without building anything (None: it may take it; ``build`` still has
        the last word).  Campaign strategies draw only configs it may take."""

    def engine_config(self, config: ManagerConfig) -> ManagerConfig:
        """Optional: the config the engine builds from the settings ``config``
        stands for (raise TargetUnsupported, with the engine's reason, where
        it refuses them).  Campaign strategies judge what the engine builds."""

    def unreachable(self, scenario: Any) -> str | None:
        """Optional: why no settings a user can type drive the engine through
        ``scenario``'s lifecycle (None: they do).  Such a scenario is not judged."""

    def launch(self, scenario: Any) -> dict | None:
        """Optional: the launch that reaches ``scenario`` (the command line a
        user types and its parts), recorded with every finding."""

    def serve(self, config: ManagerConfig, requests: Any) -> tuple[tuple[Batch, ...], Any]:
        """Optional: the batches the engine's own scheduler schedules, in
        order, for the request trace ``requests`` under the launch ``config``
        stands for, and where they came from (a ``cgsim.scenario.Served``);
        TargetUnsupported where the engine refuses the trace.  Campaign
        strategies make served scenarios of them."""

    def evidence(self, finding: Any) -> dict | None:
        """Optional: what the engine's own scheduler says about the batch or
        graph a final finding's claim rests on (recorded with it as
        ``scheduler_evidence``); None where it rests on neither."""

    def build(self, config: ManagerConfig, ruleset: Ruleset, backend, workload) -> ManagerUnderTest: ...
