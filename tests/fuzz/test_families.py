"""The command-line half of each capture-manager family (``fuzz.families``):
one per family of ``cgsim.families``, found by target name and by run directory."""

from __future__ import annotations

import json

from cgsim.families import families
from fuzz.families import commands_of_run_dir, commands_of_target, family_commands


def test_every_family_has_its_command_line_half():
    assert set(family_commands()) == set(families())
    assert all(c.family == name for name, c in family_commands().items())


def test_a_target_runs_its_own_familys_campaign():
    assert commands_of_target("encoder-mutant:fit-strict").family == "encoder"
    assert commands_of_target("mutant:range-off-by-one").family == "decode"
    assert commands_of_target("no-such-target").family == "decode"  # its campaign names the choices


def test_a_run_directory_is_rebuilt_by_the_family_whose_summary_it_has(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"schema": "cgsim.encoder-summary"}))
    assert commands_of_run_dir(str(tmp_path)).family == "encoder"
    (tmp_path / "summary.json").write_text(json.dumps({"schema": "cgsim.campaign-summary"}))
    assert commands_of_run_dir(str(tmp_path)).family == "decode"
    assert commands_of_run_dir(str(tmp_path / "missing")).family == "decode"  # its rebuild says what is wrong
