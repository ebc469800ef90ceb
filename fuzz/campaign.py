"""A fuzz campaign: workers, a deadline, one merged report.

The parent validates everything up front (a bad target, ruleset, backend,
budget or report directory is a usage error before any worker starts), then
runs N worker processes (fuzz.workers), each deterministic from the seed.
Workers write findings to disk themselves; the parent watches them (restarts
one that died or hung, turning the death into a finding when the target
caused it), shows a progress line, and writes summary.json, junit.xml and
index.md at the end, every few seconds while running, and on SIGINT/SIGTERM
(then with ``"complete": false``).

Issue 7 (nightly GPU job) is meant to be small on top of this: ``gpus``
assigns CUDA_VISIBLE_DEVICES per worker (one GPU each, round robin), cuda
workers are spawned rather than forked, and a worker whose CUDA context is
poisoned exits with EXIT_RESTART after writing its finding and is restarted.
"""

from __future__ import annotations

import datetime as _dt
import json
import multiprocessing
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

from cgsim.report.findings import HARNESS_PROPERTIES, new_finding, scan_findings, write_finding
from cgsim.report.pipeline import Pipeline
from cgsim.report.repro import write_repro
from cgsim.report.summary import SUMMARY_SCHEMA, SUMMARY_SCHEMA_VERSION, update_latest, write_report
from fuzz.workers import EXIT_DONE, EXIT_ERROR, EXIT_RESTART, WorkerSpec, worker_main

__all__ = [
    "UsageError",
    "CampaignOptions",
    "CampaignResult",
    "PROFILE_DEFAULTS",
    "parse_budget",
    "options_for_profile",
    "run_campaign",
    "Campaign",
    "ensure_profiles",
]


class UsageError(Exception):
    """Bad input or a broken environment: one line for the user, exit 2."""


# What a profile means for a campaign (Hypothesis settings come from the
# Hypothesis profile of the same name).
PROFILE_DEFAULTS: dict[str, dict[str, Any]] = {
    "dev": {"budget_s": 10.0, "workers": 1, "timeout_s": 10.0, "chunk_examples": 25, "seed": 0},
    "ci": {"budget_s": 60.0, "workers": min(2, os.cpu_count() or 1), "timeout_s": 30.0, "chunk_examples": 50, "seed": 0},
    "nightly": {"budget_s": 1800.0, "workers": os.cpu_count() or 1, "timeout_s": 120.0, "chunk_examples": 100, "seed": None},
}

MAX_RESTARTS = 20  # per worker slot; a target that kills every worker should not spin forever
EXIT_ERROR_RESTARTS = 2


def ensure_profiles() -> None:
    """Hypothesis profiles dev/ci/nightly: the lead's fuzz.profiles when it
    exists; otherwise minimal ones, registered only under names still free."""
    from hypothesis import settings

    try:
        import fuzz.profiles  # noqa: F401
    except ImportError:
        pass
    for name, n in (("dev", 50), ("ci", 200), ("nightly", 2000)):
        try:
            settings.get_profile(name)
        except Exception:
            settings.register_profile(name, max_examples=n, deadline=None)


_BUDGET_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_budget(text: str) -> float:
    """'60s', '5m', '1h30m', '250ms', '90' (plain seconds) -> seconds."""
    raw = str(text).strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        total = float(raw)
    elif raw and re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ms|h|m|s))+", raw):
        total = sum(float(n) * _UNITS[u] for n, u in _BUDGET_PART.findall(raw))
    else:
        raise UsageError(f"--budget {text!r} is not a duration; write e.g. 60s, 5m, 1h30m or 90 (seconds)")
    if total <= 0:
        raise UsageError(f"--budget {text!r} is not a positive duration; write e.g. 60s, 5m or 1h")
    return total


