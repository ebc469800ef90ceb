"""Report files: atomic writes, finding JSON, JUnit XML, index.md, repro scripts."""

from __future__ import annotations

import ast
import json
import os
import runpy
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from cgsim.config import ManagerConfig
from cgsim.finding import Finding, FindingError, finding_id
from cgsim.report import (
    atomic_write_text,
    load_finding,
    render_junit,
    render_markdown,
    render_repro,
    scan_findings,
    write_finding,
    write_repro,
)
from cgsim.report.repro import TEMPLATE_PATH
from cgsim.scenario import Scenario, Step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def scenario(**cfg) -> Scenario:
    return Scenario(ManagerConfig(**cfg), (Step.capture(),))


def finding(prop="CAPTURE-ORDER", target="mutant:full-before-piecewise", message="FULL captured before PIECEWISE", **kw):
    return Finding(
        property=prop, message=message, target=target, backend="mock",
        scenario=kw.pop("scenario_json", scenario().to_json()), status=kw.pop("status", "shrunk"),
        scenario_short="Scenario(...)", run_id="run", worker=0, **kw,
    )


# -- atomic writes ---------------------------------------------------------------
def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path):
    p = tmp_path / "f.txt"
    atomic_write_text(str(p), "one")
    atomic_write_text(str(p), "two")
    assert p.read_text() == "two"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_failed_atomic_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "f.txt"
    atomic_write_text(str(p), "old")
    with pytest.raises(TypeError):
        atomic_write_text(str(p), 12345)  # type: ignore[arg-type]
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]


# -- findings ---------------------------------------------------------------------------
def test_finding_id_is_stable_and_distinguishes_inputs():
    s = scenario().to_json()
    a = finding_id("reference", "CAPTURE-ORDER", s)
    assert a == finding_id("reference", "CAPTURE-ORDER", json.loads(json.dumps(s)))
    assert a.startswith("capture-order-")
    assert a != finding_id("mutant:x", "CAPTURE-ORDER", s)
    assert a != finding_id("reference", "CAPTURE-ONCE", s)
    assert a != finding_id("reference", "CAPTURE-ORDER", scenario(capture_sizes=(1, 2)).to_json())


def test_finding_round_trip(tmp_path):
    f = finding()
    path = write_finding(str(tmp_path), f)
    assert load_finding(path) == f
    assert scan_findings(str(tmp_path)) == [f]
    assert Scenario.from_json(f.scenario) == scenario()


def test_findings_of_renamed_properties_still_load(tmp_path):
    old = finding(prop="NO-HANG").to_json()
    old["property"], old["id"] = "TARGET-HANG", "target-hang-0123456789"
    (tmp_path / "old.json").write_text(json.dumps(old))
    f = load_finding(str(tmp_path / "old.json"))
    assert f.property == "NO-HANG" and f.extra["recorded_as"] == "TARGET-HANG"


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "cannot read"),
        ("{not json", "not valid JSON"),
        ('{"hello": 1}', "not a cgsim finding"),
        ('{"schema": "cgsim.finding", "schema_version": 99}', "schema_version"),
        ('{"schema": "cgsim.finding", "schema_version": 1, "id": "x"}', "lacks the field"),
    ],
)
def test_bad_finding_files_raise_one_clear_error(tmp_path, content, words):
    p = tmp_path / "f.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(FindingError, match=words):
        load_finding(str(p))


# -- repro scripts ----------------------------------------------------------------------------
def _statements(tree: ast.Module) -> list[str]:
    return [type(n).__name__ for n in tree.body]


