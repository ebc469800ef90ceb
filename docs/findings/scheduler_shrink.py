"""What vLLM's own scheduler hands the model runner after a batch shrinks,
under finding 6's launch (docs/findings.md #6), and which graph vLLM's
CUDA-graph manager replays for each of those batches.

    PYTHONPATH=. python docs/findings/scheduler_shrink.py [FINDING.json]    # in a venv with vLLM

As many requests as the launch's max_num_seqs decode together; all but
one finish in the same step, and the last one verifies alone the drafts
the schedule chose for the full batch (under #6's launch: two requests
draft no token, so the lone request's decode is one token long, which
the schedule's length for one request, one draft, does not predict).  Each
batch is then
dispatched by the manager vLLM builds from the same launch (after its
capture), as the model runner would; the script prints the graph.  Exit 0,
or 2 where the manager did not dispatch them.
"""

from __future__ import annotations

import json
import os
import sys

from cgsim.config import ManagerConfig
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step
from cgsim.spec.scheduler import decode_query_len
from cgsim.targets.vllm.compat import require_vllm
from cgsim.targets.vllm.engine import reach
from cgsim.targets.vllm.scheduling import RequestSpec, Workload, run_scheduler
from cgsim.trace import Dispatch, Error

HERE = os.path.dirname(os.path.abspath(__file__))
FINDING = os.path.join(HERE, "capture-useful-a02a072c44.json")


def shrinking_trace(num_requests: int) -> tuple[RequestSpec, ...]:
    """5-token prompts; one request of 12 output tokens, the others of 3
    (with every draft accepted they finish in the same step)."""
    return (RequestSpec(0, 5, 12),) + tuple(RequestSpec(0, 5, 3) for _ in range(num_requests - 1))


def main(argv: list[str]) -> int:
    path = argv[0] if argv else FINDING
    with open(path, encoding="utf-8") as fh:
        scenario = json.load(fh)["scenario"]
    caps = require_vllm()
    # The manager config this tree builds from the finding's launch (0.34+: decode graphs by request count).
    config = reach(ManagerConfig.from_json(scenario["config"]))
    trace = shrinking_trace(config.max_num_reqs)
    runs = {mode: run_scheduler(config, Workload(trace, acceptance=1.0, async_scheduling=mode == "async"))
            for mode in ("sync", "async")}
    batches = list(dict.fromkeys(b.batch() for run in runs.values() for b in run.batches))
    steps = (Step.capture(),) + tuple(Step.dispatch(b) for b in batches)
    served = run_scenario(Scenario(config, steps, ruleset=caps.ruleset), "vllm", "mock")
    graph = {e.batch: e.desc for e in served.events if isinstance(e, Dispatch)}
    if len(graph) < len(batches):
        errors = [e.message for e in served.events if isinstance(e, Error)]
        print(f"vLLM {caps.version}'s manager did not dispatch every batch: "
              f"{served.unsupported or (errors[0] if errors else 'no dispatch')}")
        return 2
    print(f"vLLM {caps.version}: {runs['sync'].launch}")
    for mode, run in runs.items():
        print(f"\n{run.scheduler} ({mode} scheduling): step, query lengths, drafts verified, "
              "the schedule's length for that many requests, the graph vLLM replays")
        for b in run.batches:
            kind = "prefill" if b.batch().has_prefill else "decode"
            print(f"  {b.step:3d}  {kind:7s} {str(list(b.query_lens)):10s} drafts {str(list(b.draft_lens)):8s} "
                  f"schedule {decode_query_len(config, b.num_reqs)}  ->  {graph[b.batch()].short()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
