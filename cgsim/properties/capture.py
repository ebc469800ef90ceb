"""Properties of the capture protocol: CAPTURE-ORDER, CAPTURE-ONCE,
WARMUP-FIRST, FRESH-METADATA, SKIP-ATTN, NO-ILLEGAL-OP,
CAPTURE-STREAM-CONSISTENT."""

from __future__ import annotations

from collections import Counter

from cgsim.descriptors import BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.properties.registry import Violation, declare
from cgsim.properties.view import (
    MAX_PER_GROUP,
    RunView,
    Session,
    group,
    is_capture_pass,
    is_full_capture,
    is_warmup,
    list_short,
    shorts,
)
from cgsim.trace import CreateForwardFn, Forward, GraphStored, PiecewiseCapture, Replay

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


def _has_sessions(run: RunView) -> bool:
    return any(s.events or s.done is not None for s in run.sessions)


def _has_capture_forwards(run: RunView) -> bool:
    return any(s.forwards for s in run.sessions)


def _captures_with_fresh_metadata(run: RunView) -> bool:
    for s in run.sessions:
        for f in s.forwards:
            if f.desc is None:
                continue
            if (is_full_capture(f) and f.desc.cg_mode == F) or (f.mode == P and f.desc.cg_mode == P and run.trace.uses_breakable):
                return True
    return False


def _capture_sequence(session: Session) -> list[BatchDescriptor]:
    """Descriptors in the order their capture started (first warmup create)."""
    seq: list[BatchDescriptor] = []
    seen: set[BatchDescriptor] = set()
    creates = [e for e in session.events if isinstance(e, CreateForwardFn)]
    source = [e.desc for e in creates if e.warmup] if creates else [f.desc for f in session.forwards if f.desc is not None]
    for d in source:
        if d not in seen:
            seen.add(d)
            seq.append(d)
    return seq


@declare("CAPTURE-ORDER", "PIECEWISE captured before FULL, largest first within a mode", family="capture",
         applies=_has_capture_forwards)
