"""Properties of where batches go: DISPATCH-SOUND, DISPATCH-PRIORITY,
DISPATCH-COMPLETE, DISPATCH-MINIMAL, DISPATCH-ROUNDTRIP, BEFORE-CAPTURE and
CAPTURE-USEFUL (a graph no batch is dispatched to is dead)."""

from __future__ import annotations

from functools import lru_cache
from itertools import compress
from operator import attrgetter
from typing import Iterable

from cgsim.config import ManagerConfig
from cgsim.descriptors import BatchDescriptor, lora_case
from cgsim.modes import RUNTIME_RANK, CUDAGraphMode
from cgsim.properties.registry import Violation, declare
from cgsim.properties.view import RunView, candidates_hold, group, incompat_reason, shorts, sweep_violations
from cgsim.spec import desc_sort_key, padding_key
from cgsim.spec import scheduler
from cgsim.spec.fit import best_fits, compatible, fits_in_case
from cgsim.trace import CaptureDone

__all__ = ["useless_descriptors", "roundtrip_ok", "sound_fit", "priority_ok", "complete_ok", "sole_choice",
           "capture_flag_problem"]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


def _has_dispatch(run: RunView) -> bool:
    return bool(run.judged_sweeps)


def _has_captured_dispatch(run: RunView) -> bool:
    return bool(run.judged_captured)


# Every dispatch property has one loop: over the runner's dispatch sweeps and
# the scenario's own dispatch steps, each a sweep of its one batch
# (RunView.judged_sweeps), judging the batches whose decision is not the
# oracle's (SweepView.disputed) and naming the smallest that fails.


# Each property's rule over plain values (``rule=`` in its declaration): the
# check calls it, and export-test generates the exported check from it.


def sound_fit(d: BatchDescriptor, b, case: int) -> bool:
    """Whether dispatching ``b`` (of LoRA case ``case``) to ``d`` can run it
    at all: an eager run keeps every token of the batch, a graph fits it
    (``compatible``, the case given; export-test carries this rule as written)."""
    if d.cg_mode is N:
        return d.num_tokens >= b.num_tokens
    return d.num_active_loras == case and fits_in_case(d, b)


@declare("DISPATCH-SOUND", "the dispatched descriptor fits the batch and something runs it", family="dispatch",
         applies=_has_dispatch, rule=sound_fit)
def dispatch_sound(run: RunView) -> list[Violation]:
    cases = run.config.lora_cases
    out: list[Violation] = []
    for sv in run.judged_sweeps:
        failures = []
        # A sweep's thousands of decisions are a few distinct descriptors:
        # whether something runs each is asked once per descriptor.
        missing: dict[int, str | None] = {}
        case_of: dict[int, int] = {}
        for b, d, _ in sv.disputed():
            # The batch's LoRA case, looked up once per count.
            case = case_of.get(b.num_active_loras)
            if case is None:
                case = case_of[b.num_active_loras] = lora_case(b.num_active_loras, cases)
            if not sound_fit(d, b, case):
                failures.append((b, f"{b.short()} dispatched to eager {d.short()} with fewer tokens than the batch"
                                 if d.cg_mode is N else
                                 f"{b.short()} dispatched to incompatible {d.short()}: {incompat_reason(d, b, cases)}"))
                continue
            if d.cg_mode is N or sv.captured is None:
                continue  # nothing captured: BEFORE-CAPTURE judges it
            why = missing.get(id(d), "")
            if why == "":
                why = missing[id(d)] = sv.not_run(d)
            if why is not None:
                failures.append((b, f"{b.short()} dispatched to {why}"))
        out += sweep_violations("DISPATCH-SOUND", sv, failures)
    return group(out)


def _choices(sv) -> dict:
    """Batch -> what a correct dispatcher may return for it, read off the view's fits."""
    return {b: fit.choices for b, _, fit in sv.disputed()}


def priority_ok(d: BatchDescriptor, full_fits: bool) -> bool:
    """Whether dispatching to ``d`` keeps FULL first: FULL, or no captured
    FULL graph fits the batch (``full_fits``; export-test carries this rule
    as written)."""
    return d.cg_mode is F or not full_fits


@declare("DISPATCH-PRIORITY", "if a captured FULL descriptor fits the batch, dispatch returns FULL",
         family="dispatch", applies=_has_captured_dispatch, rule=priority_ok)
