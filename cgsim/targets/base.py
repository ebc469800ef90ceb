"""The contract every system under test implements.

A ``Target`` builds a ``ManagerUnderTest`` for (config, ruleset, backend,
workload); the runner drives it step by step.  Properties never look at a
target, only at the Trace, so adding a target never touches them.

The recording contract (checked for every registered target by
``tests/cgsim/targets/test_target_conformance.py``):

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

Optional hooks are typed members of a target, grouped by role: ``drawing``
(``Drawing``: how configs are drawn as the engine runs them), ``triage``
(``Triage``: what the engine says about a finding) and ``tooling``
(``Tooling``: checks and coverage around a campaign); an encoder target
has these and ``encoder`` (``EncoderHooks``: what only the encoder family
asks).  Each hook is a field, None where the target has none, read as
``target.triage.classify``, never fetched by name; one it defines must be
callable as declared (the registry checks that when it creates the target,
with the roles its ``TargetFamily`` declares, ``TARGET_HOOKS`` or
``ENCODER_HOOKS``: TargetEnvironmentError naming target and hook).  What
a target family declares about itself beside its targets (a source tree
option, a pytest adapter) is a ``SourceOption`` or ``PytestAdapter`` on its
``TargetFamily``.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field, fields
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
    "ScenarioNotRunnable",
    "TargetUnsupported",
    "UnknownTarget",
    "CAPABILITIES",
    "SubManager",
    "Hook",
    "Hooks",
    "hook",
    "hook_fields",
    "Drawing",
    "Triage",
    "Tooling",
    "EncoderHooks",
    "TARGET_HOOKS",
    "ENCODER_HOOKS",
    "SourceOption",
    "PytestAdapter",
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


class ScenarioNotRunnable(TargetEnvironmentError):
    """A finding's scenario is one the target here refuses to run (its
    engine would not start with those settings): exit 2, could not tell."""


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
    # Optional: ``engine_alignment``, a ``cgsim.trace.EngineAlignment``, what
    # the engine's own helpers answer for the alignment of the graph sizes
    # under this launch (SGLang's handles); the recorder writes it into the
    # trace's header once, and the alignment properties judge by it.

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

    # Its optional hooks by role, each None where it has none (below: Drawing, Triage, Tooling).
    drawing: Drawing
    triage: Triage
    tooling: Tooling

    def build(self, config: ManagerConfig, ruleset: Ruleset, backend, workload) -> ManagerUnderTest: ...


# -- optional hooks --------------------------------------------------------------------


@dataclass(frozen=True)
class Hook:
    """How one optional hook is called and what it does: the metadata of its
    field in a role (``Drawing``, ``Triage``, ``Tooling``, ``Encoder*``)."""

    does: str
    params: tuple[str, ...] = ()  # the arguments callers pass, in order
    by_keyword: bool = False  # callers pass ``params`` by name
    needs: tuple[str, ...] = ()  # hooks of the same role a target defining this one must define too

    def call_text(self, name: str) -> str:
        return f"{name}({', '.join(f'{p}=' if self.by_keyword else p for p in self.params)})"


def hook(does: str, params: tuple[str, ...] = (), *, by_keyword: bool = False, needs: tuple[str, ...] = ()) -> Any:
    """A role's field for one optional hook: None where the target has none."""
    return field(default=None, metadata={"hook": Hook(does, params, by_keyword, needs)})


def hook_fields(role: type) -> dict[str, Hook]:
    """The hooks a role declares, by field name."""
    return {f.name: f.metadata["hook"] for f in fields(role)}


