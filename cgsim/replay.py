"""Re-run one finding: the shared core of ``python -m fuzz replay`` and of the
standalone repro scripts, and what the end of a repro script run in its own
process says (``script_verdict``)."""

from __future__ import annotations

import ast
import json
import signal
from dataclasses import dataclass

from cgsim.backends import get_backend
from cgsim.encoder.replay import EncoderReplayResult, describe_encoder, is_encoder_finding, reproduce_encoder
from cgsim.finding import Finding, FindingError
from cgsim.observe import RUNNER, Outcome, Pipeline, observe
from cgsim.properties.harness import NO_CRASH, NO_HANG
from cgsim.scenario import Scenario
from cgsim.served import ServedReplayResult, describe_served, is_served_finding, reproduce_served
from cgsim.targets import get_target
from cgsim.targets.base import ScenarioNotRunnable

__all__ = ["ReplayResult", "ScenarioNotRunnable", "reproduce", "describe", "DEFAULT_REPLAY_TIMEOUT", "ScriptVerdict", "script_verdict",
           "finding_in_repro", "script_time_limit", "CRASH_SIGNALS"]

DEFAULT_REPLAY_TIMEOUT = 60.0
# How a process dies of its own fault (a segfault, an abort), as opposed to
# being stopped from outside (SIGKILL from the OOM killer, SIGTERM, SIGINT).
CRASH_SIGNALS = frozenset(getattr(signal, n) for n in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGTRAP",
                                                         "SIGSYS") if hasattr(signal, n))
SCRIPT_START_S = 120.0  # a repro script's own start (imports; an engine's cold import is ~20 s)


@dataclass(frozen=True)
class ReplayResult:
    property: str
    reproduced: bool
    outcome: Outcome

    def lines(self) -> list[str]:
        out = []
        seen = self.outcome.first(self.property)
        if self.reproduced and seen is not None:
            out.append(f"REPRODUCED {self.property}: {seen.message}")
        else:
            out.append(f"not reproduced: {self.property} holds on this run")
        for f in self.outcome.findings:
            if f.property != self.property:
                out.append(f"also violated {f.property}: {f.message}")
        return out


def reproduce(finding: Finding, backend: str | None = None, timeout: float | None = None,
              pipeline: Pipeline = RUNNER) -> ReplayResult | EncoderReplayResult | ServedReplayResult:
    """Run the finding's scenario on its target.  ``reproduced`` is True while
    the finding's property is still violated.

    Environment problems (no GPU, a target this install lacks, an engine that
    does not import) raise before anything runs: they must never look like a
    reproduction, nor like a fix.

    An encoder finding (its scenario of kind "encoder") is replayed by
    ``cgsim.encoder.replay``: its result has the same ``property``,
    ``reproduced`` and ``lines()``; so has a finding served through the
    engine's runner, served again by ``cgsim.served``."""
    if is_encoder_finding(finding):
        return reproduce_encoder(finding, backend=backend, timeout=timeout)
    if timeout is not None and timeout <= 0:
        raise ValueError(f"--timeout {timeout:g}: give a positive number of seconds")
    if is_served_finding(finding):
        return reproduce_served(finding, timeout)
    scenario = Scenario.from_json(finding.scenario)
    backend = backend or finding.backend or "mock"
    get_backend(backend)  # BackendUnavailable (e.g. cuda without a GPU)
    get_target(finding.target).prepare_environment()
    if timeout is None:
        timeout = float(finding.extra.get("timeout_s") or DEFAULT_REPLAY_TIMEOUT)
    outcome = observe(scenario, finding.target, backend, timeout, pipeline=pipeline)
    if outcome.unsupported is not None:
        # Nothing ran: neither a reproduction nor a fix.
        raise ScenarioNotRunnable(f"{finding.id} cannot run on {finding.target} here: {outcome.unsupported}")
    return ReplayResult(finding.property, outcome.first(finding.property) is not None, outcome)


