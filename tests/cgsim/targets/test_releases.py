"""The one reader of release rows both engines share (cgsim/targets/releases.py)."""

from cgsim.targets.releases import Design, design_for, in_range, version_key

ROWS = (Design("0.20.0", "old", "a"), Design("0.25.0", "mid", "b"), Design("0.34.0", "new", "c"))


def test_versions_order_by_release_whatever_their_local_and_dev_parts():
    assert version_key("0.33.0+cpu") == (0, 33, 0)
    assert version_key("0.35.0.dev12+g1234abc") == (0, 35, 0)
    assert version_key("0.5") == (0, 5, 0)
    assert version_key("0.5.10") > version_key("0.5.9")


def test_a_release_follows_the_newest_design_row_at_or_before_it():
    assert design_for(ROWS, "0.19.1") is None
    assert [design_for(ROWS, v).ruleset for v in ("0.20.0", "0.24.9", "0.25.0", "0.33.1+cpu", "0.35.0.dev1")] == [
        "old", "old", "mid", "mid", "new"]


def test_a_range_holds_its_first_release_and_not_its_end():
    assert in_range("0.25.0", "0.25.0", "0.29.0") and in_range("0.28.3", "0.25", "0.29")
    assert not in_range("0.29.0", "0.25.0", "0.29.0") and not in_range("0.24.0", "0.25.0", None)
    assert in_range("1.0.0", "0.25.0", None)
