"""Fuzzing speed on the CPU mock, and how fast Hypothesis finds each mutant.

    python benchmarks/bench_fuzz.py [--seeds 10] [--max-examples 500] [--examples 200]
                                    [--mutants a,b] [--markdown FILE]

What is measured, in one run, on one core (``torch.set_num_threads(1)``):

- throughput: ``--examples`` scenarios of ``fuzz.strategies.scenarios(max_size=64)``
  (as tests/fuzz/test_fuzz.py draws them; the ruleset is drawn too) against the
  reference target, each run on the mock and checked with every property, in
  one derandomized ``@given`` test (ci profile settings, no database, generate
  phase only).  Scenarios per second = calls / wall time of the test.
- detection: for each mutant and each of ``--seeds`` seeds (``@seed(s)``,
  ``database=None``, generate phase only: no shrinking), the number of
  examples executed and the wall time until the first scenario with any
  property violation (the test body raises a private exception at once).
  Each mutant is fuzzed with the strategy tests/cgsim/targets/test_mutants.py gives it
  (``FUZZ``: small configs, per-mutant config filters, no release segment
  except for ``captured-flag-kept``).  At most ``--max-examples`` examples per
  seed; a seed that finds nothing counts as "not found".  Medians are over the
  seeds that found the mutant.

Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from hypothesis import Phase, given, settings  # noqa: E402
from hypothesis import seed as seed_dec  # noqa: E402

import cgsim.profiles  # noqa: E402,F401  (registers dev / ci / nightly)
from cgsim.properties import check_scenario  # noqa: E402
from cgsim.runner import run_scenario  # noqa: E402
from cgsim.targets.mutants import MUTANTS  # noqa: E402
from fuzz.strategies import scenarios  # noqa: E402

# The per-mutant strategies of the Hypothesis mutant tests, imported (not
# copied) so the benchmark fuzzes exactly what the test suite fuzzes.
from tests.cgsim.targets.test_mutants import FUZZ  # noqa: E402


class _Found(Exception):
    """Raised from the test body at the first violation: ends generation."""


def _settings(max_examples: int, derandomize: bool) -> settings:
    return settings(
        settings.get_profile("ci"), database=None, max_examples=max_examples, derandomize=derandomize,
        phases=(Phase.generate,), print_blob=False, report_multiple_bugs=False,
    )


def throughput(examples: int) -> dict:
    calls, violating = [0], [0]

    @_settings(examples, derandomize=True)
    @given(scenarios(max_size=64))
    def test(scenario):
        verdict = check_scenario(scenario, run_scenario(scenario, target="reference", backend="mock"))
        calls[0] += 1
        violating[0] += bool(verdict.violations)

    t0 = time.perf_counter()
    test()
    wall = time.perf_counter() - t0
    return {"scenarios": calls[0], "wall_s": wall, "per_s": calls[0] / wall, "violating": violating[0]}


def hunt(name: str, s: int, max_examples: int) -> dict:
    """One seed: examples and seconds until the first violation (or None)."""
    strategy, _catchers = FUZZ[name]
    target = f"mutant:{name}"
    state = {"calls": 0, "found_at": None, "t": None, "props": ()}

    @_settings(max_examples, derandomize=False)
    @seed_dec(s)
    @given(strategy)
    def test(scenario):
        if state["found_at"] is not None:  # Hypothesis replays the failing example once at the end
            raise _Found
        state["calls"] += 1
        verdict = check_scenario(scenario, run_scenario(scenario, target=target, backend="mock"))
        if verdict.violations:
            state["found_at"] = state["calls"]
            state["t"] = time.perf_counter() - t0
            state["props"] = tuple(sorted({v.property for v in verdict.violations}))
            raise _Found

    t0 = time.perf_counter()
    try:
        test()
    except _Found:
        pass
    wall = time.perf_counter() - t0
    found = state["found_at"] is not None
    return {"found": found, "examples": state["found_at"] if found else state["calls"],
            "wall_s": state["t"] if found else wall, "props": state["props"]}


def _fmt_props(counter: Counter) -> str:
    return ", ".join(f"{p} ({n})" for p, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds per mutant (0 .. N-1)")
    ap.add_argument("--max-examples", type=int, default=500, help="cap on examples per seed")
    ap.add_argument("--examples", type=int, default=200, help="scenarios for the throughput line (0: skip)")
    ap.add_argument("--mutants", default="", help="comma-separated mutant names (default: all)")
    ap.add_argument("--markdown", default=None, help="also write the table (and throughput line) to FILE")
    args = ap.parse_args()
    torch.set_num_threads(1)

    names = [n.strip() for n in args.mutants.split(",") if n.strip()] or sorted(MUTANTS)
    unknown = [n for n in names if n not in FUZZ]
    if unknown:
        ap.error(f"unknown mutant(s) {unknown}; choose from {', '.join(sorted(FUZZ))}")

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"host: {os.cpu_count()} CPUs, load {load:.2f}, python {platform.python_version()}, "
          f"torch {torch.__version__}, 1 thread", flush=True)

    # Warm up: lazy imports and the first capture in this process.
    run_scenario(_warm_scenario(), target="reference", backend="mock")

    lines: list[str] = []
    if args.examples > 0:
        tp = throughput(args.examples)
        line = (f"Throughput (reference, mock, 1 core, scenarios(max_size=64), run + check): "
                f"{tp['scenarios']} scenarios in {tp['wall_s']:.1f} s = **{tp['per_s']:.1f} scenarios/s**"
                + (f" ({tp['violating']} with violations)" if tp["violating"] else ""))
        print(line, flush=True)
        lines += [line, ""]

    lines += [
        f"Mutant detection: {args.seeds} seeds, at most {args.max_examples} examples per seed, "
        f"generate phase only (no shrinking); medians over the seeds that found it.",
        "",
        f"| mutant | median s | median examples | found in k/{args.seeds} seeds | properties that caught it (seeds) |",
        "|---|---:|---:|---:|---|",
    ]
    t_all = time.perf_counter()
    for name in names:
        runs = [hunt(name, s, args.max_examples) for s in range(args.seeds)]
        hits = [r for r in runs if r["found"]]
        props = Counter(p for r in hits for p in r["props"])
        if hits:
            med_s = f"{statistics.median(r['wall_s'] for r in hits):.2f}"
            med_n = f"{statistics.median(r['examples'] for r in hits):g}"
        else:
            med_s = med_n = f"not found in {args.max_examples}"
        row = f"| {name} | {med_s} | {med_n} | {len(hits)}/{args.seeds} | {_fmt_props(props)} |"
        lines.append(row)
        detail = " ".join(f"{r['examples']}" + ("" if r["found"] else "x") for r in runs)
        print(row + f"   [examples per seed: {detail}]", flush=True)
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    tail = f"Detection wall time {time.perf_counter() - t_all:.0f} s; load average {load:.2f} at start, {load_end:.2f} at end."
    lines += ["", tail]
    print()
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


def _warm_scenario():
    from cgsim.config import ManagerConfig
    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario, Step

    return Scenario(config=ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(2,)),
                    steps=(Step.capture(), Step.dispatch(Batch((1, 1)))), ruleset="pr48822")


if __name__ == "__main__":
    sys.exit(main())
