"""What a campaign was asked to do: one frozen ``CampaignOptions``, validated
once, before any worker starts.  Everything wrong with it (a bad target,
ruleset, backend, budget or report directory, a broken environment) is a
``UsageError``: one line for the user, exit code 2."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, replace
from typing import Any

from cgsim.profiles import PROFILES, get_profile
from cgsim.text import first_line

__all__ = ["UsageError", "CampaignOptions", "parse_budget", "options_for_profile", "validate", "resolve_gpus",
           "check_ray_address", "bounded_workers", "START_METHODS"]

START_METHODS = ("fork", "spawn", "forkserver")
DEFAULT_SHRINK_SHARE = 0.25


class UsageError(Exception):
    """Bad input or a broken environment: one line for the user, exit 2."""


def parse_budget(text: str, flag: str = "--budget", zero: bool = False) -> float:
    """A duration flag's value in seconds (``cgsim.values.parse_duration``:
    '60s', '5m', '1h30m', '250ms', '90'), or UsageError naming the flag;
    with ``zero``, 0 is taken too (a flag whose 0 means "none")."""
    from cgsim.values import ValueProblem, parse_duration

    try:
        return parse_duration(text, zero=zero)
    except ValueProblem as exc:
        raise UsageError(f"{flag} {text!r} {exc}") from None


@dataclass(frozen=True)
class CampaignOptions:
    target: str = "reference"
    backend: str = "mock"
    ruleset: str | None = None  # None: the target's default, else the strategy picks
    budget_s: float = 10.0
    workers: int = 1
    force_workers: bool = False  # more workers than CPUs (GPUs with cuda) on purpose
    workers_from_profile: bool = False  # the profile's default, not asked for: bounded without a word
    seed: int | None = 0  # None: a random seed, chosen (and reported) at validation
    report_dir: str = "reports"
    profile: str = "dev"
    timeout_s: float | None = 10.0
    chunk_examples: int = 25
    max_examples: int | None = None  # total over workers; makes a run independent of speed
    shrink_grace_s: float | None = None  # default: min(30s, max(2s, budget/4))
    shrink_limit_s: float | None = None  # default: max(5s, budget/10); 0: none
    shrink_time_share: float | None = None  # default: 0.25 of a worker's time (none with max_examples); 1: no cap
    gpus: str | None = None  # None: leave CUDA_VISIBLE_DEVICES alone; "auto" or "0,1,..."
    one_per_gpu: bool = False  # with gpus: as many workers as GPUs (--gpus without --workers)
    start_method: str | None = None  # default: fork for mock, spawn for cuda
    quiet: bool = False
    command: str = ""
    # (environment variable, path) of each source tree laid over an installed
    # engine (a target family's SourceOption: set in every worker), and the git
    # ref a tree's changed lines are compared against.
    sources: tuple[tuple[str, str], ...] = ()
    diff_base: str | None = None
    ray: str | None = None  # None: worker processes here; else a Ray address, "auto" or "local" (ray_executor)
    workers_from_cluster: bool = False  # with ray: one worker per GPU (cuda) or CPU of the cluster (--ray without --workers)
    example_db: str | None = None  # a directory or redis:// URL of saved failures (example_db); None: no database
    runner_confirm: bool = True  # the engine's own runner after the search: served launches, each finding confirmed (fuzz.campaign.served, .confirm)
    runner_share_s: float | None = None  # seconds for the served launches (None: served.served_budget; 0: none)
    confirm_budget_s: float | None = None  # seconds for the findings' runner builds (None: confirm.phase_budget; 0: none)
    # Filled in by validate():
    gpu_list: tuple[str, ...] | None = None
    environment: tuple[tuple[str, Any], ...] = ()  # what the target reports about the code under test
    cluster: Any = None  # with ray: the cluster.Cluster the run joined (join_cluster), not validate()
    # What the target's self-check met about the code under test (Findings): replayed first.
    self_check_findings: tuple[Any, ...] = ()

    def with_(self, **changes: Any) -> "CampaignOptions":
        return replace(self, **changes)

    @property
    def shrink_grace(self) -> float:
        if self.shrink_grace_s is not None:
            return self.shrink_grace_s
        return min(30.0, max(2.0, self.budget_s / 4))

    @property
    def shrink_limit(self) -> float | None:
        """How long one shrink may run before its smallest failure so far is
        recorded and the search goes on (None: as long as Hypothesis takes).
        A shrink of an engine-sized config can take a third of a short
        budget, and every defect not yet seen waits for it.  None with
        --max-examples: a time limit would make the run depend on speed."""
        if self.shrink_limit_s is not None:
            return self.shrink_limit_s or None
        if self.max_examples is not None:
            return None
        return max(5.0, self.budget_s / 10)

    @property
    def shrink_share(self) -> float | None:
        """The share of a worker's time that shrinking may take; a failure
        seen while it is spent waits ("pending") for a recurrence (None: no
        cap).  None with --max-examples: a time share would make the run
        depend on speed."""
        if self.shrink_time_share is not None:
            return self.shrink_time_share
        if self.max_examples is not None:
            return None
        return DEFAULT_SHRINK_SHARE

    @property
    def method(self) -> str:
        # CUDA cannot be used in a forked child once the parent touched it.
        return self.start_method or ("spawn" if self.backend == "cuda" or self.gpu_list else "fork")


def options_for_profile(profile: str, **overrides: Any) -> CampaignOptions:
    if profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    p = get_profile(profile)
    base: dict[str, Any] = {
        "profile": profile, "budget_s": p.budget_s, "workers": p.default_workers(), "timeout_s": p.timeout_s,
        "chunk_examples": p.chunk_examples, "seed": p.seed,
    }
    base["workers_from_profile"] = overrides.get("workers") is None
    base.update({k: v for k, v in overrides.items() if v is not None})
    return CampaignOptions(**base)


def validate(o: CampaignOptions) -> CampaignOptions:
    """The options as the campaign will run them, or UsageError (one line)."""
    from cgsim.backends import BACKENDS, get_backend
    from cgsim.families import family_of_target
    from cgsim.targets import TargetEnvironmentError, get_target

    if o.workers < 1:
        raise UsageError(f"--workers {o.workers}: give at least 1")
    if o.budget_s <= 0:
        raise UsageError(f"--budget {o.budget_s:g}s: give a positive duration, e.g. 60s")
    if o.timeout_s is not None and o.timeout_s <= 0:
        raise UsageError(f"--timeout {o.timeout_s:g}: give a positive number of seconds")
    if o.shrink_grace_s is not None and o.shrink_grace_s < 0:
        raise UsageError(f"--shrink-grace {o.shrink_grace_s:g}s: give a duration of 0 or more")
    if o.shrink_limit_s is not None and o.shrink_limit_s < 0:
        raise UsageError(f"--shrink-limit {o.shrink_limit_s:g}s: give a duration, or 0 for no limit")
    if o.shrink_time_share is not None and not 0 < o.shrink_time_share <= 1:
        raise UsageError(f"--shrink-share {o.shrink_time_share:g}: give a share of the time above 0 and at most 1 "
                         "(1: shrink every failure when it is found)")
    if o.chunk_examples < 1:
        raise UsageError(f"--chunk-examples {o.chunk_examples}: give at least 1")
    if o.max_examples is not None and o.max_examples < 1:
        raise UsageError(f"--max-examples {o.max_examples}: give at least 1")
    if o.profile not in PROFILES:
        raise UsageError(f"unknown profile {o.profile!r}; choose one of {', '.join(PROFILES)}")
    if o.backend not in BACKENDS:
        raise UsageError(f"unknown backend {o.backend!r}; choose one of {', '.join(BACKENDS)}")
    if o.start_method not in (None,) + START_METHODS:
        raise UsageError(f"unknown start method {o.start_method!r}; choose one of {', '.join(START_METHODS)}")
    if o.ray is not None:
        if o.gpus is not None:
            raise UsageError(f"--gpus {o.gpus} picks GPUs of this machine; with --ray, Ray gives each worker one GPU "
                             "of the cluster (--backend cuda): leave --gpus out")
        if o.start_method is not None:
            raise UsageError("--start-method is for worker processes on this machine; with --ray the workers are "
                             "Ray actors: leave it out")
        check_ray_address(o.ray)
    changes: dict[str, Any] = {}
    if o.sources:
        # Before anything imports an engine; spawned workers inherit the environment.
        changes["sources"] = tuple((env, os.path.abspath(path)) for env, path in o.sources)
        os.environ.update(changes["sources"])
    target = _one_line(get_target, o.target)
    if o.ruleset is not None:  # one of the target's family's rulesets, of the design the target follows
        _one_line(lambda name: family_of_target(o.target).check_ruleset(o.target, name), o.ruleset)
    try:
        target.prepare_environment()
        # The target adapter's self-check (optional hook): a broken mechanism is
        # exit 2; what it met about the code under test is replayed first.
        self_check = target.tooling.self_check
        if self_check is not None:
            changes["self_check_findings"] = tuple(self_check() or ())
    except TargetEnvironmentError as exc:
        raise UsageError(first_line(exc)) from None
    if o.ray is None or o.backend != "cuda":
        # With --ray the GPUs are the cluster's: this machine may have none,
        # and each actor checks its own (a worker error, in the notes).
        _one_line(get_backend, o.backend)
    if o.ruleset is None:
        # A real engine is judged by the design it follows (SPEC §3).
        ruleset = target.default_ruleset()
        if ruleset is not None:
            changes["ruleset"] = ruleset
    changes["environment"] = tuple(sorted(target.environment().items()))
    if o.seed is None:
        changes["seed"] = secrets.randbelow(2**31)
    if o.gpus is not None:
        gpus = tuple(resolve_gpus(o.gpus))
        if not gpus:
            raise UsageError("--gpus auto found no GPU (nvidia-smi -L lists none and CUDA_VISIBLE_DEVICES is empty)")
        _check_gpus_exist(gpus)
        changes["gpu_list"] = gpus
        if o.one_per_gpu:
            changes["workers"] = len(gpus)
    if o.ray is None:
        changes["workers"] = _bounded_workers(replace(o, **changes))
    # With --ray the workers are bounded by the cluster, which the run joins
    # (cluster.join_cluster): validation connects to nothing.
    return replace(o, **changes)


def check_ray_address(address: str) -> None:
    """UsageError for a --ray address no campaign can use, known without
    connecting: Ray Client (``ray://``) runs this process off the cluster."""
    if address.startswith("ray://"):
        raise UsageError(f"--ray {address}: Ray Client runs this process off the cluster, but the report and the "
                         "findings are written where the campaign runs; run it on a cluster node (ray start "
                         "--address=HEAD:6379 there) with --ray auto")


def _bounded_workers(o: CampaignOptions) -> int:
    return bounded_workers(o.workers, o.backend, o.force_workers, o.gpu_list, o.workers_from_profile)


def bounded_workers(workers: int, backend: str, force: bool = False, gpu_list: tuple[str, ...] | None = None,
                    from_profile: bool = False) -> int:
    """At most one worker per CPU (per GPU: with --backend cuda, or each
    with its own GPU through --gpus) unless --force-workers: more only fight
    over the same cores and memory.  A profile's default is bounded
    silently; a number asked for is refused, with what fits (UsageError)."""
    from fuzz.campaign.resources import cpu_count

    if gpu_list:
        capacity, what = len(gpu_list), "GPU(s) given to --gpus"
    elif backend == "cuda":
        capacity, what = _gpu_count(), "GPU(s)"
    else:
        capacity, what = cpu_count(), "CPU(s) this process may use"
    if workers <= capacity or force:
        return workers
    if from_profile:
        return capacity
    raise UsageError(f"--workers {workers}: there are {capacity} {what}, one per worker; give --workers "
                     f"{capacity} or fewer, or add --force-workers to start {workers} anyway")


def _gpu_count() -> int:
    found = len(resolve_gpus("auto"))
    if found:
        return found
    import torch  # the backend check found a GPU that nvidia-smi did not list

    return max(1, torch.cuda.device_count())


def resolve_gpus(spec: str) -> list[str]:
    """'auto' -> the visible GPUs (CUDA_VISIBLE_DEVICES, else nvidia-smi -L);
    '0,1,3' -> those."""
    if spec != "auto":
        from cgsim.values import ValueProblem, parse_sizes

        try:
            return [str(g) for g in parse_sizes(spec, least=0)]
        except ValueProblem as exc:
            raise UsageError(f"--gpus {spec!r} {exc}, or auto") from None
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    return _nvidia_smi_gpus()


def _nvidia_smi_gpus() -> list[str]:
    if shutil.which("nvidia-smi"):
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
            return [str(i) for i, _ in enumerate(line for line in listing.splitlines() if line.startswith("GPU "))]
        except (OSError, subprocess.SubprocessError):
            pass
    return []


def _check_gpus_exist(gpus: tuple[str, ...]) -> None:
    """Named GPU indices must exist: the same answer --gpus auto gives."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return  # indices are relative to what is visible; the workers' backend check decides
    present = _nvidia_smi_gpus()
    missing = [g for g in gpus if g not in present]
    if missing:
        seen = f"this machine has GPU(s) {', '.join(present)}" if present else "nvidia-smi lists no GPU on this machine"
        raise UsageError(f"--gpus {','.join(gpus)}: GPU {', '.join(missing)} not found ({seen}); "
                         "use --gpus auto or indices that exist")


def _one_line(check: Any, value: str) -> Any:
    try:
        return check(value)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(first_line(exc) or f"{value!r} is not available") from None
