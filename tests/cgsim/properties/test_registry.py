"""SPEC §4: the property registry (cgsim/properties/registry.py: @declare, the table) on hand-made traces (hand_traces.py)."""

from __future__ import annotations

import pytest

from cgsim.properties import (
    ALL_PROPERTIES,
    PROPERTIES,
    check_scenario,
    judged_by,
    property_ids,
    resolve_alias,
)
from cgsim.properties.registry import FAMILIES, InvalidProperty, declare
from cgsim.properties.view import RunView
from tests.cgsim.properties.hand_traces import BASE, cap, disp, good_trace, scenario


def test_property_table_covers_spec_and_has_one_line_statements():
    spec_ids = (
        "CAND-ORDER", "CAND-BOUNDS", "CAPTURE-ORDER", "CAPTURE-ONCE", "WARMUP-FIRST", "FRESH-METADATA",
        "SKIP-ATTN", "METADATA-LIVE", "PAD-CONSISTENT", "KEY-CONSISTENT", "CAPTURE-USEFUL", "DECODE-LENGTHS",
        "INIT-TOTAL", "NO-ILLEGAL-OP", "DISPATCH-SOUND", "DISPATCH-PRIORITY", "DISPATCH-COMPLETE",
        "DISPATCH-MINIMAL", "DISPATCH-ROUNDTRIP", "BEFORE-CAPTURE", "REPLAY-EQUALS-EAGER", "MODE-RESOLUTION",
        "RELEASE-RECAPTURE",
    )
    assert set(spec_ids) | {"NO-CRASH", "NO-HANG"} <= set(property_ids())
    families = [p.family for p in PROPERTIES.values()]
    assert families == sorted(families, key=FAMILIES.index), "the table is grouped by family, in family order"
    for pid, prop in PROPERTIES.items():
        assert prop.id == pid and prop.statement and "\n" not in prop.statement
    assert ALL_PROPERTIES["CHECK-CRASH"].harness_only and "CHECK-CRASH" not in PROPERTIES
    assert resolve_alias("TARGET-HANG") == "NO-HANG" and resolve_alias("TARGET-CRASH") == "NO-CRASH"


@pytest.mark.parametrize("pid,statement,kw,match", [
    ("capture-order", "x", {"family": "capture"}, "upper-case"),
    ("CAPTURE-ORDER", "x", {"family": "capture"}, "declared twice"),
    ("NEW-ONE", "", {"family": "capture"}, "one non-empty line"),
    ("NEW-ONE", "two\nlines", {"family": "capture"}, "one non-empty line"),
    ("NEW-ONE", "x" * 300, {"family": "capture"}, "at most"),
    ("NEW-ONE", "x", {"family": "nope"}, "family 'nope' is unknown"),
    ("NEW-ONE", "x", {"family": "capture", "applies": lambda a, b: True}, "exactly one"),
    ("NEW-ONE", "x", {"family": "capture", "kind": "boom"}, "kind 'boom'"),
    ("NEW-ONE", "x", {"family": "capture", "engine": "nope"}, "engine 'nope' has no ruleset"),
])
def test_malformed_property_declarations_fail_at_definition(pid, statement, kw, match):
    with pytest.raises(InvalidProperty, match=match):
        declare(pid, statement, **kw)(lambda run: [])
    assert "NEW-ONE" not in ALL_PROPERTIES


def test_a_check_must_take_one_run_view():
    with pytest.raises(InvalidProperty, match="exactly one"):
        declare("NEW-TWO", "x", family="capture")(lambda scenario, trace: [])


def _rule_of_the_run(run):
    return True


def _private_rule(d, full_fits):
    return True


