"""A vLLM tree with a capture or dispatch bug put in gets findings, not exit 2.

Each mutation (``cgsim.targets.vllm.mutation.MUTATIONS``) is a one-line bug
in the installed tree's own ``cudagraph_utils.py``, or in the elastic-EP
scale event that releases its graphs, put in as the module is imported; each
of ``SERVED_MUTATIONS`` one in a path only the runner takes, found by the
campaign's runner share.  A short campaign (counted in scenarios, not seconds) on the
mutated tree must exit 1 with the bug as a finding that no documented defect
claims, and ``fuzz doctor`` must not call the adapter broken.

Needs vLLM (the ``vllm-0.NN`` tox envs); skipped with the reason elsewhere,
unless CGSIM_REQUIRE_VLLM=1 says vLLM must be there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.targets.vllm.compat import require_vllm  # noqa: E402
from cgsim.targets.vllm.mutation import MUTATIONS, SERVED_MUTATIONS, Mutation, environment_for, in_tree  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
# What catches each mutation (any of these properties, unlabelled).
CAUGHT_BY = {
    "compat-exact-reqs": {"DISPATCH-COMPLETE", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP", "DISPATCH-MINIMAL"},
    "compat-exact-tokens": {"DISPATCH-COMPLETE", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP", "DISPATCH-MINIMAL"},
    "full-captured-first": {"CAPTURE-ORDER"},
    "capture-reuses-warmup-state": {"FRESH-METADATA"},
    "scale-event-keeps-graphs": {"RELEASE-RECAPTURE", "NO-CRASH", "CAPTURE-ONCE", "WARMUP-FIRST", "BEFORE-CAPTURE"},
}


def _fuzz(args: list[str], mutations: list[Mutation], tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, **environment_for(mutations), "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "fuzz", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_a_campaign_on_a_mutated_tree_reports_the_bug(mutation, tmp_path):
    reports = tmp_path / "reports"
    # The search tier finds the bug; the runner's confirmation phase is the front door test's.
    run = _fuzz(["run", "--target", "vllm", "--max-examples", "30", "--workers", "1", "--seed", "1",
                 "--report-dir", str(reports), "--quiet", "--no-runner-confirm"], [mutation], tmp_path)
    assert run.returncode == 1, (run.returncode, run.stderr[-2000:])
    summary = json.loads((reports / "latest" / "summary.json").read_text())
    caught = [f for f in summary["findings"] if f["property"] in CAUGHT_BY[mutation.name]]
    # The bug is new: no documented defect of the release claims it.  (The
    # release's own documented defects may show beside it, each labelled by
    # its cause: #1's fitting graph is missing from the manager's candidates.)
    new = [f for f in caught if f.get("known_defect") is None]
    assert new, [(f["property"], f.get("known_defect"), f["message"][:120]) for f in summary["findings"]]
    for f in caught:
        if f.get("known_defect") == "dynsd-nearest-group":
            assert f["facts"]["fit_in_candidates"] is False, f["facts"]
    assert all(f["launch"]["line"].startswith(("vllm serve", "VLLM_")) for f in new)


# One campaign (minutes): the input-preparation bug; the draft manager's is served directly (test_runner_serve.py).
@pytest.mark.parametrize("mutation", in_tree([m for m in SERVED_MUTATIONS if m.area == "input preparation"],
                                             require_vllm().location),
                         ids=lambda m: m.name)
def test_a_campaigns_runner_share_reports_a_bug_only_the_runner_runs(mutation, tmp_path):
    """A bug in a path only vLLM's runner takes: the search cannot see it, the
    launches the campaign serves end to end with graphs and eager do."""
    reports = tmp_path / "reports"
    # The share is what this checks: seed 11's cheapest launch (one FULL_AND_PIECEWISE graph of 7 tokens, one
    # request at a time) pads every decode, so the first launch served shows the bug; the confirmation of the
    # search's findings is the front door test's.
    run = _fuzz(["run", "--target", "vllm", "--max-examples", "5", "--workers", "1", "--seed", "11",
                 "--report-dir", str(reports), "--quiet", "--confirm-budget", "0", "--runner-share", "90s"],
                [mutation], tmp_path)
    summary = json.loads((reports / "latest" / "summary.json").read_text())
    assert run.returncode == 1, (run.returncode, run.stderr[-2000:], summary["notes"])
    served = [f for f in summary["findings"] if f["property"] == "SERVED-EQUALS-EAGER"]
    assert served and served[0]["runner_confirmation"]["verdict"] == "served", summary["notes"]
    assert served[0]["launch"]["line"].startswith(("vllm serve", "VLLM_"))


def test_the_doctor_of_a_mutated_tree_reports_findings_not_a_broken_adapter(tmp_path):
    run = _fuzz(["doctor"], [MUTATIONS[0]], tmp_path)
    assert run.returncode == 1, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert "finding(s) about the tree" in run.stdout and "FIND" in run.stdout


def test_a_mutation_that_does_not_apply_is_exit_2_in_one_line(tmp_path):
    wrong = Mutation(MUTATIONS[0].module, "this line is in no release\n", "", "nowhere")
    run = _fuzz(["doctor"], [wrong], tmp_path)
    assert run.returncode == 2, (run.returncode, run.stdout[-1000:], run.stderr[-1000:])
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "does not apply" in lines[0], run.stderr[-1000:]
