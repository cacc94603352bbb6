"""The peer throttles (mcplhost/peers/admission.py) at each boundary, and against a naive model of the windows."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mcplhost.peers.admission import ADMIT, Throttles, Verdict, text_key
from mcplhost.peers.limits import (
    CONSECUTIVE_WAKES_MAX,
    DUPLICATE_WINDOW_MS,
    LONGEST_WINDOW_MS,
    PAIR_MAX,
    PAIR_WINDOW_MS,
    QUEUE_MAX,
    TARGET_MAX,
    TARGET_WINDOW_MS,
)

from ..properties import examples

#: An arbitrary epoch-milliseconds start, far from zero so no arithmetic leans on it.
T0 = 1_790_000_000_000
DUPLICATE = Verdict("refused", reason="duplicate")
QUEUE_FULL = Verdict("refused", reason="queue_full")
NEEDS_ATTENTION = Verdict("refused", reason="needs_attention")


def rate_limited(retry_after_ms: int) -> Verdict:
    return Verdict("rate_limited", retry_after_ms=retry_after_ms)


def check(throttles: Throttles, sender: str, target: str, text: str, now_ms: int,
          *, queued: int = 0, consecutive_wakes: int = 0) -> Verdict:
    return throttles.check(sender, target, text_key(text), now_ms, queued=queued, consecutive_wakes=consecutive_wakes)


def send(throttles: Throttles, sender: str, target: str, text: str, now_ms: int) -> Verdict:
    """What the service does: check, and record the send when admitted."""
    verdict = check(throttles, sender, target, text, now_ms)
    if verdict == ADMIT:
        throttles.record(sender, target, text_key(text), now_ms)
    return verdict


class TestTextKey:
    def test_is_sha256_hex_of_the_trimmed_text(self) -> None:
        """64 lowercase hex characters, the SHA-256 of the text without its outer whitespace."""
        key = text_key("  hello there \n")
        assert re.fullmatch(r"[0-9a-f]{64}", key)
        assert key == hashlib.sha256(b"hello there").hexdigest()

    def test_inner_whitespace_and_case_are_kept(self) -> None:
        """Only the outer whitespace is trimmed: inner spacing and case make a different message."""
        assert len({text_key("a b"), text_key("a  b"), text_key("A b")}) == 3

    def test_lone_surrogates_hash(self) -> None:
        """A model's JSON may decode to a lone surrogate: it hashes, distinct from its neighbours."""
        assert text_key("\ud800") != text_key("\ud801")

    @given(st.text(), st.text(alphabet=" \t\r\n\u00a0\u2003\u3000"), st.text(alphabet=" \t\r\n\u00a0\u2003"))
    def test_outer_whitespace_never_matters(self, text: str, before: str, after: str) -> None:
        assert text_key(before + text + after) == text_key(text)


class TestPairWindow:
    def test_fifth_send_admitted_sixth_rate_limited_until_the_oldest_expires(self) -> None:
        """PAIR_MAX sends admitted, the next one waits exactly until the oldest leaves the window."""
        throttles = Throttles()
        for n in range(PAIR_MAX):
            assert send(throttles, "a", "b", f"m{n}", T0 + n * 1000) == ADMIT
        sixth_at = T0 + PAIR_MAX * 1000
        assert send(throttles, "a", "b", "m-next", sixth_at) == rate_limited(T0 + PAIR_WINDOW_MS - sixth_at)

    def test_window_end_plus_minus_one_ms(self) -> None:
        """The oldest send counts at t + window - 1 (retry in 1 ms) and is gone at t + window."""
        throttles = Throttles()
        for n in range(PAIR_MAX):
            assert send(throttles, "a", "b", f"m{n}", T0 + n) == ADMIT
        assert check(throttles, "a", "b", "late", T0 + PAIR_WINDOW_MS - 1) == rate_limited(1)
        assert check(throttles, "a", "b", "late", T0 + PAIR_WINDOW_MS) == ADMIT

    def test_each_expiry_frees_one_place(self) -> None:
        """A burst at one instant frees its places together; sends spread out free theirs one by one."""
        throttles = Throttles()
        for n in range(PAIR_MAX):
            assert send(throttles, "a", "b", f"m{n}", T0 + n * 10_000) == ADMIT
        at = T0 + PAIR_WINDOW_MS
        assert send(throttles, "a", "b", "x1", at) == ADMIT
        assert check(throttles, "a", "b", "x2", at) == rate_limited(10_000)

    def test_pairs_are_directed(self) -> None:
        """b → a has its own window, independent of a → b."""
        throttles = Throttles()
        for n in range(PAIR_MAX):
            send(throttles, "a", "b", f"m{n}", T0)
        assert check(throttles, "a", "b", "x", T0) == rate_limited(PAIR_WINDOW_MS)
        assert check(throttles, "b", "a", "x", T0) == ADMIT
        assert check(throttles, "a", "c", "x", T0) == ADMIT