def dispatch_priority(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    for sv in run.judged_captured:
        failures = []
        fulls: dict = {}
        for b, d, fit in sv.disputed():
            full = fit.by_mode.get(F)
            if not priority_ok(d, bool(full)):
                fulls[b] = (sv.fitting(b, fit, F), fit.choices)
                failures.append((b, f"{b.short()} dispatched to {d.cg_mode.value} {d.short()} although the captured FULL "
                                    f"{min(full[1], key=desc_sort_key).short()} fits it (expected FULL over PIECEWISE over NONE)"))
        out += sweep_violations("DISPATCH-PRIORITY", sv, failures,
                                lambda b, sv=sv, fulls=fulls: _fit_facts(run, sv.step, b, fulls[b][0]),
                                lambda b, fulls=fulls: fulls[b][1])
    return group(out)


def _fit_facts(run: RunView, step: int | None, b, fitting: Iterable[BatchDescriptor]) -> tuple:
    """Whether the manager's own candidate list for the batch held one of the
    graphs that fit it (None: the manager records no candidate lists)."""
    held = [candidates_hold(run, step, b, c) for c in sorted(fitting, key=desc_sort_key)]
    listed = None if any(h is None for h in held) else any(held)
    return (("fit_in_candidates", listed),)


def complete_ok(d: BatchDescriptor, any_fits: bool) -> bool:
    """Whether dispatching to ``d`` leaves no captured graph unused that could
    run the batch: a graph, or nothing captured fits it (``any_fits``;
    export-test carries this rule as written)."""
    return d.cg_mode is not N or not any_fits


@declare("DISPATCH-COMPLETE", "if any captured descriptor fits the batch, dispatch does not return NONE",
         family="dispatch", applies=_has_captured_dispatch, rule=complete_ok)
def dispatch_complete(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    for sv in run.judged_captured:
        failures = []
        eager: dict = {}
        for b, d, fit in sv.disputed():
            if not complete_ok(d, bool(fit.choices)):
                fits = sv.fitting(b, fit)
                eager[b] = (fits, fit.choices)
                best = min(fit.choices, key=desc_sort_key).short()
                failures.append((b, f"{b.short()} ran eagerly ({d.short()}) although "
                                    + (f"{len(fits)} captured descriptor(s) fit it, e.g. {best}" if sv.dispatch is not None
                                       else f"the captured {best} fits it")))
        out += sweep_violations("DISPATCH-COMPLETE", sv, failures,
                                lambda b, sv=sv, eager=eager: _fit_facts(run, sv.step, b, eager[b][0]),
                                lambda b, eager=eager: eager[b][1])
    return group(out)


@declare("DISPATCH-MINIMAL", "among fitting captured descriptors of the chosen mode, dispatch pads least",
         family="dispatch", applies=_has_captured_dispatch)
def dispatch_minimal(run: RunView) -> list[Violation]:
    cases = run.config.lora_cases
    out: list[Violation] = []
    for sv in run.judged_captured:
        failures = []
        choices: dict = {}
        for b, d, fit in sv.disputed():
            same = fit.by_mode.get(d.cg_mode) if d.cg_mode is not N else None
            if same and padding_key(d, b) > same[0] and compatible(d, b, cases):
                choices[b] = fit.choices
                failures.append((b, f"{b.short()} dispatched to {d.short()} padding (tokens, reqs) = {padding_key(d, b)}; "
                                    f"captured {min(same[1], key=desc_sort_key).short()} pads only {same[0]}"))
        out += sweep_violations("DISPATCH-MINIMAL", sv, failures, expected=lambda b, choices=choices: choices[b])
    return group(out)


def _applies_roundtrip(run: RunView) -> bool:
    return any(sv.exact() for sv in run.judged_captured)


def roundtrip_ok(d: BatchDescriptor, b, target: BatchDescriptor, cases, choices) -> bool:
    """Whether dispatching ``b``, which has exactly the shape of the captured
    ``target``, to ``d`` is right (export-test carries this rule as written)."""
    rank, want = RUNTIME_RANK[d.cg_mode], RUNTIME_RANK[target.cg_mode]
    # Higher priority may pad requests (a FULL graph always fixes num_reqs)
    # but no tokens; the same priority must pad no more than the exact one.
    # The oracle's own choice is always right (a FULL graph that pads the
    # tokens of a batch which has an exact PIECEWISE graph: DISPATCH-PRIORITY
    # asks for it, and a design whose FULL and PIECEWISE graphs have sizes of
    # their own, vllm-0.34's varlen decode grid, meets it).
    return d in choices or (d.cg_mode != N and compatible(d, b, cases) and (
        (rank > want and d.num_tokens == b.num_tokens)
        or (rank == want and padding_key(d, b) <= padding_key(target, b))
    ))


@declare("DISPATCH-ROUNDTRIP", "a batch exactly the shape of a captured descriptor dispatches to it "
         "(or to one of higher priority that pads no more)", family="dispatch", applies=_applies_roundtrip,
         rule=roundtrip_ok)
def dispatch_roundtrip(run: RunView) -> list[Violation]:
    cases = run.config.lora_cases
    out: list[Violation] = []
    for sv in run.judged_captured:
        failures = []
        choices: dict = {}
        exact: dict = {}
        for b, d, fit in sv.exact():
            target = max(fit.exact, key=lambda c: RUNTIME_RANK[c.cg_mode])
            if not roundtrip_ok(d, b, target, cases, fit.choices):
                choices[b] = fit.choices
                exact[b] = target
                failures.append((b, f"{b.short()} has exactly the shape of captured {target.short()} but dispatched to "
                                    f"{d.short()}" + (f" (pads {padding_key(d, b)})" if d.cg_mode != N else "")))
        out += sweep_violations("DISPATCH-ROUNDTRIP", sv, failures,
                                lambda b, exact=exact: (("exact", exact[b].to_json()),),
                                lambda b, choices=choices: choices[b])
    return group(out)


def _applies_before_capture(run: RunView) -> bool:
    return bool(run.of(CaptureDone)) or any(sv.captured is None for sv in run.judged_sweeps)


def capture_flag_problem(ok: bool, captured_flag: bool) -> str | None:
    """What is wrong with the captured flag a capture that finished (``ok``)
    or not left (None: nothing; export-test carries this rule as written)."""
    if ok and not captured_flag:
        return "capture finished but the manager is not marked captured (every dispatch will run eagerly)"
    if not ok and captured_flag:
        return "capture did not finish but the manager says it is captured"
    return None


@declare("BEFORE-CAPTURE", "dispatch before capture (or after release) returns NONE", family="dispatch",
         applies=_applies_before_capture, rule=capture_flag_problem)
def before_capture(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    for e in run.of(CaptureDone):
        problem = capture_flag_problem(e.ok, e.captured_flag)
        if problem is not None:
            out.append(Violation("BEFORE-CAPTURE", problem, e.step))
    for sv in run.judged_sweeps:
        if sv.captured is not None:
            continue
        when = sv.uncaptured_when()
        failures = [(b, f"{b.short()} dispatched {when} returned {d.short()} (expected NONE; manager captured_flag="
                        f"{sv.sweep.captured_flag})") for b, d, _ in sv.disputed() if d.cg_mode != N]
        out += sweep_violations("BEFORE-CAPTURE", sv, failures, expected=lambda b: ())
    return group(out)


def sole_choice(choices: Iterable[BatchDescriptor]) -> BatchDescriptor | None:
    """The one graph dispatch must pick for a batch whose right choices are
    ``choices`` (``dispatch_choices``), where there is just one: the graph
    that batch makes useful; None where several tie or nothing fits
    (export-test carries this rule as written)."""
    choices = tuple(choices)
    return choices[0] if len(choices) == 1 else None


def useless_descriptors(cfg: ManagerConfig, captured: Iterable[BatchDescriptor],
                        useful: Iterable[BatchDescriptor] = ()) -> dict[BatchDescriptor, str]:
    """Captured descriptors that are never the unique dispatch choice for a
    batch the scheduler can produce, each with an example of where its
    batches go instead, by mode and then ``desc_sort_key`` (the same order in
    every process: ``captured`` is often a set).  ``useful``: descriptors
    already known to be some batch's unique choice (from a dispatch sweep)."""
    return dict(_useless(cfg, frozenset(captured), frozenset(useful)))


# A shrinking campaign judges one config's captures over and over: the verdict is a function of these values.
@lru_cache(maxsize=256)
def _useless(cfg: ManagerConfig, captured: frozenset[BatchDescriptor],
             useful: frozenset[BatchDescriptor]) -> tuple[tuple[BatchDescriptor, str], ...]:
    captured = sorted(captured, key=lambda d: (d.cg_mode.value, desc_sort_key(d)))
    cases = cfg.lora_cases
    buckets: dict[tuple[int, int], list[BatchDescriptor]] = {}
    for d in captured:
        buckets.setdefault((d.num_active_loras, d.num_ubatches), []).append(d)
    decode = scheduler.decode_shapes(cfg)
    useful = set(useful)
    example: dict[BatchDescriptor, str] = {}
    for (lora, ub), bucket in buckets.items():
        if lora not in cases:
            continue  # INIT-TOTAL reports a descriptor for a non-existent LoRA case
        pending = set(bucket) - useful
        if not pending:
            continue
        # best_fits gives each batch's dispatch_choices at once (brute force per batch was most of a big config's check).
        useful.update(map(sole_choice, map(attrgetter("choices"),
                                          best_fits(scheduler.producible_batches(cfg, decode, lora, ub), bucket, cases))))
        useful.discard(None)
        pending -= useful
        for d in sorted(pending, key=lambda x: repr(x)):
            batches = scheduler.producible_batches(cfg, scheduler.probe_shapes(cfg, d), lora, ub)
            for b, fit in zip(batches, best_fits(batches, bucket, cases)):
                choices = fit.choices
                one = sole_choice(choices)
                if one is not None:
                    useful.add(one)
                    if one == d:
                        break
                if d not in example and choices and compatible(d, b, cases):
                    example[d] = f"e.g. {b.short()} goes to {shorts(choices, 3)}"
    return tuple((d, example.get(d, "no producible batch fits it")) for d in captured if d not in useful)


def _has_finished_capture(run: RunView) -> bool:
    return any(c.descs for c in run.finished_captures)


@declare("CAPTURE-USEFUL", "every captured descriptor is the unique dispatch choice for some batch the scheduler "
         "can produce", family="dispatch", applies=_has_finished_capture, rule=sole_choice)
def capture_useful(run: RunView) -> list[Violation]:
    cfg = run.config
    out: list[Violation] = []
    judged: set[frozenset] = set()
    for cap in run.finished_captures:
        if not cap.descs or cap.descs in judged:
            continue
        judged.add(cap.descs)
        # Every batch the sweep after this capture asked about is a batch the
        # scheduler can produce: its unique best graph is useful.
        useful = {sole_choice(fit.choices) for sv in run.sweeps if sv.captured is cap for fit in sv.fits()}
        useful.discard(None)
        captured = [c.to_json() for c in sorted(cap.descs, key=desc_sort_key)]
        for d, why in useless_descriptors(cfg, cap.descs, useful).items():
            out.append(Violation(
                "CAPTURE-USEFUL",
                f"captured {d.short()} is never the unique dispatch choice for a batch the scheduler can produce "
                f"(up to {cfg.max_capture_size} tokens, {cfg.max_num_reqs} requests): {why}",
                cap.step, (("graph", d.to_json()), ("captured", captured)),
            ))
    return group(out)


def _step_and_sweep(run: RunView):
    """(dispatch step, the sweep taken after the capture it dispatched under)."""
    for v in run.captured_dispatches:
        sweep = next((sv for sv in run.captured_sweeps if sv.captured is v.captured), None)
        if sweep is not None:
            yield v, sweep


def _has_swept_dispatch(run: RunView) -> bool:
    return any(True for _ in _step_and_sweep(run))


def _question(b) -> tuple:
    """What any runner may pass dispatch about a batch.  The longest request
    counts with a prefill too: vLLM 0.20-0.27's get_uniform_token_count reads
    it for every batch (a uniform prefill then asks for a decode graph), so two
    splits of the same counts can be different questions there."""
    return (b.num_reqs, b.num_tokens, b.max_query_len, b.uniform_token_count, b.has_prefill,
            b.num_active_loras, b.num_ubatches)


@declare("DISPATCH-STABLE", "between a capture and the next release, the same batch always dispatches to the same "
         "graph", family="dispatch", applies=_has_swept_dispatch)
def dispatch_stable(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    answers: dict[int, dict[tuple, BatchDescriptor]] = {}
    steps = list(_step_and_sweep(run))
    # Only the swept batches of a dispatched batch's token count can be its question.
    tokens = {v.dispatch.batch.num_tokens for v, _ in steps}
    for v, sweep in steps:
        b, d = v.dispatch.batch, v.dispatch.desc
        said = answers.get(id(sweep))
        if said is None:
            sw = sweep.sweep
            asked = compress(zip(sw.batches, sw.descs),
                             map(tokens.__contains__, map(attrgetter("num_tokens"), sw.batches)))
            said = answers[id(sweep)] = {_question(s): x for s, x in asked}
        swept = said.get(_question(b))
        if swept is not None and swept != d:
            out.append(Violation(
                "DISPATCH-STABLE",
                f"{b.short()} dispatched to {d.short()} at step {v.dispatch.step}, but to {swept.short()} in the "
                f"dispatch sweep after the capture at step {sweep.step} (dispatch must be a function of the batch "
                "and the captured graphs)",
                v.dispatch.step,
            ))
    return group(out)