@dataclass
class CampaignOptions:
    target: str = "reference"
    backend: str = "mock"
    ruleset: str | None = None
    budget_s: float = 10.0
    workers: int = 1
    seed: int | None = 0
    report_dir: str = "reports"
    profile: str = "dev"
    timeout_s: float | None = 10.0
    chunk_examples: int = 25
    max_examples: int | None = None  # total over workers; makes a run independent of speed
    shrink_grace_s: float | None = None  # default: min(30s, max(2s, budget/4))
    gpus: str | None = None  # None: leave CUDA_VISIBLE_DEVICES alone; "auto" or "0,1,..."
    one_per_gpu: bool = False  # with gpus: as many workers as GPUs (--gpus without --workers)
    start_method: str | None = None  # default: fork for mock, spawn for cuda
    quiet: bool = False
    command: str = ""


def options_for_profile(profile: str, **overrides: Any) -> CampaignOptions:
    if profile not in PROFILE_DEFAULTS:
        raise UsageError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILE_DEFAULTS)}")
    base = dict(PROFILE_DEFAULTS[profile])
    base["profile"] = profile
    base.update({k: v for k, v in overrides.items() if v is not None})
    return CampaignOptions(**base)


@dataclass
class CampaignResult:
    exit_code: int
    run_dir: str
    summary: dict


@dataclass
class _Slot:
    """One worker position; its process may be replaced (a new incarnation)."""

    index: int
    gpu: str | None
    share: int | None
    incarnation: int = 0
    process: Any = None
    restarts: int = 0
    error_restarts: int = 0
    killed_by_watchdog: bool = False
    end: str = "running"
    stats: dict[int, dict] = field(default_factory=dict)  # incarnation -> latest snapshot
    found: set = field(default_factory=set)

    @property
    def scenarios(self) -> int:
        return sum(s.get("scenarios", 0) for s in self.stats.values())


