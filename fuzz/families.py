"""The command-line half of each capture-manager family (``cgsim.families``
holds the rest), keyed by the family's name: the campaign ``python -m fuzz
run`` starts for one of its targets and the report ``python -m fuzz report``
rebuilds for one of its run directories.  It lives in fuzz, beside the
campaigns it starts, since cgsim never imports fuzz."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from cgsim.families import DEFAULT_FAMILY, family_of_target

__all__ = ["FamilyCommands", "family_commands", "commands_of_target", "commands_of_run_dir"]


@dataclass(frozen=True)
class FamilyCommands:
    """``run_campaign(args, command)``: the campaign ``fuzz run``'s parsed
    flags ask for, its exit status (``command``: the command line, for the
    report); ``owns_run_dir(run_dir)``: whether a run directory is one of
    this family's campaigns; ``rebuild_report(run_dir, quiet)``: ``fuzz
    report`` on it, its exit status."""

    family: str
    run_campaign: Callable[[argparse.Namespace, str], int]
    owns_run_dir: Callable[[str], bool]
    rebuild_report: Callable[[str, bool], int]


def family_commands() -> dict[str, FamilyCommands]:
    """Each family's command-line half, by family name (imported when asked: a campaign's modules are heavy)."""
    from fuzz import encoder_campaign
    from fuzz.campaign import command_line

    return {
        "decode": FamilyCommands("decode", command_line.run_from_arguments, command_line.is_campaign_run,
                                 command_line.rebuild_from_command_line),
        "encoder": FamilyCommands("encoder", encoder_campaign.run_from_arguments, encoder_campaign.is_encoder_run,
                                  encoder_campaign.rebuild_from_command_line),
    }


def commands_of_target(name: str) -> FamilyCommands:
    """The command-line half of the family target ``name`` belongs to."""
    return family_commands()[family_of_target(name).name]


def commands_of_run_dir(run_dir: str) -> FamilyCommands:
    """The command-line half of the family whose campaign wrote ``run_dir``
    (the default family's where none claims it: its rebuild says what is wrong)."""
    commands = family_commands()
    return next((c for c in commands.values() if c.owns_run_dir(run_dir)), commands[DEFAULT_FAMILY])
