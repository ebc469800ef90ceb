"""What the runner tier costs: a launch built and captured by vLLM's own model
runner (one finding's confirmation), and a served scenario (the same requests
served with graphs and eager), for cgsim checkouts side by side.

    python benchmarks/bench_runner_tier.py --python VENV/bin/python --tree . [--tree BASELINE] \
        [--launch decode-3 --launch default-19] [--serve] [--vllm-source TREE]

Each checkout runs this script's ``--one`` mode in the given interpreter (the
checkout first on PYTHONPATH, so its cgsim is the one imported), launch by
launch, one after the other.  Printed per launch: the build and capture
seconds vLLM's runner took (``RunnerGraphs.seconds``), the wall seconds of
the child process, and, with ``--serve``, the wall seconds of the served
pair and whether graphs and eager gave the same tokens.  Not a test:
nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# Launches by name: (mode, capture sizes, max_num_reqs).  default-19 is the
# shape of vLLM's default capture list (1, 2, 4, then steps of 8).
LAUNCHES = {
    "decode-3": ("FULL_DECODE_ONLY", (1, 2, 4), 4),
    "piecewise-3": ("PIECEWISE", (1, 2, 4), 4),
    "default-19": ("FULL_AND_PIECEWISE", (1, 2, 4, *range(8, 129, 8)), 128),
}


def one(name: str, serve: bool) -> dict:
    from cgsim.config import ManagerConfig
    from cgsim.modes import CUDAGraphMode
    from cgsim.targets.vllm.engine import launch_for
    from cgsim.targets.vllm.runner_build import build_runner

    mode, sizes, reqs = LAUNCHES[name]
    launch = launch_for(ManagerConfig(mode=CUDAGraphMode[mode], capture_sizes=sizes, max_num_reqs=reqs))
    t0 = time.perf_counter()
    built = build_runner(launch, timeout_s=3600)
    out = {"launch": name, "graphs": sum(len(m.graphs) for m in built.managers), "build_s": built.seconds[0],
           "capture_s": built.seconds[1], "wall_s": round(time.perf_counter() - t0, 1), "raised": built.raised}
    if serve:
        from cgsim.targets.vllm.runner_serve import default_requests, eager_twin, graphs_equal_eager, serve_runner

        requests = default_requests()
        t0 = time.perf_counter()
        graphs = serve_runner(launch, requests, timeout_s=3600)
        eager = serve_runner(eager_twin(launch), requests, timeout_s=3600)
        out.update(served_pair_s=round(time.perf_counter() - t0, 1), replays=graphs.replays,
                   served_equal=not graphs_equal_eager(graphs, eager))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--tree", action="append", default=[])
    ap.add_argument("--launch", action="append", choices=sorted(LAUNCHES))
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--vllm-source", default=None, help="a vLLM source tree laid over the installed vLLM")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.serve)))
        return 0
    rows = []
    for tree in args.tree or ["."]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (os.path.abspath(tree), args.vllm_source,
                                                                         os.environ.get("PYTHONPATH"))))}
        for name in args.launch or ["decode-3"]:
            cmd = [args.python, os.path.abspath(__file__), "--one", name] + (["--serve"] if args.serve else [])
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.path.abspath(tree))
            line = (proc.stdout.strip().splitlines() or ["{}"])[-1]
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = {"launch": name, "raised": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
            rows.append({"tree": tree, **row})
            print(json.dumps(rows[-1]), flush=True)
    keys = ("tree", "launch", "graphs", "build_s", "capture_s", "wall_s", "served_pair_s", "replays", "served_equal")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row.get(k, "")) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
