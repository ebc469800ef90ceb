"""Profiles: ``dev`` (quick local loop), ``ci`` (the pull-request gate),
``nightly`` (long GPU/CPU fuzz jobs).

One frozen ``Profile`` per name holds both halves: the Hypothesis settings
(registered under the same name, so pytest's ``--hypothesis-profile=ci`` and
``python -m fuzz run --profile ci`` mean the same thing) and a campaign's
defaults (budget, workers, per-scenario timeout, examples per chunk, seed).
A campaign worker runs Hypothesis with the profile's settings and overrides
only what a campaign must control itself (``campaign_settings``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, settings

__all__ = ["Profile", "PROFILES", "get_profile", "register_profiles"]

_QUIET_HEALTH = (HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much)


@dataclass(frozen=True)
class Profile:
    name: str
    # -- Hypothesis (pytest runs; campaign chunks through campaign_settings) ----
    max_examples: int
    derandomize: bool = False
    print_blob: bool = False
    suppress_health_check: tuple[HealthCheck, ...] = _QUIET_HEALTH
    # -- campaign defaults --------------------------------------------------------
    budget_s: float = 10.0
    workers: int | None = 1  # None: one per core
    timeout_s: float = 10.0
    chunk_examples: int = 25  # examples per Hypothesis run inside a worker
    seed: int | None = 0  # None: a random campaign seed
    hypothesis_extra: dict = field(default_factory=dict)

    def hypothesis_kwargs(self) -> dict:
        return dict(
            max_examples=self.max_examples, derandomize=self.derandomize, print_blob=self.print_blob,
            suppress_health_check=list(self.suppress_health_check),
            # A first capture in a cold process can take a while; hangs are
            # caught by the per-scenario timeout instead.
            deadline=None, **self.hypothesis_extra,
        )

    def settings(self) -> settings:
        return settings(**self.hypothesis_kwargs())

    def default_workers(self) -> int:
        return self.workers if self.workers is not None else (os.cpu_count() or 1)

    def campaign_settings(self, chunk_examples: int | None = None) -> settings:
        """What a campaign worker runs each chunk with: this profile's settings,
        with the campaign's own rules on top: a chunk of examples, no example
        database (the seed alone decides what runs, so a campaign repeats),
        seeds set per chunk rather than derandomized, every health check off (a
        campaign reports failures, not slowness), quiet output, one bug per
        shrink (the worker pins the property it shrinks), and no explain phase
        (the finding's message says what went wrong)."""
        return settings(
            self.settings(),
            max_examples=chunk_examples or self.chunk_examples,
            database=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.generate, Phase.shrink),
            report_multiple_bugs=False,
            print_blob=False,
            verbosity=Verbosity.quiet,
        )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("dev", max_examples=30, budget_s=10.0, workers=1, timeout_s=10.0, chunk_examples=25, seed=0),
        Profile("ci", max_examples=100, derandomize=True, print_blob=True, budget_s=60.0,
                workers=min(2, os.cpu_count() or 1), timeout_s=30.0, chunk_examples=50, seed=0),
        Profile("nightly", max_examples=2000, budget_s=1800.0, workers=None, timeout_s=120.0, chunk_examples=100,
                seed=None),
    )
}


class UnknownProfile(ValueError):
    pass


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}") from None


def register_profiles() -> None:
    for profile in PROFILES.values():
        settings.register_profile(profile.name, **profile.hypothesis_kwargs())


register_profiles()
