"""Property tests for mcplhost/ingest/quotas.py: the sliding hour against a naive model of every item admitted."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.ingest.quotas import QUOTA_SPELL_END_MS, QuotaLimits, QuotaSpell, QuotaWindow
from mcplhost.store.quotas import QUOTA_BUCKET_MS, QUOTA_WINDOW_MS, QuotaUsage, bucket_of, oldest_bucket

from .properties import examples

START = 1_790_000_000_000


class Naive:
    """Every item counted, with its time; usage is a scan over the ones whose minute is inside the hour."""

    def __init__(self, limits: QuotaLimits) -> None:
        self.limits = limits
        self.counted: list[tuple[int, int]] = []

    def usage(self, now: int) -> tuple[int, int]:
        inside = [size for at, size in self.counted if bucket_of(at) >= oldest_bucket(now)]
        return len(inside), sum(inside)

    def admits(self, now: int, size: int) -> bool:
        items, total = self.usage(now)
        return items + 1 <= self.limits.max_items and total + size <= self.limits.max_bytes


steps = st.lists(st.tuples(st.integers(0, 3 * QUOTA_BUCKET_MS), st.integers(0, 300), st.booleans()),
                 min_size=1, max_size=60)


@settings(max_examples=examples(60), deadline=None)
@given(max_items=st.integers(1, 8), max_bytes=st.integers(1, 1000), steps=steps,
       jump=st.sampled_from([0, QUOTA_WINDOW_MS - QUOTA_BUCKET_MS, QUOTA_WINDOW_MS]))
def test_the_window_decides_as_the_naive_model(max_items: int, max_bytes: int,
                                               steps: list[tuple[int, int, bool]], jump: int) -> None:
    """Same verdicts and usage; a refusal's retryAfterMs is the first moment the model admits the item again."""
    limits = QuotaLimits(max_items, max_bytes)
    window, naive, now = QuotaWindow(limits), Naive(limits), START
    for index, (advance, size, redelivered) in enumerate(steps):
        now += advance + (jump if index == len(steps) // 2 else 0)
        refusal = window.reserve(now, size)
        assert (refusal is None) == naive.admits(now, size)
        if refusal is None:
            if redelivered:  # stored nothing: given back
                window.release(now, size)
            else:
                naive.counted.append((now, size))
        elif refusal.retry_after_ms is None:
            assert size > max_bytes
        else:
            assert refusal.retry_after_ms > 0
            assert naive.admits(now + refusal.retry_after_ms, size)
            assert not naive.admits(now + refusal.retry_after_ms - 1, size)
        assert window.usage(now) == naive.usage(now)


@settings(max_examples=examples(30), deadline=None)
@given(buckets=st.lists(st.tuples(st.integers(0, 120), st.integers(0, 5), st.integers(0, 500)), max_size=20))
def test_a_window_seeded_from_stored_buckets_counts_only_the_hour(buckets: list[tuple[int, int, int]]) -> None:
    """Seeded with stored minutes (as after a restart), usage is the sum of those still inside the hour."""
    now = START + 120 * QUOTA_BUCKET_MS
    starts = sorted({minute for minute, _, _ in buckets})
    usage = []
    for minute in starts:
        items = sum(i for m, i, _ in buckets if m == minute)
        size = sum(s for m, _, s in buckets if m == minute)
        usage.append(QuotaUsage(bucket_of(START) + minute * QUOTA_BUCKET_MS, items, size))
    window = QuotaWindow(QuotaLimits(), usage)
    inside = [u for u in usage if u.bucket_start >= oldest_bucket(now)]
    assert window.usage(now) == (sum(u.items for u in inside), sum(u.body_bytes for u in inside))


def test_an_item_stops_counting_when_its_minute_leaves_the_hour() -> None:
    """Stored at 10:17:59, it counts until 11:16:59.999 and no longer at 11:17:00."""
    window = QuotaWindow(QuotaLimits(max_items=1))
    at = bucket_of(START) + QUOTA_BUCKET_MS - 1
    assert window.reserve(at, 10) is None
    refusal = window.reserve(at + 1, 10)
    assert refusal is not None and refusal.quota == "items"
    assert refusal.retry_after_ms == QUOTA_WINDOW_MS - QUOTA_BUCKET_MS
    free_at = bucket_of(at) + QUOTA_WINDOW_MS
    assert window.reserve(free_at - 1, 10) is not None
    assert window.reserve(free_at, 10) is None


def test_an_item_larger_than_the_bytes_quota_never_fits() -> None:
    window = QuotaWindow(QuotaLimits(max_bytes=100))
    refusal = window.reserve(START, 101)
    assert refusal is not None and (refusal.quota, refusal.retry_after_ms) == ("bytes", None)
    assert window.usage(START) == (0, 0)


def test_a_spell_ends_at_the_first_admission_a_minute_after_its_last_refusal() -> None:
    spell = QuotaSpell()
    assert spell.refusal(START, "items") is True
    assert spell.refusal(START + 10, "bytes") is False  # the same spell, whichever quota
    assert spell.admission(START + 10 + QUOTA_SPELL_END_MS - 1) is False
    assert spell.active and spell.refused == {"items": 1, "bytes": 1}
    assert spell.admission(START + 10 + QUOTA_SPELL_END_MS) is True
    assert not spell.active
    assert spell.admission(START + 10 * QUOTA_SPELL_END_MS) is False
    assert spell.refusal(START + 20 * QUOTA_SPELL_END_MS, "items") is True
    assert spell.refused == {"items": 1, "bytes": 0}
