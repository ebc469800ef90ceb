"""``python -m fuzz run --target vllm-encoder | encoder-reference |
encoder-mutant:NAME``: a campaign over encoder scenarios in one process.

Hypothesis draws scenarios; each is reached through the target's front door
(refusals counted), run and judged.  A property seen failing for the first
time is written at once (status "shrinking"), shrunk with that property
pinned (``cgsim.encoder.shrink``, at most ``shrink_limit_s``) and written
again ("shrunk" or "shrink-interrupted"); findings go to disk atomically the
moment they are confirmed, each with its repro script (``repro_<id>.py``,
written first: a finding on disk always has its script), so a stop at any
point loses none.  The report (summary.json, and index.md and index.html
rendered from it by ``cgsim.report.encoder``) is written at the end, or on
Ctrl-C."""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from cgsim.backends import get_backend
from cgsim.encoder.observe import observe_encoder
from cgsim.encoder.shrink import shrink_encoder_scenario
from cgsim.encoder.targets import encoder_target
from cgsim.encoder.values import EncoderScenario
from cgsim.finding import Finding
from cgsim.properties.encoder import ENCODER_PROPERTIES
from cgsim.report.atomic import atomic_write_json, atomic_write_text
from cgsim.report.encoder import render_encoder_html, render_encoder_markdown
from cgsim.report.findings import finding_path, scan_findings, write_finding
from cgsim.report.repro import write_repro
from cgsim.report.summary import update_latest
from cgsim.targets.base import ENCODER_HOOKS, TargetEnvironmentError, optional_hook
from cgsim.targets.registry import source_options
from fuzz.encoder_strategies import encoder_scenarios

__all__ = ["EncoderCampaignOptions", "EncoderCampaignResult", "encoder_finding", "is_encoder_run",
           "rebuild_encoder_report", "run_encoder_campaign", "search_encoder", "write_encoder_finding",
           "remove_encoder_finding"]


@dataclass(frozen=True)
class EncoderCampaignOptions:
    target: str
    backend: str = "mock"
    budget_s: float = 60.0
    seed: int = 0
    max_examples: int | None = None
    report_dir: str = "reports"
    shrink_limit_s: float = 10.0
    quiet: bool = False
    command: str = ""
    workers: int = 1  # processes, each drawing its own seed's scenarios (bounded by the caller: bounded_workers)


@dataclass
class EncoderCampaignResult:
    run_dir: str
    exit_code: int
    scenarios: int = 0
    refused: int = 0
    findings: list = field(default_factory=list)
    checks: dict = field(default_factory=dict)
    interrupted: bool = False


_CHUNK = 50


def _replay_command(path: str) -> str:
    return f"python -m fuzz replay {path}"


def encoder_finding(target: Any, obs: Any, violation: Any, backend: str, defect: str | None = None,
                    **changes: Any) -> Finding:
    """The finding of ``violation`` in the observation ``obs`` of ``target``
    (its scenario as the engine reached it, the launch line that reaches it,
    the documented ``defect`` it is an instance of); ``changes`` as
    ``Finding.with_`` takes them (``extra`` merged)."""
    f = Finding.from_violation(violation, obs.scenario.to_json(), target.name, backend, obs.scenario.short())
    environment = target.environment()
    extra: dict[str, Any] = {"environment": environment}
    # The source tree it ran on (its description too), where the replay and the repro script look for it (as
    # decode findings).
    recorded = tuple(o.recorded_as for o in source_options() if o.recorded_as)
    extra.update({k: v for k, v in environment.items() if k.startswith(recorded)})
    if obs.launch is not None:
        extra["launch"] = obs.launch
    if defect is not None:
        extra["defect"] = defect
    extra.update(changes.pop("extra", {}))
    return f.with_(extra=extra, **changes)


def write_encoder_finding(findings_dir: str, finding: Finding) -> str:
    """The finding's repro script, then the finding (both atomically): a
    finding on disk always has its script."""
    write_repro(findings_dir, finding)
    return write_finding(findings_dir, finding)


def remove_encoder_finding(findings_dir: str, finding: Finding) -> None:
    """The finding and its repro script off the disk."""
    os.remove(finding_path(findings_dir, finding))
    try:
        os.remove(os.path.join(findings_dir, finding.repro))
    except FileNotFoundError:
        pass


def run_encoder_campaign(o: EncoderCampaignOptions, say: Callable[[str], None] = print) -> EncoderCampaignResult:
    target = encoder_target(o.target)
    target.prepare_environment()
    self_check = optional_hook(target, "self_check", ENCODER_HOOKS)
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


