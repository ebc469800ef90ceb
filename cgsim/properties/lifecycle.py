"""Properties of replay and release: REPLAY-EQUALS-EAGER, RELEASE-RECAPTURE."""

from __future__ import annotations

from cgsim.properties.registry import Violation, declare
from cgsim.properties.view import RunView, group
from cgsim.trace import CaptureDone, Release, Replay


def _has_replay(run: RunView) -> bool:
    return bool(run.of(Replay))


def _has_release_or_recapture(run: RunView) -> bool:
    return bool(run.of(Release)) or len(run.of(CaptureDone)) > 1


@declare("REPLAY-EQUALS-EAGER", "outputs after replay equal eager outputs on the real rows", family="lifecycle",
         applies=_has_replay)
def replay_equals_eager(run: RunView) -> list[Violation]:
    out = []
    for r in run.of(Replay):
        if not r.outputs_ok:
            err = "no output produced" if r.max_abs_err is None else f"max abs error {r.max_abs_err:g} over the real rows"
            out.append(Violation(
                "REPLAY-EQUALS-EAGER",
                f"{r.path} run of {r.desc.short()} for {r.batch.short()} differs from eager: {err}"
                + (f" (graph from capture step {r.graph_from_step})" if r.graph_from_step is not None else ""),
                r.step, (("graph", r.desc.to_json()), ("path", r.path)),
            ))
    return group(out)


@declare("RELEASE-RECAPTURE", "release drops every graph and the captured flag; nothing from before is replayed "
         "after a recapture", family="lifecycle", applies=_has_release_or_recapture)
def release_recapture(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    releases = run.of(Release)
    for e in releases:
        if e.graphs_after != 0:
            out.append(Violation("RELEASE-RECAPTURE", f"release left {e.graphs_after} graph(s) stored (expected 0)", e.step))
        if e.captured_flag_after:
            out.append(Violation("RELEASE-RECAPTURE", "release left the manager marked captured", e.step))
    # Captures that actually recorded graphs (a capture() that found everything
    # already captured records none and does not make older graphs stale).
    storing = [s.step for s in run.sessions if s.ok and s.captured_something and s.step is not None]
    for r in run.of(Replay):
        if r.graph_from_step is None:
            continue
        released = [x.step for x in releases if x.step < r.step]
        recaptured = [x for x in storing if x < r.step]
        head = f"{r.path} replay of {r.desc.short()} for {r.batch.short()}"
        if released and r.graph_from_step < released[-1]:
            out.append(Violation(
                "RELEASE-RECAPTURE",
                f"{head} used a graph from capture step {r.graph_from_step}, released at step {released[-1]}", r.step))
        elif recaptured and r.graph_from_step < recaptured[-1]:
            out.append(Violation(
                "RELEASE-RECAPTURE",
                f"{head} used a stale graph from capture step {r.graph_from_step}; the latest capture was at step "
                f"{recaptured[-1]}", r.step))
    return group(out)
