"""SGLang's CUDA-graph runners as cgsim targets.

``sglang``: the installed sglang's ``DecodeCudaGraphRunner`` and
``PrefillCudaGraphRunner`` with their ``FullCudaGraphBackend`` /
``BreakableCudaGraphBackend``, run on CPU over cgsim's mock, sglang unchanged
(``_handle``: the ManagerUnderTest; ``_world``: the model runner, attention
backend, model and process patches around the runners).
``sglang-mutant:NAME``: the same with one bug from sglang's history put back
in-process (``mutants``).

How a cgsim config reads for sglang, and how sglang's graphs read as cgsim
descriptors: ``cgsim.spec.sglang``.  Judged by the ``sglang`` ruleset;
docs/sglang.md maps the property catalogue onto it.

Importing this module is cheap: sglang is imported by ``prepare_environment``
(about 15 s of CPU the first time, then a warm-up capture) and by ``build``.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from cgsim.config import ManagerConfig
from cgsim.spec.rulesets import Ruleset
from cgsim.targets.base import Drawing, Tooling, Triage
from cgsim.targets.registry import TargetFamily
from cgsim.targets.sglang.compat import (INSTALL_HINT, SOURCE_OPTION, SglangAdapterError, SglangEnvironmentError,
                                         as_on_cpu_host, installed_version, probe)
from cgsim.text import first_line

__all__ = ["SglangTarget", "FAMILY", "MUTANT_FAMILY", "installed_version", "require_sglang", "SglangEnvironmentError",
           "SglangAdapterError"]


def require_sglang() -> str:
    """The imported sglang's version, or SglangEnvironmentError (one line)
    when it is missing, lacks a piece the target drives or does not import;
    imports what the target drives and warms it up, so a campaign pays
    sglang's import before its first scenario."""
    with as_on_cpu_host():
        return _require_sglang()


def _require_sglang() -> str:
    try:
        tree = probe()
        handle = importlib.import_module("cgsim.targets.sglang._handle")
    except SglangEnvironmentError:
        raise
    except Exception as exc:  # noqa: BLE001 - any import failure is the environment's
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        hint = (f"the package {missing} is missing: re-run {INSTALL_HINT} (it installs sglang's runtime packages "
                "and the stand-ins its import chain needs)" if missing and not missing.startswith("sglang")
                else f"cgsim's adapter does not fit this tree; {INSTALL_HINT} installs one it drives")
        raise SglangEnvironmentError(
            f"sglang {installed_version() or '?'} does not import here ({type(exc).__name__}: "
            f"{first_line(exc, 200)}); {hint}") from None
    # A warm-up that fails in sglang's own code is the tree's defect: the
    # campaign's scenarios find it (NO-CRASH); only the adapter's failures stop here.
    handle.warm_up(tree.version)
    return tree.version


class SglangTarget:
    """--target sglang (and, with ``patches``, sglang-mutant:NAME)."""

    capabilities = frozenset({"mock", "cuda", "release"})
    engine = "sglang"

    def __init__(self, name: str = "sglang", patches: Callable[[], Any] | None = None):
        self.name = name
        self.patches = patches
        self._version: str | None = None
        self.drawing = Drawing(engine_capture_sizes=self._engine_capture_sizes, engine_config=self._engine_config,
                               config_strategy=self._config_strategy, unreachable=self._unreachable)
        self.triage = Triage(launch=self._launch, classify=self._classify)
        self.tooling = Tooling()

    def default_ruleset(self) -> str | None:
        """The design of the imported tree (compat.DESIGNS)."""
        self.prepare_environment()
        return probe().ruleset

    def prepare_environment(self) -> None:
        if self._version is None:
            self._version = require_sglang()

    def environment(self) -> dict:
        try:
            return probe().to_json()
        except SglangEnvironmentError:
            return {"sglang_version": installed_version()}

    def _engine_config(self, config: ManagerConfig) -> ManagerConfig:
        """``config`` where sglang takes the launch it stands for (its own parser
        and model-independent checks; cgsim.targets.sglang.launch), else
        TargetUnsupported with sglang's reason: campaigns count those, never judge them."""
        from cgsim.spec.sglang import unsupported_reason  # noqa: PLC0415
        from cgsim.targets.base import TargetUnsupported  # noqa: PLC0415
        from cgsim.targets.sglang.launch import engine_graph_config  # noqa: PLC0415

        reason = unsupported_reason(config)
        if reason is not None:
            raise TargetUnsupported(reason)
        engine_graph_config(config, probe().version)
        return config

    def _launch(self, scenario: Any) -> dict | None:
        """The ``python -m sglang.launch_server`` line that reaches ``scenario``."""
        from cgsim.targets.sglang.launch import launch_for  # noqa: PLC0415

        return launch_for(scenario.config).to_json()

    def _classify(self, finding: Any) -> dict:
        """Which documented defect of this sglang the finding is (cgsim.targets.sglang.known)."""
        from cgsim.targets.sglang.known import label  # noqa: PLC0415

        try:
            return label(finding, probe().version)
        except SglangEnvironmentError:
            return {}

    def _unreachable(self, scenario: Any) -> str | None:
        """A release needs sglang's elastic release path, which older trees lack."""
        if any(step.kind == "release" for step in scenario.steps) and not probe().release:
            return (f"sglang {probe().version} has no elastic release path "
                    "(model_runner_components/cuda_graph_setup.drop_elastic_cuda_graph_state): no launch releases "
                    "its graphs")
        return None

    def _engine_capture_sizes(self, max_num_seqs: int, decode_query_len: int,
                              spec_schedule: tuple | None) -> tuple[int, ...]:
        """The decode bs list sglang picks by default for such a server (its
        ladder up to --cuda-graph-max-bs, here the request count)."""
        from cgsim.spec.sglang import default_decode_bs  # noqa: PLC0415

        return tuple(default_decode_bs(max_num_seqs, False, decode_query_len > 1))

    def _config_strategy(self, max_size: int) -> Any:
        """Configs as sglang runs them (``strategies``), their sizes up to
        ``max_size`` and at most 64, only launches this tree's sglang takes
        (no ``--lora-backend triton_v2`` before 0.5.23): the campaign's
        strategy draws these."""
        from cgsim.targets.sglang.strategies import sglang_configs  # noqa: PLC0415

        try:
            skips_inactive = probe().nolora_from_backend
        except SglangEnvironmentError:
            skips_inactive = True
        return sglang_configs(min(max_size, 64), lora_skips_inactive=skips_inactive)

    def build(self, config: ManagerConfig, ruleset: Ruleset, backend: Any, workload: Any) -> Any:
        self.prepare_environment()
        handle_mod = importlib.import_module("cgsim.targets.sglang._handle")
        return handle_mod.SglangHandle(config, backend, workload, self._version or "?", self.patches)


def _mutant_target(variant: str | None) -> SglangTarget:
    from cgsim.targets.sglang.mutants import MUTANTS  # noqa: PLC0415

    return SglangTarget(f"sglang-mutant:{variant}", MUTANTS[variant].patch)


def _mutant_variants() -> dict[str, str]:
    from cgsim.targets.sglang.mutants import MUTANTS  # noqa: PLC0415

    return {name: m.summary for name, m in MUTANTS.items()}


FAMILY = TargetFamily("sglang", "the installed sglang's decode and prefill CUDA-graph runners (sglang 0.5.20+)",
                      lambda _variant: SglangTarget(), source=SOURCE_OPTION)
MUTANT_FAMILY = TargetFamily("sglang-mutant", "sglang's runners with one historical bug put back in-process",
                             _mutant_target, _mutant_variants)
