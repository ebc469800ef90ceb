"""The property rules and the scheduler model an exported vLLM test carries
are cgsim's.

export-test generates each property's declared rule (``rule=``: the
dispatch properties' ``sound_fit``, ``priority_ok``, ``complete_ok`` and
``roundtrip_ok`` in ``cgsim/properties/dispatch.py``, INIT-TOTAL's
``descriptor_problems``, DECODE-LENGTHS' ``decode_length_gaps`` and
CAND-ORDER's ``capture_list_diff`` in ``init.py``, RELEASE-RECAPTURE's
``release_problems``, BEFORE-CAPTURE's ``capture_flag_problem``, and
DISPATCH-SOUND's runner half, ``view.py``'s ``graph_gap``, PAD-CONSISTENT's ``covers_query_len``, CAPTURE-USEFUL's
``sole_choice``) and
``producible_batches`` (``cgsim/spec/scheduler.py``) from their source
(``fuzz/export_test/vllm_rules.py``).  Executed from the generated text as
the exported module runs them (vLLM's descriptor and mode stood in for),
they decide every drawn batch and dispatch as cgsim does, and enumerate
exactly the batches cgsim's model calls producible for drawn configs; an
altered text disagrees somewhere Hypothesis finds."""

from __future__ import annotations

import enum
import inspect
from types import SimpleNamespace
from dataclasses import dataclass, make_dataclass, replace
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, lora_case
from cgsim.modes import RUNTIME_RANK
from cgsim.modes import CUDAGraphMode as CgsimMode
from cgsim.properties import registered
from cgsim.properties.dispatch import (capture_flag_problem, complete_ok, priority_ok, roundtrip_ok, sole_choice,
                                      sound_fit)
from cgsim.properties.init import capture_list_diff, decode_length_gaps, descriptor_problems
from cgsim.properties.lifecycle import release_problems
from cgsim.properties.view import graph_gap
from cgsim.properties.metadata import covers_query_len
from cgsim.spec import eager_descriptor, scheduler
from cgsim.spec.fit import best_fits, dispatch_choices
from fuzz.export_test import vllm_code, vllm_runtime
from fuzz.export_test.vllm_fit import FIT_IMPORTS
from fuzz.export_test.vllm_parts import count_partitions, scheduler_constants
from fuzz.strategies import configs

# vLLM's CUDAGraphMode and BatchExecutionDescriptor as the exported test imports them.
VllmMode = enum.Enum("CUDAGraphMode", {"NONE": 0, "PIECEWISE": 1, "FULL": 2})
VllmDescriptor = make_dataclass(
    "BatchExecutionDescriptor",
    [("cg_mode", object), ("num_tokens", int), ("num_reqs", object), ("uniform_token_count", object, None),
     ("max_query_len", object, None), ("num_active_loras", object, 0), ("num_ubatches", object, 1)], frozen=True)

