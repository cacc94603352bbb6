"""The histograms: observation points the components call, and the loop-lag sampler.

The components never import prometheus_client: the agents call a
`TurnTimings` (mcplhost/agents/turns/turn_services.py), the group writer an
`on_commit(seconds)`; `Timings` implements both over its own registry.
"""

from __future__ import annotations

import anyio
from prometheus_client import CollectorRegistry, Histogram

#: Turns take seconds to minutes (a model call, tools).
TURN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
#: From an item's acceptance to its turn's start: the debounce (300 ms by default) and up to max_wait_ms.
WAKE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, float("inf"))
#: A group commit takes about a millisecond on a local disk.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, float("inf"))
#: How late the loop ran a timer: near zero when it is free.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, float("inf"))
#: How often the loop-lag sampler asks the loop for a timer.
LAG_INTERVAL_S = 0.5


class Timings:
    """The host's histograms, in a registry of the host's own (`registry`, which the collector joins)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.wake_latency = Histogram("mcplhost_wake_latency_seconds",
                                      "From the acceptance of a wake's oldest item to its turn's start.",
                                      buckets=WAKE_BUCKETS, registry=registry)
        self.turn = Histogram("mcplhost_turn_seconds", "How long agent turns took, by agent and outcome.",
                              ["agent", "outcome"], buckets=TURN_BUCKETS, registry=registry)
        self.commit = Histogram("mcplhost_store_commit_seconds", "How long the group writer's transactions took.",
                                buckets=COMMIT_BUCKETS, registry=registry)
        self.loop_lag = Histogram("mcplhost_loop_lag_seconds",
                                  f"How late the event loop ran a {LAG_INTERVAL_S:g} s timer.",
                                  buckets=LAG_BUCKETS, registry=registry)

    def wake_started(self, waited_s: float) -> None:
        self.wake_latency.observe(waited_s)

    def turn_ended(self, agent: str, outcome: str, seconds: float) -> None:
        self.turn.labels(agent=agent, outcome=outcome).observe(seconds)

    def committed(self, seconds: float) -> None:
        self.commit.observe(seconds)

    async def sample_loop_lag(self) -> None:
        """Every LAG_INTERVAL_S, observe how much later than asked the loop woke this task; until cancelled."""
        while True:
            asked = anyio.current_time() + LAG_INTERVAL_S
            await anyio.sleep(LAG_INTERVAL_S)
            self.loop_lag.observe(max(0.0, anyio.current_time() - asked))
