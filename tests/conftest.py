"""Settings for the whole suite: Hypothesis judges what a property holds, never how long an example took.

A per-example deadline (Hypothesis's default is 200 ms) and the too-slow health
check are timings: on a machine busy with other work, or with the suite
spread over pytest-xdist workers, they fail a property that holds. Speed is
measured in tests/bench instead. Every other health check stays on.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("mcplhost", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mcplhost")