SETTINGS = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
FIND = settings(max_examples=3000, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def assert_alteration_found(text: str, what: str, old: str, new: str, cases, disagree) -> None:
    """``text`` with ``old`` replaced by ``new`` (which it holds once) is a
    different rule: Hypothesis finds a case of ``cases`` where
    ``disagree(case, altered text)`` says the exported check and cgsim's differ."""
    assert text.count(old) == 1, f"{what}: the generated text no longer holds {old!r}"
    altered = text.replace(old, new)
    example = find(cases, lambda case: bool(disagree(case, altered)), settings=FIND)
    assert disagree(example, altered)


def _exec(text: str, **constants) -> dict:
    namespace = {"NamedTuple": NamedTuple, "CUDAGraphMode": VllmMode, **constants}
    exec("\n".join(FIT_IMPORTS) + "\n" + text, namespace)  # noqa: S102 - generated here
    return namespace


def as_vllm(d: BatchDescriptor):
    return VllmDescriptor(VllmMode[d.cg_mode.name], d.num_tokens, d.num_reqs, d.uniform_token_count,
                          d.max_query_len, d.num_active_loras, d.num_ubatches)


# -- DISPATCH-ROUNDTRIP -----------------------------------------------------------------------

ROUNDTRIP_TEXT = vllm_code.HELPER_BATCH + vllm_code.HELPER_FITS + vllm_runtime.HELPER_ROUNDTRIP


@dataclass(frozen=True)
class Dispatched:
    """Drawn: LoRA cases, captured graphs, a batch, and what dispatch might return for it."""

    lora_cases: tuple[int, ...]
    descs: tuple[BatchDescriptor, ...]
    batch: Batch
    returned: tuple[BatchDescriptor, ...]


@st.composite
def dispatched(draw) -> Dispatched:
    lora_cases = tuple(sorted(set(draw(st.lists(st.integers(0, 3), max_size=2))) | {0}))
    ubatches = draw(st.sampled_from((1, 2)))
    lens = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    prefill = draw(st.booleans())
    batch = Batch(lens, draw(st.integers(0, 3)), ubatches, has_prefill=prefill)

    def desc():
        # Near the batch's own shape, so that exact graphs are common.
        tokens = batch.num_tokens + draw(st.sampled_from((0, 0, 1, 2, -1)))
        reqs = draw(st.sampled_from((None, batch.num_reqs, batch.num_reqs + 1)))
        return BatchDescriptor(CgsimMode[draw(st.sampled_from(("FULL", "PIECEWISE")))], max(1, tokens), reqs,
                               draw(st.sampled_from((None, batch.uniform_token_count))),
                               draw(st.sampled_from((None, max(lens), max(lens) + 1))),
                               draw(st.sampled_from(lora_cases)), draw(st.sampled_from((1, ubatches))))

    descs = tuple(dict.fromkeys(desc() for _ in range(draw(st.integers(1, 6)))))
    eager = eager_descriptor(batch, lora_cases)
    short_eager = replace(eager, num_tokens=max(1, batch.num_tokens - draw(st.integers(0, 2))))
    returned = descs + (eager, short_eager, desc())
    return Dispatched(lora_cases, descs, batch, returned)


def roundtrip_disagreement(case: Dispatched, text: str = ROUNDTRIP_TEXT) -> str | None:
    """Where the exported round-trip check decides ``case`` otherwise than
    cgsim's DISPATCH-ROUNDTRIP (None: they agree)."""
    ns = _exec(text, LORA_CASES=case.lora_cases)
    b = case.batch
    batch = ns["Batch"](b.query_lens, b.num_active_loras, b.num_ubatches, b.has_prefill)
    captured = [as_vllm(d) for d in case.descs]
    theirs = [d for d in captured if ns["exact_shape"](d, batch)]
    exact = best_fits([b], case.descs, case.lora_cases)[0].exact
    if set(theirs) != {as_vllm(d) for d in exact}:
        return f"exact graphs {theirs}, cgsim: {exact}"
    if not exact:
        return None
    target = max(exact, key=lambda c: RUNTIME_RANK[c.cg_mode])
    their_target = max(theirs, key=ns["rank"])
    choices = dispatch_choices(b, case.descs, case.lora_cases)
    for d in case.returned:
        ours = roundtrip_ok(d, b, target, case.lora_cases, choices)
        if ns["roundtrip_holds"](as_vllm(d), batch, their_target, captured) != ours:
            return f"dispatch to {d.short()}: cgsim says {'right' if ours else 'wrong'}"
    return None


@SETTINGS
@given(dispatched())
def test_the_exported_roundtrip_check_decides_as_cgsims(case):
    assert roundtrip_disagreement(case) is None, case


# Edits to the generated text that the differential test must catch: (what it breaks, the text, the replacement).
ROUNDTRIP_ALTERATIONS = [
    ("the oracle's own choice", "return d in choices or (", "return ("),
    ("higher priority pads no token", "(rank > want and d.num_tokens == b.num_tokens)", "(rank > want)"),
    ("equal priority pads no more", "padding_key(d, b) <= padding_key(target, b)",
     "padding_key(d, b)[0] <= padding_key(target, b)[0]"),
    ("the exact shape pads no request", "padding_waste(desc, batch) == (0, 0)", "padding_waste(desc, batch)[0] == 0"),
]


@pytest.mark.parametrize("what,old,new", ROUNDTRIP_ALTERATIONS, ids=[a[0] for a in ROUNDTRIP_ALTERATIONS])
def test_an_altered_roundtrip_check_disagrees(what, old, new):
    assert_alteration_found(ROUNDTRIP_TEXT, what, old, new, dispatched(), roundtrip_disagreement)


# -- DISPATCH-SOUND, -PRIORITY, -COMPLETE ------------------------------------------------------

DISPATCH_TEXTS = {
    "DISPATCH-SOUND": vllm_code.HELPER_BATCH + vllm_code.HELPER_FITS + vllm_code.HELPER_SOUND,
    "DISPATCH-PRIORITY": vllm_code.HELPER_BATCH + vllm_code.HELPER_FITS + vllm_code.HELPER_PRIORITY,
    "DISPATCH-COMPLETE": vllm_code.HELPER_BATCH + vllm_code.HELPER_FITS + vllm_code.HELPER_COMPLETE,
}


def cgsims_verdict(pid: str, d: BatchDescriptor, case: Dispatched) -> bool:
    """What cgsim's judge decides of dispatching ``case.batch`` to ``d``: its
    rule over the values the check hands it (the sweep's best fits)."""
    b, cases = case.batch, case.lora_cases
    fit = best_fits([b], case.descs, cases)[0]
    if pid == "DISPATCH-SOUND":
        return sound_fit(d, b, lora_case(b.num_active_loras, cases))
    if pid == "DISPATCH-PRIORITY":
        return priority_ok(d, bool(fit.by_mode.get(CgsimMode.FULL)))
    return complete_ok(d, bool(fit.choices))


def exported_verdict(pid: str, ns: dict, d, batch, captured) -> bool:
    """What the exported test asserts of dispatching ``batch`` to ``d``."""
    if pid == "DISPATCH-SOUND":
        return ns["sound_fit_holds"](d, batch)
    return ns["priority_holds" if pid == "DISPATCH-PRIORITY" else "complete_holds"](d, batch, captured)


def dispatch_disagreement(pid: str, case: Dispatched, text: str | None = None) -> str | None:
    """Where the exported check of ``pid`` decides ``case`` otherwise than cgsim (None: they agree)."""
    ns = _exec(text or DISPATCH_TEXTS[pid], LORA_CASES=case.lora_cases)
    b = case.batch
    batch = ns["Batch"](b.query_lens, b.num_active_loras, b.num_ubatches, b.has_prefill)
    captured = [as_vllm(d) for d in case.descs]
    for d in case.returned:
        ours = cgsims_verdict(pid, d, case)
        if exported_verdict(pid, ns, as_vllm(d), batch, captured) != ours:
            return f"dispatch to {d.short()}: cgsim says {'right' if ours else 'wrong'}"
    return None


@SETTINGS
@given(dispatched())
@pytest.mark.parametrize("pid", sorted(DISPATCH_TEXTS))
def test_the_exported_dispatch_checks_decide_as_cgsims(pid, case):
    assert dispatch_disagreement(pid, case) is None, case


DISPATCH_ALTERATIONS = [
    ("DISPATCH-SOUND", "an eager run keeps every token", "return d.num_tokens >= b.num_tokens",
     "return d.num_tokens > b.num_tokens"),
    ("DISPATCH-SOUND", "a graph is of the batch's LoRA case", "return d.num_active_loras == case and fits_in_case",
     "return fits_in_case"),
    ("DISPATCH-SOUND", "the adapter's LoRA case", "lora_case(batch.num_active_loras, LORA_CASES)",
     "batch.num_active_loras"),
    ("DISPATCH-PRIORITY", "FULL wins", "return d.cg_mode is F or not full_fits",
     "return d.cg_mode is not N or not full_fits"),
    ("DISPATCH-PRIORITY", "the adapter asks of FULL graphs", "fitting(captured, batch, CUDAGraphMode.FULL)",
     "fitting(captured, batch)"),
    ("DISPATCH-COMPLETE", "any graph rather than eager", "return d.cg_mode is not N or not any_fits",
     "return d.cg_mode is F or not any_fits"),
]


@pytest.mark.parametrize("pid,what,old,new", DISPATCH_ALTERATIONS, ids=[f"{a[0]}: {a[1]}" for a in DISPATCH_ALTERATIONS])
def test_an_altered_dispatch_check_disagrees(pid, what, old, new):
    assert_alteration_found(DISPATCH_TEXTS[pid], what, old, new, dispatched(),
                            lambda case, text: dispatch_disagreement(pid, case, text))


# -- INIT-TOTAL -------------------------------------------------------------------------------

INIT_TOTAL_TEXT = vllm_code.HELPER_BATCH + vllm_code.HELPER_FITS + vllm_code.HELPER_INIT_TOTAL


@dataclass(frozen=True)
class Built:
    """Drawn: a config's decode query length, LoRA cases and micro-batch count,
    and capture descriptors, sane or not, as (mode, tokens, reqs, uniform, max_query_len, loras, ubatches)."""

    decode_query_len: int
    lora_cases: tuple[int, ...]
    num_ubatches: int
    descs: tuple[tuple, ...]


@st.composite
def built(draw) -> Built:
    fields = st.tuples(st.sampled_from(("FULL", "PIECEWISE", "NONE")), st.integers(0, 4),
                       st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.integers(0, 5)),
                       st.one_of(st.none(), st.integers(0, 3)), st.integers(0, 3), st.integers(1, 3))
    return Built(draw(st.integers(1, 4)), tuple(sorted(set(draw(st.lists(st.integers(0, 3), max_size=2))) | {0})),
                 draw(st.integers(1, 3)), tuple(draw(st.lists(fields, min_size=1, max_size=5))))


