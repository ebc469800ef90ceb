"""Campaigns of each family against a baseline commit: the same seeds, what
they find, and how fast they run.

    python benchmarks/bench_family_campaign.py --baseline e949056 \
        [--targets reference,mutant:range-off-by-one,...,encoder-reference,encoder-mutant:stale-tail] \
        [--examples 200] [--budget 20] [--seed 1] [--run-flags "--runner-share 0 --confirm-budget 0"] [--json FILE]

For each target, both trees (this one and a ``git archive`` of
``--baseline``) run ``python -m fuzz run`` in a child process of their own
(``PYTHONPATH`` the tree, one worker, the mock, ``--run-flags`` added),
interleaved, one at a time:

- same seed: ``--max-examples --examples --seed --seed``; what each found,
  as (property, documented defect, finding id) of the findings on disk.
  Decode campaigns draw the same scenarios from the same seed on both trees
  where the decode pipeline is unchanged, so these agree exactly; a family
  whose search changed draws differently, so only its (property, defect)
  pairs are compared.
- throughput: ``--budget`` seconds; scenarios per second of the campaign's
  own wall time (``summary.json``'s ``scenarios / elapsed_s``: start-up,
  workers and the report included), this tree over the baseline.

Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
DEFAULT_TARGETS = ("reference,mutant:init-before-breakable,mutant:unclamped-num-reqs,mutant:global-candidate-ranges,"
                   "mutant:range-off-by-one,mutant:nearest-group-candidates,mutant:full-reuses-warmup-metadata,"
                   "encoder-reference,encoder-mutant:stale-tail,encoder-mutant:fit-strict")


def _archive(commit: str, into: str) -> str:
    tree = os.path.join(into, commit)
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", TREE, "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def _campaign(tree: str, target: str, report_dir: str, *flags: str) -> dict:
    """One campaign in ``tree``: its summary's counts and the findings on disk."""
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "fuzz", "run", "--target", target, "--workers", "1", "--report-dir", report_dir,
           "--quiet", *flags]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} in {tree} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    run_dir = os.path.realpath(os.path.join(report_dir, "latest"))
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    found = []
    for path in sorted(glob.glob(os.path.join(run_dir, "findings", "*.json"))):
        with open(path, encoding="utf-8") as fh:
            f = json.load(fh)
        found.append((f["property"], f.get("known_defect") or f.get("defect"), f["id"]))
    return {"scenarios": summary["scenarios"], "elapsed_s": summary["elapsed_s"], "findings": sorted(found)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="the commit to compare with")
    ap.add_argument("--targets", default=DEFAULT_TARGETS)
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run-flags", default="", help="more flags for every fuzz run (e.g. the vLLM target's "
                    "--runner-share 0 --confirm-budget 0: its engine-runner phases take minutes a launch on a CPU)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"baseline": _archive(args.baseline, tmp), "this": TREE}
        for target in args.targets.split(","):
            row: dict = {"target": target}
            for side, tree in trees.items():  # interleaved: one target on both trees before the next
                reports = os.path.join(tmp, "r", side, target.replace(":", "_"))
                more = args.run_flags.split()
                same = _campaign(tree, target, os.path.join(reports, "seed"), "--max-examples", str(args.examples),
                                 "--seed", str(args.seed), "--budget", "600s", *more)
                fast = _campaign(tree, target, os.path.join(reports, "speed"), "--budget", f"{args.budget:g}s",
                                 "--seed", str(args.seed), *more)
                row[side] = {"same_seed": same, "throughput": fast}
            b, t = row["baseline"], row["this"]
            rate = {s: row[s]["throughput"]["scenarios"] / row[s]["throughput"]["elapsed_s"] for s in trees}
            row["ratio"] = round(rate["this"] / rate["baseline"], 2)
            row["same_findings"] = b["same_seed"]["findings"] == t["same_seed"]["findings"]
            pairs = {side: sorted({f[:2] for f in row[side]["same_seed"]["findings"]}, key=str) for side in trees}
            row["same_defects"] = pairs["baseline"] == pairs["this"]
            rows.append(row)
            print(f"{target}: {rate['baseline']:.1f} -> {rate['this']:.1f} scenarios/s ({row['ratio']}x); "
                  f"same seed: findings {'identical' if row['same_findings'] else 'differ'}, (property, defect) "
                  f"{'identical' if row['same_defects'] else 'differ'}: baseline {pairs['baseline']}, "
                  f"this {pairs['this']}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
