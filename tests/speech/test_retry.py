"""The outbox's retry and failure rules (docs/agents.md#outbox), pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.speech.retry import (
    BACKOFF_MAX_S,
    MAX_ATTEMPTS,
    RETRY_WINDOW_S,
    GiveUp,
    Retry,
    RetryRules,
    after_failed_try,
    backoff_s,
    code_failure,
    too_old,
)


def test_the_permanent_codes_fail_at_once_and_internal_error_retries():
    """-32017, -32023, -32602 and -32002 are permanent; -32603 is retried."""
    assert {code: code_failure(code) for code in (-32017, -32023, -32602, -32002, -32603)} == {
        -32017: "permanent", -32023: "permanent", -32602: "permanent", -32002: "permanent",
        -32603: "retryable"}


def test_the_backoff_doubles_from_one_second_to_sixty():
    """1, 2, 4, ... seconds, never more than 60."""
    assert [backoff_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


@given(st.integers(min_value=1, max_value=10_000))
def test_the_backoff_is_bounded_and_never_shrinks(attempts):
    """Whatever the count, the delay is within (0, 60] and at least the previous one."""
    assert 0 < backoff_s(attempts) <= BACKOFF_MAX_S
    assert attempts == 1 or backoff_s(attempts) >= backoff_s(attempts - 1)


def test_the_eighth_failed_try_gives_up():
    """Seven failed tries are retried; the eighth is the last."""
    assert isinstance(after_failed_try(MAX_ATTEMPTS - 1, 0, 1000, "timeout"), Retry)
    step = after_failed_try(MAX_ATTEMPTS, 0, 1000, "timeout")
    assert isinstance(step, GiveUp) and "timeout" in step.reason


def test_a_retry_past_fifteen_minutes_gives_up():
    """A retry that would start more than 15 minutes after the first try is not made."""
    now = int(RETRY_WINDOW_S * 1000) - 500
    assert isinstance(after_failed_try(3, 0, now, "timeout"), GiveUp)
    assert after_failed_try(1, 0, 10_000, "timeout") == Retry(11_000)


@given(st.integers(min_value=1, max_value=20), st.integers(min_value=0, max_value=10**9))
def test_a_retry_is_always_in_the_future_and_within_the_rules(attempts, elapsed):
    """Every Retry is later than now, within the window, and only below the try limit."""
    rules = RetryRules()
    step = after_failed_try(attempts, 0, elapsed, "x", rules)
    if isinstance(step, Retry):
        assert attempts < rules.max_attempts and elapsed < step.at <= rules.window_s * 1000


def test_publish_max_age_counts_from_queuing():
    """A row older than publish_max_age_s is too old; one just at it is not."""
    assert not too_old(0, 3_600_000, 3600) and too_old(0, 3_600_001, 3600)
