"""Properties of SGLang's design (the ``sglang`` ruleset, ``cgsim.spec.sglang``).

Some state SGLang's rule for a universal property the ruleset replaces
(SGL-CAND-ORDER, SGL-CAND-BOUNDS, SGL-CAPTURE-ORDER, the SGL-DISPATCH-* four,
SGL-CAPTURE-USEFUL); the rest are properties only SGLang's design has:
aligned capture sizes, ranks that agree under DP attention, the graph that
replays being the one dispatch chose, the rows a replay hands back and the
hidden-state mode a graph was captured with.  docs/sglang.md maps the whole
catalogue.  Every check reads the Scenario, the Trace and the spec only.

The batch-size alignment SGL-CAND-ORDER, SGL-CAND-BOUNDS and
SGL-CAPTURE-ALIGNED judge by is the engine's own answer where the trace
records one (``Trace.alignment``: what the target read off sglang's
``get_cuda_graph_batch_size_alignment`` for the launch), else cgsim's copy of
the rule (``spec.sglang.alignment``); the target's tests hold the copy to the
engine's answer, so a drift between them is a test failure, never a silent
wrong judgement.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Iterable, Iterator

from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.properties.registry import Violation, declare
from cgsim.properties.view import Captured, RunView, group, shorts, sweep_violations
from cgsim.spec import desc_sort_key
from cgsim.spec import sglang as rules
from cgsim.spec.scheduler import sweep_token_limit
from cgsim.trace import Candidates, CreateForwardFn, Dispatch, GraphOutput, RankDispatch

__all__ = ["ENGINE", "HIDDEN_MODES"]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
# sglang's CaptureHiddenMode order: what a graph returns covers what a batch needs.
HIDDEN_MODES = ("NULL", "LAST", "FULL")


# The engine whose rulesets judge every property here (SGLang's design).
ENGINE = "sglang"


def _design(run: RunView) -> rules.SglangDesign:
    return rules.design_of(run.ruleset)


def _graphs(run: RunView, captured: Captured) -> rules.Graphs:
    cache = run.__dict__.setdefault("_sglang_graphs", {})
    key = id(captured)
    if key not in cache:
        cache[key] = rules.Graphs.of(captured.descs)
    return cache[key]


class _Alignment:
    """The alignments a run is judged by: the engine's recorded answer, else the spec's copy."""

    def __init__(self, run: RunView):
        recorded = run.trace.alignment
        spec = rules.alignment(run.config)
        if recorded is not None:
            self.decode = recorded.decode
            self.prefill = recorded.prefill if recorded.prefill is not None else spec
            self.source = f"sglang's {recorded.helper.rsplit('.', 1)[-1]}"
            self.recorded = True
        else:
            self.decode = self.prefill = spec
            self.source = "cgsim's copy of sglang's rule"
            self.recorded = False

    def text(self, base: int) -> str:
        return f"the alignment {base} ({self.source})"


def _alignment(run: RunView) -> _Alignment:
    cached = run.__dict__.get("_sglang_alignment")
    if cached is None:
        cached = run.__dict__["_sglang_alignment"] = _Alignment(run)
    return cached


def _initial(run: RunView) -> list[Candidates]:
    return [c for c in run.of(Candidates) if c.phase == "initial"]


def _has_initial(run: RunView) -> bool:
    return bool(_initial(run))


def _runner(d: BatchDescriptor) -> str:
    return "decode" if rules.is_decode_desc(d) else "prefill"


def _why_eager(run: RunView, b) -> str:
    """Which of sglang's rules sends ``b`` to eager (for messages)."""
    cfg = run.config
    if rules.is_decode_batch(cfg, b):
        if cfg.num_ubatches == 2 and b.num_ubatches != 2:
            return "two-batch overlap is on and the scheduler did not split this batch"
        if rules.options(cfg).disable_padding:
            return "padding is disabled and no graph has exactly this key"
        return "more requests than the largest captured bs"
    return ("more tokens than the largest prefill bucket, its bucket more than "
            f"{rules.MAX_PREFILL_PADDING_FACTOR}x its tokens, or more requests than the FULL prefill slots")


# -- where dispatch decisions are --------------------------------------------------


def _captured_dispatches(run: RunView) -> Iterator[tuple[int, Batch, BatchDescriptor, Captured]]:
    for v in run.captured_dispatches:
        yield v.dispatch.step, v.dispatch.batch, v.dispatch.desc, v.captured


def _has_captured_dispatch(run: RunView) -> bool:
    return bool(run.captured_dispatches) or bool(run.captured_sweeps)


