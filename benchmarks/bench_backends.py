"""Scenarios per second on the CPU mock (one core) vs real CUDA graphs, on the
same scenario set: the reference entries of the agreement corpus.

    python benchmarks/bench_backends.py [--repeats 3] [--backends mock,cuda]

Prints one line per backend and the ratio measured in this run.  Not a test:
nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from cgsim.runner import run_scenario  # noqa: E402
from cgsim.scenario import Scenario  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "..", "tests", "agreement", "corpus.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", default="mock,cuda")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N scenarios")
    args = ap.parse_args()
    torch.set_num_threads(1)
    entries = [json.loads(line) for line in open(CORPUS, encoding="utf-8")]
    scenarios = [Scenario.from_json(e["scenario"]) for e in entries if e["target"] == "reference"][: args.limit]
    rates = {}
    for backend in args.backends.split(","):
        if backend == "cuda" and not torch.cuda.is_available():
            print("cuda: no GPU visible, skipped in this run")
            continue
        run_scenario(scenarios[0], "reference", backend)  # warm up lazy init
        best = None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for sc in scenarios:
                run_scenario(sc, "reference", backend)
            if backend == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
        rates[backend] = len(scenarios) / best
        print(f"{backend}: {len(scenarios)} scenarios in {best:.2f}s (best of {args.repeats}) = {rates[backend]:.1f} scenarios/s")
    if "mock" in rates and "cuda" in rates:
        print(f"cuda/mock throughput ratio: {rates['cuda'] / rates['mock']:.2f}x (mock on one CPU core)")


if __name__ == "__main__":
    main()
