"""How fast Hypothesis finds each encoder mutant, and encoder fuzzing speed, on the CPU mock.

    python benchmarks/bench_encoder_mutants.py [--seeds 10] [--max-examples 500] [--examples 200]
                                               [--mutants a,b] [--markdown FILE]

The encoder counterpart of bench_fuzz.py.  What is measured, in one run, on
one core (``torch.set_num_threads(1)``):

- throughput: ``--examples`` scenarios of ``cgsim.encoder.strategies.encoder_scenarios()``
  against ``encoder-reference``, each run on the mock and checked with every
  encoder property (``cgsim.encoder.strategies.judge_encoder``: build the
  handle, run the scenario, ``check_encoder_scenario``), in one derandomized
  ``@given`` test (no database, generate phase only).  Scenarios per second =
  calls / wall time of the test.
- detection: for each mutant of ``cgsim.encoder.mutants.ENCODER_MUTANTS``
  (target ``encoder-mutant:NAME``) and each of ``--seeds`` seeds
  (``@seed(s)``, ``database=None``, derandomize off, generate phase only: no
  shrinking), the number of examples executed and the wall time until the
  first scenario with any encoder property violation (the test body raises a
  private exception at once), and which properties that scenario violated.
  Every mutant is fuzzed with what tests/cgsim/encoder/test_encoder.py's
  ``test_hypothesis_finds_each_mutant`` gives it: ``encoder_scenarios()`` with
  its defaults, no per-mutant config filter, judged by ``judge_encoder`` on
  the mock.  (The test stops at the mutant's documented property, within 300
  derandomized examples; here any property counts, and the table names the
  ones that fired.)  At most ``--max-examples`` examples per seed; a seed
  that finds nothing counts as "not found".  Medians are over the seeds that
  found the mutant.

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

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as seed_dec

from cgsim.backends import get_backend
from cgsim.encoder.mutants import ENCODER_MUTANTS
from cgsim.encoder.strategies import encoder_scenarios, judge_encoder

BACKEND = get_backend("mock")


class _Found(Exception):
    """Raised from the test body at the first violation: ends generation."""


def _settings(max_examples: int, derandomize: bool) -> settings:
    # As tests/cgsim/encoder/test_encoder.py's mutant search: no deadline, no health checks, no database, no shrinking.
    return settings(
        max_examples=max_examples, derandomize=derandomize, deadline=None,
        suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,),
        print_blob=False, report_multiple_bugs=False,
    )


def throughput(examples: int) -> dict:
    calls, violating, refused = [0], [0], [0]

    @_settings(examples, derandomize=True)
    @given(encoder_scenarios())
    def test(scenario):
        verdict = judge_encoder("encoder-reference", scenario, BACKEND)
        calls[0] += 1
        violating[0] += bool(verdict.violations)
        refused[0] += not verdict.checked

    t0 = time.perf_counter()
    test()
    wall = time.perf_counter() - t0
    return {"scenarios": calls[0], "wall_s": wall, "per_s": calls[0] / wall, "violating": violating[0],
            "unjudged": refused[0]}


def hunt(name: str, s: int, max_examples: int) -> dict:
    """One seed: examples and seconds until the first violation (or None)."""
    target = f"encoder-mutant:{name}"
    state = {"calls": 0, "found_at": None, "t": None, "props": ()}

    @_settings(max_examples, derandomize=False)
    @seed_dec(s)
    @given(encoder_scenarios())
    def test(scenario):
        if state["found_at"] is not None:  # Hypothesis replays the failing example once at the end
            raise _Found
        state["calls"] += 1
        verdict = judge_encoder(target, scenario, BACKEND)
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
    ap.add_argument("--mutants", default="", help="comma-separated encoder mutant names (default: all)")
    ap.add_argument("--markdown", default=None, help="also write the table (and throughput line) to FILE")
    args = ap.parse_args()
    torch.set_num_threads(1)

    names = [n.strip() for n in args.mutants.split(",") if n.strip()] or sorted(ENCODER_MUTANTS)
    unknown = [n for n in names if n not in ENCODER_MUTANTS]
    if unknown:
        ap.error(f"unknown encoder mutant(s) {unknown}; choose from {', '.join(sorted(ENCODER_MUTANTS))}")

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"host: {os.cpu_count()} CPUs, load {load:.2f}, python {platform.python_version()}, "
          f"torch {torch.__version__}, 1 thread", flush=True)

    # Warm up: lazy imports and the first capture in this process.
    judge_encoder("encoder-reference", ENCODER_MUTANTS[min(ENCODER_MUTANTS)].example(), BACKEND)

    lines: list[str] = []
    if args.examples > 0:
        tp = throughput(args.examples)
        extra = [f"{tp['violating']} with violations"] if tp["violating"] else []
        extra += [f"{tp['unjudged']} refused, not judged"] if tp["unjudged"] else []
        line = (f"Throughput (encoder-reference, mock, 1 core, encoder_scenarios(), run + check): "
                f"{tp['scenarios']} scenarios in {tp['wall_s']:.1f} s = **{tp['per_s']:.1f} scenarios/s**"
                + (f" ({'; '.join(extra)})" if extra else ""))
        print(line, flush=True)
        lines += [line, ""]

    lines += [
        (f"Mutant detection: {args.seeds} seeds, at most {args.max_examples} examples per seed, "
         f"generate phase only (no shrinking); medians over the seeds that found it."),
        "",
        f"| mutant | median s | median examples | found in k/{args.seeds} seeds | properties that caught it (seeds) |",
        "|---|---:|---:|---:|---|",
    ]
    missed: list[str] = []
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
        caught_by = ENCODER_MUTANTS[name].caught_by
        without = sum(caught_by not in r["props"] for r in hits)
        if len(hits) < args.seeds:
            missed.append(f"{name} was not found in {args.seeds - len(hits)} of {args.seeds} seeds "
                          f"within {args.max_examples} examples (documented property: {caught_by}).")
        if without:
            missed.append(f"{name}: in {without} of {len(hits)} seeds the first violating scenario did not "
                          f"violate its documented property {caught_by}.")
        detail = " ".join(f"{r['examples']}" + ("" if r["found"] else "x") for r in runs)
        print(row + f"   [examples per seed: {detail}]", flush=True)
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    tail = f"Detection wall time {time.perf_counter() - t_all:.0f} s; load average {load:.2f} at start, {load_end:.2f} at end."
    lines += [""] + missed + [tail]
    print()
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
