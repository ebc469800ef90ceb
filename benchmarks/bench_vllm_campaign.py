"""Scenarios per second of a vLLM campaign, for cgsim checkouts side by side.

    python benchmarks/bench_vllm_campaign.py --python VENV/bin/python --tree . --tree /path/to/baseline-checkout \
        [--max-examples 300] [--seeds 1,2,3] [--vllm-source TREE]

For each seed, each cgsim checkout runs ``python -m fuzz run --target vllm
--workers 1 --max-examples N --seed S`` (and ``--no-runner-confirm`` where
its fuzz/cli.py knows the flag) in the given interpreter (the
checkout first on PYTHONPATH, so its cgsim is the one imported), one after
the other, and the campaign's own ``scenarios_per_s`` (scenarios over the
campaign's wall time, start-up and the self-check included) is read from its
summary.json.  Prints a table of the rates and each checkout's ratio to the
first one, per seed and over all seeds (total scenarios over total time).
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile


def knows_runner_confirm(tree: str) -> bool:
    """Whether the checkout's CLI has --no-runner-confirm (older ones end without the runner's phase)."""
    try:
        with open(os.path.join(tree, "fuzz", "cli.py"), encoding="utf-8") as fh:
            return "--no-runner-confirm" in fh.read()
    except OSError:
        return False


def campaign(python: str, tree: str, seed: int, max_examples: int, source: str | None) -> dict:
    with tempfile.TemporaryDirectory() as out:
        # The checkout first; what the caller's PYTHONPATH holds (an unpacked vLLM, say) after it.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (os.path.abspath(tree),
                                                                         os.environ.get("PYTHONPATH"))))}
        if source:
            env["CGSIM_VLLM_SOURCE"] = os.path.abspath(source)
        cmd = [python, "-m", "fuzz", "run", "--target", "vllm", "--workers", "1", "--max-examples", str(max_examples),
               "--seed", str(seed), "--report-dir", out, "--quiet", "--budget", "30m"]
        if knows_runner_confirm(tree):
            cmd.append("--no-runner-confirm")  # the rate is the search tier's: no end-of-campaign runner builds
        run = subprocess.run(cmd, cwd=os.path.abspath(tree), env=env, capture_output=True, text=True)
        if run.returncode not in (0, 1):
            raise SystemExit(f"{tree} seed {seed}: exit {run.returncode}: {run.stderr.strip().splitlines()[-1:]}")
        with open(os.path.join(out, "latest", "summary.json"), encoding="utf-8") as fh:
            summary = json.load(fh)
    return {"scenarios": summary["scenarios"], "elapsed_s": summary["elapsed_s"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True, help="an interpreter with vLLM installed")
    ap.add_argument("--tree", action="append", required=True, help="a cgsim checkout (the first is the reference)")
    ap.add_argument("--max-examples", type=int, default=300)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--vllm-source", default=None)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {tree: [] for tree in args.tree}
    for seed in seeds:
        for tree in args.tree:
            results[tree].append(campaign(args.python, tree, seed, args.max_examples, args.vllm_source))
    ref = args.tree[0]
    print("| checkout | " + " | ".join(f"seed {s}" for s in seeds) + " | all seeds | ratio to the first |")
    print("|---|" + "---|" * (len(seeds) + 2))
    ref_rate = sum(r["scenarios"] for r in results[ref]) / sum(r["elapsed_s"] for r in results[ref])
    for tree in args.tree:
        rates = [r["scenarios"] / r["elapsed_s"] for r in results[tree]]
        total = sum(r["scenarios"] for r in results[tree]) / sum(r["elapsed_s"] for r in results[tree])
        cells = " | ".join(f"{rate:.2f}/s ({r['scenarios']})" for rate, r in zip(rates, results[tree]))
        print(f"| {tree} | {cells} | {total:.2f}/s | {total / ref_rate:.2f} |")


if __name__ == "__main__":
    main()
