"""``python -m fuzz``: run, replay, report, explain, list, export-test, doctor.

Exit status: 0 nothing found / not reproduced, 1 findings / reproduced,
2 bad usage, a broken environment or (replay) could not tell (one line on
stderr, no traceback), 3 the report could not be written (a full disk),
129/130/143 a campaign stopped by SIGHUP/SIGINT/SIGTERM with nothing found.
The table is in reports/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from typing import Any, Sequence

from cgsim.text import first_line

__all__ = ["main", "build_parser"]


class _Exit(Exception):
    def __init__(self, code: int, message: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line + hint, exit 2
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _count(least: int) -> Any:
    """An argparse type: a whole number of at least ``least`` (cgsim.values.parse_count)."""
    from cgsim.values import ValueProblem, parse_count

    def parse(text: str) -> int:
        try:
            return parse_count(text, least=least)
        except ValueProblem as exc:
            raise argparse.ArgumentTypeError(f"{text!r} {exc}") from None

    return parse


def _share(text: str) -> float:
    from cgsim.values import ValueProblem, parse_share

    try:
        return parse_share(text)
    except ValueProblem as exc:
        raise argparse.ArgumentTypeError(f"{text!r} {exc}") from None


def _duration(text: str | None, flag: str, zero: bool = False) -> float | None:
    """A duration flag's value in seconds (cgsim.values.parse_duration), None when not given."""
    if text is None:
        return None
    from fuzz.campaign import parse_budget

    return parse_budget(text, flag=flag, zero=zero)


