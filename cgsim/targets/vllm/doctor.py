"""The vLLM adapter's self-check: scenarios with known outcomes on the vLLM
that imports here, run before every vLLM campaign and by ``python -m fuzz
doctor``.

It proves the adapter's mechanics, not vLLM's correctness: that it builds
the manager through vLLM's front door, captures, dispatches, replays and
releases, and that the trace records every step.  A mechanism that broke (an
adapter error, a trace with a step missing, the plainest config refused) is
exit 2 with one line, before anything is reported about vLLM.  A property a
scenario violates that no documented defect of this release explains is a
finding about the tree (``Check.findings``): the doctor exits 1 with it, and
a campaign replays it first, so it is written, shrunk and given a repro
like any other.  Two kinds of scenarios:

- clean scenarios, one per capability the tree has (compiled and breakable
  PIECEWISE, FULL, speculative decoding with its draft managers, LoRA FULL
  replay, varlen decode, DBO, release and recapture); a capability the tree
  lacks must be refused, not run;
- every documented finding (``docs/findings/*.json``) replayed under this
  tree's ruleset: whether it reproduces as its documented defect where the
  release has it is reported (a note, since a tree under change may have
  fixed it);
- the vision encoder's manager (``encoder_doctor``): its patches and clean
  scenarios, where the tree has one cgsim drives.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.families import family_of_finding, family_of_target
from cgsim.finding import Finding
from cgsim.scenario import Scenario, Step
from cgsim.targets.vllm.compat import Capabilities, VllmEnvironmentError, require_vllm
from cgsim.targets.vllm.known import classify, stopped_by
from cgsim.text import first_line
from cgsim.trace import Candidates, CaptureDone, Dispatch, Release, Replay, Sweep

__all__ = ["Check", "DoctorFailed", "run_doctor", "guard_check", "encoder_self_check", "doctor_line", "default_findings_dir",
           "CLEAN_SCENARIOS"]

DOCTOR_TIMEOUT_S = 120.0


class DoctorFailed(VllmEnvironmentError):
    """The adapter does not drive this vLLM as it should (exit 2, never a finding)."""


@dataclass(frozen=True)
class Check:
    """One scenario's result: ``ok`` False when a mechanism of the adapter
    broke; ``findings``: violations no documented defect of the release
    explains (findings about the tree, never a failed check)."""

    name: str
    ok: bool
    detail: str
    findings: tuple[Finding, ...] = ()

    @property
    def label(self) -> str:
        return "FAIL" if not self.ok else "FIND" if self.findings else "ok  "


def default_findings_dir() -> str | None:
    """docs/findings of the cgsim checkout this module is in, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.normpath(os.path.join(here, "..", "..", "..", "docs", "findings"))
    return path if os.path.isdir(path) else None


C, R = Step.capture(), Step.release()


def D(*lens: int, prefill: bool = False, loras: int = 0) -> Step:
    return Step.dispatch(Batch(tuple(lens), loras, has_prefill=prefill))


# name -> (capability it needs, config, steps)
CLEAN_SCENARIOS: tuple[tuple[str, Callable[[Capabilities], bool], ManagerConfig, tuple[Step, ...]], ...] = (
    ("full-and-piecewise", lambda c: True,
     ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4),
     (C, D(1, 1), D(1, 1, 1, 1), D(3, 2, prefill=True), D(5, prefill=True))),
    ("compiled-piecewise", lambda c: True,
     ManagerConfig(mode="PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4),
     (C, D(1, 1), D(3, prefill=True))),
    ("full", lambda c: True,
     ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=4),
     (C, D(1, 1), D(1, 1, 1))),
    ("breakable-piecewise", lambda c: c.has_breakable,
     ManagerConfig(mode="PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4, breakable=True, compiled_piecewise=False,
                   attention_support="UNIFORM_BATCH", attention_split=False),
     (C, D(1, 1), D(1, 2, prefill=True))),
    ("speculative-decoding", lambda c: True,
     ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3),
     (C, D(3, 3), D(2, 5, prefill=True), D(3))),
    ("lora-full-replay", lambda c: c.lora,
     ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, lora_cases=(0, 2)),
     (C, D(1, 1, loras=2), D(1, 1, 1, loras=1), D(1, 1), D(2, 1, prefill=True, loras=2))),
    ("varlen-decode", lambda c: c.varlen,
     ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3,
                   varlen_decode=True),
     (C, D(3, 1), D(2, 2), D(3, 3))),
    ("micro-batching", lambda c: c.dbo,
     ManagerConfig(mode="FULL_DECODE_ONLY", capture_sizes=(2, 4), max_num_reqs=4, num_ubatches=2, ubatch_threshold=2),
     (C, D(1, 1, 1, 1), D(1, 1))),
    ("release-recapture", lambda c: True,
     ManagerConfig(mode="FULL", capture_sizes=(1, 2), max_num_reqs=2),
     (C, D(1), R, C, D(1, 1))),
)

