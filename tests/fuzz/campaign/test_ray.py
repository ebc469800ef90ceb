"""Campaigns over Ray (``--ray``) and the shared example database (``--example-db``).

The Ray tests run on a local Ray instance of 2 CPUs, started once for the
module; they need Ray (``pip install -e .[ray]``: CI's Ray environment in
``.ci/run``) and are skipped, with that reason, where it is not installed.
The rest (``--ray`` without Ray, the flags, the example database on a local
campaign) run everywhere.

The pipelines are tests/fuzz/campaign/test_campaign.py's FakePipeline and
tests/fuzz/campaign/test_faults.py's FaultPipeline (real Scenarios, Traces and Verdicts,
chosen bugs); the actors import them through PYTHONPATH, which the local Ray
instance passes on to its workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import xml.etree.ElementTree as ET

import pytest

from cgsim.report.findings import load_finding, scan_findings
from tests.fuzz.campaign.test_campaign import FakePipeline, fake_strategy, options
from tests.fuzz.campaign.test_faults import FaultPipeline, assert_kept, assert_rebuilds, snapshot, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

try:
    import ray
except ImportError:
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed here; CI runs these tests in its Ray "
                                                   "environment (.ci/run: pip install -e .[ray])")


@pytest.fixture(scope="module")
def cluster():
    old = os.environ.get("PYTHONPATH")
    # Inherited by the local Ray's workers: the actors import the fake pipelines.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, old) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def campaign(tmp_path, bug="big", pipeline=None, **kw):
    from fuzz.campaign import run_campaign

    return run_campaign(options(tmp_path, **kw), pipeline=pipeline or FakePipeline(bug), strategy=fake_strategy)


def over_ray(tmp_path, bug="big", pipeline=None, **kw):
    kw.setdefault("workers", 2)
    return campaign(tmp_path, bug, pipeline, ray="auto", **kw)


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fuzz", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


# -- without Ray ----------------------------------------------------------------------------
def test_ray_flag_without_ray_exits_2_with_one_line(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["ray"] = None  # as if Ray were not installed
        from fuzz.cli import main
        sys.exit(main(["run", "--ray", "--budget", "2s", "--report-dir", {str(tmp_path / 'r')!r}]))
        """)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'cgsim[ray]'" in lines[0], p.stderr
    assert not (tmp_path / "r").exists()  # nothing started


