"""The sglang target's fuzzing speed, and how fast Hypothesis finds each sglang mutant.

    VENV/bin/python benchmarks/bench_sglang.py [--seeds 5] [--max-examples 400] [--examples 200]
    VENV/bin/python benchmarks/bench_sglang.py --runner-mutations [--seeds 5] [--limit-s 60] [--only NAME,...]

Run in the sglang environment (scripts/install_sglang.sh).  In one run, one
core (``torch.set_num_threads(1)``), ``fuzz.strategies.scenarios`` with the
sglang target's ``config_strategy``
(what a campaign against the target draws), generate phase only, no database:

- throughput: ``--examples`` scenarios against ``sglang``, each run on the mock
  and judged with every property; scenarios per second = examples / wall time;
- detection: for each mutant and each of ``--seeds`` seeds, the examples and
  seconds until the first scenario where the mutant's ``caught_by`` property
  fails (findings the clean sglang also has do not count); at most
  ``--max-examples`` per seed.  Medians over the seeds that found it.

``--runner-mutations``: for each one-line bug of
``cgsim.targets.sglang.mutation.MUTATIONS`` (put into sglang's own runner
modules by the import hook, one fresh process per mutation), the examples
and seconds until the first scenario with a failure no documented defect of
the release explains (``cgsim.targets.sglang.known``), per seed, within
``--limit-s`` seconds and ``--max-examples`` scenarios per seed: what a
campaign's generate phase does, without its shrinking and reporting.

sglang's import and warm-up (prepare_environment) happen before any clock
starts.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as seed_dec  # noqa: E402

from cgsim.properties import check_scenario  # noqa: E402
from cgsim.runner import run_scenario  # noqa: E402
from cgsim.targets import get_target  # noqa: E402
from cgsim.targets.sglang import SglangTarget  # noqa: E402
from fuzz.strategies import scenarios  # noqa: E402


class _Found(Exception):
    pass


def _settings(n: int) -> settings:
    return settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))


def _ruleset() -> str:
    from cgsim.targets.sglang.compat import probe

    return probe().ruleset


def throughput(n: int) -> tuple[int, float]:
    count = [0]

    @_settings(n)
    @given(scenarios(ruleset=_ruleset(), config_strategy=SglangTarget().drawing.config_strategy))
    def body(sc):
        check_scenario(sc, run_scenario(sc, target="sglang", timeout=120))
        count[0] += 1

    t = time.perf_counter()
    body()
    return count[0], time.perf_counter() - t


def detect(name: str, prop: str, seed: int, limit: int) -> tuple[int, float] | None:
    count = [0]

    @seed_dec(seed)
    @_settings(limit)
    @given(scenarios(ruleset=_ruleset(), config_strategy=SglangTarget().drawing.config_strategy))
    def body(sc):
        count[0] += 1
        verdict = check_scenario(sc, run_scenario(sc, target=f"sglang-mutant:{name}", timeout=120))
        if prop in {v.property for v in verdict.violations}:
            raise _Found()

    t = time.perf_counter()
    try:
        body()
    except _Found:
        return count[0], time.perf_counter() - t
    return None


class _OutOfTime(Exception):
    pass


def detect_unexplained(seed: int, limit: int, limit_s: float) -> dict:
    """Examples, seconds and the property until the first failure no
    documented defect explains (this process's sglang carries the mutation)."""
    from cgsim.spec.rulesets import get_ruleset
    from cgsim.targets.sglang.compat import probe
    from cgsim.targets.sglang.known import explains

    tree = probe()
    ruleset = tree.ruleset
    count = [0]
    found: dict = {}
    t = time.perf_counter()

    @seed_dec(seed)
    @_settings(limit)
    @given(scenarios(ruleset=ruleset, config_strategy=SglangTarget().drawing.config_strategy))
    def body(sc):
        if time.perf_counter() - t > limit_s:
            raise _OutOfTime()
        count[0] += 1
        verdict = check_scenario(sc, run_scenario(sc, target="sglang", timeout=120))
        config = get_ruleset(ruleset).effective_config(sc.config)
        for v in verdict.violations:
            if explains(v.property, v.record(), config, tree.version) is None:
                found.update(property=v.property, message=v.message[:200])
                raise _Found()

    try:
        body()
    except _Found:
        return dict(found, examples=count[0], seconds=round(time.perf_counter() - t, 1))
    except _OutOfTime:
        pass
    return {"examples": count[0], "seconds": round(time.perf_counter() - t, 1)}


def runner_mutations(a: argparse.Namespace) -> int:
    """One process per mutation (the import hook acts on sglang's first import)."""
    from cgsim.targets.sglang.mutation import MUTATIONS, environment_for

    only = set(a.only.split(",")) if a.only else None
    print("| mutation | area | found in | median examples | median s | max s | by |")
    print("|---|---|---:|---:|---:|---:|---|")
    for m in MUTATIONS:
        if only is not None and m.name not in only:
            continue
        env = dict(os.environ, **environment_for([m]))
        cmd = [sys.executable, __file__, "--detect-mutation", "--seeds", str(a.seeds), "--limit-s", str(a.limit_s),
               "--max-examples", str(a.max_examples)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.seeds * (a.limit_s + 60) + 120)
        try:
            runs = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            print(f"| {m.name} | {m.area} | error: {res.stderr.strip().splitlines()[-1:]} | | | | |")
            continue
        hits = [r for r in runs if "property" in r]
        props = sorted({r["property"] for r in hits})
        med = (f"{statistics.median(r['examples'] for r in hits):g} | {statistics.median(r['seconds'] for r in hits):.1f}"
               f" | {max(r['seconds'] for r in hits):.1f}" if hits else "- | - | -")
        print(f"| {m.name} | {m.area} | {len(hits)}/{len(runs)} | {med} | {', '.join(props)} |", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-examples", type=int, default=400)
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--runner-mutations", action="store_true", help="the runner-code mutation table")
    ap.add_argument("--limit-s", type=float, default=60.0, help="per seed, with --runner-mutations")
    ap.add_argument("--only", default=None, help="comma list of mutation names, with --runner-mutations")
    ap.add_argument("--detect-mutation", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.runner_mutations:
        return runner_mutations(a)
    if a.detect_mutation:
        get_target("sglang").prepare_environment()
        print(json.dumps([detect_unexplained(s, a.max_examples, a.limit_s) for s in range(a.seeds)]))
        return 0
    get_target("sglang").prepare_environment()
    from cgsim.targets.sglang.mutants import MUTANTS

    n, secs = throughput(a.examples)
    print(f"throughput: {n} scenarios in {secs:.1f} s = {n / secs:.2f} scenarios/s (sglang, mock, 1 core)")
    print("| mutant | caught by | found in | median examples | median s |")
    print("|---|---|---:|---:|---:|")
    for name, m in MUTANTS.items():
        runs = [r for r in (detect(name, m.caught_by, s, a.max_examples) for s in range(a.seeds)) if r is not None]
        med = (f"{statistics.median(r[0] for r in runs):g} | {statistics.median(r[1] for r in runs):.1f}"
               if runs else "- | -")
        print(f"| {name} | {m.caught_by} | {len(runs)}/{a.seeds} | {med} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
