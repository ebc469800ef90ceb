"""vLLM's own EncoderCudaGraphManager through its front door: it passes
what the reference's mutants break, its documented defects reproduce from
their launch lines and are labelled, and a campaign finds nothing else.

Needs vLLM (CGSIM_VLLM_SOURCE for 0.33/0.34 trees); skipped with the reason
elsewhere, unless CGSIM_REQUIRE_VLLM=1."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.backends import get_backend  # noqa: E402
from cgsim.encoder.mutants import ENCODER_MUTANTS  # noqa: E402
from cgsim.encoder.observe import observe_encoder  # noqa: E402
from cgsim.encoder.values import EncoderConfig, EncoderItem, EncoderScenario, EncoderStep  # noqa: E402
from cgsim.targets.vllm.encoder import missing_model_interface  # noqa: E402
from tests.encoder_documented import DOCUMENTED  # noqa: E402
from fuzz.cli import main  # noqa: E402

pytestmark = pytest.mark.vllm
if missing_model_interface():  # 0.19-0.22: tests/cgsim/targets/vllm/test_vllm_encoder_front_door.py checks the target refuses them
    pytest.skip(f"vLLM's encoder manager here asks an older model interface ({missing_model_interface()}) than "
                "cgsim's toy speaks; the vllm-encoder target refuses it", allow_module_level=True)
BACKEND = get_backend("mock")


def _labels(target, sc: EncoderScenario) -> dict[str, str | None]:
    obs = observe_encoder(target, sc, BACKEND)
    assert obs.refused is None, obs.refused
    classify = target.encoder.classify
    return {v.property: classify(obs.scenario, obs.trace, v).get("known_defect") for v in obs.verdict.violations}


@pytest.mark.parametrize("name", sorted(ENCODER_MUTANTS))
def test_vllms_manager_passes_what_each_reference_mutant_breaks(vllm_encoder_target, name):
    sc = ENCODER_MUTANTS[name].example()
    sc = dataclasses.replace(sc, ruleset=vllm_encoder_target.default_ruleset())
    assert _labels(vllm_encoder_target, sc) == {}


def test_a_repeated_budget_is_captured_twice_documented(vllm_encoder_target):
    sc = EncoderScenario(EncoderConfig(token_budgets=(32, 32), max_num_batched_tokens=64),
                         (EncoderStep("capture"),), vllm_encoder_target.default_ruleset())
    assert _labels(vllm_encoder_target, sc) == {"ENC-CAPTURE-ONCE": "vllm-enc-1"}


def test_frames_beyond_the_users_limit_replay_on_a_graph_that_cannot_hold_them_documented(vllm_encoder_target):
    # Three items per graph, frame slots max(3, 2) = 3; two videos of two frames are packed into one replay.
    sc = EncoderScenario(EncoderConfig(max_vision_items=3, max_frames_per_batch=2, min_budget=16,
                                       max_num_batched_tokens=16),
                         (EncoderStep("capture"), EncoderStep("encode", (EncoderItem(2, 2, 2, True),) * 2)),
                         vllm_encoder_target.default_ruleset())
    labels = _labels(vllm_encoder_target, sc)
    assert labels.get("ENC-FIT") == "vllm-enc-2" and set(labels.values()) == {"vllm-enc-2"}
    # Without the user's frame limit the manager sizes frames itself and the batch fits.
    auto = dataclasses.replace(sc, config=dataclasses.replace(sc.config, max_frames_per_batch=None))
    assert _labels(vllm_encoder_target, auto) == {}


def test_a_campaign_finds_only_documented_defects(vllm_encoder_target, tmp_path):
    import json

    from cgsim.report.findings import scan_findings

    assert main(["run", "--target", "vllm-encoder", "--budget", "600s", "--seed", "1", "--max-examples", "250",
                 "--report-dir", str(tmp_path), "--quiet"]) in (0, 1)
    run_dir = os.path.realpath(os.path.join(tmp_path, "latest"))
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    outcomes = summary["coverage"]["outcomes"]
    assert summary["scenarios"] >= 250 and outcomes["judged"] > 0
    assert outcomes["judged"] + outcomes.get("refused by the engine", 0) == summary["scenarios"]
    findings = scan_findings(os.path.join(run_dir, "findings"))
    unlabelled = [(f.property, f.message, f.extra.get("launch", {}).get("line")) for f in findings
                  if not f.extra.get("known_defect")]
    assert not unlabelled
    assert all(f.extra["launch"]["line"].startswith(("vllm serve", "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve",
                                                     "VLLM_USE_V2_MODEL_RUNNER=0 vllm serve"))
               for f in findings)
    # Each finding on disk has its repro script beside it, and the report its page.
    assert all(os.path.exists(os.path.join(run_dir, "findings", f.repro)) for f in findings)
    assert os.path.exists(os.path.join(run_dir, "index.html"))


def _dp_scenario(target, tp: int) -> EncoderScenario:
    items = (EncoderItem(1, 4, 4), EncoderItem(1, 8, 4), EncoderItem(1, 2, 2), EncoderItem(1, 6, 6), EncoderItem(1, 4, 2))
    return EncoderScenario(EncoderConfig(min_budget=16, max_num_batched_tokens=128, tp_size=tp, dp_encoder=True),
                           (EncoderStep("capture"), EncoderStep("encode", items), EncoderStep("encode", items[:1])),
                           target.default_ruleset())


@pytest.mark.parametrize("tp", [2, 4])
def test_data_parallel_ranks_shard_and_gather_every_item_in_order(vllm_encoder_target, tp):
    from cgsim.encoder.trace import EncCapture, EncGroup  # noqa: PLC0415

    obs = observe_encoder(vllm_encoder_target, _dp_scenario(vllm_encoder_target, tp), BACKEND)
    assert obs.refused is None and obs.scenario.config.use_dp
    assert obs.verdict.ok, [str(v) for v in obs.verdict.violations]
    assert len({g.rank for g in obs.trace.of(EncGroup) if g.step == 1}) > 1
    assert sorted(e.rank for e in obs.trace.of(EncCapture)) == list(range(tp))


def test_a_gather_in_the_wrong_rank_order_is_caught(vllm_encoder_target, monkeypatch):
    import torch  # noqa: PLC0415

    from cgsim.targets.vllm import encoder_dp  # noqa: PLC0415

    right = encoder_dp.FakeGroup.all_gather

    def reversed_ranks(self, tensor, dim=-1):
        out = right(self, tensor, dim)
        return torch.cat(list(reversed(out.chunk(self.size, dim=dim))), dim=dim)

    monkeypatch.setattr(encoder_dp.FakeGroup, "all_gather", reversed_ranks)
    obs = observe_encoder(vllm_encoder_target, _dp_scenario(vllm_encoder_target, 2), BACKEND)
    assert "ENC-EQUAL" in {v.property for v in obs.verdict.violations}


# -- the documented findings as files: replay, repro scripts, export-test ------------------------

@pytest.mark.parametrize("path", DOCUMENTED, ids=[os.path.basename(p)[:-5] for p in DOCUMENTED])
def test_each_documented_finding_replays_labelled(vllm_encoder_target, path, capsys):
    from cgsim.report.findings import load_finding
    from fuzz.cli import main

    finding = load_finding(path)
    capsys.readouterr()
    assert main(["replay", path]) == 1
    out = capsys.readouterr().out
    assert f"REPRODUCED {finding.property}: " in out
    assert f"(documented defect {finding.extra['known_defect']}, docs/encoder.md)" in out.split("REPRODUCED", 1)[1]
    assert f"launch: {finding.extra['launch']['line']}" in out


def test_a_vllm_encoder_repro_script_reproduces_in_its_own_process(vllm_encoder_target, tmp_path):
    from cgsim.report.findings import load_finding
    from cgsim.report.repro import write_repro

    finding = load_finding(next(p for p in DOCUMENTED if "capture-once" in p))
    script = write_repro(str(tmp_path), finding)
    res = subprocess.run([sys.executable, script], check=False, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "REPRODUCED ENC-CAPTURE-ONCE: budgets [32] captured more than once (documented defect vllm-enc-1" \
        in res.stdout