@pytest.mark.slow
def test_ray_flag_conflicts_are_usage_errors(tmp_path):
    p = cli("run", "--ray", "--gpus", "0", "--budget", "2s", "--report-dir", str(tmp_path))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--gpus" in p.stderr, p.stderr
    p = cli("run", "--ray", "--start-method", "spawn", "--budget", "2s", "--report-dir", str(tmp_path))
    assert p.returncode == 2 and "--start-method" in p.stderr, p.stderr
    # A file where a directory is wanted.
    (tmp_path / "f").write_text("x")
    p = cli("run", "--example-db", str(tmp_path / "f"), "--budget", "2s", "--report-dir", str(tmp_path / "r"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "is a file" in p.stderr, p.stderr


def test_validation_connects_to_nothing(monkeypatch):
    from fuzz.campaign.options import CampaignOptions, UsageError, validate

    monkeypatch.setitem(sys.modules, "ray", None)  # a connect would fail: Ray is "not installed"
    o = validate(CampaignOptions(ray="auto", workers=64))
    assert o.cluster is None and o.workers == 64  # bounded by the cluster the run joins (join_cluster)
    with pytest.raises(UsageError, match="Ray Client"):  # known without connecting
        validate(CampaignOptions(ray="ray://head:10001"))


# -- the example database (local campaigns: the driver owns the database either way) --------------------
def test_example_db_replays_saved_failures_first_and_forgets_fixed_ones(tmp_path):
    from fuzz.campaign.example_db import open_example_db

    db = str(tmp_path / "db")
    first = campaign(tmp_path / "a", bug="big", max_examples=60, example_db=db)
    (found,) = first.summary["findings"]
    assert found["status"] == "shrunk" and first.summary["settings"]["example_db"] == db
    (entry,) = open_example_db(db, "reference", "mock").entries()
    assert entry.property == "FAKE-BIG" and entry.scenario == found["scenario"]
    # Tomorrow: one scenario allowed, and it is the saved failure, final again.
    second = campaign(tmp_path / "b", bug="big", max_examples=1, seed=99, example_db=db)
    assert second.summary["scenarios"] == 1
    (again,) = second.summary["findings"]
    assert again["id"] == found["id"] and again["status"] == "shrunk"
    assert again["replayed"] == entry.digest and "first_seen_s" not in again
    assert any("1 saved failure(s) replayed first" in n for n in second.summary["notes"])
    # Fixed: it passes where it is replayed, and is forgotten.
    third = campaign(tmp_path / "c", bug="none", max_examples=5, example_db=db)
    assert third.exit_code == 0 and third.summary["findings"] == []
    assert any("forgotten (fixed)" in n for n in third.summary["notes"])
    assert open_example_db(db, "reference", "mock").entries() == ()
    # Another target's failures are its own.
    assert open_example_db(db, "mutant:missing-warmup", "mock").entries() == ()


def test_without_example_db_a_run_depends_on_its_seed_alone(tmp_path):
    db = str(tmp_path / "db")
    campaign(tmp_path / "a", bug="big", max_examples=60, example_db=db)
    a = campaign(tmp_path / "b", bug="two", max_examples=40, seed=5)
    b = campaign(tmp_path / "c", bug="two", max_examples=40, seed=5)
    assert sorted(f["id"] for f in a.summary["findings"]) == sorted(f["id"] for f in b.summary["findings"])
    assert "example_db" not in a.summary["settings"]


def test_example_db_on_redis(tmp_path, monkeypatch):
    fakeredis = pytest.importorskip("fakeredis", reason="fakeredis is installed in CI's Ray environment")
    import redis

    server = fakeredis.FakeServer()
    monkeypatch.setattr(redis.Redis, "from_url", classmethod(lambda cls, url, **kw: fakeredis.FakeRedis(server=server)))
    first = campaign(tmp_path / "a", bug="big", max_examples=60, example_db="redis://localhost:6379/0")
    second = campaign(tmp_path / "b", bug="big", max_examples=1, seed=99, example_db="redis://localhost:6379/0")
    assert [f["id"] for f in second.summary["findings"]] == [f["id"] for f in first.summary["findings"]]
    assert second.summary["findings"][0]["replayed"]


def test_example_db_redis_unreachable_is_a_usage_error(tmp_path):
    pytest.importorskip("redis", reason="the redis client is installed in CI's Ray environment")
    p = cli("run", "--example-db", "redis://127.0.0.1:1/0", "--budget", "2s", "--report-dir", str(tmp_path / "r"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "cannot reach Redis" in p.stderr, p.stderr


# -- over Ray -----------------------------------------------------------------------------
@needs_ray
def test_mutant_campaign_over_ray_finds_the_mutant(tmp_path, cluster):
    from cgsim.replay import reproduce
    from fuzz.campaign import CampaignOptions, run_campaign

    result = run_campaign(CampaignOptions(target="mutant:missing-warmup", budget_s=60.0, max_examples=10, workers=2,
                                          report_dir=str(tmp_path / "r"), quiet=True, seed=0, ray="auto"))
    assert result.exit_code == 1, result.summary
    f = next(f for f in result.summary["findings"] if f["property"] == "WARMUP-FIRST")
    assert reproduce(load_finding(os.path.join(result.run_dir, f["path"]))).reproduced
    assert result.summary["settings"]["ray"]["cpus"] == 2
    assert len({w["node"] for w in result.summary["workers"]}) == 1  # one machine, one node
    assert all(w["node"] and w["end"] == "done" for w in result.summary["workers"])


@needs_ray
def test_an_encoder_mutant_campaign_over_ray_finds_the_mutant(tmp_path, cluster):
    from cgsim.replay import reproduce
    from fuzz.campaign import CampaignOptions, run_campaign

    result = run_campaign(CampaignOptions(target="encoder-mutant:stale-tail", budget_s=90.0, max_examples=300,
                                          workers=2, report_dir=str(tmp_path / "r"), quiet=True, seed=1, ray="auto"))
    assert result.exit_code == 1, result.summary
    f = next(f for f in result.summary["findings"] if f["property"] == "ENC-EQUAL")
    assert f["scenario"]["kind"] == "encoder"
    assert reproduce(load_finding(os.path.join(result.run_dir, f["path"]))).reproduced
    assert all(w["node"] and w["end"] == "done" for w in result.summary["workers"])


@needs_ray
def test_report_has_the_same_shape_as_a_local_run(tmp_path, cluster):
    local = campaign(tmp_path / "local", bug="two", workers=2, max_examples=60, seed=7, budget_s=60.0)
    remote = over_ray(tmp_path / "ray", bug="two", workers=2, max_examples=60, seed=7, budget_s=60.0)
    a, b = local.summary, remote.summary
    assert set(a) == set(b)
    assert set(b["settings"]) - set(a["settings"]) == {"ray"}
    assert set(b["workers"][0]) - set(a["workers"][0]) == {"node", "node_ip"}
    assert set(a["properties"]) == set(b["properties"]) and set(a["coverage"]) == set(b["coverage"])
    # Same seed, same workers, same --max-examples: the same scenarios, so the same findings.
    assert a["scenarios"] == b["scenarios"], (a["workers"], b["workers"])
    on_disk = lambda r: sorted((f.id, f.status) for f in scan_findings(os.path.join(r.run_dir, "findings")))  # noqa: E731
    assert on_disk(local) == on_disk(remote)
    assert [f["status"] for f in b["findings"]] == ["shrunk", "shrunk"]
    for run in (local, remote):
        assert (json.load(open(os.path.join(run.run_dir, "summary.json")))["run_id"] == os.path.basename(run.run_dir))
    cases = lambda r: sorted(c.get("name") for c in ET.parse(os.path.join(r.run_dir, "junit.xml")).iter("testcase"))  # noqa: E731
    assert cases(local) == cases(remote)
    heads = lambda r: [ln for ln in open(os.path.join(r.run_dir, "index.md")) if ln.startswith("## ")]  # noqa: E731
    assert [h for h in heads(remote) if h != "## Nodes\n"] == heads(local)
    assert "## Nodes" in open(os.path.join(remote.run_dir, "index.md")).read()
    # Every finding on disk is listed; each has its repro script.
    listed = {f["id"] for f in b["findings"]} | {d for f in b["findings"] for d in f["duplicates"]}
    assert {f.id for f in scan_findings(os.path.join(remote.run_dir, "findings"))} == listed
    assert all(os.path.exists(os.path.join(remote.run_dir, f["repro_path"])) for f in b["findings"])


@needs_ray
def test_killing_an_actor_mid_run_loses_no_finding(tmp_path, cluster):
    seen = {}

    def kill_mid_shrink():
        run_dir, _ = wait_for(tmp_path, lambda found, d: any(f.status == "shrinking" for f in found), timeout=60,
                              what="a finding being shrunk")
        run_dir = type(run_dir)(os.path.realpath(run_dir))  # not reports/latest: the run's own name
        seen["before"] = snapshot(run_dir)
        shrinking = next(f for f in scan_findings(str(run_dir / "findings")) if f.status == "shrinking")
        victim = ray.get_actor(f"cgsim-{run_dir.name}-w{shrinking.worker}.0")
        ray.kill(victim)
        seen["run_dir"], seen["worker"] = run_dir, shrinking.worker

    killer = threading.Thread(target=kill_mid_shrink, daemon=True)
    killer.start()
    result = over_ray(tmp_path, pipeline=FaultPipeline("slow-two"), budget_s=15.0)
    killer.join(timeout=5)
    assert "before" in seen, "the actor was never killed"
    run_dir = seen["run_dir"]
    assert_kept(seen["before"], snapshot(run_dir))
    summary = result.summary
    assert summary["complete"] is True and result.exit_code == 1
    assert summary["workers"][seen["worker"]]["restarts"] >= 1
    assert any("ray.kill" in n for n in summary["notes"]), summary["notes"]
    assert not any(f["property"] == "NO-CRASH" for f in summary["findings"])  # a kill from outside is no finding
    assert {f["property"] for f in summary["findings"]} == {"FAKE-BIG", "FAKE-LORA"}
    assert_rebuilds(run_dir, complete=True)


@needs_ray
def test_an_actor_that_segfaults_is_restarted_and_its_scenario_is_a_finding(tmp_path, cluster):
    budget = 12.0
    result = over_ray(tmp_path, bug="segv", workers=1, budget_s=budget)
    crashes = [f for f in result.summary["findings"] if f["property"] == "NO-CRASH"]
    assert crashes, result.summary
    f = crashes[0]
    assert "died while running this scenario" in f["message"] and f["node"]
    assert max(sum(s["batch"]["query_lens"]) for s in f["scenario"]["steps"] if s["kind"] == "dispatch") >= 6
    assert os.path.exists(os.path.join(result.run_dir, f["repro_path"]))
    # The driver restarts a dead actor only while the budget lasts: an actor
    # whose start took most of it (a loaded machine) may die past the end.
    assert result.summary["workers"][0]["restarts"] >= 1 or f["elapsed_s"] > budget - 2.0, (
        result.summary["workers"], f["elapsed_s"])


@needs_ray
def test_a_hard_hang_is_killed_by_the_watchdog(tmp_path, cluster):
    # The actor's start and a draw that hangs (a dispatch of 6+ tokens) both come first: a loaded host
    # spent 14 s on them before the watchdog had anything to kill.
    result = over_ray(tmp_path, bug="hard-hang", workers=1, budget_s=30.0, timeout_s=0.3)
    hangs = [f for f in result.summary["findings"] if f["property"] == "NO-HANG"]
    assert hangs, result.summary
    assert "watchdog killed worker 0" in hangs[0]["message"] and hangs[0]["scenario"]["steps"]
    assert result.summary["workers"][0]["restarts"] >= 1, (result.summary["workers"], hangs[0]["elapsed_s"], result.summary["notes"])


@needs_ray
def test_the_actors_die_with_their_driver(tmp_path, cluster):
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from tests.fuzz.campaign.test_faults import FaultPipeline, fake_strategy
        from fuzz.campaign import CampaignOptions, run_campaign
        opts = CampaignOptions(target="reference", budget_s=60.0, workers=2, seed=1, report_dir={str(tmp_path / 'reports')!r},
                               quiet=True, timeout_s=5.0, shrink_grace_s=5.0, ray={cluster!r})
        sys.exit(run_campaign(opts, pipeline=FaultPipeline("slow-big"), strategy=fake_strategy).exit_code)
        """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        run_dir, _ = wait_for(tmp_path, lambda found, d: bool(found), timeout=90)
        pids = set()
        end = time.time() + 30
        while len(pids) < 2 and time.time() < end:
            for w in (0, 1):
                try:
                    pids.add(json.loads((run_dir / ".work" / f"inflight-w{w}.json").read_text())["pid"])
                except (OSError, ValueError, KeyError):
                    pass
            time.sleep(0.05)
        assert pids, "no actor announced a scenario"
        before = snapshot(run_dir)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        end = time.time() + 30
        while time.time() < end and any(os.path.exists(f"/proc/{pid}") for pid in pids):
            time.sleep(0.2)
        assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], "actors outlived their driver"
    finally:
        if p.poll() is None:
            p.kill()
    after = snapshot(run_dir)
    assert_kept(before, after)
    summary = assert_rebuilds(run_dir, complete=False, interrupted="campaign died")
    assert all(e["scenario"]["steps"] for e in summary["inflight"])


@needs_ray
def test_ray_client_addresses_are_refused(tmp_path, cluster):
    from fuzz.campaign import UsageError
    from fuzz.campaign.cluster import connect

    with pytest.raises(UsageError, match="Ray Client"):
        connect("ray://head:10001")


@needs_ray
def test_more_workers_than_the_cluster_has_is_a_usage_error(tmp_path, cluster):
    from fuzz.campaign import UsageError

    with pytest.raises(UsageError, match="the cluster has 2 CPU"):
        over_ray(tmp_path, workers=3)
    assert not (tmp_path / "reports").exists()  # nothing started
