"""How fast an unaided campaign finds each documented vLLM defect.

For every row of docs/findings.md (``cgsim.targets.vllm.known``) and every
vLLM environment given, run ``--seeds`` one-worker campaigns of ``--budget``
and report, per (defect, release): in how many seeds a finding recognised as
that defect appeared, and the median CPU seconds and scenarios before it was
first seen (over the seeds that found it).  Releases where a row is fixed must
show none of it; any finding that matches no documented defect is listed
(it is a new defect to document, or a cgsim bug).

    python benchmarks/bench_vllm_detect.py --python /path/to/venv/bin/python [--python ...] \\
        [--seeds 5] [--budget 60s] [--jobs N] [--out DIR [--reuse]] [--markdown FILE]

Each ``--python`` is an interpreter with a vLLM installed; ``--python
PY::SOURCE`` runs it with ``--vllm-source SOURCE``.  Campaigns run ``--jobs``
at a time (one core each); CPU seconds are the worker's own, so a busy machine
does not inflate them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROBE = r"""
import json, sys
from cgsim.report.findings import scan_findings
from cgsim.targets.vllm.compat import installed_version
from cgsim.targets.vllm.known import KNOWN_DEFECTS, classify
version = installed_version()
runs = {}
for run in sys.argv[1:]:
    rows = runs[run] = []
    for f in scan_findings(run + "/findings"):
        d = classify(f, version)
        rows.append({"property": f.property, "defect": d.row if d else None, "message": f.message[:200],
                     "cpu_s": f.extra.get("first_seen_cpu_s"), "wall_s": f.extra.get("first_seen_s"),
                     "scenarios": f.extra.get("first_seen_scenarios")})
print(json.dumps({"version": version, "present": [d.row for d in KNOWN_DEFECTS if d.present_in(version)],
                  "runs": runs}))
"""


def _env(source: str | None) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if source:
        env["CGSIM_VLLM_SOURCE"] = source
    return env


def campaign(python: str, source: str | None, seed: int, budget: str, out: str) -> str:
    cmd = [python, "-m", "fuzz", "run", "--target", "vllm", "--budget", budget, "--seed", str(seed),
           "--workers", "1", "--report-dir", out, "--quiet"]
    subprocess.run(cmd, cwd=ROOT, env=_env(source), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = sorted(d for d in os.listdir(out) if d[:1].isdigit())
    return os.path.join(out, runs[-1]) if runs else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", required=True, help="a vLLM interpreter (PY or PY::SOURCE)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", default="60s")
    ap.add_argument("--out", default=None, help="keep the campaign reports here")
    ap.add_argument("--markdown", default=None, help="also write the table as Markdown")
    ap.add_argument("--jobs", type=int, default=1, help="campaigns at a time (one core each)")
    ap.add_argument("--reuse", action="store_true",
                    help="with --out: classify the campaigns already there again instead of re-running them "
                         "(after a change to the classifier)")
    args = ap.parse_args(argv)
    out_root = args.out or tempfile.mkdtemp(prefix="cgsim-detect-")
    table: list[tuple] = []
    unlabelled: list[tuple] = []
    from cgsim.targets.vllm.known import KNOWN_DEFECTS  # noqa: PLC0415

    specs = [spec.partition("::")[::2] for spec in args.python]
    tasks = [(i, seed) for i in range(len(specs)) for seed in range(1, args.seeds + 1)]

    def run_one(task: tuple[int, int]) -> str:
        i, seed = task
        python, source = specs[i]
        d = os.path.join(out_root, f"{i}-{os.path.basename(os.path.dirname(os.path.dirname(python)))}-seed{seed}")
        os.makedirs(d, exist_ok=True)
        done = sorted(r for r in os.listdir(d) if r[:1].isdigit())
        if args.reuse and done:
            return os.path.join(d, done[-1])
        return campaign(python, source or None, seed, args.budget, d)

    # Campaigns in parallel (--jobs) each take one core; CPU seconds stay each worker's own.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = dict(zip(tasks, pool.map(run_one, tasks)))
    for i, (python, source) in enumerate(specs):
        # One probe per release (its vLLM imported once) classifies every seed's findings.
        seed_runs = [runs[(i, seed)] for seed in range(1, args.seeds + 1)]
        p = subprocess.run([python, "-c", _PROBE, *[r for r in seed_runs if r]], cwd=ROOT,
                           env=_env(source or None), capture_output=True, text=True)
        data = json.loads(p.stdout.strip().splitlines()[-1])
        version, present = data["version"] + (" (source)" if source else ""), data["present"]
        # the classified findings of each seed's campaign
        per_seed: list[list[dict]] = [data["runs"].get(r, []) if r else [] for r in seed_runs]
        for d in KNOWN_DEFECTS:
            firsts = [min((r for r in rows if r["defect"] == d.row and r["cpu_s"] is not None), key=lambda r: r["cpu_s"])
                      for rows in per_seed if any(r["defect"] == d.row and r["cpu_s"] is not None for r in rows)]
            cpu = statistics.median(f["cpu_s"] for f in firsts) if firsts else None
            scen = statistics.median(f["scenarios"] for f in firsts) if firsts else None
            table.append((d.row, d.name, version, d.row in present, len(firsts), args.seeds, cpu, scen))
        unlabelled += [(version, r["property"], r["message"]) for rows in per_seed for r in rows if r["defect"] is None]
    lines = ["| # | defect | release | present | found in | median CPU s | median scenarios |",
             "|---|---|---|---|---:|---:|---:|"]
    for row, name, version, present, found, seeds, cpu, scen in table:
        lines.append(f"| {row} | {name} | {version} | {'yes' if present else 'fixed'} | {found}/{seeds} | "
                     f"{'-' if cpu is None else f'{cpu:.1f}'} | {'-' if scen is None else f'{scen:g}'} |")
    text = "\n".join(lines)
    print(text)
    if unlabelled:
        print("\nfindings that match no documented defect (document them, or fix cgsim):")
        for version, prop, msg in sorted(set(unlabelled)):
            print(f"  [{version}] {prop}: {msg}")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    print(f"\nreports: {out_root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
