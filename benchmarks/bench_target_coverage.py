"""What measuring vLLM's CUDA-graph modules (a campaign's target_coverage)
costs a scenario: the same scenarios run without coverage, traced the whole
time (coverage.py started once, as a worker did before), and traced only
inside the adapter's calls into the manager (``vllm_coverage.measuring``, what
a worker does now), interleaved; the lines each way executed must agree.

    python benchmarks/bench_target_coverage.py [--examples 300] [--repeat 3]

Needs an interpreter where vLLM and coverage.py import.  CPU time of this
process; prints the median over ``--repeat`` rounds of each way's total and
its ratio to the run without coverage.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


def _scenarios(n: int) -> list:
    from hypothesis import HealthCheck, Phase, given, settings

    from cgsim.targets import get_target
    from fuzz.strategies import scenarios

    t = get_target("vllm")
    out: list = []

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=(Phase.generate,), derandomize=True)
    @given(scenarios(ruleset=t.default_ruleset(), engine_sizes=t.drawing.engine_capture_sizes,
                     refusal=t.drawing.unsupported_reason))
    def collect(s):
        out.append(s)

    collect()
    return out


def _executed(cov, files: list[str]) -> set[tuple[str, int]]:
    data = cov.get_data()
    return {(f, n) for f in files for n in (data.lines(f) or ())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    import coverage

    from cgsim.properties import check_scenario
    from cgsim.runner import run_scenario
    from cgsim.targets import get_target
    from cgsim.targets.vllm import coverage as vllm_coverage

    get_target("vllm").prepare_environment()
    scenarios = _scenarios(args.examples)
    pkg = vllm_coverage._package_dir()
    files = vllm_coverage.module_files(pkg)
    include = [os.path.join(pkg, p) for p in vllm_coverage.MODULES]

    def run_all() -> float:
        t0 = time.process_time()
        for s in scenarios:
            check_scenario(s, run_scenario(s, target="vllm"))
        return time.process_time() - t0

    def new_cov():
        cov = coverage.Coverage(data_file=os.path.join(tempfile.mkdtemp(), ".coverage"), include=include,
                                config_file=False)
        cov.set_option("run:disable_warnings", ["no-data-collected", "module-not-measured"])
        return cov

    times: dict[str, list[float]] = {"none": [], "everywhere": [], "inside calls": []}
    lines: dict[str, set] = {}
    run_all()  # warm: first-use costs of vLLM and torch
    for _ in range(args.repeat):
        times["none"].append(run_all())
        cov = new_cov()
        cov.start()
        try:
            times["everywhere"].append(run_all())
        finally:
            cov.stop()
        lines["everywhere"] = _executed(cov, files)
        cov = new_cov()
        vllm_coverage._cov = cov
        try:
            times["inside calls"].append(run_all())
        finally:
            vllm_coverage._cov = None
        lines["inside calls"] = _executed(cov, files)
    base = statistics.median(times["none"])
    print(f"{len(scenarios)} scenarios on the vLLM target, CPU s (median of {args.repeat}):")
    for way, ts in times.items():
        m = statistics.median(ts)
        print(f"  coverage {way:13s} {m:7.2f} s  x{m / base:.2f}")
    same = lines["everywhere"] == lines["inside calls"]
    print(f"  lines executed: everywhere {len(lines['everywhere'])}, inside calls {len(lines['inside calls'])}"
          f" ({'the same' if same else 'DIFFERENT'})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
