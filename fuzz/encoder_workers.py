"""An encoder campaign on several worker processes (``--workers N``).

Each worker searches its own seed's scenarios (``search_encoder``; worker
``w`` of a campaign seeded ``s`` draws from ``s + w * WORKER_SEED_STRIDE``,
so worker 0 draws what a one-process campaign draws) with its share of
``--max-examples``, and writes every finding into the run's one findings
folder the moment it sees it, as a one-process campaign does: a worker that
dies, or a campaign stopped by Ctrl-C, loses none.  A worker ends by writing
its counts to ``workers/<w>.json``.  The supervisor then keeps one finding
per property and documented defect over all workers (the most shrunk, then
the smallest scenario) and removes the others' files.

Workers are spawned (a fork of a process whose torch thread pool has run
deadlocks); the caller bounds their number
(``fuzz.campaign.options.bounded_workers``).  An adapter error in any worker
stops the campaign with its line (exit 2); a worker that dies without its
counts is named, and the findings it wrote stay.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from dataclasses import replace
from typing import Any

from cgsim.backends import get_backend
from cgsim.encoder.targets import encoder_target
from cgsim.finding import Finding
from cgsim.report.atomic import atomic_write_json
from cgsim.report.findings import scan_findings
from cgsim.targets.base import TargetEnvironmentError
from fuzz.encoder_search import EncoderCampaignResult, remove_encoder_finding, search_encoder

__all__ = ["run_encoder_workers", "keep_one_per_defect", "WORKER_SEED_STRIDE", "EncoderWorkerDied"]

WORKER_SEED_STRIDE = 1_000_003
# Which of two findings of one property and defect is kept: the further its shrink went.
_STATUS_RANK = {"shrunk": 0, "shrink-interrupted": 1, "shrinking": 2}


class EncoderWorkerDied(TargetEnvironmentError):
    """A worker process ended without its counts (killed, out of memory, a crash in native code)."""


def _share(total: int | None, workers: int, index: int) -> int | None:
    if total is None:
        return None
    return total // workers + (1 if index < total % workers else 0)


def _worker(o: Any, run_id: str, findings_dir: str, index: int, out_path: str) -> None:
    """One worker: search, then write its counts (or its error line) to ``out_path``."""
    result = EncoderCampaignResult(os.path.dirname(findings_dir), 0)
    counts: dict[str, Any] = {"worker": index}
    try:
        target = encoder_target(o.target)
        target.prepare_environment()
        found = search_encoder(o, target, get_backend(o.backend), run_id, findings_dir,
                               o.seed + index * WORKER_SEED_STRIDE, _share(o.max_examples, o.workers, index), result)
        counts["findings"] = [f.id for f in found]
    except TargetEnvironmentError as exc:
        counts["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    counts.update(scenarios=result.scenarios, refused=result.refused, checks=result.checks,
                  interrupted=result.interrupted)
    atomic_write_json(out_path, counts)


def run_encoder_workers(o: Any, run_id: str, findings_dir: str, result: Any) -> list[Finding]:
    """Run ``o.workers`` workers into ``findings_dir``, add their counts to
    ``result`` and return the findings kept (one per property and defect)."""
    run_dir = os.path.dirname(findings_dir)
    counts_dir = os.path.join(run_dir, "workers")
    os.makedirs(counts_dir, exist_ok=True)
    # Spawned, never forked: a fork of a process whose torch thread pool has run deadlocks in the child's first op.
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for w in range(o.workers):
        out_path = os.path.join(counts_dir, f"{w}.json")
        p = ctx.Process(target=_worker, args=(replace(o, quiet=True), run_id, findings_dir, w, out_path),
                        name=f"cgsim-encoder-worker-{w}", daemon=True)
        p.start()
        procs.append((w, p, out_path))
    try:
        for _w, p, _out in procs:
            p.join()
    except KeyboardInterrupt:
        result.interrupted = True
        for _w, p, _out in procs:  # each gets Ctrl-C from the terminal too; this reaches those that did not
            if p.is_alive():
                os.kill(p.pid, signal.SIGINT)
        for _w, p, _out in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()
    errors, died = [], []
    for w, p, out_path in procs:
        try:
            with open(out_path, encoding="utf-8") as fh:
                counts = json.load(fh)
        except (OSError, ValueError):
            if not result.interrupted:
                died.append(f"worker {w} (exit {p.exitcode})")
            continue
        result.scenarios += counts.get("scenarios", 0)
        result.refused += counts.get("refused", 0)
        for pid, n in (counts.get("checks") or {}).items():
            result.checks[pid] = result.checks.get(pid, 0) + n
        result.interrupted = result.interrupted or bool(counts.get("interrupted"))
        if counts.get("error"):
            errors.append(counts["error"])
    kept = keep_one_per_defect(findings_dir)
    if errors:
        raise TargetEnvironmentError(errors[0])
    if died:
        raise EncoderWorkerDied(
            f"{', '.join(died)} ended without its counts; the {len(kept)} finding(s) on disk are kept in {run_dir} "
            f"(python -m fuzz report {run_dir} renders them)")
    return kept


def _rank(f: Finding) -> tuple:
    return (_STATUS_RANK.get(f.status, 3), len(json.dumps(f.scenario, sort_keys=True)), f.id)


def keep_one_per_defect(findings_dir: str) -> list[Finding]:
    """One finding per (property, documented defect) of those on disk: the
    most shrunk, then the smallest scenario; the others' files removed."""
    best: dict[tuple[str, Any], Finding] = {}
    for f in sorted(scan_findings(findings_dir), key=_rank):
        key = (f.property, f.extra.get("defect"))
        if key in best:
            remove_encoder_finding(findings_dir, f)
        else:
            best[key] = f
    return list(best.values())
