"""One-line bugs put into sglang's runner modules through the import hook
(CGSIM_SGLANG_MUTATIONS): each applies to the installed tree or is exit 2
naming it, a tree that crashes during capture is a NO-CRASH finding (never
"cannot capture here"), and every mutation of the table is caught where the
clean tree passes (its example scenario).  Each case runs in a fresh
process: the hook acts when sglang is first imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cgsim.targets import TargetEnvironmentError
from cgsim.targets.sglang import require_sglang
from cgsim.targets.sglang.mutation import MUTATIONS, MUTATIONS_ENV, Mutation, environment_for

try:  # the one allowed skip: sglang does not import in this interpreter
    VERSION = require_sglang()
except TargetEnvironmentError as exc:
    if os.environ.get("CGSIM_REQUIRE_SGLANG") == "1":
        raise
    pytest.skip(f"sglang cannot run here ({exc})", allow_module_level=True)

pytestmark = pytest.mark.sglang
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL = "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend"
# The graph store raises IndexError inside sglang's capture_one (the case).
CAPTURE_CRASH = Mutation(FULL, "        self._graphs[shape_key] = graph", "        self._graphs[shape_key] = [graph][1]",
                         "capture-index-error")


def campaign(tmp_path, env: dict, *args: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=REPO, **env)
    return subprocess.run([sys.executable, "-m", "fuzz", "run", "--target", "sglang", "--report-dir",
                           str(tmp_path / "reports"), "--quiet", *args], capture_output=True, text=True,
                          env=full_env, cwd=REPO, timeout=600)


def findings(tmp_path) -> list[dict]:
    out = []
    for root, _, files in os.walk(tmp_path / "reports"):
        out += [json.load(open(os.path.join(root, f))) for f in files
                if f.endswith(".json") and os.path.basename(root) == "findings"]
    return out


def test_a_tree_that_crashes_during_capture_is_a_finding(tmp_path):
    # An IndexError is a device-side assert on a GPU: NO-ILLEGAL-OP (runner.classify_error).
    res = campaign(tmp_path, environment_for([CAPTURE_CRASH]), "--max-examples", "3", "--seed", "1")
    assert res.returncode == 1, res.stderr[-2000:]
    crash = [f for f in findings(tmp_path) if f["property"] in ("NO-CRASH", "NO-ILLEGAL-OP")]
    assert crash and "IndexError" in crash[0]["message"], [f["message"] for f in findings(tmp_path)]
    assert "during capture" in crash[0]["message"]
    assert crash[0]["sglang_mutations"] == ["capture-index-error"]
    assert "cannot capture here" not in res.stderr


def test_a_mutation_whose_line_is_not_in_the_tree_is_exit_2_naming_it(tmp_path):
    wrong = Mutation(FULL, "        this line is in no sglang\n", "        x\n", "no-such-line")
    res = campaign(tmp_path, environment_for([wrong]), "--max-examples", "1")
    assert res.returncode == 2
    err = res.stderr.strip()
    assert "no-such-line" in err and "occurs 0 times" in err and "\n" not in err


def test_an_unknown_mutation_name_is_exit_2(tmp_path):
    res = campaign(tmp_path, {MUTATIONS_ENV: '["no-such-bug"]'}, "--max-examples", "1")
    assert res.returncode == 2 and "no mutation is named 'no-such-bug'" in res.stderr


def test_every_mutation_applies_to_its_release_tree():
    import importlib.util

    applies = [m.name for m in MUTATIONS
               if open(importlib.util.find_spec(m.module).origin, encoding="utf-8").read().count(m.old) == 1]
    if VERSION == "0.5.23":
        assert applies == [m.name for m in MUTATIONS]
    assert len(MUTATIONS) >= 15
    assert {m.area for m in MUTATIONS} >= {"padding", "buffer filling", "replay inputs", "output slicing", "warmup",
                                           "LoRA", "DP", "alignment"}