@dataclass(frozen=True)
class Drawing:
    """How a campaign draws configs and scenarios as the engine runs them."""

    engine_capture_sizes: Callable[[int, int, tuple | None], tuple[int, ...]] | None = hook(
        "the capture sizes the engine picks by default for such a config (configs as engines run them are drawn "
        "from it)", ("max_num_seqs", "decode_query_len", "spec_schedule"))
    unsupported_reason: Callable[[ManagerConfig], str | None] | None = hook(
        "why the target cannot be given the config at all, known without building anything (None: it may take "
        "it); campaign strategies draw only configs it may take", ("config",))
    engine_settings: Callable[[ManagerConfig], ManagerConfig] | None = hook(
        "the drawn config as settings the engine takes: those it refuses in this combination left out "
        "(TargetUnsupported with its reason where none is taken); campaign strategies draw through it, before "
        "unsupported_reason and engine_config", ("config",))
    engine_config: Callable[[ManagerConfig], ManagerConfig] | None = hook(
        "the config the engine builds from the settings the config stands for (TargetUnsupported with the "
        "engine's reason where it refuses them)", ("config",))
    config_strategy: Callable[[int], Any] | None = hook(
        "a Hypothesis strategy of configs as the engine runs them, up to max_size tokens, drawn instead of "
        "cgsim's own", ("max_size",))
    serve: Callable[[ManagerConfig, Any], tuple] | None = hook(
        "the batches the engine's own scheduler schedules for a request trace under the config's launch, in "
        "order, and a cgsim.scenario.Served (TargetUnsupported where it refuses the trace)", ("config", "requests"))
    unreachable: Callable[[Any], str | None] | None = hook(
        "why no settings a user can type drive the engine through the scenario's lifecycle (None: they do); "
        "such a scenario is not judged", ("scenario",))


@dataclass(frozen=True)
class Triage:
    """What the engine says about a finding: how to reach it, what it is, whether its own runner agrees."""

    launch: Callable[[Any], dict | None] | None = hook(
        "the launch that reaches the scenario (the command line a user types and its parts), recorded with "
        "every finding", ("scenario",))
    evidence: Callable[[Any], dict | None] | None = hook(
        "what the engine's own scheduler says about the batch or graph a final finding rests on (recorded as "
        "scheduler_evidence); None where it rests on neither", ("finding",))
    confirm_findings: Callable[[list, int, Callable[[], bool], float], dict] | None = hook(
        "each finding's launch built by the engine's own model runner, at a campaign's end: a plain verdict per "
        "finding id (runner_confirmation; 'absent' or 'refused' make it manager-level only)",
        ("findings", "jobs", "stopped", "budget_s"))
    serve_scenarios: Callable[[list, int, Callable[[], bool], float], list] | None = hook(
        "each scenario's launch served end to end through the engine's own model runner, with CUDA graphs and "
        "eager, the same requests (cgsim.served): per scenario {graphs, eager} as plain runs (tokens, logprobs, "
        "raised) and optionally the launch served (recorded in place of the launch hook's), {error} where it "
        "cannot be served here, None where the budget or a stop left it unserved",
        ("scenarios", "jobs", "stopped", "budget_s"), needs=("launch",))
    classify: Callable[[Any], dict] | None = hook(
        "which documented defect of the code under test a finding is (a dict for its extra; known_defect names "
        "it)", ("finding",))


@dataclass(frozen=True)
class Tooling:
    """What runs around a campaign: the adapter's own checks and coverage of the engine's code."""

    self_check: Callable[[], tuple] | None = hook(
        "a fixed set of scenarios with known outcomes, run before a campaign: raises TargetEnvironmentError "
        "naming a broken mechanism, else returns the findings it met")
    doctor: Callable[..., tuple] | None = hook(
        "python -m fuzz doctor: (what was checked, every check, the one failure line or None)",
        ("findings_dir", "progress", "announce"), by_keyword=True)
    coverage_start: Callable[[str], None] | None = hook(
        "a campaign asks its workers to measure the engine's code into a directory", ("data_dir",),
        needs=("coverage_report",))
    coverage_report: Callable[[str | None, str | None], dict] | None = hook(
        "the summary's target_coverage section from what the workers measured", ("data_dir", "diff_base"))