class TestTargetWindow:
    def test_target_limit_across_ten_senders(self) -> None:
        """TARGET_MAX sends from as many senders reach the target; the next sender, whoever, waits."""
        throttles = Throttles()
        for n in range(TARGET_MAX):
            assert send(throttles, f"s{n}", "t", "hello", T0 + n * 100) == ADMIT
        eleventh_at = T0 + TARGET_MAX * 100
        assert check(throttles, "s-new", "t", "hello", eleventh_at) == rate_limited(T0 + TARGET_WINDOW_MS - eleventh_at)
        assert check(throttles, "s0", "t", "other", eleventh_at) == rate_limited(T0 + TARGET_WINDOW_MS - eleventh_at)
        assert check(throttles, "s-new", "t", "hello", T0 + TARGET_WINDOW_MS - 1) == rate_limited(1)
        assert check(throttles, "s-new", "t", "hello", T0 + TARGET_WINDOW_MS) == ADMIT
        # Other targets are untouched.
        assert check(throttles, "s-new", "u", "hello", eleventh_at) == ADMIT


class TestDuplicateWindow:
    def test_refused_within_the_window_admitted_after(self) -> None:
        throttles = Throttles()
        assert send(throttles, "a", "b", "same", T0) == ADMIT
        assert check(throttles, "a", "b", "same", T0 + 1) == DUPLICATE
        assert check(throttles, "a", "b", "same", T0 + DUPLICATE_WINDOW_MS - 1) == DUPLICATE
        assert check(throttles, "a", "b", "same", T0 + DUPLICATE_WINDOW_MS) == ADMIT

    def test_trimmed_text_counts_as_the_same(self) -> None:
        throttles = Throttles()
        assert send(throttles, "a", "b", "same", T0) == ADMIT
        assert check(throttles, "a", "b", "  same\n\t", T0 + 1) == DUPLICATE

    def test_the_same_text_to_another_target_or_from_another_sender_is_no_duplicate(self) -> None:
        throttles = Throttles()
        assert send(throttles, "a", "b", "same", T0) == ADMIT
        assert check(throttles, "a", "c", "same", T0 + 1) == ADMIT
        assert check(throttles, "c", "b", "same", T0 + 1) == ADMIT


class TestQueueAndWakes:
    def test_queue_full_at_queue_max(self) -> None:
        throttles = Throttles()
        assert check(throttles, "a", "b", "m", T0, queued=QUEUE_MAX - 1) == ADMIT
        assert check(throttles, "a", "b", "m", T0, queued=QUEUE_MAX) == QUEUE_FULL

    def test_needs_attention_at_consecutive_wakes_max(self) -> None:
        throttles = Throttles()
        assert check(throttles, "a", "b", "m", T0, consecutive_wakes=CONSECUTIVE_WAKES_MAX - 1) == ADMIT
        assert check(throttles, "a", "b", "m", T0, consecutive_wakes=CONSECUTIVE_WAKES_MAX) == NEEDS_ATTENTION


