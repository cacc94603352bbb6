"""RestartPolicy against README.md#configuration-reference's restart arithmetic, by properties over failure times."""

from __future__ import annotations

import math

import msgspec
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from mcplhost.config import RestartConfig
from mcplhost.supervisor.policy import JITTER, GiveUp, Restart, RestartPolicy

#: Float products may land one rounding step outside the exact ±20% band.
ROUNDING = 1e-9

positive = st.floats(min_value=0, exclude_min=True, allow_nan=False, allow_infinity=False)
uniforms = st.floats(min_value=0, max_value=1, exclude_max=True)
gaps = st.floats(min_value=0, max_value=1e6, allow_nan=False)
#: Far beyond any monotonic clock reading, far below where float arithmetic overflows.
CLOCK_MAX_S = 1e15


@st.composite
def configs(draw: st.DrawFn,
            policy: st.SearchStrategy[str] = st.sampled_from(["always", "on-failure"])) -> RestartConfig:
    return RestartConfig(policy=draw(policy), backoff_initial_s=draw(positive), backoff_max_s=draw(positive),
                         burst=draw(st.integers(min_value=1, max_value=50)), window_s=draw(positive))


def failure_times(start: float, deltas: list[float]) -> list[float]:
    times, now = [], start
    for delta in deltas:
        now += delta
        times.append(now)
    return times


def in_window(times: list[float], now: float, window: float) -> int:
    """How many failures lie within `window` before `now` (the boundary counts as inside)."""
    return sum(1 for t in times if not t < now - window)


class TestRestartPolicy:
    @given(configs(), st.lists(gaps, min_size=1, max_size=60), st.data())
    def test_the_delay_never_exceeds_backoff_max(
        self, config: RestartConfig, deltas: list[float], data: st.DataObject
    ) -> None:
        """Whatever the failure times and the jitter, no delay is longer than backoff_max_s."""
        policy = RestartPolicy(config, uniform=lambda: data.draw(uniforms))
        for now in failure_times(0.0, deltas):
            decision = policy.failed(now)
            assert isinstance(decision, Restart)
            assert 0 < decision.delay <= config.backoff_max_s

    @given(configs(), st.integers(min_value=1, max_value=80), st.data())
    def test_delays_grow_as_initial_times_two_to_the_failures_within_jitter(
        self, config: RestartConfig, count: int, data: st.DataObject
    ) -> None:
        """Before the slow lane, failure n waits initial×2^(n−1) ±20%, capped at backoff_max_s."""
        policy = RestartPolicy(config, uniform=lambda: data.draw(uniforms))
        for n in range(1, count + 1):
            decision = policy.failed(0.0)  # all at once: inside any window
            assert isinstance(decision, Restart)
            assert decision.consecutive == n
            if n >= config.burst:
                assert decision.slow_lane
                break
            base = config.backoff_initial_s * 2.0 ** (n - 1)
            low = min(base * (1 - JITTER), config.backoff_max_s)
            high = min(base * (1 + JITTER), config.backoff_max_s)
            assert low * (1 - ROUNDING) <= decision.delay <= high * (1 + ROUNDING), (n, decision)

    @given(configs(), st.integers(min_value=1, max_value=30))
    def test_without_jitter_the_delay_is_exactly_the_doubling(self, config: RestartConfig, count: int) -> None:
        """A jitter draw of 0.5 means a factor of exactly 1: the delay is min(initial×2^(n−1), max)."""
        policy = RestartPolicy(config, uniform=lambda: 0.5)
        for n in range(1, min(count, config.burst - 1) + 1):
            decision = policy.failed(0.0)
            assert isinstance(decision, Restart) and not decision.slow_lane
            assert decision.delay == min(config.backoff_initial_s * 2.0 ** (n - 1), config.backoff_max_s)

    @given(configs(st.just("never")), st.lists(gaps, min_size=1, max_size=10))
    def test_policy_never_gives_up_at_every_failure(self, config: RestartConfig, deltas: list[float]) -> None:
        """Under policy "never" the first failure (and any later one) is a GiveUp."""
        policy = RestartPolicy(config)
        for now in failure_times(0.0, deltas):
            assert isinstance(policy.failed(now), GiveUp)

    @given(configs(), st.lists(gaps, min_size=1, max_size=60))
    def test_other_policies_never_give_up(self, config: RestartConfig, deltas: list[float]) -> None:
        """"always" and "on-failure" restart forever; only the pace changes."""
        policy = RestartPolicy(config)
        for now in failure_times(0.0, deltas):
            assert isinstance(policy.failed(now), Restart)

    @given(configs(), st.data())
    def test_the_slow_lane_starts_exactly_at_burst_failures_in_the_window(
        self, config: RestartConfig, data: st.DataObject
    ) -> None:
        """Failures spaced within the window: failure burst−1 is still fast, failure burst is slow."""
        # Failure times are clock readings: keep burst × spacing finite (a huge window would overflow to inf).
        spacing = data.draw(st.floats(min_value=0, max_value=min(config.window_s, CLOCK_MAX_S) / max(config.burst, 1)))
        policy = RestartPolicy(config)
        for n in range(1, config.burst + 1):
            decision = policy.failed(n * spacing)
            assert isinstance(decision, Restart)
            assert decision.slow_lane is (n == config.burst), (n, decision)
            assert policy.slow_lane is (n == config.burst)

    @given(configs(), st.floats(min_value=0, max_value=1e9, exclude_min=True), st.integers(min_value=2, max_value=40))
    def test_failures_further_apart_than_the_window_never_reach_the_slow_lane(
        self, config: RestartConfig, window: float, count: int
    ) -> None:
        """With burst > 1, failures each more than window_s apart stay in the fast lane."""
        config = msgspec.structs.replace(config, burst=max(config.burst, 2), window_s=window)
        policy = RestartPolicy(config)
        for n in range(count):
            decision = policy.failed(n * (window * 1.5 + 1.0))
            assert isinstance(decision, Restart) and not decision.slow_lane

    def test_a_slow_lane_delay_is_backoff_max_with_jitter_only_downwards(self) -> None:
        """In the slow lane the delay lies in [0.8, 1] × backoff_max_s."""
        config = RestartConfig(backoff_initial_s=0.05, backoff_max_s=0.4, burst=1, window_s=5)
        low = RestartPolicy(config, uniform=lambda: 0.0).failed(0.0)
        high = RestartPolicy(config, uniform=lambda: 0.999).failed(0.0)
        assert isinstance(low, Restart) and isinstance(high, Restart)
        assert math.isclose(low.delay, 0.32) and high.delay == 0.4