def _join_option_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--budget -5s`` -> ``--budget=-5s``: argparse takes a value that starts
    with "-" for an option and answers "expected one argument"; joined, the
    value reaches our own check, which says what is wrong with it."""
    takes_value: set[str] = set()
    known: set[str] = set()
    parsers = [parser]
    while parsers:
        p = parsers.pop()
        for action in p._actions:
            known.update(action.option_strings)
            if action.option_strings and action.nargs is None and action.const is None and not isinstance(
                    action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
                takes_value.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            out.extend(argv[i:])
            break
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a in takes_value and nxt is not None and nxt.startswith("-") and nxt != "--" and nxt.split("=")[0] not in known:
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m fuzz", description="cgsim fuzz campaigns, replays and explanations")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="run a fuzz campaign and write a report")
    run.add_argument("--target", default="reference", help="reference, mutant:NAME or vllm (python -m fuzz list)")
    run.add_argument("--backend", default="mock", help="mock (CPU, default) or cuda")
    run.add_argument("--ruleset", default=None, help="pin one ruleset (default: the strategy picks)")
    run.add_argument("--budget", default=None, help="wall-clock budget, e.g. 60s, 5m, 1h (default from --profile)")
    run.add_argument("--workers", type=_count(1), default=None,
                     help="worker processes (default from --profile); at most one per CPU (per GPU with --backend cuda)")
    run.add_argument("--force-workers", action="store_true",
                     help="start --workers even where it is more than the CPUs (GPUs) here; memory still bounds them")
    run.add_argument("--seed", type=_count(0), default=None, help="campaign seed (default 0; random for nightly)")
    run.add_argument("--report-dir", default="reports", help="where runs are written (default reports/)")
    run.add_argument("--profile", default="dev", choices=("dev", "ci", "nightly"), help="budget/worker defaults and Hypothesis profile")
    run.add_argument("--timeout", default=None, help="per-scenario timeout, e.g. 10s, 2m or 10 (seconds)")
    run.add_argument("--max-examples", type=_count(1), default=None, help="stop after this many scenarios (over all workers); with --seed the run is exactly repeatable")
    run.add_argument("--chunk-examples", type=_count(1), default=None, help=argparse.SUPPRESS)
    run.add_argument("--shrink-grace", default=None, help="extra time a shrink under way may take after the budget (e.g. 10s)")
    run.add_argument("--shrink-limit", default=None, help="longest one shrink may take before its smallest failure so far is "
                     "recorded and the search goes on (default: a tenth of the budget, at least 5s; 0: no limit)")
    run.add_argument("--shrink-share", type=_share, default=None,
                     help="share of each worker's time that shrinking may take; a failure seen while it is spent is "
                          "written at once and shrunk when it recurs (default 0.25; 1: shrink every failure at once)")
    run.add_argument("--gpus", default=None, help="auto or 0,1,...: workers get one GPU each (round robin) through CUDA_VISIBLE_DEVICES; without --workers, one worker per GPU")
    run.add_argument("--start-method", default=None, help=argparse.SUPPRESS)
    run.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS|auto|local",
                     help="workers as Ray actors on every node of a cluster: one per GPU with --backend cuda, one per "
                          "CPU otherwise (--workers caps it); auto (the default) joins this machine's cluster, local "
                          "starts a one-machine Ray; needs pip install 'cgsim[ray]'")
    run.add_argument("--example-db", default=None, metavar="PATH|redis://HOST:PORT",
                     help="a database of the failures campaigns found (a directory, or Redis with pip install redis): "
                          "saved failures are replayed first, new ones saved; without it a run depends on its seed alone")
    run.add_argument("--quiet", action="store_true", help="no progress line and no summary")
    run.add_argument("--no-runner", "--no-runner-confirm", dest="no_runner_confirm", action="store_true",
                     help="skip the engine's own model runner after the search: serving drawn launches end to end "
                          "with graphs and eager (a quarter of --budget, at least 120 s), and building each "
                          "finding's launch (vLLM: ~30 s a launch) to tell defects of the engine from "
                          "manager-level findings")
    run.add_argument("--runner-share", default=None, metavar="DURATION",
                     help="time for serving drawn launches through the engine's own runner after the search "
                          "(default: a quarter of --budget, 120 s to 600 s; 0: none, findings are still confirmed)")
    run.add_argument("--confirm-budget", default=None, metavar="DURATION",
                     help="time for building each finding's launch through the engine's own runner after the share "
                          "(default: as long as --budget, 60 s to 600 s; 0: none, findings are reported unconfirmed)")
    _source_flag(run)
    run.add_argument("--diff-base", default=None,
                     help="with --vllm-source on a git checkout: report the changed lines against this ref that the "
                          "campaign never ran (default: the merge base with the upstream main)")

    rp = sub.add_parser("replay", help="re-run a finding (JSON) or a repro script; exit 1 while it reproduces")
    rp.add_argument("path")
    rp.add_argument("--backend", default=None, help="mock or cuda (default: the finding's)")
    rp.add_argument("--timeout", default=None, help="per-scenario timeout, e.g. 10s, 2m or 10 (seconds)")
    _source_flag(rp)

    rb = sub.add_parser("report", help="rebuild a run's summary.json, junit.xml and index.md from its findings "
                                       "(after the campaign died); exit 1 with findings")
    rb.add_argument("run_dir", help="the run directory, e.g. reports/latest or reports/<run-id>")
    rb.add_argument("--quiet", action="store_true", help="write the report, print nothing")

    ex = sub.add_parser("explain", help="capture list, candidate table and dispatch table of a config")
    from cgsim.config import ManagerConfig  # light: no torch

    ex.add_argument("--config", default=None, help="a ManagerConfig JSON file; flags override its fields")
    ex.add_argument("--ruleset", default=None, help="ruleset (default pr48822)")
    ex.add_argument("--plot", default=None, help="draw the dispatch map (every batch, the graph it lands on, its padding) as .png or .svg; needs matplotlib (cgsim[plot])")
    ex.add_argument("--lora", type=_count(0), default=0, help="active LoRA adapters of the explained batches")
    ex.add_argument("--json", action="store_true", help="print the tables as JSON")
    ex.add_argument("--max-rows", type=_count(1), default=None, help="limit the dispatch table to batches up to this many tokens")
    from dataclasses import fields

    for f in fields(ManagerConfig):
        if f.name == "engine_options":
            continue  # an engine's own options come in the --config file, under their JSON keys
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            ex.add_argument(flag, dest=f"cfg_{f.name}", action=argparse.BooleanOptionalAction, default=None)
        else:
            ex.add_argument(flag, dest=f"cfg_{f.name}", default=None, help=_CFG_HELP.get(f.name))

    sub.add_parser("list", help="targets, mutants, rulesets and properties")

    doc = sub.add_parser("doctor", help="the target adapter's self-check on the engine here; exit 2 when a "
                         "mechanism broke, 1 when the engine violates a property no documented defect explains")
    doc.add_argument("--target", default="vllm", help="the target to check (default vllm)")
    doc.add_argument("--findings", default=None, help="documented finding JSONs to replay (default: docs/findings)")
    _source_flag(doc)

    et = sub.add_parser("export-test", help="write a finding as a standalone pytest module in the engine's test style")
    et.add_argument("path", help="a finding JSON")
    et.add_argument("-o", "--output", default=None, help="write the test here (default: print it)")
    return p


def _source_flag(p: argparse.ArgumentParser) -> None:
    """Each target family's source-tree option (--vllm-source, ...)."""
    from cgsim.targets.registry import source_options

    for option in source_options():
        p.add_argument(option.flag, default=None, metavar="PATH", help=option.help)


