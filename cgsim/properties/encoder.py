"""The encoder CUDA-graph properties (docs/encoder.md): pure functions of
an ``EncoderRunView`` (an encoder scenario and its trace) judged against
``cgsim.spec.encoder`` under the scenario's design.  They never look at a
target: the reference manager, its mutants and vLLM's manager are judged
alike."""

from __future__ import annotations

from functools import cached_property
from typing import Iterable

from cgsim.encoder.trace import EncCapture, EncClear, EncError, EncGroup, EncOutput, EncoderTrace
from cgsim.encoder.values import EncoderScenario
from cgsim.properties.registry import ENCODER_FAMILIES, Property, Verdict, Violation, declare, registered
from cgsim.spec.encoder import (EncoderConfigRefused, EncoderDesign, EncoderPlan, Group, design, fits, plan,
                                smallest_fitting)

__all__ = ["EncoderRunView", "ENCODER_PROPERTIES", "check_encoder_scenario"]


class EncoderRunView:
    def __init__(self, scenario: EncoderScenario, trace: EncoderTrace) -> None:
        self.scenario, self.trace = scenario, trace
        self.design: EncoderDesign = design(scenario.ruleset)

    @cached_property
    def expected(self) -> EncoderPlan | None:
        try:
            return plan(self.scenario.config, self.scenario.ruleset)
        except EncoderConfigRefused:
            return None

    @cached_property
    def captured_at(self) -> dict[int, tuple[int, ...]]:
        """Per step, the budgets captured and not cleared when it ran (empty: none)."""
        out, now = {}, ()
        events = {e.step: e for e in self.trace.events if isinstance(e, (EncCapture, EncClear))}
        for i in range(len(self.scenario.steps)):
            out[i] = now
            e = events.get(i)
            if isinstance(e, EncCapture):
                now = tuple(sorted(set(e.budgets)))
            elif isinstance(e, EncClear):
                now = ()
        return out

    def groups(self) -> list[EncGroup]:
        return self.trace.of(EncGroup)

    @cached_property
    def best_fits(self) -> dict[EncGroup, int | None]:
        """Per group, the smallest budget captured when it ran that it fits (None: none; ENC-MINIMAL and
        ENC-COMPLETE both read it)."""
        return {g: smallest_fitting(_group(g), self.captured_at[g.step], self.expected,
                                    self.design) for g in self.groups()}

    def items(self, step: int):
        return self.scenario.steps[step].items

    def has(self, kind: type) -> bool:
        return any(isinstance(e, kind) for e in self.trace.events)


def _v(pid: str, message: str, step: int | None = None, **facts) -> Violation:
    return Violation(pid, message, step, tuple(sorted(facts.items())))


def _has_plan(run: EncoderRunView) -> bool:
    return run.trace.plan is not None and run.expected is not None


def _has_capture(run: EncoderRunView) -> bool:
    return run.has(EncCapture) and run.expected is not None


def _has_replays(run: EncoderRunView) -> bool:
    return any(g.budget is not None for g in run.groups()) and run.expected is not None


def _has_groups(run: EncoderRunView) -> bool:
    return bool(run.groups()) and run.expected is not None


def _has_outputs(run: EncoderRunView) -> bool:
    return run.has(EncOutput)


@declare("ENC-PLAN", "the manager plans the budgets, items per graph and frames per batch the design gives the config",
         family="encoder", applies=_has_plan)
def enc_plan(run: EncoderRunView) -> list[Violation]:
    got, want = run.trace.plan, run.expected
    out = []
    if tuple(sorted(set(got.budgets))) != want.budgets:
        out.append(_v("ENC-PLAN", f"budgets {list(got.budgets)}, expected {list(want.budgets)}",
                      got=list(got.budgets), expected=list(want.budgets)))
    if got.max_batch_size != want.max_batch_size:
        out.append(_v("ENC-PLAN", f"max_batch_size {got.max_batch_size}, expected {want.max_batch_size}",
                      got=got.max_batch_size, expected=want.max_batch_size))
    if got.max_frames_per_batch != want.max_frames_per_batch:
        out.append(_v("ENC-PLAN", f"max_frames_per_batch {got.max_frames_per_batch}, expected {want.max_frames_per_batch}",
                      got=got.max_frames_per_batch, expected=want.max_frames_per_batch))
    return out