def test_repro_carries_the_finding_as_data_only():
    nasty = 'x"""\nimport os; os.system("echo pwned")  # \\" \u00e9 \U0001f600'
    f = finding(message=nasty)
    text = render_repro(f)
    template = open(TEMPLATE_PATH).read()
    # The script is the template's code with one value changed, the JSON
    # literal; the scenario as code is comment lines only.
    tree, ttree = ast.parse(text), ast.parse(template)
    assert _statements(tree) == _statements(ttree)
    literal = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "FINDING_JSON").value
    assert isinstance(literal, ast.Constant) and json.loads(literal.value) == f.to_json()
    tliteral = next(n for n in ttree.body if isinstance(n, ast.Assign) and n.targets[0].id == "FINDING_JSON").value
    literal.value = tliteral.value
    assert ast.dump(tree) == ast.dump(ttree)
    template_lines = set(template.splitlines())
    added = [line for line in text.splitlines() if line not in template_lines]
    code_lines = [line for line in added if line.startswith("#|")]
    assert code_lines and all(line.startswith("#") or line in text[text.index("FINDING_JSON"):] for line in added)


def test_repro_script_reproduces_and_reports_fixed(tmp_path, capsys):
    bad = finding()
    path = write_repro(str(tmp_path), bad)
    assert os.access(path, os.X_OK)
    main = runpy.run_path(path, run_name="repro")["main"]
    assert main([]) == 1
    out = capsys.readouterr().out
    assert "REPRODUCED CAPTURE-ORDER" in out
    fixed = finding(target="reference")
    main = runpy.run_path(write_repro(str(tmp_path), fixed), run_name="repro")["main"]
    assert main(["--backend", "mock"]) == 0
    assert "not reproduced" in capsys.readouterr().out
    assert main(["--show-scenario"]) == 0
    assert json.loads(capsys.readouterr().out) == fixed.scenario


def test_repro_script_shows_the_scenario_as_code_with_its_resolved_mode(tmp_path, capsys):
    """The scenario as builder calls, every non-default field written (here
    compiled_piecewise=False, which makes FULL_AND_PIECEWISE resolve to
    FULL_DECODE_ONLY), at the top of the script and with --show-code; the
    JSON is readable, one key a line."""
    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario, Step

    sc = Scenario(ManagerConfig(capture_sizes=(1,), max_num_reqs=1, compiled_piecewise=False),
                  (Step.capture(), Step.dispatch(Batch((1,)))), ruleset="vllm-0.32")
    f = finding(scenario_json=sc.to_json())
    path = write_repro(str(tmp_path), f)
    text = open(path).read()
    assert "#|         compiled_piecewise=False," in text
    assert "#| # resolved mode FULL_DECODE_ONLY (requested FULL_AND_PIECEWISE) under ruleset vllm-0.32" in text
    assert '\n "property": "CAPTURE-ORDER",\n' in text and len(max(text.splitlines(), key=len)) < 400
    main = runpy.run_path(path, run_name="repro")["main"]
    assert main(["--show-code"]) == 0
    code = capsys.readouterr().out
    namespace: dict = {}
    exec(code, namespace)  # the code builds the very scenario
    assert namespace["scenario"] == sc
    assert "FULL_AND_PIECEWISE->FULL_DECODE_ONLY" in sc.short()


def test_scenario_code_builds_every_documented_finding(tmp_path):
    import glob

    from cgsim.scenario import Scenario
    from cgsim.scenario_code import scenario_code

    paths = glob.glob(os.path.join(ROOT, "docs", "findings", "*.json")) + glob.glob(
        os.path.join(ROOT, "docs", "sglang-findings", "*.json"))
    assert paths
    for path in paths:
        sc = Scenario.from_json(json.load(open(path))["scenario"])
        namespace: dict = {}
        exec(scenario_code(sc), namespace)
        assert namespace["scenario"] == sc, path


