"""Hypothesis profiles: ``dev`` (quick local loop), ``ci`` (the pull-request
gate), ``nightly`` (long GPU/CPU fuzz jobs).  Selected with pytest's
``--hypothesis-profile`` or the campaign's ``--profile``."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

__all__ = ["PROFILES", "register_profiles"]

_COMMON = dict(
    deadline=None,  # a capture on a cold process can take a while; hangs are caught by timeouts
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

PROFILES = {
    "dev": dict(max_examples=30, **_COMMON),
    "ci": dict(max_examples=100, derandomize=True, print_blob=True, **_COMMON),
    "nightly": dict(max_examples=2000, **_COMMON),
}


def register_profiles() -> None:
    for name, kwargs in PROFILES.items():
        settings.register_profile(name, **kwargs)


register_profiles()
