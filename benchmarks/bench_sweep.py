"""What the dispatch sweep costs: per scenario, the time spent sweeping
against the time spent capturing, batches swept per second, and how much the
sweep adds to a scenario (run + check), for the reference target and, where
vLLM imports, the vLLM target.

    python benchmarks/bench_sweep.py [--examples 200] [--max-size 64] [--targets reference,vllm] [--repeat 3] [--seed N]
                                      [--plans campaign|cold|warm]

CPU time of this process (time.process_time), so a busy shared machine
inflates nothing; each scenario runs with and without the sweep,
interleaved.  Scenarios: ``fuzz.strategies.scenarios`` with the target's
engine configs mixed in, as a campaign draws them (derandomized), and as
a campaign worker runs them: each (config, ruleset, lifecycle) once
(the decode family's ``FamilySearch.repeat_key``), so ``--plans campaign`` caches the
plans of a config drawn again with another lifecycle only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


def _scenarios(target: str, n: int, max_size: int, sample_seed: int | None = None) -> list:
    from hypothesis import HealthCheck, Phase, given, reject, seed, settings

    from cgsim.targets import get_target
    from fuzz.strategies import scenarios

    t = get_target(target)
    out: list = []
    try:  # a campaign worker runs each (config, ruleset, lifecycle) once: so do these scenarios
        from fuzz.campaign.search import DECODE_SEARCH

        repeat_key = DECODE_SEARCH.repeat_key
    except ImportError:
        try:  # a tree from before the families' searches
            from fuzz.campaign.worker import repeat_key
        except ImportError:  # a tree from before that rule: its campaigns ran repeats
            repeat_key = None
    ran: set = set()

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=(Phase.generate,), derandomize=sample_seed is None)
    @given(scenarios(max_size=max_size, engine_sizes=t.drawing.engine_capture_sizes,
                     refusal=t.drawing.unsupported_reason))
    def collect(sc):
        if repeat_key is not None:
            if repeat_key(sc) in ran:
                reject()
            ran.add(repeat_key(sc))
        out.append(sc)

    (collect if sample_seed is None else seed(sample_seed)(collect))()
    return out


class _Timer:
    """Wraps each manager recorder's sweep and each handle's capture to add up their CPU time."""

    def __init__(self):
        import cgsim.runner as runner
        from cgsim.recorder import ManagerRecorder

        self.runner, self.recorder = runner, ManagerRecorder
        self.sweep_s = self.capture_s = 0.0
        self.swept = 0
        self._sweep, self._get_target = ManagerRecorder.sweep, runner.get_target

    def __enter__(self):
        timer = self

        def sweep(recorder, *args, **kwargs):
            trace = recorder.trace
            t0 = time.process_time()
            try:
                return timer._sweep(recorder, *args, **kwargs)
            finally:
                timer.sweep_s += time.process_time() - t0
                timer.swept += len(trace.events[-1].batches) if trace.events and trace.events[-1].kind == "sweep" else 0

        def get_target(name):
            target = timer._get_target(name)
            build = target.build

            def timed_build(*args, **kwargs):
                handle = build(*args, **kwargs)
                capture = handle.capture

                def timed_capture():
                    t0 = time.process_time()
                    try:
                        return capture()
                    finally:
                        timer.capture_s += time.process_time() - t0

                handle.capture = timed_capture
                return handle

            target.build = timed_build
            return target

        self.recorder.sweep, self.runner.get_target = sweep, get_target
        return self

    def __exit__(self, *exc):
        self.recorder.sweep, self.runner.get_target = self._sweep, self._get_target


def _forget_plans() -> None:
    import cgsim.runner as runner
    from cgsim.spec import scheduler

    for cached in (getattr(runner, "_seeded_plan", None), getattr(runner, "_boundary_descs", None),
                   getattr(scheduler, "_space", None), getattr(scheduler, "_prefill_splits", None)):
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


def _forget_spec() -> None:
    # A run's sweep plan and its checks share the spec's capture descriptors
    # (one computation a run): forgotten before every run, so the run with the
    # sweep does not find them already made by the run without.
    from cgsim.spec import candidates

    cached = getattr(candidates, "_expected_capture_descs", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()


def bench(target: str, n: int, max_size: int, repeat: int = 3, plans: str = "campaign",
          sample_seed: int | None = None) -> dict | None:
    import torch

    from cgsim.properties import check_scenario
    from cgsim.runner import run_scenario
    from cgsim.targets import TargetEnvironmentError, get_target

    try:
        get_target(target).prepare_environment()
    except TargetEnvironmentError as exc:
        print(f"{target}: skipped ({exc})")
        return None
    torch.set_num_threads(1)
    scs = _scenarios(target, n, max_size, sample_seed)
    for sc in scs[:10]:
        check_scenario(sc, run_scenario(sc, target=target, timeout=600))  # warm
    runs: dict[tuple[int, bool], list[float]] = {}
    sweep_s: list[list[float]] = [[] for _ in scs]
    capture_s: list[list[float]] = [[] for _ in scs]
    shapes = 0
    med = statistics.median
    # ``repeat`` passes over the scenarios, each one with and without the
    # sweep, interleaved: one run of a few milliseconds moves by as much as
    # the sweep costs whenever a garbage collection lands in it, so each
    # scenario's median counts.  Plans: "campaign" starts every pass with
    # none cached and keeps what the pass makes (a campaign draws a config
    # again, and plans it once); "cold" plans every swept run afresh (an
    # upper bound); "warm" keeps every plan of the earlier passes (a lower one).
    for rep in range(repeat):
        if plans == "campaign" or (plans == "warm" and rep == 0):
            _forget_plans()
        for i, sc in enumerate(scs):
            _forget_spec()
            t0 = time.process_time()
            check_scenario(sc, run_scenario(sc, target=target, timeout=600, sweep=False))
            runs.setdefault((i, False), []).append(time.process_time() - t0)
            if plans == "cold":
                _forget_plans()
            _forget_spec()
            with _Timer() as timer:
                t0 = time.process_time()
                check_scenario(sc, run_scenario(sc, target=target, timeout=600, sweep=True))
                runs.setdefault((i, True), []).append(time.process_time() - t0)
            sweep_s[i].append(timer.sweep_s)
            capture_s[i].append(timer.capture_s)
            shapes += timer.swept
    plain = [med(runs[(i, False)]) for i in range(len(scs))]
    swept = [med(runs[(i, True)]) for i in range(len(scs))]
    sweep_s = [med(x) for x in sweep_s]
    capture_s = [med(x) for x in capture_s]
    shapes //= repeat
    if not shapes:
        raise SystemExit(f"{target}: no sweep was timed (every swept run failed?): check that _Timer still "
                         "wraps ManagerRecorder.sweep and the targets' build as the runner calls them")
    return {
        "target": target, "scenarios": len(scs),
        "median_ms_without": 1000 * med(plain), "median_ms_with": 1000 * med(swept),
        "added_pct": 100 * (med(swept) / med(plain) - 1),
        "median_added_pct": 100 * med([w / max(1e-9, p) - 1 for w, p in zip(swept, plain)]),
        "total_added_pct": 100 * (sum(swept) / sum(plain) - 1),
        "median_sweep_ms": 1000 * med(sweep_s), "median_capture_ms": 1000 * med(capture_s),
        "sweep_over_capture": sum(sweep_s) / max(1e-9, sum(capture_s)),
        "shapes_per_s": shapes / max(1e-9, sum(sweep_s)), "shapes": shapes, "plans": plans,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--max-size", type=int, default=64)
    ap.add_argument("--targets", default="reference,vllm")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each scenario each way (their median counts)")
    ap.add_argument("--seed", type=int, default=None,
                    help="draw this seed's sample of scenarios instead of the derandomized one (the same every run)")
    ap.add_argument("--plans", choices=("campaign", "cold", "warm"), default="campaign",
                    help="sweep plans cached as a campaign caches them (default), made afresh for every swept run "
                         "(an upper bound), or all cached (a lower bound)")
    args = ap.parse_args(argv)
    print(f"{'target':10} {'n':>4} {'med w/o':>8} {'med with':>9} {'+med':>6} {'med+':>6} {'+total':>7} {'sweep':>7} "
          f"{'capture':>8} {'sweep/capt':>10} {'shapes/s':>9}")
    for target in args.targets.split(","):
        r = bench(target.strip(), args.examples, args.max_size, args.repeat, args.plans, args.seed)
        if r is None:
            continue
        print(f"{r['target']:10} {r['scenarios']:>4} {r['median_ms_without']:>7.1f}ms {r['median_ms_with']:>8.1f}ms "
              f"{r['added_pct']:>5.1f}% {r['median_added_pct']:>5.1f}% {r['total_added_pct']:>6.1f}% {r['median_sweep_ms']:>6.2f}ms "
              f"{r['median_capture_ms']:>7.2f}ms {r['sweep_over_capture']:>10.3f} {r['shapes_per_s']:>9.0f}")
    print("(median per scenario, CPU ms of one process; +med: the sweep's share of the median scenario; "
          "med+: the median of each scenario's share; "
          "+total: of all scenarios; sweep/capt: total sweep CPU over total capture CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
