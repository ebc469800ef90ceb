"""python -m fuzz: exit codes, one-line errors, replay, explain, list."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cgsim.config import ManagerConfig
from cgsim.finding import Finding
from cgsim.report import write_finding
from cgsim.scenario import Scenario, Step
from fuzz.campaign import UsageError, parse_budget
from fuzz.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ``slow`` is registered by cgsim's pytest plugin; when the plugin is not
# loaded (cgsim not installed) --strict-markers would reject the marker, so
# the long tests are then opt-in through CGSIM_SLOW=1.
if "cgsim.pytest_plugin" in sys.modules:
    slow = pytest.mark.slow
else:
    slow = pytest.mark.skipif(not os.environ.get("CGSIM_SLOW"), reason="slow test: set CGSIM_SLOW=1 (or install cgsim for -m slow)")


def _no_gpu() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "args, words",
    [
        (["--target", "nope"], "unknown target"),
        (["--target", "mutant:nope"], "unknown mutant"),
        (["--ruleset", "nope"], "unknown ruleset"),
        (["--backend", "tpu"], "backend"),
        (["--budget", "60x"], "--budget"),
        (["--budget", "0s"], "--budget"),
        (["--workers", "0"], "--workers"),
    ],
)
def test_run_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, words):
    assert main(["run", "--report-dir", str(tmp_path), "--budget", "1s", *args]) == 2
    assert words in one_line_error(capsys)
    assert os.listdir(tmp_path) == []  # nothing started


@pytest.mark.skipif(not _no_gpu(), reason="a GPU is present")
def test_run_cuda_without_gpu_is_exit_2(tmp_path, capsys):
    assert main(["run", "--backend", "cuda", "--report-dir", str(tmp_path), "--budget", "1s"]) == 2
    assert "cuda" in one_line_error(capsys).lower()


def test_run_unwritable_report_dir_is_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["run", "--report-dir", str(blocker / "reports"), "--budget", "1s"]) == 2
    assert "not writable" in one_line_error(capsys)


def test_parse_budget():
    assert parse_budget("60s") == 60 and parse_budget("5m") == 300 and parse_budget("1h30m") == 5400
    assert parse_budget("90") == 90 and parse_budget("1.5s") == 1.5 and parse_budget("250ms") == 0.25
    for bad in ("60x", "", "s", "-5s", "5s3", "1e3"):
        with pytest.raises(UsageError):
            parse_budget(bad)


def test_run_subprocess_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "fuzz", "run", "--target", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "unknown target 'nope'" in proc.stderr


# -- replay -----------------------------------------------------------------------------
def _finding(tmp_path, target):
    f = Finding(property="CAPTURE-ORDER", message="FULL before PIECEWISE", target=target, backend="mock",
                scenario=Scenario(ManagerConfig(), (Step.capture(),)).to_json(), status="shrunk")
    return write_finding(str(tmp_path), f)


def test_replay_finding_exit_1_while_it_reproduces_and_0_when_fixed(tmp_path, capsys):
    assert main(["replay", _finding(tmp_path, "mutant:full-before-piecewise")]) == 1
    assert "REPRODUCED CAPTURE-ORDER" in capsys.readouterr().out
    assert main(["replay", _finding(tmp_path, "reference")]) == 0


@pytest.mark.parametrize("content", [None, "{broken", '{"schema": "other"}'])
def test_replay_bad_finding_is_exit_2(tmp_path, capsys, content):
    p = tmp_path / "f.json"
    if content is not None:
        p.write_text(content)
    assert main(["replay", str(p)]) == 2
    one_line_error(capsys)


@pytest.mark.skipif(not _no_gpu(), reason="a GPU is present")
def test_replay_on_cuda_without_gpu_is_exit_2(tmp_path, capsys):
    assert main(["replay", _finding(tmp_path, "mutant:full-before-piecewise"), "--backend", "cuda"]) == 2
    assert "error" in capsys.readouterr().err


# -- explain ------------------------------------------------------------------------------
def test_explain_text(capsys):
    from cgsim.spec import expected_capture_order

    assert main(["explain", "--capture-sizes", "1,2,4,8", "--max-num-reqs", "4"]) == 0
    out = capsys.readouterr().out
    n = len(expected_capture_order(ManagerConfig(capture_sizes=(1, 2, 4, 8), max_num_reqs=4), "pr48822"))
    assert f"capture list ({n} graphs" in out
    assert "candidate table" in out
    # every batch shape up to the largest capture size, with its graph and waste
    assert "5       decode q=1" not in out  # 5 requests > max_num_reqs: no such decode batch
    assert "Desc(PIECEWISE tokens=8)" in out and "37.5%" in out


def test_explain_json_and_config_file(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"mode": "FULL_DECODE_ONLY", "capture_sizes": [1, 2, 4], "decode_query_len": 2}))
    assert main(["explain", "--config", str(cfg), "--json", "--ruleset", "vllm-0.32"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resolved_mode"] == "FULL_DECODE_ONLY" and report["ruleset"] == "vllm-0.32"
    assert {r["num_tokens"] for r in report["dispatch"]} == {1, 2, 3, 4}
    assert all(d["cg_mode"] == "FULL" for d in report["capture_list"])


def test_explain_svg_plot(tmp_path, capsys):
    out = tmp_path / "plot.svg"
    assert main(["explain", "--plot", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("<svg") and "padding waste" in text and "FULL" in text
    import xml.etree.ElementTree as ET

    ET.fromstring(text)  # well-formed


def test_explain_png_without_matplotlib_is_exit_2(tmp_path, capsys):
    try:
        import matplotlib  # noqa: F401

        pytest.skip("matplotlib is installed")
    except ImportError:
        pass
    assert main(["explain", "--plot", str(tmp_path / "p.png")]) == 2
    assert "matplotlib" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, words",
    [
        (["--config", "/nonexistent.json"], "cannot be read"),
        (["--capture-sizes", "1,x"], "capture_sizes"),
        (["--mode", "SIDEWAYS"], "mode"),
        (["--ruleset", "nope"], "unknown ruleset"),
        (["--plot", "x.bmp"], ".svg"),
    ],
)
def test_explain_bad_input(capsys, args, words):
    assert main(["explain", *args]) == 2
    assert words in one_line_error(capsys)


def test_explain_unreadable_config(tmp_path, capsys):
    p = tmp_path / "c.json"
    p.write_text("{nope")
    assert main(["explain", "--config", str(p)]) == 2
    assert "not valid JSON" in one_line_error(capsys)


# -- list ---------------------------------------------------------------------------------------
def test_list(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    kinds = {line.split()[0] for line in lines}
    assert {"target", "mutant", "ruleset", "property"} <= kinds
    assert any(line.startswith("target    reference") for line in lines)
    assert any(line.startswith("ruleset   pr48822") for line in lines)
    assert any("CAPTURE-ORDER" in line for line in lines)


def test_no_command_is_usage_error(capsys):
    assert main([]) == 2


# -- a real campaign end to end -----------------------------------------------------------------
@slow
def test_default_run_on_a_mutant_writes_a_report(tmp_path, capsys):
    code = main(["run", "--target", "mutant:missing-warmup", "--budget", "10s", "--report-dir", str(tmp_path)])
    assert code == 1
    out = capsys.readouterr().out
    assert "WARMUP-FIRST" in out and "repro:" in out
    latest = (tmp_path / "LATEST").read_text().strip()
    summary = json.loads((tmp_path / latest / "summary.json").read_text())
    assert summary["complete"] and any(f["property"] == "WARMUP-FIRST" for f in summary["findings"])
    f = next(f for f in summary["findings"] if f["property"] == "WARMUP-FIRST")
    assert main(["replay", str(tmp_path / latest / f["path"])]) == 1
    assert main(["replay", str(tmp_path / latest / f["repro_path"])]) == 1
