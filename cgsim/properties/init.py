"""Properties of what candidate init builds and how the mode resolves:
CAND-ORDER, CAND-BOUNDS, DECODE-LENGTHS, INIT-TOTAL, MODE-RESOLUTION."""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

from cgsim.descriptors import BatchDescriptor
from cgsim.modes import CUDAGraphMode, ModeResolutionError, required_support
from cgsim.properties.registry import Violation, declare
from cgsim.properties.view import RunView, group, list_short, mode_name, shorts, shown
from cgsim.spec import expected_capture_descs, resolved_mode
from cgsim.trace import Candidates

__all__ = ["capture_list_diff", "descriptor_problems", "decode_length_gaps", "full_decode_lengths"]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


def _has_candidates(run: RunView) -> bool:
    return bool(run.of(Candidates))


def _has_initial_candidates(run: RunView) -> bool:
    return any(c.phase == "initial" for c in run.of(Candidates))


def _by_mode(descs: Iterable[BatchDescriptor]) -> dict[CUDAGraphMode, set[BatchDescriptor]]:
    descs = list(descs)
    return {mode: {d for d in descs if d.cg_mode == mode} for mode in {d.cg_mode for d in descs}}


def capture_list_diff(actual: Iterable[BatchDescriptor], expected: Iterable[BatchDescriptor]) -> dict:
    """Per mode whose descriptors differ (PIECEWISE, FULL, NONE in turn):
    (those ``expected`` holds that ``actual`` lacks, those ``actual`` holds
    that ``expected`` lacks), as sets; empty when they hold the same
    (export-test carries this rule as written)."""
    a, e = _by_mode(actual), _by_mode(expected)
    out = {}
    for mode in (P, F, N):
        got, want = a.get(mode, set()), e.get(mode, set())
        if got != want:
            out[mode] = (want - got, got - want)
    return out


def _diff_by_mode(actual: Iterable[BatchDescriptor],
                  expected: Iterable[BatchDescriptor]) -> tuple[list[str], list[BatchDescriptor]]:
    """The differences per mode in words, and the descriptors those words name."""
    parts = []
    named: list[BatchDescriptor] = []
    for mode, (missing, extra) in capture_list_diff(actual, expected).items():
        text = f"{mode.value}:"
        if missing:
            text += f" missing {shorts(missing)}"
            named += shown(missing)
        if extra:
            text += f" unexpected {shorts(extra)}"
            named += shown(extra)
        parts.append(text)
    return parts, named


def _graphs(descs: Iterable[BatchDescriptor]) -> tuple[str, list[dict]]:
    """The fact naming the graphs a violation names (the classifiers of documented defects read it)."""
    return "graphs", [d.to_json() for d in descs]


def _not_breakable_hint(run: RunView, descs: Sequence[BatchDescriptor]) -> str:
    cfg = run.config
    if not cfg.breakable:
        return ""
    try:
        as_if = expected_capture_descs(cfg.with_(breakable=False, compiled_piecewise=True), run.scenario.ruleset)
    except (ModeResolutionError, ValueError):
        return ""
    got = {d for d in descs if d.cg_mode == P}
    if got and got == set(as_if.get(P, ())):
        return (
            " (the PIECEWISE descriptors are the ones a non-breakable manager builds: candidate init "
            "ran before the breakable flag was final, the PR 48822 ordering bug)"
        )
    return ""


@declare("CAND-ORDER", "candidate init run again on the finished manager gives the same descriptors and candidates, "
         "and they match the spec", family="init", applies=_has_candidates, rule=capture_list_diff)
