"""Re-run one finding: the shared core of ``python -m fuzz replay`` and of the
standalone repro scripts, and what the end of a repro script run in its own
process says (``script_verdict``)."""

from __future__ import annotations

import ast
import json
import signal
from dataclasses import dataclass

from cgsim.decode_family import DEFAULT_REPLAY_TIMEOUT, ReplayResult
from cgsim.families import ReplayOutcome, family_of_finding
from cgsim.finding import Finding, FindingError
from cgsim.properties.harness import NO_CRASH, NO_HANG
from cgsim.targets.base import ScenarioNotRunnable

__all__ = ["ReplayResult", "ScenarioNotRunnable", "reproduce", "describe", "DEFAULT_REPLAY_TIMEOUT", "ScriptVerdict", "script_verdict",
           "finding_in_repro", "script_time_limit", "CRASH_SIGNALS"]
# How a process dies of its own fault (a segfault, an abort), as opposed to
# being stopped from outside (SIGKILL from the OOM killer, SIGTERM, SIGINT).
CRASH_SIGNALS = frozenset(getattr(signal, n) for n in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGTRAP",
                                                         "SIGSYS") if hasattr(signal, n))
SCRIPT_START_S = 120.0  # a repro script's own start (imports; an engine's cold import is ~20 s)


def reproduce(finding: Finding, backend: str | None = None, timeout: float | None = None) -> ReplayOutcome:
    """Run the finding's scenario on its target, as its family replays it
    (``cgsim.families``).  ``reproduced`` is True while the finding's
    property is still violated.

    Environment problems (no GPU, a target this install lacks, an engine that
    does not import) raise before anything runs: they must never look like a
    reproduction, nor like a fix."""
    return family_of_finding(finding).reproduce(finding, backend, timeout)


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
    """What the finding is, before it is replayed, as its family says it."""
    return family_of_finding(finding).describe(finding)
