"""The peer throttles: row 3 of the guards (docs/peers.md#guards-and-throttles), a pure state machine.

No I/O, no clock of its own, no asyncio: every method takes `now_ms`, the
host's wall-clock time in epoch milliseconds, so the service decides when
"now" is and the tests drive time by hand. The service holds one `Throttles`
for the host, calls `check` under the target's lock, persists an admitted
send, then calls `record`; at start it `seed`s the sends the store still
holds within LONGEST_WINDOW_MS.

The rows, checked in this order, the first failure wins:

| row | bound | verdict |
|---|---|---|
| pair | PAIR_MAX admitted sender→target sends per PAIR_WINDOW_MS | `rate_limited`, `retry_after_ms` |
| target | TARGET_MAX admitted sends to a target, all senders, per TARGET_WINDOW_MS | `rate_limited`, `retry_after_ms` |
| duplicate | one admitted (sender, target, `text_key`) per DUPLICATE_WINDOW_MS | `refused`, `duplicate` |
| queue | `queued` ≥ QUEUE_MAX | `refused`, `queue_full` |
| wakes | `consecutive_wakes` ≥ CONSECUTIVE_WAKES_MAX | `refused`, `needs_attention` |

Only `record` adds to a window, so a refused or rate-limited send counts
toward none.

Windows slide: a send admitted at `t` counts while `now - t < window`, so at
`t + window - 1` it still counts and at `t + window` it is gone.
`retry_after_ms` is when the window that refused has room again, reckoned
on the caller's clock: the time of the entry whose expiry makes room (the
oldest counted one, unless a seed brought more than the limit) + window -
now_ms, at least 1. After a clock step back it includes the step.

Memory is bounded by what the windows count: every check (and record)
evicts, from the left of each window's time-ordered deque, the entries that
window no longer counts, so nothing older than LONGEST_WINDOW_MS survives,
and a key whose last entry goes is removed from its map. Each eviction is
one `popleft`, paid for by the `append` that made the entry: amortised
O(1). `entries()` is the number of (time, key) records the three windows
hold: right after any call it is, per window, the recorded sends that
window still counts, at most 3 × the sends recorded within
LONGEST_WINDOW_MS of the latest time seen.

The wall clock may step backwards. The throttles' own time never does: it
is the latest `now_ms` (of `check` or `record`) seen so far, and a smaller
`now_ms` evicts and counts as of that latest time, so nothing expires early
and nothing expired comes back; in effect their time stands still until the
clock catches up. A `record` earlier than the latest time is recorded at the
latest time, which keeps every deque in time order (the invariant eviction
relies on) and errs toward throttling.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Generic, Literal, TypeVar

import msgspec

from mcplhost.peers.limits import (
    CONSECUTIVE_WAKES_MAX,
    DUPLICATE_WINDOW_MS,
    PAIR_MAX,
    PAIR_WINDOW_MS,
    QUEUE_MAX,
    TARGET_MAX,
    TARGET_WINDOW_MS,
)


def text_key(text: str) -> str:
    """The duplicate window's key: SHA-256 (64 lowercase hex) of the text with outer whitespace trimmed.

    `surrogatepass`: a model's JSON may decode to lone surrogates, which must hash, not raise.
    """
    return hashlib.sha256(text.strip().encode("utf-8", "surrogatepass")).hexdigest()


class Verdict(msgspec.Struct, frozen=True):
    """What `check` decided for one send."""

    status: Literal["admit", "rate_limited", "refused"]
    #: For `refused`: "duplicate", "queue_full" or "needs_attention".
    reason: str | None = None
    #: For `rate_limited`: milliseconds until the window that refused has room again (>= 1).
    retry_after_ms: int | None = None


#: The one admit verdict.
ADMIT = Verdict("admit")
#: The refusals, one verdict each.
DUPLICATE = Verdict("refused", reason="duplicate")
QUEUE_FULL = Verdict("refused", reason="queue_full")
NEEDS_ATTENTION = Verdict("refused", reason="needs_attention")

K = TypeVar("K", bound=Hashable)


class _SlidingWindow(Generic[K]):
    """At most `limit` recorded sends per key within the last `window_ms`.

    `_timeline` holds every entry in time order, so eviction pops from its
    left. `_newest` keeps, per key, only its newest `limit` times: those alone
    decide whether the key is full and when it has room again, which bounds
    each list at `limit` however many sends a seed brings.
    """

    __slots__ = ("limit", "window_ms", "_timeline", "_newest")

    def __init__(self, limit: int, window_ms: int) -> None:
        self.limit = limit
        self.window_ms = window_ms
        self._timeline: deque[tuple[int, K]] = deque()
        self._newest: dict[K, list[int]] = {}

    def evict(self, horizon_ms: int) -> None:
        """Drop the entries that no longer count at `horizon_ms`, and the keys left with none."""
        timeline, newest, window_ms = self._timeline, self._newest, self.window_ms
        while timeline and horizon_ms - timeline[0][0] >= window_ms:
            at_ms, key = timeline.popleft()
            times = newest.get(key)
            # The entry may be one the key's list already let go of for a newer one (times[0] is later).
            if times is not None and times[0] <= at_ms:
                del times[0]
                if not times:
                    del newest[key]

    def room_at(self, key: K) -> int | None:
        """None when `key` has room; else the time at which it has (its `limit`-th newest entry expires)."""
        times = self._newest.get(key)
        if times is None or len(times) < self.limit:
            return None
        return times[-self.limit] + self.window_ms

    def add(self, key: K, at_ms: int) -> None:
        """Count one send at `at_ms`, which is never earlier than any entry held."""
        self._timeline.append((at_ms, key))
        times = self._newest.setdefault(key, [])
        times.append(at_ms)
        if len(times) > self.limit:
            del times[0]

    def __len__(self) -> int:
        return len(self._timeline)


class _RecentKeys(Generic[K]):
    """The keys recorded within the last `window_ms`: a sliding window of one per key.

    Kept apart from `_SlidingWindow` because these keys grow with the sends
    (every new text is a key) where pairs and targets grow only with the
    agents: each key holds one int, not a list of one.
    """

    __slots__ = ("window_ms", "_timeline", "_latest")

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._timeline: deque[tuple[int, K]] = deque()
        #: Each key's newest time: the one that decides, and the last of its entries to expire.
        self._latest: dict[K, int] = {}

    def evict(self, horizon_ms: int) -> None:
        """Drop the entries that no longer count at `horizon_ms`, and the keys left with none."""
        timeline, latest, window_ms = self._timeline, self._latest, self.window_ms
        while timeline and horizon_ms - timeline[0][0] >= window_ms:
            at_ms, key = timeline.popleft()
            # A key sent again stays until its newest entry (or an equal-time twin of it) expires.
            newest_ms = latest.get(key)
            if newest_ms is not None and newest_ms <= at_ms:
                del latest[key]

    def room_at(self, key: K) -> int | None:
        """None when `key` has not been recorded within the window; else the time at which it leaves."""
        at_ms = self._latest.get(key)
        return None if at_ms is None else at_ms + self.window_ms

    def add(self, key: K, at_ms: int) -> None:
        """Count one send at `at_ms`, which is never earlier than any entry held."""
        self._timeline.append((at_ms, key))
        self._latest[key] = at_ms

    def __len__(self) -> int:
        return len(self._timeline)


class Throttles:
    """The throttle rows for every sender and target of one host."""

    __slots__ = ("_latest_ms", "_pairs", "_targets", "_duplicates")

    def __init__(self) -> None:
        #: The latest now_ms seen: the throttles' own time, which never goes back.
        self._latest_ms: int | None = None
        self._pairs: _SlidingWindow[tuple[str, str]] = _SlidingWindow(PAIR_MAX, PAIR_WINDOW_MS)
        self._targets: _SlidingWindow[str] = _SlidingWindow(TARGET_MAX, TARGET_WINDOW_MS)
        self._duplicates: _RecentKeys[tuple[str, str, str]] = _RecentKeys(DUPLICATE_WINDOW_MS)

    def check(self, sender: str, target: str, key: str, now_ms: int, *, queued: int, consecutive_wakes: int) -> Verdict:
        """The first row this send fails, in the table's order, else ADMIT. Records nothing.

        `key` is `text_key(message)`; `queued` is the target's queued, undelivered peer
        messages; `consecutive_wakes` its turns started by agents since user or parent input.
        """
        self._advance(now_ms)
        for room_at in (self._pairs.room_at((sender, target)), self._targets.room_at(target)):
            if room_at is not None:
                # At least 1: an entry still held expires after the latest time, which is >= now_ms.
                return Verdict("rate_limited", retry_after_ms=room_at - now_ms)
        if self._duplicates.room_at((sender, target, key)) is not None:
            return DUPLICATE
        if queued >= QUEUE_MAX:
            return QUEUE_FULL
        if consecutive_wakes >= CONSECUTIVE_WAKES_MAX:
            return NEEDS_ATTENTION
        return ADMIT

    def record(self, sender: str, target: str, key: str, now_ms: int) -> None:
        """Count an admitted send, at `now_ms` or, if the clock went back, at the latest time seen."""
        at_ms = self._advance(now_ms)
        self._pairs.add((sender, target), at_ms)
        self._targets.add(target, at_ms)
        self._duplicates.add((sender, target, key), at_ms)

    def seed(self, sends: Iterable[tuple[str, str, str, int]]) -> None:
        """Count sends admitted before a restart, `(sender, target, key, at_ms)` in any order."""
        for sender, target, key, at_ms in sorted(sends, key=lambda send: send[3]):
            self.record(sender, target, key, at_ms)

    def entries(self) -> int:
        """The (time, key) records held now, over the three windows: what the memory bound is about."""
        return len(self._pairs) + len(self._targets) + len(self._duplicates)

    def _advance(self, now_ms: int) -> int:
        """Move the throttles' time to `now_ms` unless it is earlier, evict, and return that time."""
        latest_ms = now_ms if self._latest_ms is None else max(now_ms, self._latest_ms)
        self._latest_ms = latest_ms
        self._pairs.evict(latest_ms)
        self._targets.evict(latest_ms)
        self._duplicates.evict(latest_ms)
        return latest_ms
