"""Nested per-scenario deadlines (cgsim.timeouts): the earliest pending one
fires, an inner one never switches an outer one off, and the runner's own
timer and observe's backstop each catch what they are meant to."""

from __future__ import annotations

import dataclasses
import signal
import time

import pytest

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.scenario import Scenario, Step
from cgsim.timeouts import ScenarioTimeout, deadline


def _sleep_swallowing(total: float, own) -> None:
    """Sleep ``total`` seconds like a target that catches BaseException: a
    timeout of ``own`` is swallowed, any other propagates."""
    end = time.monotonic() + total
    while time.monotonic() < end:
        try:
            time.sleep(max(0.0, end - time.monotonic()))
        except ScenarioTimeout as exc:
            if own is None or not own.owns(exc):
                raise


def _clean() -> None:
    from cgsim import timeouts

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert timeouts._pending == []
    assert signal.getsignal(signal.SIGALRM) is not timeouts._expire


def test_outer_fires_after_an_inner_that_ended():
    start = time.monotonic()
    with pytest.raises(ScenarioTimeout) as info:
        with deadline(1.0, "outer") as outer:
            with deadline(0.2, "inner"):
                pass
            time.sleep(2.5)
    assert outer.owns(info.value) and str(info.value) == "outer"
    assert 0.9 <= time.monotonic() - start < 2.0
    _clean()


def test_one_second_around_a_fifth_around_a_long_sleep_fires_at_one_second():
    start = time.monotonic()
    with pytest.raises(ScenarioTimeout) as info:
        with deadline(1.0, "outer") as outer:
            with deadline(0.2, "inner") as inner:
                _sleep_swallowing(2.5, inner)  # the inner fires at 0.2 s and is swallowed
    assert outer.owns(info.value) and inner.fired
    assert 0.9 <= time.monotonic() - start < 2.0
    _clean()


def test_inner_longer_than_outer_fires_at_the_outer():
    start = time.monotonic()
    with pytest.raises(ScenarioTimeout) as info:
        with deadline(0.3, "outer") as outer:
            with deadline(2.0, "inner") as inner:
                time.sleep(2.5)
    assert outer.owns(info.value) and not inner.owns(info.value)
    assert 0.25 <= time.monotonic() - start < 1.5
    _clean()


def test_inner_fires_first_and_the_outer_stays_armed():
    with deadline(5.0, "outer"):
        with pytest.raises(ScenarioTimeout) as info:
            with deadline(0.1, "inner") as inner:
                time.sleep(2.0)
        assert inner.owns(info.value)
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 3.0 < remaining <= 5.0  # re-armed for the outer one
    _clean()


def test_previous_sigalrm_handler_is_restored():
    seen = []
    previous = signal.signal(signal.SIGALRM, lambda s, f: seen.append(s))
    try:
        with deadline(0.5, "x"):
            pass
        assert signal.getsignal(signal.SIGALRM) is not None and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        time.sleep(0.1)
        assert seen == [signal.SIGALRM]
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_no_timeout_and_negative_timeout():
    with deadline(None, "x") as d:
        assert d is None
    with pytest.raises(ValueError, match="negative"):
        with deadline(-1, "x"):
            pass


def test_a_timer_due_during_the_exit_never_kills_the_process():
    # Many deadlines ending right when they are due: the timer that went off
    # while SIGALRM was blocked for the bookkeeping must not reach SIG_DFL.
    for _ in range(200):
        try:
            with deadline(0.0005, "tiny"):
                t = time.monotonic() + 0.0005
                while time.monotonic() < t:
                    pass
        except ScenarioTimeout:
            pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


# -- the runner's timer and observe's backstop -----------------------------------------------------
def _scenario() -> Scenario:
    return Scenario(ManagerConfig(capture_sizes=(1, 2)), (Step.capture(), Step.dispatch(Batch((1,)))))


@pytest.fixture(scope="module")
def warm():
    # A first capture in a process pays one-time costs longer than the timers below.
    from cgsim.observe import observe

    assert observe(_scenario(), "reference", "mock", timeout=30).findings == ()


