"""Scenarios per second per core on the CPU mock (or on a GPU), against a baseline commit.

    python benchmarks/bench_throughput.py [--baseline f22a9c1 | --baseline-tree DIR] [--sizes 64,512]
                                          [--examples 300] [--repeats 3] [--backend mock|cuda] [--json FILE]

One run measures both trees, each in its own child process (``PYTHONPATH``
set to the tree, one torch thread), interleaved ``--repeats`` times (best of
the repeats per tree):

- same scenarios: ``--examples`` scenarios of
  ``fuzz.strategies.scenarios(max_size=N)`` are drawn once, by the
  baseline's strategies (derandomized, ci profile, generate phase only), and
  written to JSON; each tree then runs every one of them on the reference
  target and the mock and checks it with every property
  (``run_scenario`` + ``check_scenario``; the dispatch sweep is part of
  that wherever the tree has one).  Scenarios/s = scenarios / CPU seconds
  of the loop.
- generation: the same Hypothesis test with an empty body, each tree with
  its own strategies: CPU ms per drawn scenario.
- end to end: the same Hypothesis test with run + check in the body, each
  tree with its own strategies (the scenarios are the same where the
  strategies draw the same): what a campaign worker gets per core.

CPU time (``time.process_time``) rather than wall time, because the
machines this runs on are shared; wall seconds are printed too.  Ratios are
this tree over the baseline.  The baseline tree is made with ``git archive``
of ``--baseline`` into a temporary directory unless ``--baseline-tree``
names one.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
# The children's backend.  On cuda the device's time counts too, so scenarios/s
# is over wall time there (the GPU machine is not shared).
BACKEND = os.environ.get("CGSIM_BENCH_BACKEND", "mock")
TIME_KEY = "wall_s" if BACKEND == "cuda" else "cpu_s"

# ----------------------------------------------------------------------------- child


def _child(mode: str, max_size: int, examples: int, path: str) -> dict:
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    from hypothesis import Phase, given, settings

    # Registers dev / ci / nightly: cgsim.profiles, or fuzz/profiles.py in older
    # trees (checked on disk: an editable install of another tree would
    # otherwise fill in the missing module from there).
    if os.path.exists(os.path.join("cgsim", "profiles.py")):
        import cgsim.profiles  # noqa: F401
    else:
        import fuzz.profiles  # noqa: F401
    from cgsim.properties import check_scenario
    from cgsim.runner import run_scenario
    from cgsim.scenario import Scenario
    from fuzz.strategies import scenarios

    torch.set_num_threads(1)
    _warm(run_scenario, check_scenario)
    hyp = settings(settings.get_profile("ci"), database=None, max_examples=examples, derandomize=True,
                   phases=(Phase.generate,), print_blob=False, deadline=None)
    if mode == "draw":
        drawn: list = []

        @hyp
        @given(scenarios(max_size=max_size))
        def draw(scenario):
            drawn.append(scenario.to_json())

        draw()
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(drawn, fh)
        return {"scenarios": len(drawn)}
    if mode == "run":
        with open(path, encoding="utf-8") as fh:
            loaded = [Scenario.from_json(d) for d in json.load(fh)]
        c0, w0 = time.process_time(), time.perf_counter()
        for sc in loaded:
            check_scenario(sc, run_scenario(sc, target="reference", backend=BACKEND))
        return {"scenarios": len(loaded), "cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0}
    calls = [0]

    @hyp
    @given(scenarios(max_size=max_size))
    def test(scenario):
        calls[0] += 1
        if mode == "e2e":
            check_scenario(scenario, run_scenario(scenario, target="reference", backend=BACKEND))

    c0, w0 = time.process_time(), time.perf_counter()
    test()
    return {"scenarios": calls[0], "cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0}


def _warm(run_scenario, check_scenario) -> None:
    # Lazy imports and the first capture in the process are not per-scenario time.
    from cgsim.config import ManagerConfig
    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario, Step

    for mode in ("FULL_AND_PIECEWISE", "PIECEWISE"):
        sc = Scenario(config=ManagerConfig(mode=mode, capture_sizes=(2, 4), breakable=mode == "PIECEWISE"),
                      steps=(Step.capture(), Step.dispatch(Batch((1, 1))), Step.dispatch(Batch((3,)))),
                      ruleset="pr48822")
        check_scenario(sc, run_scenario(sc, target="reference", backend=BACKEND))


# ---------------------------------------------------------------------------- parent


def _spawn(tree: str, mode: str, max_size: int, examples: int, path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--max-size", str(max_size),
           "--examples", str(examples), "--path", path]
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench_throughput: the {mode} child in {tree} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _describe(tree: str) -> str:
    try:
        return subprocess.run(["git", "-C", tree, "log", "-1", "--format=%h %s"], capture_output=True, text=True,
                              check=True).stdout.strip()[:72]
    except (OSError, subprocess.CalledProcessError):
        return "(not a git checkout)"


def _archive(rev: str, dest: str) -> None:
    try:
        data = subprocess.run(["git", "-C", TREE, "archive", rev], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"bench_throughput: cannot export baseline {rev!r} with git archive ({e}); "
                 "pass --baseline-tree DIR with a checkout of it instead")
    subprocess.run(["tar", "-x", "-C", dest], input=data, check=True)


def _best(results: list[dict]) -> dict:
    return min(results, key=lambda r: r[TIME_KEY])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="f22a9c1", help="baseline commit (exported with git archive)")
    ap.add_argument("--baseline-tree", default=None, help="use this checkout of the baseline instead")
    ap.add_argument("--sizes", default="64,512", help="max_size values of scenarios(), comma-separated")
    ap.add_argument("--examples", type=int, default=300, help="scenarios per measurement")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats per tree (best counts)")
    ap.add_argument("--skip", default="", help="comma-separated measurements to skip: gen, e2e")
    ap.add_argument("--json", default=None, help="also write the numbers to FILE")
    ap.add_argument("--backend", default="mock", choices=("mock", "cuda"),
                    help="cuda: the same scenarios on a GPU (wall time; both trees must run there)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--max-size", type=int, default=64, help=argparse.SUPPRESS)
    ap.add_argument("--path", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.max_size, args.examples, args.path)))
        return 0

    global BACKEND, TIME_KEY
    BACKEND = os.environ["CGSIM_BENCH_BACKEND"] = args.backend
    TIME_KEY = "wall_s" if BACKEND == "cuda" else "cpu_s"
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    tmp = tempfile.TemporaryDirectory(prefix="cgsim-bench-")
    base = args.baseline_tree
    if base is None:
        base = os.path.join(tmp.name, "baseline")
        os.makedirs(base)
        _archive(args.baseline, base)
        base_label = f"{args.baseline} (git archive)"
    else:
        base = os.path.abspath(base)
        base_label = _describe(base)
    trees = {"baseline": base, "this tree": TREE}
    load0 = os.getloadavg()[0]
    print(f"host: {os.cpu_count()} CPUs, load {load0:.2f}, python {platform.python_version()}; "
          f"{args.examples} scenarios per measurement, best of {args.repeats}, "
          f"{'wall time on cuda' if BACKEND == 'cuda' else 'CPU time on the mock'}, 1 thread")
    print(f"baseline:  {base_label}")
    print(f"this tree: {_describe(TREE)}", flush=True)
    out: dict = {"examples": args.examples, "repeats": args.repeats, "baseline": base_label, "sizes": {}}
    t_start = time.perf_counter()
    for size in sizes:
        corpus = os.path.join(tmp.name, f"scenarios-{size}.json")
        _spawn(base, "draw", size, args.examples, corpus)
        row: dict = {}
        modes = ["run"] + [m for m in ("gen", "e2e") if m not in skip]
        for mode in modes:
            results: dict[str, list[dict]] = {k: [] for k in trees}
            for _ in range(args.repeats):
                for name, tree in trees.items():
                    results[name].append(_spawn(tree, mode, size, args.examples, corpus))
            row[mode] = {k: _best(v) for k, v in results.items()}
        out["sizes"][size] = row
        _print_size(size, row)
    load1 = os.getloadavg()[0]
    print(f"\nwhole run {time.perf_counter() - t_start:.0f} s; load average {load0:.2f} at start, {load1:.2f} at end")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    tmp.cleanup()
    return 0


def _print_size(size: int, row: dict) -> None:
    def per_s(r: dict) -> float:
        return r["scenarios"] / r[TIME_KEY]

    print(f"\nscenarios(max_size={size})")
    print("| measurement | baseline | this tree | ratio |")
    print("|---|---:|---:|---:|")
    b, t = row["run"]["baseline"], row["run"]["this tree"]
    print(f"| run + check, same {b['scenarios']} scenarios (scenarios/s{' per core' if BACKEND == 'mock' else ''}) | {per_s(b):.1f} | {per_s(t):.1f} | "
          f"**{per_s(t) / per_s(b):.1f}x** |")
    if "gen" in row:
        b, t = row["gen"]["baseline"], row["gen"]["this tree"]
        gb, gt = 1000 * b[TIME_KEY] / b["scenarios"], 1000 * t[TIME_KEY] / t["scenarios"]
        print(f"| Hypothesis generation (CPU ms per scenario) | {gb:.2f} | {gt:.2f} | {gb / gt:.1f}x faster |")
    if "e2e" in row:
        b, t = row["e2e"]["baseline"], row["e2e"]["this tree"]
        print(f"| end to end: generate + run + check (scenarios/s{' per core' if BACKEND == 'mock' else ''}) | {per_s(b):.1f} | {per_s(t):.1f} | "
              f"**{per_s(t) / per_s(b):.1f}x** |")
    walls = ", ".join(f"{k} {row['run'][k]['wall_s']:.1f} s" for k in ("baseline", "this tree"))
    print(f"(run + check wall time: {walls})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