class TestRowOrder:
    """A send failing several rows reports the first in the table's order."""

    @staticmethod
    def everything_full() -> Throttles:
        """Pair a→b full (oldest at T0), target b full (oldest at T0 - 1000 from other senders), 'dup' sent."""
        throttles = Throttles()
        for n in range(TARGET_MAX - PAIR_MAX):
            send(throttles, f"other{n}", "b", "x", T0 - 1000)
        for n in range(PAIR_MAX - 1):
            send(throttles, "a", "b", f"m{n}", T0)
        send(throttles, "a", "b", "dup", T0)
        return throttles

    def test_pair_before_target_duplicate_queue_and_wakes(self) -> None:
        verdict = check(self.everything_full(), "a", "b", "dup", T0 + 1,
                        queued=QUEUE_MAX, consecutive_wakes=CONSECUTIVE_WAKES_MAX)
        assert verdict == rate_limited(PAIR_WINDOW_MS - 1)

    def test_target_before_duplicate_queue_and_wakes(self) -> None:
        throttles = self.everything_full()
        throttles.record("c", "b", text_key("dup"), T0)  # so c → b is a duplicate too
        verdict = check(throttles, "c", "b", "dup", T0 + 1, queued=QUEUE_MAX, consecutive_wakes=CONSECUTIVE_WAKES_MAX)
        assert verdict == rate_limited(TARGET_WINDOW_MS - 1000 - 1)

    def test_duplicate_before_queue_and_wakes(self) -> None:
        throttles = Throttles()
        send(throttles, "a", "b", "dup", T0)
        verdict = check(throttles, "a", "b", "dup", T0 + 1, queued=QUEUE_MAX, consecutive_wakes=CONSECUTIVE_WAKES_MAX)
        assert verdict == DUPLICATE

    def test_queue_before_wakes(self) -> None:
        verdict = check(Throttles(), "a", "b", "m", T0, queued=QUEUE_MAX, consecutive_wakes=CONSECUTIVE_WAKES_MAX)
        assert verdict == QUEUE_FULL


class TestRefusalsCountNowhere:
    def test_refused_and_rate_limited_sends_fill_no_window(self) -> None:
        """Hundreds of refused and rate-limited checks leave the windows as the admitted sends made them."""
        throttles = Throttles()
        for n in range(PAIR_MAX):
            send(throttles, "a", "b", f"m{n}", T0)
        held = throttles.entries()
        for n in range(300):
            assert check(throttles, "a", "b", f"r{n}", T0 + n).status == "rate_limited"
            assert check(throttles, "c", "b", f"q{n}", T0 + n, queued=QUEUE_MAX) == QUEUE_FULL
            assert check(throttles, "c", "b", f"w{n}", T0 + n, consecutive_wakes=CONSECUTIVE_WAKES_MAX) == NEEDS_ATTENTION
        assert throttles.entries() == held
        # c → b was refused 600 times, yet the target holds only a's five: c gets the other five places.
        for n in range(TARGET_MAX - PAIR_MAX):
            assert send(throttles, "c", "b", f"c{n}", T0 + 400) == ADMIT
        assert check(throttles, "d", "b", "d", T0 + 400) == rate_limited(TARGET_WINDOW_MS - 400)


