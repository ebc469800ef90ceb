"""Does throughput on one GPU grow with workers?  And what does a scenario
ask the device to do?

    python benchmarks/bench_gpu_workers.py [--workers 1,2,4,8] [--max-examples 400] [--seed 7]
                                           [--sync-scenarios 100] [--mps] [--json FILE]

Needs a CUDA GPU (exit 2 with one line otherwise).  Two measurements, in one
run:

- workers: the nightly campaign (``--profile nightly``, reference target,
  ``--backend cuda``) with every worker on GPU 0 (``--gpus 0``), for 1, 2, 4
  and 8 workers, each stopped after the same ``--max-examples`` scenarios
  (same seed); scenarios/s over the campaign's wall time and the ratio to one
  worker, plus CPU seconds per scenario (the workers' user + system time).
  Violations are dropped after judging, so no run spends time shrinking.
- device work per scenario: ``--sync-scenarios`` scenarios of the campaign's
  strategy (derandomized) run in this process on CUDA under a dispatch mode
  that counts, per scenario: aten ops on the device (each a kernel launch,
  or a graph replay's worth of them inside ``CUDAGraph.replay``), graph
  captures and replays, and synchronisation points: ``torch.cuda.synchronize``
  / ``Stream.synchronize`` / ``Event.synchronize`` calls, ``.item()`` /
  ``bool()`` / ``.tolist()`` of a device tensor (``_local_scalar_dense``),
  and device-to-host copies (``.cpu()``, ``.to("cpu")``).  Also the host time
  per scenario against the time the device was busy (CUDA events around each
  scenario), which says whether one process keeps the GPU fed.

``--mps``: also run the worker series under the CUDA Multi-Process Service
(starts ``nvidia-cuda-mps-control -d`` with a private pipe directory and
stops it after; reported as not available when the binary is missing or
the daemon does not start).  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from cgsim.observe import RunnerPipeline  # noqa: E402
from cgsim.properties import Verdict  # noqa: E402


class NoFindingPipeline(RunnerPipeline):
    """The real pipeline, with violations dropped after judging (no shrinking)."""

    def judge(self, scenario, trace):
        return Verdict((), super().judge(scenario, trace).checked)


def campaign(workers: int, max_examples: int, seed: int, backend: str = "cuda") -> dict:
    import resource

    from fuzz.campaign import CampaignOptions, run_campaign

    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        result = run_campaign(
            CampaignOptions(target="reference", backend=backend, profile="nightly", workers=workers,
                            gpus="0" if backend == "cuda" else None,
                            budget_s=3600.0, max_examples=max_examples, seed=seed, report_dir=tmp, quiet=True,
                            shrink_grace_s=0.0, timeout_s=120.0),
            pipeline=NoFindingPipeline(),
        )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    n = result.summary["scenarios"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"workers": workers, "scenarios": n, "wall_s": round(wall, 2), "per_s": round(n / wall, 2),
            "cpu_ms_per_scenario": round(1000 * cpu / max(n, 1), 2), "exit_code": result.exit_code}


def device_work(n: int, seed: int, backend: str = "cuda") -> dict:
    """Counts per scenario on CUDA, in this process."""
    import torch
    from hypothesis import Phase, given, settings
    from torch.utils._python_dispatch import TorchDispatchMode

    import cgsim.profiles  # noqa: F401
    from cgsim.properties import check_scenario
    from cgsim.runner import run_scenario
    from fuzz.campaign.decode_scenarios import default_strategy

    torch.set_num_threads(1)
    dev = "cuda" if backend == "cuda" else "cpu"  # the mock's device memory is the CPU (a smoke test)
    counts: collections.Counter = collections.Counter()

    def on_device(t) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == dev
    scalar = torch.ops.aten._local_scalar_dense.default

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func is scalar:
                counts["sync: item/bool/tolist"] += 1
            elif func.name() in ("aten::copy_", "aten::_to_copy"):
                src = args[1] if func.name() == "aten::copy_" else args[0]
                dst = args[0] if func.name() == "aten::copy_" else out
                if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor):
                    if on_device(src) and not on_device(dst):
                        counts["sync: device-to-host copy"] += 1
                    elif on_device(dst) and not on_device(src):
                        counts["host-to-device copy"] += 1
            if any(on_device(a) for a in args) or on_device(out):
                counts["device ops (launched, or recorded into a graph)"] += 1
            return out

    wrapped = []

    def wrap(obj, name, label):
        orig = getattr(obj, name)

        def counted(*a, **k):
            counts[label] += 1
            return orig(*a, **k)

        setattr(obj, name, counted)
        wrapped.append((obj, name, orig))

    wrap(torch.cuda, "synchronize", "sync: torch.cuda.synchronize")
    wrap(torch.cuda.Stream, "synchronize", "sync: Stream.synchronize")
    wrap(torch.cuda.Event, "synchronize", "sync: Event.synchronize")
    wrap(torch.cuda.CUDAGraph, "replay", "graph replays")
    wrap(torch.cuda.CUDAGraph, "capture_begin", "graph captures")

    drawn: list = []

    @settings(settings.get_profile("ci"), database=None, max_examples=n, derandomize=True, phases=(Phase.generate,),
              print_blob=False, deadline=None)
    @given(default_strategy(None, "reference"))
    def draw(scenario):
        drawn.append(scenario)

    draw()
    host, device = 0.0, 0.0
    try:
        for sc in drawn:
            timed = backend == "cuda"
            if timed:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            with Count():
                trace = run_scenario(sc, target="reference", backend=backend)
            if timed:
                end.record()
                torch.cuda.synchronize()
                device += start.elapsed_time(end) / 1000.0
            host += time.perf_counter() - t0
            check_scenario(sc, trace)
    finally:
        for obj, name, orig in wrapped:
            setattr(obj, name, orig)
    k = len(drawn)
    per = {name: round(v / k, 2) for name, v in sorted(counts.items())}
    return {"scenarios": k, "per_scenario": per, "host_ms_per_scenario": round(1000 * host / k, 2),
            "event_span_ms_per_scenario": round(1000 * device / k, 2)}


class _Mps:
    """The CUDA Multi-Process Service for the duration of a block, if it starts."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="cgsim-mps-")
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=os.path.join(self.dir, "pipe"),
                        CUDA_MPS_LOG_DIRECTORY=os.path.join(self.dir, "log"))
        self.why_not: str | None = None

    def __enter__(self) -> "_Mps":
        ctl = shutil.which("nvidia-cuda-mps-control")
        if ctl is None:
            self.why_not = "nvidia-cuda-mps-control is not installed"
            return self
        os.makedirs(self.env["CUDA_MPS_PIPE_DIRECTORY"])
        os.makedirs(self.env["CUDA_MPS_LOG_DIRECTORY"])
        proc = subprocess.run([ctl, "-d"], env=self.env, capture_output=True, text=True)
        if proc.returncode != 0:
            self.why_not = f"nvidia-cuda-mps-control -d failed: {(proc.stderr or proc.stdout).strip()[:200]}"
            return self
        os.environ["CUDA_MPS_PIPE_DIRECTORY"] = self.env["CUDA_MPS_PIPE_DIRECTORY"]
        os.environ["CUDA_MPS_LOG_DIRECTORY"] = self.env["CUDA_MPS_LOG_DIRECTORY"]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.why_not is None:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=self.env, capture_output=True, text=True)
            os.environ.pop("CUDA_MPS_PIPE_DIRECTORY", None)
            os.environ.pop("CUDA_MPS_LOG_DIRECTORY", None)
        shutil.rmtree(self.dir, ignore_errors=True)


