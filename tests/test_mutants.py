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
    # Captured under (2, True, 2), looked up under (2, True, 1).
    "key-drops-lora-count": (
        "KEY-CONSISTENT",
        _sc([C(), D(Batch((1, 1), num_active_loras=2))], mode="PIECEWISE", capture_sizes=(2,), lora_cases=(0, 2)),
    ),
    # q = 2: a FULL decode graph for length 1, which the scheduler never produces.
    "decode-lengths-all": ("DECODE-LENGTHS", _sc([C()], mode=FAP, capture_sizes=(2,), decode_query_len=2)),
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


# ---------------------------------------------------------------------------
# Hypothesis: the fuzzer finds every mutant and shrinks it to a small case
# ---------------------------------------------------------------------------
from hypothesis import find, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fuzz.strategies import batches, configs, scenarios  # noqa: E402


# Small capture lists keep each run of the toy model cheap (every bug class
# here shows on a handful of sizes).  Ladders are left out: the shrinker does
# not get from configs()' ladder branch (1, 2, 4, 8, 16) back to its short-list
# branch, so a case found on a ladder would stay at 5 sizes.
FUZZ_MAX_SIZE = 16
MAX_SIZES = 4


def _small(config_filter=lambda c: True):
    return configs(max_size=FUZZ_MAX_SIZE).filter(lambda c: len(c.capture_sizes) <= MAX_SIZES and config_filter(c))


def _fuzz(config_filter=lambda c: True, ruleset=None):
    """scenarios() over small configs; ``config_filter`` narrows to the
    configs where the bug can show at all, so 100 ci examples reach it.
    Scenarios with a release are left out (none of these bugs needs one):
    scenarios() draws its optional release segment with ``integers(0, 3) ==
    0``, which the shrinker drives *towards* the release, so a case found
    there stays at 5 steps."""
    return (_small(config_filter).flatmap(lambda c: scenarios(ruleset=ruleset, config=c))
            .filter(lambda sc: all(s.kind != "release" for s in sc.steps)))


@st.composite
def _release_scenarios(draw):
    # scenarios() puts release after capture + dispatches and always captures
    # again, so its shortest release scenario has 5 steps; this one is
    # capture, release, dispatch.
    cfg = draw(_small())
    return Scenario(config=cfg, steps=(C(), R(), D(draw(batches(cfg)))), ruleset=draw(st.sampled_from(("pr48822", "vllm-0.32"))))


# mutant -> (strategy, properties any of which may be the one that catches the shrunk case)
FUZZ: dict[str, tuple[st.SearchStrategy, set[str]]] = {
    "init-before-breakable": (_fuzz(), {"CAND-ORDER"}),
    "full-reuses-warmup-metadata": (_fuzz(), {"FRESH-METADATA"}),
    "skip-attn-breakable": (_fuzz(), {"SKIP-ATTN"}),
    "unpadded-breakable-metadata": (_fuzz(lambda c: c.breakable, "pr48822"), {"PAD-CONSISTENT"}),
    "rebind-metadata": (_fuzz(), {"METADATA-LIVE", "REPLAY-EQUALS-EAGER"}),
    "global-candidate-ranges": (_fuzz(), {"DISPATCH-COMPLETE", "DISPATCH-ROUNDTRIP"}),
    "range-off-by-one": (_fuzz(), {"DISPATCH-COMPLETE", "DISPATCH-ROUNDTRIP", "DISPATCH-PRIORITY"}),
    "dispatch-later-candidate": (_fuzz(), {"DISPATCH-MINIMAL", "DISPATCH-PRIORITY", "DISPATCH-ROUNDTRIP"}),
    "full-before-piecewise": (_fuzz(), {"CAPTURE-ORDER"}),
    "missing-warmup": (_fuzz(), {"WARMUP-FIRST"}),
    "unclamped-num-reqs": (_fuzz(), {"CAND-BOUNDS", "CAND-ORDER", "NO-CRASH"}),
    "lora-round-down": (_fuzz(lambda c: c.lora_cases == (0, 2, 4)), {"DISPATCH-COMPLETE", "DISPATCH-ROUNDTRIP", "DISPATCH-PRIORITY"}),
    "captured-flag-kept": (_release_scenarios(), {"RELEASE-RECAPTURE", "BEFORE-CAPTURE"}),
    "key-drops-lora-count": (_fuzz(lambda c: max(c.lora_cases) >= 2), {"KEY-CONSISTENT"}),
    "decode-lengths-all": (_fuzz(lambda c: c.decode_query_len >= 2), {"DECODE-LENGTHS", "CAPTURE-USEFUL"}),
}


def test_every_mutant_is_fuzzed():
    assert set(FUZZ) == set(MUTANTS)


@pytest.mark.parametrize("name", sorted(FUZZ))
def test_fuzzer_finds_and_shrinks_mutant(name):
    strategy, catchers = FUZZ[name]

    def caught(sc: Scenario) -> set[str]:
        return _props(check_scenario(sc, run_scenario(sc, target=f"mutant:{name}", backend="mock"))) & catchers

    ci = settings(settings.get_profile("ci"), database=None)
    example = find(strategy, lambda sc: bool(caught(sc)), settings=ci)
    props = caught(example)
    assert props, example.short()
    assert len(example.config.capture_sizes) <= MAX_SIZES, example.short()
    assert len(example.steps) <= 3, f"{name}: shrunk to {example.short()}"
    # A counterexample only counts where the reference passes.
    ref = check_scenario(example, run_scenario(example, target="reference", backend="mock"))
    assert not ref.violations, f"{name}: reference fails the shrunk {example.short()}: " + "; ".join(map(str, ref.violations))
