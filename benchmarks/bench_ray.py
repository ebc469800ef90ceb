"""Campaigns over Ray: 1 -> 2 actors on a CPU host, and Ray vs local workers.

    python benchmarks/bench_ray.py cpu [--budget 30] [--repeats 2] [--target reference] [--json out.json]
    python benchmarks/bench_ray.py gpu [--budget 60] [--repeats 1] [--target reference] [--json out.json]

What is measured
- ``cpu``: on a one-machine Ray of 2 CPUs (``ray.init(address="local",
  num_cpus=2)``), ``run_campaign`` with ``ray="auto"`` and 1 then 2 actors,
  and the same campaign with 1 then 2 local worker processes; scenarios per
  second over each campaign's wall time (actor or process start, sink
  round trips and report writing included).  Prints the 2/1 ratio over Ray
  (goal >= 1.8x on a machine with two free cores, as for local workers) and
  Ray/local at each worker count (what the actors, one awaited round trip
  per scenario, cost against worker processes).
- ``gpu``: the same campaign with ``--backend cuda``, one worker per visible
  GPU, over Ray (one actor per GPU, a one-machine Ray of that many GPUs) and
  over local workers (``gpus="auto"``); prints Ray/local.  Needs a GPU and
  Ray: without either it prints one line and exits 2.  The lent GPU
  machines have no Ray and cannot download it, and the Ray wheel for
  CPython 3.12 (ray 2.60.0, manylinux2014_x86_64: 79.3 MB) is larger than
  the 64 MiB a call can carry there, so there this mode says so and stops.

Every run uses a pipeline that runs and checks every scenario in full and
drops the violations (as ``bench_campaign.py``), so no run spends its time
shrinking and both sides do identical work per scenario.  Seeds are the
same on both sides: the same scenarios are drawn.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from cgsim.observe import RunnerPipeline  # noqa: E402
from cgsim.properties import Verdict  # noqa: E402

RAY_WHEEL = "ray 2.60.0 for CPython 3.12 (manylinux2014_x86_64) is 79.3 MB, over the 64 MiB a device call carries"


class NoFindingPipeline(RunnerPipeline):
    """The real pipeline, with violations dropped after checking.  Defined
    here (``__main__``), so Ray ships it to the actors by value."""

    def judge(self, scenario, trace):
        return Verdict((), super().judge(scenario, trace).checked)


def campaign(target: str, backend: str, workers: int, budget: float, seed: int, over_ray: bool) -> dict:
    from fuzz.campaign import CampaignOptions, run_campaign

    extra = {"ray": "auto"} if over_ray else ({"gpus": "auto", "one_per_gpu": True} if backend == "cuda" else {})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = run_campaign(
            CampaignOptions(target=target, backend=backend, workers=workers, budget_s=budget, seed=seed, report_dir=tmp,
                            quiet=True, shrink_grace_s=0.0, timeout_s=60.0, **extra),
            pipeline=NoFindingPipeline(),
        )
        wall = time.perf_counter() - t0
    n = result.summary["scenarios"]
    return {"workers": len(result.summary["workers"]), "scenarios": n, "wall_s": round(wall, 2),
            "per_s": round(n / wall, 2), "exit": result.exit_code}


def measure(args: argparse.Namespace, backend: str, workers: int, over_ray: bool) -> dict:
    runs = [campaign(args.target, backend, workers, args.budget, args.seed + k, over_ray) for k in range(args.repeats)]
    total = sum(r["scenarios"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    out = {"executor": "ray" if over_ray else "local", "workers": runs[0]["workers"], "runs": runs,
           "scenarios": total, "wall_s": round(wall, 2), "per_s": round(total / wall, 2) if wall else 0.0}
    print(f"  {out['executor']:5s} {out['workers']} worker(s): {total} scenarios / {out['wall_s']}s = {out['per_s']}/s "
          f"({args.repeats} seed(s))", flush=True)
    return out


def ratio(a: dict, b: dict) -> float:
    return a["per_s"] / b["per_s"] if b["per_s"] else float("nan")


def start_ray(**resources: int) -> None:
    import ray

    # The actors import cgsim (and this checkout's fuzz) like this process does.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR", **resources)


def cpu_mode(args: argparse.Namespace) -> dict:
    import cgsim.runner  # noqa: F401  (torch imported once, before local workers fork)

    start_ray(num_cpus=2)
    print(f"host: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, one-machine Ray of 2 CPUs; "
          f"target {args.target}, budget {args.budget:g}s", flush=True)
    ray1, ray2 = measure(args, "mock", 1, True), measure(args, "mock", 2, True)
    local1, local2 = measure(args, "mock", 1, False), measure(args, "mock", 2, False)
    res = {"ray_2_over_1": ratio(ray2, ray1), "local_2_over_1": ratio(local2, local1),
           "ray_over_local_1": ratio(ray1, local1), "ray_over_local_2": ratio(ray2, local2)}
    print(f"scaling over Ray, 2/1 actors : {res['ray_2_over_1']:.2f}x (goal >= 1.8x with two free cores)")
    print(f"scaling local, 2/1 workers   : {res['local_2_over_1']:.2f}x")
    print(f"Ray / local, 1 worker        : {res['ray_over_local_1']:.2f}x")
    print(f"Ray / local, 2 workers       : {res['ray_over_local_2']:.2f}x")
    return {"mode": "cpu", "runs": [ray1, ray2, local1, local2], **res}


def gpu_mode(args: argparse.Namespace) -> dict | None:
    import torch

    if not torch.cuda.is_available():
        print("bench_ray gpu: no GPU here (torch.cuda.is_available() is False); run it on a GPU machine", file=sys.stderr)
        return None
    try:
        import ray  # noqa: F401
    except ImportError:
        print(f"bench_ray gpu: SKIPPED, Ray is not installed here (pip install 'cgsim[ray]'); on the lent GPU machines "
              f"it cannot be downloaded, and {RAY_WHEEL}", file=sys.stderr)
        return None
    gpus = torch.cuda.device_count()
    start_ray(num_gpus=gpus)
    print(f"host: {os.cpu_count()} CPUs, {gpus} x {torch.cuda.get_device_name(0)}; target {args.target}, "
          f"budget {args.budget:g}s", flush=True)
    over_ray = measure(args, "cuda", gpus, True)
    local = measure(args, "cuda", gpus, False)
    res = {"ray_over_local": ratio(over_ray, local)}
    print(f"Ray / local, {gpus} GPU worker(s): {res['ray_over_local']:.2f}x")
    return {"mode": "gpu", "runs": [over_ray, local], **res}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("cpu", "gpu"))
    ap.add_argument("--budget", type=float, default=None, help="seconds per campaign (cpu: 30, gpu: 60)")
    ap.add_argument("--repeats", type=int, default=None, help="seeds per measurement (cpu: 2, gpu: 1)")
    ap.add_argument("--target", default="reference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.budget is None:
        args.budget = 30.0 if args.mode == "cpu" else 60.0
    if args.repeats is None:
        args.repeats = 2 if args.mode == "cpu" else 1
    if args.mode == "cpu":
        try:
            import ray  # noqa: F401
        except ImportError:
            print("bench_ray cpu: Ray is not installed here: pip install 'cgsim[ray]'", file=sys.stderr)
            return 2
        out = cpu_mode(args)
    else:
        out = gpu_mode(args)
        if out is None:
            return 2
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
