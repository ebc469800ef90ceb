"""A fuzz campaign: workers, a deadline, one merged report (``run``).

The parts, each with one job: ``options`` (what the campaign was asked,
validated once), ``run`` (the run: options, executor, console and report
wired together), ``cluster`` (the Ray cluster a ``--ray`` run joins),
``executor`` with its two kinds, ``supervisor`` (processes here) and
``ray_executor`` with ``ray_actors`` (Ray actors); ``worker`` (one worker's
process and its Hypothesis loop), ``lifecycle`` (what happens to a failure a
worker saw), ``coverage`` (what its scenarios covered), ``inflight`` (the
scenario each worker runs, on disk), ``console``, ``rebuild`` (``fuzz
report``), ``resources``, ``example_db`` and ``command_line`` (``fuzz run``
and ``fuzz report`` for the decode family, ``fuzz.families``).
"""

from fuzz.campaign.executor import StopSignal
from fuzz.campaign.options import CampaignOptions, UsageError, options_for_profile, parse_budget, resolve_gpus
from fuzz.campaign.run import (EXIT_CLEAN, EXIT_FINDINGS, EXIT_REPORT_FAILED, EXIT_USAGE, RUN_LOCK, CampaignResult,
                               exit_code, hold_run_lock, run_campaign, settings_of)

__all__ = [
    "UsageError", "StopSignal", "CampaignOptions", "CampaignResult", "parse_budget", "options_for_profile", "resolve_gpus",
    "run_campaign", "settings_of", "exit_code", "hold_run_lock", "RUN_LOCK",
    "EXIT_CLEAN", "EXIT_FINDINGS", "EXIT_USAGE", "EXIT_REPORT_FAILED",
]