def cand_order(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    cands = run.of(Candidates)
    initial = [c for c in cands if c.phase == "initial"]
    recomputed = [c for c in cands if c.phase == "recomputed"]
    for r in recomputed:
        i = run.initial_candidates(r.step)
        if i is None:
            continue
        diff, named = _diff_by_mode(r.capture_descs, i.capture_descs)
        if diff:
            out.append(Violation(
                "CAND-ORDER",
                "candidate init run again on the finished manager gives other capture descriptors "
                "(recomputed vs initial): " + "; ".join(diff),
                r.step, (_graphs(named),),
            ))
        ic, rc = dict(i.candidates), dict(r.candidates)
        if ic != rc:
            keys = sorted(set(ic) | set(rc))
            bad = [k for k in keys if ic.get(k) != rc.get(k)]
            lines = [
                f"(num_tokens={k[0]}, lora={k[1]}): initial {list_short(ic.get(k))} vs recomputed {list_short(rc.get(k))}"
                for k in bad[:3]
            ]
            # list_short names the first four of each list
            named = [d for k in bad[:3] for lst in (ic.get(k), rc.get(k)) for d in (lst or ())[:4]]
            out.append(Violation(
                "CAND-ORDER",
                f"candidate lists differ after recomputing on the finished manager for {len(bad)} key(s): "
                + "; ".join(lines),
                r.step, (_graphs(named),),
            ))
    expected = run.spec_descs
    if expected is not None:
        want = [d for ds in expected.values() for d in ds]
        reported: set[tuple] = set()
        for i in initial:
            diff, named = _diff_by_mode(i.capture_descs, want)
            if not diff or tuple(diff) in reported:
                continue
            reported.add(tuple(diff))
            out.append(Violation(
                "CAND-ORDER",
                f"capture descriptors differ from the spec (ruleset {run.ruleset.name}, resolved mode "
                f"{mode_name(run.spec_mode)}): " + "; ".join(diff) + _not_breakable_hint(run, i.capture_descs),
                i.step, (_graphs(named), ("spec_mode", run.spec_mode.value if run.spec_mode is not None else None)),
            ))
    return group(out)


@declare("CAND-BOUNDS", "every descriptor has 0 < num_tokens <= max capture size, num_reqs <= min(num_tokens, "
         "max_num_reqs), FULL uniform decode num_tokens = num_reqs x uniform_token_count, no duplicates",
         family="init", applies=_has_initial_candidates)
def cand_bounds(run: RunView) -> list[Violation]:
    cfg = run.config
    max_size = cfg.max_capture_size
    out: list[Violation] = []
    for c in run.of(Candidates):
        if c.phase != "initial":
            continue
        counts = Counter(c.capture_descs)
        for d, n in counts.items():
            if n > 1:
                out.append(Violation("CAND-BOUNDS", f"{d.short()} appears {n} times in the {d.cg_mode.value} capture list", c.step))
        for d in counts:
            if not 0 < d.num_tokens <= max_size:
                out.append(Violation(
                    "CAND-BOUNDS", f"{d.short()}: num_tokens {d.num_tokens} outside 1..{max_size} (max capture size)", c.step))
            if d.num_reqs is not None and d.num_reqs > min(d.num_tokens, cfg.max_num_reqs):
                out.append(Violation(
                    "CAND-BOUNDS",
                    f"{d.short()}: num_reqs {d.num_reqs} > min(num_tokens {d.num_tokens}, max_num_reqs {cfg.max_num_reqs})",
                    c.step,
                ))
            if d.cg_mode == F and d.uniform_token_count is not None:
                if d.num_reqs is None or d.num_tokens != d.num_reqs * d.uniform_token_count:
                    out.append(Violation(
                        "CAND-BOUNDS",
                        f"{d.short()}: FULL uniform decode descriptor needs num_tokens = num_reqs x uniform_token_count "
                        f"= {d.num_reqs} x {d.uniform_token_count}, has {d.num_tokens}",
                        c.step,
                    ))
        capset = set(c.capture_descs)
        for (n, lora), descs in c.candidates:
            for d in descs:
                if d not in capset:
                    problem = "is not a capture descriptor"
                elif d.num_tokens < n:
                    problem = f"has fewer tokens than the key ({d.num_tokens} < {n})"
                elif d.num_active_loras != lora:
                    problem = f"is for LoRA case {d.num_active_loras}, not {lora}"
                else:
                    continue
                out.append(Violation(
                    "CAND-BOUNDS", f"candidate list (num_tokens={n}, lora={lora}) holds {d.short()}, which {problem}", c.step))
    return group(out)


def _decode_routine(run: RunView) -> bool:
    mode = run.trace.resolved_mode or run.spec_mode
    return mode is not None and mode.separate_routine() and mode.decode_mode() == F and not run.config.varlen_decode


def _applies_decode_lengths(run: RunView) -> bool:
    return _decode_routine(run) and (any(s.ok for s in run.sessions) or _has_initial_candidates(run))


def full_decode_lengths(descs: Iterable[BatchDescriptor]) -> list[int]:
    """The decode query lengths the FULL decode graphs of ``descs`` are for, sorted."""
    return sorted({d.uniform_token_count for d in descs if d.cg_mode == F and d.uniform_token_count is not None})


def decode_length_gaps(descs: Iterable[BatchDescriptor], scheduled: Iterable[int],
                       feasible: Iterable[int]) -> tuple[list[int], list[int]]:
    """Of the FULL decode graphs of ``descs``: the query lengths they are for
    that the scheduler never produces (not ``scheduled``), and the
    ``feasible`` lengths (some capture size has room for them) none is for;
    each sorted (export-test carries this rule as written)."""
    lens = set(full_decode_lengths(descs))
    return sorted(lens - set(scheduled)), sorted(set(feasible) - lens)


@declare("DECODE-LENGTHS", "FULL decode graphs exist for exactly the decode query lengths the scheduler produces",
         family="init", applies=_applies_decode_lengths, rule=decode_length_gaps)
def decode_lengths(run: RunView) -> list[Violation]:
    if not _decode_routine(run):
        return []
    cfg = run.config
    scheduler = set(cfg.scheduler_decode_query_lens())
    spec = run.spec_descs
    # Lengths for which some capture size gives a FULL decode graph within the bounds.
    feasible = ({d.uniform_token_count for d in spec.get(F, ()) if d.uniform_token_count is not None}
                if spec is not None else scheduler)
    sources: list[tuple[int | None, str, list[BatchDescriptor]]] = []
    for s in run.sessions:
        if s.ok:
            sources.append((s.step, "stored FULL graphs", s.stored))
    if not sources:
        for c in run.of(Candidates):
            if c.phase == "initial":
                sources.append((c.step, "FULL capture descriptors", list(c.capture_descs)))
    out: list[Violation] = []
    for step, what, descs in sources:
        extra, missing = decode_length_gaps(descs, scheduler, feasible)
        sched_text = f"the scheduler produces {sorted(scheduler)}"
        if cfg.spec_schedule is not None:
            sched_text += (f" (dynamic schedule {[list(e) for e in cfg.spec_schedule]} clamped to "
                           f"{cfg.num_speculative_tokens} spec tokens, {cfg.max_num_reqs} reqs)")
        if extra:
            ex = [d for d in descs if d.cg_mode == F and d.uniform_token_count in extra]
            out.append(Violation(
                "DECODE-LENGTHS",
                f"{what} include decode query length(s) {sorted(extra)} the scheduler never produces, e.g. {ex[0].short()}; {sched_text}",
                step,
            ))
        if missing:
            out.append(Violation(
                "DECODE-LENGTHS",
                f"{what} have no FULL decode graph for query length(s) {sorted(missing)}; {sched_text}, graphs exist for {full_decode_lengths(descs)}",
                step,
            ))
    return group(out)


def _applies_init_total(run: RunView) -> bool:
    t = run.trace
    return bool(t.of(Candidates)) or any(run.is_build_error(e) for e in run.errors) or t.resolved_mode is not None


def descriptor_problems(d: BatchDescriptor, decode_query_len: int, lora_cases: Sequence[int],
                        num_ubatches: int) -> list[str]:
    """What is insane about capture descriptor ``d`` under a config of the
    largest decode query length, LoRA cases and micro-batch count given
    (empty: nothing; export-test carries this rule as written)."""
    problems = []
    if d.num_tokens < 1:
        problems.append(f"num_tokens {d.num_tokens} < 1")
    if d.num_reqs is not None and d.num_reqs < 1:
        problems.append(f"num_reqs {d.num_reqs} < 1")
    if d.uniform_token_count is not None and not 1 <= d.uniform_token_count <= decode_query_len:
        problems.append(f"uniform_token_count {d.uniform_token_count} outside 1..{decode_query_len} "
                        "(largest decode query length)")
    if d.max_query_len is not None and d.max_query_len < 1:
        problems.append(f"max_query_len {d.max_query_len} < 1")
    if d.num_active_loras not in lora_cases:
        problems.append(f"num_active_loras {d.num_active_loras} is not a LoRA case {list(lora_cases)}")
    if d.num_ubatches not in (1, num_ubatches):
        problems.append(f"num_ubatches {d.num_ubatches} is neither 1 nor the configured {num_ubatches}")
    if d.cg_mode == N:
        problems.append("a NONE descriptor in the capture list")
    return problems


@declare("INIT-TOTAL", "building the manager succeeds for every valid config and every descriptor is sane",
         family="init", applies=_applies_init_total, rule=descriptor_problems)
def init_total(run: RunView) -> list[Violation]:
    cfg = run.config
    out: list[Violation] = []
    rejected = run.spec_mode is None
    for e in run.errors:
        if not run.is_build_error(e) or e.error == "illegal-op":
            continue
        if rejected and e.error == "crash":
            continue  # the config cannot run; a clear error is the right answer
        out.append(Violation(
            "INIT-TOTAL",
            f"building the manager failed ({e.error}: {e.exc_type}: {e.message}) for a valid config "
            f"(requested {cfg.mode.value}, support {cfg.attention_support.name}, resolves to {mode_name(run.spec_mode)})"
            if not rejected else
            f"building the manager for a config the spec rejects ended in {e.error}, not a clear error: {e.exc_type}: {e.message}",
            e.step, (("raised", f"{e.exc_type}: {e.message}"), _graphs(())),
        ))
    for c in run.of(Candidates):
        if c.phase != "initial":
            continue
        for d in dict.fromkeys(c.capture_descs):
            problems = descriptor_problems(d, cfg.decode_query_len, cfg.lora_cases, cfg.num_ubatches)
            if problems:
                out.append(Violation("INIT-TOTAL", f"insane descriptor {d.short()}: " + "; ".join(problems), c.step,
                                     (_graphs([d]),)))
    return group(out)


def _applies_mode_resolution(run: RunView) -> bool:
    return run.trace.resolved_mode is not None or any(run.is_build_error(e) for e in run.errors)


@declare("MODE-RESOLUTION", "the resolved mode matches SPEC §2 and needs no more support than declared",
         family="init", applies=_applies_mode_resolution)
def mode_resolution(run: RunView) -> list[Violation]:
    cfg = run.config
    got = run.trace.resolved_mode
    built_failed = any(run.is_build_error(e) for e in run.errors)
    try:
        want: CUDAGraphMode | None = resolved_mode(cfg)
        reason = ""
    except (ModeResolutionError, ValueError) as exc:
        want, reason = None, str(exc)
    asked = run.scenario.config.mode
    requested = cfg.mode.value if asked == cfg.mode else f"{asked.value} (routed to {cfg.mode.value} by ruleset {run.ruleset.name})"
    inputs = (f"requested {requested}, support {cfg.attention_support.name}, q={cfg.decode_query_len}, "
              f"attention_split={cfg.attention_split}, piecewise_available={cfg.piecewise_available}")
    out: list[Violation] = []
    if got is None:
        return out
    # The modes each violation names: the one asked for, the ruleset's route, the target's answer.
    modes = (("requested", asked.value), ("routed", cfg.mode.value), ("resolved", got.value))
    if want is None:
        if not built_failed:
            out.append(Violation(
                "MODE-RESOLUTION", f"{inputs}: the spec rejects this config ({reason}) but the target resolved it to {got.value}",
                None, (*modes, ("spec_rejects", reason))))
        return out
    if got != want:
        out.append(Violation("MODE-RESOLUTION", f"{inputs}: resolved to {got.value}, expected {want.value}",
                             None, (*modes, ("spec_mode", want.value))))
    need = required_support(got, cfg.decode_query_len)
    if need > cfg.attention_support:
        out.append(Violation(
            "MODE-RESOLUTION",
            f"{inputs}: resolved mode {got.value} needs attention support {need.name} > declared {cfg.attention_support.name}",
            None, (*modes, ("needs_support", need.name))))
    return out