def init_total_disagreement(case: Built, text: str = INIT_TOTAL_TEXT) -> str | None:
    """Where the exported INIT-TOTAL check finds other problems than cgsim's (None: the same)."""
    ns = _exec(text, DECODE_QUERY_LEN=case.decode_query_len, LORA_CASES=list(case.lora_cases),
               NUM_UBATCHES=case.num_ubatches)
    for mode, *rest in case.descs:
        # Plain records: a descriptor cgsim's constructor would refuse is what INIT-TOTAL is about.
        ours = descriptor_problems(SimpleNamespace(**dict(zip(
            ("cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "max_query_len", "num_active_loras",
             "num_ubatches"), (CgsimMode[mode], *rest)))), case.decode_query_len, case.lora_cases, case.num_ubatches)
        theirs = ns["insane"](VllmDescriptor(VllmMode[mode], *rest))
        if theirs != ours:
            return f"{mode}{tuple(rest)}: exported {theirs}, cgsim {ours}"
    return None


@SETTINGS
@given(built())
def test_the_exported_init_total_check_finds_cgsims_problems(case):
    assert init_total_disagreement(case) is None, case


INIT_TOTAL_ALTERATIONS = [
    ("the longest decode length", "not 1 <= d.uniform_token_count <= decode_query_len",
     "not 1 <= d.uniform_token_count < decode_query_len"),
    ("micro-batches 1 or the configured", "if d.num_ubatches not in (1, num_ubatches):",
     "if d.num_ubatches not in (1,):"),
    ("the adapter's config", "DECODE_QUERY_LEN, LORA_CASES, NUM_UBATCHES", "DECODE_QUERY_LEN + 1, LORA_CASES, NUM_UBATCHES"),
]


