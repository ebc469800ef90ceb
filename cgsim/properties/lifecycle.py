"""Properties of replay and release: REPLAY-EQUALS-EAGER, RELEASE-RECAPTURE;
and SERVED-EQUALS-EAGER, the same promise kept end to end: requests served
through the engine's own model runner (``cgsim.served``) get the tokens with
CUDA graphs that they get eager.  Its rule is ``served_violations``, a pure
function of the two served runs as plain values."""

from __future__ import annotations

from typing import Any, Mapping

from cgsim.properties.registry import Violation, declare
from cgsim.properties.view import RunView, group
from cgsim.trace import CaptureDone, Release, Replay

__all__ = ["release_problems", "served_violations"]


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


def release_problems(graphs_after: int, captured_flag_after: bool) -> list[str]:
    """What a release left behind: graphs still stored, the captured flag
    still set (empty: nothing; export-test carries this rule as written)."""
    problems = []
    if graphs_after != 0:
        problems.append(f"release left {graphs_after} graph(s) stored (expected 0)")
    if captured_flag_after:
        problems.append("release left the manager marked captured")
    return problems


@declare("RELEASE-RECAPTURE", "release drops every graph and the captured flag; nothing from before is replayed "
         "after a recapture", family="lifecycle", applies=_has_release_or_recapture, rule=release_problems)
def release_recapture(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    releases = run.of(Release)
    for e in releases:
        for problem in release_problems(e.graphs_after, e.captured_flag_after):
            out.append(Violation("RELEASE-RECAPTURE", problem, e.step))
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


SERVED_EQUALS_EAGER = "SERVED-EQUALS-EAGER"
# Log-probabilities of a graph replay and an eager forward differ by bf16
# rounding where padding changes a matmul's shape; tokens must not differ.
LOGPROB_TOLERANCE = 0.05

# Judged by the runner tier on served runs, not on a trace; not shrunk (every attempt serves a launch twice).
declare(SERVED_EQUALS_EAGER, "requests served through the engine's own model runner get the same tokens with CUDA "
        "graphs as eager, from the same drafts, log-probabilities within bf16 noise, and graphs make nothing raise "
        "that eager does not",
        family="lifecycle", kind="violation", shrink=False, harness_only=True)


# Facts of a violation whose output is eager's: only the drafts differ (greedy verification keeps the tokens).
_DRAFT_FACTS = ("drafts", "per_step")


def changes_output(violation: Violation) -> bool:
    """Whether a SERVED-EQUALS-EAGER violation is in what the user receives
    (tokens, log-probabilities, an exception), not only in the drafts."""
    return not any(key in _DRAFT_FACTS for key, _ in violation.facts)


def served_violations(graphs: Mapping[str, Any], eager: Mapping[str, Any]) -> list[Violation]:
    """Where a served run with CUDA graphs differs from the same requests served
    eager ([]: nowhere).  Each run: ``tokens`` and ``logprobs`` per request id,
    ``raised`` (what the engine raised, None: nothing).  A launch that raises
    eager as well says nothing about its graphs."""
    if eager.get("raised"):
        return []
    if graphs.get("raised"):
        return [Violation(SERVED_EQUALS_EAGER, f"raised with CUDA graphs, not eager: {graphs['raised']}",
                          facts=(("raised", graphs["raised"]),))]
    out = []
    g_tokens, e_tokens = graphs.get("tokens") or {}, eager.get("tokens") or {}
    for rid in sorted(set(g_tokens) | set(e_tokens)):
        g, e = list(g_tokens.get(rid, [])), list(e_tokens.get(rid, []))
        if g != e:
            out.append(Violation(SERVED_EQUALS_EAGER, f"request {rid}: tokens {g} with CUDA graphs, {e} eager",
                                 facts=(("request", rid), ("tokens", g), ("eager_tokens", e))))
            continue
        gl, el = (graphs.get("logprobs") or {}).get(rid, []), (eager.get("logprobs") or {}).get(rid, [])
        worst = max((abs(a - b) for a, b in zip(gl, el)), default=0.0)
        if worst > LOGPROB_TOLERANCE:
            out.append(Violation(SERVED_EQUALS_EAGER,
                                 f"request {rid}: log-probabilities differ by {worst:.3f} (over {LOGPROB_TOLERANCE})",
                                 facts=(("request", rid), ("logprob_difference", round(worst, 4)))))
            continue
        # The same tokens, other drafts: the draft model's graphs did not draft as eager did.
        gd, ed = (graphs.get("drafts") or {}).get(rid), (eager.get("drafts") or {}).get(rid)
        if gd is not None and ed is not None and list(gd) != list(ed):
            step = next((i for i, (a, b) in enumerate(zip(gd, ed)) if list(a) != list(b)), min(len(gd), len(ed)))
            g_at, e_at = (list(gd[step]) if step < len(gd) else None), (list(ed[step]) if step < len(ed) else None)
            out.append(Violation(SERVED_EQUALS_EAGER,
                                 f"request {rid}: drafted {g_at} with CUDA graphs, {e_at} eager (its step {step + 1})",
                                 facts=(("request", rid), ("drafts", g_at), ("eager_drafts", e_at),
                                        ("draft_step", step + 1))))
            continue
        # The same tokens in other steps: other drafts accepted.
        gs, es = (graphs.get("per_step") or {}).get(rid), (eager.get("per_step") or {}).get(rid)
        if gs is not None and es is not None and list(gs) != list(es):
            out.append(Violation(SERVED_EQUALS_EAGER,
                                 f"request {rid}: tokens per step {list(gs)} with CUDA graphs, {list(es)} eager "
                                 "(other drafts accepted)",
                                 facts=(("request", rid), ("per_step", list(gs)), ("eager_per_step", list(es)))))
    return out
