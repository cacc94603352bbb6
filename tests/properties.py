"""How hard the property tests look: one Hypothesis profile for every run, chosen by HYPOTHESIS_PROFILE.

    python -m pytest -q -n 3                                   # "ci": the suite's time goal holds
    HYPOTHESIS_PROFILE=full python -m pytest -q -n 3           # twice the examples, before a release
    HYPOTHESIS_PROFILE=deep python -m pytest -q tests/peers    # twenty times, for a search run

A property with its own count says so with `examples(n)`, its count in the
"full" profile; "ci" tries half of it (each run draws new examples, so runs
add up), "deep" ten times it, and lets the tests that repeat a race within a
time budget run all their rounds. "ci" halved "full" for the suite's 150 s
on 2 cores: the ~190 properties took ~80 of its ~440 s of CPU. No profile has a
deadline or the too-slow health check: they are timings, and on a machine
busy with other work, or with the suite spread over pytest-xdist workers,
they fail a property that holds (speed is measured in tests/bench). Every
other health check stays on.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: Examples per property without its own count, and the factor on a count given with `examples`.
PROFILES = {"ci": (20, 0.5), "full": (40, 1), "deep": (1000, 10)}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in PROFILES:
    raise SystemExit(f"HYPOTHESIS_PROFILE={PROFILE!r}: one of {', '.join(PROFILES)}")
DEFAULT_EXAMPLES, FACTOR = PROFILES[PROFILE]
#: A deep run: the tests that repeat a chance, not a property (tests/e2e/test_stop_under_load.py), repeat it fully.
DEEP = PROFILE == "deep"

for name, (count, _) in PROFILES.items():
    settings.register_profile(name, max_examples=count, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load() -> None:
    settings.load_profile(PROFILE)


def examples(count: int) -> int:
    """A property's own number of examples: `count` in the "full" profile, half of it in "ci", more in "deep"."""
    return max(1, round(count * FACTOR))