@declare("ENC-CAPTURED", "a capture captures one graph for every planned budget and no other", family="encoder",
         applies=_has_capture)
def enc_captured(run: EncoderRunView) -> list[Violation]:
    out = []
    for e in run.trace.of(EncCapture):
        if tuple(sorted(set(e.budgets))) != run.expected.budgets or not e.captured:
            out.append(_v("ENC-CAPTURED", f"{_rank(e)}captured budgets {sorted(set(e.budgets))} (is_captured {e.captured}), "
                          f"expected {list(run.expected.budgets)}", e.step, got=sorted(set(e.budgets)),
                          expected=list(run.expected.budgets)))
    return out


@declare("ENC-CAPTURE-ONCE", "a capture captures each budget once", family="encoder", applies=_has_capture)
def enc_capture_once(run: EncoderRunView) -> list[Violation]:
    out = []
    for e in run.trace.of(EncCapture):
        twice = sorted({b for b in e.budgets if e.budgets.count(b) > 1})
        if twice:
            out.append(_v("ENC-CAPTURE-ONCE", f"{_rank(e)}budgets {twice} captured more than once", e.step, budgets=twice))
    return out


def _rank(e: EncCapture) -> str:
    return f"rank {e.rank}: " if e.rank else ""


def _group(g: EncGroup) -> Group:
    return Group(g.tokens, len(g.ids), g.frames)


@declare("ENC-FIT", "a replayed group fits its graph: tokens, items and frames within what the graph was captured for",
         family="encoder", applies=_has_replays)
def enc_fit(run: EncoderRunView) -> list[Violation]:
    out = []
    for g in run.groups():
        if g.budget is not None and not fits(_group(g), g.budget, run.expected, run.design):
            out.append(_v("ENC-FIT", f"items {list(g.ids)} ({g.tokens} tokens, {len(g.ids)} items, {g.frames} frames) "
                          f"replayed the graph of budget {g.budget} (max {run.expected.max_batch_size} items, "
                          f"{run.expected.frame_slots(g.budget, run.design)} frames)", g.step, budget=g.budget,
                          tokens=g.tokens, items=len(g.ids), frames=g.frames))
    return out


@declare("ENC-MINIMAL", "a replayed group replays the smallest captured budget it fits", family="encoder",
         applies=_has_replays)
def enc_minimal(run: EncoderRunView) -> list[Violation]:
    out = []
    for g in run.groups():
        if g.budget is None:
            continue
        best = run.best_fits[g]
        if best is not None and best != g.budget:
            out.append(_v("ENC-MINIMAL", f"items {list(g.ids)} ({g.tokens} tokens) replayed budget {g.budget}, "
                          f"the smallest that fits is {best}", g.step, budget=g.budget, expected=best))
    return out


@declare("ENC-COMPLETE", "a group the manager runs eagerly fits no captured graph", family="encoder",
         applies=_has_groups)
def enc_complete(run: EncoderRunView) -> list[Violation]:
    out = []
    for g in run.groups():
        if g.budget is not None or g.site != "manager":
            continue
        best = run.best_fits[g]
        if best is not None:
            out.append(_v("ENC-COMPLETE", f"items {list(g.ids)} ({g.tokens} tokens, {len(g.ids)} items, {g.frames} "
                          f"frames) ran eagerly; the graph of budget {best} fits them", g.step, expected=best))
    return out


@declare("ENC-COVER", "every item of an encoder batch is encoded exactly once", family="encoder",
         applies=_has_groups)