@pytest.mark.parametrize("what,old,new", INIT_TOTAL_ALTERATIONS, ids=[a[0] for a in INIT_TOTAL_ALTERATIONS])
def test_an_altered_init_total_check_disagrees(what, old, new):
    assert_alteration_found(INIT_TOTAL_TEXT, what, old, new, built(), init_total_disagreement)


# -- PAD-CONSISTENT ---------------------------------------------------------------------------

PAD_TEXT = vllm_code.HELPER_BATCH + vllm_code.HELPER_PAD


def pad_disagreement(captured_max_query_len: int, b: Batch, text: str = PAD_TEXT) -> str | None:
    """Where the exported PAD-CONSISTENT check decides otherwise than cgsim's (None: they agree)."""
    ns = _exec(text)
    batch = ns["Batch"](b.query_lens, b.num_active_loras, b.num_ubatches, b.has_prefill)
    ours = covers_query_len(captured_max_query_len, b.max_query_len)
    if ns["metadata_covers"](captured_max_query_len, batch) != ours:
        return f"{b.short()} on metadata for max_query_len={captured_max_query_len}: cgsim says {ours}"
    return None


padded = st.tuples(st.integers(1, 5), st.builds(Batch, st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple),
                                                st.just(0), st.just(1), has_prefill=st.booleans()))


