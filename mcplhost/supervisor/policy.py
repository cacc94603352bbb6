"""Restart arithmetic, from timestamps alone (docs/operations.md#when-a-connector-misbehaves).

The supervisor reports each failure's time; `RestartPolicy.next_attempt`
answers how long to wait, or `GiveUp`. The supervisor only sleeps what it is
told, so every rule here is tested without processes or clocks.

- delay = backoff_initial_s × 2^(consecutive failures − 1), ±20% jitter, then
  capped at backoff_max_s (the cap applies after jitter, so it is a hard cap);
- `burst` failures inside `window_s` put the connector in the slow lane: one
  start every backoff_max_s (jitter only downwards), until it stays up;
- the failure count resets once a connector stayed up for `window_s` (the
  supervisor calls `reset`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..config import RestartConfig

#: Relative jitter on every delay, so restarted connectors do not move in lockstep.
JITTER = 0.2


@dataclass(frozen=True, slots=True)
class Restart:
    delay: float
    slow_lane: bool
    consecutive: int  # failures since the connector last stayed up


@dataclass(frozen=True, slots=True)
class GiveUp:
    reason: str


class RestartPolicy:
    def __init__(self, config: RestartConfig, uniform: Callable[[], float] = random.random) -> None:
        self.config = config
        self._uniform = uniform  # a number in [0, 1); injectable for tests
        self._failures: deque[float] = deque()
        self._consecutive = 0
        self._slow_lane = False  # once in, stays in until the connector stays up

    @property
    def slow_lane(self) -> bool:
        return self._slow_lane

    def reset(self) -> None:
        """The connector stayed up for window_s: forget its failures."""
        self._failures.clear()
        self._consecutive = 0
        self._slow_lane = False

    def failed(self, now: float) -> Restart | GiveUp:
        """Record a failure at `now` and decide what happens next."""
        cfg = self.config
        self._consecutive += 1
        self._failures.append(now)
        while self._failures and self._failures[0] < now - cfg.window_s:
            self._failures.popleft()
        if cfg.policy == "never":
            return GiveUp("restart policy is never")
        jitter = 1.0 + JITTER * (2.0 * self._uniform() - 1.0)
        if len(self._failures) >= cfg.burst:
            self._slow_lane = True
        if self._slow_lane:
            delay = cfg.backoff_max_s * min(jitter, 1.0)
            return Restart(delay, slow_lane=True, consecutive=self._consecutive)
        base = cfg.backoff_initial_s * 2.0 ** min(self._consecutive - 1, 64)
        return Restart(min(base * jitter, cfg.backoff_max_s), slow_lane=False, consecutive=self._consecutive)