def test_a_rule_is_a_public_predicate_over_plain_values_beside_its_check():
    """``rule=``: the function export-test generates the exported check from
    is a top-level, public function of the check's module taking no RunView."""
    from cgsim.properties.dispatch import priority_ok, roundtrip_ok

    def nested(d):
        return True

    for rule, match in ((nested, "top level"), (lambda d: True, "top level"), (_rule_of_the_run, "never the RunView"),
                        (_private_rule, "must be public"), (roundtrip_ok, "beside the check")):
        with pytest.raises(InvalidProperty, match=match):
            declare("NEW-RULE", "x", family="dispatch", rule=rule)(lambda run: [])
    with pytest.raises(InvalidProperty, match="no rule"):
        declare("NEW-RULE", "x", family="harness", harness_only=True, rule=priority_ok)
    assert "NEW-RULE" not in ALL_PROPERTIES
    assert ALL_PROPERTIES["DISPATCH-PRIORITY"].rule is priority_ok


def test_only_restricts_and_unknown_ids_are_refused():
    sc = scenario(BASE, cap(), disp(1))
    verdict = check_scenario(sc, good_trace(sc), only=["DISPATCH-SOUND", "CAND-ORDER"])
    assert verdict.checked == ("CAND-ORDER", "DISPATCH-SOUND")
    with pytest.raises(ValueError, match="NOPE"):
        check_scenario(sc, good_trace(sc), only=["NOPE"])


def test_an_engines_own_property_is_judged_only_under_its_rulesets():
    """SGL-CAPTURE-USEFUL's ``applies`` holds on any trace with graphs; its
    declaration (``engine``) keeps it off a vLLM ruleset."""
    sc = scenario(BASE, cap(), disp(1))
    assert ALL_PROPERTIES["SGL-CAPTURE-USEFUL"].applies(RunView(sc, good_trace(sc)))
    assert check_scenario(sc, good_trace(sc), only=["SGL-CAPTURE-USEFUL", "CAPTURE-USEFUL"]).checked == (
        "CAPTURE-USEFUL",)


def test_judged_by_lists_the_properties_the_named_rulesets_judge():
    universal = [pid for pid, p in ALL_PROPERTIES.items() if p.engine is None]
    vllm = judged_by(["vllm-0.32", "pr48822", "any"])  # an unknown name is skipped
    assert list(vllm) == universal and not any(pid.startswith("SGL-") for pid in vllm)
    sglang = judged_by(["sglang-0.5.22"])
    assert "SGL-CAPTURE-USEFUL" in sglang and "DISPATCH-STABLE" in sglang and "NO-CRASH" in sglang
    # What the design replaces or waives is never judged under it.
    assert "CAPTURE-USEFUL" not in sglang and "FRESH-METADATA" not in sglang
    assert set(judged_by(["sglang", "vllm-0.32"])) == set(vllm) | set(sglang)
    assert list(judged_by([])) == universal


def test_each_engines_listing_names_only_its_own_familys_properties():
    """From the declarations alone (no engine installed): under every SGLang
    design each of its own properties is listed and none it replaces or
    waives, under vLLM's designs no SGLang one, and neither lists an encoder
    property (those judge encoder scenarios only)."""
    from cgsim.properties import WATCHED
    from cgsim.properties.encoder import ENCODER_PROPERTIES
    from cgsim.spec.rulesets import RULESETS, rulesets_of

    sgl_own = {pid for pid, p in ALL_PROPERTIES.items() if p.engine == "sglang"}
    assert sgl_own and not set(judged_by(rulesets_of("vllm"))) & sgl_own
    for name in rulesets_of("sglang"):
        listed = set(judged_by([name]))
        design = RULESETS[name]
        assert sgl_own <= listed and set(WATCHED) <= listed
        assert not listed & ({old for old, _ in design.replaces} | {pid for pid, _ in design.waives})
    for engine in ("vllm", "sglang"):
        assert not set(judged_by(rulesets_of(engine))) & set(ENCODER_PROPERTIES)
    assert WATCHED == ("NO-CRASH", "NO-HANG", "CHECK-CRASH")  # the harness family, in declaration order
