"""Every mutant is caught by a SPEC §4 property on the mock with a small
scenario, and the reference passes that same scenario."""

from __future__ import annotations

import pytest

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.properties import check_scenario, property_ids
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step
from cgsim.targets import get_target, target_names
from cgsim.targets.mutants import MUTANTS
from cgsim.targets.reference import ModelCudaGraphManager, ReferenceTarget

C, D, R = Step.capture, Step.dispatch, Step.release
FAP = "FULL_AND_PIECEWISE"


def _sc(steps, ruleset="pr48822", **config) -> Scenario:
    return Scenario(config=ManagerConfig(**config), steps=tuple(steps), ruleset=ruleset)


# mutant -> (property that must catch it, minimal scenario exposing it)
CATCHES: dict[str, tuple[str, Scenario]] = {
    # Breakable PIECEWISE descriptors built as if not breakable (num_reqs None).
    "init-before-breakable": ("CAND-ORDER", _sc([C()], mode="PIECEWISE", capture_sizes=(2,), breakable=True)),
    # FULL graph captured with the warmup's metadata object.
    "full-reuses-warmup-metadata": ("FRESH-METADATA", _sc([C()], mode="FULL", capture_sizes=(2,))),
    # Breakable PIECEWISE capture runs with metadata None.
    "skip-attn-breakable": ("SKIP-ATTN", _sc([C()], mode="PIECEWISE", capture_sizes=(2,), breakable=True)),
    # Pieces captured for 4 padded requests, runtime metadata built for 2.
    "unpadded-breakable-metadata": (
        "PAD-CONSISTENT",
        _sc([C(), D(Batch((1, 1)))], mode="PIECEWISE", capture_sizes=(4,), breakable=True),
    ),
    # Metadata buffers reallocated after capture: the FULL replay reads stale ones.
    "rebind-metadata": ("METADATA-LIVE", _sc([C(), D(Batch((1, 1)))], mode="FULL", capture_sizes=(2,))),
    # FULL decode group claims tokens 0..4, the mixed batch (2,2) finds no PIECEWISE graph.
    "global-candidate-ranges": (
        "DISPATCH-COMPLETE", _sc([C(), D(Batch((2, 2)))], mode=FAP, capture_sizes=(4,)),
    ),
    # A batch of exactly the capture size has no candidate list.
    "range-off-by-one": ("DISPATCH-COMPLETE", _sc([C(), D(Batch((1, 1)))], mode="PIECEWISE", capture_sizes=(2,))),
    # Two-token batch dispatched to the 4-token graph.
    "dispatch-later-candidate": (
        "DISPATCH-MINIMAL", _sc([C(), D(Batch((1, 1)))], mode="PIECEWISE", capture_sizes=(2, 4)),
    ),
    "full-before-piecewise": ("CAPTURE-ORDER", _sc([C()], mode=FAP, capture_sizes=(2,))),
    "missing-warmup": ("WARMUP-FIRST", _sc([C()], mode="FULL", capture_sizes=(2,))),
    # Capture size 4 with max_num_reqs 2: the mixed FULL descriptor says 4 requests.
    "unclamped-num-reqs": ("CAND-BOUNDS", _sc([C()], mode="FULL", capture_sizes=(4,), max_num_reqs=2)),
    # One active adapter mapped down to case 0: no compatible graph, eager fallback.
    "lora-round-down": (
        "DISPATCH-COMPLETE",
        _sc([C(), D(Batch((1, 1), num_active_loras=1))], mode="PIECEWISE", capture_sizes=(2,), lora_cases=(0, 2)),
    ),
    # After release the manager still says "captured".
    "captured-flag-kept": ("RELEASE-RECAPTURE", _sc([C(), R(), D(Batch((1, 1)))], mode="FULL", capture_sizes=(2,))),
}


def _props(verdict) -> set[str]:
    return {v.property for v in verdict.violations}


def test_every_mutant_has_a_catching_scenario():
    assert len(MUTANTS) >= 13
    assert set(CATCHES) == set(MUTANTS)
    known = set(property_ids())
    for prop, _ in CATCHES.values():
        assert prop in known, prop


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_shape(name):
    cls = MUTANTS[name]
    assert issubclass(cls, ReferenceTarget) and cls is not ReferenceTarget
    assert cls.name == f"mutant:{name}"
    assert issubclass(cls.manager_class, ModelCudaGraphManager)
    assert cls.manager_class is not ModelCudaGraphManager
    assert cls.__doc__ and "Bug class" in cls.__doc__
    assert f"mutant:{name}" in target_names()
    assert isinstance(get_target(f"mutant:{name}"), cls)


@pytest.mark.parametrize("name", sorted(CATCHES))
def test_reference_passes_the_mutant_scenario(name):
    _, scenario = CATCHES[name]
    verdict = check_scenario(scenario, run_scenario(scenario, target="reference", backend="mock"))
    assert not verdict.violations, "\n".join(map(str, verdict.violations))


@pytest.mark.parametrize("name", sorted(CATCHES))
def test_mutant_is_caught(name):
    prop, scenario = CATCHES[name]
    trace = run_scenario(scenario, target=f"mutant:{name}", backend="mock")
    assert trace.target == f"mutant:{name}"
    verdict = check_scenario(scenario, trace)
    assert prop in _props(verdict), f"{name}: expected {prop}, got:\n" + "\n".join(map(str, verdict.violations))