def _apply_source_flag(args: argparse.Namespace) -> None:
    """A source-tree option goes into the environment before anything imports
    its engine: campaign workers (forked or spawned), replays and repro
    scripts read it."""
    from cgsim.targets.registry import source_options

    for option in source_options():
        path = getattr(args, option.dest, None)
        if path is None:
            continue
        if not path.strip():
            raise _Exit(2, f"{option.flag} is empty; {option.empty}")
        os.environ[option.env] = os.path.abspath(os.path.expanduser(path))


_CFG_HELP = {
    "mode": "NONE, PIECEWISE, FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE",
    "capture_sizes": "comma list, e.g. 1,2,4,8",
    "lora_cases": "comma list containing 0, e.g. 0,1,2",
    "spec_schedule": "start-end:k,... e.g. 1-8:3,9-64:1 (or JSON)",
    "attention_support": "NEVER, UNIFORM_SINGLE_TOKEN_DECODE, UNIFORM_BATCH or ALWAYS",
}


class _PipeSafe:
    """stdout that survives its reader going away (``list | head -1``): the
    command finishes and exits with its own status instead of "Broken pipe".
    Later output goes to /dev/null, and so does the interpreter's last flush."""

    def __init__(self, stream: Any):
        self._stream = stream
        self._broken = False

    def write(self, text: str) -> int:
        if not self._broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._break()
        return len(text)

    def flush(self) -> None:
        if not self._broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._break()

    def _break(self) -> None:
        self._broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI.  Without ``argv`` it is the process entry (``python -m fuzz``,
    ``cgsim-fuzz``): it reads sys.argv and the process exits when it returns,
    so a campaign may leave its stop signals blocked on the way out."""
    import warnings

    # torch built without NumPy warns at import; it says nothing about cgsim.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    exiting = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    stdout = sys.stdout
    sys.stdout = _PipeSafe(stdout)
    try:
        return _main(argv, exiting)
    finally:
        sys.stdout = stdout


def _main(argv: list[str], exiting: bool = False) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(_join_option_values(parser, argv))
    except SystemExit as exc:  # --help (0) or a usage error (2, one line already printed)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        print(f"{parser.prog}: error: give a command: run, replay, report, explain, list, export-test or doctor "
              f"(see {parser.prog} --help)", file=sys.stderr)
        return 2
    commands = {"run": _cmd_run, "replay": _cmd_replay, "report": _cmd_report, "explain": _cmd_explain,
                "list": _cmd_list, "export-test": _cmd_export_test, "doctor": _cmd_doctor}
    args.exiting = exiting
    try:
        _apply_source_flag(args)
        return commands[args.command](args, argv)
    except _Exit as exc:
        if exc.message:
            print(f"error: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except _stop_signal() as exc:
        print(f"stopped by {exc}", file=sys.stderr)
        return 128 + exc.signum
    except Exception as exc:
        known = _known_errors()
        if isinstance(exc, known):
            print(f"error: {first_line(exc)}", file=sys.stderr)
            return 2
        raise


def _stop_signal() -> type:
    from fuzz.campaign.executor import StopSignal

    return StopSignal


def _known_errors() -> tuple[type, ...]:
    from cgsim.backends import BackendUnavailable
    from cgsim.config import ConfigError
    from cgsim.families import FamilyRegistryError
    from cgsim.finding import FindingError
    from cgsim.modes import ModeResolutionError
    from cgsim.scenario import ScenarioError
    from cgsim.spec import UnknownRuleset
    from cgsim.targets import TargetEnvironmentError, UnknownTarget
    from fuzz.campaign import UsageError

    return (ConfigError, ScenarioError, UnknownRuleset, FindingError, UsageError, ModeResolutionError, OSError,
            BackendUnavailable, TargetEnvironmentError, UnknownTarget, FamilyRegistryError)


# -- run ---------------------------------------------------------------------------
def _cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    """The campaign against the target, of whichever family (``fuzz.campaign``)."""
    from fuzz.campaign.command_line import run_from_arguments

    command = "python -m fuzz " + " ".join(shlex.quote(a) for a in argv)
    return run_from_arguments(args, command)


# -- replay ---------------------------------------------------------------------------
def _cmd_replay(args: argparse.Namespace, argv: list[str]) -> int:
    path = args.path
    args.timeout = _duration(args.timeout, "--timeout")
    if args.backend not in (None, "mock", "cuda"):
        raise _Exit(2, f"unknown backend {args.backend!r}; choose mock or cuda")
    if not os.path.exists(path):
        raise _Exit(2, f"{path}: no such finding or repro script")
    report = _report_of(path)
    if report is not None:
        raise _Exit(2, report)
    if os.path.isdir(path):
        raise _Exit(2, f"{path} is a directory; give a finding (findings/<id>.json) or a repro script "
                       "(findings/repro_<id>.py)")
    if path.endswith(".py"):
        return _replay_script(path, args)
    from cgsim.replay import describe, reproduce
    from cgsim.report.findings import load_finding
    from cgsim.targets.registry import source_options

    finding = load_finding(path)  # of any family: reproduce() hands it to its family's replay
    for option in source_options():
        recorded = finding.extra.get(option.recorded_as) if option.recorded_as else None
        if recorded and not os.environ.get(option.env) and os.path.isdir(str(recorded)):
            # Replayed on the tree it was found on, while that tree is here.
            os.environ[option.env] = str(recorded)
            commit = f" (commit {finding.extra.get(option.commit_key)})" if option.commit_key else ""
            print(f"using the {option.what} source tree the finding was found on: {recorded}{commit}; "
                  f"{option.flag} overrides it")
    for line in describe(finding):
        print(line)
    try:
        result = reproduce(finding, backend=args.backend, timeout=args.timeout)
    except Exception as exc:
        raise _Exit(2, f"cannot replay {path}: {first_line(exc)}") from None
    for line in result.lines():
        print(line)
    return 1 if result.reproduced else 0


_REPORT_FILES = ("index.md", "index.html", "summary.json", "junit.xml")


def _report_of(path: str) -> str | None:
    """What to say when ``path`` is a campaign's run directory or one of its
    report files rather than a finding: which findings it has to replay."""
    run_dir = path if os.path.isdir(path) else os.path.dirname(path) or "."
    if not os.path.isdir(os.path.join(run_dir, "findings")):
        return None
    if not os.path.isdir(path) and os.path.basename(path) not in _REPORT_FILES:
        return None
    what = "a campaign's run directory" if os.path.isdir(path) else "a campaign report"
    ids = sorted(n for n in os.listdir(os.path.join(run_dir, "findings")) if n.endswith(".json") and not n.startswith("."))
    example = os.path.join(run_dir, "findings", ids[0] if ids else "<id>.json")
    listed = f" ({len(ids)} there, e.g. {example})" if ids else " (this run has none)"
    return (f"{path} is {what}, not a finding; give one of its findings: {os.path.join(run_dir, 'findings', '<id>.json')} "
            f"or findings/repro_<id>.py{listed}")


# -- doctor -----------------------------------------------------------------------------
def _cmd_doctor(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the target's self-check and list every check; exit 2 (one line on
    stderr) when one failed."""
    from cgsim.targets import get_target

    target = get_target(args.target)
    target.prepare_environment()
    doctor = target.tooling.doctor
    if doctor is None:
        print(f"{args.target}: nothing to check (no adapter between cgsim and the code under test)")
        return 0
    header, checks, failure = doctor(findings_dir=args.findings, progress=lambda c: print(
        f"  {c.label}  {c.name}: {c.detail}", flush=True), announce=print)
    failed = sum(1 for c in checks if not c.ok)
    found = [f for c in checks for f in c.findings]
    print(f"doctor: {len(checks)} checks, {failed} failed, {len(found)} finding(s) about the tree ({header})")
    if failure:
        raise _Exit(2, failure)
    if found:
        print(f"doctor: the tree violates {', '.join(sorted({f.property for f in found}))} in scenarios no "
              f"documented defect explains: python -m fuzz run --target {args.target} shrinks them and writes their "
              "repros")
        return 1
    return 0


