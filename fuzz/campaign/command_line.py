"""``python -m fuzz run`` and ``python -m fuzz report`` for every family: a
campaign built from the parsed flags, and a run directory's report rebuilt."""

from __future__ import annotations

import argparse
import os

from fuzz.campaign.options import options_for_profile, parse_budget
from fuzz.campaign.rebuild import rebuild_report
from fuzz.campaign.run import run_campaign

__all__ = ["run_from_arguments", "rebuild_from_command_line"]


def _seconds(text: str | None, flag: str, zero: bool = False) -> float | None:
    return None if text is None else parse_budget(text, flag=flag, zero=zero)


def run_from_arguments(args: argparse.Namespace, command: str) -> int:
    """A campaign as ``python -m fuzz run``'s flags ask for it; its exit status."""
    budget = _seconds(args.budget, "--budget")
    grace = _seconds(args.shrink_grace, "--shrink-grace", zero=True)
    limit = _seconds(args.shrink_limit, "--shrink-limit", zero=True)
    timeout = _seconds(args.timeout, "--timeout")
    options = options_for_profile(
        args.profile,
        target=args.target,
        backend=args.backend,
        ruleset=args.ruleset,
        budget_s=budget,
        workers=args.workers,
        force_workers=args.force_workers,
        seed=args.seed,
        report_dir=args.report_dir,
        timeout_s=timeout,
        max_examples=args.max_examples,
        chunk_examples=args.chunk_examples,
        shrink_grace_s=grace,
        shrink_limit_s=limit,
        shrink_time_share=args.shrink_share,
        gpus=args.gpus,
        one_per_gpu=bool(args.gpus) and args.workers is None,
        start_method=args.start_method,
        ray=args.ray,
        workers_from_cluster=args.ray is not None and args.workers is None,
        example_db=args.example_db,
        runner_confirm=not args.no_runner_confirm,
        runner_share_s=_seconds(args.runner_share, "--runner-share", zero=True),
        confirm_budget_s=_seconds(args.confirm_budget, "--confirm-budget", zero=True),
        quiet=args.quiet,
        sources=_sources_given(),
        diff_base=args.diff_base,
        command=command,
    )
    return run_campaign(options, ignore_late_signals=args.exiting).exit_code


def _sources_given() -> tuple[tuple[str, str], ...]:
    """(environment variable, tree) of each source-tree option set for this run."""
    from cgsim.targets.registry import source_options

    return tuple((o.env, os.environ[o.env]) for o in source_options() if os.environ.get(o.env))


def rebuild_from_command_line(run_dir: str, quiet: bool) -> int:
    """``python -m fuzz report RUN_DIR``; its exit status."""
    return rebuild_report(run_dir, quiet=quiet).exit_code