@SETTINGS
@given(padded)
def test_the_exported_pad_check_decides_as_cgsims(case):
    assert pad_disagreement(*case) is None, case


PAD_ALTERATIONS = [
    ("metadata for the longest request covers it", "return captured_max_query_len >= batch_max_query_len",
     "return captured_max_query_len > batch_max_query_len"),
    ("the adapter reads the longest request", "max(batch.query_lens)", "batch.query_lens[0]"),
]


@pytest.mark.parametrize("what,old,new", PAD_ALTERATIONS, ids=[a[0] for a in PAD_ALTERATIONS])
def test_an_altered_pad_check_disagrees(what, old, new):
    assert_alteration_found(PAD_TEXT, what, old, new, padded, lambda case, text: pad_disagreement(*case, text=text))


# -- CAPTURE-USEFUL ---------------------------------------------------------------------------

USEFUL_TEXT = vllm_code.HELPER_BATCH + vllm_code.HELPER_FITS + vllm_code.HELPER_USEFUL


def useful_disagreement(case: Dispatched, text: str = USEFUL_TEXT) -> str | None:
    """Where the exported CAPTURE-USEFUL check credits another graph with
    ``case.batch`` than cgsim's does (None: the same, or none)."""
    ns = _exec(text, LORA_CASES=case.lora_cases)
    b = case.batch
    batch = ns["Batch"](b.query_lens, b.num_active_loras, b.num_ubatches, b.has_prefill)
    ours = sole_choice(best_fits([b], case.descs, case.lora_cases)[0].choices)
    theirs = ns["sole_choice"](ns["best_choices"](batch, [as_vllm(d) for d in case.descs]))
    if theirs != (None if ours is None else as_vllm(ours)):
        return f"exported: {theirs}, cgsim: {ours}"
    return None


@SETTINGS
@given(dispatched())
def test_the_exported_useful_check_credits_the_graph_cgsims_does(case):
    assert useful_disagreement(case) is None, case


USEFUL_ALTERATIONS = [
    ("a batch with tied graphs makes none useful", "return choices[0] if len(choices) == 1 else None",
     "return choices[0] if choices else None"),
]


@pytest.mark.parametrize("what,old,new", USEFUL_ALTERATIONS, ids=[a[0] for a in USEFUL_ALTERATIONS])
def test_an_altered_useful_check_disagrees(what, old, new):
    assert_alteration_found(USEFUL_TEXT, what, old, new, dispatched(), useful_disagreement)


# -- DECODE-LENGTHS ---------------------------------------------------------------------------

DECODE_LENGTHS_TEXT = vllm_code.HELPER_DECODE_LENGTHS

lengths = st.lists(st.integers(1, 4), max_size=4)
decoded = st.tuples(st.lists(st.tuples(st.sampled_from(("FULL", "PIECEWISE")), st.one_of(st.none(), st.integers(1, 4))),
                             max_size=5), lengths, lengths)


def decode_lengths_disagreement(case: tuple, text: str = DECODE_LENGTHS_TEXT) -> str | None:
    """Where the exported DECODE-LENGTHS check finds other gaps than cgsim's (None: the same)."""
    graphs, scheduled, feasible = case
    ns = _exec(text)
    ours = decode_length_gaps([BatchDescriptor(CgsimMode[m], 4, None, u) for m, u in graphs], scheduled, feasible)
    theirs = ns["decode_length_gaps"]([VllmDescriptor(VllmMode[m], 4, None, u) for m, u in graphs], scheduled, feasible)
    return None if tuple(theirs) == tuple(ours) else f"exported {theirs}, cgsim {ours}"


@SETTINGS
@given(decoded)
def test_the_exported_decode_lengths_check_finds_cgsims_gaps(case):
    assert decode_lengths_disagreement(case) is None, case


DECODE_LENGTHS_ALTERATIONS = [
    ("only FULL graphs are decode graphs", "if d.cg_mode == F and d.uniform_token_count is not None",
     "if d.uniform_token_count is not None"),
    ("lengths the scheduler never produces", "sorted(lens - set(scheduled))", "sorted(lens - set(feasible))"),
]


