"""python -m fuzz export-test: findings as standalone vLLM tests.

Without vLLM: every docs/findings JSON exports to a module that compiles,
imports only vllm, torch, pytest and the standard library, names its finding
and asserts its property; findings it cannot write are refused with one line.
With vLLM (``-m vllm``): the exported tests, run on the installed release
outside this repository, fail exactly where docs/findings.md says the finding
reproduces there and pass (or skip, for a feature the release lacks) where it
does not.
"""

from __future__ import annotations

import ast
import glob
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from cgsim.properties import ALL_PROPERTIES
from cgsim.report.findings import load_finding
from fuzz.cli import main
from fuzz.export_test import (
    DESIGN_FREE_PROPERTIES,
    ExportError,
    VLLM_PROPERTIES,
    default_test_name,
    documented_findings,
    export_test,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FINDINGS = sorted(glob.glob(os.path.join(ROOT, "docs", "findings", "*.json")))
ALLOWED_TOP_LEVEL = {"vllm", "torch", "pytest"} | set(sys.stdlib_module_names)


def _node(snippet: str) -> ast.AST:
    stmt = ast.parse(textwrap.dedent(snippet).strip()).body[0]
    return stmt.value if isinstance(stmt, ast.Expr) else stmt


def has(where: str | ast.AST, snippet: str) -> bool:
    """Whether generated code holds ``snippet`` (one expression or statement)
    as code, whatever its layout: line breaks, spacing, comments, quotes."""
    tree = ast.parse(where) if isinstance(where, str) else where
    want = _node(snippet)
    dump = ast.dump(want)
    return any(type(n) is type(want) and ast.dump(n) == dump for n in ast.walk(tree))


def asserts(where: str | ast.AST, condition: str) -> bool:
    """Whether generated code asserts ``condition`` (with any message)."""
    tree = ast.parse(where) if isinstance(where, str) else where
    want = ast.dump(_node(condition))
    return any(isinstance(n, ast.Assert) and ast.dump(n.test) == want for n in ast.walk(tree))


def function(text: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name)


def constant(text: str, name: str):
    """The value a module-level constant of generated code is assigned (a literal)."""
    for n in ast.parse(text).body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            return ast.literal_eval(n.value)
    raise AssertionError(f"no constant {name}")


def statement_order(fn: ast.FunctionDef, snippets: list[str]) -> list[int]:
    """For each snippet in turn, the index of the first statement of ``fn``'s
    body after the previous snippet's that holds it (-1: none does)."""
    at, out = 0, []
    for snippet in snippets:
        found = next((i for i in range(at, len(fn.body)) if has(fn.body[i], snippet)), -1)
        out.append(found)
        at = found + 1 if found >= 0 else at
    return out


def _imported_modules(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("vllm."):
            out.add("vllm")  # importlib.import_module("vllm....") by name
    return out


# Every docs/findings JSON exports; a finding added here that export-test
# cannot write goes in this set with its reason.
NOT_EXPORTED: set[str] = set()
BREAKABLE_PROPERTIES = {"FRESH-METADATA", "NO-CRASH", "REPLAY-EQUALS-EAGER", "SKIP-ATTN"}


def _exportable(finding) -> bool:
    """export-test writes a vLLM test for these; the others (properties it has
    no template for, breakable graphs outside the properties that drive them)
    it refuses with one line."""
    breakable = finding.scenario["config"].get("breakable")
    return (finding.property in VLLM_PROPERTIES and finding.id not in NOT_EXPORTED
            and (not breakable or finding.property in BREAKABLE_PROPERTIES))


def test_the_code_matcher_ignores_layout_only():
    code = 'x = f(a,\n      "s")  # a comment\nassert x == 1, ("one"\n    " message")\n'
    assert has(code, "f(a, 's')") and has(code, "x = f(a, 's')") and asserts(code, "x == 1")
    assert not has(code, "f(a, 't')") and not has(code, "f(a)") and not asserts(code, "x == 2")


@pytest.mark.parametrize("path", FINDINGS, ids=[os.path.basename(p)[:-5] for p in FINDINGS])
def test_every_documented_finding_exports_a_standalone_test(path):
    finding = load_finding(path)
    if not _exportable(finding):
        with pytest.raises(ExportError) as info:
            export_test(finding, os.path.relpath(path, ROOT))
        assert finding.id in str(info.value) and "\n" not in str(info.value)
        return
    text = export_test(finding, os.path.relpath(path, ROOT))
    tree = ast.parse(text)
    imported = _imported_modules(tree)
    assert imported <= ALLOWED_TOP_LEVEL, f"imports beyond vllm/torch/pytest/stdlib: {imported - ALLOWED_TOP_LEVEL}"
    assert "cgsim" not in imported and "fuzz" not in imported
    tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    assert len(tests) == 1, tests
    doc = ast.get_docstring(tree) or ""
    assert finding.id in doc and finding.property in doc
    assert "Cause in vLLM's code" in doc, "every docs/findings row documents its cause"
    # The verdict is an assertion that names the property (the matrix check
    # tells it apart from a test that broke).
    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert) and n.msg is not None]
    assert asserts
    first = ast.unparse(asserts[-1].msg)
    assert f"{finding.property}:" in first, first
    assert default_test_name(finding).startswith("test_cgsim_")


