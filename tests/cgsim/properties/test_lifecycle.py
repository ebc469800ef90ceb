"""SPEC §4: the lifecycle properties (cgsim/properties/lifecycle.py) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

from dataclasses import replace

from cgsim.modes import CUDAGraphMode
from cgsim.trace import Release, Replay
from tests.cgsim.properties.hand_traces import (
    BASE,
    FD,
    WORKFLOW,
    C,
    assert_holds,
    assert_violates,
    cap,
    disp,
    good_trace,
    is_,
    mutate,
    rel,
    scenario,
)


# --------------------------------------------------------------------------
# REPLAY-EQUALS-EAGER
# --------------------------------------------------------------------------
def test_replay_equals_eager_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("REPLAY-EQUALS-EAGER", sc, good_trace(sc))


def test_replay_equals_eager_wrong_output():
    sc = scenario(BASE, cap(), disp(1, 1, 1))
    t = mutate(good_trace(sc), is_(Replay), lambda r: replace(r, outputs_ok=False, max_abs_err=0.25))
    assert_violates("REPLAY-EQUALS-EAGER", sc, t, "full run of", FD(4, 4, 1).short(), "max abs error 0.25", "reqs=3")


# --------------------------------------------------------------------------
# RELEASE-RECAPTURE
# --------------------------------------------------------------------------
def test_release_recapture_holds():
    sc = scenario(BASE, *WORKFLOW)
    assert_holds("RELEASE-RECAPTURE", sc, good_trace(sc))


def test_release_recapture_release_keeps_graphs():
    sc = scenario(BASE, cap(), rel())
    t = mutate(good_trace(sc), is_(Release), lambda e: replace(e, graphs_after=3, captured_flag_after=True))
    assert_violates("RELEASE-RECAPTURE", sc, t, "left 3 graph(s)", "left the manager marked captured")


def test_release_recapture_replays_old_graph():
    sc = scenario(BASE, cap(), rel(), cap(), disp(1, 1))
    t = mutate(good_trace(sc), is_(Replay), lambda r: replace(r, graph_from_step=0))
    assert_violates("RELEASE-RECAPTURE", sc, t, "graph from capture step 0", "released at step 1", FD(2, 2, 1).short())


def test_stale_graph_after_recapture_without_release():
    sc = scenario(C(mode=CUDAGraphMode.FULL), cap(), cap(), disp(1, 1))
    t = good_trace(sc)
    t = mutate(t, is_(Replay), lambda r: replace(r, graph_from_step=0))
    assert_violates("RELEASE-RECAPTURE", sc, t, "stale graph from capture step 0", "latest capture was at step 1")


def _served(tokens: list[int], logprobs: list[float], raised: str | None = None) -> dict:
    return {"tokens": {"r0": tokens}, "logprobs": {"r0": logprobs}, "raised": raised}


def test_served_equals_eager_names_other_tokens_wider_log_probabilities_and_what_graphs_alone_raise():
    from cgsim.properties.lifecycle import LOGPROB_TOLERANCE, served_violations

    eager = _served([5, 6], [-1.0, -2.0])
    assert served_violations(_served([5, 6], [-1.0, -2.0 - LOGPROB_TOLERANCE / 2]), eager) == []
    [v] = served_violations(_served([5, 7], [-1.0, -2.0]), eager)
    assert dict(v.facts) == {"request": "r0", "tokens": [5, 7], "eager_tokens": [5, 6]}
    [v] = served_violations(_served([5, 6], [-1.0, -2.5]), eager)
    assert dict(v.facts)["logprob_difference"] == 0.5
    [v] = served_violations(_served([], [], raised="RuntimeError: boom"), eager)
    assert dict(v.facts) == {"raised": "RuntimeError: boom"}
    # Raising eager too says nothing about the graphs.
    assert served_violations(_served([], [], raised="E"), _served([], [], raised="E")) == []


def test_served_equals_eager_names_the_same_tokens_given_in_other_steps():
    """Speculative decoding: the same tokens, but other drafts accepted (the
    draft model's graphs did not draft as eager did)."""
    from cgsim.properties.lifecycle import served_violations

    eager = {**_served([5, 6, 7], [-1.0] * 3), "per_step": {"r0": [1, 2]}}
    assert served_violations({**_served([5, 6, 7], [-1.0] * 3), "per_step": {"r0": [1, 2]}}, eager) == []
    [v] = served_violations({**_served([5, 6, 7], [-1.0] * 3), "per_step": {"r0": [1, 1, 1]}}, eager)
    assert dict(v.facts) == {"request": "r0", "per_step": [1, 1, 1], "eager_per_step": [1, 2]}
    assert "other drafts accepted" in v.message
    # A run recorded without steps (an older finding) is judged on its tokens alone.
    assert served_violations(_served([5, 6, 7], [-1.0] * 3), eager) == []


def test_served_equals_eager_names_the_first_step_drafted_otherwise():
    """Speculative decoding: the same tokens, but the draft model's graphs
    drafted other tokens than eager (greedy verification hides it in the
    output; the user pays in acceptance)."""
    from cgsim.properties.lifecycle import changes_output, served_violations

    eager = {**_served([5, 6], [-1.0] * 2), "drafts": {"r0": [[9, 9], [3, 4]]}}
    assert served_violations({**_served([5, 6], [-1.0] * 2), "drafts": {"r0": [[9, 9], [3, 4]]}}, eager) == []
    [v] = served_violations({**_served([5, 6], [-1.0] * 2), "drafts": {"r0": [[9, 9], [3, 0]]}}, eager)
    assert dict(v.facts) == {"request": "r0", "drafts": [3, 0], "eager_drafts": [3, 4], "draft_step": 2}
    assert not changes_output(v)  # the user gets eager's tokens; only the acceptance suffers
    [v] = served_violations({**_served([5, 7], [-1.0] * 2), "drafts": {"r0": [[9, 9], [3, 0]]}}, eager)
    assert changes_output(v)
