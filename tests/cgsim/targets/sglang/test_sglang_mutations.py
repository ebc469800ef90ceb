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

from tests.sglang_required import require_sglang_or_skip
from cgsim.targets.sglang.mutation import MUTATIONS, MUTATIONS_ENV, Mutation, environment_for

VERSION = require_sglang_or_skip()

pytestmark = pytest.mark.sglang
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
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


# -- what the table's misses taught (each case failed before the fix it names) --------------------

_EXAMPLE = """
import json, sys
from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.properties import check_scenario
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step
from cgsim.targets import get_target
from cgsim.targets.sglang.compat import probe

get_target("sglang").prepare_environment()
config = ManagerConfig.from_json(json.loads(sys.argv[1]))
steps = [Step.capture()] + [Step.dispatch(Batch(tuple(q))) for q in json.loads(sys.argv[2])]
scenario = Scenario(config, tuple(steps), ruleset=probe().ruleset)
verdict = check_scenario(scenario, run_scenario(scenario, "sglang", timeout=300))
print(json.dumps(sorted({v.property for v in verdict.violations})))
"""


def violated_under(mutation: str, config: dict, batches: list) -> set[str]:
    env = dict(os.environ, PYTHONPATH=REPO, **{MUTATIONS_ENV: json.dumps([mutation])})
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", _EXAMPLE, json.dumps(config), json.dumps(batches)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return set(json.loads(res.stdout.strip().splitlines()[-1]))


DECODE = {"mode": "FULL_DECODE_ONLY", "capture_sizes": [1, 2, 4, 8], "max_num_reqs": 8}


def test_padded_logits_rows_are_seen():
    # The target records every output sglang slices, not only the hidden states.
    assert "SGL-OUTPUT-ROWS" in violated_under("logits-rows-padded", DECODE, [[1, 1, 1]])


def test_a_view_sglang_contradicts_is_its_crash_not_the_adapters():
    # The toy backend refuses a view of more query tokens than input rows as sglang's (EngineCallError).
    assert "NO-CRASH" in violated_under("replay-tokens-unpadded", DECODE, [[1, 1, 1]])


def test_a_dp_peer_holding_more_requests_than_rank_0():
    # Peers hold more requests than rank 0 (spec.sglang.dp_rank_sizes), so a rank padding to its own count shows.
    config = dict(DECODE, sglang={"dp_size": 2})
    assert "SGL-DISPATCH-SOUND" in violated_under("dp-own-count", config, [[1, 1, 1]])