def test_the_dispatch_test_writes_the_findings_batch_and_config_out():
    finding = load_finding(os.path.join(ROOT, "docs", "findings", "dispatch-priority-29225784ff.json"))
    text = export_test(finding)
    config = finding.scenario["config"]
    assert constant(text, "CAPTURE_SIZES") == list(config["capture_sizes"]) == [1, 2, 4, 10, 16]
    assert constant(text, "SPEC_SCHEDULE") == [tuple(t) for t in config["spec_schedule"]] == [(1, 2, 4), (3, 4, 2)]
    # The finding's steps in order: capture, then the batch it dispatches.
    test = function(text, "test_dispatch_priority_29225784ff")
    assert -1 not in statement_order(test, ["capture(manager, recorder)", "batch = Batch((3, 3, 3))",
                                            "dispatch(manager, batch)"])
    assert has(text, "pytestmark = pytest.mark.cpu_test")


def test_a_design_difference_is_marked_as_one(tmp_path):
    finding = load_finding(os.path.join(ROOT, "docs", "findings", "mode-resolution-1d6434a595.json"))
    doc = tmp_path / "findings.md"
    doc.write_text("# findings (vLLM 0.28 – 0.32)\n\n| # | property | releases | fixed in | JSON | source |\n"
                   "|---|---|---|---|---|---|\n| – | MODE-RESOLUTION | 0.30–0.32 | – | `mode-resolution-1d6434a595` | x |\n")
    text = export_test(finding, doc_path=str(doc))
    assert "DESIGN DIFFERENCE, not a vLLM" in " ".join(text.split())


def test_mode_resolution_follows_the_runners_adaptive_route():
    """The exported test expects the mode the finding's design requests
    (vllm-0.32: FULL with adaptive verification takes the FULL_DECODE_ONLY
    route here) and resolves as the release's runner does (0.30+ the route,
    0.28-0.29 FULL_AND_PIECEWISE forced: documented defect 13)."""
    finding = load_finding(os.path.join(ROOT, "docs", "findings", "mode-resolution-1d6434a595.json"))
    text = export_test(finding)
    assert asserts(text, "mode == CUDAGraphMode.FULL_DECODE_ONLY")
    resolve = function(text, "_resolve")
    assert has(resolve, 'getattr(adaptive_verification, "resolve_adaptive_cudagraph_mode", None)')
    assert has(resolve, "compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE")
    assert not documented_findings()["mode-resolution-1d6434a595"].design_difference


def test_every_summary_row_has_a_json_and_a_cause():
    docs = documented_findings()
    assert len(docs) >= 14
    on_disk = {os.path.basename(p)[:-5] for p in FINDINGS}
    assert set(docs) <= on_disk, set(docs) - on_disk
    for fid, doc in docs.items():
        assert doc.cause, f"{fid}: no cause paragraph found in docs/findings.md"
        assert load_finding(os.path.join(ROOT, "docs", "findings", f"{fid}.json")).property in ALL_PROPERTIES