def test_repro_script_without_gpu_is_an_environment_error(tmp_path, capsys):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present")
    except ImportError:
        pass
    main = runpy.run_path(write_repro(str(tmp_path), finding()), run_name="repro")["main"]
    assert main(["--backend", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1


def test_repro_script_runs_standalone(tmp_path):
    path = write_repro(str(tmp_path), finding())
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "REPRODUCED CAPTURE-ORDER" in proc.stdout
    assert "hypothesis" not in proc.stdout.lower()


# -- summary renderings -----------------------------------------------------------------------------
def summary_with(findings):
    from cgsim.report.summary import finding_entries

    findings = finding_entries(findings, "mock")
    return {
        "run_id": "run-1",
        "complete": True,
        "interrupted": None,
        "started_at": "2026-01-01T00:00:00",
        "elapsed_s": 1.5,
        "scenarios": 10,
        "settings": {"target": "mutant:x", "backend": "mock", "ruleset": "any", "seed": 0, "budget_s": 1, "workers": 1, "profile": "dev"},
        "properties": {
            "CAPTURE-ORDER": {"statement": "PIECEWISE first", "checks": 10, "failures": 3},
            "CAPTURE-ONCE": {"statement": "once", "checks": 10, "failures": 0},
            "DECODE-LENGTHS": {"statement": "lens", "checks": 0, "failures": 0},
        },
        "coverage": {"modes": {"FULL": 4, "PIECEWISE": 6}, "batch_kinds": {"mixed": 3}},
        "findings": findings,
        "workers": [{"worker": 0, "scenarios": 10, "restarts": 0, "end": "done"}],
        "notes": [],
    }


def test_junit_has_one_testcase_per_property_and_findings_as_failures():
    s = summary_with([finding()])
    f = s["findings"][0]
    root = ET.fromstring(render_junit(s))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {"CAPTURE-ORDER", "CAPTURE-ONCE", "DECODE-LENGTHS"}
    assert root.get("tests") == "3" and root.get("failures") == "1" and root.get("skipped") == "1"
    failure = cases["CAPTURE-ORDER"].find("failure")
    assert failure is not None and "FULL captured before PIECEWISE" in failure.get("message")
    props = {p.get("name"): p.get("value") for p in cases["CAPTURE-ORDER"].iter("property")}
    assert props["repro"] == f["repro_path"] and props["finding"] == f["id"]
    assert cases["CAPTURE-ONCE"].find("failure") is None
    assert cases["DECODE-LENGTHS"].find("skipped") is not None


def test_index_md_shows_settings_coverage_and_replay():
    s = summary_with([finding()])
    f = s["findings"][0]
    md = render_markdown(s)
    assert "1 finding(s)" in md and f["id"] in md
    assert f["replay_command"] in md and f"python {f['repro_path']}" in md
    assert '"capture_sizes"' in md  # the shrunk Scenario as JSON
    assert "```python\nfrom cgsim.config import ManagerConfig" in md and "# resolved mode" in md  # ... and as code
    assert "## Coverage" in md and "PIECEWISE ×6" in md
    assert "| `mutant:x` |" in md


def test_a_summary_lists_the_properties_of_the_rulesets_the_campaign_ran():
    """The rulesets a campaign ran (its workers' coverage) or was pinned to
    decide its property rows; a row of another design goes even from a
    summary an older cgsim wrote with every row (``fuzz report`` rebuilds
    from its counts), and a property with a finding always has its row."""
    from cgsim.properties import ALL_PROPERTIES
    from cgsim.report.summary import build_summary

    def rows(settings, stats=(), findings=()):
        return build_summary(run_id="r", settings=settings, findings=list(findings), stats=stats)["properties"]

    ran = {"scenarios": 2, "coverage": {"rulesets": {"sglang-0.5.22": 2}}}
    assert "SGL-DISPATCH-SOUND" in rows({"ruleset": "sglang"}) and "SGL-DISPATCH-SOUND" in rows({}, [ran])
    assert "DISPATCH-PRIORITY" not in rows({}, [ran])  # waived by SGLang's designs
    old = {"scenarios": 3, "checks": {**{pid: 0 for pid in ALL_PROPERTIES}, "CAPTURE-ORDER": 3},
           "coverage": {"rulesets": {"vllm-0.32": 3}}}
    for vllm in (rows({"ruleset": "any"}), rows({"ruleset": "any"}, [old])):
        assert "DISPATCH-PRIORITY" in vllm and not any(pid.startswith("SGL-") for pid in vllm)
    assert rows({"ruleset": "any"}, [old])["CAPTURE-ORDER"]["checks"] == 3
    sgl = finding(prop="SGL-OUTPUT-ROWS", message="padded rows handed back")
    assert rows({"ruleset": "vllm-0.32"}, findings=[sgl])["SGL-OUTPUT-ROWS"]["failures"] == 1


def test_index_md_for_a_clean_partial_run():
    s = summary_with([])
    s.update(complete=False, interrupted="SIGINT")
    md = render_markdown(s)
    assert "no findings" in md and "PARTIAL (SIGINT)" in md


# -- file modes -------------------------------------------------------------------------------------
def test_report_files_get_the_mode_open_would_give(tmp_path):
    from cgsim.report import write_report

    old = os.umask(0o022)
    try:
        write_report(str(tmp_path), summary_with([finding()]))
        path = write_repro(str(tmp_path), finding())
        fpath = write_finding(str(tmp_path), finding())
        os.umask(0o077)  # a user who wants private files gets them
        atomic_write_text(str(tmp_path / "private.txt"), "x")
    finally:
        os.umask(old)
    for name in ("summary.json", "junit.xml", "index.md", os.path.basename(fpath)):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o644, name
    assert os.stat(path).st_mode & 0o777 == 0o755
    assert os.stat(tmp_path / "private.txt").st_mode & 0o777 == 0o600


# -- the findings store -----------------------------------------------------------------------------
def _store_finding(status, worker=0, incarnation=0, message="seen", cfg=None):
    return finding(status=status, message=message, scenario_json=scenario(**(cfg or {})).to_json()).with_(
        worker=worker, extra={"incarnation": incarnation})


def test_store_creates_provisional_findings_but_never_replaces_one(tmp_path):
    from cgsim.report.findings import FindingStore

    store = FindingStore(str(tmp_path), repro=write_repro)
    first = _store_finding("shrinking", worker=0)
    assert store.put(first) == "written"
    assert (tmp_path / first.repro).exists()  # every finding has its script
    assert store.put(_store_finding("pending", worker=1, message="other")) == "kept"
    assert load_finding(str(tmp_path / f"{first.id}.json")).message == "seen"


def test_store_replaces_a_provisional_file_only_with_its_shrunk_version(tmp_path):
    from cgsim.report.findings import FindingStore

    store = FindingStore(str(tmp_path), repro=write_repro)
    store.put(_store_finding("shrinking"))
    assert store.put(_store_finding("shrunk", message="final")) == "written"
    assert store.put(_store_finding("shrink-interrupted", worker=1, message="late")) == "kept"
    assert store.put(_store_finding("shrinking", worker=1, message="again")) == "kept"
    (only,) = scan_findings(str(tmp_path))
    assert only.status == "shrunk" and only.message == "final"


def test_store_removes_only_its_own_provisional_file(tmp_path):
    from cgsim.report.findings import FindingStore

    store = FindingStore(str(tmp_path), repro=write_repro)
    mine = _store_finding("shrinking", worker=0, incarnation=1)
    store.put(mine)
    assert not store.remove_own(mine.id, ("run", 1, 1))  # another worker
    assert not store.remove_own(mine.id, ("run", 0, 0))  # an earlier incarnation of the same worker
    assert store.remove_own(mine.id, ("run", 0, 1))
    assert scan_findings(str(tmp_path)) == [] and not (tmp_path / mine.repro).exists()
    final = _store_finding("shrunk", worker=0, incarnation=1)
    store.put(final)
    assert not store.remove_own(final.id, ("run", 0, 1))  # a final finding is never removed
    assert [f.id for f in scan_findings(str(tmp_path))] == [final.id]


def test_store_changes_nothing_when_the_writer_is_no_longer_allowed(tmp_path):
    from cgsim.report.findings import FindingStore

    live = FindingStore(str(tmp_path))
    f = _store_finding("shrinking")
    live.put(f)
    gone = FindingStore(str(tmp_path), allowed=lambda: False)  # e.g. an orphaned worker
    assert gone.put(_store_finding("shrunk", message="orphan")) is None
    assert gone.put(_store_finding("pending", cfg={"capture_sizes": (1, 2)})) is None
    assert gone.remove_own(f.id, ("run", 0, 0)) is False
    assert [(x.id, x.status, x.message) for x in scan_findings(str(tmp_path))] == [(f.id, "shrinking", "seen")]


def test_a_failed_write_keeps_the_provisional_file(tmp_path, monkeypatch):
    import errno

    from cgsim.report.findings import FindingStore

    store = FindingStore(str(tmp_path), repro=write_repro)
    store.put(_store_finding("shrinking"))

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        store.put(_store_finding("shrunk", message="final"))
    monkeypatch.undo()
    (only,) = scan_findings(str(tmp_path))
    assert only.status == "shrinking"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


# -- index.md ---------------------------------------------------------------------------------------------
def test_index_md_says_where_to_run_its_commands_and_shows_what_was_in_flight():
    s = summary_with([finding()])
    s.update(complete=False, interrupted="campaign died",
             inflight=[{"worker": 1, "started_at": "2026-01-01T00:00:05", "scenario_short": "Scenario(FULL, ...)",
                        "scenario": scenario().to_json()}])
    md = render_markdown(s)
    assert "relative to this run's directory" in md
    assert "PARTIAL (campaign died)" in md and "## In flight" in md and "Scenario(FULL, ...)" in md
    assert "`findings/" in md and "/findings/" not in md.replace("`findings/", "")


# -- repro scripts: quiet, strict exits ------------------------------------------------------------------------
@pytest.mark.slow
def test_repro_script_prints_no_numpy_warning_and_refuses_a_bad_timeout(tmp_path):
    path = write_repro(str(tmp_path), finding())
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=120)
    assert proc.returncode == 1 and "NumPy" not in proc.stderr and proc.stderr.strip() == "", proc.stderr
    proc = subprocess.run([sys.executable, path, "--timeout", "-1"], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--timeout" in proc.stderr
    proc = subprocess.run([sys.executable, path, "--timeout", "30s"], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=120)  # the durations every --timeout takes
    assert proc.returncode == 1, proc.stderr


def test_repro_script_exits_2_not_1_when_something_unexpected_breaks(tmp_path, capsys, monkeypatch):
    import cgsim.replay

    def broken(*a, **k):
        raise KeyError("internal")

    monkeypatch.setattr(cgsim.replay, "describe", broken)
    main = runpy.run_path(write_repro(str(tmp_path), finding()), run_name="repro")["main"]
    assert main([]) == 2  # exit 1 means "reproduced" and nothing else
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1


def test_scenario_code_of_a_served_scenario_builds_its_steps_and_names_their_origin():
    import dataclasses

    from cgsim.config import ManagerConfig
    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario, Served, Step
    from cgsim.scenario_code import scenario_code

    served = Served("AsyncScheduler", "vllm serve m --max-num-seqs 2", json.dumps({"requests": [{}, {}]}), 5)
    sc = Scenario(ManagerConfig(capture_sizes=(1, 2), max_num_reqs=2), (Step.capture(), Step.dispatch(Batch((1, 1)))),
                  served=served)
    code = scenario_code(sc)
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["scenario"] == dataclasses.replace(sc, served=None)
    assert "# the dispatch steps: what served by AsyncScheduler: 2 requests, 5 batches under `vllm serve m" in code