@pytest.mark.parametrize("what,old,new", DECODE_LENGTHS_ALTERATIONS, ids=[a[0] for a in DECODE_LENGTHS_ALTERATIONS])
def test_an_altered_decode_lengths_check_disagrees(what, old, new):
    assert_alteration_found(DECODE_LENGTHS_TEXT, what, old, new, decoded, decode_lengths_disagreement)


# -- CAND-ORDER -------------------------------------------------------------------------------

CAND_ORDER_TEXT = vllm_code.HELPER_CAND_ORDER

capture_list = st.lists(st.builds(lambda m, t, r: (m, t, r), st.sampled_from(("FULL", "PIECEWISE", "NONE")),
                                  st.integers(1, 3), st.one_of(st.none(), st.integers(1, 2))), max_size=5)


def cand_order_disagreement(case: tuple, text: str = CAND_ORDER_TEXT) -> str | None:
    """Where the exported CAND-ORDER check finds another difference between
    two capture lists than cgsim's (None: the same)."""
    ns = _exec(text)
    ours = capture_list_diff(*([BatchDescriptor(CgsimMode[m], t, r) for m, t, r in lst] for lst in case))
    theirs = ns["capture_list_diff"](*([VllmDescriptor(VllmMode[m], t, r) for m, t, r in lst] for lst in case))
    ours_as_vllm = {VllmMode[m.name]: tuple({as_vllm(d) for d in part} for part in parts) for m, parts in ours.items()}
    if list(theirs.items()) != list(ours_as_vllm.items()):
        return f"exported {theirs}, cgsim {ours}"
    return None


@SETTINGS
@given(st.tuples(capture_list, capture_list))
def test_the_exported_cand_order_check_finds_cgsims_difference(case):
    assert cand_order_disagreement(case) is None, case


CAND_ORDER_ALTERATIONS = [
    ("missing is what the expected list holds", "out[mode] = (want - got, got - want)",
     "out[mode] = (got - want, want - got)"),
    ("every mode, NONE too", "for mode in (P, F, N):", "for mode in (P, F):"),
]


@pytest.mark.parametrize("what,old,new", CAND_ORDER_ALTERATIONS, ids=[a[0] for a in CAND_ORDER_ALTERATIONS])
def test_an_altered_cand_order_check_disagrees(what, old, new):
    assert_alteration_found(CAND_ORDER_TEXT, what, old, new, st.tuples(capture_list, capture_list),
                            cand_order_disagreement)


# -- RELEASE-RECAPTURE and BEFORE-CAPTURE: rules over a graph count and flags ----------------

FLAG_RULES = {
    # pid: (the exported text, cgsim's rule, its name there, drawn arguments)
    "RELEASE-RECAPTURE": (vllm_code.HELPER_RELEASE_RECAPTURE, release_problems, "release_problems",
                          st.tuples(st.integers(0, 3), st.booleans())),
    "BEFORE-CAPTURE": (vllm_code.HELPER_BEFORE_CAPTURE, capture_flag_problem, "capture_flag_problem",
                       st.tuples(st.booleans(), st.booleans())),
}


def flag_disagreement(pid: str, args: tuple, text: str | None = None) -> str | None:
    exported, rule, name, _ = FLAG_RULES[pid]
    theirs, ours = _exec(text or exported)[name](*args), rule(*args)
    return None if theirs == ours else f"{args}: exported {theirs!r}, cgsim {ours!r}"


@SETTINGS
@given(st.data())
@pytest.mark.parametrize("pid", sorted(FLAG_RULES))
def test_the_exported_flag_checks_decide_as_cgsims(pid, data):
    args = data.draw(FLAG_RULES[pid][3])
    assert flag_disagreement(pid, args) is None


FLAG_ALTERATIONS = [
    ("RELEASE-RECAPTURE", "every graph is dropped", "if graphs_after != 0:", "if graphs_after > 1:"),
    ("RELEASE-RECAPTURE", "the flag is dropped", "if captured_flag_after:", "if not captured_flag_after:"),
    ("BEFORE-CAPTURE", "a failed capture leaves no flag", "if not ok and captured_flag:", "if not ok and False:"),
]


