"""The campaign under faults, with real processes and real signals.

Each test starts a campaign in its own session (so its process group is
its pid and every worker is in it), does one thing to it (SIGKILL of the
campaign while a finding is being shrunk, SIGKILL of a worker, Ctrl-C twice,
SIGTERM, a target stuck in native code, a worker over its memory limit, a
full disk) and then checks the same four things:

- no process of the campaign is left (``/proc`` scanned for its group);
- every finding confirmed before the fault is on disk and readable (a
  property seen stays seen; a final finding file stays);
- the report can be rebuilt from disk (``fuzz report``) and lists exactly
  the findings on disk;
- the exit status is the documented one (reports/README.md).

The targets are ``FaultPipeline``: tests/fuzz/campaign/test_campaign.py's FakePipeline
(real Scenarios, real Traces and Verdicts, chosen bugs) with a few more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cgsim.report.findings import scan_findings
from tests.fuzz.campaign.test_campaign import FakePipeline, fake_strategy  # noqa: F401  (the campaigns below import both from here)

# Each test runs campaigns in processes and kills them: the inner loop deselects them (-m "not slow").
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class FaultPipeline(FakePipeline):
    """FakePipeline plus:

    - "slow-big" / "slow-two": "big" / "two" with 30 ms per scenario, so that
      shrinking lasts seconds and a fault lands in the middle of it;
    - "oom": a scenario of >= 6 tokens lowers the worker's address-space limit
      (RLIMIT_AS) just above what it uses, then allocates 512 MiB.
    """

    def run(self, scenario, target, backend, timeout=None):
        if self.bug.startswith("slow-"):
            time.sleep(0.03)
            return FakePipeline(self.bug[len("slow-"):]).run(scenario, target, backend, timeout)
        if self.bug == "oom" and max(b.num_tokens for b in scenario.batches) >= 6:
            import resource

            with open("/proc/self/status") as fh:
                vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
            resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
            hog = bytearray(512 << 20)
            return hog  # not reached: MemoryError
        return FakePipeline("none" if self.bug == "oom" else self.bug).run(scenario, target, backend, timeout)

    def judge(self, scenario, trace):
        bug = self.bug[len("slow-"):] if self.bug.startswith("slow-") else self.bug
        return FakePipeline(bug).judge(scenario, trace)


# -- a campaign in its own session ------------------------------------------------------------
def start(tmp_path, bug, *, budget=60.0, workers=1, timeout=5.0, quiet=True, prelude="", extra=""):
    code = textwrap.dedent(
        f"""
        import sys, warnings
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # as the CLI does
        sys.path.insert(0, {ROOT!r})
        {prelude}
        from tests.fuzz.campaign.test_faults import FaultPipeline, fake_strategy
        from fuzz.campaign import CampaignOptions, run_campaign
        opts = CampaignOptions(target="reference", budget_s={budget}, workers={workers}, seed=1,
                               report_dir={str(tmp_path / 'reports')!r}, quiet={quiet}, timeout_s={timeout},
                               shrink_grace_s=5.0{extra})
        # As the CLI runs it: a late Ctrl-C must not change the exit status.
        result = run_campaign(opts, pipeline=FaultPipeline({bug!r}), strategy=fake_strategy, ignore_late_signals=True)
        sys.exit(result.exit_code)
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)


