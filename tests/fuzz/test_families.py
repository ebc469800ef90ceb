"""The campaign half of each capture-manager family: every family of
``cgsim.families`` names its ``FamilySearch``, which the one campaign
(``fuzz.campaign``) finds by target name."""

from __future__ import annotations

import dataclasses

import pytest

from cgsim.families import FamilyRegistryError, FamilySearch, families, search_of_family
from fuzz.campaign.search import search_of_target


def test_every_family_names_a_search_of_its_own():
    for name, family in families().items():
        search = search_of_family(family)
        assert isinstance(search, FamilySearch) and search.family == name


def test_a_target_runs_its_own_familys_search():
    assert search_of_target("encoder-mutant:fit-strict").family == "encoder"
    assert search_of_target("mutant:range-off-by-one").family == "decode"


@pytest.mark.parametrize("where, says", [
    ("cgsim.no_such_module:SEARCH", "does not load: ModuleNotFoundError"),
    ("cgsim.families:families", "is a function, not a cgsim.families.FamilySearch"),
])
def test_a_search_that_does_not_load_is_one_line_naming_the_family(where, says):
    family = dataclasses.replace(families()["encoder"], search=where)
    with pytest.raises(FamilyRegistryError, match=f"the encoder family's search {where!r} {says}"):
        search_of_family(family)