# A capability the tree lacks: the adapter must refuse the config (not judge it).
REFUSED_SCENARIOS: tuple[tuple[str, Callable[[Capabilities], bool], ManagerConfig], ...] = (
    ("no-lora", lambda c: not c.lora, ManagerConfig(mode="FULL", capture_sizes=(1, 2), max_num_reqs=2, lora_cases=(0, 1))),
    ("no-breakable", lambda c: not c.has_breakable,
     ManagerConfig(mode="PIECEWISE", capture_sizes=(2,), max_num_reqs=2, breakable=True, compiled_piecewise=False)),
    ("no-varlen", lambda c: not c.varlen,
     ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2), max_num_reqs=2, decode_query_len=2,
                   varlen_decode=True)),
    ("no-dbo", lambda c: not c.dbo, ManagerConfig(mode="FULL", capture_sizes=(2,), max_num_reqs=2, num_ubatches=2)),
)


def _run(scenario: Scenario) -> tuple[Any, list[Finding]]:
    from cgsim.properties import check_scenario  # noqa: PLC0415
    from cgsim.runner import run_scenario  # noqa: PLC0415

    trace = run_scenario(scenario, target="vllm", backend="mock", timeout=DOCTOR_TIMEOUT_S)
    verdict = check_scenario(scenario, trace)
    sj = scenario.to_json()
    found = [Finding.from_violation(v, sj, "vllm", "mock", scenario.short()) for v in verdict.violations]
    return trace, found


def _unexplained(found: Iterable[Finding], version: str) -> list[Finding]:
    return [f for f in found if classify(f, version) is None]


def _describe(f: Finding) -> str:
    return f"{f.property}: {first_line(f.message, 220)}"


def _check_finding_json(path: str, caps: Capabilities) -> Check:
    from cgsim.report.findings import load_finding  # noqa: PLC0415

    name = os.path.splitext(os.path.basename(path))[0]
    doc = load_finding(path)
    defect = classify(doc)
    scenario = Scenario.from_json({**doc.scenario, "ruleset": caps.ruleset})
    trace, found = _run(scenario)
    if trace.unsupported:
        return Check(name, True, f"not reachable on vLLM {caps.version} ({first_line(trace.unsupported, 120)})")
    broken = _incomplete(scenario, trace)
    if broken:
        return Check(name, False, broken)
    bad = tuple(_unexplained(found, caps.version))
    if bad:
        return Check(name, True, f"replay shows {_describe(bad[0])}, which is no documented defect of vLLM "
                                 f"{caps.version}", bad)
    if defect is not None and defect.present_in(caps.version):
        hits = [f for f in found if f.property == doc.property and classify(f, caps.version) == defect]
        if hits:
            return Check(name, True, f"reproduces #{defect.row} {defect.name}")
        stoppers = stopped_by(found, defect, caps.version)
        if defect.reachable_in(caps.version) or not stoppers:
            return Check(name, True, f"documented defect #{defect.row} ({defect.name}) of vLLM {caps.version} is not "
                                     f"shown: its replay holds {doc.property} here (fixed in this tree?)")
        return Check(name, True, f"#{defect.row} {defect.name} not reached: stopped first by "
                                 + ", ".join(f"#{r}" for r in stoppers))
    return Check(name, True, "holds" if not found else "only documented defects of this release")


def _check_clean(name: str, config: ManagerConfig, steps: tuple[Step, ...], caps: Capabilities) -> Check:
    scenario = Scenario(config, steps, ruleset=caps.ruleset)
    trace, found = _run(scenario)
    if trace.unsupported:
        # The plainest engine must start; another capability may be one this
        # release's config path refuses (its reason is vLLM's).
        plainest = name == CLEAN_SCENARIOS[0][0]
        return Check(name, not plainest, f"not reachable on vLLM {caps.version}: {first_line(trace.unsupported, 200)}")
    broken = _incomplete(scenario, trace)
    if broken:
        return Check(name, False, broken)
    bad = tuple(_unexplained(found, caps.version))
    if bad:
        return Check(name, True, f"{_describe(bad[0])} (no documented defect of vLLM {caps.version})", bad)
    known = sorted({classify(f, caps.version).name for f in found})  # type: ignore[union-attr]
    return Check(name, True, "clean" if not known else "only documented defects: " + ", ".join(known))


