"""``python -m fuzz run --target vllm-encoder | encoder-reference |
encoder-mutant:NAME``: a campaign over encoder scenarios in one process.

The search (``fuzz.encoder_search``) runs here, or on ``--workers``
processes (``fuzz.encoder_workers``).  Hypothesis draws scenarios; each is
reached through the target's front door (refusals counted), run and judged.
A property seen failing for the first time is written at once (status
"shrinking"), shrunk with that property pinned (``cgsim.encoder.shrink``, at
most ``shrink_limit_s``) and written again ("shrunk" or
"shrink-interrupted"); findings go to disk atomically the
moment they are confirmed, each with its repro script (``repro_<id>.py``,
written first: a finding on disk always has its script), so a stop at any
point loses none.  The report (summary.json, and index.md and index.html
rendered from it by ``cgsim.report.encoder``) is written at the end, or on
Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from typing import Callable

from cgsim.backends import get_backend
from cgsim.encoder.targets import encoder_target
from cgsim.finding import Finding
from cgsim.properties.encoder import ENCODER_PROPERTIES
from cgsim.report.atomic import atomic_write_json, atomic_write_text
from cgsim.report.encoder import render_encoder_html, render_encoder_markdown
from cgsim.report.findings import finding_path, scan_findings
from cgsim.report.repro import write_repro
from cgsim.report.summary import update_latest
from fuzz.campaign.options import UsageError, bounded_workers, parse_budget
from fuzz.encoder_search import (EncoderCampaignOptions, EncoderCampaignResult, encoder_finding,
                                 remove_encoder_finding, search_encoder, write_encoder_finding)

# The search's values and writers are re-exported: the campaign's callers take them from here.
__all__ = ["EncoderCampaignOptions", "EncoderCampaignResult", "encoder_finding", "is_encoder_run",
           "rebuild_encoder_report", "run_encoder_campaign", "search_encoder", "write_encoder_finding",
           "remove_encoder_finding", "run_from_arguments", "rebuild_from_command_line"]


def _replay_command(path: str) -> str:
    return f"python -m fuzz replay {path}"


def run_encoder_campaign(o: EncoderCampaignOptions, say: Callable[[str], None] = print) -> EncoderCampaignResult:
    target = encoder_target(o.target)
    target.prepare_environment()
    self_check = target.tooling.self_check
    if self_check is not None:  # an engine's adapter proves its mechanics before anything is judged
        self_check()
    backend = get_backend(o.backend)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"
    run_dir = os.path.join(o.report_dir, run_id)
    findings_dir = os.path.join(run_dir, "findings")
    os.makedirs(findings_dir, exist_ok=True)
    result = EncoderCampaignResult(run_dir, 0)
    start = time.monotonic()
    ruleset = target.default_ruleset()
    if o.workers > 1:
        from fuzz.encoder_workers import run_encoder_workers  # noqa: PLC0415 - processes only where asked for

        found = run_encoder_workers(o, run_id, findings_dir, result)
    else:
        found = search_encoder(o, target, backend, run_id, findings_dir, o.seed, o.max_examples, result,
                               say if not o.quiet else None)
    result.findings = found
    result.exit_code = 130 if result.interrupted else (1 if result.findings else 0)
    _write_report(o, result, run_id, ruleset, time.monotonic() - start, target.environment())
    update_latest(o.report_dir, run_id)
    if not o.quiet:
        for f in result.findings:
            label = f" (documented: {f.extra['defect']})" if f.extra.get("defect") else ""
            say(f"  {f.property} [{f.status}]{label} {f.message}")
            if f.extra.get("launch"):
                say(f"    launch: {f.extra['launch']['line']}")
            say(f"    replay: {_replay_command(os.path.abspath(finding_path(findings_dir, f)))}")
            say(f"    repro:  python {os.path.abspath(os.path.join(findings_dir, f.repro))}")
        workers = f" on {o.workers} workers" if o.workers > 1 else ""
        say(f"{result.scenarios} scenarios ({result.refused} refused){workers}, {len(result.findings)} findings; "
            f"report: {os.path.abspath(os.path.join(run_dir, 'index.html'))} (as text: index.md)")
    return result


def run_from_arguments(args: argparse.Namespace, command: str) -> int:
    """An encoder campaign as ``python -m fuzz run``'s flags ask for it: Hypothesis draws on one
    process or ``--workers``, shrinks pinned to a property; its exit status."""
    unsupported = [flag for flag, given in (("--ray", args.ray), ("--gpus", args.gpus),
                                            ("--example-db", args.example_db), ("--ruleset", args.ruleset),
                                            ("--diff-base", args.diff_base)) if given]
    if unsupported:
        raise UsageError(f"{', '.join(unsupported)} is not taken by the encoder target {args.target} (its workers "
                         "run on this machine, judged by its own design); leave it out")
    workers = bounded_workers(args.workers or 1, args.backend, args.force_workers)
    budget = (parse_budget(args.budget, flag="--budget") if args.budget is not None else None) or 60.0
    limit = parse_budget(args.shrink_limit, flag="--shrink-limit", zero=True) if args.shrink_limit is not None else None
    options = EncoderCampaignOptions(
        target=args.target, backend=args.backend, budget_s=budget, seed=args.seed or 0,
        max_examples=args.max_examples, report_dir=args.report_dir,
        shrink_limit_s=limit if limit else max(5.0, budget / 10), quiet=args.quiet, workers=workers,
        command=command)
    return run_encoder_campaign(options).exit_code


def _summary_entry(f: Finding) -> dict:
    return {"id": f.id, "property": f.property, "statement": f.statement, "status": f.status, "message": f.message,
            "defect": f.extra.get("defect"), "launch": (f.extra.get("launch") or {}).get("line"),
            "scenario": f.scenario_short, "file": os.path.join("findings", f"{f.id}.json"),
            "repro": os.path.join("findings", f.repro)}


def _write_pages(run_dir: str, summary: dict) -> None:
    atomic_write_json(os.path.join(run_dir, "summary.json"), summary)
    atomic_write_text(os.path.join(run_dir, "index.md"), render_encoder_markdown(summary))
    atomic_write_text(os.path.join(run_dir, "index.html"), render_encoder_html(summary))


def _read_summary(run_dir: str) -> dict | None:
    try:
        with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _findings_on_disk(run_dir: str) -> list[Finding]:
    return scan_findings(os.path.join(run_dir, "findings"))


def is_encoder_run(run_dir: str) -> bool:
    """Whether ``run_dir`` is an encoder campaign's: its summary says so, or
    (a campaign that died before writing one) its findings are encoder findings."""
    summary = _read_summary(run_dir)
    if summary is not None:
        return summary.get("schema") == "cgsim.encoder-summary"
    found = _findings_on_disk(run_dir) if os.path.isdir(os.path.join(run_dir, "findings")) else []
    return bool(found) and all(isinstance(f.scenario, dict) and f.scenario.get("kind") == "encoder" for f in found)


def rebuild_encoder_report(run_dir: str, say: Callable[[str], None] = print) -> int:
    """``python -m fuzz report RUN_DIR`` for an encoder run: every finding on
    disk gets its repro script where it lacks one, and summary.json's
    findings become those on disk; index.md and index.html are rendered
    again.  A run that died before its summary gets one from its findings
    (counts unknown, "interrupted").  Exit 1 with findings, else 0."""
    findings = _findings_on_disk(run_dir)
    for f in findings:
        if not os.path.exists(os.path.join(run_dir, "findings", f.repro)):
            write_repro(os.path.join(run_dir, "findings"), f)
    summary = _read_summary(run_dir)
    if summary is None:
        first = findings[0] if findings else None
        summary = {
            "schema": "cgsim.encoder-summary", "schema_version": 1, "run_id": os.path.basename(os.path.abspath(run_dir)),
            "target": first.target if first else None, "backend": first.backend if first else None,
            "ruleset": first.ruleset if first else None, "seed": first.seed if first else None, "command": "",
            "elapsed_s": None, "interrupted": "campaign died (report rebuilt from the findings on disk)",
            "scenarios": None, "refused": None, "environment": first.extra.get("environment", {}) if first else {},
            "properties": {pid: {"statement": p.statement, "checks": None, "failures": 0}
                           for pid, p in ENCODER_PROPERTIES.items()},
        }
    summary["findings"] = [_summary_entry(f) for f in findings]
    for pid, entry in summary.get("properties", {}).items():
        entry["failures"] = sum(1 for f in findings if f.property == pid)
    _write_pages(run_dir, summary)
    say(f"{len(findings)} findings; report: {os.path.abspath(os.path.join(run_dir, 'index.html'))} (as text: index.md)")
    return 1 if findings else 0


def rebuild_from_command_line(run_dir: str, quiet: bool) -> int:
    """``python -m fuzz report RUN_DIR`` for an encoder run; its exit status."""
    return rebuild_encoder_report(run_dir, say=(lambda line: None) if quiet else print)


def _write_report(o: EncoderCampaignOptions, r: EncoderCampaignResult, run_id: str, ruleset: str, elapsed: float,
                  environment: dict) -> None:
    """summary.json, then index.md and index.html rendered from it."""
    summary = {
        "schema": "cgsim.encoder-summary", "schema_version": 1, "run_id": run_id, "target": o.target,
        "backend": o.backend, "ruleset": ruleset, "seed": o.seed, "command": o.command,
        "elapsed_s": round(elapsed, 3), "interrupted": r.interrupted, "scenarios": r.scenarios,
        "refused": r.refused, "environment": environment,
        "properties": {pid: {"statement": p.statement, "checks": r.checks.get(pid, 0),
                             "failures": sum(1 for f in r.findings if f.property == pid)}
                       for pid, p in ENCODER_PROPERTIES.items()},
        "findings": [_summary_entry(f) for f in r.findings],
    }
    _write_pages(r.run_dir, summary)
