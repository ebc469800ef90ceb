"""A campaign's workers within what the machine has: at most one per CPU
(per GPU) unless forced, the first one measured before the others start,
as many as the memory budget holds."""

from __future__ import annotations

import pytest

from fuzz.campaign import CampaignOptions, UsageError, options_for_profile, run_campaign
from fuzz.campaign.options import validate
from fuzz.campaign.resources import MIB, MemoryBudget, cpu_count, private_memory
from tests.fuzz.campaign.test_campaign import FakePipeline, fake_strategy, options


@pytest.fixture
def two_cpus(monkeypatch):
    import fuzz.campaign.resources as resources

    monkeypatch.setattr(resources, "cpu_count", lambda: 2)


def test_more_workers_than_cpus_is_refused_with_what_fits(two_cpus):
    with pytest.raises(UsageError) as exc:
        validate(CampaignOptions(workers=10000))
    assert "--workers 10000" in str(exc.value) and "2 CPU(s)" in str(exc.value) and "--force-workers" in str(exc.value)
    assert validate(CampaignOptions(workers=2)).workers == 2


def test_force_workers_starts_more_than_the_cpus(two_cpus):
    assert validate(CampaignOptions(workers=5, force_workers=True)).workers == 5


def test_a_profiles_default_is_bounded_without_a_word(two_cpus, monkeypatch):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the nightly profile's "one per core", on a 64-core host
    nightly = options_for_profile("nightly", budget_s=10.0)
    assert nightly.workers_from_profile
    assert validate(nightly.with_(workers=64)).workers == 2


def test_workers_with_their_own_gpu_are_bounded_by_the_gpus_given(monkeypatch):
    import fuzz.campaign.options as options_mod

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(options_mod, "_nvidia_smi_gpus", lambda: ["0", "1"])
    with pytest.raises(UsageError, match="1 GPU"):
        validate(CampaignOptions(workers=2, gpus="0"))
    assert validate(CampaignOptions(workers=2, gpus="0", force_workers=True)).workers == 2


def test_memory_budget_arithmetic():
    budget = MemoryBudget(worker_bytes=100 * MIB, available=1000 * MIB, share=0.5)
    assert budget.fits == 5
    assert "started 6 of the 9" in budget.describe(1, 9) and "100 MiB" in budget.describe(1, 9)
    assert cpu_count() >= 1
    import os

    assert private_memory(os.getpid()) > 0 and private_memory(2**22 + 12345) is None


def test_workers_start_as_the_memory_budget_holds(tmp_path, monkeypatch):
    """The first worker starts alone; once it is warm its private memory is
    measured and only as many more start as the budget holds: the others
    are "not started" and a note says why, with the numbers."""
    import fuzz.campaign.resources as resources

    monkeypatch.setattr(resources, "private_memory", lambda pid: 100 * MIB)
    monkeypatch.setattr(resources, "available_memory", lambda: 400 * MIB)  # half of it: two more workers
    result = run_campaign(options(tmp_path, workers=5, force_workers=True, max_examples=50),
                          pipeline=FakePipeline("none"), strategy=fake_strategy)
    ran = [w for w in result.summary["workers"] if w["scenarios"]]
    assert len(ran) == 3
    assert [w["end"] for w in result.summary["workers"][3:]] == ["not started: memory budget"] * 2
    (note,) = [n for n in result.summary["notes"] if "memory" in n or "MiB" in n]
    assert "started 3 of the 5 workers" in note and "100 MiB" in note


def test_memory_headroom_reads_a_cgroup_limit(tmp_path):
    from fuzz.campaign.resources import _headroom

    (tmp_path / "memory.limit_in_bytes").write_text(str(700 * MIB))
    (tmp_path / "memory.usage_in_bytes").write_text(str(200 * MIB))
    assert _headroom(str(tmp_path), "memory.limit_in_bytes", "memory.usage_in_bytes") == 500 * MIB
    (tmp_path / "memory.max").write_text("max")
    (tmp_path / "memory.current").write_text("1")
    assert _headroom(str(tmp_path), "memory.max", "memory.current") is None  # unlimited
    assert _headroom(str(tmp_path / "none"), "memory.max", "memory.current") is None
