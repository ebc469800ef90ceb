"""Campaign throughput (1 vs 2 workers) and reporting overhead vs bare Hypothesis.

    python benchmarks/bench_campaign.py [--budget 20] [--examples 150] [--target reference] [--json out.json]

What is measured
- throughput: ``run_campaign`` on the mock for ``--budget`` seconds with 1 and
  with 2 workers; scenarios per second over the campaign's wall time (worker
  start-up and report writing included).  Goal: 2 workers >= 1.8x 1 worker.
- overhead: the same ``--examples`` scenarios (same strategy, same seed) run
  (a) as a bare Hypothesis test calling run_scenario + check_scenario and
  (b) as a 1-worker campaign with ``--max-examples``; the difference is what
  the campaign adds (process start, in-flight scenario file, counters,
  coverage, the per-scenario timer, summary/JUnit/Markdown).

Both use a pipeline that runs and checks every scenario in full but drops
the violations, so no run spends its time shrinking a finding and the two
sides do identical work per scenario.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from cgsim.observe import RunnerPipeline  # noqa: E402
from cgsim.properties import Verdict  # noqa: E402


class NoFindingPipeline(RunnerPipeline):
    """The real pipeline, with violations dropped after checking."""

    def judge(self, scenario, trace):
        return Verdict((), super().judge(scenario, trace).checked)


def throughput(target: str, workers: int, budget: float, seed: int) -> dict:
    from fuzz.campaign import CampaignOptions, run_campaign

    import resource

    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        result = run_campaign(
            CampaignOptions(target=target, workers=workers, budget_s=budget, seed=seed, report_dir=tmp, quiet=True, shrink_grace_s=0.0, timeout_s=30.0),
            pipeline=NoFindingPipeline(),
        )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    n = result.summary["scenarios"]
    # CPU seconds the workers used: on a machine shared with other jobs this,
    # per scenario, says whether workers cost more each (a harness problem) or
    # just got fewer cores (the machine).
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"workers": workers, "scenarios": n, "wall_s": round(wall, 2), "per_s": round(n / wall, 2), "cpu_s": round(cpu, 2)}


def bare_hypothesis(target: str, examples: int, seed: int) -> dict:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seed_dec

    import torch

    torch.set_num_threads(1)  # as in a campaign worker: the comparison is about the harness, not threads
    from fuzz.strategies import scenarios

    pipe = NoFindingPipeline()
    strategy = scenarios(ruleset=None)
    count = [0]

    @settings(max_examples=examples, database=None, deadline=None, suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate))
    @seed_dec(seed)
    @given(strategy)
    def test(scenario):
        trace = pipe.run(scenario, target, "mock", 30.0)
        pipe.judge(scenario, trace)
        count[0] += 1

    t0 = time.perf_counter()
    test()
    wall = time.perf_counter() - t0
    return {"scenarios": count[0], "wall_s": round(wall, 2), "per_scenario_ms": round(1000 * wall / max(1, count[0]), 2)}


def campaign_fixed(target: str, examples: int, seed: int) -> dict:
    from fuzz.campaign import CampaignOptions, run_campaign

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = run_campaign(
            CampaignOptions(target=target, workers=1, budget_s=3600.0, seed=seed, report_dir=tmp, quiet=True, max_examples=examples, chunk_examples=examples, timeout_s=30.0),
            pipeline=NoFindingPipeline(),
        )
        wall = time.perf_counter() - t0
    n = result.summary["scenarios"]
    return {"scenarios": n, "wall_s": round(wall, 2), "per_scenario_ms": round(1000 * wall / max(1, n), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--examples", type=int, default=150)
    ap.add_argument("--target", default="reference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--more-workers", default="", help="extra worker counts to measure, e.g. 4,8")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="seeds per worker count (scenario cost varies by seed stream)")
    args = ap.parse_args()

    import cgsim.profiles  # noqa: F401
    import cgsim.runner  # noqa: F401  (torch imported once, before workers fork)

    print(f"host: {os.cpu_count()} CPUs, python {sys.version.split()[0]}")

    def measure(n: int) -> dict:
        runs = [throughput(args.target, n, args.budget, args.seed + k) for k in range(args.repeats)]
        total = sum(r["scenarios"] for r in runs)
        wall = sum(r["wall_s"] for r in runs)
        cpu = sum(r["cpu_s"] for r in runs)
        return {"workers": n, "runs": runs, "scenarios": total, "wall_s": round(wall, 2), "per_s": round(total / wall, 2),
                "cpu_ms_per_scenario": round(1000 * cpu / max(1, total), 1), "cores_used": round(cpu / wall, 2)}

    one = measure(1)
    two = measure(2)
    ratio = two["per_s"] / one["per_s"] if one["per_s"] else float("nan")
    for r in (one, two):
        print(
            f"throughput {r['workers']:2d} worker(s): {r['scenarios']} scenarios / {r['wall_s']}s = {r['per_s']}/s  "
            f"({args.repeats} seeds; {r['cpu_ms_per_scenario']} CPU-ms/scenario, {r['cores_used']} cores busy)"
        )
    print(f"scaling 2/1 workers  : {ratio:.2f}x (goal >= 1.8x)")
    more = []
    for n in [int(x) for x in args.more_workers.split(",") if x.strip()]:
        r = measure(n)
        more.append(r)
        print(
            f"throughput {n:2d} workers: {r['scenarios']} scenarios / {r['wall_s']}s = {r['per_s']}/s ({r['per_s'] / one['per_s']:.2f}x; "
            f"{r['cpu_ms_per_scenario']} CPU-ms/scenario, {r['cores_used']} cores busy)"
        )
    if args.skip_overhead:
        bare = camp = None
        overhead = None
    else:
        bare, camp, overhead = overhead_runs(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"one": one, "two": two, "more": more, "ratio": ratio, "bare": bare, "campaign": camp, "overhead_pct": overhead}, fh, indent=2)
    return 0


def overhead_runs(args: argparse.Namespace) -> tuple:
    bare_hypothesis(args.target, 5, args.seed + 99)  # warm-up: lazy imports, first capture in this process
    bare = bare_hypothesis(args.target, args.examples, args.seed)
    camp = campaign_fixed(args.target, args.examples, args.seed)
    overhead = (camp["wall_s"] - bare["wall_s"]) / bare["wall_s"] * 100 if bare["wall_s"] else float("nan")
    print(f"bare Hypothesis      : {bare['scenarios']} scenarios in {bare['wall_s']}s ({bare['per_scenario_ms']} ms/scenario)")
    print(f"campaign, 1 worker   : {camp['scenarios']} scenarios in {camp['wall_s']}s ({camp['per_scenario_ms']} ms/scenario)")
    print(f"reporting overhead   : {overhead:+.1f}% wall time")
    return bare, camp, overhead


if __name__ == "__main__":
    sys.exit(main())
