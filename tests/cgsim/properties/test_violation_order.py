"""The judge gives its violations in one order in every process.

Sets of descriptors iterate in an order that changes from one process to the
next (hash randomisation; a graph mode hashes by identity), so a property that
walks one must sort it first: otherwise the same run's violations, and the
first of them that becomes the finding, differ between two runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# A reference run whose capture also stored FULL graphs no batch of its
# config can use (micro-batched, the config has no micro-batching): several
# CAPTURE-USEFUL violations, judged in a fresh process.
_JUDGE = textwrap.dedent("""
    import json
    from cgsim.config import ManagerConfig
    from cgsim.descriptors import BatchDescriptor
    from cgsim.modes import CUDAGraphMode
    from cgsim.observe import RunnerPipeline
    from cgsim.properties import check_scenario
    from cgsim.scenario import Scenario, Step
    from cgsim.trace import CaptureDone, GraphStored, Trace

    cfg = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4, 8, 16), max_num_reqs=4, attention_support="ALWAYS")
    scenario = Scenario(cfg, (Step.capture(),), ruleset="pr48822")
    trace = RunnerPipeline().run(scenario, "reference", "mock", None)
    done = next(i for i, e in enumerate(trace.events) if isinstance(e, CaptureDone))
    dead = [GraphStored(BatchDescriptor(CUDAGraphMode.FULL, n, num_reqs=min(n, 4), num_ubatches=2), 0)
            for n in (2, 4, 8, 16)]
    events = trace.events[:done] + dead + trace.events[done:]
    verdict = check_scenario(scenario, Trace.from_header(trace.header, events, trace.metadata))
    print(json.dumps([[v.property, v.message, v.step, v.record()] for v in verdict.violations]))
""")


def _judge(hash_seed: str) -> list:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _JUDGE], cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_violations_come_in_the_same_order_under_every_hash_seed():
    runs = [_judge(seed) for seed in ("0", "1", "2", "3")]
    useless = [v for v in runs[0] if v[0] == "CAPTURE-USEFUL"]
    assert len(useless) == 4, runs[0]
    for other in runs[1:]:
        assert other == runs[0]
    # by mode, then largest first (desc_sort_key)
    assert [v[3]["graph"]["num_tokens"] for v in useless] == [16, 8, 4, 2]
