"""What the README tells a new user to type does what it says."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _quick_start() -> str:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return text[text.index("## Quick start"):text.index("## The pipeline")]


def test_the_quick_start_installs_the_plot_extra():
    """The first finding's HTML report has its dispatch maps: every install
    line of the quick start takes the plot extra."""
    installs = re.findall(r"pip install [^\n&]*", _quick_start())
    assert installs
    for line in installs:
        assert "'.[plot]'" in line or '".[plot]"' in line, line



def test_the_fault_matrix_is_linked_and_every_test_it_names_exists():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert "docs/faults.md" in readme
    matrix = open(os.path.join(ROOT, "docs", "faults.md"), encoding="utf-8").read()
    named = set(re.findall(r"`(test_\w+)(?:\[[^\]]*\])?`", matrix))
    assert len(named) >= 15
    defined = set()
    for folder, _dirs, names in os.walk(os.path.join(ROOT, "tests")):
        for name in names:
            if name.endswith(".py"):
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                defined.update(re.findall(r"^def (test_\w+)", text, re.M))
    assert named <= defined, sorted(named - defined)
