"""python -m fuzz: exit codes, one-line errors, replay, explain, list."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from cgsim.config import ManagerConfig
from cgsim.finding import Finding
from cgsim.report import write_finding
from cgsim.scenario import Scenario, Step
from fuzz.campaign import UsageError, parse_budget
from fuzz.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


@slow
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
    import signal

    code = main(["run", "--target", "mutant:missing-warmup", "--max-examples", "30", "--budget", "10m",
                 "--report-dir", str(tmp_path)])
    assert code == 1
    # Called in-process, the CLI leaves this process's signals as it found them.
    assert not {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} & signal.pthread_sigmask(signal.SIG_BLOCK, [])
    out = capsys.readouterr().out
    assert "WARMUP-FIRST" in out and "repro:" in out
    latest = (tmp_path / "LATEST").read_text().strip()
    summary = json.loads((tmp_path / latest / "summary.json").read_text())
    assert summary["complete"] and any(f["property"] == "WARMUP-FIRST" for f in summary["findings"])
    f = next(f for f in summary["findings"] if f["property"] == "WARMUP-FIRST")
    assert main(["replay", str(tmp_path / latest / f["path"])]) == 1
    assert main(["replay", str(tmp_path / latest / f["repro_path"])]) == 1


# -- bad input, one table ------------------------------------------------------------------------
# (command line with {tmp} for the test's directory, words the one line must contain)
BAD_INPUTS = [
    # run
    (["run", "--target", "nope"], "unknown target"),
    (["run", "--target", "mutant:nope"], "unknown mutant"),
    (["run", "--ruleset", "nope"], "unknown ruleset"),
    (["run", "--ruleset", "sglang"], "ruleset 'sglang' states sglang's design, and target reference follows vllm's"),
    (["run", "--target", "mutant:range-off-by-one", "--ruleset", "sglang"], "choose one of pr48822"),
    (["run", "--target", "refrence"], "did you mean 'reference'?"),
    (["run", "--target", "mutant:range-of-by-one"], "did you mean 'range-off-by-one'?"),
    (["run", "--ruleset", "vllm-032"], "did you mean 'vllm-0.32'?"),
    (["run", "--budget", "99999h"], "--budget '99999h' is longer than 168h"),
    (["run", "--timeout", "99999h"], "--timeout '99999h' is longer"),
    (["run", "--timeout", "10x"], "--timeout '10x' is not a duration"),
    (["run", "--shrink-limit", "1,5s"], "--shrink-limit '1,5s' is not a duration"),
    (["run", "--shrink-share", "2"], "share above 0 and at most 1"),
    (["run", "--seed", "-1"], "--seed"),
    (["run", "--gpus", "0,,1"], "empty item"),
    (["run", "--backend", "tpu"], "backend"),
    (["run", "--budget", "60x"], "--budget '60x' is not a duration"),
    (["run", "--budget", "0s"], "--budget"),
    (["run", "--budget", "-5s"], "negative"),
    (["run", "--budget=-5s"], "negative"),
    (["run", "--budget", ""], "--budget"),
    (["run", "--budget"], "expected one argument"),
    (["run", "--workers", "0"], "--workers"),
    (["run", "--workers", "two"], "--workers"),
    (["run", "--workers", "{cpus+1}"], "--force-workers"),
    (["run", "--timeout", "0"], "--timeout"),
    (["run", "--timeout", "-1"], "positive"),
    (["run", "--timeout", "abc"], "--timeout"),
    (["run", "--seed", "x"], "--seed"),
    (["run", "--max-examples", "0"], "--max-examples"),
    (["run", "--shrink-grace", "xyz"], "--shrink-grace 'xyz'"),
    (["run", "--shrink-grace", "-1s"], "--shrink-grace '-1s' is negative"),
    (["run", "--profile", "huge"], "--profile"),
    (["run", "--gpus", "0,1"], "GPU 0, 1 not found"),
    (["run", "--gpus", "first"], "--gpus 'first'"),
    (["run", "--start-method", "nope"], "start method"),
    (["run", "--report-dir", "{tmp}/file.txt/reports"], "not writable"),
    (["run", "--nope"], "unrecognized arguments"),
    # replay
    (["replay", "{tmp}/missing.json"], "no such finding"),
    (["replay", "{tmp}/empty"], "is a directory"),
    (["replay", "{tmp}/broken.json"], "not valid JSON"),
    (["replay", "{tmp}/run/index.md"], "is a campaign report, not a finding; give one of its findings"),
    (["replay", "{tmp}/run/summary.json"], "is a campaign report, not a finding"),
    (["replay", "{tmp}/run"], "is a campaign's run directory, not a finding"),
    (["replay", "{tmp}/other.json"], "not a cgsim finding"),
    (["replay", "{tmp}/finding.json", "--timeout", "-1"], "positive duration"),
    (["replay", "{tmp}/finding.json", "--timeout", "0"], "positive duration"),
    (["replay", "{tmp}/finding.json", "--backend", "tpu"], "unknown backend"),
    (["replay", "{tmp}/unknown-target.json"], "unknown target"),
    (["replay", "{tmp}/notrepro.py"], "not a cgsim repro script"),
    (["replay", "{tmp}/syntax.py"], "not a Python file"),
    (["replay"], "required: path"),
    # explain
    (["explain", "--lora", "-1"], "--lora"),
    (["explain", "--lora", "x"], "--lora"),
    (["explain", "--max-rows", "0"], "--max-rows"),
    (["explain", "--plot", "/no/such/dir/out.svg"], "/no/such/dir does not exist; create it"),
    (["explain", "--plot", "{tmp}/plot.svg"], "is a directory"),
    (["explain", "--plot", "x.bmp"], ".svg"),
    (["explain", "--config", "/nonexistent.json"], "cannot be read"),
    (["explain", "--config", "{tmp}/broken.json"], "not valid JSON"),
    (["explain", "--capture-sizes", "1,x"], "capture_sizes"),
    (["explain", "--capture-sizes", "1,,2"], "'capture_sizes' = '1,,2': has an empty item"),
    (["explain", "--capture-sizes", "1,2,"], "has an empty item"),
    (["explain", "--lora-cases", "0,,1"], "has an empty item"),
    (["explain", "--max-num-reqs", "four"], "not a whole number"),
    (["explain", "--capture-sizes", "0"], "capture_sizes"),
    (["explain", "--max-num-reqs", "-3"], "max_num_reqs"),
    (["explain", "--mode", "SIDEWAYS"], "mode"),
    (["explain", "--spec-schedule", "1-2"], "spec_schedule"),
    (["explain", "--ruleset", "nope"], "unknown ruleset"),
    # list
    (["list", "extra"], "unrecognized arguments"),
    (["list", "--nope"], "unrecognized arguments"),
    # report
    (["report", "{tmp}/missing"], "does not exist"),
    (["report", "{tmp}/file.txt"], "is not a directory"),
    (["report", "{tmp}/empty"], "not a campaign run directory"),
    (["report", "{tmp}/broken-summary"], "not valid JSON"),
    (["report", "{tmp}/other-summary"], "not a cgsim campaign summary"),
    (["report", "{tmp}/live"], "still running"),
    (["report"], "required: run_dir"),
    # the command itself
    ([], "give a command"),
    (["fly"], "invalid choice"),
]


@pytest.fixture
def bad_files(tmp_path, monkeypatch):
    import fuzz.campaign.options as options_mod

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(options_mod, "_nvidia_smi_gpus", lambda: [])  # a machine without GPUs
    (tmp_path / "file.txt").write_text("not a directory")
    (tmp_path / "empty").mkdir()
    (tmp_path / "plot.svg").mkdir()
    (tmp_path / "broken.json").write_text("{broken")
    (tmp_path / "other.json").write_text('{"schema": "other"}')
    os.rename(_finding(tmp_path, "reference"), tmp_path / "finding.json")
    unknown = json.loads((tmp_path / "finding.json").read_text())
    unknown["target"] = "nope"
    (tmp_path / "unknown-target.json").write_text(json.dumps(unknown))
    (tmp_path / "notrepro.py").write_text("print('hello')\n")
    (tmp_path / "run" / "findings").mkdir(parents=True)  # a campaign's run directory and its report
    for name in ("index.md", "summary.json"):
        (tmp_path / "run" / name).write_text("{}")
    (tmp_path / "syntax.py").write_text("def (:\n")
    for name, text in (("broken-summary", "{"), ("other-summary", '{"schema": "x"}'), ("live", None)):
        (tmp_path / name / "findings").mkdir(parents=True)
        (tmp_path / name / ".work").mkdir()
        if text is not None:
            (tmp_path / name / "summary.json").write_text(text)
    from fuzz.campaign import hold_run_lock

    fd = hold_run_lock(str(tmp_path / "live"))  # as a running campaign holds it
    yield tmp_path
    os.close(fd)


@pytest.mark.parametrize("argv, words", BAD_INPUTS, ids=[" ".join(a) or "(none)" for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(bad_files, capsys, argv, words):
    tmp = str(bad_files)
    from fuzz.campaign.resources import cpu_count

    argv = [a.replace("{tmp}", tmp).replace("{cpus+1}", str(cpu_count() + 1)) for a in argv]
    if argv[:1] == ["run"] and "--report-dir" not in argv:
        argv = argv[:1] + ["--report-dir", f"{tmp}/reports"] + argv[1:]
    before = sorted(os.listdir(tmp))
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert words in err
    assert sorted(os.listdir(tmp)) == before  # nothing started, nothing written
    if argv[:1] == ["explain"]:
        assert captured.out == ""  # refused before printing half a report


PYTEST_BAD_OPTIONS = [
    (["--cgsim-target", "nope"], "unknown target 'nope'"),
    (["--cgsim-target", "mutant:nope"], "unknown mutant 'nope'"),
    (["--cgsim-backend", "tpu"], "unknown backend"),
    (["--cgsim-ruleset", "nope"], "unknown ruleset 'nope'"),
    (["--cgsim-ruleset", "sglang", "--cgsim-target", "reference"], "states sglang's design"),
]


@slow
@pytest.mark.parametrize("args, words", PYTEST_BAD_OPTIONS, ids=[" ".join(a) for a, _ in PYTEST_BAD_OPTIONS])
def test_bad_pytest_options_are_one_line_and_exit_2(tmp_path, args, words):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    for var in ("CGSIM_TARGET", "CGSIM_BACKEND", "CGSIM_RULESET", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER"):
        env.pop(var, None)
    from importlib.metadata import entry_points

    installed = any(ep.value == "cgsim.pytest_plugin" for ep in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "cgsim.pytest_plugin"]  # an uninstalled checkout loads it by name
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, *args,
                           str(tmp_path)], cwd=str(tmp_path), capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert words in err and args[0] in err
    assert "passed" not in proc.stdout  # no test ran against nothing


@slow
def test_list_into_a_closed_pipe_exits_0_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "fuzz", "list"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # `list | head -0`: the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Broken pipe" not in err and "Traceback" not in err, err


@slow
def test_list_into_head(tmp_path):
    proc = subprocess.run(f"{shlex.quote(sys.executable)} -m fuzz list | head -1; exit ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 1
    assert "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr


def test_every_duration_flag_reads_the_same_durations(tmp_path, monkeypatch):
    """--timeout 10s is ten seconds, as --budget 10s is: one parser for every duration."""
    from fuzz.campaign import CampaignResult, command_line

    seen = {}

    def fake_run(options, **kw):
        seen["options"] = options
        return CampaignResult(0, str(tmp_path), {})

    monkeypatch.setattr(command_line, "run_campaign", fake_run)  # the decode family's `fuzz run` (fuzz.families)
    assert main(["run", "--timeout", "10s", "--budget", "2m", "--shrink-grace", "1m30s", "--shrink-limit", "0",
                 "--runner-share", "0", "--report-dir", str(tmp_path)]) == 0
    o = seen["options"]
    assert (o.timeout_s, o.budget_s, o.shrink_grace_s, o.shrink_limit_s, o.runner_share_s) == (10.0, 120.0, 90.0, 0.0, 0.0)
    assert main(["run", "--runner-share", "3m", "--report-dir", str(tmp_path)]) == 0
    assert seen["options"].runner_share_s == 180.0
    assert main(["run", "--confirm-budget", "0", "--report-dir", str(tmp_path)]) == 0
    assert seen["options"].confirm_budget_s == 0.0
    assert main(["run", "--timeout", "2.5", "--report-dir", str(tmp_path)]) == 0 and seen["options"].timeout_s == 2.5


def test_size_lists_refuse_what_they_used_to_skip():
    from cgsim.values import ValueProblem, parse_sizes

    assert parse_sizes("1,2, 4") == (1, 2, 4) and parse_sizes("[1, 2]") == (1, 2) and parse_sizes("0,1", least=0) == (0, 1)
    for bad in ("1,,2", "1,", ",1", "", "1;2", "[1, true]", "1,-2"):
        with pytest.raises(ValueProblem):
            parse_sizes(bad)


def test_run_shrink_grace_and_budget_name_their_flag(tmp_path, capsys):
    assert main(["run", "--report-dir", str(tmp_path), "--shrink-grace", "xyz"]) == 2
    err = capsys.readouterr().err
    assert "--shrink-grace" in err and "--budget" not in err


# -- replay of a repro script ---------------------------------------------------------------------
def _repro(tmp_path, prop="CAPTURE-ORDER", body=None):
    """A repro script carrying a finding of ``prop``, whose main() is replaced
    by ``body`` (how the script ends) when given."""
    from cgsim.report.repro import write_repro

    f = Finding(property=prop, message="seen", target="reference", backend="mock",
                scenario=Scenario(ManagerConfig(), (Step.capture(),)).to_json(), status="shrunk")
    path = write_repro(str(tmp_path), f)
    if body is not None:
        text = open(path).read().replace('if __name__ == "__main__":', f"def main():\n    {body}\n\n\nif __name__ == \"__main__\":")
        with open(path, "w") as fh:
            fh.write(text)
    return path


@pytest.mark.parametrize(
    "prop, body, code, words",
    [
        ("CAPTURE-ORDER", "return 1", 1, None),
        ("CAPTURE-ORDER", "return 0", 0, None),
        ("CAPTURE-ORDER", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", 2, "could not tell"),
        ("CAPTURE-ORDER", "return 3", 2, "exited with status 3; could not tell"),
        ("NO-CRASH", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", 1, "REPRODUCED NO-CRASH"),
        ("NO-CRASH", "import os; os._exit(7)", 1, "exited with status 7"),
        ("NO-CRASH", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 2, "died with SIGKILL; could not tell"),
    ],
)
def test_replay_of_a_repro_script_trusts_only_what_its_finding_predicts(tmp_path, capsys, prop, body, code, words):
    path = _repro(tmp_path, prop, body)
    assert main(["replay", path]) == code
    captured = capsys.readouterr()
    if code == 2:
        err = captured.err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    elif words:
        assert words in captured.out


@slow
def test_replay_of_a_real_repro_script(tmp_path, capsys):
    path = _repro(tmp_path)  # reference: CAPTURE-ORDER holds
    assert main(["replay", path]) == 0


def test_replay_timeout_minus_one_is_exit_2_on_a_finding_that_reproduces(tmp_path, capsys):
    path = _finding(tmp_path, "mutant:full-before-piecewise")
    assert main(["replay", path, "--timeout", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--timeout" in err and "not reproduced" not in err


# -- report -------------------------------------------------------------------------------------
def test_report_rebuilds_a_run_without_a_summary(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    _finding(run_dir / "findings", "mutant:full-before-piecewise")
    assert main(["report", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "CAPTURE-ORDER" in out and "campaign died" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is False and summary["interrupted"] == "campaign died"
    assert [f["property"] for f in summary["findings"]] == ["CAPTURE-ORDER"]
    assert (run_dir / "findings" / f"repro_{summary['findings'][0]['id']}.py").exists()  # written again
    assert main(["report", "--quiet", str(tmp_path / "run")]) == 1 and capsys.readouterr().out == ""


def test_report_of_an_uploaded_run_keeps_the_last_summary_and_what_was_in_flight(tmp_path, capsys):
    # No .work/ (scratch is not uploaded): the last summary says what ran.
    from cgsim.report.summary import build_summary, write_report

    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    _finding(run_dir / "findings", "mutant:full-before-piecewise")
    scen = Scenario(ManagerConfig(), (Step.capture(),))
    settings = {"target": "mutant:full-before-piecewise", "backend": "mock", "ruleset": "any", "seed": 4,
                "budget_s": 60, "workers": 2}
    last = build_summary(run_id="run-x", settings=settings, findings=[], stats=[{"scenarios": 17, "checks": {"CAPTURE-ORDER": 17}}],
                         started_at="2026-01-01T00:00:00+00:00", elapsed_s=5.0,
                         inflight=[{"worker": 1, "started_at": "2026-01-01T00:00:04+00:00",
                                    "scenario_short": scen.short(), "scenario": scen.to_json()}])
    write_report(str(run_dir), last)
    assert main(["report", "--quiet", str(run_dir)]) == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run_id"] == "run-x" and summary["settings"] == settings and summary["scenarios"] == 17
    assert summary["properties"]["CAPTURE-ORDER"]["checks"] == 17
    assert [e["worker"] for e in summary["inflight"]] == [1] and summary["interrupted"] == "campaign died"
    # Rebuilding again changes nothing but the note's time.
    assert main(["report", "--quiet", str(run_dir)]) == 1
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["findings"] == summary["findings"] and again["scenarios"] == 17
    assert again["last_activity"] == summary["last_activity"]  # the rebuild's own writes are no sign of life
    assert len(again["notes"]) == len(summary["notes"])