class TestClockSteps:
    def test_time_going_back_expires_nothing_early_and_revives_nothing(self) -> None:
        """After a step back the throttles keep their latest time: full stays full, expired stays expired."""
        throttles = Throttles()
        for n in range(PAIR_MAX):
            send(throttles, "a", "b", f"m{n}", T0)
        # The clock steps back 30 s: the pair is still full, and the wait is reckoned on the caller's clock.
        assert check(throttles, "a", "b", "x", T0 - 30_000) == rate_limited(PAIR_WINDOW_MS + 30_000)
        assert check(throttles, "a", "b", "x", T0 + PAIR_WINDOW_MS) == ADMIT
        # Back again, below the time the sends were made: they stay expired (only their duplicate keys remain).
        assert check(throttles, "a", "b", "x", T0 + 10) == ADMIT
        assert throttles.entries() == PAIR_MAX

    def test_a_record_in_the_past_is_recorded_at_the_latest_time(self) -> None:
        """A record earlier than the latest time counts from the latest time (never expires early)."""
        throttles = Throttles()
        assert check(throttles, "a", "b", "m", T0) == ADMIT
        throttles.record("a", "b", text_key("m"), T0 - 50_000)
        assert check(throttles, "a", "b", "m", T0 + DUPLICATE_WINDOW_MS - 1) == DUPLICATE
        assert check(throttles, "a", "b", "m", T0 + DUPLICATE_WINDOW_MS) == ADMIT

    def test_records_out_of_order_keep_eviction_exact(self) -> None:
        """Records stepping back and forth still leave every window in order: each expires on time."""
        throttles = Throttles()
        throttles.record("a", "b", "k1", T0 + 5_000)
        throttles.record("a", "b", "k2", T0)  # counted at T0 + 5000
        throttles.record("a", "b", "k3", T0 + 6_000)
        assert throttles.entries() == 9
        assert check(throttles, "a", "b", "k4", T0 + 5_000 + PAIR_WINDOW_MS) == ADMIT
        assert throttles.entries() == 3 + 1 + 1  # the three duplicate keys, k3's pair and target entries
        throttles.check("a", "b", "k4", T0 + 6_000 + DUPLICATE_WINDOW_MS, queued=0, consecutive_wakes=0)
        assert throttles.entries() == 0


class TestMemory:
    def test_maps_shrink_back_to_nothing(self) -> None:
        """A check after the longest window leaves no entry and no key behind, however many pairs there were."""
        throttles = Throttles()
        for n in range(500):
            send(throttles, f"s{n % 50}", f"t{n % 37}", f"m{n}", T0 + n)
        assert throttles.entries() > 0
        throttles.check("a", "b", text_key("m"), T0 + 500 + LONGEST_WINDOW_MS, queued=0, consecutive_wakes=0)
        assert throttles.entries() == 0
        # White box: the per-key maps are empty too.
        assert not throttles._pairs._newest and not throttles._targets._newest and not throttles._duplicates._latest

    def test_a_text_sent_twice_in_the_window_stays_a_duplicate_until_the_later_expires(self) -> None:
        """A seed may hold one text twice: the older one's expiry leaves the newer counting."""
        throttles = Throttles()
        throttles.seed([("a", "b", text_key("same"), T0 + 50_000), ("a", "b", text_key("same"), T0)])
        assert check(throttles, "a", "b", "same", T0 + DUPLICATE_WINDOW_MS) == DUPLICATE
        assert check(throttles, "a", "b", "same", T0 + 50_000 + DUPLICATE_WINDOW_MS - 1) == DUPLICATE
        assert check(throttles, "a", "b", "same", T0 + 50_000 + DUPLICATE_WINDOW_MS) == ADMIT

    def test_a_seed_beyond_the_limits_keeps_per_key_lists_at_the_limit(self) -> None:
        """A store holding more sends than the limits would admit still decides exactly, with capped lists."""
        throttles = Throttles()
        throttles.seed(("a", "b", f"k{n}", T0 + n) for n in range(1000))
        assert max(len(times) for times in throttles._pairs._newest.values()) == PAIR_MAX
        # Room again when the PAIR_MAX-th newest send (at T0 + 995) expires.
        assert throttles.check("a", "b", "new", T0 + 999, queued=0, consecutive_wakes=0) == rate_limited(
            T0 + 1000 - PAIR_MAX + PAIR_WINDOW_MS - (T0 + 999))
        # The oldest sends expiring (ones the capped list had let go of) leave the newest in place.
        later = T0 + PAIR_WINDOW_MS + 500
        assert throttles.check("a", "b", "new", later, queued=0, consecutive_wakes=0) == rate_limited(
            T0 + 1000 - PAIR_MAX + PAIR_WINDOW_MS - later)
        assert throttles.check("a", "b", "new", T0 + 1000 - PAIR_MAX + PAIR_WINDOW_MS,
                               queued=0, consecutive_wakes=0) == ADMIT