@pytest.mark.parametrize("pid,what,old,new", FLAG_ALTERATIONS, ids=[f"{a[0]}: {a[1]}" for a in FLAG_ALTERATIONS])
def test_an_altered_flag_check_disagrees(pid, what, old, new):
    assert_alteration_found(FLAG_RULES[pid][0], what, old, new, FLAG_RULES[pid][3],
                            lambda args, text: flag_disagreement(pid, args, text))


# DISPATCH-SOUND's runner half (view.py's graph_gap): whether something runs
# the graph, asked of the test's doubles.  Drawn: the graph's mode, whether
# the manager stores it, whether capture recorded it, a compiled model,
# breakable graphs.
runner_world = st.tuples(st.sampled_from(("FULL", "PIECEWISE")), st.booleans(), st.booleans(), st.booleans(),
                         st.booleans())


def runs_disagreement(case: tuple, text: str = DISPATCH_TEXTS["DISPATCH-SOUND"]) -> str | None:
    mode, stored, recorded, compiled, breakable = case
    ns = _exec(text, LORA_CASES=(0,), COMPILED_MODEL=compiled)
    desc = VllmDescriptor(VllmMode[mode], 4, None)
    manager = SimpleNamespace(graphs={desc: object()} if stored else {}, use_breakable_cg=breakable)
    # The recorder's captured(): the stored graphs, and the PIECEWISE shapes
    # capture recorded where the compiled model captured them.
    recorder = SimpleNamespace(captured=lambda m: list(m.graphs) + ([desc] if recorded and compiled else []))
    ours = graph_gap(CgsimMode[mode], stored, compiled or breakable, stored or (recorded and compiled))
    theirs = ns["runs_gap"](desc, manager, recorder)
    return None if theirs == ours else f"{case}: exported {theirs!r}, cgsim {ours!r}"


@SETTINGS
@given(runner_world)
def test_the_exported_runner_check_decides_as_cgsims(case):
    assert runs_disagreement(case) is None


RUNS_ALTERATIONS = [
    ("a FULL graph must be stored", 'if mode is CUDAGraphMode.FULL and not stored:', "if False:"),
    ("breakable graphs run piecewise graphs", 'COMPILED_MODEL or getattr(manager, "use_breakable_cg", False)',
     "COMPILED_MODEL"),
]


@pytest.mark.parametrize("what,old,new", RUNS_ALTERATIONS, ids=[a[0] for a in RUNS_ALTERATIONS])
def test_an_altered_runner_check_disagrees(what, old, new):
    assert_alteration_found(DISPATCH_TEXTS["DISPATCH-SOUND"], what, old, new, runner_world, runs_disagreement)


def test_each_exported_rule_is_the_one_its_property_declares():
    """The generated text holds the very function the judge calls (``rule=``)."""
    for pid, text in {**DISPATCH_TEXTS, "DISPATCH-ROUNDTRIP": ROUNDTRIP_TEXT, "INIT-TOTAL": INIT_TOTAL_TEXT,
                      "PAD-CONSISTENT": PAD_TEXT, "CAPTURE-USEFUL": USEFUL_TEXT,
                      "DECODE-LENGTHS": DECODE_LENGTHS_TEXT, "CAND-ORDER": CAND_ORDER_TEXT,
                      **{pid: rule[0] for pid, rule in FLAG_RULES.items()}}.items():
        rule = registered()[pid].rule
        assert rule is not None and f"def {rule.__name__}(" in text, pid


# -- the scheduler model ----------------------------------------------------------------------

SCHEDULER_TEXT = vllm_code.HELPER_BATCH + vllm_code.HELPER_SCHEDULER


def small(config: ManagerConfig) -> bool:
    """A config whose every batch shape a test can enumerate quickly."""
    return count_partitions(config.max_capture_size, config.max_num_reqs) <= 400


def exported_batches(config: ManagerConfig, text: str = SCHEDULER_TEXT) -> set[tuple]:
    """What ``every_producible_batch()`` yields under the config's constants, as (lens, loras, ubatches, prefill)."""
    constants: dict = {"MAX_NUM_REQS": config.max_num_reqs, "LORA_CASES": list(config.lora_cases),
                       "NUM_UBATCHES": config.num_ubatches}
    if config.num_ubatches > 1:
        constants["UBATCH_THRESHOLD"] = config.ubatch_threshold
    exec(scheduler_constants(config), constants)  # noqa: S102 - the constants the writer puts in the module
    ns = _exec(text, **constants)
    return {tuple(b) for b in ns["every_producible_batch"]()}


