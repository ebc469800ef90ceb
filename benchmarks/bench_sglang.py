"""The sglang target's fuzzing speed, and how fast Hypothesis finds each sglang mutant.

    VENV/bin/python benchmarks/bench_sglang.py [--seeds 5] [--max-examples 400] [--examples 200]

Run in the sglang environment (scripts/install_sglang.sh).  In one run, one
core (``torch.set_num_threads(1)``), ``fuzz.strategies.scenarios(ruleset="sglang")``
(what a campaign against the target draws), generate phase only, no database:

- throughput: ``--examples`` scenarios against ``sglang``, each run on the mock
  and judged with every property; scenarios per second = examples / wall time;
- detection: for each mutant and each of ``--seeds`` seeds, the examples and
  seconds until the first scenario where the mutant's ``caught_by`` property
  fails (findings the clean sglang also has do not count); at most
  ``--max-examples`` per seed.  Medians over the seeds that found it.

sglang's import and warm-up (check_environment) happen before any clock
starts.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as seed_dec  # noqa: E402

from cgsim.properties import check_scenario  # noqa: E402
from cgsim.runner import run_scenario  # noqa: E402
from cgsim.targets import get_target  # noqa: E402
from fuzz.strategies import scenarios  # noqa: E402


class _Found(Exception):
    pass


def _settings(n: int) -> settings:
    return settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))


def throughput(n: int) -> tuple[int, float]:
    count = [0]

    @_settings(n)
    @given(scenarios(ruleset="sglang"))
    def body(sc):
        check_scenario(sc, run_scenario(sc, target="sglang", timeout=120))
        count[0] += 1

    t = time.perf_counter()
    body()
    return count[0], time.perf_counter() - t


def detect(name: str, prop: str, seed: int, limit: int) -> tuple[int, float] | None:
    count = [0]

    @seed_dec(seed)
    @_settings(limit)
    @given(scenarios(ruleset="sglang"))
    def body(sc):
        count[0] += 1
        verdict = check_scenario(sc, run_scenario(sc, target=f"sglang-mutant:{name}", timeout=120))
        if prop in {v.property for v in verdict.violations}:
            raise _Found()

    t = time.perf_counter()
    try:
        body()
    except _Found:
        return count[0], time.perf_counter() - t
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-examples", type=int, default=400)
    ap.add_argument("--examples", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    get_target("sglang").check_environment()
    from cgsim.targets.sglang.mutants import MUTANTS

    n, secs = throughput(a.examples)
    print(f"throughput: {n} scenarios in {secs:.1f} s = {n / secs:.2f} scenarios/s (sglang, mock, 1 core)")
    print("| mutant | caught by | found in | median examples | median s |")
    print("|---|---|---:|---:|---:|")
    for name, m in MUTANTS.items():
        runs = [r for r in (detect(name, m.caught_by, s, a.max_examples) for s in range(a.seeds)) if r is not None]
        med = (f"{statistics.median(r[0] for r in runs):g} | {statistics.median(r[1] for r in runs):.1f}"
               if runs else "- | -")
        print(f"| {name} | {m.caught_by} | {len(runs)}/{a.seeds} | {med} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