def _judge_dispatch(run: RunView, prop: str, judge) -> list[Violation]:
    """Apply ``judge(batch, desc, expected, graphs) -> message | None`` to every
    captured dispatch step and every swept batch (one violation per sweep)."""
    cfg, design = run.config, _design(run)
    out: list[Violation] = []
    for step, b, d, cap in _captured_dispatches(run):
        g = _graphs(run, cap)
        msg = judge(b, d, rules.expected_dispatch(cfg, g, b, design), g)
        if msg:
            out.append(Violation(prop, msg, step))
    for sv in run.captured_sweeps:
        g = _graphs(run, sv.captured)
        failures = []
        for _, b, d in sv.entries():
            msg = judge(b, d, rules.expected_dispatch(cfg, g, b, design), g)
            if msg:
                failures.append((b, msg))
        out += sweep_violations(prop, sv, failures)
    return group(out)


# -- init ----------------------------------------------------------------------------


def _by_runner(descs: Iterable[BatchDescriptor]) -> dict[str, set[BatchDescriptor]]:
    out: dict[str, set[BatchDescriptor]] = {"prefill": set(), "decode": set()}
    for d in descs:
        out[_runner(d)].add(d)
    return out


def _diff(got: Iterable[BatchDescriptor], want: Iterable[BatchDescriptor]) -> list[str]:
    a, e = _by_runner(got), _by_runner(want)
    parts = []
    for runner in ("prefill", "decode"):
        missing, extra = e[runner] - a[runner], a[runner] - e[runner]
        if missing or extra:
            text = f"{runner} runner:"
            if missing:
                text += f" missing {shorts(missing)}"
            if extra:
                text += f" unexpected {shorts(extra)}"
            parts.append(text)
    return parts


@declare("SGL-CAND-ORDER", "the runners capture the graphs sglang's sizing rules give for the config, and sizing "
         "again on the finished runners gives the same", family="init", engine=ENGINE,
         applies=_has_initial)