def finding_in_repro(path: str) -> Finding:
    """The finding a repro script carries, read as data (its FINDING_JSON
    literal; the script is never run for this).  FindingError for a file
    that is not a cgsim repro script."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except OSError as exc:
        raise FindingError(f"cannot read {path}: {exc.strerror}") from None
    except (SyntaxError, ValueError, UnicodeDecodeError):
        raise FindingError(f"{path} is not a Python file; give a cgsim repro script (findings/repro_<id>.py)") from None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "FINDING_JSON" and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            try:
                data = json.loads(node.value.value)
            except ValueError:
                break
            return Finding.from_json(data, where=f"the finding in {path}")
    raise FindingError(f"{path} is not a cgsim repro script (it has no FINDING_JSON); give a finding "
                       "(findings/<id>.json) or a repro script (findings/repro_<id>.py) written by a campaign")


def script_time_limit(finding: Finding, timeout: float | None = None) -> float:
    """Wall-clock limit for a repro script: its own timer and backstop, plus its start."""
    t = timeout or float(finding.extra.get("timeout_s") or DEFAULT_REPLAY_TIMEOUT)
    return 2 * t + SCRIPT_START_S


@dataclass(frozen=True)
class ScriptVerdict:
    reproduced: bool | None  # None: the end of the script tells nothing about the finding
    message: str = ""


def script_verdict(finding: Finding, code: int | None, limit: float, path: str = "the repro script") -> ScriptVerdict:
    """What a repro script's end says about its finding.

    ``code``: the exit status (negative: killed by that signal; None: it did
    not end within ``limit`` seconds and was killed).  1 is "reproduced" and
    0 "not reproduced" (the script printed which itself); a death by a crash
    signal or another status reproduces a crash finding only, a script that
    does not end a hang finding only: for any other finding they are a
    broken run, and nothing can be told.
    """
    prop = finding.property
    if code == 1:
        return ScriptVerdict(True)
    if code == 0:
        return ScriptVerdict(False)
    if code is None:
        if finding.kind == "hang" or prop == NO_HANG:
            return ScriptVerdict(True, f"REPRODUCED {prop}: {path} did not finish within {limit:g}s")
        return ScriptVerdict(None, f"{path} did not finish within {limit:g}s; could not tell whether {prop} "
                                   "reproduces (only a hang finding is reproduced by a script that never ends)")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if (finding.kind == "crash" or prop == NO_CRASH) and -code in CRASH_SIGNALS:
            return ScriptVerdict(True, f"REPRODUCED {prop}: {path} died with {name}")
        return ScriptVerdict(None, f"{path} died with {name}; could not tell whether {prop} reproduces "
                                   "(only a crash finding is reproduced by a script that dies of a crash signal)")
    if finding.kind == "crash" or prop == NO_CRASH:
        return ScriptVerdict(True, f"REPRODUCED {prop}: {path} exited with status {code}")
    return ScriptVerdict(None, f"{path} exited with status {code}; could not tell whether {prop} reproduces "
                               "(a repro script exits 1 reproduced, 0 not, 2 cannot run here)")


def describe(finding: Finding) -> list[str]:
    if is_encoder_finding(finding):
        return describe_encoder(finding)
    if is_served_finding(finding):
        return describe_served(finding)
    lines = [f"finding {finding.id}: {finding.property} on target {finding.target}"]
    if finding.statement:
        lines.append(f"  property: {finding.statement}")
    if finding.message:
        lines.append(f"  first seen: {finding.message}")
    if finding.scenario_short:
        lines.append(f"  scenario: {finding.scenario_short}")
    try:
        from cgsim.scenario_code import mode_resolution

        lines.append(f"  {mode_resolution(Scenario.from_json(finding.scenario))}")
    except (ValueError, TypeError, KeyError):
        pass  # a scenario that does not load: reproduce() says why
    return lines
