"""Hand-written scenarios for the vLLM findings in docs/findings.md.

    PYTHONPATH=. python docs/findings/handwritten.py [--write] [NAME ...]   # in a venv with vLLM

Runs each scenario on ``--target vllm`` (the installed release) and prints what
the properties say.  ``--adopt F.json ...`` re-judges fuzzer findings under
ruleset vllm-0.32 (the fuzzer also draws pr48822 scenarios, whose design vLLM
deliberately does not follow) instead.  With --write, a scenario that violates its expected
property is saved as a finding JSON next to this script, so that
``python -m fuzz replay docs/findings/<id>.json`` re-runs it.
"""

from __future__ import annotations

import os
import sys

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.observe import observe
from cgsim.report.findings import write_finding
from cgsim.scenario import Scenario, Step

HERE = os.path.dirname(os.path.abspath(__file__))
C, R = Step.capture(), Step.release()


def D(*lens: int, prefill: bool = False, **kw) -> Step:
    return Step.dispatch(Batch(tuple(lens), has_prefill=prefill, **kw))


# name -> (expected property, scenario)
SCENARIOS: dict[str, tuple[str, Scenario]] = {
    # 1. nearest-group candidate lists under dynamic SD: 3x2 decode goes PIECEWISE(8)
    "dynsd-dispatch-priority": ("DISPATCH-PRIORITY", Scenario(
        ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3,
                      spec_schedule=((1, 2, 2), (3, 4, 1))),
        (C, D(2, 2, 2)), ruleset="vllm-0.32")),
    # 1b. the same with K=4, schedule k in {4, 2}: no scheduled k = K-1, so the draft
    #     decode manager of 0.25-0.31 (finding 3) does not divide by zero while it is
    #     built; its capture still asserts there (k=2: draft length -1), so 1b shows
    #     from 0.32 on
    "dynsd-dispatch-priority-k4": ("DISPATCH-PRIORITY", Scenario(
        ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 10, 16), max_num_reqs=4, decode_query_len=5,
                      spec_schedule=((1, 2, 4), (3, 4, 2))),
        (C, D(3, 3, 3)), ruleset="vllm-0.32")),
    # 5b. 0.28 raw schedule entries past max_num_seqs: K=3, k in {3, 1} (draft lens 1, -1)
    "raw-schedule-lengths-k3": ("DECODE-LENGTHS", Scenario(
        ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=2, decode_query_len=4,
                      spec_schedule=((1, 2, 3), (3, 8, 1))),
        (C, D(4, 4)), ruleset="vllm-0.32")),
    # 2. 0.28 cross-mode candidate lists: 1x2 decode goes PIECEWISE(3) beside FULL(4, r2, u2)
    "cross-mode-candidates": ("DISPATCH-PRIORITY", Scenario(
        ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(3, 4), max_num_reqs=2, decode_query_len=2),
        (C, D(2)), ruleset="vllm-0.32")),
    # 3. draft decode manager (decode_query_len 1) with a scheduled k = K-1: round_up(size, 0)
    "draft-zero-division": ("INIT-TOTAL", Scenario(
        ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4), max_num_reqs=4, decode_query_len=3,
                      spec_schedule=((1, 2, 2), (3, 4, 1))),
        (C,), ruleset="vllm-0.32")),
    # 4. mixed FULL graph captured with max_query_len 1, replays a 3-token prefill
    "full-prefill-max-query-len": ("PAD-CONSISTENT", Scenario(
        ManagerConfig(mode="FULL", capture_sizes=(4,), max_num_reqs=4),
        (C, D(3, prefill=True)), ruleset="vllm-0.32")),
    # 5. 0.28 raw schedule entries: uniform-2 graphs for a schedule that never runs 2 tokens
    #    (K=2 without k=1 in the schedule would be needed to avoid finding 3; K=3 with k in {3, 2})
    "raw-schedule-lengths": ("DECODE-LENGTHS", Scenario(
        ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=2, decode_query_len=4,
                      spec_schedule=((1, 1, 3), (2, 8, 2))),
        (C, D(3, 3)), ruleset="vllm-0.32")),
    # 7. release then capture again
    "release-recapture": ("RELEASE-RECAPTURE", Scenario(
        ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=4),
        (C, D(1), R, C, D(1)), ruleset="vllm-0.32")),
    # 14. 0.21-0.22: the draft prefill manager is handed the one attention state the target
    #     captured with, and warms up and captures each FULL graph with it
    "draft-prefill-warmup-metadata": ("FRESH-METADATA", Scenario(
        ManagerConfig(mode="FULL", capture_sizes=(2,), max_num_reqs=1, decode_query_len=2),
        (C, D(2)), ruleset="vllm-0.21")),
    # 15. breakable PIECEWISE graphs: release, then capture again into the global pool
    #     (torch >= 2.11: the pinned-host allocator still holds the pool id)
    "breakable-recapture-host-pool": ("NO-CRASH", Scenario(
        ManagerConfig(mode="PIECEWISE", capture_sizes=(1,), max_num_reqs=1, breakable=True),
        (C, R, C), ruleset="vllm-0.32")),
    # 8. DBO twin of a mixed FULL descriptor: FULL(16, r1) -> twin uniform 16
    "dbo-twin-capture-useful": ("CAPTURE-USEFUL", Scenario(
        ManagerConfig(mode="FULL", capture_sizes=(16,), max_num_reqs=1, num_ubatches=2, ubatch_threshold=2),
        (C, D(1)), ruleset="vllm-0.32")),
    # 1c. nearest-group candidate lists under DBO, no speculative schedule: a
    #     micro-batched 2x2 decode finds only FULL(6, r4) at 6 tokens (6 is no
    #     multiple of 4 requests: no twin) and runs eagerly, though the twin
    #     FULL(8, r4, u2, ubatches=2) fits it (4 of its 8 tokens: the second
    #     micro-batch is not empty)
    "dbo-nearest-group": ("DISPATCH-PRIORITY", Scenario(
        ManagerConfig(mode="FULL", capture_sizes=(6, 8), max_num_reqs=4, decode_query_len=2, num_ubatches=2,
                      ubatch_threshold=4, attention_support="ALWAYS", attention_split=False,
                      compiled_piecewise=False),
        (C, D(2, 2, num_ubatches=2)), ruleset="vllm-0.32")),
    # 6. dynamic SD: a length drafted at fewer requests than a batch can grow to. K=1 drafts one
    #    token at 1 request and none at 2; a second request joins as a prefill, then both decode
    #    1 token, so FULL(4, r2, u2) (2 requests of 2 tokens) is captured for no batch
    "dynsd-capture-useful-growth": ("CAPTURE-USEFUL", Scenario(
        ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=2, decode_query_len=2,
                      spec_schedule=((1, 1, 1), (2, 2, 0)), attention_support="UNIFORM_BATCH"),
        (C, D(2)), ruleset="vllm-0.32")),
    # 12, reachable: dispatch-roundtrip-2e41bc7df9's scenario with attention split out of
    #     the graph, as vLLM builds FULL_AND_PIECEWISE (splitting_ops [] makes it FULL)
    "uniform-prefill-on-decode-graph": ("DISPATCH-ROUNDTRIP", Scenario(
        ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1,), max_num_reqs=1,
                      attention_support="UNIFORM_SINGLE_TOKEN_DECODE", ubatch_threshold=4),
        (C, D(1, prefill=True)), ruleset="vllm-0.21")),
    # 2, reachable: dispatch-complete-ed6a3d919d's scenario with attention split out of the graph
    "cross-mode-candidates-complete": ("DISPATCH-COMPLETE", Scenario(
        ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(4, 7), max_num_reqs=3, decode_query_len=3,
                      attention_support="UNIFORM_BATCH", ubatch_threshold=4),
        (C, D(1, 1, 3, prefill=True)), ruleset="vllm-0.32")),
}