def _replay_script(path: str, args: argparse.Namespace) -> int:
    """Run a repro script in its own process.  Its exit status says 1
    reproduced, 0 not, 2 cannot run here; any other end (a signal, another
    status, no end within the time limit) reproduces only the finding that
    predicts it (a crash, a hang) and otherwise tells nothing."""
    import signal

    from cgsim.replay import finding_in_repro, script_time_limit, script_verdict

    finding = finding_in_repro(path)  # FindingError (exit 2) for a file that is not a repro script
    cmd = [sys.executable, path] + (["--backend", args.backend] if args.backend else [])
    if args.timeout:
        cmd += ["--timeout", repr(args.timeout)]
    limit = script_time_limit(finding, args.timeout)
    try:
        code: int | None = subprocess.call(cmd, timeout=limit)
    except subprocess.TimeoutExpired:
        code = None
    if code == -signal.SIGINT:
        raise KeyboardInterrupt
    if code == 2:
        return 2  # the script cannot run here and said why, in one line
    verdict = script_verdict(finding, code, limit, path)
    if verdict.reproduced is None:
        raise _Exit(2, verdict.message)
    if verdict.message:
        print(verdict.message)
    return 1 if verdict.reproduced else 0


# -- report ---------------------------------------------------------------------------------
def _cmd_report(args: argparse.Namespace, argv: list[str]) -> int:
    """The campaign's report rebuilt from the run directory (``fuzz.campaign.rebuild``)."""
    from fuzz.campaign.command_line import rebuild_from_command_line

    return rebuild_from_command_line(args.run_dir, args.quiet)