def test_runner_timer_turns_a_hang_into_a_timeout_event(monkeypatch, warm):
    from cgsim.observe import observe
    from cgsim.targets.reference import ManagerHandle

    monkeypatch.setattr(ManagerHandle, "dispatch", lambda self, batch: time.sleep(30))
    start = time.monotonic()
    outcome = observe(_scenario(), "reference", "mock", timeout=0.3)
    assert time.monotonic() - start < 1.0  # the runner's 0.3 s, not the 1.45 s backstop
    hang = outcome.first("NO-HANG")
    assert hang is not None and "0.3s timeout" in hang.message and outcome.needs_restart


def test_backstop_fires_when_the_target_swallows_the_runner_timer(monkeypatch, warm):
    from cgsim.observe import observe
    from cgsim.targets.reference import ManagerHandle

    def stubborn(self, batch):
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                time.sleep(end - time.monotonic())
            except BaseException as exc:  # a target that swallows everything, once
                if "did not finish" in str(exc):
                    raise

    monkeypatch.setattr(ManagerHandle, "dispatch", stubborn)
    start = time.monotonic()
    outcome = observe(_scenario(), "reference", "mock", timeout=0.3)
    took = time.monotonic() - start
    hang = outcome.first("NO-HANG")
    assert hang is not None and "did not finish within 1.45s" in hang.message, outcome
    assert 1.2 <= took < 4.0  # the backstop: 0.3 * 1.5 + 1 s
    _clean()


def test_a_failed_capture_on_the_mock_keeps_the_worker_and_the_next_scenario_captures(monkeypatch, warm):
    """The mock aborts a capture nobody ended when it is uninstalled, so a
    target that raised mid-capture leaves the process able to capture: no
    restart (it would cut the shrink of every such finding short)."""
    from cgsim.observe import observe
    from cgsim.targets.reference import ManagerHandle

    real_capture = ManagerHandle.capture

    def raise_mid_capture(self):
        import torch

        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.CUDAGraph().capture_begin()  # begun, never ended
            raise RuntimeError("the target failed mid-capture")

    monkeypatch.setattr(ManagerHandle, "capture", raise_mid_capture)
    with pytest.warns(RuntimeWarning, match="still under way"):
        failed = observe(_scenario(), "reference", "mock", timeout=30)
    assert failed.first("NO-CRASH") is not None and not failed.needs_restart
    monkeypatch.setattr(ManagerHandle, "capture", real_capture)
    assert observe(_scenario(), "reference", "mock", timeout=30).findings == ()


def test_a_failed_capture_restarts_the_worker_where_the_backend_says_it_poisons(monkeypatch, warm):
    from cgsim import backends
    from cgsim.observe import observe
    from cgsim.targets.reference import ManagerHandle

    def poisoning(name):
        return dataclasses.replace(real_get_backend(name), capture_failure_poisons=True)

    real_get_backend = backends.get_backend
    monkeypatch.setattr("cgsim.observe.get_backend", poisoning)
    monkeypatch.setattr(ManagerHandle, "capture", lambda self: (_ for _ in ()).throw(RuntimeError("capture failed")))
    assert observe(_scenario(), "reference", "mock", timeout=30).needs_restart


def test_the_timeout_grows_with_the_graphs_of_the_requested_mode():
    """A 51-size ladder with five LoRA cases is 255 graphs per capture: slow,
    not hung.  Without a piecewise runner the spec drops PIECEWISE (nothing to
    capture), but a target that keeps it (vLLM before 0.30, docs/findings.md
    #9) still runs every capture: its limit must count them too."""
    from cgsim.observe import GRAPHS_PER_TIMEOUT, scenario_timeout

    sizes = tuple(range(8, 409, 8))
    kept = ManagerConfig(mode="PIECEWISE", capture_sizes=sizes, max_num_reqs=64, lora_cases=(0, 1, 2, 4, 8))
    dropped = dataclasses.replace(kept, compiled_piecewise=False)
    steps = (Step.capture(), Step.release(), Step.capture())
    expected = 10 * len(sizes) * 5 * 2 / GRAPHS_PER_TIMEOUT
    assert scenario_timeout(Scenario(kept, steps), 10) == pytest.approx(expected)
    assert scenario_timeout(Scenario(dropped, steps), 10) == pytest.approx(expected)
    assert scenario_timeout(Scenario(ManagerConfig(capture_sizes=(1, 2)), steps), 10) == 10
    # With speculative decoding the drafter's prefill and decode managers capture as well.
    drafted = dataclasses.replace(kept, decode_query_len=2)
    assert scenario_timeout(Scenario(drafted, steps), 10) >= 3 * expected * 0.9