# --- the state machine against a naive model ---------------------------------------------------------------

SENDERS = ["a", "b", "c"]
TARGETS = ["a", "b"]
#: Enough distinct messages to fill a pair past the duplicate window, and trimmed variants of some.
TEXTS = [f"m{n}" for n in range(12)] + [" m0", "m1\n", "\tm2 "]
#: Time steps: mostly a little forward (so the windows fill), sometimes up to past a window, sometimes a step back.
_SMALL_STEPS = st.integers(0, 800)
STEPS = st.one_of(_SMALL_STEPS, _SMALL_STEPS, _SMALL_STEPS, _SMALL_STEPS, _SMALL_STEPS,
                  st.integers(0, 2 * LONGEST_WINDOW_MS), st.integers(-5_000, 0))
QUEUED = st.sampled_from([0] * 8 + [QUEUE_MAX - 1, QUEUE_MAX, QUEUE_MAX + 5])
WAKES = st.sampled_from([0] * 8 + [CONSECUTIVE_WAKES_MAX - 1, CONSECUTIVE_WAKES_MAX])
#: Where a record lands relative to its check: usually the same instant, sometimes before or a bit after.
RECORD_SKEWS = st.sampled_from([0, 0, 0, -2_000, 700])

WINDOWS = {"pair": (PAIR_MAX, PAIR_WINDOW_MS), "target": (TARGET_MAX, TARGET_WINDOW_MS),
           "duplicate": (1, DUPLICATE_WINDOW_MS)}


class NaiveThrottles:
    """Every admitted send in a list; each check filters it by window, with time that never goes back."""

    def __init__(self) -> None:
        self.sends: list[tuple[str, str, str, int]] = []
        self.latest: int | None = None

    def advance(self, now_ms: int) -> int:
        self.latest = now_ms if self.latest is None else max(self.latest, now_ms)
        return self.latest

    def room_at(self, times: list[int], window: str, at: int) -> int | None:
        """None when there is room; else the first instant at which fewer than the limit count."""
        limit, window_ms = WINDOWS[window]
        if sum(at - t < window_ms for t in times) < limit:
            return None
        return min(candidate for candidate in (t + window_ms for t in times) if candidate > at
                   if sum(candidate - t < window_ms for t in times) < limit)

    def check(self, sender: str, target: str, key: str, now_ms: int, queued: int, wakes: int) -> Verdict:
        at = self.advance(now_ms)
        pair_times = [t for s, g, _, t in self.sends if (s, g) == (sender, target)]
        target_times = [t for _, g, _, t in self.sends if g == target]
        for times, window in ((pair_times, "pair"), (target_times, "target")):
            room_at = self.room_at(times, window, at)
            if room_at is not None:
                return rate_limited(max(1, room_at - now_ms))
        duplicates = [t for s, g, k, t in self.sends if (s, g, k) == (sender, target, key)]
        if self.room_at(duplicates, "duplicate", at) is not None:
            return DUPLICATE
        if queued >= QUEUE_MAX:
            return QUEUE_FULL
        if wakes >= CONSECUTIVE_WAKES_MAX:
            return NEEDS_ATTENTION
        return ADMIT

    def record(self, sender: str, target: str, key: str, now_ms: int) -> None:
        self.sends.append((sender, target, key, self.advance(now_ms)))

    def held(self) -> int:
        """What the three windows still count at the latest time: one record per window per send."""
        if self.latest is None:
            return 0
        return sum(self.latest - t < window_ms for *_, t in self.sends for _, window_ms in WINDOWS.values())

    def admitted_within_longest(self) -> int:
        return 0 if self.latest is None else sum(self.latest - t < LONGEST_WINDOW_MS for *_, t in self.sends)


