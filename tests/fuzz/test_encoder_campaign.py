"""Encoder campaigns from the command line, on the one campaign pipeline
(``fuzz.campaign`` with the encoder family's search): findings on disk with
their shrunk scenario and repro script, replays that reproduce them, the
report, export-test's answer for the encoder targets, workers and the
example database, and adapter errors as one line, exit 2."""

from __future__ import annotations

import ast
import dataclasses
import glob
import json
import os
import subprocess
import sys

import pytest

from cgsim.report.findings import load_finding
from fuzz.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENCODER_FINDINGS = sorted(glob.glob(os.path.join(ROOT, "docs", "encoder-findings", "*.json")))


def _run(tmp_path, *args: str) -> int:
    return main(["run", *args, "--report-dir", str(tmp_path), "--quiet"])


def _summary(tmp_path) -> dict:
    with open(os.path.join(tmp_path, "latest", "summary.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _findings(tmp_path) -> list[dict]:
    """Every finding JSON written under ``tmp_path`` (any run)."""
    out = []
    for root, _dirs, files in os.walk(tmp_path):
        if os.path.basename(root) == "findings" and not os.path.islink(os.path.dirname(root)):
            for name in sorted(files):
                if name.endswith(".json"):
                    with open(os.path.join(root, name), encoding="utf-8") as fh:
                        out.append(json.load(fh))
    return out


@pytest.fixture(scope="module")
def stale_tail(tmp_path_factory) -> str:
    """One campaign of a mutant that the encoder properties catch: its run directory."""
    reports = tmp_path_factory.mktemp("reports")
    assert _run(reports, "--target", "encoder-mutant:stale-tail", "--max-examples", "400", "--seed", "1",
                "--budget", "120s") == 1
    return os.path.realpath(os.path.join(reports, "latest"))


def _entry(run_dir: str, prop: str = "ENC-EQUAL") -> dict:
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as fh:
        (entry,) = [f for f in json.load(fh)["findings"] if f["property"] == prop]
    return {**entry, "file": entry["path"], "repro": entry["repro_path"]}


@pytest.mark.slow
def test_a_mutant_is_found_shrunk_written_and_replayed(stale_tail, tmp_path, capsys):
    entry = _entry(stale_tail)
    assert entry["status"] == "shrunk"
    path = os.path.join(stale_tail, entry["file"])
    with open(path, encoding="utf-8") as fh:
        finding = json.load(fh)
    assert finding["scenario"]["kind"] == "encoder" and finding["target"] == "encoder-mutant:stale-tail"
    # Shrunk to the bug: a larger batch, then a smaller one on the same graph.
    encodes = [s for s in finding["scenario"]["steps"] if s["kind"] == "encode"]
    assert len(encodes) == 2
    capsys.readouterr()
    assert main(["replay", path]) == 1
    assert "REPRODUCED ENC-EQUAL: item" in capsys.readouterr().out
    # The reference manager does not have the bug.
    finding["target"] = "encoder-reference"
    other = os.path.join(tmp_path, "as_reference.json")
    with open(other, "w", encoding="utf-8") as fh:
        json.dump(finding, fh)
    assert main(["replay", other]) == 0
    assert "not reproduced: ENC-EQUAL holds on this run" in capsys.readouterr().out


def _script(path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, path, *args], check=False, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_each_finding_has_a_repro_script_that_reproduces_it(stale_tail, tmp_path, capsys):
    entry = _entry(stale_tail)
    finding = load_finding(os.path.join(stale_tail, entry["file"]))
    assert entry["repro"] == os.path.join("findings", f"repro_{finding.id}.py")
    repro = os.path.join(stale_tail, entry["repro"])
    # Every finding file has its script, and no script outlives its finding (the first sighting's went with it).
    on_disk = sorted(n for n in os.listdir(os.path.join(stale_tail, "findings")) if not n.startswith("."))
    assert on_disk == sorted(n for f in on_disk if f.endswith(".json") for n in (f, f"repro_{f[:-5]}.py"))
    res = _script(repro)
    assert res.returncode == 1, res.stderr
    assert f"finding {finding.id}: ENC-EQUAL on target encoder-mutant:stale-tail" in res.stdout
    assert "REPRODUCED ENC-EQUAL: item" in res.stdout
    capsys.readouterr()
    assert main(["replay", repro]) == 1  # the script, run in its own process
    # The same script for the reference manager: not reproduced, exit 0.
    from cgsim.report.repro import write_repro

    fixed = write_repro(str(tmp_path), finding.with_(target="encoder-reference"))
    res = _script(fixed)
    assert res.returncode == 0 and "not reproduced: ENC-EQUAL holds on this run" in res.stdout, res.stdout
    # A target this cgsim does not have: it cannot run here, exit 2 with one line.
    broken = write_repro(str(tmp_path), finding.with_(target="encoder-mutant:gone"))
    res = _script(broken)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "unknown encoder-mutant 'gone'" in res.stderr


@pytest.mark.slow
def test_an_encoder_finding_records_the_vllm_source_tree_where_replays_look_for_it(tmp_path, monkeypatch):
    from cgsim.encoder.mutants import ENCODER_MUTANTS
    from cgsim.encoder.targets import ReferenceEncoderTarget

    class OnATree(ReferenceEncoderTarget):
        def environment(self):
            return {"vllm_version": "0.34.0", "vllm_source": str(tmp_path), "vllm_source_commit": "abc"}

    target = OnATree("encoder-reference", ENCODER_MUTANTS["stale-tail"].cls)
    assert _campaign_on(monkeypatch, tmp_path / "r", target, 300) == 1
    (f,) = [f for f in _findings(tmp_path / "r") if f["property"] == "ENC-EQUAL"]
    assert (f["vllm_source"], f["vllm_source_commit"], f["vllm_version"]) == (str(tmp_path), "abc", "0.34.0")


@pytest.mark.slow
def test_a_repro_script_shows_its_scenario_as_data_and_as_code(stale_tail):
    from cgsim.encoder.values import EncoderScenario

    entry = _entry(stale_tail)
    finding = load_finding(os.path.join(stale_tail, entry["file"]))
    repro = os.path.join(stale_tail, entry["repro"])
    res = _script(repro, "--show-scenario")
    assert res.returncode == 0 and json.loads(res.stdout) == finding.scenario
    res = _script(repro, "--show-code")
    assert res.returncode == 0
    namespace: dict = {}
    exec(res.stdout, namespace)  # noqa: S102 - the code cgsim wrote for this scenario
    assert namespace["scenario"] == EncoderScenario.from_json(finding.scenario)
    assert "# the plan of design encoder: budgets" in res.stdout


@pytest.mark.parametrize("steps, config, ruleset, seed", [
    ((("capture", ()), ("encode", ((2, 4, 4, True), (1, 2, 2, True))), ("clear", ()), ("encode", ((1, 2, 6, False),))),
     {"token_budgets": (32, 32), "max_vision_items": 2, "max_frames_per_batch": 0, "video": True}, "encoder", 3),
    ((("capture", ()), ("encode", ((1, 2, 2, False),))), {"max_token_budget": 64, "tp_size": 2, "dp_encoder": True,
                                                           "video": False}, "vllm-encoder-0.34", 0),
])
def test_the_scenario_code_builds_the_scenario(steps, config, ruleset, seed):
    from cgsim.encoder.code import encoder_scenario_code
    from cgsim.encoder.values import (
        EncoderConfig,
        EncoderItem,
        EncoderScenario,
        EncoderStep,
    )

    sc = EncoderScenario(EncoderConfig(**config), tuple(EncoderStep(k, tuple(EncoderItem(*i) for i in items))
                                                        for k, items in steps), ruleset, seed)
    namespace: dict = {}
    exec(encoder_scenario_code(sc), namespace)  # noqa: S102 - cgsim's own generated code
    assert namespace["scenario"] == sc


# -- the report -------------------------------------------------------------------------


@pytest.mark.slow
def test_the_campaign_report_lists_the_encoder_finding_with_its_scenario_code_and_only_encoder_properties(stale_tail):
    with open(os.path.join(stale_tail, "summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    entry = _entry(stale_tail)
    assert "EncoderScenario(" in entry["scenario_code"] and entry["scenario_code"].count("EncoderStep(") >= 2
    # Only the encoder family's properties (and the harness's, which watch every scenario) are listed.
    assert set(summary["properties"]) >= {"ENC-EQUAL", "ENC-FIT"}
    assert not [p for p in summary["properties"] if not p.startswith(("ENC-", "NO-"))], sorted(summary["properties"])
    with open(os.path.join(stale_tail, "index.md"), encoding="utf-8") as fh:
        page = fh.read()
    assert entry["id"] in page and "ENC-EQUAL" in page and "DISPATCH-" not in page


@pytest.mark.slow
def test_fuzz_report_rebuilds_an_encoder_run_even_one_that_died_before_its_summary(stale_tail, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(stale_tail, run)
    entry = _entry(str(run))
    for name in ("summary.json", "index.md", "index.html", entry["repro"]):
        os.remove(run / name)
    assert main(["report", str(run), "--quiet"]) == 1
    summary = json.loads((run / "summary.json").read_text())
    assert [f["id"] for f in summary["findings"]] == [entry["id"]]
    assert (run / entry["repro"]).exists() and entry["id"] in (run / "index.md").read_text()


def test_the_report_of_a_labelled_encoder_finding_says_its_defect_and_launch():
    from cgsim.report.markdown import render_markdown
    from cgsim.report.summary import build_summary

    finding = load_finding(next(p for p in ENCODER_FINDINGS if "enc-fit" in p))
    summary = build_summary(run_id="r", settings={"target": "vllm-encoder", "backend": "mock",
                                                  "ruleset": "vllm-encoder-0.32"}, findings=[finding])
    md = render_markdown(summary)
    assert "vllm-enc-2" in md and finding.extra["launch"]["line"] in md
    assert "EncoderScenario(" in summary["findings"][0]["scenario_code"]
    assert not [p for p in summary["properties"] if not p.startswith(("ENC-", "NO-"))]


# -- export-test ------------------------------------------------------------------------


@pytest.mark.slow
def test_export_test_sends_a_reference_or_mutant_finding_to_its_repro_script(stale_tail, capsys):
    entry = _entry(stale_tail)
    capsys.readouterr()
    assert main(["export-test", os.path.join(stale_tail, entry["file"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cgsim's own 'encoder-mutant:stale-tail' manager" in err
    assert "export-test writes tests for engine targets (vllm)" in err and f"findings/repro_{entry['id']}.py" in err


ALLOWED_TOP_LEVEL = {"vllm", "torch", "pytest"} | set(sys.stdlib_module_names)


def _imported(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant):
            out.add(str(node.args[0].value).split(".")[0])
    return out


def test_the_documented_vllm_encoder_findings_are_here():
    """docs/encoder-findings holds vllm-enc-1 and vllm-enc-2 (docs/encoder-findings/documented.py writes them)."""
    found = {(load_finding(p).property, load_finding(p).extra.get("known_defect")) for p in ENCODER_FINDINGS}
    assert {("ENC-CAPTURE-ONCE", "vllm-enc-1"), ("ENC-FIT", "vllm-enc-2")} <= found


@pytest.mark.parametrize("path", ENCODER_FINDINGS, ids=[os.path.basename(p)[:-5] for p in ENCODER_FINDINGS])
def test_a_vllm_encoder_finding_exports_a_standalone_test(path, tmp_path, capsys):
    finding = load_finding(path)
    out = tmp_path / "test_exported.py"
    assert main(["export-test", path, "-o", str(out)]) == 0
    text = out.read_text()
    tree = ast.parse(text)
    assert _imported(tree) <= ALLOWED_TOP_LEVEL, _imported(tree) - ALLOWED_TOP_LEVEL
    assert "cgsim." not in "".join(n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    assert len(tests) == 1
    doc = ast.get_docstring(tree)
    assert finding.id in doc and finding.property in doc and finding.extra["launch"]["line"].split()[-1] in doc
    assert f"docs/encoder.md {finding.extra['known_defect']}" in doc and "Cause in vLLM's code" in doc
    assert f"LAUNCH = {finding.extra['launch']['line']!r}" in text
    # The last assertion names the property (what tells a failing test from a broken one).
    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert) and n.msg is not None]
    assert f"{finding.property}:" in ast.unparse(asserts[-1].msg)
    # Each top-level name is defined once (cgsim's generated code and the harness do not clash).
    names = [t.id for n in tree.body for t in (n.targets if isinstance(n, ast.Assign) else []) if isinstance(t, ast.Name)]
    names += [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("change, words", [
    (lambda f: f.with_(property="ENC-NOPE"), "cannot write as a vLLM encoder test yet"),
    (lambda f: dataclasses.replace(f, extra={k: v for k, v in f.extra.items() if k != "launch"}),
     "records no vllm serve launch line"),
    (lambda f: f.with_(scenario={**f.scenario, "config": {**f.scenario["config"], "tp_size": 2, "dp_encoder": True}}),
     "data-parallel over 2 ranks"),
])
def test_what_export_test_cannot_write_for_the_encoder_is_one_line_exit_2(tmp_path, capsys, change, words):
    f = change(load_finding(ENCODER_FINDINGS[0]))
    path = tmp_path / "f.json"
    path.write_text(json.dumps(f.to_json()))
    assert main(["export-test", str(path)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_the_exported_toy_is_cgsims_toy_and_runs_without_cgsim(tmp_path):
    """The toy encoder and runner helpers an exported test carries are generated
    from cgsim's source: without cgsim importable they run and compute what
    cgsim's own modules compute."""
    import torch

    from cgsim.encoder.runner import groups_from_log
    from cgsim.encoder.toy import ToyVisionEncoder
    from cgsim.encoder.values import EncoderItem
    from fuzz.export_test.standalone import standalone_source
    from fuzz.export_test.vllm_encoder import STANDALONE_PARTS

    source = standalone_source(list(STANDALONE_PARTS))
    assert "cgsim" not in "".join(line for line in source.splitlines() if line.startswith(("import", "from")))
    probe = """
import json, sys
sys.modules["cgsim"] = None  # cgsim cannot be imported here
sys.modules["fuzz"] = None
exec(open(sys.argv[1]).read())
toy = ToyVisionEncoder(min_budget=4, max_budget=16, max_frames_per_video=2, device=torch.device("cpu"), seed=3)
items = [EncoderItem(2, 2, 4, True), EncoderItem(1, 2, 2, True)]
kw = toy.inputs(items, seed=7)
capture = toy.prepare_encoder_cudagraph_capture_inputs(16, 2, 2, torch.device("cpu"), torch.float32).values
replay = toy.prepare_encoder_cudagraph_replay_buffers(kw, 2, 2).values
for key, buf in capture.items():
    toy.get_encoder_cudagraph_config().padding_logics.get(key, lambda d, s: d[: s.shape[0]].copy_(s))(buf, replay[key])
graph = toy.encoder_cudagraph_forward(capture)
out = {"reference": [r.tolist() for r in toy.reference(kw)], "graph": graph.tolist(),
       "groups": [list(g.ids) + [g.budget] for g in groups_from_log(0, [("replay", (0, 1)), ("output", (0, 1), 16)], items)]}
print(json.dumps(out))
"""
    (tmp_path / "standalone.py").write_text("from __future__ import annotations\n" + source)
    (tmp_path / "probe.py").write_text(probe)
    res = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(tmp_path / "standalone.py")],
                         check=False, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout)
    toy = ToyVisionEncoder(min_budget=4, max_budget=16, max_frames_per_video=2, device=torch.device("cpu"), seed=3)
    items = [EncoderItem(2, 2, 4, True), EncoderItem(1, 2, 2, True)]
    kw = toy.inputs(items, seed=7)
    capture = toy.prepare_encoder_cudagraph_capture_inputs(16, 2, 2, torch.device("cpu"), torch.float32).values
    replay = toy.prepare_encoder_cudagraph_replay_buffers(kw, 2, 2).values
    for key, buf in capture.items():
        toy.get_encoder_cudagraph_config().padding_logics.get(key, lambda d, s: d[: s.shape[0]].copy_(s))(buf, replay[key])
    assert got["reference"] == [r.tolist() for r in toy.reference(kw)]
    assert got["graph"] == toy.encoder_cudagraph_forward(capture).tolist()
    assert got["groups"] == [[0, 1, 16]] == [list(g.ids) + [g.budget] for g in
                                             groups_from_log(0, [("replay", (0, 1)), ("output", (0, 1), 16)], items)]


def test_the_standalone_generator_refuses_what_it_cannot_follow(tmp_path, monkeypatch):
    from fuzz.export_test import standalone

    pkg = tmp_path / "cgsim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cgsim.b import helper as h\n\ndef f():\n    return h()\n")
    (pkg / "b.py").write_text("import os\n\ndef helper():\n    return os.sep\n\ndef f():\n    return 1\n")
    (pkg / "c.py").write_text("from cgsim.b import helper\n\ndef g():\n    return helper()\n")
    (pkg / "d.py").write_text("def f():\n    return 2\n")
    monkeypatch.setattr(standalone, "_ROOT", str(tmp_path))
    with pytest.raises(standalone.StandaloneError, match="without aliases"):
        standalone.standalone_source([standalone.Part("cgsim.a")])
    with pytest.raises(standalone.StandaloneError, match="f is defined in both"):
        standalone.standalone_source([standalone.Part("cgsim.b", ("f",)), standalone.Part("cgsim.d")])
    text = standalone.standalone_source([standalone.Part("cgsim.c")])
    namespace: dict = {}
    exec(text, namespace)  # noqa: S102
    assert namespace["g"]() == os.sep and text.startswith("import os\n") and "cgsim" not in text.split("#")[0]


def test_the_reference_runs_clean_and_counts_what_it_judged(tmp_path):
    assert _run(tmp_path, "--target", "encoder-reference", "--max-examples", "120", "--seed", "2") == 0
    summary = _summary(tmp_path)
    assert summary["findings"] == [] and summary["scenarios"] == 120
    assert summary["properties"]["ENC-EQUAL"]["checks"] > 0 and summary["properties"]["ENC-FIT"]["checks"] > 0
    assert summary["coverage"]["step_kinds"]["capture"] >= 120 and sum(summary["coverage"]["outcomes"].values()) == 120
    assert os.path.exists(os.path.join(tmp_path, "latest", "index.md"))


@pytest.mark.parametrize("args, words", [
    (("--target", "encoder-reference", "--ruleset", "vllm-v1"), "encoder ruleset 'vllm-v1' is unknown"),
    (("--target", "encoder-reference", "--workers", "999"), "--workers 999: there are"),
    (("--target", "encoder-mutant:nope"), "unknown encoder-mutant 'nope'"),
])
def test_what_an_encoder_campaign_cannot_do_is_one_line_exit_2(tmp_path, capsys, args, words):
    assert _run(tmp_path, *args, "--max-examples", "1") == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def _campaign_on(monkeypatch, tmp_path, target, examples: int = 5, *more: str) -> int:
    """``python -m fuzz run`` against ``target``, registered as encoder-reference (the workers fork, and
    inherit it): its exit status."""
    from cgsim.encoder import search
    from cgsim.targets import registry
    from cgsim.targets.base import ENCODER_HOOKS

    real = registry.families()
    family = registry.TargetFamily("encoder-reference", "a test target", lambda _variant: target,
                                   capture_family="encoder", hooks=ENCODER_HOOKS)
    monkeypatch.setattr(registry, "families", lambda: {**real, "encoder-reference": family})
    monkeypatch.setattr(search, "_targets", {})
    return _run(tmp_path, "--target", "encoder-reference", "--max-examples", str(examples), "--seed", "1", *more)


@pytest.mark.slow
def test_a_new_defect_behind_a_property_a_documented_one_already_violates_is_still_found(tmp_path, monkeypatch):
    from cgsim.encoder.mutants import ENCODER_MUTANTS
    from cgsim.encoder.targets import ReferenceEncoderTarget
    from cgsim.targets.base import EncoderHooks

    def classify(scenario, trace, violation):
        # "documented" where the scenario encodes a video: the stale rows of image batches stay new.
        return {"known_defect": "doc"} if any(i.video for s in scenario.steps for i in s.items) else {}

    target = ReferenceEncoderTarget("encoder-reference", ENCODER_MUTANTS["stale-tail"].cls)
    target.encoder = EncoderHooks(classify=classify)
    assert _campaign_on(monkeypatch, tmp_path, target, 600, "--seed", "3") == 1
    labels = {f.get("known_defect") for f in _findings(tmp_path) if f["property"] == "ENC-EQUAL"}
    assert labels == {"doc", None}


def test_an_exception_in_cgsims_front_door_is_an_adapter_error_exit_2_not_a_traceback(tmp_path, monkeypatch, capsys):
    from cgsim.encoder.mutants import ENCODER_MUTANTS
    from cgsim.encoder.targets import ReferenceEncoderTarget

    class BrokenFrontDoor(ReferenceEncoderTarget):
        def reach(self, scenario):
            return scenario.config.no_such_field  # what reading an engine config of another release did

    assert _campaign_on(monkeypatch, tmp_path, BrokenFrontDoor("x", ENCODER_MUTANTS["stale-tail"].cls)) == 2
    assert not _findings(tmp_path)
    err = capsys.readouterr().err
    assert "cgsim's encoder front door raised AttributeError" in err and err.count("\n") == 1


def _raise_in(filename: str) -> None:
    """Raise with the innermost frame in ``filename`` (what the adapter-error rule reads)."""
    exec(compile("raise RuntimeError('boom')", filename, "exec"), {})


@pytest.mark.parametrize("where, exit_code", [
    (os.path.join("site-packages", "vllm", "v1", "worker", "encoder_cudagraph.py"), 1),  # the engine's: judged
    (os.path.join(os.path.dirname(os.path.abspath(__import__("cgsim").__file__)), "encoder", "runner.py"), 2),
])
def test_an_engine_manager_raising_is_judged_and_cgsims_own_frames_raising_is_exit_2(tmp_path, monkeypatch, capsys,
                                                                                     where, exit_code):
    from cgsim.encoder.reference import ReferenceEncoderManager
    from cgsim.encoder.targets import ReferenceEncoderTarget

    class Engine(ReferenceEncoderTarget):  # an engine target: reach gives a launch, so cgsim's frames are suspect
        def reach(self, scenario):
            return scenario, {"line": "engine serve"}

    class CrashingManager(ReferenceEncoderManager):
        def capture(self, graph_pool=None):
            _raise_in(where)

    assert _campaign_on(monkeypatch, tmp_path, Engine("x", CrashingManager)) == exit_code
    if exit_code == 1:
        assert {f["property"] for f in _findings(tmp_path)} == {"ENC-NO-CRASH"}
    else:
        err = capsys.readouterr().err
        assert not _findings(tmp_path) and "cgsim's encoder adapter raised RuntimeError" in err and err.count("\n") == 1


@pytest.mark.slow
def test_workers_search_into_one_findings_folder_and_keep_one_finding_per_defect(tmp_path):
    # --force-workers: two workers whatever this machine's CPU count (the bound is tested above).
    assert _run(tmp_path, "--target", "encoder-mutant:stale-tail", "--workers", "2", "--force-workers",
                "--max-examples", "300", "--seed", "3") == 1
    summary = _summary(tmp_path)
    assert summary["scenarios"] >= 300  # --max-examples over all workers, and the shrinks' runs
    keys = [(f["property"], f.get("known_defect")) for f in summary["findings"]]
    assert "ENC-EQUAL" in {p for p, _ in keys} and len(keys) == len(set(keys))
    assert {f["id"] for f in _findings(tmp_path)} >= {f["id"] for f in summary["findings"]}
    assert {w["worker"] for w in summary["workers"]} == {0, 1}


@pytest.mark.slow
def test_the_example_database_replays_an_encoder_failure_first_in_the_next_campaign(tmp_path):
    db = str(tmp_path / "db")
    assert _run(tmp_path / "a", "--target", "encoder-mutant:stale-tail", "--max-examples", "300", "--seed", "1",
                "--example-db", db) == 1
    first = {f["id"] for f in _summary(tmp_path / "a")["findings"]}
    # One example: the saved failure, replayed before anything is drawn, is found again.
    assert _run(tmp_path / "b", "--target", "encoder-mutant:stale-tail", "--max-examples", "1", "--seed", "9",
                "--example-db", db) == 1
    assert {f["id"] for f in _summary(tmp_path / "b")["findings"]} & first
