"""Run one agreement-corpus entry (JSON on stdin) on a backend and print what
was observed as JSON.  The agreement test runs the cuda side in a fresh process
per entry: a device-side assert poisons a CUDA context for good, and one
mutant's illegal access must not fail every later entry."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


def _digest(sweep) -> str:
    import hashlib

    text = json.dumps([[b.to_json(), d.to_json()] for b, d in zip(sweep.batches, sweep.descs)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _decisions(trace) -> dict:
    return {
        "dispatch": [[e.step, e.desc.to_json()] for e in trace.events if e.kind == "dispatch"],
        # Every decision of every dispatch sweep, as one digest per sweep.
        "sweeps": [[e.step, _digest(e)] for e in trace.events if e.kind == "sweep"],
        "outputs": {str(k): v.tolist() for k, v in trace.outputs.items()},
    }


def observe(entry: dict, backend: str) -> dict:
    from cgsim.properties import check_scenario
    from cgsim.runner import run_scenario
    from cgsim.scenario import Scenario

    scenario = Scenario.from_json(entry["scenario"])
    trace = run_scenario(scenario, entry["target"], backend, timeout=600)
    verdict = check_scenario(scenario, trace)
    return {
        "violations": sorted({v.property for v in verdict.violations}),
        "messages": [f"{v.property}: {v.message}" for v in verdict.violations],
        **_decisions(trace),
        # The other managers the target drove (draft runners): their decisions and replayed rows too.
        "managers": {name: _decisions(sub) for name, sub in sorted(trace.managers.items())},
        "unsupported": trace.unsupported,
    }


if __name__ == "__main__":
    print(json.dumps(observe(json.load(sys.stdin), sys.argv[1])))
