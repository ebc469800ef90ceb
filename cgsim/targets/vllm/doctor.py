"""The vLLM adapter's self-check: scenarios with known outcomes on the vLLM
that imports here, run before every vLLM campaign and by ``python -m fuzz
doctor``.

A vLLM change to a convention the adapter relies on (a forward-context
field, a constructor argument, the capture loop's calls) must show up here,
as one line and exit 2, before it shows up as a finding about vLLM.  Two
kinds of checks:

- every documented finding (``docs/findings/*.json``) replayed under this
  tree's ruleset: where this release has the documented defect
  (``cgsim.targets.vllm.known``) it must reproduce and be recognised as that
  defect;
- clean scenarios, one per capability the tree has (compiled and breakable
  PIECEWISE, FULL, speculative decoding with its draft managers, LoRA FULL
  replay, varlen decode, DBO, release and recapture); a capability the tree
  lacks must be refused as unsupported.

In both, every violation must be a documented defect of this release: any
other is drift (or a new defect, which the campaign should not report as
vLLM's until someone has looked at it).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch
from cgsim.finding import Finding
from cgsim.scenario import Scenario, Step
from cgsim.targets.vllm.compat import Capabilities, VllmEnvironmentError, require_vllm
from cgsim.targets.vllm.known import classify, stopped_by
from cgsim.text import first_line

__all__ = ["Check", "DoctorFailed", "run_doctor", "doctor_line", "default_findings_dir", "CLEAN_SCENARIOS"]

DOCTOR_TIMEOUT_S = 120.0


class DoctorFailed(VllmEnvironmentError):
    """The adapter does not drive this vLLM as it should (exit 2, never a finding)."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


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
        return Check(name, True, f"not expressible to vLLM {caps.version} ({first_line(trace.unsupported, 120)})")
    bad = _unexplained(found, caps.version)
    if bad:
        return Check(name, False, f"replay shows {_describe(bad[0])}, which is no documented defect of vLLM "
                                  f"{caps.version}")
    if defect is not None and defect.present_in(caps.version):
        hits = [f for f in found if f.property == doc.property and classify(f, caps.version) == defect]
        if hits:
            return Check(name, True, f"reproduces #{defect.row} {defect.name}")
        stoppers = stopped_by(found, defect, caps.version)
        if defect.reachable_in(caps.version) or not stoppers:
            return Check(name, False, f"vLLM {caps.version} has documented defect #{defect.row} ({defect.name}) but "
                                      f"its replay no longer shows {doc.property}")
        return Check(name, True, f"#{defect.row} {defect.name} not reached: stopped first by "
                                 + ", ".join(f"#{r}" for r in stoppers))
    return Check(name, True, "holds" if not found else "only documented defects of this release")


def _check_clean(name: str, config: ManagerConfig, steps: tuple[Step, ...], caps: Capabilities) -> Check:
    scenario = Scenario(config, steps, ruleset=caps.ruleset)
    trace, found = _run(scenario)
    if trace.unsupported:
        return Check(name, False, f"refused as unsupported although vLLM {caps.version} has the capability: "
                                  f"{first_line(trace.unsupported, 200)}")
    bad = _unexplained(found, caps.version)
    if bad:
        return Check(name, False, f"{_describe(bad[0])} (no documented defect of vLLM {caps.version})")
    known = sorted({classify(f, caps.version).name for f in found})  # type: ignore[union-attr]
    return Check(name, True, "clean" if not known else "only documented defects: " + ", ".join(known))


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
            add(_guard(name, lambda: _check_clean(name, config, steps, caps)))
    for name, lacks, config in REFUSED_SCENARIOS:
        if lacks(caps):
            add(_guard(name, lambda: _check_refused(name, config, caps)))
    folder = findings_dir if findings_dir is not None else default_findings_dir()
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))) if folder else ():
        add(_guard(os.path.basename(path), lambda: _check_finding_json(path, caps)))
    return checks


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except VllmEnvironmentError:
        raise
    except Exception as exc:  # noqa: BLE001 - the check itself broke: that is drift too
        return Check(name, False, f"the check raised {type(exc).__name__}: {first_line(exc, 200)}")


def doctor_line(caps: Capabilities, checks: list[Check]) -> str | None:
    """The one line for a failed self-check, or None when everything held."""
    failed = [c for c in checks if not c.ok]
    if not failed:
        return None
    more = f" (+{len(failed) - 1} more; python -m fuzz doctor lists them)" if len(failed) > 1 else ""
    return (f"the vLLM adapter's self-check failed on vLLM {caps.version}: {failed[0].name}: {failed[0].detail}"
            f"{more}; the adapter has drifted from this vLLM (or this is a new defect): no campaign finding "
            "would be trustworthy")


def self_check() -> None:
    """Raise DoctorFailed (one line) unless every check holds."""
    caps = require_vllm()
    line = doctor_line(caps, run_doctor())
    if line is not None:
        raise DoctorFailed(line)