def sgl_cand_order(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    align = _alignment(run)
    want = rules.expected_capture_descs(run.config, _design(run), align.decode, align.prefill)
    for c in _initial(run):
        diff = _diff(c.capture_descs, want)
        if diff:
            out.append(Violation("SGL-CAND-ORDER", "capture list differs from sglang's rules (bs list "
                                 f"{rules.requested_decode_bs(run.config)}, pool {run.config.max_num_reqs}, "
                                 f"{align.text(align.decode)}): " + "; ".join(diff), c.step))
    for r in (c for c in run.of(Candidates) if c.phase == "recomputed"):
        i = run.initial_candidates(r.step)
        if i is not None and set(i.capture_descs) != set(r.capture_descs):
            out.append(Violation("SGL-CAND-ORDER", "the finished runners' own lists differ from the sizes computed "
                                 "before capture: " + "; ".join(_diff(r.capture_descs, i.capture_descs)), r.step))
    return group(out)


@declare("SGL-CAND-BOUNDS", "decode graphs hold 1 to the request pool rounded up to the alignment requests of the "
         "decode width, the largest that fits is captured; prefill buckets are 1 to the largest size; no key twice",
         family="init", engine=ENGINE, applies=_has_initial)
def sgl_cand_bounds(run: RunView) -> list[Violation]:
    cfg = run.config
    align = _alignment(run)
    base, w = align.decode, cfg.decode_query_len
    pool = rules.ceil_align(cfg.max_num_reqs, base)
    k = rules.lora_case_of(cfg)
    ub = 2 if cfg.num_ubatches == 2 else 1
    top = rules.ceil_align(max(cfg.capture_sizes), align.prefill)
    out: list[Violation] = []
    for c in _initial(run):
        for d, n in Counter(c.capture_descs).items():
            if n > 1:
                out.append(Violation("SGL-CAND-BOUNDS", f"{d.short()} is in the capture list {n} times", c.step))
        decode = [d for d in c.capture_descs if rules.is_decode_desc(d)]
        for d in dict.fromkeys(c.capture_descs):
            problems = []
            if d in decode:
                bs = d.num_reqs or 0
                if not 1 <= bs <= pool:
                    problems.append(f"bs {bs} outside 1..{pool} (the pool {cfg.max_num_reqs} rounded up to "
                                    f"{align.text(base)})")
                if d.uniform_token_count != w or d.num_tokens != bs * w:
                    problems.append(f"not bs x the decode width {w}")
                if d.num_ubatches != ub:
                    problems.append(f"num_ubatches {d.num_ubatches}, expected {ub}")
            else:
                if not 1 <= d.num_tokens <= top:
                    problems.append(f"tokens {d.num_tokens} outside 1..{top}")
                if d.cg_mode == F and d.num_reqs != rules.prefill_slots(cfg):
                    problems.append(f"request slots {d.num_reqs}, expected {rules.prefill_slots(cfg)}")
            if d.num_active_loras not in (0, k):
                problems.append(f"LoRA case {d.num_active_loras} is neither 0 nor {k}")
            if problems:
                out.append(Violation("SGL-CAND-BOUNDS", f"{d.short()}: " + "; ".join(problems), c.step))
        if decode:
            largest = max(d.num_reqs or 0 for d in decode)
            expected = max(rules.decode_capture_bs(cfg, base), default=0)
            if largest != expected:
                out.append(Violation(
                    "SGL-CAND-BOUNDS",
                    f"the largest decode graph is bs {largest}, but the largest size the config asks for that fits "
                    f"the rounded pool {pool} is {expected} (asked for {rules.requested_decode_bs(cfg)})", c.step))
    return group(out)


@declare("SGL-CAPTURE-ALIGNED", "every decode graph's bs times its alignment width (1 under two-batch overlap, else "
         "the decode width) and, where the design aligns them, every prefill bucket is a multiple of sglang's "
         "batch-size alignment, as sglang answers it",
         family="init", engine=ENGINE, applies=_has_initial)
def sgl_capture_aligned(run: RunView) -> list[Violation]:
    cfg = run.config
    align = _alignment(run)
    width = rules.alignment_width(cfg)
    aligned_prefill = _design(run).aligned_prefill_tokens
    out = []
    for c in _initial(run):
        for d in dict.fromkeys(c.capture_descs):
            decode = rules.is_decode_desc(d)
            if not decode and not aligned_prefill:
                continue  # this design lists prefill buckets as configured (SGL_RULES aligned_prefill_tokens)
            base = align.decode if decode else align.prefill
            size = (d.num_reqs or 0) * width if decode else d.num_tokens
            if size % base:
                what = f"bs {d.num_reqs} x {width}" if decode else f"{d.num_tokens} tokens"
                out.append(Violation("SGL-CAPTURE-ALIGNED", f"{d.short()}: {what} = {size} is not a multiple of "
                                     f"{align.text(base)}", c.step))
    return group(out)


# -- capture ---------------------------------------------------------------------------


def _has_creates(run: RunView) -> bool:
    return any(isinstance(e, CreateForwardFn) for s in run.sessions for e in s.events)


@declare("SGL-CAPTURE-ORDER", "the prefill runner captures before the decode runner, each largest first, and per "
         "decode bs the LoRA graph before the base-only one", family="capture", engine=ENGINE,
         applies=_has_creates)
def sgl_capture_order(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    for s in run.sessions:
        seq = list(dict.fromkeys(e.desc for e in s.events if isinstance(e, CreateForwardFn) and e.warmup))
        for prev, cur in zip(seq, seq[1:]):
            if _runner(prev) == "decode" and _runner(cur) == "prefill":
                msg = f"prefill {cur.short()} captured after decode {prev.short()} (the prefill runner goes first)"
            elif _runner(prev) == _runner(cur) and cur.num_tokens > prev.num_tokens:
                msg = f"{cur.short()} captured after the smaller {prev.short()} (largest first)"
            elif (_runner(prev) == _runner(cur) == "decode" and cur.num_tokens == prev.num_tokens
                  and prev.num_active_loras == 0 < cur.num_active_loras):
                msg = f"LoRA graph {cur.short()} captured after its base-only graph {prev.short()}"
            else:
                continue
            out.append(Violation("SGL-CAPTURE-ORDER", msg, s.step))
    return group(out)


# -- dispatch ----------------------------------------------------------------------------


def _holds(run: RunView, d: BatchDescriptor, b, dp_size: int) -> str | None:
    """Why graph ``d`` cannot hold ``b`` (None: it can)."""
    decode = rules.is_decode_batch(run.config, b)
    if _runner(d) == "decode" and not decode:
        return "an extend on a decode graph"
    if _runner(d) == "prefill" and decode:
        return "a decode batch on a prefill graph"
    if d.num_tokens < b.num_tokens:
        return f"{d.num_tokens} graph tokens < the batch's {b.num_tokens}"
    need = (max(rules.dp_rank_sizes(b.num_reqs, dp_size, run.config.max_num_reqs)) if _runner(d) == "decode"
            else b.num_reqs)
    if d.num_reqs is not None and d.num_reqs < need:
        return f"{d.num_reqs} graph requests < the {need} it must hold"
    if _runner(d) == "decode" and d.uniform_token_count != b.uniform_token_count:
        return f"width {d.uniform_token_count} != the batch's {b.uniform_token_count}"
    return None


@declare("SGL-DISPATCH-SOUND", "a batch replays a graph only where sglang's rules replay one: the runner of its "
         "forward mode, a captured graph that holds it, every gate passed", family="dispatch", engine=ENGINE,
         applies=_has_captured_dispatch)
def sgl_dispatch_sound(run: RunView) -> list[Violation]:
    dp = rules.options(run.config).dp_size

    def judge(b, d, expected, g):
        if d.cg_mode == N:
            return (f"{b.short()} dispatched to eager {d.short()} with fewer tokens than the batch"
                    if d.num_tokens < b.num_tokens else None)
        if d not in g.decode and d not in g.prefill:
            return f"{b.short()} dispatched to {d.short()}, which was not captured"
        why = _holds(run, d, b, dp)
        if why:
            return f"{b.short()} dispatched to {d.short()}: {why}"
        if expected is None:
            return f"{b.short()} dispatched to {d.short()} although sglang's rules run it eagerly ({_why_eager(run, b)})"
        return None

    return _judge_dispatch(run, "SGL-DISPATCH-SOUND", judge)


@declare("SGL-DISPATCH-COMPLETE", "if sglang's rules replay a captured graph for a batch, it does not run eagerly",
         family="dispatch", engine=ENGINE, applies=_has_captured_dispatch)
def sgl_dispatch_complete(run: RunView) -> list[Violation]:
    def judge(b, d, expected, g):
        if d.cg_mode == N and expected is not None:
            return f"{b.short()} ran eagerly although sglang's rules replay the captured {expected.short()}"
        return None

    return _judge_dispatch(run, "SGL-DISPATCH-COMPLETE", judge)


@declare("SGL-DISPATCH-MINIMAL", "a replayed batch pads to the smallest captured bucket that holds it (bisect; the "
         "max over DP ranks), in the LoRA variant its adapters need", family="dispatch", engine=ENGINE,
         applies=_has_captured_dispatch)
def sgl_dispatch_minimal(run: RunView) -> list[Violation]:
    def judge(b, d, expected, g):
        if d.cg_mode != N and expected is not None and d != expected:
            return f"{b.short()} dispatched to {d.short()}; sglang's bisect pads it to {expected.short()}"
        return None

    return _judge_dispatch(run, "SGL-DISPATCH-MINIMAL", judge)


def _exact(run: RunView, b, expected: BatchDescriptor | None) -> bool:
    if expected is None:
        return False
    if rules.is_decode_desc(expected):
        return expected.num_reqs == max(rules.dp_rank_sizes(b.num_reqs, rules.options(run.config).dp_size,
                                                            run.config.max_num_reqs))
    return expected.num_tokens == b.num_tokens


def _applies_roundtrip(run: RunView) -> bool:
    return _has_captured_dispatch(run)


@declare("SGL-DISPATCH-ROUNDTRIP", "a batch of exactly a captured graph's size (requests, or prefill tokens) replays "
         "that graph", family="dispatch", engine=ENGINE, applies=_applies_roundtrip)
def sgl_dispatch_roundtrip(run: RunView) -> list[Violation]:
    def judge(b, d, expected, g):
        if _exact(run, b, expected) and d != expected:
            return f"{b.short()} has exactly the size of captured {expected.short()} but dispatched to {d.short()}"
        return None

    return _judge_dispatch(run, "SGL-DISPATCH-ROUNDTRIP", judge)


def _schedulable(run: RunView) -> Iterator[Batch]:
    """Batches sglang's scheduler can hand in for the config: decodes of every
    request count (split for two-batch overlap when it is on), with and
    without adapters, and single prompts of every token count."""
    cfg = run.config
    w = cfg.decode_query_len
    k = rules.lora_case_of(cfg)
    ub = 2 if cfg.num_ubatches == 2 else 1
    for r in range(1, cfg.max_num_reqs + 1):
        for a in sorted({0, min(k, r)}):
            yield Batch((w,) * r, a, ub)
    for t in range(1, sweep_token_limit(cfg) + 1):
        yield Batch((t,), 0, 1, has_prefill=True)


@declare("SGL-CAPTURE-USEFUL", "every captured graph is the one sglang replays for some batch its scheduler can "
         "produce", family="dispatch", engine=ENGINE,
         applies=lambda run: any(c.descs for c in run.finished_captures))
def sgl_capture_useful(run: RunView) -> list[Violation]:
    cfg, design = run.config, _design(run)
    out: list[Violation] = []
    judged: set[frozenset] = set()
    for cap in run.finished_captures:
        if not cap.descs or cap.descs in judged:
            continue
        judged.add(cap.descs)
        g = _graphs(run, cap)
        used = {rules.expected_dispatch(cfg, g, b, design) for b in _schedulable(run)}
        if rules.options(cfg).dp_size > 1:
            # A DP group whose ranks all hold the same count is schedulable too:
            # it replays what one rank alone would.
            alone = cfg.with_options(replace(rules.options(cfg), dp_size=1))
            used |= {rules.expected_dispatch(alone, g, b, design) for b in _schedulable(run)}
        # desc_sort_key last: the descriptors otherwise tied keep one order in every process
        for d in sorted(cap.descs - used, key=lambda d: (_runner(d), -d.num_tokens, d.num_active_loras, d.cg_mode.value,
                                                       desc_sort_key(d))):
            out.append(Violation("SGL-CAPTURE-USEFUL", f"captured {d.short()} is replayed for no batch the scheduler "
                                 f"can produce (up to {cfg.max_num_reqs} requests)", cap.step))
    return group(out)


def _has_rank_dispatch(run: RunView) -> bool:
    return bool(run.of(RankDispatch))


@declare("SGL-DP-AGREE", "under DP attention every rank makes the same graph-or-eager choice and replays the same "
         "graph", family="dispatch", engine=ENGINE, applies=_has_rank_dispatch)
def sgl_dp_agree(run: RunView) -> list[Violation]:
    failures = []
    for e in run.of(RankDispatch):
        choices = {d for _, d in e.ranks}
        if len(choices) > 1:
            per = "; ".join(f"rank {i} ({n} requests): {d.short() if d else 'eager'}" for i, (n, d) in enumerate(e.ranks))
            failures.append((e.step, e.batch, f"ranks disagree for {e.batch.short()}: {per}"))
    if not failures:
        return []
    step, _, msg = min(failures, key=lambda f: (f[1].num_tokens, f[1].num_reqs))
    return [Violation("SGL-DP-AGREE", f"{msg} ({len(failures)} batches in all)", step if step >= 0 else None)]


# -- lifecycle ----------------------------------------------------------------------------


def _has_graph_output(run: RunView) -> bool:
    return bool(run.of(GraphOutput))


@declare("SGL-REPLAY-KEY", "the graph a batch replays is the one dispatch chose for it", family="lifecycle",
         engine=ENGINE, applies=_has_graph_output)
def sgl_replay_key(run: RunView) -> list[Violation]:
    chosen = {d.step: d for d in run.of(Dispatch)}
    out = []
    for e in run.of(GraphOutput):
        d = chosen.get(e.step)
        if d is not None and d.desc != e.graph:
            out.append(Violation("SGL-REPLAY-KEY", f"{d.batch.short()} dispatched to {d.desc.short()} replayed "
                                 f"{e.graph.short()}", e.step))
    return group(out)


@declare("SGL-OUTPUT-ROWS", "a replay hands back exactly the batch's real rows (the graph's padded rows only for "
         "tensors sent on to a next pipeline stage)", family="lifecycle", engine=ENGINE,
         applies=_has_graph_output)
def sgl_output_rows(run: RunView) -> list[Violation]:
    out = []
    for e in run.of(GraphOutput):
        want = e.padded_rows if e.output == "proxy" else e.real_rows
        if e.rows != want:
            what = "padded" if e.output == "proxy" else "real"
            out.append(Violation("SGL-OUTPUT-ROWS", f"replay of {e.graph.short()} handed back {e.rows} {e.output} rows, "
                                 f"expected the {want} {what} rows ({e.real_rows} real, {e.padded_rows} padded)", e.step))
    return group(out)


@declare("SGL-HIDDEN-MODE", "a batch replays a graph only if the graph was captured with a hidden-state mode covering "
         "the batch's (NULL < LAST < FULL)", family="lifecycle", engine=ENGINE,
         applies=_has_graph_output)
def sgl_hidden_mode(run: RunView) -> list[Violation]:
    out = []
    rank = {m: i for i, m in enumerate(HIDDEN_MODES)}
    for e in run.of(GraphOutput):
        if e.captured_hidden is None or e.runtime_hidden is None:
            continue
        if rank.get(e.runtime_hidden, len(rank)) > rank.get(e.captured_hidden, -1):
            out.append(Violation("SGL-HIDDEN-MODE", f"a batch asking for hidden states {e.runtime_hidden} replayed "
                                 f"{e.graph.short()}, captured with {e.captured_hidden}", e.step))
    return group(out)