def _series(workers: list[int], max_examples: int, seed: int, label: str, backend: str) -> list[dict]:
    rows = []
    for w in workers:
        r = campaign(w, max_examples, seed, backend)
        rows.append(r)
        base = rows[0]["per_s"]
        print(f"| {label} | {w} | {r['scenarios']} | {r['wall_s']:.1f} | {r['per_s']:.1f} | {r['per_s'] / base:.2f}x | "
              f"{r['cpu_ms_per_scenario']:.1f} |", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--max-examples", type=int, default=400, help="scenarios per campaign (over all workers)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sync-scenarios", type=int, default=100, help="scenarios for the device-work counts (0: skip)")
    ap.add_argument("--mps", action="store_true", help="also run the worker series under CUDA MPS")
    ap.add_argument("--json", default=None)
    ap.add_argument("--backend", default="cuda", help=argparse.SUPPRESS)  # mock: a smoke test of this script
    args = ap.parse_args()
    import torch

    if args.backend == "cuda" and not torch.cuda.is_available():
        print(f"bench_gpu_workers: no CUDA GPU (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
              "run it on a GPU machine", file=sys.stderr)
        return 2
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    gpu = torch.cuda.get_device_name(0) if args.backend == "cuda" else "the CPU mock (smoke test)"
    print(f"host: {os.cpu_count()} CPUs, {gpu}, python {platform.python_version()}, "
          f"torch {torch.__version__}; nightly profile, reference target, all workers on GPU 0, "
          f"{args.max_examples} scenarios per campaign, seed {args.seed}", flush=True)
    out: dict = {}
    if args.sync_scenarios > 0:
        dw = device_work(args.sync_scenarios, args.seed, args.backend)
        out["device_work"] = dw
        print(f"\nper scenario on CUDA ({dw['scenarios']} scenarios of the campaign strategy, one process):")
        for name, v in dw["per_scenario"].items():
            print(f"  {name:40s} {v}")
        print(f"  host wall ms per scenario (counting)     {dw['host_ms_per_scenario']}")
        print(f"  CUDA-event span ms per scenario          {dw['event_span_ms_per_scenario']}", flush=True)
    print("\n| service | workers | scenarios | wall s | scenarios/s | vs 1 worker | CPU ms per scenario |")
    print("|---|---:|---:|---:|---:|---:|---:|", flush=True)
    out["plain"] = _series(workers, args.max_examples, args.seed, "none", args.backend)
    if args.mps:
        with _Mps() as mps:
            if mps.why_not:
                print(f"MPS not available: {mps.why_not}")
                out["mps"] = mps.why_not
            else:
                out["mps"] = _series(workers, args.max_examples, args.seed, "MPS", args.backend)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
