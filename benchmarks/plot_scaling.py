"""How a scenario's cost grows with the number of capture sizes and with
max_num_reqs, on the CPU mock, one core, against a baseline commit.

    python benchmarks/plot_scaling.py [--baseline f22a9c1 | --baseline-tree DIR] [--out benchmarks/scaling.png]
                                      [--repeats 3] [--json FILE]

One scenario shape, scaled: FULL_AND_PIECEWISE on the reference target,
ruleset pr48822, capture sizes the first n of the ladder 1, 2, 4, 8, 16,
24, 32, ... (steps of 8, as vLLM's defaults), then a capture and three
dispatches (a decode of max_num_reqs requests, a mixed batch, a prefill of
the largest size), run + check with every property (the dispatch sweep
included wherever the tree has one).  Two series per tree:

- capture sizes n = 1 .. 67 (largest 512) at max_num_reqs 16;
- max_num_reqs 1 .. 256 at the 11 sizes up to 64.

Each point is the best of three runs in a process, and of ``--repeats``
fresh processes (CPU time, one torch thread, garbage collected before each
run).  The script prints the table, the marginal cost per capture
size (least squares over the upper half of the series: a growth exponent
below 1 is sub-linear) and writes the plot.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
LADDER = [1, 2, 4, 8] + list(range(16, 513, 8))
SIZE_COUNTS = [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 67]
REQS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
REQS_SIZES = 11  # the ladder up to 64


def _scenario(n_sizes: int, max_num_reqs: int):
    from cgsim.config import ManagerConfig
    from cgsim.descriptors import Batch
    from cgsim.scenario import Scenario, Step

    sizes = tuple(LADDER[:n_sizes])
    top = sizes[-1]
    reqs = min(max_num_reqs, top)
    # decodes beside one prompt chunk, filling the largest graph
    mixed = (1,) * (reqs - 1) + (max(1, top - (reqs - 1)),)
    batches = (Batch((1,) * reqs), Batch(mixed, has_prefill=True), Batch((top,), has_prefill=True))
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=sizes, max_num_reqs=max_num_reqs)
    return Scenario(config=cfg, steps=(Step.capture(),) + tuple(Step.dispatch(b) for b in batches),
                    ruleset="pr48822", seed=0)


def _child(points: list[tuple[int, int]]) -> list[float]:
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

    from cgsim.properties import check_scenario
    from cgsim.runner import run_scenario

    torch.set_num_threads(1)
    warm = _scenario(4, 4)
    check_scenario(warm, run_scenario(warm, target="reference", backend="mock"))
    import gc

    out = []
    for n, r in points:
        sc = _scenario(n, r)
        best = float("inf")
        for _ in range(3):
            # Garbage left by the previous point is not this one's cost.
            gc.collect()
            t0 = time.process_time()
            trace = run_scenario(sc, target="reference", backend="mock")
            verdict = check_scenario(sc, trace)
            best = min(best, time.process_time() - t0)
        out.append(best)
        if verdict.violations:
            print(f"note: {sc.short()}: {[v.property for v in verdict.violations]}", file=sys.stderr)
    return out


def _spawn(tree: str, points: list[tuple[int, int]]) -> list[float]:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(points)], env=env,
                          cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"plot_scaling: the child in {tree} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x over the upper half."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0][len(xs) // 2:]
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    num = sum((p[0] - mx) * (p[1] - my) for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return num / den if den else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="f22a9c1")
    ap.add_argument("--baseline-tree", default=None)
    ap.add_argument("--out", default=os.path.join(HERE, "scaling.png"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child([tuple(p) for p in json.loads(args.child)])))
        return 0

    tmp = tempfile.TemporaryDirectory(prefix="cgsim-scaling-")
    base = args.baseline_tree
    if base is None:
        base = os.path.join(tmp.name, "baseline")
        os.makedirs(base)
        data = subprocess.run(["git", "-C", TREE, "archive", args.baseline], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=data, check=True)
    points = [(n, 16) for n in SIZE_COUNTS] + [(REQS_SIZES, r) for r in REQS]
    best: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, tree in (("baseline", base), ("this tree", TREE)):
            got = _spawn(tree, points)
            best[name] = got if name not in best else [min(a, b) for a, b in zip(best[name], got)]
    k = len(SIZE_COUNTS)
    print(f"host: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; best of {args.repeats}, CPU ms per scenario")
    print("\n| capture sizes (max_num_reqs 16) | baseline ms | this tree ms | ratio |")
    print("|---:|---:|---:|---:|")
    for i, n in enumerate(SIZE_COUNTS):
        b, t = best["baseline"][i] * 1e3, best["this tree"][i] * 1e3
        print(f"| {n} (largest {LADDER[n - 1]}) | {b:.1f} | {t:.1f} | {b / t:.1f}x |")
    print("\n| max_num_reqs (11 sizes up to 64) | baseline ms | this tree ms | ratio |")
    print("|---:|---:|---:|---:|")
    for j, r in enumerate(REQS):
        b, t = best["baseline"][k + j] * 1e3, best["this tree"][k + j] * 1e3
        print(f"| {r} | {b:.1f} | {t:.1f} | {b / t:.1f}x |")
    for name in best:
        e_sizes = _exponent(SIZE_COUNTS, best[name][:k])
        e_reqs = _exponent(REQS, best[name][k:])
        print(f"{name}: time ~ sizes^{e_sizes:.2f} (upper half), ~ max_num_reqs^{e_reqs:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"sizes": SIZE_COUNTS, "reqs": REQS, "cpu_s": best}, fh, indent=2)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot written")
        return 0
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, style in (("baseline", "o--"), ("this tree", "s-")):
        a1.plot(SIZE_COUNTS, [v * 1e3 for v in best[name][:k]], style, label=name)
        a2.plot(REQS, [v * 1e3 for v in best[name][k:]], style, label=name)
    a1.plot(SIZE_COUNTS, [best["this tree"][0] * 1e3 * n for n in SIZE_COUNTS], ":", color="grey",
            label="linear from n=1 (this tree)")
    a1.set(xlabel="capture sizes (ladder 1, 2, 4, 8, 16, 24, ...)", ylabel="CPU ms per scenario",
           title="max_num_reqs 16", xscale="log", yscale="log")
    a2.set(xlabel="max_num_reqs", ylabel="CPU ms per scenario", title="11 capture sizes (up to 64)",
           xscale="log", yscale="log")
    for a in (a1, a2):
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    fig.suptitle("FULL_AND_PIECEWISE, capture + 3 dispatches, run + check (sweep included), CPU mock, 1 core")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot: {args.out}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