class Campaign:
    def __init__(self, options: CampaignOptions, pipeline: Pipeline | None = None, out: TextIO | None = None, err: TextIO | None = None):
        self.o = options
        self.pipeline = pipeline or Pipeline()
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.stop_reason: str | None = None
        self.notes: list[str] = []
        self.slots: list[_Slot] = []
        self.finding_events = 0
        self.cut_short = False

    # -- validation --------------------------------------------------------------
    def validate(self) -> None:
        o = self.o
        if o.workers < 1:
            raise UsageError(f"--workers {o.workers} must be at least 1")
        if o.budget_s <= 0:
            raise UsageError("--budget must be positive")
        if o.timeout_s is not None and o.timeout_s <= 0:
            raise UsageError("--timeout must be positive")
        if o.chunk_examples < 1:
            raise UsageError("--chunk-examples must be at least 1")
        if o.max_examples is not None and o.max_examples < 1:
            raise UsageError("--max-examples must be at least 1")
        if o.profile not in PROFILE_DEFAULTS:
            raise UsageError(f"unknown profile {o.profile!r}; choose one of {', '.join(PROFILE_DEFAULTS)}")
        if o.backend not in ("mock", "cuda"):
            raise UsageError(f"unknown backend {o.backend!r}; choose mock or cuda")
        if o.start_method not in (None, "fork", "spawn", "forkserver"):
            raise UsageError(f"unknown start method {o.start_method!r}; choose fork, spawn or forkserver")
        if o.ruleset is not None:
            _usage(self.pipeline.check_ruleset, o.ruleset, what="ruleset")
        _usage(self.pipeline.check_target, o.target, what="target")
        _usage(self.pipeline.check_backend, o.backend, what="backend")
        if o.ruleset is None and o.target == "vllm":
            # A real release is judged by the design it follows (SPEC §3): the
            # ruleset picked from the installed version, unless --ruleset says.
            from cgsim.targets.vllm_compat import installed_version, ruleset_for_version

            version = installed_version()
            if version is not None:
                o.ruleset = ruleset_for_version(version)
        try:
            self.pipeline.strategy(o.ruleset)
        except Exception as exc:
            raise UsageError(f"cannot build the scenario strategy: {type(exc).__name__}: {_first_line(exc)}") from None
        if o.seed is None:
            o.seed = secrets.randbelow(2**31)
        self.gpu_list = resolve_gpus(o.gpus) if o.gpus else None
        if self.gpu_list is not None and not self.gpu_list:
            raise UsageError("--gpus auto found no GPU (nvidia-smi -L lists none and CUDA_VISIBLE_DEVICES is empty)")
        if self.gpu_list and o.one_per_gpu:
            o.workers = len(self.gpu_list)

    def _make_run_dir(self) -> None:
        o = self.o
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_id = f"{stamp}-{os.getpid()}-{secrets.token_hex(3)}"
        self.run_dir = os.path.join(o.report_dir, self.run_id)
        try:
            os.makedirs(o.report_dir, exist_ok=True)
            os.makedirs(os.path.join(self.run_dir, "findings"))
            os.makedirs(os.path.join(self.run_dir, ".work"))
            probe = os.path.join(self.run_dir, ".work", "probe")
            with open(probe, "w") as fh:
                fh.write("ok")
            os.unlink(probe)
        except OSError as exc:
            raise UsageError(f"report dir {o.report_dir!r} is not writable: {exc.strerror or exc}") from None

    # -- the run -------------------------------------------------------------------
    def run(self) -> CampaignResult:
        self.validate()
        self._make_run_dir()
        ensure_profiles()
        o = self.o
        self.started_wall = time.time()
        self.started_at = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        self.deadline = self.started_wall + o.budget_s
        self.shrink_grace = o.shrink_grace_s if o.shrink_grace_s is not None else min(30.0, max(2.0, o.budget_s / 4))
        self.hard_deadline = self.deadline + self.shrink_grace + (o.timeout_s or 0) + 10.0
        method = o.start_method or ("spawn" if o.backend == "cuda" or self.gpu_list else "fork")
        self.ctx = multiprocessing.get_context(method)
        self.queue = self.ctx.Queue()
        self.stop_event = self.ctx.Event()
        self.heartbeat = self.ctx.Array("d", o.workers, lock=False)
        shares = _split(o.max_examples, o.workers)
        for i in range(o.workers):
            gpu = self.gpu_list[i % len(self.gpu_list)] if self.gpu_list else None
            self.slots.append(_Slot(i, gpu, shares[i]))
        self._write_report(complete=False)
        update_latest(o.report_dir, self.run_id)
        previous = self._install_signals()
        try:
            for slot in self.slots:
                self._start(slot)
            self._loop()
        finally:
            self._restore_signals(previous)
            self._shutdown_workers()
            self._drain()
        complete = self.stop_reason is None and not self.cut_short
        summary = self._write_report(complete=complete, final=True)
        update_latest(o.report_dir, self.run_id)
        self._clear_progress()
        self._print_summary(summary)
        if summary["findings"]:
            code = 1
        elif self.stop_reason is not None:
            code = 130 if self.stop_reason == "SIGINT" else 143
        else:
            code = 0
        return CampaignResult(code, self.run_dir, summary)

    def _spec(self, slot: _Slot) -> WorkerSpec:
        o = self.o
        share = slot.share
        if share is not None:
            share = max(0, share - slot.scenarios)
        return WorkerSpec(
            index=slot.index,
            incarnation=slot.incarnation,
            run_id=self.run_id,
            run_dir=self.run_dir,
            target=o.target,
            backend=o.backend,
            ruleset=o.ruleset,
            seed=int(o.seed or 0),
            deadline=self.deadline,
            shrink_grace_s=self.shrink_grace,
            timeout_s=o.timeout_s,
            chunk_examples=o.chunk_examples,
            max_examples=share,
            profile=o.profile,
            pipeline=self.pipeline,
            gpu=slot.gpu,
            skip_properties=tuple(sorted(slot.found)),
        )

    def _start(self, slot: _Slot) -> None:
        spec = self._spec(slot)
        if spec.max_examples == 0:
            slot.end = "done"
            slot.process = None
            return
        self.heartbeat[slot.index] = 0.0
        slot.killed_by_watchdog = False
        p = self.ctx.Process(
            target=worker_main, args=(spec, self.queue, self.stop_event, self.heartbeat), name=f"cgsim-fuzz-w{slot.index}", daemon=True
        )
        p.start()
        slot.process = p
        slot.end = "running"

    def _loop(self) -> None:
        last_report = last_progress = time.monotonic()
        tty = hasattr(self.err, "isatty") and self.err.isatty()
        progress_every = 0.25 if tty else 10.0
        while True:
            self._drain(timeout=0.1)
            if self.stop_reason is not None:
                return
            self._watch()
            if all(s.process is None for s in self.slots):
                return
            now = time.time()
            if now > self.hard_deadline:
                self.notes.append("workers did not stop by the hard deadline; they were terminated")
                self.cut_short = True
                return
            mono = time.monotonic()
            if not self.o.quiet and mono - last_progress >= progress_every:
                self._progress(tty)
                last_progress = mono
            if mono - last_report >= 5.0:
                self._write_report(complete=False)
                last_report = mono

    def _watch(self) -> None:
        now = time.time()
        for slot in self.slots:
            p = slot.process
            if p is None:
                continue
            if p.exitcode is None:
                started = self.heartbeat[slot.index]
                limit = (self.o.timeout_s or 0) * 1.5 + 2.0  # past the in-process backstop timer too
                if self.o.timeout_s and started and now - started > limit and not slot.killed_by_watchdog:
                    # The in-process timer did not fire (a hang in C code, a
                    # blocked syscall): kill the worker, keep its scenario.
                    slot.killed_by_watchdog = True
                    try:
                        os.kill(p.pid, signal.SIGKILL)
                    except OSError:
                        pass
                continue
            self._exited(slot, p.exitcode)

    def _exited(self, slot: _Slot, code: int) -> None:
        slot.process = None
        self._drain()
        restart = False
        if code == EXIT_DONE:
            slot.end = "done"
        elif code == EXIT_RESTART:
            slot.end = "restarted (target left the process unusable)"
            restart = True
        elif code == EXIT_ERROR:
            text = _read(os.path.join(self.run_dir, ".work", f"worker-{slot.index}.err")).strip().splitlines()
            slot.end = f"worker error: {text[-1] if text else 'unknown'}"
            self.notes.append(f"worker {slot.index} (incarnation {slot.incarnation}) failed: {text[-1] if text else 'no traceback'}; see .work/worker-{slot.index}.err")
            slot.error_restarts += 1
            restart = slot.error_restarts <= EXIT_ERROR_RESTARTS
        elif code < 0:
            signame = _signame(-code)
            scenario = self._inflight(slot)
            if slot.killed_by_watchdog:
                self._death_finding(slot, scenario, "TARGET-HANG", "hang", f"the scenario ran past the per-scenario timeout ({self.o.timeout_s:g}s) without returning to Python; the watchdog killed worker {slot.index}")
                slot.end = "killed by watchdog (hang)"
            elif -code == signal.SIGKILL:
                self.notes.append(f"worker {slot.index} was killed with SIGKILL from outside (OOM killer or a user); at most the scenario it was running is lost")
                slot.end = "killed (SIGKILL)"
            else:
                stack = _fault_frames(_read(os.path.join(self.run_dir, ".work", f"worker-{slot.index}.fault")))
                where = f"; innermost frames: {stack}" if stack else ""
                self._death_finding(slot, scenario, "TARGET-CRASH", "crash", f"worker {slot.index} died with {signame} while running this scenario{where}")
                slot.end = f"died ({signame})"
            restart = True
        else:
            slot.end = f"exited with status {code}"
            self.notes.append(f"worker {slot.index} exited with unexpected status {code}")
            restart = slot.error_restarts < EXIT_ERROR_RESTARTS
            slot.error_restarts += 1
        if restart and self.stop_reason is None and time.time() < self.deadline and slot.restarts < MAX_RESTARTS:
            slot.restarts += 1
            slot.incarnation += 1
            self._start(slot)

    def _inflight(self, slot: _Slot) -> dict | None:
        text = _read(os.path.join(self.run_dir, ".work", f"inflight-w{slot.index}.json"))
        try:
            data = json.loads(text)
            return data if isinstance(data, dict) else None
        except ValueError:
            return None

    def _death_finding(self, slot: _Slot, scenario: dict | None, prop: str, kind: str, message: str) -> None:
        if scenario is None:
            self.notes.append(f"{message}; the scenario it was running could not be read back")
            return
        short = ""
        try:
            from cgsim.scenario import Scenario

            short = Scenario.from_json(scenario).short()
        except Exception:
            pass
        data = new_finding(
            prop=prop,
            message=message,
            kind=kind,
            target=self.o.target,
            backend=self.o.backend,
            scenario_json=scenario,
            status="unshrunk",
            run_id=self.run_id,
            worker=slot.index,
            elapsed_s=time.time() - self.started_wall,
            scenario_short=short,
            extra={"timeout_s": self.o.timeout_s, "incarnation": slot.incarnation, "note": "recorded by the parent after the worker process died"},
        )
        write_finding(os.path.join(self.run_dir, "findings"), data)
        write_repro(os.path.join(self.run_dir, "findings"), data)
        slot.found.add(prop)
        self.finding_events += 1

    def _drain(self, timeout: float = 0.0) -> None:
        import queue as _q

        first = True
        while True:
            try:
                msg = self.queue.get(timeout=timeout) if first and timeout else self.queue.get_nowait()
            except (_q.Empty, OSError, ValueError, EOFError):
                return
            first = False
            kind = msg[0]
            if kind == "stats":
                _, index, incarnation, stats = msg
                slot = self.slots[index]
                slot.stats[incarnation] = stats
                slot.found.update(stats.get("found", ()))
            elif kind == "finding":
                self.finding_events += 1
            elif kind == "note":
                self.notes.append(f"worker {msg[1]}: {msg[2]}")

    # -- stopping ---------------------------------------------------------------------
    def _install_signals(self) -> dict:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}

        def handler(signum: int, frame: Any) -> None:
            name = _signame(signum)
            if self.stop_reason is None:
                self.stop_reason = name
                self.stop_event.set()
            else:  # a second Ctrl-C: stop waiting for workers
                self.stop_reason = name
                for s in self.slots:
                    if s.process is not None and s.process.exitcode is None:
                        try:
                            s.process.kill()
                        except Exception:
                            pass

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        return previous

    def _restore_signals(self, previous: dict) -> None:
        for sig, h in previous.items():
            signal.signal(sig, h)

    def _shutdown_workers(self, grace: float = 5.0) -> None:
        self.stop_event.set()
        end = time.monotonic() + grace
        for slot in self.slots:
            p = slot.process
            if p is None:
                continue
            p.join(max(0.0, end - time.monotonic()))
            if p.exitcode is None:
                p.terminate()
                p.join(1.0)
            if p.exitcode is None:
                p.kill()
                p.join(1.0)
            self._drain()
            if slot.end == "running":
                slot.end = "stopped" if p.exitcode in (EXIT_DONE, EXIT_RESTART) else f"terminated ({p.exitcode})"
            slot.process = None

    # -- reporting ------------------------------------------------------------------------
    def _totals(self) -> tuple[int, Counter, Counter, dict[str, Counter]]:
        scenarios, checks, failures, coverage = 0, Counter(), Counter(), {}
        for slot in self.slots:
            for stats in slot.stats.values():
                scenarios += stats.get("scenarios", 0)
                checks.update(stats.get("checks", {}))
                failures.update(stats.get("failures", {}))
                for dim, counts in stats.get("coverage", {}).items():
                    coverage.setdefault(dim, Counter()).update(counts)
        return scenarios, checks, failures, coverage

    def _findings(self, final: bool = False) -> list[dict]:
        fdir = os.path.join(self.run_dir, "findings")
        raw = scan_findings(fdir)
        rank = {"shrunk": 0, "shrink-interrupted": 1, "shrinking": 2, "unshrunk": 3}
        by_prop: dict[str, list[dict]] = {}
        for f in raw:
            # Workers write repros when shrinking ends; at the end the parent
            # writes one for every finding still without (unshrunk ones, a
            # worker killed mid-shrink).
            if final and not os.path.exists(os.path.join(fdir, f"repro_{f['id']}.py")):
                try:
                    write_repro(fdir, f)
                except OSError:
                    pass
            by_prop.setdefault(f["property"], []).append(f)
        out = []
        for prop in sorted(by_prop):
            group = sorted(by_prop[prop], key=lambda f: (rank.get(f.get("status"), 9), len(json.dumps(f["scenario"], sort_keys=True)), f["id"]))
            primary = dict(group[0])
            primary["duplicates"] = [f["id"] for f in group[1:]]
            primary["path"] = os.path.join(fdir, f"{primary['id']}.json")
            primary["repro_path"] = os.path.join(fdir, f"repro_{primary['id']}.py")
            backend = "" if self.o.backend == "mock" else f" --backend {self.o.backend}"
            primary["replay_command"] = f"python -m fuzz replay {primary['path']}{backend}"
            primary.pop("original_scenario", None)
            out.append(primary)
        return out

    def _summary(self, complete: bool, final: bool = False) -> dict:
        import hypothesis

        import cgsim

        o = self.o
        scenarios, checks, failures, coverage = self._totals()
        try:
            statements = self.pipeline.properties()
        except Exception:
            statements = {}
        props: dict[str, dict] = {}
        for pid in list(statements) + [p for p in sorted(set(checks) | set(failures)) if p not in statements]:
            props[pid] = {
                "statement": statements.get(pid) or HARNESS_PROPERTIES.get(pid, ""),
                "checks": checks.get(pid, 0),
                "failures": failures.get(pid, 0),
            }
        for pid in ("TARGET-CRASH", "TARGET-HANG"):
            props.setdefault(pid, {"statement": HARNESS_PROPERTIES[pid], "checks": scenarios, "failures": failures.get(pid, 0)})
            props[pid]["checks"] = max(props[pid]["checks"], scenarios)
        elapsed = time.time() - self.started_wall
        findings = self._findings(final=final)
        for f in findings:  # a death found by the parent has no worker counter
            entry = props.setdefault(f["property"], {"statement": f.get("statement", ""), "checks": 0, "failures": 0})
            entry["failures"] = max(entry["failures"], 1)
            entry["checks"] = max(entry["checks"], 1)
        return {
            "schema": SUMMARY_SCHEMA,
            "schema_version": SUMMARY_SCHEMA_VERSION,
            "run_id": self.run_id,
            "complete": complete,
            "interrupted": self.stop_reason,
            "started_at": self.started_at,
            "finished_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds") if final else None,
            "elapsed_s": round(elapsed, 3),
            "settings": {
                "target": o.target,
                "backend": o.backend,
                "ruleset": o.ruleset or "any",
                "profile": o.profile,
                "budget_s": o.budget_s,
                "workers": o.workers,
                "seed": o.seed,
                "timeout_s": o.timeout_s,
                "max_examples": o.max_examples,
                "chunk_examples": o.chunk_examples,
                "gpus": [s.gpu for s in self.slots] if self.gpu_list else None,
                "command": o.command,
                "cgsim_version": getattr(cgsim, "__version__", "?"),
                "hypothesis_version": hypothesis.__version__,
                "python": platform.python_version(),
                "host": platform.node(),
            },
            "scenarios": scenarios,
            "scenarios_per_s": round(scenarios / elapsed, 2) if elapsed > 0 else None,
            "properties": props,
            "coverage": {k: dict(sorted(v.items())) for k, v in sorted(coverage.items())},
            "findings": findings,
            "workers": [
                {"worker": s.index, "gpu": s.gpu, "scenarios": s.scenarios, "restarts": s.restarts, "end": s.end}
                for s in self.slots
            ],
            "notes": list(self.notes),
        }

    def _write_report(self, complete: bool, final: bool = False) -> dict:
        summary = self._summary(complete, final)
        try:
            write_report(self.run_dir, summary)
        except OSError as exc:
            self.notes.append(f"could not write the report: {exc}")
        return summary

    def _progress(self, tty: bool) -> None:
        scenarios, _, _, _ = self._totals()
        left = max(0.0, self.deadline - time.time())
        n_findings = len({f["property"] for f in scan_findings(os.path.join(self.run_dir, "findings"))})
        alive = sum(1 for s in self.slots if s.process is not None)
        line = f"[fuzz {self.o.target}] {scenarios} scenarios · {n_findings} finding(s) · {left:.0f}s left · workers {alive}/{len(self.slots)}"
        if tty:
            self.err.write("\r" + line.ljust(100)[:100])
        else:
            self.err.write(line + "\n")
        self.err.flush()
        self._progress_shown = tty

    def _clear_progress(self) -> None:
        if getattr(self, "_progress_shown", False):
            self.err.write("\r" + " " * 100 + "\r")
            self.err.flush()

    def _print_summary(self, summary: dict) -> None:
        if self.o.quiet:
            return
        w = self.out.write
        s = summary["settings"]
        state = "" if summary["complete"] else f"  [PARTIAL: stopped by {summary['interrupted'] or 'deadline'}]"
        w(f"cgsim fuzz {summary['run_id']}: target={s['target']} backend={s['backend']} ruleset={s['ruleset']} seed={s['seed']} workers={s['workers']} budget={s['budget_s']:g}s{state}\n")
        w(f"ran {summary['scenarios']} scenarios in {summary['elapsed_s']:.1f}s\n")
        width = max([len(p) for p in summary["properties"]] + [8])
        w(f"  {'property'.ljust(width)}  {'checks':>8}  {'failures':>8}\n")
        for pid, v in summary["properties"].items():
            w(f"  {pid.ljust(width)}  {v['checks']:>8}  {v['failures']:>8}\n")
        findings = summary["findings"]
        w(f"{len(findings)} finding(s)\n")
        for f in findings:
            w(f"  {f['property']}: {f['id']} ({f['status']})\n    {_first_line(f.get('message', ''))}\n    repro: {f['repro_path']}\n")
        for n in summary["notes"]:
            w(f"note: {n}\n")
        w(f"report: {os.path.join(self.run_dir, 'index.md')}\n")
        self.out.flush()


