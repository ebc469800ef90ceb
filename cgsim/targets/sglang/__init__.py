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

Importing this module is cheap: sglang is imported by ``check_environment``
(about 15 s of CPU the first time, then a warm-up capture) and by ``build``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from typing import Any, Callable

from cgsim.config import ManagerConfig
from cgsim.spec.rulesets import Ruleset
from cgsim.targets.base import TargetEnvironmentError
from cgsim.targets.registry import TargetFamily
from cgsim.text import first_line

__all__ = ["SglangTarget", "FAMILY", "MUTANT_FAMILY", "SUPPORTED_VERSIONS", "installed_version", "require_sglang"]

SUPPORTED_VERSIONS = ("0.5.23",)
ALLOW_UNTESTED = "CGSIM_SGLANG_ALLOW_UNTESTED"
INSTALL_HINT = "bash scripts/install_sglang.sh VENV (docs/sglang.md)"


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_sglang() -> str:
    """The installed sglang's version, or TargetEnvironmentError (one line)
    when it is missing, untested or does not import; imports what the target
    drives, so a campaign pays sglang's import before its first scenario."""
    version = installed_version()
    if version is None or importlib.util.find_spec("sglang") is None:
        raise TargetEnvironmentError(f"sglang is not installed in this environment; install it with {INSTALL_HINT}")
    if version not in SUPPORTED_VERSIONS and os.environ.get(ALLOW_UNTESTED) != "1":
        raise TargetEnvironmentError(
            f"sglang {version} is untested (cgsim drives {', '.join(SUPPORTED_VERSIONS)}); "
            f"install one of those or set {ALLOW_UNTESTED}=1 to try")
    try:
        handle = importlib.import_module("cgsim.targets.sglang._handle")
    except Exception as exc:  # noqa: BLE001 - any import failure is the environment's
        raise TargetEnvironmentError(
            f"sglang {version} does not import here ({type(exc).__name__}: {first_line(exc, 200)}); "
            f"the stand-ins may be missing: {INSTALL_HINT}") from None
    try:
        handle.warm_up(version)
    except Exception as exc:  # noqa: BLE001
        raise TargetEnvironmentError(
            f"sglang {version} imports but cannot capture here ({type(exc).__name__}: {first_line(exc, 200)})") from None
    return version


class SglangTarget:
    """--target sglang (and, with ``patches``, sglang-mutant:NAME)."""

    capabilities = frozenset({"mock", "release"})
    engine = "sglang"

    def __init__(self, name: str = "sglang", patches: Callable[[], Any] | None = None):
        self.name = name
        self.patches = patches
        self._version: str | None = None

    def default_ruleset(self) -> str | None:
        return "sglang"

    def check_environment(self) -> None:
        if self._version is None:
            self._version = require_sglang()

    def environment(self) -> dict:
        return {"sglang_version": installed_version()}

    def engine_capture_sizes(self, max_num_seqs: int, decode_query_len: int,
                             spec_schedule: tuple | None) -> tuple[int, ...]:
        """The decode bs list sglang picks by default for such a server (its
        ladder up to --cuda-graph-max-bs, here the request count)."""
        from cgsim.spec.sglang import default_decode_bs  # noqa: PLC0415

        return tuple(default_decode_bs(max_num_seqs, False, decode_query_len > 1))

    def build(self, config: ManagerConfig, ruleset: Ruleset, backend: Any, workload: Any) -> Any:
        self.check_environment()
        handle_mod = importlib.import_module("cgsim.targets.sglang._handle")
        return handle_mod.SglangHandle(config, backend, workload, self._version or "?", self.patches)


def _mutant_target(variant: str | None) -> SglangTarget:
    from cgsim.targets.sglang.mutants import MUTANTS  # noqa: PLC0415

    return SglangTarget(f"sglang-mutant:{variant}", MUTANTS[variant].patch)


def _mutant_variants() -> dict[str, str]:
    from cgsim.targets.sglang.mutants import MUTANTS  # noqa: PLC0415

    return {name: m.summary for name, m in MUTANTS.items()}


FAMILY = TargetFamily("sglang", "the installed sglang's decode and prefill CUDA-graph runners (sglang 0.5.23)",
                      lambda _variant: SglangTarget())
MUTANT_FAMILY = TargetFamily("sglang-mutant", "sglang's runners with one historical bug put back in-process",
                             _mutant_target, _mutant_variants)