def enc_cover(run: EncoderRunView) -> list[Violation]:
    out = []
    raised = {e.step for e in run.trace.of(EncError)}  # a step that raised covers what it got to (ENC-NO-CRASH)
    steps = sorted({g.step for g in run.groups()} - raised)
    for step in steps:
        seen = [i for g in run.groups() if g.step == step for i in g.ids]
        n = len(run.items(step))
        if sorted(seen) != list(range(n)):
            out.append(_v("ENC-COVER", f"items encoded {sorted(seen)} for a batch of {n}", step, encoded=sorted(seen)))
    return out


@declare("ENC-ONE-REPLAY", "under a single-replay design, a captured manager encodes its batch (each rank its shard) in "
         "one group", family="encoder", applies=lambda run: run.design.packing == "single" and _has_groups(run))
def enc_one_replay(run: EncoderRunView) -> list[Violation]:
    out = []
    for step, rank in sorted({(g.step, g.rank) for g in run.groups()}):
        groups = [g for g in run.groups() if g.step == step and g.rank == rank and g.site == "manager"]
        if len(groups) > 1:
            where = f"rank {rank}: " if rank else ""
            out.append(_v("ENC-ONE-REPLAY", f"{where}{len(groups)} groups: {[list(g.ids) for g in groups]}", step,
                          groups=len(groups)))
    return out


@declare("ENC-EQUAL", "each item's output equals the item encoded alone, eagerly (padding and earlier replays never show)",
         family="encoder", applies=_has_outputs)
def enc_equal(run: EncoderRunView) -> list[Violation]:
    return [_v("ENC-EQUAL", f"item {o.item}: {o.detail}", o.step, item=o.item)
            for o in run.trace.of(EncOutput) if o.when == "step" and not o.equal]


@declare("ENC-STABLE", "an output handed back stays what it was through later replays", family="encoder",
         applies=_has_outputs)
def enc_stable(run: EncoderRunView) -> list[Violation]:
    right = {(o.step, o.item) for o in run.trace.of(EncOutput) if o.when == "step" and o.equal}
    return [_v("ENC-STABLE", f"item {o.item}'s output changed after its step: {o.detail}", o.step, item=o.item)
            for o in run.trace.of(EncOutput) if o.when == "end" and not o.equal and (o.step, o.item) in right]


@declare("ENC-UNCAPTURED", "nothing replays before the first capture or after a clear, and a clear leaves no graph",
         family="encoder", applies=lambda run: run.has(EncClear) or bool(run.groups()))
def enc_uncaptured(run: EncoderRunView) -> list[Violation]:
    out = [_v("ENC-UNCAPTURED", "is_captured() is True after clear()", e.step) for e in run.trace.of(EncClear)
           if e.captured]
    out += [_v("ENC-UNCAPTURED", f"items {list(g.ids)} replayed budget {g.budget} with no graph captured", g.step)
            for g in run.groups() if g.budget is not None and not run.captured_at[g.step]]
    return out


@declare("ENC-NO-CRASH", "the manager never raises while capturing, encoding or clearing", family="encoder",
         applies=lambda run: True, kind="crash")
def enc_no_crash(run: EncoderRunView) -> list[Violation]:
    return [_v("ENC-NO-CRASH", f"{e.phase} raised {e.type}: {e.message} (at {e.where})", e.step, type=e.type,
               where=e.where) for e in run.trace.of(EncError)]


ENCODER_PROPERTIES: dict[str, Property] = {pid: p for pid, p in registered().items() if p.family in ENCODER_FAMILIES}


def check_encoder_scenario(scenario: EncoderScenario, trace: EncoderTrace, only: Iterable[str] | None = None) -> Verdict:
    """Judge one encoder run (a refused config: nothing to judge)."""
    if trace.refused is not None:
        return Verdict((), ())
    run = EncoderRunView(scenario, trace)
    chosen = [p for pid, p in ENCODER_PROPERTIES.items() if only is None or pid in set(only)]
    violations, checked = [], []
    for prop in chosen:
        if prop.applies(run):
            checked.append(prop.id)
            violations.extend(prop.check(run))
    return Verdict(tuple(violations), tuple(checked))
