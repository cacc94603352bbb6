"""Per-connector quotas: the sliding hour in memory, and the spells of refusals (docs/operations.md#quotas).

Pure rules, no I/O: ingest (service.py) seeds a `QuotaWindow` per connector
from the store (store/quotas.py), the truth that survives a restart, and asks
it before storing each message or push. An admitted item is reserved in the
window at once, so concurrent requests of one connector never overshoot
together; an item that stored nothing (a redelivery, a failed commit) is
given back.

The hour slides by minute buckets (`QUOTA_BUCKET_MS`): an item stored at
10:17:59 stops counting at 11:17:00.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Literal

import msgspec

from mcplhost.config import DEFAULT_MAX_BYTES_PER_HOUR, DEFAULT_MAX_ITEMS_PER_HOUR
from mcplhost.store.quotas import QUOTA_BUCKET_MS, QUOTA_WINDOW_MS, QuotaUsage, bucket_of, oldest_bucket

Quota = Literal["items", "bytes"]
#: Both quotas, in the order they are checked (and reported).
QUOTAS: tuple[Quota, ...] = ("items", "bytes")
#: A spell of refusals ends at the first admission at least this long after its last refusal.
QUOTA_SPELL_END_MS = QUOTA_BUCKET_MS


class QuotaLimits(msgspec.Struct, frozen=True):
    """A connector's `max_items_per_hour` and `max_bytes_per_hour` (mcplhost/config/schema.py)."""

    max_items: int = DEFAULT_MAX_ITEMS_PER_HOUR
    max_bytes: int = DEFAULT_MAX_BYTES_PER_HOUR


class QuotaRefusal(msgspec.Struct, frozen=True):
    """Why an item is refused: the quota it would pass, and when it would fit (None: never, it alone is too big)."""

    quota: Quota
    retry_after_ms: int | None


class QuotaWindow:
    """One connector's usage over the sliding hour: minute buckets, oldest first, and their totals."""

    def __init__(self, limits: QuotaLimits, usage: Iterable[QuotaUsage] = ()) -> None:
        self.limits = limits
        self._buckets: deque[list[int]] = deque()  # [bucket_start, items, bytes], ascending starts
        self.items = 0
        self.bytes = 0
        for bucket in usage:
            self._add(bucket.bucket_start, bucket.items, bucket.body_bytes)

    def reserve(self, now_ms: int, size: int) -> QuotaRefusal | None:
        """Count one item of `size` body bytes at `now_ms` if both quotas allow it; else why not (nothing counted)."""
        self._expire(now_ms)
        if self.items + 1 > self.limits.max_items:
            return QuotaRefusal("items", self._fits_after(now_ms, size))
        if self.bytes + size > self.limits.max_bytes:
            return QuotaRefusal("bytes", self._fits_after(now_ms, size))
        self._add(bucket_of(now_ms), 1, size)
        return None

    def fits(self, now_ms: int, items: int, size: int) -> bool:
        """Whether `items` more items of `size` body bytes in all would fit now (nothing counted)."""
        self._expire(now_ms)
        return self.items + items <= self.limits.max_items and self.bytes + size <= self.limits.max_bytes

    def reserve_all(self, now_ms: int, items: int, size: int) -> None:
        """Count `items` items of `size` body bytes in all at `now_ms`, which `fits` said fit."""
        self._add(bucket_of(now_ms), items, size)

    def release(self, at_ms: int, size: int) -> None:
        """Give back an item reserved at `at_ms` that stored nothing (its bucket may have left the hour since)."""
        start = bucket_of(at_ms)
        for bucket in reversed(self._buckets):  # almost always the newest
            if bucket[0] == start:
                bucket[1] -= 1
                bucket[2] -= size
                self.items -= 1
                self.bytes -= size
                return
            if bucket[0] < start:
                return

    def usage(self, now_ms: int) -> tuple[int, int]:
        """Items and body bytes counted in the hour ending at `now_ms`."""
        self._expire(now_ms)
        return self.items, self.bytes

    def _add(self, start: int, items: int, size: int) -> None:
        if self._buckets and self._buckets[-1][0] == start:
            self._buckets[-1][1] += items
            self._buckets[-1][2] += size
        elif not self._buckets or self._buckets[-1][0] < start:
            self._buckets.append([start, items, size])
        else:  # a clock that stepped back: count it in the newest bucket, never lose it
            self._buckets[-1][1] += items
            self._buckets[-1][2] += size
        self.items += items
        self.bytes += size

    def _expire(self, now_ms: int) -> None:
        oldest = oldest_bucket(now_ms)
        while self._buckets and self._buckets[0][0] < oldest:
            _, items, size = self._buckets.popleft()
            self.items -= items
            self.bytes -= size

    def _fits_after(self, now_ms: int, size: int) -> int | None:
        """Milliseconds until enough buckets leave the hour for one more item of `size` to fit."""
        if size > self.limits.max_bytes:
            return None
        items, total = self.items, self.bytes
        for start, bucket_items, bucket_bytes in self._buckets:
            items -= bucket_items
            total -= bucket_bytes
            if items + 1 <= self.limits.max_items and total + size <= self.limits.max_bytes:
                return start + QUOTA_WINDOW_MS - now_ms
        return None  # unreachable: an empty hour admits an item no larger than max_bytes


class QuotaSpell:
    """A connector's spell of quota refusals: when one starts (log a warning) and when it ends (log an info)."""

    def __init__(self) -> None:
        self.active = False
        self.last_refusal_at = 0
        #: Refusals in the current spell, by quota.
        self.refused: dict[Quota, int] = dict.fromkeys(QUOTAS, 0)

    def refusal(self, now_ms: int, quota: Quota) -> bool:
        """Count a refusal; True when it starts a spell."""
        started = not self.active
        if started:
            self.active = True
            self.refused = dict.fromkeys(QUOTAS, 0)
        self.refused[quota] += 1
        self.last_refusal_at = now_ms
        return started

    def admission(self, now_ms: int) -> bool:
        """An item was admitted; True when that ends the spell (no refusal for QUOTA_SPELL_END_MS)."""
        if self.active and now_ms - self.last_refusal_at >= QUOTA_SPELL_END_MS:
            self.active = False
            return True
        return False
