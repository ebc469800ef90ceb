"""What the engine parts of the agreement corpus share (vllm_agreement.py,
sglang_agreement.py): record a list of scenarios on the mock (``make``),
then run every entry of a corpus in a fresh child process on a backend and
compare verdicts, dispatch decisions (steps and sweeps) and, within
OUTPUT_ATOL, replayed rows with what was recorded (``check``).

Each entry runs in its own child (a device-side assert poisons a CUDA
context for good; engines keep class-level capture state), forked from a
parent that imported the engine once, so the one-time import is paid once.
A disagreement is a mock or adapter bug to fix, never an engine finding.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import sys
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.agreement.observe import observe  # noqa: E402

OUTPUT_ATOL = 1e-3  # as for cgsim's own manager: the same kernels on padded shapes
# What a stale metadata read yields depends on the allocator's choices (a
# documented mock limit), so where both backends see METADATA-LIVE these are
# not compared.
STALE_READ_CONSEQUENCES = {"REPLAY-EQUALS-EAGER", "NO-ILLEGAL-OP", "NO-CRASH"}


def observe_entry(args: tuple[dict, str]) -> dict:
    entry, backend = args
    t0 = time.time()
    try:
        seen = observe(entry, backend)
    except BaseException as exc:  # noqa: BLE001 - the child reports, the parent judges
        seen = {"error": f"{type(exc).__name__}: {exc}"}
    seen["seconds"] = round(time.time() - t0, 2)
    return seen


def _pool(jobs: int):
    # Fork after the engine is imported (no CUDA context yet in the parent):
    # each entry gets a fresh process without paying the import again.  A
    # parent that started CUDA cannot fork children that use it: spawn then.
    import torch

    method = "spawn" if torch.cuda.is_initialized() else "fork"
    if method == "spawn":
        print("CUDA started in the parent: spawning each child (each imports the engine again)")
    return multiprocessing.get_context(method).Pool(processes=jobs, maxtasksperchild=1)


def make(todo: list[tuple[str, dict]], target: str, label: str, out: str, jobs: int) -> int:
    """Record ``todo`` ((id, scenario JSON) pairs) on the mock into ``out``;
    entries the engine refuses (unsupported, or the observer failed) are left out."""
    import json

    from cgsim.targets import get_target

    get_target(target).prepare_environment()
    with _pool(jobs) as pool:
        seen = pool.map(observe_entry, [({"scenario": s, "target": target}, "mock") for _, s in todo], chunksize=1)
    kept = 0
    with open(out, "w", encoding="utf-8") as fh:
        for (entry_id, scenario), s in zip(todo, seen):
            if "error" in s or s.get("unsupported"):
                print(f"left out {entry_id}: {s.get('error') or s.get('unsupported')}")
                continue
            expected = {k: s[k] for k in ("violations", "dispatch", "sweeps", "outputs", "managers")}
            fh.write(json.dumps({"id": entry_id, "target": target, "scenario": scenario, "expected": expected},
                                sort_keys=True) + "\n")
            kept += 1
    print(f"wrote {kept} {label} entries to {out} ({len(todo) - kept} the release refuses)")
    return 0


def compare(entry: dict, seen: dict) -> list[str]:
    """Why ``seen`` disagrees with the entry's expectation (empty: it agrees)."""
    if "error" in seen:
        return [f"observer failed: {seen['error']}"]
    want = entry["expected"]
    stale = "METADATA-LIVE" in want["violations"] and "METADATA-LIVE" in seen["violations"]
    ignore = STALE_READ_CONSEQUENCES if stale else set()
    problems = []
    if sorted(set(seen["violations"]) - ignore) != sorted(set(want["violations"]) - ignore):
        problems.append(f"violations {seen['violations']} != expected {want['violations']}")
    if stale:
        return problems
    problems += _decisions_differ(want, seen, "")
    if "managers" not in want:  # recorded before sub-managers were observed
        return problems
    for name in sorted(set(want["managers"]) | set(seen["managers"])):
        if name not in seen["managers"]:
            problems.append(f"{name}: not driven")
        elif name not in want["managers"]:
            problems.append(f"{name}: driven, but not when recorded")
        else:
            problems += _decisions_differ(want["managers"][name], seen["managers"][name], f"{name}: ")
    return problems


def _decisions_differ(want: dict, seen: dict, where: str) -> list[str]:
    """Where one manager's dispatch decisions, sweep digests or replayed rows differ."""
    problems = []
    if seen["dispatch"] != want["dispatch"]:
        problems.append(f"{where}dispatch decisions differ")
    if seen["sweeps"] != want["sweeps"]:
        problems.append(f"{where}sweep decisions differ")
    for step, values in want["outputs"].items():
        got = seen["outputs"].get(step)
        if got is None:
            problems.append(f"{where}step {step}: no output")
            continue
        pairs = [(a, b) for ra, rb in zip(values, got) for a, b in zip(ra, rb) if math.isfinite(a)]
        err = max((abs(a - b) for a, b in pairs), default=0.0)
        if len(values) != len(got) or not math.isfinite(err) or err > OUTPUT_ATOL:
            problems.append(f"{where}step {step}: outputs differ by {err:g}")
    return problems


def check(corpus: str, target: str, label: str, backend: str, jobs: int, out_json: str | None,
          only: str | None = None) -> int:
    import json

    from cgsim.targets import get_target

    get_target(target).prepare_environment()
    entries = [json.loads(line) for line in open(corpus, encoding="utf-8")]
    if only:
        entries = [e for e in entries if only in e["id"]]
    t0 = time.time()
    with _pool(jobs) as pool:
        seen = pool.map(observe_entry, [(e, backend) for e in entries], chunksize=1)
    rows, bad = [], 0
    for e, s in zip(entries, seen):
        problems = compare(e, s)
        bad += bool(problems)
        rows.append({"id": e["id"], "agree": not problems, "problems": problems, "seconds": s.get("seconds"),
                     "violations": s.get("violations"), "messages": s.get("messages") if problems else None})
        print(f"{'ok  ' if not problems else 'DIFF'} {e['id']:60} {s.get('seconds', 0):6.1f}s"
              + ("" if not problems else "  " + "; ".join(problems)))
        if problems and s.get("messages"):
            print(f"     {s['messages'][0][:400]}")  # what the observer saw, so a GPU log alone says why
    print(f"{len(entries) - bad}/{len(entries)} {label} entries agree on {backend} ({time.time() - t0:.0f}s, {jobs} jobs)")
    if out_json:
        with open(out_json, "w", encoding="utf-8") as fh:
            json.dump({"backend": backend, "entries": rows}, fh, indent=1)
    return 1 if bad else 0


def main(argv: list[str] | None, doc: str, corpus: str, target: str, label: str,
         entries_to_record: Callable[[], list[tuple[str, dict]]]) -> int:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("--out", default=corpus)
    mk.add_argument("--jobs", type=int, default=2)
    ck = sub.add_parser("check")
    ck.add_argument("--backend", default="cuda")
    ck.add_argument("--corpus", default=corpus)
    ck.add_argument("--jobs", type=int, default=8)
    ck.add_argument("--json", default=None)
    ck.add_argument("--only", default=None, help="only the entries whose id contains this")
    args = ap.parse_args(argv)
    if args.cmd == "make":
        return make(entries_to_record(), target, label, args.out, args.jobs)
    return check(args.corpus, target, label, args.backend, args.jobs, args.json, args.only)