def adopt(path: str, write: bool) -> None:
    """A fuzzer finding, judged again under ruleset vllm-0.32 (the design every
    release 0.27-0.33 follows); saved here only if it still reproduces."""
    import json  # noqa: PLC0415

    f = json.load(open(path, encoding="utf-8"))
    sj = dict(f["scenario"], ruleset="vllm-0.32")
    sc = Scenario.from_json(sj)
    SCENARIOS[os.path.basename(path)] = (f["property"], sc)
    run_one(os.path.basename(path), write, status=f["status"], run_id=f.get("run_id", ""))


def run_one(name: str, write: bool, status: str = "unshrunk", run_id: str = "") -> None:
    from cgsim.targets.vllm.compat import require_vllm  # noqa: PLC0415

    require_vllm()  # vLLM imported by cgsim first: on cgsim's platform
    import vllm  # noqa: PLC0415

    prop, sc = SCENARIOS[name]
    out = observe(sc, "vllm", "mock", 120)
    seen = out.first(prop)
    others = sorted(set(out.properties) - {prop})
    print(f"[vllm {vllm.__version__}] {name}: {prop} {'VIOLATED' if seen else 'holds'}"
          + (f" (also {', '.join(others)})" if others else ""))
    if seen:
        print(f"    {seen.message}")
    for f in out.findings:
        if f.property != prop and f.property in ("INIT-TOTAL", "NO-CRASH"):
            print(f"    {f.property}: {f.message[:300]}")
    if write and seen:
        from cgsim.targets.vllm import VllmTarget  # noqa: PLC0415

        found = seen.with_(status=status, run_id=run_id or f"handwritten:{name}",
                           extra={"launch": VllmTarget(warm=False).triage.launch(sc)})
        print(f"    wrote {write_finding(HERE, found)}")


def main(argv: list[str]) -> int:
    write = "--write" in argv
    if "--adopt" in argv:
        for path in [a for a in argv if not a.startswith("--")]:
            adopt(path, write)
        return 0
    names = [a for a in argv if not a.startswith("--")] or list(SCENARIOS)
    for name in names:
        run_one(name, write)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
