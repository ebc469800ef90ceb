"""The capture-manager families (``cgsim.families``): each finding and target
belongs to one family, whose operations generic code calls; and a scan of
the source tree that no generic module tests which family it runs."""

from __future__ import annotations

import ast
import os

import pytest

from cgsim.families import DEFAULT_FAMILY, Family, families, family_of_finding, family_of_scenario, family_of_target
from cgsim.finding import Finding
from cgsim.properties.registry import Violation
from tests.source_trees import parsed_modules, string_literals

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- the registry ------------------------------------------------------------------------------


def test_cgsim_registers_the_decode_and_encoder_families_as_values():
    assert list(families()) == ["decode", "encoder"]
    assert all(isinstance(f, Family) for f in families().values())


@pytest.mark.parametrize("scenario, family", [
    ({"schema_version": 1, "config": {}, "steps": []}, "decode"),
    ({"schema_version": 1, "kind": "encoder", "config": {}, "steps": []}, "encoder"),
    ({"kind": "no-such-kind"}, DEFAULT_FAMILY),  # its loader says what is wrong with it
    ([1, 2], DEFAULT_FAMILY),
])
def test_a_scenario_belongs_to_the_family_its_kind_names(scenario, family):
    assert family_of_scenario(scenario).name == family


def test_a_finding_belongs_to_the_family_of_its_scenario():
    encoder = Finding.from_violation(Violation("ENC-FIT", "m"), {"kind": "encoder"}, "encoder-reference", "mock")
    decode = Finding.from_violation(Violation("DISPATCH-COMPLETE", "m"), {"steps": []}, "reference", "mock")
    assert (family_of_finding(encoder).name, family_of_finding(decode).name) == ("encoder", "decode")


def test_every_target_a_family_lists_is_that_familys_and_unknown_names_go_to_the_default():
    for family in families().values():
        listed = [row.name for row in family.catalogue() if row.what in ("target", "mutant")]
        assert listed and all(family_of_target(name) == family for name in listed), family.name
    assert family_of_target("no-such-target").name == DEFAULT_FAMILY  # the target registry names the choices


def test_an_outside_family_that_does_not_load_is_named_where_nothing_else_claims(monkeypatch):
    """cgsim's own families still work; a target or a scenario kind no family
    claims, which may be the broken family's, names it in one line."""
    import cgsim.families as registry  # noqa: PLC0415
    from importlib.metadata import EntryPoint  # noqa: PLC0415

    broken = EntryPoint("vit", "no_such_package.cgsim_family:FAMILY", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken])
    monkeypatch.setattr(registry, "_cache", None)
    monkeypatch.setattr(registry, "_broken", {})
    assert list(families()) == ["decode", "encoder"]
    assert family_of_target("reference").name == "decode"
    assert family_of_scenario({"steps": []}).name == "decode"
    for unclaimed in (lambda: family_of_target("vit-reference"), lambda: family_of_scenario({"kind": "vit"})):
        with pytest.raises(registry.FamilyRegistryError, match="family entry point vit = .* does not load") as info:
            unclaimed()
        assert "\n" not in str(info.value)


def test_the_families_property_registries_are_disjoint():
    decode, encoder = (set(families()[name].properties()) for name in ("decode", "encoder"))
    assert decode and encoder and not decode & encoder


# -- no generic module tests which family it runs ---------------------------------------------------

# A family's own modules: they may name it.
FAMILY_MODULES = (
    "cgsim/families.py",
    "cgsim/encoder/",
    "cgsim/properties/encoder.py",
    "cgsim/spec/encoder.py",
    "cgsim/targets/vllm/encoder",
)
# The default family's name is also SGLang's decode runner's kind, compared by its own code.
SCANNED_NAMES = tuple(name for name in families() if name != DEFAULT_FAMILY)


def family_tests(root: str) -> list[tuple[str, int, str]]:
    """(path, line, what) of each comparison (``==``, ``!=``, ``in``) with a
    family's name and each call of an ``is_<family>_...`` predicate, in the
    cgsim and fuzz modules outside the families' own."""
    return [(rel, node.lineno, what) for rel, tree in parsed_modules(root, skip=FAMILY_MODULES)
            for node in ast.walk(tree) for what in _family_test(node)]


def _family_test(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Compare):
        return [f"compares with {lit!r}" for operand in (node.left, *node.comparators) for lit in string_literals(operand)
                if lit in SCANNED_NAMES]
    if isinstance(node, ast.Call):
        called = getattr(node.func, "id", None) or getattr(node.func, "attr", None) or ""
        return [f"calls {called}"] if called.startswith(tuple(f"is_{n}_" for n in SCANNED_NAMES)) else []
    return []


def test_no_generic_module_tests_which_family_it_runs():
    found = [f"{path}:{line}: {what}" for path, line, what in family_tests(ROOT)]
    assert not found, ("generic code tests which family it runs (ask its family, cgsim.families.family_of_finding "
                       "or family_of_target, and call the family's operation):\n" + "\n".join(found))


@pytest.mark.parametrize("code", [
    'if isinstance(finding.scenario, dict) and finding.scenario.get("kind") == "encoder":\n    pass\n',
    'ALL = {pid: p for pid, p in registered().items() if p.family != "encoder"}\n',
    'ok = family in ("encoder",)\n',
    'if is_encoder_target(args.target):\n    pass\n',
    'ok = encoder_campaign.is_encoder_run(run_dir)\n',
])
def test_the_family_scan_finds_the_tests_generic_code_used_to_make(tmp_path, code):
    (tmp_path / "fuzz").mkdir()
    (tmp_path / "fuzz" / "generic.py").write_text(code)
    assert {path for path, _, _ in family_tests(str(tmp_path))} == {"fuzz/generic.py"}


def test_the_family_scan_leaves_a_familys_own_modules_alone(tmp_path):
    (tmp_path / "cgsim" / "encoder").mkdir(parents=True)
    (tmp_path / "cgsim" / "encoder" / "replay.py").write_text('ok = scenario.get("kind") == "encoder"\n')
    assert family_tests(str(tmp_path)) == []