def producible(config: ManagerConfig) -> set[tuple]:
    """Every batch up to the largest capture size that cgsim's model says the
    scheduler can produce (``why_not_producible``), in each LoRA case."""
    out = set()
    for tokens in range(1, config.max_capture_size + 1):
        for lens in _partitions(tokens, config.max_num_reqs):
            for loras in config.lora_cases:
                for ubatches in {1, config.num_ubatches}:
                    for prefill in (False, True):
                        if scheduler.why_not_producible(config, Batch(lens, loras, ubatches, prefill)) is None:
                            out.add((lens, loras, ubatches, prefill))
    return out


def _partitions(total: int, parts: int, largest: int | None = None):
    largest = total if largest is None else largest
    if total == 0:
        yield ()
        return
    for first in range(min(total, largest), 0, -1) if parts else ():
        for rest in _partitions(total - first, parts - 1, first):
            yield (first,) + rest


@SETTINGS
@given(configs(max_size=12).filter(small))
def test_the_exported_scheduler_enumerates_what_cgsims_model_produces(config):
    assert exported_batches(config) == producible(config)


SCHEDULER_ALTERATIONS = [
    ("a decode's longest length", "return max(lens) <= longest_decode_len(config, len(lens))",
     "return max(lens) == longest_decode_len(config, len(lens))"),
    ("mixed decodes take any batch size's length",
     "return longest_decode_len(config, 1) if num_reqs > 1", "return longest_decode_len(config, num_reqs) if True"),
    ("any shape can be prompt chunks", "if not prefill and not is_decode_batch(config, lens):",
     "if not is_decode_batch(config, lens):"),
    ("an eligible batch may run whole", "out.append(Batch(lens, lora, 1, has_prefill=prefill))",
     "out.append(make_batch(config, lens, lora, has_prefill=prefill))"),
    ("the DBO floor", "max(config.ubatch_threshold, config.num_ubatches)", "config.num_ubatches"),
    ("every micro-batch count", "sorted({1, NUM_UBATCHES})", "[1]"),
]


@pytest.mark.parametrize("what,old,new", SCHEDULER_ALTERATIONS, ids=[a[0] for a in SCHEDULER_ALTERATIONS])
def test_an_altered_scheduler_model_disagrees(what, old, new):
    assert SCHEDULER_TEXT.count(old) == 1, f"{what}: the generated text no longer holds {old!r}"
    altered = SCHEDULER_TEXT.replace(old, new)
    example = find(configs(max_size=12).filter(small),
                   lambda c: exported_batches(c, altered) != producible(c), settings=FIND)
    assert exported_batches(example, altered) != producible(example)


@pytest.mark.parametrize("function", [roundtrip_ok, sound_fit, priority_ok, complete_ok, descriptor_problems,
                                      covers_query_len, sole_choice, decode_length_gaps, capture_list_diff,
                                      release_problems, capture_flag_problem, graph_gap,
                                      scheduler.producible_batches, scheduler.is_decode_batch,
                                      scheduler.make_batch, scheduler.longest_mixed_decode_len])
def test_the_exported_rules_are_generated_from_cgsims_source(function):
    """Every line of each function's body is in the exported text as written
    in cgsim (the signature loses its annotations only)."""
    lines = inspect.getsource(function).splitlines()
    body = lines[next(i for i, line in enumerate(lines) if line.rstrip().endswith(":")) + 1:]
    text = (ROUNDTRIP_TEXT + SCHEDULER_TEXT + "".join(DISPATCH_TEXTS.values()) + INIT_TOTAL_TEXT + PAD_TEXT
            + USEFUL_TEXT + DECODE_LENGTHS_TEXT + CAND_ORDER_TEXT
            + "".join(rule[0] for rule in FLAG_RULES.values()))
    assert all(line in text for line in body), [line for line in body if line not in text]
    assert f"def {function.__name__}(" in text
