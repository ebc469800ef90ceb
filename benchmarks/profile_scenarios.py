"""Where a fuzzed scenario's time goes: cProfile of generate + run + check.

    python benchmarks/profile_scenarios.py [--examples 300] [--max-size 64] [--top 25] [--out FILE.pstats]

Draws ``--examples`` scenarios of ``fuzz.strategies.scenarios(max_size=N)``
in one derandomized ``@given`` test (ci profile settings, no database,
generate phase only, as bench_fuzz's throughput line), runs each on the
reference target and the CPU mock and checks it with every property, all
under cProfile, on one thread.  Prints the split of wall time between the
runner (``run_scenario``), the property checks (``check_scenario``) and the
rest (Hypothesis generation and its bookkeeping), the number of aten ops the
mock's capture mode saw, and the top functions by internal time.

Works from any checkout with the same entry points (run it with
``PYTHONPATH=<checkout>`` to profile another commit).  Not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import warnings

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from hypothesis import Phase, given, settings  # noqa: E402

import cgsim.profiles  # noqa: E402,F401  (registers dev / ci / nightly)
from cgsim.properties import check_scenario  # noqa: E402
from cgsim.runner import run_scenario  # noqa: E402
from fuzz.strategies import scenarios  # noqa: E402


def _cumulative(stats: pstats.Stats, name: str, file_part: str) -> float:
    total = 0.0
    for (filename, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        if func == name and file_part in filename:
            total += ct
    return total


def _dispatch_count(stats: pstats.Stats) -> int:
    for (filename, _line, func), (_cc, nc, _tt, _ct, _callers) in stats.stats.items():
        if func == "__torch_dispatch__" and "cuda_mock" in filename:
            return nc
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=300)
    ap.add_argument("--max-size", type=int, default=64)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None, help="write the raw pstats here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    calls = [0]

    @settings(settings.get_profile("ci"), database=None, max_examples=args.examples, derandomize=True,
              phases=(Phase.generate,), print_blob=False, deadline=None)
    @given(scenarios(max_size=args.max_size))
    def test(scenario):
        check_scenario(scenario, run_scenario(scenario, target="reference", backend="mock"))
        calls[0] += 1

    # Warm: lazy imports and first-capture costs are not per-scenario time.
    from cgsim.config import ManagerConfig
    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario, Step

    run_scenario(Scenario(config=ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(2,)),
                          steps=(Step.capture(), Step.dispatch(Batch((1, 1)))), ruleset="pr48822"))

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    test()
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    total = stats.total_tt
    run = _cumulative(stats, "run_scenario", "cgsim/runner.py")
    check = _cumulative(stats, "check_scenario", "cgsim/properties")
    rest = total - run - check
    n = calls[0]
    print(f"{n} scenarios of scenarios(max_size={args.max_size}) in {wall:.1f} s wall, {total:.1f} s profiled "
          f"({n / total:.1f}/s profiled); torch {torch.__version__}, 1 thread, load {os.getloadavg()[0]:.2f}")
    print(f"  runner (run_scenario)       {run:7.1f} s  {100 * run / total:5.1f} %")
    print(f"  checks (check_scenario)     {check:7.1f} s  {100 * check / total:5.1f} %")
    print(f"  generation and the rest     {rest:7.1f} s  {100 * rest / total:5.1f} %")
    print(f"  ops through the capture mode's __torch_dispatch__: {_dispatch_count(stats)}")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    if args.out:
        stats.dump_stats(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