# -- export-test ---------------------------------------------------------------------------
def _cmd_export_test(args: argparse.Namespace, argv: list[str]) -> int:
    from cgsim.report.atomic import atomic_write_text
    from cgsim.report.findings import load_finding
    from fuzz.export_test import ExportError, export_test

    finding = load_finding(args.path)
    try:
        text = export_test(finding, source=args.path)
    except ExportError as exc:
        raise _Exit(2, str(exc)) from None
    if args.output is None:
        sys.stdout.write(text)
        return 0
    atomic_write_text(args.output, text)
    print(f"wrote {args.output} (pytest {args.output}; it imports only the engine, torch and pytest)")
    return 0


# -- list -------------------------------------------------------------------------------
def _cmd_list(args: argparse.Namespace, argv: list[str]) -> int:
    """Each family's targets, rulesets and properties (``cgsim.families``)."""
    from cgsim.families import families

    for family in families().values():
        for row in family.catalogue():
            sys.stdout.write(f"{row.what.ljust(9)} {row.name}  {row.summary}\n")
    return 0


# -- explain -------------------------------------------------------------------------------
def _cmd_explain(args: argparse.Namespace, argv: list[str]) -> int:
    from fuzz.explain import explain_config, explain_text, write_plot

    if args.plot:  # refuse before printing anything
        from cgsim.report.plots import MissingMatplotlib, picture_format, require_matplotlib

        try:
            picture_format(args.plot)
        except ValueError as exc:
            raise _Exit(2, f"--plot {exc}") from None
        folder = os.path.dirname(os.path.abspath(args.plot))
        if os.path.isdir(args.plot):
            raise _Exit(2, f"--plot {args.plot!r} is a directory; give a file name such as {os.path.join(args.plot, 'dispatch.png')}")
        if not os.path.isdir(folder):
            raise _Exit(2, f"--plot {args.plot!r}: the directory {folder} does not exist; create it "
                           f"(mkdir -p {shlex.quote(folder)}) or give a path in an existing directory")
        if not os.access(folder, os.W_OK):
            raise _Exit(2, f"--plot {args.plot!r}: the directory {folder} is not writable; give a path you can write to")
        try:
            require_matplotlib()
        except MissingMatplotlib as exc:
            raise _Exit(2, f"--plot {args.plot}: {exc}") from None
    config = _config_from_args(args)
    ruleset = args.ruleset or "pr48822"
    from cgsim.spec import get_ruleset

    get_ruleset(ruleset)
    report = explain_config(config, ruleset, lora=args.lora, max_tokens=args.max_rows)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(explain_text(report))
    if args.plot:
        try:
            write_plot(config, ruleset, args.plot, max_tokens=args.max_rows)
        except OSError as exc:
            raise _Exit(2, f"--plot {args.plot!r}: cannot write it: {exc.strerror or exc}; "
                           "give a path you can write to") from None
        print(f"dispatch map written to {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _config_from_args(args: argparse.Namespace) -> Any:
    from dataclasses import fields

    from cgsim.config import ConfigError, ManagerConfig

    data: dict[str, Any] = {}
    if args.config:
        data = ManagerConfig.load(args.config).to_json()
    for f in fields(ManagerConfig):
        raw = getattr(args, f"cfg_{f.name}", None)  # engine_options has no flag
        if raw is None:
            continue
        data[f.name] = _parse_field(f.name, raw)
    try:
        return ManagerConfig.from_json(data)
    except TypeError as exc:
        raise ConfigError("<config>", data, str(exc), "check the field values") from None


def _parse_field(name: str, raw: Any) -> Any:
    from cgsim.config import ConfigError

    from cgsim.values import ValueProblem, parse_count, parse_sizes

    if isinstance(raw, bool):
        return raw
    text = str(raw).strip()
    try:
        if name in ("capture_sizes", "lora_cases"):
            return list(parse_sizes(text, least=1 if name == "capture_sizes" else 0))
        if name == "spec_schedule":
            if text.lower() in ("none", ""):
                return None
            if text.startswith("["):
                return json.loads(text)
            out = []
            for part in text.split(","):
                rng, k = part.split(":")
                lo, hi = rng.split("-")
                out.append([int(lo), int(hi), int(k)])
            return out
        if name in ("max_num_reqs", "max_capture_size", "decode_query_len", "num_ubatches", "ubatch_threshold"):
            return parse_count(text)
        if name == "attention_support" and text.isdigit():
            return int(text)
    except ValueProblem as exc:
        raise ConfigError(name, raw, str(exc), "see python -m fuzz explain --help") from None
    except (ValueError, json.JSONDecodeError):
        raise ConfigError(name, raw, "cannot be parsed", _CFG_HELP.get(name, "give a number")) from None
    return text
