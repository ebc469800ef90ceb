"""Findings grouped by defect: what a report shows as one card.

A campaign keeps one finding per property (or per property and documented
defect), each shrunk for its own property, so one bug often shows as
several: a range off by one sends a one-token batch eagerly, and that one
batch violates DISPATCH-COMPLETE, -PRIORITY and -ROUNDTRIP.  A card is one
minimal scenario with every property it violates (a finding's ``violates``,
recorded when it was seen), and the findings of those properties that it
stands for; where the target names the documented defect of its findings
(``known_defect``), one card per documented defect.  Grouping changes what
a report shows, never what is found: every finding stays on disk and in
the summary's ``findings``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

__all__ = ["group_defects", "STATUS_RANK", "reached", "MANAGER_LEVEL", "runner_said", "CONFIRMATION"]

# The key of a finding's verdict from the engine's own runner (fuzz.campaign.confirm).
CONFIRMATION = "runner_confirmation"

# Verdicts of the engine's own runner (fuzz.campaign.confirm) that make a
# finding "manager-level only": the runner never builds the graphs it names,
# or the engine refuses its launch.  Never counted as a defect of the engine.
MANAGER_LEVEL = ("absent", "refused")


def reached(entry: dict) -> bool:
    """Whether a finding counts as a defect of the engine: not one the
    engine's runner was asked about and does not build."""
    said = entry.get(CONFIRMATION)
    return not (isinstance(said, dict) and said.get("verdict") in MANAGER_LEVEL)


def runner_said(entry: dict) -> str | None:
    """The engine runner's verdict on a finding in a phrase (None: not asked)."""
    said = entry.get(CONFIRMATION)
    if not isinstance(said, dict):
        return None
    verdict = said.get("verdict")
    where = f"{', '.join(said.get('named') or ())} in its {said.get('manager')} manager"
    if verdict == "confirmed":
        return f"confirmed: the runner built from the launch captures {where}" + _served(said.get("served"))
    if verdict == "no-graph":
        return "not asked: the finding names no graph"
    if verdict == "unasked":  # a budget or a stop, not the environment: a longer run asks
        return f"not asked: {said.get('detail')}"
    if verdict == "served":  # cgsim.served: found by serving the launch through the runner
        return "found by serving the launch through the engine's own model runner" + _served(said.get("served"))
    if verdict == "absent":
        return f"manager-level only: the runner never captures {', '.join(said.get('missing') or ())} ({said.get('detail')})"
    if verdict == "refused":
        return f"manager-level only: the engine refuses the launch ({said.get('detail')})"
    return f"could not be asked ({verdict}: {said.get('detail')})"

def _served(served: Any) -> str:
    """What serving the launch showed, as the tail of the runner's phrase."""
    if not isinstance(served, dict):
        return ""
    if served.get("error"):
        return f"; not served here ({served['error']})"
    if served.get("raised") and served.get("eager_raised"):
        return f"; serving raised with graphs and eager alike: {served['raised']}"
    if served.get("raised"):
        return f"; serving with graphs, the engine raised: {served['raised']}"
    if served.get("differences") and served.get("wrong_output", True):
        return f"; served with graphs, WRONG OUTPUT against eager: {'; '.join(served['differences'])}"
    if served.get("differences"):
        # Greedy verification keeps the tokens: the user pays in accepted drafts (slower decoding).
        return (f"; served with graphs, eager's output but OTHER DRAFTS (fewer accepted, slower): "
                f"{'; '.join(served['differences'])}")
    return f"; served {served.get('requests')} requests with graphs ({served.get('replays')} replays): eager's tokens"


# Which finding stands first for a card: shrunk ones, then the less finished.
STATUS_RANK = {"shrunk": 0, "shrink-interrupted": 1, "shrinking": 2, "pending": 3, "unshrunk": 4, "new": 5}


def _violates(entry: dict) -> set[str]:
    return {entry["property"], *entry.get("violates", ())}


def _order(entry: dict) -> tuple:
    flaky = entry.get("flaky_rate") is not None
    return (flaky, STATUS_RANK.get(entry.get("status", ""), 9), len(json.dumps(entry.get("scenario"), sort_keys=True)),
            entry["id"])


def _card(primary: dict, members: list[dict], properties: Iterable[str], known_defect: str | None) -> dict:
    others = [m for m in members if m is not primary]
    return {"id": primary["id"], "properties": sorted(set(properties)), "known_defect": known_defect,
            "primary": primary["id"], "findings": [primary["id"]] + [m["id"] for m in others]}


def group_defects(entries: list[dict]) -> list[dict]:
    """One card per defect, for the summary's finding ``entries`` (one per
    property): {"id", "properties", "known_defect", "primary", "findings"},
    in the order of their primary findings' entries.

    Findings labelled with a documented defect make one card per label.  Of
    the others, the finding whose scenario violates the properties of the
    most findings still unplaced (the smaller scenario on a tie) makes the
    next card, standing for those findings, until none is left."""
    cards = []
    labelled: dict[str, list[dict]] = {}
    rest = []
    for entry in entries:
        label = entry.get("known_defect")
        (labelled.setdefault(label, []) if label else rest).append(entry)
    for label, members in labelled.items():
        members = sorted(members, key=_order)
        cards.append(_card(members[0], members, set().union(*map(_violates, members)), label))
    while rest:
        def covered(candidate: dict) -> list[dict]:
            return [e for e in rest if e["property"] in _violates(candidate)]

        primary = min(rest, key=lambda c: (-len(covered(c)), _order(c)))
        members = covered(primary)
        cards.append(_card(primary, members, _violates(primary), None))
        rest = [e for e in rest if e not in members]
    position = {e["id"]: i for i, e in enumerate(entries)}
    return sorted(cards, key=lambda c: position[c["primary"]])