def run_campaign(options: CampaignOptions, pipeline: Pipeline | None = None, out: TextIO | None = None, err: TextIO | None = None) -> CampaignResult:
    return Campaign(options, pipeline, out, err).run()


def resolve_gpus(spec: str) -> list[str]:
    """'auto' -> the visible GPUs (CUDA_VISIBLE_DEVICES, else nvidia-smi -L);
    '0,1,3' -> those."""
    if spec != "auto":
        ids = [g.strip() for g in spec.split(",") if g.strip()]
        if not ids:
            raise UsageError(f"--gpus {spec!r}: give auto or a comma-separated list such as 0,1")
        return ids
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi"):
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
            return [str(i) for i, line in enumerate(l for l in listing.splitlines() if l.startswith("GPU "))]
        except (OSError, subprocess.SubprocessError):
            pass
    return []


def _usage(check: Any, value: str, what: str) -> None:
    try:
        check(value)
    except UsageError:
        raise
    except Exception as exc:
        msg = _first_line(exc) or f"{what} {value!r} is not available"
        raise UsageError(msg) from None


def _split(total: int | None, n: int) -> list[int | None]:
    if total is None:
        return [None] * n
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]


def _first_line(exc: Any) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _fault_frames(text: str, n: int = 3) -> str:
    """The innermost frames of a faulthandler dump, as 'file:line in fn'."""
    frames = [line.strip()[len("File "):] for line in text.splitlines() if line.strip().startswith("File ")]
    return " <- ".join(f.replace('"', "") for f in frames[:n])


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
