"""Profiles: one value per name that pytest and campaigns share, and that
reaches Hypothesis in a campaign worker."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

from cgsim.profiles import PROFILES, Profile, get_profile


def test_registered_hypothesis_profiles_match_the_profile_values():
    for name, profile in PROFILES.items():
        registered = settings.get_profile(name)
        assert registered.max_examples == profile.max_examples
        assert registered.derandomize == profile.derandomize
        assert registered.deadline is None


def test_campaign_settings_start_from_the_profile():
    profile = Profile("custom", max_examples=5, chunk_examples=7, hypothesis_extra={"stateful_step_count": 3})
    s = profile.campaign_settings()
    assert s.max_examples == 7  # a chunk, from the profile
    assert s.stateful_step_count == 3  # the profile's own Hypothesis setting reaches the worker
    # ... and what a campaign must control itself:
    assert s.database is None and not s.derandomize and s.report_multiple_bugs is False
    assert set(s.suppress_health_check) == set(HealthCheck)
    assert tuple(s.phases) == (Phase.explicit, Phase.generate, Phase.shrink)
    assert profile.campaign_settings(chunk_examples=3).max_examples == 3


def test_profiles_give_campaign_defaults():
    assert get_profile("nightly").seed is None and get_profile("nightly").default_workers() >= 1
    assert get_profile("ci").chunk_examples == 50 and get_profile("dev").budget_s == 10.0