# What each step of a run must leave in its trace, up to the first error the
# target raised (after which the run stops: NO-CRASH and INIT-TOTAL judge it).
_STEP_EVENTS = {"capture": (CaptureDone, Sweep), "dispatch": (Dispatch, Replay), "release": (Release, Sweep)}


def _incomplete(scenario: Scenario, trace: Any) -> str | None:
    """Which step of ``scenario`` the adapter ran without recording what it
    must (a broken mechanism of the adapter), or None."""
    errors = [e.step for e in trace.errors]
    if errors and min(errors) < 0:
        return None  # building failed: the run has no steps
    stop = min(errors) if errors else len(scenario.steps)
    for i, step in enumerate(scenario.steps[:stop]):
        for kind in _STEP_EVENTS[step.kind]:
            if not any(getattr(e, "step", None) == i for e in trace.of(kind)):
                return (f"the trace has no {kind.__name__} event for step {i} ({step.kind}): the adapter ran a step "
                        "it did not record")
    if not trace.of(Candidates):
        return "the trace has no candidate snapshot: the adapter built a manager it did not read"
    return None


def _check_refused(name: str, config: ManagerConfig, caps: Capabilities) -> Check:
    trace, found = _run(Scenario(config, (C,), ruleset=caps.ruleset))
    if not trace.unsupported:
        return Check(name, False, f"vLLM {caps.version} lacks the capability, but the config was run instead of "
                                  "refused as unsupported")
    return Check(name, True, "refused: " + first_line(trace.unsupported, 160))


def run_doctor(findings_dir: str | None = None, progress: Callable[[Check], None] | None = None) -> list[Check]:
    """Every check, in order (``progress`` sees each as it finishes)."""
    caps = require_vllm()
    checks: list[Check] = []

    def add(check: Check) -> None:
        checks.append(check)
        if progress is not None:
            progress(check)

    for name, needs, config, steps in CLEAN_SCENARIOS:
        if needs(caps):
            add(guard_check(name, lambda: _check_clean(name, config, steps, caps)))
    for name, lacks, config in REFUSED_SCENARIOS:
        if lacks(caps):
            add(guard_check(name, lambda: _check_refused(name, config, caps)))
    folder = findings_dir if findings_dir is not None else default_findings_dir()
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))) if folder else ():
        add(guard_check(os.path.basename(path), lambda: _check_finding_json(path, caps)))
    from cgsim.targets.vllm.encoder_doctor import encoder_checks  # noqa: PLC0415 - the second manager's checks

    for check in encoder_checks(Check, guard_check):
        add(check)
    return checks


def encoder_self_check() -> None:
    """The encoder target's self-check (``VllmEncoderTarget.tooling.self_check``):
    TargetEnvironmentError, one line, where a mechanism broke; a violation
    of the clean scenarios is left to the campaign to find."""
    from cgsim.targets.base import TargetEnvironmentError  # noqa: PLC0415
    from cgsim.targets.vllm.encoder_doctor import encoder_checks  # noqa: PLC0415

    failed = [c for c in encoder_checks(Check, guard_check) if not c.ok]
    if failed:
        raise TargetEnvironmentError(
            f"the vLLM encoder adapter's self-check failed on vLLM {require_vllm().version}: {failed[0].name}: "
            f"{failed[0].detail}; nothing it would report about this manager could be trusted "
            "(python -m fuzz doctor lists every check)")


def guard_check(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except VllmEnvironmentError:
        raise
    except Exception as exc:  # noqa: BLE001 - the check itself broke: that is drift too
        return Check(name, False, f"the check raised {type(exc).__name__}: {first_line(exc, 200)}")


def doctor_line(caps: Capabilities, checks: list[Check]) -> str | None:
    """The one line for a broken mechanism, or None when the adapter works."""
    failed = [c for c in checks if not c.ok]
    if not failed:
        return None
    more = f" (+{len(failed) - 1} more; python -m fuzz doctor lists them)" if len(failed) > 1 else ""
    return (f"the vLLM adapter's self-check failed on vLLM {caps.version}: {failed[0].name}: {failed[0].detail}"
            f"{more}; the adapter cannot drive this vLLM as it must, so nothing it would report about it could "
            "be trusted")


def self_check() -> tuple[Finding, ...]:
    """Raise DoctorFailed (one line) when a mechanism broke; else the
    findings about the tree the checks met (the campaign replays them)."""
    caps = require_vllm()
    checks = run_doctor()
    line = doctor_line(caps, checks)
    if line is not None:
        raise DoctorFailed(line)
    # The campaign replays its own family's findings; another family's are the doctor's to show (exit 1).
    own = family_of_target("vllm")
    return tuple(f for c in checks for f in c.findings if family_of_finding(f) == own)
