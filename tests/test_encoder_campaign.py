"""Encoder campaigns from the command line: findings on disk with their
shrunk scenario, replays that reproduce them, refusals of what the encoder
campaign does not take."""

from __future__ import annotations

import json
import os

import pytest

from fuzz.cli import main


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


def test_a_mutant_is_found_shrunk_written_and_replayed(tmp_path, capsys):
    assert _run(tmp_path, "--target", "encoder-mutant:stale-tail", "--max-examples", "400", "--seed", "1",
                "--budget", "120s") == 1
    summary = _summary(tmp_path)
    (entry,) = [f for f in summary["findings"] if f["property"] == "ENC-EQUAL"]
    assert entry["status"] == "shrunk"
    path = os.path.join(tmp_path, "latest", entry["file"])
    with open(path, encoding="utf-8") as fh:
        finding = json.load(fh)
    assert finding["scenario"]["kind"] == "encoder" and finding["target"] == "encoder-mutant:stale-tail"
    # Shrunk to the bug: a larger batch, then a smaller one on the same graph.
    encodes = [s for s in finding["scenario"]["steps"] if s["kind"] == "encode"]
    assert len(encodes) == 2
    capsys.readouterr()
    assert main(["replay", path]) == 1
    assert "reproduced: ENC-EQUAL" in capsys.readouterr().out
    # The reference manager does not have the bug.
    finding["target"] = "encoder-reference"
    other = os.path.join(tmp_path, "as_reference.json")
    with open(other, "w", encoding="utf-8") as fh:
        json.dump(finding, fh)
    assert main(["replay", other]) == 0


def test_the_reference_runs_clean_and_counts_what_it_judged(tmp_path):
    assert _run(tmp_path, "--target", "encoder-reference", "--max-examples", "120", "--seed", "2") == 0
    summary = _summary(tmp_path)
    assert summary["findings"] == [] and summary["scenarios"] == 120
    assert summary["properties"]["ENC-EQUAL"]["checks"] > 0 and summary["properties"]["ENC-FIT"]["checks"] > 0
    assert os.path.exists(os.path.join(tmp_path, "latest", "index.md"))


@pytest.mark.parametrize("args, words", [
    (("--target", "encoder-reference", "--workers", "2"), "--workers is not taken by the encoder target"),
    (("--target", "encoder-mutant:nope"), "encoder mutant 'nope' is unknown"),
])
def test_what_an_encoder_campaign_cannot_do_is_one_line_exit_2(tmp_path, capsys, args, words):
    assert _run(tmp_path, *args, "--max-examples", "1") == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_a_new_defect_behind_a_property_a_documented_one_already_violates_is_still_found(tmp_path, monkeypatch):
    from cgsim.encoder.mutants import ENCODER_MUTANTS
    from cgsim.encoder.targets import ReferenceEncoderTarget
    from fuzz import encoder_campaign

    class Labelled(ReferenceEncoderTarget):
        def classify(self, scenario, trace, violation):
            # "documented" where the scenario encodes a video: the stale rows of image batches stay new.
            return {"defect": "doc"} if any(i.video for s in scenario.steps for i in s.items) else {}

    target = Labelled("encoder-mutant:stale-tail", ENCODER_MUTANTS["stale-tail"].cls)
    monkeypatch.setattr(encoder_campaign, "encoder_target", lambda name: target)
    result = encoder_campaign.run_encoder_campaign(encoder_campaign.EncoderCampaignOptions(
        target="encoder-mutant:stale-tail", budget_s=120, seed=3, max_examples=600, report_dir=str(tmp_path),
        quiet=True))
    labels = {f.extra.get("defect") for f in result.findings if f.property == "ENC-EQUAL"}
    assert labels == {"doc", None}


def _campaign_on(monkeypatch, tmp_path, target) -> int:
    """``python -m fuzz run`` against ``target`` (as encoder-reference): its exit status."""
    from fuzz import encoder_campaign

    monkeypatch.setattr(encoder_campaign, "encoder_target", lambda name: target)
    return _run(tmp_path, "--target", "encoder-reference", "--max-examples", "5", "--seed", "1")


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
