"""When a publish is tried again, and when it fails for good (docs/connectors.md §13): pure rules, no I/O.

- `-32017` (channel not permitted), `-32023`, `-32602` (invalid params) and
  `-32002` (capability not granted) end a publish as failed at once: asking
  again cannot change the answer.
- A timeout, a dead connection or `-32603` (internal error) is retried with
  backoff: 1 s doubling to 60 s, at most 8 tries or 15 minutes from the
  first try; then failed.
- Any other error code is treated as permanent too (a decision: the rule
  names what is worth retrying, and a row failed is never silent: its agent
  gets a `failed-reply` notice).
- A publish still pending `publish_max_age_s` after it was queued fails
  unsent, whatever its tries.
"""

from __future__ import annotations

from typing import Literal

import msgspec

#: Error codes that end a publish as failed at once.
PERMANENT_CODES = frozenset({-32017, -32023, -32602, -32002})
#: Error codes worth another try.
RETRYABLE_CODES = frozenset({-32603})
#: The first retry's delay, doubled for each later one.
BACKOFF_FIRST_S = 1.0
#: The longest delay between tries.
BACKOFF_MAX_S = 60.0
#: Tries at most, the first included.
MAX_ATTEMPTS = 8
#: How long after its first try a publish may still be retried.
RETRY_WINDOW_S = 15 * 60.0

Failure = Literal["permanent", "retryable"]


class RetryRules(msgspec.Struct, frozen=True, kw_only=True):
    """The bounds above; tests shrink them instead of waiting minutes."""

    first_s: float = BACKOFF_FIRST_S
    max_s: float = BACKOFF_MAX_S
    max_attempts: int = MAX_ATTEMPTS
    window_s: float = RETRY_WINDOW_S


class Retry(msgspec.Struct, frozen=True):
    """Try again at `at` (epoch ms)."""

    at: int


class GiveUp(msgspec.Struct, frozen=True):
    """Fail the publish, for `reason`."""

    reason: str


def code_failure(code: int) -> Failure:
    """Whether an error answer to channels/publish is worth another try."""
    return "retryable" if code in RETRYABLE_CODES else "permanent"


def backoff_s(attempts: int, rules: RetryRules = RetryRules()) -> float:
    """The delay after the `attempts`-th failed try (1-based): first_s doubling, capped at max_s."""
    if attempts < 1:
        raise ValueError(f"a backoff follows a try; attempts counts from 1, not {attempts}")
    doubling: int = 2 ** min(attempts - 1, 62)  # int ** int is typed Any: its sign decides int or float
    return min(rules.first_s * doubling, rules.max_s)


def after_failed_try(attempts: int, first_attempt_at: int, now: int, error: str,
                     rules: RetryRules = RetryRules()) -> Retry | GiveUp:
    """What follows the `attempts`-th retryable failure (1-based), the first try having been at `first_attempt_at`."""
    if attempts >= rules.max_attempts:
        return GiveUp(f"{error} (gave up after {attempts} tries)")
    at = now + round(backoff_s(attempts, rules) * 1000)
    if at - first_attempt_at > rules.window_s * 1000:
        return GiveUp(f"{error} (gave up after {attempts} tries in {(now - first_attempt_at) / 1000:g} s)")
    return Retry(at)


def too_old(created_at: int, now: int, max_age_s: float) -> bool:
    """Whether a publish queued at `created_at` has been pending longer than `max_age_s` (publish_max_age_s)."""
    return now - created_at > max_age_s * 1000