class ThrottlesMachine(RuleBasedStateMachine):
    """Random senders, targets, texts and clock steps: Throttles answers as the naive model does."""

    @initialize(start=st.integers(0, 2**41))
    def setup(self, start: int) -> None:
        self.throttles = Throttles()
        self.model = NaiveThrottles()
        self.now = start

    # `recipient`, not `target`: @rule reserves `target` for bundles.
    @rule(sender=st.sampled_from(SENDERS), recipient=st.sampled_from(TARGETS), text=st.sampled_from(TEXTS),
          step=STEPS, queued=QUEUED, wakes=WAKES, persisted=st.sampled_from([True] * 7 + [False]), skew=RECORD_SKEWS)
    def send(self, sender: str, recipient: str, text: str, step: int, queued: int, wakes: int,
             persisted: bool, skew: int) -> None:
        self.now += step
        key = text_key(text)
        verdict = self.throttles.check(sender, recipient, key, self.now, queued=queued, consecutive_wakes=wakes)
        assert verdict == self.model.check(sender, recipient, key, self.now, queued, wakes)
        if verdict.status == "rate_limited":
            assert verdict.retry_after_ms is not None and verdict.retry_after_ms >= 1
        # An admitted send the service failed to persist is never recorded.
        if verdict == ADMIT and persisted:
            self.throttles.record(sender, recipient, key, self.now + skew)
            self.model.record(sender, recipient, key, self.now + skew)

    @invariant()
    def entries_are_what_the_windows_count(self) -> None:
        """entries() == the records the windows count now ≤ 3 × the sends recorded within the longest window."""
        if hasattr(self, "throttles"):
            assert self.throttles.entries() == self.model.held()
            assert self.throttles.entries() <= 3 * self.model.admitted_within_longest()


TestThrottlesMachine = ThrottlesMachine.TestCase
TestThrottlesMachine.settings = settings(max_examples=examples(30), stateful_step_count=60)


# --- seed ----------------------------------------------------------------------------------------------------

seeded_sends = st.lists(st.tuples(st.sampled_from(SENDERS), st.sampled_from(TARGETS),
                                  st.sampled_from(TEXTS).map(text_key), st.integers(T0 - 3 * LONGEST_WINDOW_MS, T0)),
                        max_size=60)
probes = st.lists(st.tuples(st.sampled_from(SENDERS), st.sampled_from(TARGETS), st.sampled_from(TEXTS),
                            st.integers(0, LONGEST_WINDOW_MS + 1_000)), min_size=1, max_size=30)


@given(sends=seeded_sends, order=st.randoms(), checks=probes)
def test_seed_then_check_equals_recording_the_same_sends(sends: list[tuple[str, str, str, int]], order,
                                                         checks: list[tuple[str, str, str, int]]) -> None:
    """Seeded in any order, the throttles decide as if each send had been recorded when it was made."""
    shuffled = list(sends)
    order.shuffle(shuffled)
    seeded, recorded = Throttles(), Throttles()
    seeded.seed(shuffled)
    for sender, target, key, at_ms in sorted(sends, key=lambda send: send[3]):
        recorded.record(sender, target, key, at_ms)
    assert seeded.entries() == recorded.entries()
    for sender, target, text, offset in checks:
        key = text_key(text)
        assert (seeded.check(sender, target, key, T0 + offset, queued=0, consecutive_wakes=0)
                == recorded.check(sender, target, key, T0 + offset, queued=0, consecutive_wakes=0))
        assert seeded.entries() == recorded.entries()