@dataclass(frozen=True)
class EncoderHooks:
    """What the encoder family asks of an encoder target beside the common roles."""

    takes_max_token_budget: Callable[[], bool] | None = hook(
        "whether the engine has a field for the max token budget setting (False: scenarios with it are not "
        "drawn)")
    classify: Callable[[Any, Any, Any], dict] | None = hook(
        "which documented defect a violation is (a dict for the finding's extra; known_defect names it)",
        ("scenario", "trace", "violation"))


@dataclass(frozen=True)
class Hooks:
    """The roles one kind of target (decode or encoder) exposes its optional hooks through."""

    kind: str
    roles: tuple[tuple[str, type], ...]  # (member, its role class)

    def check(self, target: Any) -> None:
        """TargetEnvironmentError (one line) naming the first role member
        ``target`` lacks, or the first hook it defines that cannot be called
        as declared."""
        who = f"{self.kind} {getattr(target, 'name', type(target).__name__)}"
        for member, role in self.roles:
            value = getattr(target, member, None)
            if not isinstance(value, role):
                raise TargetEnvironmentError(f"{who}: its {member} is a {type(value).__name__}, not a "
                                             f"{role.__module__}.{role.__qualname__} (None for each hook it lacks)")
            for name, declared in hook_fields(role).items():
                fn = getattr(value, name)
                if fn is None:
                    continue
                problem = _call_problem(fn, declared) or next(
                    (f"comes without {member}.{n}, which it needs" for n in declared.needs
                     if getattr(value, n) is None), None)
                if problem is not None:
                    raise TargetEnvironmentError(f"{who}: optional hook {member}.{name} {problem}; declared as "
                                                 f"{member}.{declared.call_text(name)}: {declared.does}")


def _call_problem(fn: Any, hook: Hook) -> str | None:
    if not callable(fn):
        return f"is a {type(fn).__name__}, not callable"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: callable is all that can be known
        return None
    try:
        if hook.by_keyword:
            signature.bind(**dict.fromkeys(hook.params))
        else:
            signature.bind(*hook.params)
    except TypeError as exc:
        return f"cannot be called with {len(hook.params)} argument(s) ({exc})"
    return None


TARGET_HOOKS = Hooks("target", (("drawing", Drawing), ("triage", Triage), ("tooling", Tooling)))
ENCODER_HOOKS = Hooks("encoder target", TARGET_HOOKS.roles + (("encoder", EncoderHooks),))


# -- what a target family declares beside its targets -----------------------------------


@dataclass(frozen=True)
class SourceOption:
    """A source tree of the code under test laid over (or imported instead
    of) its installed package, named by a flag of every command that runs the
    target and by an environment variable the processes that import it read."""

    flag: str  # the command-line flag, e.g. --vllm-source
    env: str  # the environment variable it sets before anything imports the engine
    help: str  # for the command line
    summary: str  # one short clause: what the tree is laid over
    empty: str  # what to give instead of an empty value
    what: str  # the engine as messages name it
    recorded_as: str | None = None  # the finding's key for the tree it ran on: a replay uses it while it is here
    commit_key: str | None = None  # the finding's key for that tree's commit
    # With a pytest flag the plugin takes it, and prepares the family's target
    # before collection when the session targets it or the flag is given.
    pytest_flag: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def pytest_dest(self) -> str | None:
        return self.pytest_flag.lstrip("-").replace("-", "_") if self.pytest_flag else None


@dataclass(frozen=True)
class PytestAdapter:
    """How ``--cgsim-mock-engine FAMILY`` adapts an engine whose CPU build
    routes around CUDA graphs to the CPU mock of torch.cuda, for a whole
    pytest session."""

    what: str  # one line for --help
    patches: tuple[str, ...]  # the names of what it changes (each with its why where the family keeps its patches)
    # Applies them (each undone by the stack); TargetEnvironmentError, one line, where it cannot.
    install: Callable[[contextlib.ExitStack], None]