def group(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def assert_group_gone(pgid: int, within: float = 10.0) -> None:
    end = time.time() + within
    while time.time() < end:
        if not group(pgid):
            return
        time.sleep(0.05)
    left = group(pgid)
    for pid in left:  # do not leak them into the rest of the suite
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    raise AssertionError(f"processes of the campaign left after {within:g}s: {left}")


def run_dir_of(tmp_path):
    dirs = [d for d in (tmp_path / "reports").iterdir() if d.is_dir() and not d.is_symlink()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def wait_for(tmp_path, predicate, timeout=30.0, what="a finding"):
    end = time.time() + timeout
    while time.time() < end:
        for d in (tmp_path / "reports").glob("*/findings"):
            found = scan_findings(str(d))
            if predicate(found, d.parent):
                return d.parent, found
        time.sleep(0.05)
    raise AssertionError(f"{what} did not appear within {timeout:g}s")


def workers_of(pid: int) -> list[int]:
    return [p for p in group(pid) if p != pid and _ppid(p) == pid and "resource_tracker" not in _cmdline(p)]


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as fh:
            return fh.read()
    except OSError:
        return ""


def snapshot(run_dir) -> dict[str, tuple[str, str]]:
    """id -> (property, status) of every finding on disk; all must be readable."""
    fdir = run_dir / "findings"
    names = {n[:-len(".json")] for n in os.listdir(fdir) if n.endswith(".json") and not n.startswith(".")}
    found = scan_findings(str(fdir))
    # A live campaign may remove a provisional finding (its JSON, then its
    # script) or add one while this looks: only a file that stays is judged.
    unreadable = sorted(n for n in names - {f.id for f in found} if (fdir / f"{n}.json").exists())
    assert not unreadable, f"unreadable finding files: {unreadable}"
    for f in found:
        assert (fdir / f.repro).exists() or not (fdir / f"{f.id}.json").exists(), f"{f.id} has no repro script"
    return {f.id: (f.property, f.status) for f in found if (fdir / f"{f.id}.json").exists()}


def assert_kept(before: dict, after: dict) -> None:
    """Every property seen before the fault is still on disk, and no final
    finding file went away."""
    assert {p for p, _ in before.values()} <= {p for p, _ in after.values()}, (before, after)
    for fid, (_, status) in before.items():
        if status in ("shrunk", "shrink-interrupted", "unshrunk"):
            assert fid in after, f"final finding {fid} was removed"


def assert_rebuilds(run_dir, *, complete=None, interrupted=None):
    """``fuzz report`` rebuilds a report that lists exactly what is on disk."""
    from fuzz.campaign.rebuild import rebuild_report

    on_disk = snapshot(run_dir)
    last = json.loads((run_dir / "summary.json").read_text())
    result = rebuild_report(str(run_dir), quiet=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    # What the last summary knew (settings, counts) is kept.
    assert summary["settings"] == last["settings"] and summary["run_id"] == last["run_id"]
    assert summary["scenarios"] == last["scenarios"] and summary["coverage"] == last["coverage"]
    listed = {f["id"] for f in summary["findings"]} | {d for f in summary["findings"] for d in f["duplicates"]}
    assert listed == set(on_disk)
    assert result.exit_code == (1 if on_disk else 0)
    if complete is not None:
        assert summary["complete"] is complete
    if interrupted is not None:
        assert summary["interrupted"] == interrupted
    assert (run_dir / "junit.xml").exists() and (run_dir / "index.md").exists()
    return summary


def no_traceback(p) -> str:
    err = p.stderr.read()
    assert "Traceback" not in err, err
    return err


# -- the faults ---------------------------------------------------------------------------------
def test_sigkill_of_the_campaign_mid_shrink(tmp_path):
    p = start(tmp_path, "slow-big", workers=2)
    run_dir, _ = wait_for(tmp_path, lambda found, d: any(f.status == "shrinking" for f in found),
                          what="a finding being shrunk")
    time.sleep(0.1)
    before = snapshot(run_dir)
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=10) == -signal.SIGKILL
    assert_group_gone(p.pid, within=5.0)  # the kernel's parent-death signal, not the budget
    after = snapshot(run_dir)
    assert_kept(before, after)
    # Nobody is left to touch the findings.
    mtimes = {n: os.stat(run_dir / "findings" / n).st_mtime for n in os.listdir(run_dir / "findings")}
    time.sleep(0.5)
    assert mtimes == {n: os.stat(run_dir / "findings" / n).st_mtime for n in os.listdir(run_dir / "findings")}
    assert any(status == "shrinking" for _, status in after.values())  # died mid-shrink: kept as it was
    inflight_files = [n for n in os.listdir(run_dir / ".work")
                      if n.startswith("inflight-") and os.path.getsize(run_dir / ".work" / n)]
    summary = assert_rebuilds(run_dir, complete=False, interrupted="campaign died")
    assert len(summary["inflight"]) == len(inflight_files)
    assert all(e["scenario"]["steps"] for e in summary["inflight"])
    assert any("campaign died" in n for n in summary["notes"])
    # The command a user runs, in its own process.
    proc = subprocess.run([sys.executable, "-m", "fuzz", "report", str(run_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "PARTIAL: campaign died" in proc.stdout and "Traceback" not in proc.stderr


def test_sigkill_of_a_worker(tmp_path):
    p = start(tmp_path, "slow-two", workers=2, extra=", max_examples=200")
    run_dir, _ = wait_for(tmp_path, lambda found, d: bool(found))
    before = snapshot(run_dir)
    victims = workers_of(p.pid)
    assert len(victims) == 2, victims
    os.kill(victims[0], signal.SIGKILL)
    assert p.wait(timeout=60) == 1
    no_traceback(p)
    assert_group_gone(p.pid)
    assert_kept(before, snapshot(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is True
    assert any("SIGKILL" in n for n in summary["notes"])
    assert any(w["restarts"] >= 1 for w in summary["workers"])
    assert not any("SIGKILL" in f["message"] for f in summary["findings"])  # a kill from outside is no finding
    assert_rebuilds(run_dir, complete=True)  # a finished run keeps its state


def test_ctrl_c_twice_prints_the_summary_and_leaves_a_fresh_report(tmp_path):
    p = start(tmp_path, "slow-two", workers=2, quiet=False)
    run_dir, _ = wait_for(tmp_path, lambda found, d: bool(found))
    time.sleep(0.3)
    before = snapshot(run_dir)
    os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 1, err
    assert "Traceback" not in err
    assert "finding(s)" in out and "report:" in out and "PARTIAL: stopped by SIGINT" in out
    assert_group_gone(p.pid)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is False and summary["interrupted"] == "SIGINT" and summary["finished_at"]
    after = snapshot(run_dir)
    assert_kept(before, after)
    listed = {f["id"] for f in summary["findings"]} | {d for f in summary["findings"] for d in f["duplicates"]}
    assert listed == set(after)  # the last summary is not stale
    assert_rebuilds(run_dir, complete=False, interrupted="SIGINT")


# A process can inherit its stop signals blocked (from a test runner, a
# supervisor): the campaign unblocks the ones it handles.
BLOCKED = "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})"


@pytest.mark.parametrize("bug, code", [("slow-two", 1), ("slow", 143)])
def test_sigterm_to_the_group(tmp_path, bug, code):
    p = start(tmp_path, bug, workers=2, prelude=BLOCKED if bug == "slow" else "")
    if bug == "slow":
        run_dir, _ = wait_for(tmp_path, lambda found, d: (d / "summary.json").exists() and len(workers_of(p.pid)) == 2,
                              what="the workers")
        time.sleep(0.5)
    else:
        run_dir, _ = wait_for(tmp_path, lambda found, d: bool(found))
    before = snapshot(run_dir)
    os.killpg(p.pid, signal.SIGTERM)  # a container stop, systemd, a CI timeout
    assert p.wait(timeout=30) == code
    no_traceback(p)
    assert_group_gone(p.pid)
    assert_kept(before, snapshot(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and summary["complete"] is False
    # Workers that got the group's SIGTERM stopped; none of them is a crash.
    assert not any(f["property"] == "NO-CRASH" for f in summary["findings"])
    assert_rebuilds(run_dir, complete=False, interrupted="SIGTERM")


def test_target_stuck_in_native_code(tmp_path):
    p = start(tmp_path, "hard-hang", timeout=0.3)
    run_dir, found = wait_for(tmp_path, lambda found, d: any(f.property == "NO-HANG" for f in found),
                              what="the watchdog's NO-HANG finding")
    hang = next(f for f in found if f.property == "NO-HANG")
    assert max(sum(s["batch"]["query_lens"]) for s in hang.scenario["steps"] if s["kind"] == "dispatch") >= 6

    def stuck(found, d):  # the restarted worker is stuck again
        try:
            data = json.loads((d / ".work" / "inflight-w0.json").read_text())
        except (OSError, ValueError):
            return False
        return data["incarnation"] >= 1 and max(
            sum(s["batch"]["query_lens"]) for s in data["scenario"]["steps"] if s["kind"] == "dispatch") >= 6

    wait_for(tmp_path, stuck, what="a worker stuck again")
    before = snapshot(run_dir)
    os.kill(p.pid, signal.SIGKILL)  # the campaign dies while its worker cannot even take SIGALRM
    p.wait(timeout=10)
    assert_group_gone(p.pid, within=5.0)
    assert_kept(before, snapshot(run_dir))
    summary = assert_rebuilds(run_dir, complete=False, interrupted="campaign died")
    (entry,) = summary["inflight"]
    assert entry["worker"] == 0 and "dispatch" in entry["scenario_short"]
    assert "## In flight" in (run_dir / "index.md").read_text()


def test_worker_over_its_memory_limit(tmp_path):
    p = start(tmp_path, "oom", extra=", max_examples=40")
    assert p.wait(timeout=60) == 1
    no_traceback(p)
    assert_group_gone(p.pid)
    run_dir = run_dir_of(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    # Python raises MemoryError in the target (a NO-CRASH finding); a worker
    # that dies of it instead is a finding too, or a note if it died outside
    # a scenario.  Either way, never a dead campaign.
    crashes = [f for f in summary["findings"] if f["property"] == "NO-CRASH"
               and ("MemoryError" in f["message"] or "died with" in f["message"])]
    assert crashes or [n for n in summary["notes"] if "MemoryError" in n or "worker 0" in n], summary
    assert summary["complete"] is True and summary["scenarios"] >= 40  # the campaign went on (shrinks add runs)
    snapshot(run_dir)
    assert_rebuilds(run_dir, complete=True)


DISK_FULL = """
import errno, os
_fsync = os.fsync
def _full_disk_fsync(fd):
    # The report directory's disk fills up once the test creates FLAG.
    if os.path.exists(FLAG):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _fsync(fd)
os.fsync = _full_disk_fsync
"""


@pytest.mark.parametrize("errno_name, words", [("ENOSPC", "No space left on device"),
                                               ("EROFS", "Read-only file system")])
def test_report_directory_disk_full(tmp_path, errno_name, words):
    """Writes fail mid-run (simulated: every fsync after FLAG exists), as on
    a full disk or one remounted read-only."""
    flag = tmp_path / "disk-full"
    prelude = (f"FLAG = {str(flag)!r}" + DISK_FULL.replace("ENOSPC", errno_name)).replace("\n", "\n        ")
    p = start(tmp_path, "slow-two", workers=2, prelude=prelude)
    run_dir, _ = wait_for(tmp_path, lambda found, d: bool(found))
    before = snapshot(run_dir)
    flag.write_text("")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], err
    assert "python -m fuzz report" in lines[0]
    assert_group_gone(p.pid)
    after = snapshot(run_dir)  # every finding on disk is whole and readable
    assert_kept(before, after)
    assert not [n for n in os.listdir(run_dir / "findings") if n.endswith(".tmp")]  # no half-written leftovers
    flag.unlink()  # space is back: the report is rebuilt from the findings
    summary = assert_rebuilds(run_dir, complete=False)
    assert summary["interrupted"] in ("campaign died", "report directory unwritable")


# -- stop signals in every phase ---------------------------------------------------------------
SLOW_SPAWN = """
import time, fuzz.campaign.supervisor as _supervisor
_start = _supervisor.Supervisor._start
def _slow_start(self, slot):
    time.sleep(0.3)  # a loaded machine: every new worker takes a while to start
    _start(self, slot)
_supervisor.Supervisor._start = _slow_start
"""


def test_sigint_while_workers_are_being_started_stops_the_starting(tmp_path):
    """--workers 40 on a machine where each start is slow: a Ctrl-C in the
    middle of starting them ends the campaign at once, with a report;
    nobody goes on starting the other workers first."""
    p = start(tmp_path, "slow", workers=40, extra=", force_workers=True",
              prelude=SLOW_SPAWN.replace("\n", "\n        "))
    wait_for(tmp_path, lambda found, d: len(workers_of(p.pid)) >= 3, what="the workers starting")
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)  # timeout -s INT: the campaign alone, not its group
    assert p.wait(timeout=60) == 130
    took = time.monotonic() - sent
    no_traceback(p)
    assert_group_gone(p.pid)
    summary = json.loads((run_dir_of(tmp_path) / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT"
    started = [w for w in summary["workers"] if w["spans"]]
    assert len(started) < 20, f"{len(started)} workers were started after the stop"
    assert took < 6.0, f"the campaign took {took:.1f}s to stop"


def test_sigint_ends_workers_stuck_in_a_scenario_within_the_grace(tmp_path):
    """Two workers stuck where no stop request reaches them: a Ctrl-C gives
    them STOP_GRACE_S together, then kills both at once."""
    from fuzz.campaign.executor import STOP_GRACE_S

    p = start(tmp_path, "hard-hang", workers=2, timeout=600.0)
    wait_for(tmp_path, lambda found, d: all(
        (d / ".work" / f"inflight-w{i}.json").exists() and (d / ".work" / f"inflight-w{i}.json").stat().st_size
        for i in (0, 1)), what="both workers stuck")
    time.sleep(0.2)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 130
    took = time.monotonic() - sent
    no_traceback(p)
    assert_group_gone(p.pid)
    assert took < STOP_GRACE_S + 3.5, f"the campaign took {took:.1f}s to stop"
    summary = json.loads((run_dir_of(tmp_path) / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and summary["complete"] is False


SLOW_START_UP = """
import time, fuzz.campaign.run as _campaign
_validate = _campaign.validate
def _slow_validate(options):
    open(MARK, "w").close()
    time.sleep(60)  # a target's cold import and self-check
    return _validate(options)
_campaign.validate = _slow_validate
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_during_start_up_ends_the_run_with_one_line(tmp_path, sig, code):
    mark = tmp_path / "in-start-up"
    prelude = f"MARK = {str(mark)!r}" + SLOW_START_UP.replace("\n", "\n        ")
    script = textwrap.dedent(f"""
        import sys
        {prelude}
        from fuzz.cli import main
        sys.exit(main())
        """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    p = subprocess.Popen([sys.executable, "-c", script, "run", "--report-dir", str(tmp_path / "reports"), "--quiet"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env=env)
    end = time.time() + 60
    while not mark.exists() and time.time() < end:  # past the imports, inside the slow start-up
        time.sleep(0.05)
    p.send_signal(sig)
    assert p.wait(timeout=30) == code
    err = no_traceback(p).strip()
    assert len(err.splitlines()) == 1 and ("stopped by SIGTERM" in err or "interrupted" in err), err
    assert_group_gone(p.pid)


# -- SIGKILL at any point ----------------------------------------------------------------------
def _kill_campaign_and_check(tmp_path, p, *, started: bool) -> None:
    """After SIGKILL of the campaign: no process of it is left, nothing
    touches the findings any more, and (once it had a run directory) the
    report is rebuilt from disk and lists exactly what is there."""
    run_dirs = [d for d in (tmp_path / "reports").iterdir() if d.is_dir() and not d.is_symlink()] \
        if (tmp_path / "reports").exists() else []
    before = snapshot(run_dirs[0]) if run_dirs else {}
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=10) == -signal.SIGKILL  # the shell's 137
    assert_group_gone(p.pid, within=5.0)
    if not started:
        assert not run_dirs
        return
    (run_dir,) = run_dirs
    assert_kept(before, snapshot(run_dir))
    if (run_dir / "summary.json").exists():
        assert_rebuilds(run_dir, complete=False, interrupted="campaign died")
    else:  # killed before its first report: the findings alone
        from fuzz.campaign.rebuild import rebuild_report

        assert rebuild_report(str(run_dir), quiet=True).exit_code in (0, 1)


@pytest.mark.parametrize("point", ["start-up", "workers starting", "fuzzing (random moment)", "fuzzing (random moment 2)"])
def test_sigkill_of_the_campaign_at_any_point(tmp_path, point):
    import random

    if point == "start-up":
        mark = tmp_path / "in-start-up"
        p = start(tmp_path, "slow-two", prelude=f"MARK = {str(mark)!r}" + SLOW_START_UP.replace("\n", "\n        "))
        end = time.time() + 60
        while not mark.exists() and time.time() < end:
            time.sleep(0.05)
        _kill_campaign_and_check(tmp_path, p, started=False)
        return
    if point == "workers starting":
        p = start(tmp_path, "slow-two", workers=6, extra=", force_workers=True",
                  prelude=SLOW_SPAWN.replace("\n", "\n        "))
        wait_for(tmp_path, lambda found, d: len(workers_of(p.pid)) >= 2, what="the workers starting")
    else:
        p = start(tmp_path, "slow-two", workers=2)
        wait_for(tmp_path, lambda found, d: len(workers_of(p.pid)) >= 1, what="a worker")
        time.sleep(random.Random(point).uniform(0.0, 3.0))
    _kill_campaign_and_check(tmp_path, p, started=True)


@pytest.mark.parametrize("moment", ["starting", "mid-shrink", "random"])
def test_sigkill_of_a_worker_at_any_point(tmp_path, moment):
    """A worker killed from outside (the OOM killer, a user) at any moment:
    a note, never a finding; it is restarted and the campaign ends as usual
    with every finding written before the kill."""
    import random

    p = start(tmp_path, "slow-two", workers=2, extra=", max_examples=200")
    if moment == "starting":
        wait_for(tmp_path, lambda found, d: len(workers_of(p.pid)) >= 1, what="a worker")
    elif moment == "mid-shrink":
        wait_for(tmp_path, lambda found, d: any(f.status == "shrinking" for f in found), what="a shrink")
    else:
        wait_for(tmp_path, lambda found, d: len(workers_of(p.pid)) >= 1, what="a worker")
        time.sleep(random.Random(38).uniform(0.0, 2.0))
    run_dir = run_dir_of(tmp_path)
    before = snapshot(run_dir)
    victims = workers_of(p.pid)
    assert victims
    os.kill(victims[0], signal.SIGKILL)
    assert p.wait(timeout=120) == 1
    no_traceback(p)
    assert_group_gone(p.pid)
    assert_kept(before, snapshot(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is True
    assert not any("SIGKILL" in f["message"] for f in summary["findings"])
    assert any("SIGKILL" in n for n in summary["notes"]) or summary["scenarios"] >= 200
    assert_rebuilds(run_dir, complete=True)


# -- a corrupt example database ------------------------------------------------------------------
def test_a_corrupt_example_database_is_skipped_with_a_note(tmp_path):
    """Garbage, half-written or foreign values in --example-db: skipped and
    counted in a note, left as they are; the readable saved failure is still
    replayed and the campaign ends as usual."""
    import hashlib

    from fuzz.campaign import CampaignOptions, run_campaign
    from fuzz.campaign.example_db import KEY_PREFIX

    db = tmp_path / "db"
    opts = dict(target="reference", workers=1, seed=1, quiet=True, timeout_s=5.0, shrink_grace_s=5.0, budget_s=600.0,
                example_db=str(db))
    first = run_campaign(CampaignOptions(report_dir=str(tmp_path / "a"), max_examples=60, **opts),
                         pipeline=FaultPipeline("big"), strategy=fake_strategy)
    assert first.exit_code == 1
    key_dir = db / hashlib.sha384(KEY_PREFIX + b"reference:mock").hexdigest()[:16]
    assert key_dir.is_dir(), sorted(p.name for p in db.iterdir())
    (key_dir / "garbage").write_bytes(b"\x00\xff not json")
    (key_dir / "half").write_bytes(b'{"property": "FAKE-BIG", "status": "shr')
    (key_dir / "malformed").write_bytes(b'{"property": "FAKE-BIG", "status": "shrunk", "scenario": {"steps": 5}}')
    second = run_campaign(CampaignOptions(report_dir=str(tmp_path / "b"), max_examples=5, **opts),
                          pipeline=FaultPipeline("big"), strategy=fake_strategy)
    assert second.exit_code == 1
    notes = second.summary["notes"]
    assert any("2 saved value(s) could not be read" in n for n in notes), notes
    assert any("cannot be replayed" in n for n in notes), notes
    assert any("saved failure(s) replayed first" in n for n in notes), notes
    assert (key_dir / "garbage").exists() and (key_dir / "half").exists()  # left as they are


# -- a small tmpfs: full, read-only ----------------------------------------------------------------
def _in_a_mount_namespace(tmp_path, script: str) -> subprocess.CompletedProcess:
    """Run a shell script with its own tmpfs at $MNT (a user and mount
    namespace: no root needed where the kernel allows them); skip where it
    does not."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here ({probe.stderr.strip()[:120]}); the simulated full disk covers it")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, MNT=str(mnt), OUT=str(tmp_path), PY=sys.executable,
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)


CAMPAIGN = """
import sys, warnings
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
from tests.fuzz.campaign.test_faults import FaultPipeline, fake_strategy
from fuzz.campaign import CampaignOptions, run_campaign

opts = CampaignOptions(target="reference", budget_s=600.0, max_examples=400, workers=2, seed=1,
                       report_dir=sys.argv[1], quiet=True, timeout_s=5.0, shrink_grace_s=5.0)
sys.exit(run_campaign(opts, pipeline=FaultPipeline("slow-two"), strategy=fake_strategy).exit_code)
"""


@pytest.mark.parametrize("fault, words", [("full", "No space left on device"), ("read-only", "Read-only file system")])
def test_report_directory_on_a_tmpfs_that_fills_up_or_turns_read_only(tmp_path, fault, words):
    """The report directory on a real 2 MiB tmpfs: once a finding is on disk
    the disk fills (or is remounted read-only).  Exit 3 with one line, the
    findings already written stay whole, and once space is back the report
    is rebuilt from them."""
    (tmp_path / "campaign.py").write_text(CAMPAIGN)
    # Read-only: a read-only bind mount over the report directory (a remount
    # of the tmpfs itself is refused while the campaign holds files open; so is
    # the bind mount's while the campaign has a file open for writing through
    # it, for a moment: retried).
    fault_cmd = ("dd if=/dev/zero of=$MNT/fill bs=4k 2>/dev/null" if fault == "full"
                 else "mount --bind $MNT/reports $MNT/reports || exit 98; i=0; "
                      "until mount -o remount,bind,ro $MNT/reports 2>/dev/null; do "
                      "i=$((i+1)); [ $i -ge 500 ] && exit 98; sleep 0.02; done")
    undo_cmd = "rm -f $MNT/fill" if fault == "full" else "umount $MNT/reports"
    script = f"""
        mount -t tmpfs -o size=2m tmpfs $MNT || exit 99
        $PY $OUT/campaign.py $MNT/reports 2> $OUT/stderr &
        pid=$!
        until ls $MNT/reports/*/findings/*.json >/dev/null 2>&1; do sleep 0.05; done
        cp -r $MNT/reports $OUT/before
        {fault_cmd}
        wait $pid; echo $? > $OUT/rc
        {undo_cmd}
        $PY -m fuzz report --quiet $MNT/reports/2*; echo $? > $OUT/report_rc
        cp -r $MNT/reports $OUT/after
    """
    proc = _in_a_mount_namespace(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "rc").read_text().strip() == "3", (tmp_path / "stderr").read_text()
    err = [line for line in (tmp_path / "stderr").read_text().splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    (before,) = [d for d in (tmp_path / "before").iterdir() if d.name[0].isdigit()]
    (after,) = [d for d in (tmp_path / "after").iterdir() if d.name[0].isdigit()]
    assert_kept(snapshot(before), snapshot(after))
    assert (tmp_path / "report_rc").read_text().strip() == "1"
    summary = json.loads((after / "summary.json").read_text())
    assert {f["id"] for f in summary["findings"]} | {d for f in summary["findings"] for d in f["duplicates"]} == set(
        snapshot(after))


def test_a_report_directory_read_only_from_the_start_is_exit_2(tmp_path):
    (tmp_path / "campaign.py").write_text(CAMPAIGN)
    script = """
        mount -t tmpfs -o size=1m,ro tmpfs $MNT || exit 99
        $PY $OUT/campaign.py $MNT/reports 2> $OUT/stderr; echo $? > $OUT/rc
        $PY -m fuzz run --report-dir $MNT/reports --budget 5s 2> $OUT/cli_stderr; echo $? > $OUT/cli_rc
    """
    proc = _in_a_mount_namespace(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cli_rc").read_text().strip() == "2"
    err = (tmp_path / "cli_stderr").read_text().strip().splitlines()
    assert len(err) == 1 and "not writable" in err[0] and "Read-only file system" in err[0], err


def test_a_stopped_campaign_does_not_wait_for_its_pictures(tmp_path):
    """Dispatch maps take seconds to draw: a stop signal never waits for
    them.  The stopped campaign's last report says which are missing, and
    ``fuzz report`` draws them."""
    pytest.importorskip("matplotlib")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    p = subprocess.Popen([sys.executable, "-m", "fuzz", "run", "--target", "mutant:range-off-by-one", "--budget", "10m",
                          "--report-dir", str(tmp_path / "reports"), "--quiet"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    run_dir, _ = wait_for(tmp_path, lambda found, d: any(f.status == "shrunk" for f in found), timeout=120,
                          what="a shrunk dispatch finding")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 1
    no_traceback(p)
    assert_group_gone(p.pid)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] == "SIGTERM"
    assert any("were drawn" in n and "fuzz report" in n for n in summary["notes"]), summary["notes"]
    rebuilt = assert_rebuilds(run_dir, complete=False, interrupted="SIGTERM")
    assert not any("no pictures" in n for n in rebuilt["notes"])
    assert [f for f in rebuilt["findings"] if f.get("picture")]