def test_documented_release_ranges():
    docs = documented_findings()
    dbo = docs["capture-useful-c3e5a31f32"]  # "0.30–0.34 (no DBO before)"
    assert [dbo.reproduces_on(r) for r in ("0.20", "0.29", "0.30", "0.34")] == [False, False, True, True]
    assert dbo.reproduces_on("0.35") is None and dbo.reproduces_on("0.19") is None
    assert docs["decode-lengths-e215cf2c13"].reproduces_on("0.28") is True
    assert docs["decode-lengths-e215cf2c13"].reproduces_on("0.29") is False
    assert docs["mode-resolution-1d6434a595"].reproduces_on("0.28") is True
    assert not docs["pad-consistent-24c25280dc"].design_difference


def test_exported_verdicts_are_compared_only_on_the_findings_design():
    check = _check_module()
    doc = documented_findings()["pad-consistent-24c25280dc"]  # 0.20–0.30, ruleset vllm-0.32 (0.27+)
    assert check.expected(doc, "0.28", "vllm-0.32") is True and check.expected(doc, "0.31", "vllm-0.32") is False
    assert check.expected(doc, "0.24", "vllm-0.32") is None  # 0.24 follows vllm-0.21: another design
    assert check.expected(doc, "0.24") is True


def _variant(tmp_path, name, **changes):
    data = json.load(open(os.path.join(ROOT, "docs", "findings", "pad-consistent-24c25280dc.json"), encoding="utf-8"))
    scenario_changes = changes.pop("config", None)
    data.update(changes)
    if scenario_changes:
        data["scenario"]["config"].update(scenario_changes)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("name,changes,expect", [
    ("mutant", {"target": "mutant:range-off-by-one"}, "cgsim's own 'mutant:range-off-by-one' manager"),
    ("reference", {"target": "reference"}, "export-test writes tests for engine targets (vllm)"),
    ("sglang", {"target": "sglang"}, "no test writer yet (export-test writes tests for: vllm)"),
    ("metadata-live", {"property": "METADATA-LIVE"}, "it writes: BEFORE-CAPTURE, CAND-ORDER, CAPTURE-USEFUL"),
    ("breakable", {"config": {"breakable": True}}, "breakable CUDA graphs"),
    ("skip-attn", {"property": "SKIP-ATTN"}, "SKIP-ATTN is exported for breakable PIECEWISE graphs only"),
    ("replay-compiled", {"property": "REPLAY-EQUALS-EAGER", "step": 1}, "for breakable PIECEWISE graphs with"),
    ("hang", {"kind": "hang", "property": "NO-CRASH"}, "is a hang"),
    ("breakable-crash", {"kind": "crash", "property": "NO-CRASH", "config": {"breakable": True}},
     "for a re-capture after a release only"),
    ("huge", {"property": "CAPTURE-USEFUL", "step": 0,
              "config": {"capture_sizes": [512], "max_capture_size": 512, "max_num_reqs": 256}}, "too many to enumerate"),
])
def test_findings_it_cannot_write_are_refused_with_one_line(tmp_path, capsys, name, changes, expect):
    path = _variant(tmp_path, name, **changes)
    with pytest.raises(ExportError) as info:
        export_test(load_finding(path))
    assert expect in str(info.value)
    assert main(["export-test", path, "-o", str(tmp_path / "t.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err and expect in err
    assert not (tmp_path / "t.py").exists()


def test_the_runtime_writers_watch_what_the_model_sees():
    """DISPATCH-ROUNDTRIP asks the runner's own uniform-count function;
    FRESH-METADATA and SKIP-ATTN watch the forward context in the warmup and
    inside the graph; REPLAY-EQUALS-EAGER replays a CPU graph double."""
    def text(fid):
        return export_test(load_finding(os.path.join(ROOT, "docs", "findings", f"{fid}.json")))

    roundtrip = text("dispatch-roundtrip-2e41bc7df9")
    count = function(roundtrip, "runner_uniform_token_count")
    assert has(count, "from vllm.v1.worker.utils import get_uniform_decode_token_count as count")
    assert has(count, "cudagraph_utils.get_uniform_token_count(batch.num_reqs, batch.num_tokens, max_query_len)")
    test = function(roundtrip, "test_dispatch_roundtrip_2e41bc7df9")
    loop = next(n for n in test.body if isinstance(n, ast.For))
    assert has(loop.iter, "every_producible_batch()") and has(loop, "desc = runner_dispatch(manager, batch)")
    fresh = text("fresh-metadata-456f702b57")
    assert [a.arg for a in function(fresh, "observer").args.args] == ["monkeypatch", "cpu_graphs", "recorder"]
    assert has(fresh, "id(metadata) in warmup") and has(fresh, "metadata = get_forward_context().attn_metadata")
    skip = text("skip-attn-9656d102f2")
    assert has(skip, 'monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")')
    assert has(function(skip, "test_skip_attn_9656d102f2"), "require_breakable_graphs()")
    assert constant(skip, "BREAKABLE") is True
    assert has(skip, "metadata is None")
    replay = text("replay-equals-eager-fb213b6920")
    assert any(isinstance(n, ast.ClassDef) and n.name == "CpuGraph" for n in ast.parse(replay).body)
    assert has(replay, 'monkeypatch.setattr(torch.cuda, "CUDAGraph", CpuGraph)')
    assert has(replay, "manager.run_pw_graph(ToyModel(), inputs)")
    assert has(replay, "batch = Batch((2,), has_prefill=True)")
    # Their tests hold no design's literals: compared on every release.
    assert {"DISPATCH-ROUNDTRIP", "FRESH-METADATA", "REPLAY-EQUALS-EAGER", "SKIP-ATTN"} <= DESIGN_FREE_PROPERTIES
    check = _check_module()
    rulesets = check.finding_rulesets()
    assert rulesets["skip-attn-9656d102f2"] == "" and rulesets["pad-consistent-24c25280dc"] == "vllm-0.32"
    # A breakable re-capture's NO-CRASH test asserts only that it does not
    # raise: compared on every release; #3's NO-CRASH runs the design's list.
    assert rulesets["no-crash-6a1c49e513"] == ""
    assert check.expected(documented_findings()["no-crash-6a1c49e513"], "0.24", "") is False
    doc = documented_findings()["skip-attn-9656d102f2"]
    assert check.expected(doc, "0.25", "") is True and check.expected(doc, "0.26", "") is False


def test_the_draft_prefill_writer_drives_each_releases_speculator_api():
    """FRESH-METADATA of the draft prefill manager: the target's capture, the
    speculator's own init_cudagraph_manager, then its prefill capture in the
    release's API (handed the target's states, or building its own), with the
    warmup's and the in-graph metadata objects compared."""
    text = export_test(load_finding(os.path.join(ROOT, "docs", "findings", "fresh-metadata-2f61040c3e.json")))
    assert has(text, "target_states = capture(manager, recorder)")
    # The capture helper hands the states on.
    assert any(isinstance(n, ast.Return) and has(n, "manager.capture") for n in ast.walk(function(text, "capture")))
    assert has(text, "speculator_cls.init_cudagraph_manager(speculator, mode)")
    assert has(text, "handed = capture_draft_prefill(speculator.prefill_cudagraph_manager, draft_prefill, "
                     "target_states, recorder)")
    assert has(text, '"full_cg_attn_states" in params or "attn_states" in params')
    assert has(text, "prefill_manager.capture(forward_fn, target_states)")
    assert has(text, "prefill_manager.capture(forward_fn, model_state, input_buffers, block_tables, [[]], "
                     "kv_cache_config)")
    # 0.20: the shared capture loop itself reuses (the target's finding), not the prefill manager.
    skip = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.If) and has(n.test, "not handed and target_reused"))
    assert has(skip.body[0], "pytest.skip")
    assert asserts(text, "passes == {False, True}")  # a warmup and an in-graph pass were seen
    assert has(text, 'monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())')


def test_the_breakable_recapture_writer_models_both_allocators_pools():
    """NO-CRASH of a breakable re-capture after a release: a CPU graph double
    with the device and the pinned-host allocators' pool lifetimes, elastic
    EP's release, and a re-capture that must not raise; skips where release
    never reaches the manager (before 0.32) or torch keeps no host pools."""
    text = export_test(load_finding(os.path.join(ROOT, "docs", "findings", "no-crash-6a1c49e513.json")))
    assert any(isinstance(n, ast.ClassDef) and n.name == "PoolGraph" for n in ast.parse(text).body)
    assert has(text, 'monkeypatch.setattr(torch.cuda, "CUDAGraph", PoolGraph)')
    assert "CachingHostAllocator.h" in text and "create_or_incref_pool_under_lock" in text and "H200" in text
    assert has(text, 'monkeypatch.setattr(torch.accelerator, "empty_cache", empty_device)')
    assert has(text, 'monkeypatch.setattr(torch._C, "_host_emptyCache", empty_host, raising=False)')
    assert has(text, 'monkeypatch.setattr(cudagraph_utils.current_platform, "get_global_graph_pool", '
                     'lambda: GLOBAL_GRAPH_POOL)')
    assert has(text, "HOST_GRAPH_POOLS = tuple(int(part) for part in torch.__version__.split('+')[0].split('.')[:2]) "
                     ">= (2, 11)")
    test = function(text, "test_no_crash_6a1c49e513")
    order = statement_order(test, ["require_breakable_graphs()",
                                   'not hasattr(cudagraph_utils.CudaGraphManager, "release_graphs")',
                                   "not HOST_GRAPH_POOLS",
                                   "build_manager(vllm_config, resolve_cudagraph_mode(vllm_config))",
                                   "capture(manager, recorder)", "release(manager, vllm_config)",
                                   "capture(manager, recorder)"])
    assert -1 not in order, order
    assert "pool_graphs" in [a.arg for a in test.args.args]
    # The double itself: the host pool a released graph leaves behind trips a
    # bare capture_begin until the host cache is emptied (run without vLLM).
    start = text.index("HOST_GRAPH_POOLS = tuple(")
    code = text[start:text.index("@pytest.fixture", start)]
    import torch  # noqa: PLC0415

    ns: dict = {"torch": torch}
    exec(compile(code, "pool_graph", "exec"), ns)
    graph_cls = ns["PoolGraph"]
    graph_cls.pools = {"device": {}, "host": {}}
    graph_cls.__del__ = lambda self: None  # released by hand below
    first = graph_cls()
    first.capture_begin(pool=(0, 1))
    first.reset()
    graph_cls.empty_cache("device")
    if ns["HOST_GRAPH_POOLS"]:
        with pytest.raises(RuntimeError, match="CachingHostAllocator.h"):
            graph_cls().capture_begin(pool=(0, 1))
        graph_cls.empty_cache("host")
    graph_cls().capture_begin(pool=(0, 1))


def test_check_script_checks_only_the_findings_named(tmp_path, capsys):
    check = _check_module()
    exported = check.export_all(str(tmp_path), only=frozenset({"no-crash-6a1c49e513"}))
    assert list(exported) == ["no-crash-6a1c49e513"]
    assert sorted(p.name for p in tmp_path.glob("test_*.py")) == ["test_cgsim_no_crash_6a1c49e513.py"]
    assert check.main(["--finding", "no-such-finding", "--python", sys.executable]) == 2
    assert "no-such-finding" in capsys.readouterr().err


def test_check_script_takes_a_source_tree():
    check = _check_module()
    assert check.split_spec("/v/bin/python") == ("/v/bin/python", None)
    py, tree = check.split_spec("/v/bin/python::relative/tree")
    assert py == "/v/bin/python" and os.path.isabs(tree) and tree.endswith("relative/tree")
    assert check.release_of(sys.executable, "/nonexistent-tree") is None


def test_cli_writes_the_test_or_prints_it(tmp_path, capsys):
    path = os.path.join(ROOT, "docs", "findings", "release-recapture-e178b48079.json")
    out = tmp_path / "test_release.py"
    assert main(["export-test", path, "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    written = out.read_text()
    assert has(written, "ElasticEPScalingExecutor._release_cuda_graphs(executor)")
    assert main(["export-test", path]) == 0
    assert capsys.readouterr().out == written
    assert main(["export-test", str(tmp_path / "missing.json")]) == 2


def test_cli_runs_as_a_module(tmp_path):
    path = os.path.join(ROOT, "docs", "findings", "init-total-6bd79114c6.json")
    res = subprocess.run([sys.executable, "-m", "fuzz", "export-test", path], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0, res.stderr
    assert [a.arg for a in function(res.stdout, "build_draft_managers").args.args] == ["vllm_config", "mode"]


# -- against the installed vLLM ---------------------------------------------------


def _vllm_importable() -> bool:
    # Through cgsim: the first import of vLLM in a process picks its platform.
    try:
        from cgsim.targets.vllm.compat import require_vllm

        require_vllm()
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.vllm
@pytest.mark.skipif(not _vllm_importable(), reason="vLLM is not importable here; run with -m vllm in the vllm env")
def test_exported_tests_fail_exactly_where_docs_say_the_finding_reproduces(tmp_path):
    check = _check_module()
    exported = check.export_all(str(tmp_path))
    rulesets = check.finding_rulesets()
    version = check.release_of(sys.executable)
    assert version is not None
    cells = check.run_tests(sys.executable, str(tmp_path), exported)
    docs = documented_findings()
    release = check._short_release(version)
    report = {fid: (c.outcome, check.expected(docs.get(fid), release, rulesets.get(fid)), c.detail[:200])
              for fid, c in cells.items()}
    wrong = {fid: r for fid, r in report.items() if check.agrees(cells[fid], r[1]) is False}
    assert not wrong, f"vLLM {version}: exported tests disagree with docs/findings.md: {wrong}"
    if release in ("0.28", "0.29", "0.30", "0.31", "0.32"):
        # Every cell of this release's design had an expectation.
        ours = check.design_for(version).ruleset
        assert all(r[1] is not None for fid, r in report.items() if rulesets.get(fid) in ("", ours)), report


@pytest.mark.vllm
@pytest.mark.skipif(not _vllm_importable(), reason="vLLM is not importable here; run with -m vllm in the vllm env")
@pytest.mark.parametrize("fid", ["dispatch-roundtrip-2e41bc7df9", "fresh-metadata-456f702b57",
                                 "replay-equals-eager-fb213b6920", "skip-attn-9656d102f2",
                                 "fresh-metadata-2f61040c3e", "no-crash-6a1c49e513"])
def test_each_runtime_writer_runs_on_the_installed_vllm(tmp_path, fid):
    """One exported file per new writer, run with pytest on this vLLM: it
    fails with its property's assertion where docs/findings.md says the
    finding reproduces, and passes (or skips: no breakable graphs) elsewhere."""
    check = _check_module()
    finding = load_finding(os.path.join(ROOT, "docs", "findings", f"{fid}.json"))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    cpu_test: no GPU\n")
    (tmp_path / default_test_name(finding)).write_text(export_test(finding))
    cells = check.run_tests(sys.executable, str(tmp_path), {fid: (finding.property, default_test_name(finding))})
    release = check._short_release(check.release_of(sys.executable))
    want = check.expected(documented_findings().get(fid), release, "")
    assert want is not None, f"docs/findings.md says nothing about vLLM {release}"
    assert check.agrees(cells[fid], want), (cells[fid], want)


def _check_module():
    name = "check_exported_tests"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", "check_exported_tests.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


# -- docs/ci.md --------------------------------------------------------------------


def _ci_script() -> str:
    import re

    text = open(os.path.join(ROOT, "docs", "ci.md"), encoding="utf-8").read()
    section = text[text.index("## The script"):]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_ci_script_in_docs_is_valid_bash(tmp_path):
    script = tmp_path / "cgsim-pr.sh"
    script.write_text(_ci_script())
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_every_fuzz_command_in_the_ci_script_parses():
    """The script's cgsim commands use only subcommands and flags this cgsim has."""
    import re
    import shlex

    from fuzz.cli import build_parser

    values = {"$RULESET": "vllm-0.32", "$BUDGET": "10m", "$SEED": "7", "$OUT": "out", "$run": "out/run",
              "$f": "f.json", "$id": "x", "${id//-/_}": "x"}
    joined = _ci_script().replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        if '_PY" -m fuzz ' not in line or "--help" in line:
            continue  # not a command (an echo that names one) or the --vllm-source probe
        # ${PR_TREE:+--vllm-source "$PR_TREE"}: the flag and the tree, when set.
        line = re.sub(r'\$\{(\w+):\+--vllm-source "\$\1"\}', "--vllm-source tree", line)
        words = shlex.split(line.split('_PY" -m fuzz ', 1)[1].split(">")[0].split("||")[0])
        for k, v in sorted(values.items(), key=lambda kv: -len(kv[0])):
            words = [w.replace(k, v) for w in words]
        commands.append(words)
    assert sum("--vllm-source" in c for c in commands) == 2, commands  # the campaign and the base replay
    assert {c[0] for c in commands} == {"run", "replay", "export-test"}, commands
    parser = build_parser()
    for words in commands:
        parser.parse_args(words)  # exit 2 (SystemExit) on an unknown flag
