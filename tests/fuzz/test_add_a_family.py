"""docs/architecture.md's recipe "Add a capture manager", held to the tree: a
toy family written as the recipe says, in a package of its own and
registered through the two entry-point groups alone, runs a campaign,
shows in ``fuzz list``, replays its finding and is refused by export-test
in one line, with no file of cgsim or fuzz touched."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib.metadata import EntryPoint

import pytest

from fuzz.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The toy family: a manager that sorts a batch's sizes, with a bug past three of them.
TOY_FAMILY = '''
from dataclasses import dataclass
from typing import Any, Mapping

from hypothesis import strategies as st

from cgsim.families import CatalogueRow, Family, FamilySearch, owns_target_of
from cgsim.finding import Finding
from cgsim.observe import Outcome
from cgsim.properties.registry import Violation, add_property_family, declare, registered
from cgsim.targets.base import Drawing, Tooling, Triage
from cgsim.targets.registry import TargetFamily, get_target

# 1. the scenario
@dataclass(frozen=True)
class ToyScenario:
    sizes: tuple

    def to_json(self):
        return {"kind": "toy", "sizes": list(self.sizes)}

    @classmethod
    def from_json(cls, data):
        if not isinstance(data, Mapping) or data.get("kind") != "toy":
            raise ValueError(f"not a toy scenario: {data!r}")
        return cls(tuple(int(s) for s in data["sizes"]))

    def short(self):
        return f"ToyScenario({list(self.sizes)})"

# 2. the properties
add_property_family("toy")
SORTED = declare("TOY-SORTED", "the toy manager returns a batch's sizes in order", family="toy",
                 harness_only=True)

# 3. the targets
class ToyTarget:
    def __init__(self, name, bug):
        self.name, self.bug = name, bug
        self.drawing, self.triage, self.tooling = Drawing(), Triage(), Tooling()

    def default_ruleset(self):
        return "toy"

    def prepare_environment(self):
        return None

    def environment(self):
        return {}

    def order(self, sizes):
        out = sorted(sizes)
        return out[::-1] if self.bug and len(out) > 3 else out

TARGET = TargetFamily("toy-target", "a toy manager with a bug", lambda _v: ToyTarget("toy-target", True),
                      capture_family="toy")
FIXED = TargetFamily("toy-fixed", "the toy manager without it", lambda _v: ToyTarget("toy-fixed", False),
                     capture_family="toy")

# 4. the search
def _observe(scenario, target, backend, timeout_s, pipeline):
    got = get_target(target).order(scenario.sizes)
    findings = () if got == sorted(got) else (Finding.from_violation(
        Violation("TOY-SORTED", f"{got} is out of order"), scenario.to_json(), target, backend, scenario.short()),)
    return Outcome(findings, ("TOY-SORTED",))

SEARCH = FamilySearch("toy", lambda ruleset, target: st.builds(ToyScenario, st.lists(st.integers(0, 9), max_size=6).map(tuple)),
                      _observe, lambda scenario, t: t, ToyScenario.from_json, lambda s: (s.sizes,),
                      lambda s: (("sizes", str(len(s.sizes))),))

# 5. the family
class Replayed:
    def __init__(self, prop, reproduced):
        self.property, self.reproduced = prop, reproduced

    def lines(self):
        return [f"REPRODUCED {self.property}" if self.reproduced else f"not reproduced: {self.property} holds"]

def _reproduce(finding, backend, timeout):
    outcome = _observe(ToyScenario.from_json(finding.scenario), finding.target, backend or "mock", timeout, None)
    return Replayed(finding.property, bool(outcome.findings))

def _properties():
    return {pid: p for pid, p in registered().items() if p.family == "toy"}

FAMILY = Family(
    name="toy", summary="a toy family",
    owns_scenario=lambda s: isinstance(s, Mapping) and s.get("kind") == "toy",
    owns_target=owns_target_of("toy"), reproduce=_reproduce,
    describe=lambda f: [f"finding {f.id}: {f.property} on target {f.target}"],
    scenario_code=lambda s: f"scenario = ToyScenario({tuple(ToyScenario.from_json(s).sizes)!r})",
    scenario_short=lambda s: ToyScenario.from_json(s).short(),
    properties=_properties, judged_by=lambda rulesets: _properties(),
    check_ruleset=lambda target, ruleset: None,
    catalogue=lambda: (CatalogueRow("target", "toy-target", "a toy manager with a bug"),
                       CatalogueRow("property", "TOY-SORTED", "the toy manager returns a batch's sizes in order")),
    search="toyfam:SEARCH",
)
'''


def _tree_digest() -> str:
    digest = hashlib.sha256()
    for package in ("cgsim", "fuzz"):
        for folder, dirs, files in sorted(os.walk(os.path.join(ROOT, package))):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                with open(os.path.join(folder, name), "rb") as fh:
                    digest.update(name.encode() + fh.read())
    return digest.hexdigest()


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The toy family installed as a package outside cgsim would be: its module on the path, its two entry points."""
    from cgsim import families
    from cgsim.targets import registry

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "toyfam.py").write_text(TOY_FAMILY)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    points = {families.ENTRY_POINT_GROUP: [EntryPoint("toy", "toyfam:FAMILY", families.ENTRY_POINT_GROUP)],
              registry.ENTRY_POINT_GROUP: [EntryPoint(n, f"toyfam:{a}", registry.ENTRY_POINT_GROUP)
                                           for n, a in (("toy-target", "TARGET"), ("toy-fixed", "FIXED"))]}
    for module in (families, registry):
        monkeypatch.setattr(module, "entry_points", lambda group: points.get(group, []))
        monkeypatch.setattr(module, "_cache", None)
    before = _tree_digest()
    yield tmp_path
    assert _tree_digest() == before  # the family touched no file of cgsim or fuzz
    from cgsim.properties import registry as properties

    # The toy's declarations leave with it: later tests in this process see cgsim's properties alone.
    monkeypatch.delitem(sys.modules, "toyfam", raising=False)
    properties._REGISTRY.pop("TOY-SORTED", None)
    properties._ADDED_FAMILIES.remove("toy")