def search_encoder(o: EncoderCampaignOptions, target: Any, backend: Any, run_id: str, findings_dir: str, seed: int,
                   max_examples: int | None, result: EncoderCampaignResult,
                   say: Callable[[str], None] | None = None) -> list[Finding]:
    """Draw, run and judge scenarios from ``seed`` until the budget or
    ``max_examples`` is spent, counting into ``result``; each finding is
    written the moment it is first seen and again once shrunk.  The
    findings, one per property and documented defect.  Ctrl-C ends the
    search (``result.interrupted``); an adapter error is raised."""
    # One finding per property and documented defect: a new defect behind a property already found is still sought.
    found: dict[tuple[str, str | None], Finding] = {}
    start = time.monotonic()
    ruleset = target.default_ruleset()
    # A setting the engine has no field for is only ever refused: drawn where it exists.
    takes_cap = (optional_hook(target, "takes_max_token_budget", ENCODER_HOOKS) or (lambda: True))()

    classify = optional_hook(target, "classify", ENCODER_HOOKS)

    def defect_of(obs: Any, v: Any) -> str | None:
        return classify(obs.scenario, obs.trace, v).get("defect") if classify is not None else None

    def violation(obs: Any, key: tuple[str, str | None]) -> Any:
        return next((v for v in obs.verdict.violations if (v.property, defect_of(obs, v)) == key), None)

    def finding_for(key: tuple[str, str | None], obs: Any, status: str, first: Finding | None = None) -> Finding:
        extra: dict[str, Any] = {"campaign_seed": o.seed}
        if first is not None:
            extra["first_seen"] = first.id
        return encoder_finding(target, obs, violation(obs, key), o.backend, key[1], status=status, run_id=run_id,
                               seed=seed, elapsed_s=round(time.monotonic() - start, 3), extra=extra)

    def shrink(key: tuple[str, str | None], sc: EncoderScenario, first: Finding) -> Finding:
        def fails(candidate: EncoderScenario) -> bool:  # the property and defect pinned
            return violation(observe_encoder(target, candidate, backend), key) is not None

        smallest, complete = shrink_encoder_scenario(sc, fails, time.monotonic() + o.shrink_limit_s)
        obs = observe_encoder(target, smallest, backend)
        if violation(obs, key) is None:  # the shrink keeps only failing scenarios; a flaky target lands here
            return first
        final = finding_for(key, obs, "shrunk" if complete else "shrink-interrupted", first)
        write_encoder_finding(findings_dir, final)
        if final.id != first.id:
            remove_encoder_finding(findings_dir, first)
        return final

    drawn = [0]

    def out_of_time() -> bool:
        return time.monotonic() - start >= o.budget_s or bool(max_examples and drawn[0] >= max_examples)

    stopped: list[BaseException] = []

    def body(data: Any) -> None:
        # Drawn before the clock is read: Hypothesis requires the same draws for the same data.
        sc = data.draw(encoder_scenarios(ruleset=ruleset, cap=takes_cap))
        if out_of_time() or stopped:
            return  # the rest of this chunk's draws are skipped
        drawn[0] += 1
        result.scenarios += 1
        try:
            obs = observe_encoder(target, sc, backend)
        except TargetEnvironmentError as exc:  # cgsim's adapter, not the manager: stop, exit 2 outside Hypothesis
            stopped.append(exc)
            return
        if obs.refused is not None:
            result.refused += 1
            return
        for pid in obs.verdict.checked:
            result.checks[pid] = result.checks.get(pid, 0) + 1
        for key in dict.fromkeys((v.property, defect_of(obs, v)) for v in obs.verdict.violations):
            if key in found:
                continue
            first = finding_for(key, obs, "shrinking")
            write_encoder_finding(findings_dir, first)  # on disk, with its repro script, before the shrink starts
            found[key] = first
            if say is not None:
                say(f"found {key[0]} in {time.monotonic() - start:.1f}s: {first.message}")
            found[key] = shrink(key, obs.scenario, first)

    chunk = 0
    try:
        # Chunks of draws, each a Hypothesis run seeded from the campaign seed: repeatable with --seed.
        while not out_of_time() and not stopped:
            test = settings(max_examples=_CHUNK, deadline=None, database=None, phases=[Phase.generate],
                            suppress_health_check=list(HealthCheck))(
                hypothesis_seed(seed * 100_003 + chunk)(given(st.data())(body)))
            test()
            chunk += 1
    except KeyboardInterrupt:
        result.interrupted = True
    if stopped:
        raise stopped[0]
    return list(found.values())


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