class RestartMachine(RuleBasedStateMachine):
    """Failures and resets in any order; the model is the list of failure times since the last reset."""

    @initialize(config=configs(), start=st.floats(min_value=0, max_value=1e9))
    def setup(self, config: RestartConfig, start: float) -> None:
        self.config = config
        self.policy = RestartPolicy(config, uniform=lambda: 0.5)
        self.now = start
        self.times: list[float] = []
        self.was_slow = False
        self.last: Restart | None = None

    @rule(gap=gaps)
    def fail(self, gap: float) -> None:
        self.now += gap
        self.times.append(self.now)
        decision = self.policy.failed(self.now)
        assert isinstance(decision, Restart)
        reached = in_window(self.times, self.now, self.config.window_s) >= self.config.burst
        # The slow lane starts when burst failures lie within one window, and stays until reset.
        assert decision.slow_lane is (self.was_slow or reached)
        self.was_slow = decision.slow_lane
        assert decision.consecutive == len(self.times)
        self.last = decision

    @precondition(lambda self: self.times)
    @rule()
    def stay_up(self) -> None:
        self.policy.reset()
        self.times, self.was_slow = [], False

    @invariant()
    def slow_lane_is_reported(self) -> None:
        if hasattr(self, "policy"):
            assert self.policy.slow_lane is self.was_slow

    @invariant()
    def delay_is_bounded(self) -> None:
        if getattr(self, "last", None) is not None:
            assert self.last is not None and self.last.delay <= self.config.backoff_max_s


TestRestartMachine = RestartMachine.TestCase