def test_the_recipe_names_each_piece_the_toy_family_is_made_of():
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as fh:
        doc = fh.read()
    recipe = doc[doc.index("### Add a capture manager"):]
    recipe = recipe[:recipe.index("\n### ", 4)]
    for piece in ("add_property_family", "declare(", "TargetFamily", "capture_family", "FamilySearch", "Family",
                  "owns_target_of", "search="):
        assert piece in recipe and piece in TOY_FAMILY, piece
    for group in ("cgsim.families", "cgsim.targets"):  # the toy's two entry points (the fixture's)
        assert f'entry-points."{group}"' in recipe, group
    assert "test_add_a_family.py" in recipe


def test_a_family_added_through_its_entry_points_runs_the_one_campaign(toy_family, capsys):
    reports = toy_family / "reports"
    assert main(["run", "--target", "toy-target", "--max-examples", "200", "--seed", "1", "--report-dir",
                 str(reports), "--quiet"]) == 1
    run_dir = os.path.realpath(reports / "latest")
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    (entry,) = summary["findings"]
    assert entry["property"] == "TOY-SORTED" and entry["scenario"]["kind"] == "toy"
    assert len(entry["scenario"]["sizes"]) == 4  # Hypothesis shrank it to the smallest batch the bug needs
    assert entry["scenario_code"].startswith("scenario = ToyScenario(")
    assert [p for p in summary["properties"] if not p.startswith(("TOY-", "NO-"))] == []
    assert summary["coverage"]["sizes"]
    path = os.path.join(run_dir, entry["path"])
    assert os.path.exists(os.path.join(run_dir, entry["repro_path"]))
    capsys.readouterr()
    assert main(["replay", path]) == 1 and "REPRODUCED TOY-SORTED" in capsys.readouterr().out
    # The fixed manager: the same campaign finds nothing.
    assert main(["run", "--target", "toy-fixed", "--max-examples", "100", "--seed", "1", "--report-dir",
                 str(toy_family / "fixed"), "--quiet"]) == 0
    # Listed with its target and property; export-test has no writer for it: one line, exit 2.
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "toy-target" in listed and "TOY-SORTED" in listed
    assert main(["export-test", path]) == 2
    err = capsys.readouterr().err
    assert "'toy-target', which has no test writer yet" in err and err.count("\n") == 1