def capture_order(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    for s in run.sessions:
        seq = [d for d in _capture_sequence(s) if d.cg_mode in (P, F)]
        found = 0
        for prev, cur in zip(seq, seq[1:]):
            if prev.cg_mode == F and cur.cg_mode == P:
                msg = f"PIECEWISE {cur.short()} captured after FULL {prev.short()} (expected all PIECEWISE first, then FULL)"
            elif prev.cg_mode == cur.cg_mode and cur.num_tokens > prev.num_tokens:
                msg = (f"{cur.short()} captured after the smaller {prev.short()} "
                       f"(expected largest first within {cur.cg_mode.value})")
            else:
                continue
            found += 1
            if found <= MAX_PER_GROUP:
                out.append(Violation("CAPTURE-ORDER", msg, s.step))
        if found > MAX_PER_GROUP:
            out.append(Violation("CAPTURE-ORDER", f"... {found - MAX_PER_GROUP} more out-of-order captures in this session; "
                                 f"order seen: {list_short(seq)}", s.step))
    return out


@declare("CAPTURE-ONCE", "each FULL descriptor captured exactly once; stored graphs = FULL capture list",
         family="capture", applies=_has_sessions)
def capture_once(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    spec = run.spec_descs
    for s in run.sessions:
        in_graph = Counter(f.desc for f in s.forwards if is_full_capture(f) and f.desc is not None)
        stored = Counter(s.stored)
        for d, n in in_graph.items():
            if d.cg_mode != F:
                out.append(Violation("CAPTURE-ONCE", f"{d.short()} (not FULL) was captured inside a FULL graph", s.step))
            elif n > 1:
                out.append(Violation("CAPTURE-ONCE", f"FULL {d.short()} captured {n} times in one capture (expected once)", s.step))
        for d, n in stored.items():
            if n > 1:
                out.append(Violation("CAPTURE-ONCE", f"graph for {d.short()} stored {n} times (expected once)", s.step))
            if in_graph[d] == 0:
                out.append(Violation("CAPTURE-ONCE", f"graph for {d.short()} stored without a capture pass for it", s.step))
        if not s.ok:
            continue
        cand = run.initial_candidates(s.step)
        if cand is not None:
            full_list, source = [d for d in cand.capture_descs if d.cg_mode == F], "the manager's FULL capture list"
        elif spec is not None:
            full_list, source = list(spec.get(F, ())), "the spec's FULL capture list"
        else:
            continue
        stored.update({d: 1 for d in s.carried})
        for d in dict.fromkeys(full_list):
            if in_graph[d] == 0 and stored[d] == 0:
                out.append(Violation("CAPTURE-ONCE", f"FULL {d.short()} is in {source} but was never captured nor stored", s.step))
            elif stored[d] == 0:
                out.append(Violation("CAPTURE-ONCE", f"FULL {d.short()} was captured but no graph was stored for it", s.step))
        extra = set(stored) - set(full_list)
        if extra:
            out.append(Violation("CAPTURE-ONCE", f"stored graphs not in {source}: {shorts(extra)}", s.step))
    return group(out)


@declare("WARMUP-FIRST", "every capture of a descriptor is preceded by its warmup", family="capture",
         applies=_has_capture_forwards)
def warmup_first(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    for s in run.sessions:
        created: set[BatchDescriptor] = set()
        warmed: set[BatchDescriptor] = set()
        for e in s.events:
            if isinstance(e, CreateForwardFn):
                if e.warmup:
                    created.add(e.desc)
            elif isinstance(e, Forward) and e.desc is not None:
                if is_warmup(e):
                    if e.desc in created:
                        warmed.add(e.desc)
                elif is_capture_pass(e) and e.desc not in warmed:
                    why = ("no create_forward_fn(warmup=True) for it" if e.desc not in created
                           else "create_forward_fn(warmup=True) was called but its eager warmup forward never ran")
                    where = "inside a FULL graph" if is_full_capture(e) else f"as {e.mode.value}"
                    out.append(Violation(
                        "WARMUP-FIRST", f"{e.desc.short()} captured {where} before its warmup ({why})", e.step))
            elif isinstance(e, GraphStored) and e.desc not in warmed and e.desc not in s.carried:
                out.append(Violation("WARMUP-FIRST", f"graph for {e.desc.short()} stored but its warmup never ran", e.step))
    return group(out)


@declare("FRESH-METADATA", "FULL and breakable PIECEWISE captures use metadata that is not the warmup's "
         "(identity and no shared state)", family="capture", applies=_captures_with_fresh_metadata)
def fresh_metadata(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    for s in run.sessions:
        warm: dict[BatchDescriptor, int | None] = {}
        for f in s.forwards:
            d = f.desc
            if d is None:
                continue
            if is_warmup(f):
                warm[d] = f.metadata
                continue
            full = is_full_capture(f) and d.cg_mode == F
            breakable_pw = f.mode == P and d.cg_mode == P and run.trace.uses_breakable
            if not (full or breakable_pw) or d not in warm:
                continue
            w, c = warm[d], f.metadata
            if w is None or c is None:
                continue  # attention skipped: SKIP-ATTN judges that
            what = "FULL graph" if full else "breakable PIECEWISE capture"
            graph = (("graph", d.to_json()),)
            if w == c:
                out.append(Violation(
                    "FRESH-METADATA",
                    f"{what} for {d.short()} captured with the warmup's metadata object #{c} "
                    "(expected a fresh object from create_forward_fn(warmup=False))",
                    f.step, graph,
                ))
                continue
            rw, rc = run.metadata(w), run.metadata(c)
            if rw is not None and rc is not None:
                shared = sorted(set(rw.state) & set(rc.state))
                if shared:
                    out.append(Violation(
                        "FRESH-METADATA",
                        f"{what} for {d.short()}: captured metadata #{c} shares mutable state {shared} with the "
                        f"warmup's metadata #{w} (backends mutate or lazily build it during warmup)",
                        f.step, graph,
                    ))
    return group(out)


@declare("SKIP-ATTN", "attention metadata is None exactly when the ruleset says skip", family="capture",
         applies=_has_capture_forwards)
def skip_attn(run: RunView) -> list[Violation]:
    rs = run.ruleset
    breakable = run.trace.uses_breakable
    out: list[Violation] = []
    for s in run.sessions:
        for f in s.forwards:
            d = f.desc
            if d is None:
                continue
            skip = rs.skip_attn(d.cg_mode == P, breakable, warmup=is_warmup(f))
            kind = "warmup" if is_warmup(f) else ("FULL graph capture" if is_full_capture(f) else f"{f.mode.value} capture")
            facts = (("graph", d.to_json()), ("forward_mode", f.mode.value))
            if skip and f.metadata is not None:
                out.append(Violation(
                    "SKIP-ATTN",
                    f"{kind} forward for {d.short()} built attention metadata #{f.metadata}; ruleset {rs.name} "
                    "skips attention for PIECEWISE without breakable graphs (attention runs outside the pieces)",
                    f.step, facts,
                ))
            elif not skip and f.metadata is None:
                out.append(Violation(
                    "SKIP-ATTN",
                    f"{kind} forward for {d.short()} ran with attention skipped (metadata None); ruleset {rs.name} "
                    f"builds metadata here (breakable={breakable})",
                    f.step, facts,
                ))
    return group(out)


def _has_capture_or_illegal(run: RunView) -> bool:
    return _has_sessions(run) or any(e.error == "illegal-op" for e in run.errors)


@declare("NO-ILLEGAL-OP", "nothing illegal (host sync, data-dependent shape, pageable copy) during capture",
         family="capture", applies=_has_capture_or_illegal)
def no_illegal_op(run: RunView) -> list[Violation]:
    return [
        Violation("NO-ILLEGAL-OP", f"illegal operation during {e.phase}: {e.exc_type}: {e.message}", e.step)
        for e in run.errors
        if e.error == "illegal-op"
    ]


def captured_off_warmup_stream(warmed_on: int | None, captured_on: int | None) -> bool:
    """A graph captured on another stream than its warm-up ran on (None: not
    known, no claim)."""
    return warmed_on is not None and captured_on is not None and warmed_on != captured_on


def replayed_off_step_stream(step_stream: int | None, replay_streams: tuple[int, ...]) -> tuple[int, ...]:
    """The streams a step's graph replays ran on that are not the step's own."""
    if step_stream is None:
        return ()
    return tuple(sorted({r for r in replay_streams if r != step_stream}))


def _stream_name(stream: int) -> str:
    return "the default stream" if stream == 0 else f"stream {stream}"


def _has_captures_or_replays(run: RunView) -> bool:
    return _has_capture_forwards(run) or any(r.replay_streams for r in run.trace.of(Replay))


@declare("CAPTURE-STREAM-CONSISTENT", "each graph is captured on the stream its warmup ran on, and each replay "
         "runs on the stream of the step that replays it", family="capture", applies=_has_captures_or_replays)
def capture_stream_consistent(run: RunView) -> list[Violation]:
    # On a GPU a graph may be captured on a side stream and replayed on
    # another (vLLM captures inside graph_capture()'s stream and replays on the
    # current one).  What breaks: a warm-up on one stream and the capture on
    # another, so the capture stream's lazy state (cuBLAS workspaces) is made
    # inside the graph; and a replay on a stream the step's input writes and
    # output reads are not ordered with.
    out: list[Violation] = []
    for s in run.sessions:
        warmed: dict[BatchDescriptor, int] = {}
        last: Forward | None = None
        for e in s.events:
            if isinstance(e, Forward):
                last = e
                if e.desc is None:
                    continue
                if is_warmup(e):
                    warmed[e.desc] = e.stream
                elif is_full_capture(e) and captured_off_warmup_stream(warmed.get(e.desc), e.stream):
                    out.append(Violation(
                        "CAPTURE-STREAM-CONSISTENT",
                        f"FULL graph for {e.desc.short()} captured on {_stream_name(e.stream)}, its warmup ran on "
                        f"{_stream_name(warmed[e.desc])}",
                        e.step, (("graph", e.desc.to_json()), ("warmed_on", warmed[e.desc]), ("captured_on", e.stream)),
                    ))
            elif isinstance(e, PiecewiseCapture) and last is not None and last.desc is not None:
                warm = warmed.get(last.desc)
                if captured_off_warmup_stream(warm, e.stream):
                    out.append(Violation(
                        "CAPTURE-STREAM-CONSISTENT",
                        f"piecewise graphs for {last.desc.short()} captured on {_stream_name(e.stream)}, its warmup "
                        f"ran on {_stream_name(warm)}",
                        e.step, (("graph", last.desc.to_json()), ("warmed_on", warm), ("captured_on", e.stream)),
                    ))
    for r in run.trace.of(Replay):
        foreign = replayed_off_step_stream(r.step_stream, r.replay_streams)
        if foreign:
            out.append(Violation(
                "CAPTURE-STREAM-CONSISTENT",
                f"{r.path} replay for {r.desc.short()} ran on {', '.join(map(_stream_name, foreign))}, the step ran "
                f"on {_stream_name(r.step_stream)} (its inputs written and outputs read there, unordered with the replay)",
                r.step, (("graph", r.desc.to_json()), ("step_stream", r.step_stream), ("replay_streams", list(foreign))),
            ))
    return group(out)
