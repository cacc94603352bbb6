"""mcplhost/agents/wakes/scheduler.py: debounce, max wait, single flight, the cap and the guards, on a controlled clock."""

from __future__ import annotations

import functools
import math
from typing import Any

import msgspec
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from structlog.testing import capture_logs

from mcplhost.agents.wakes.rules import Wake, view_of, wake_matches
from mcplhost.agents.wakes.scheduler import HOUR_S, MAX_PENDING_IDS, AgentScheduler, SchedulerStats
from mcplhost.config import AgentConfig
from mcplhost.ingest import Stored
from mcplhost.store import NewItem

from ..properties import examples
from .wakes import event

ADDRESSED = ["chat:addressed"]


def scheduler(**fields: Any) -> AgentScheduler:
    """A scout waking on addressed items, debounce 300 ms and max wait 3 s unless told."""
    fields.setdefault("wake_on", ["addressed"])
    return AgentScheduler(AgentConfig(name="scout", **fields))


def addressed(item_id: int, **fields: Any) -> Stored:
    fields.setdefault("tags", ADDRESSED)
    return event(item_id, **fields)


class TestDebounce:
    def test_a_turn_starts_debounce_ms_after_the_latest_item(self) -> None:
        """Each waking item moves the start to debounce_ms after it; not a moment before."""
        s = scheduler()
        assert s.on_item(addressed(1), 10.0) and s.next_deadline() == 10.3
        assert s.due(10.299) is None
        assert s.on_item(addressed(2), 10.2) and s.next_deadline() == 10.5
        assert s.due(10.4) is None
        wake = s.due(10.5)
        assert wake == Wake(item_ids=(1, 2), overflow=0, conversations=(addressed(1).item.conversation_id,),
                            several_conversations=False, first_at=10.0)

    def test_a_steady_stream_cannot_postpone_past_max_wait(self) -> None:
        """Items every 200 ms keep debouncing, but the turn starts max_wait_ms after the first."""
        s = scheduler(debounce_ms=300, max_wait_ms=1000)
        started = []
        for i in range(10):
            now = 5.0 + i / 5
            s.on_item(addressed(i + 1), now)
            assert s.next_deadline() <= 6.0
            wake = s.due(now)
            if wake is not None:
                started.append((now, wake.item_ids))
                break
        assert started == [(6.0, (1, 2, 3, 4, 5, 6))]

    def test_the_default_max_wait_is_the_larger_of_3s_and_four_debounces(self) -> None:
        """With debounce 1 s and no max_wait_ms, a stream is cut at 4 s."""
        s = scheduler(debounce_ms=1000)
        for i in range(10):
            s.on_item(addressed(i + 1), 0.5 * i)
        assert s.next_deadline() == 4.0

    def test_items_that_do_not_wake_leave_no_trace(self) -> None:
        """An ambient item is heard, not a wake: nothing pends, nothing is due."""
        s = scheduler()
        assert not s.on_item(event(1), 0.0)
        assert s.next_deadline() is None and s.due(100.0) is None
        assert s.statistics() == SchedulerStats(state="idle", pending_wakes=0, held=False, turns_last_hour=0)

    def test_an_item_offered_twice_wakes_once(self) -> None:
        """The same id again (an event and a catch-up read of it) is not a second waking item."""
        s = scheduler(debounce_ms=0)
        assert s.on_item(addressed(1), 0.0) and not s.on_item(addressed(1), 0.0)
        wake = s.due(0.0)
        assert wake is not None and wake.item_ids == (1,)
        s.turn_ended(1.0)
        assert not s.on_item(addressed(1), 1.0) and s.next_deadline() is None


class TestSingleFlight:
    def test_items_during_a_turn_make_one_follow_up(self) -> None:
        """No second turn while one runs; what arrived meanwhile collapses into one follow-up turn."""
        s = scheduler(debounce_ms=300, max_wait_ms=1000)
        s.on_item(addressed(1), 0.0)
        assert s.due(0.3) is not None
        for i, t in enumerate((0.5, 0.6, 0.7)):
            assert s.on_item(addressed(10 + i), t)
        assert s.due(5.0) is None and s.next_deadline() is None
        assert s.statistics().state == "in_turn" and s.statistics().pending_wakes == 3
        s.turn_ended(5.0)
        assert s.next_deadline() == 1.0  # max wait from 0.5 has passed: due at once
        follow_up = s.due(5.0)
        assert follow_up is not None and follow_up.item_ids == (10, 11, 12) and follow_up.first_at == 0.5
        s.turn_ended(6.0)
        assert s.due(100.0) is None

    def test_the_follow_up_debounces_from_the_items_arrival(self) -> None:
        """A turn ending right after an item arrived still waits out that item's debounce."""
        s = scheduler(debounce_ms=300)
        s.on_item(addressed(1), 0.0)
        s.due(0.3)
        s.on_item(addressed(2), 0.9)
        s.turn_ended(1.0)
        assert s.due(1.1) is None and s.next_deadline() == 1.2
        assert s.due(1.2) is not None


class TestBounds:
    def test_past_100_ids_only_a_count_is_kept(self) -> None:
        """150 waking items: 100 ids, and 50 counted as overflow; none lost."""
        s = scheduler(debounce_ms=0)
        for i in range(150):
            assert s.on_item(addressed(i + 1, author_id=f"u{i}"), 0.0)
        assert s.statistics().pending_wakes == 150
        wake = s.due(0.0)
        assert wake is not None and wake.item_ids == tuple(range(1, MAX_PENDING_IDS + 1)) and wake.overflow == 50
        assert not wake.several_conversations

    def test_an_overflowed_item_from_another_conversation_still_counts(self) -> None:
        """Past the cap, an item of a second conversation makes the wake span several, unnamed."""
        s = scheduler(debounce_ms=0)
        for i in range(MAX_PENDING_IDS):
            assert s.on_item(addressed(i + 1, author_id=f"u{i}"), 0.0)
        s.on_item(addressed(500, channel="disc:g1:other"), 0.0)
        wake = s.due(0.0)
        assert wake is not None and wake.overflow == 1 and wake.several_conversations
        assert wake.conversations == (addressed(1).item.conversation_id,)

    def test_several_conversations_are_named_sorted(self) -> None:
        """Items of two channels (or two threads) give both conversation ids, sorted, and the flag."""
        s = scheduler(debounce_ms=0)
        items = [addressed(1), addressed(2, thread="t1"), addressed(3, channel="disc:g1:other"), addressed(4)]
        for stored in items:
            s.on_item(stored, 0.0)
        wake = s.due(0.0)
        assert wake is not None and wake.several_conversations
        assert wake.conversations == tuple(sorted({i.item.conversation_id for i in items}))

    def test_an_unscoped_push_names_no_conversation(self) -> None:
        """A push that names no channel belongs to no conversation (routing treats it as undecided)."""
        s = scheduler(debounce_ms=0, wake_on=["push"])
        s.on_item(event(1, lane="push/event", channel=None), 0.0)
        wake = s.due(0.0)
        assert wake is not None and wake.conversations == () and not wake.several_conversations

    def test_an_unscoped_push_beside_a_channel_s_item_is_several_places(self) -> None:
        """A wake of a channel message and an unscoped push has no one conversation to answer in."""
        s = scheduler(debounce_ms=0, wake_on=["push", "addressed"])
        s.on_item(addressed(1), 0.0)
        s.on_item(event(2, lane="push/event", channel=None), 0.0)
        wake = s.due(0.0)
        assert wake is not None and wake.conversations == (addressed(1).item.conversation_id,)
        assert wake.several_conversations


class TestGuards:
    def test_past_max_turns_per_hour_wakes_are_held_with_one_warning(self) -> None:
        """The third turn in an hour waits for the first to leave the window; one warning, status says held."""
        s = scheduler(debounce_ms=0, max_turns_per_hour=2)
        with capture_logs() as logs:
            for i, t in enumerate((0.0, 10.0)):
                s.on_item(addressed(i + 1), t)
                assert s.due(t) is not None
                s.turn_ended(t + 1)
            s.on_item(addressed(3), 20.0)
            s.on_item(addressed(4), 30.0)
            assert s.due(20.0) is None and s.due(30.0) is None and s.due(HOUR_S - 1) is None
        held = [e for e in logs if e["event"] == "agent.wakes_held"]
        assert len(held) == 1 and held[0]["log_level"] == "warning" and held[0]["agent"] == "scout"
        assert s.statistics() == SchedulerStats(state="debouncing", pending_wakes=2, held=True, turns_last_hour=2)
        assert s.next_deadline() == HOUR_S
        wake = s.due(HOUR_S)
        assert wake is not None and wake.item_ids == (3, 4)
        assert not s.statistics().held

    def test_seeded_turns_hold_the_agent_until_they_age_out(self) -> None:
        """Two turns a restart read from the ledger fill a cap of 2; the next wake waits for the older to leave."""
        s = scheduler(debounce_ms=0, max_turns_per_hour=2)
        now = 10_000.0
        s.seed_turns([now - 1_800, now - 600, now - HOUR_S], now)  # the last one has just left the window
        assert s.statistics().turns_last_hour == 2
        assert s.on_item(addressed(1), now)
        assert s.due(now) is None and s.statistics().held
        assert s.next_deadline() == now - 1_800 + HOUR_S
        assert s.due(now - 1_800 + HOUR_S - 0.001) is None
        wake = s.due(now - 1_800 + HOUR_S)
        assert wake is not None and wake.item_ids == (1,)
        s.turn_ended(now - 1_800 + HOUR_S + 1)
        assert s.on_item(addressed(2), now - 1_800 + HOUR_S + 2)
        assert s.next_deadline() == now - 600 + HOUR_S  # the second seeded turn, then the one just run

    def test_seeding_keeps_only_the_newest_cap_and_clamps_future_times(self) -> None:
        """More seeded turns than the cap keep the newest; a start after now (the wall clock went back) is now."""
        s = scheduler(debounce_ms=0, max_turns_per_hour=2)
        s.seed_turns([100.0, 200.0, 300.0, 5_000.0], 1_000.0)
        assert s.statistics().turns_last_hour == 2
        s.on_item(addressed(1), 1_000.0)
        assert s.next_deadline() == 300.0 + HOUR_S

    def test_seeding_nothing_changes_nothing(self) -> None:
        """An empty ledger hour leaves the scheduler as new: the first wake is due at once."""
        s = scheduler(debounce_ms=0, max_turns_per_hour=1)
        s.seed_turns([], 50.0)
        s.on_item(addressed(1), 50.0)
        assert s.due(50.0) is not None

    def test_past_the_per_sender_cap_a_sender_is_heard_not_woken(self) -> None:
        """The fourth wake from one author within an hour does not wake; others still do; logged once an hour."""
        s = scheduler(max_wakes_per_sender_per_hour=3)
        with capture_logs() as logs:
            assert all(s.on_item(addressed(i, author_id="u1"), float(i)) for i in range(1, 4))
            assert not s.on_item(addressed(4, author_id="u1"), 4.0)
            assert not s.on_item(addressed(5, author_id="u1"), 5.0)
            assert s.on_item(addressed(6, author_id="u2"), 6.0)
            assert s.on_item(addressed(7, author_id="u1"), 1.0 + HOUR_S)  # the first left the window
            assert not s.on_item(addressed(8, author_id="u1"), 1.5 + HOUR_S)
        capped = [e for e in logs if e["event"] == "agent.sender_capped"]
        assert [e["sender"] for e in capped] == ["disc/id:u1"]  # once within the hour of its first line

    def test_the_cap_is_logged_again_in_a_later_hour(self) -> None:
        """One log line per sender and hour, not one per item and not one ever."""
        s = scheduler(max_wakes_per_sender_per_hour=1)
        with capture_logs() as logs:
            s.on_item(addressed(1, author_id="u1"), 0.0)
            s.on_item(addressed(2, author_id="u1"), 1.0)
            s.on_item(addressed(3, author_id="u1"), 0.5 + HOUR_S)
            s.on_item(addressed(4, author_id="u1"), 2.0 + HOUR_S)
        assert len([e for e in logs if e["event"] == "agent.sender_capped"]) == 2


class TestCatchUp:
    def test_catch_up_is_one_wake_at_once(self) -> None:
        """Matching items after the cursor wake the agent once, without waiting for the debounce."""
        s = scheduler(debounce_ms=5000)
        s.catch_up([addressed(1), event(2), addressed(3, channel="disc:g1:other")], 100.0)
        assert s.next_deadline() == 100.0
        wake = s.due(100.0)
        assert wake is not None and wake.item_ids == (1, 3) and wake.several_conversations
        s.turn_ended(101.0)
        assert s.due(1000.0) is None

    def test_catch_up_ignores_the_per_sender_cap(self) -> None:
        """Items paid for before a restart are not counted against their senders again."""
        s = scheduler(max_wakes_per_sender_per_hour=1, debounce_ms=0)
        s.catch_up([addressed(i, author_id="u1") for i in range(1, 4)], 0.0)
        wake = s.due(0.0)
        assert wake is not None and wake.item_ids == (1, 2, 3)
        s.turn_ended(0.0)
        assert s.on_item(addressed(4, author_id="u1"), 0.0)

    def test_an_empty_catch_up_wakes_no_one(self) -> None:
        """Nothing after the cursor matched: no wake."""
        s = scheduler()
        s.catch_up([event(1)], 0.0)
        assert s.next_deadline() is None


class TestConversationScope:
    def test_each_conversation_is_its_own_wake_one_turn_at_a_time(self) -> None:
        """Under context_scope = "conversation" wakes are per conversation, and single flight still holds."""
        s = scheduler(context_scope="conversation", debounce_ms=0)
        s.on_item(addressed(1), 0.0)
        s.on_item(addressed(2, channel="disc:g1:other"), 0.0)
        s.on_item(addressed(3), 0.0)
        first = s.due(0.0)
        assert first is not None and first.item_ids == (1, 3) and len(first.conversations) == 1
        assert s.due(0.0) is None
        s.turn_ended(0.5)
        second = s.due(0.5)
        assert second is not None and second.item_ids == (2,) and not second.several_conversations


    def test_past_the_cap_new_conversations_share_one_overflow_wake(self) -> None:
        """Items of a thousand new conversations past the cap make one counted wake, not a thousand groups."""
        s = scheduler(context_scope="conversation", debounce_ms=0)
        for i in range(MAX_PENDING_IDS):
            s.on_item(addressed(i + 1, author_id=f"u{i}"), 0.0)
        for i in range(1000):
            assert s.on_item(addressed(1000 + i, channel=f"disc:g1:c{i}", author_id=f"v{i}"), 0.0)
        wakes = []
        while (wake := s.due(1.0)) is not None:
            wakes.append(wake)
            s.turn_ended(1.0)
        assert [(len(w.item_ids), w.overflow, w.several_conversations) for w in wakes] == [
            (MAX_PENDING_IDS, 0, False), (0, 1000, True)]


class TestLowWaterMark:
    """`handled_through`: the durable cursor never passes a waking item that is not handled yet."""

    def test_a_turn_for_one_conversation_stops_below_another_s_pending_item(self) -> None:
        """Items 10 (A), 11 (B), 12 (A): B's turn ends first, and the cursor stays below 10 until A's has."""
        s = scheduler(context_scope="conversation")
        s.on_item(addressed(10), 0.0)
        s.on_item(addressed(11, channel="disc:g1:other"), 0.1)
        s.on_item(addressed(12), 0.2)
        first = s.due(0.45)
        assert first is not None and first.item_ids == (11,)
        assert s.handled_through(12) == 9  # 11 is in its turn, 10 and 12 pend
        assert s.handled_through(12, turn_done=True) == 9  # the cursor B's turn writes: not past 10
        s.turn_ended(1.0)
        second = s.due(1.0)
        assert second is not None and second.item_ids == (10, 12)
        assert s.handled_through(12, turn_done=True) == 12
        s.turn_ended(2.0)
        assert s.handled_through(12) == 12

    def test_items_offered_out_of_id_order_hold_the_mark_at_the_lowest(self) -> None:
        """12 arrives before 11: once 12's wake is running, 11 (pending, a follow-up) still holds the mark."""
        s = scheduler(debounce_ms=0)
        s.on_item(addressed(12), 0.0)
        wake = s.due(0.0)
        assert wake is not None and wake.item_ids == (12,)
        s.on_item(addressed(11, author_id="u2"), 0.1)
        assert s.handled_through(12, turn_done=True) == 10
        s.turn_ended(0.2)
        follow_up = s.due(0.2)
        assert follow_up is not None and follow_up.item_ids == (11,)
        assert s.handled_through(12, turn_done=True) == 12

    def test_an_item_not_offered_yet_holds_the_mark(self) -> None:
        """Nothing pending, but the caller vouches only for ids up to 6 (7 is a dropped event not read back)."""
        s = scheduler(debounce_ms=0)
        s.on_item(addressed(5), 0.0)
        assert s.due(0.0) is not None
        assert s.handled_through(6, turn_done=True) == 6
        s.turn_ended(0.0)
        assert s.handled_through(6) == 6

    def test_items_that_wake_nobody_are_handled_when_offered(self) -> None:
        s = scheduler()
        assert not s.on_item(event(3), 0.0)  # not addressed
        assert s.handled_through(3) == 3

    def test_a_counted_only_item_holds_the_mark_too(self) -> None:
        """Past MAX_PENDING_IDS an item keeps no id, yet its group remembers the lowest id it holds."""
        s = scheduler(context_scope="conversation", debounce_ms=0)
        for i in range(MAX_PENDING_IDS):
            s.on_item(addressed(1000 + i, author_id=f"u{i}"), 0.0)
        s.on_item(addressed(50, channel="disc:g1:c9", author_id="v"), 0.0)  # a new conversation: counted only
        first = s.due(0.0)
        assert first is not None and first.overflow == 0 and len(first.item_ids) == MAX_PENDING_IDS
        assert s.handled_through(2000, turn_done=True) == 49

    def test_held_wakes_hold_the_mark(self) -> None:
        """Past max_turns_per_hour the pending items wait, and so does the cursor."""
        s = scheduler(debounce_ms=0, max_turns_per_hour=1)
        s.on_item(addressed(1), 0.0)
        assert s.due(0.0) is not None
        s.turn_ended(0.0)
        s.on_item(addressed(2, author_id="u2"), 1.0)
        assert s.due(1.0) is None and s.statistics().held
        assert s.handled_through(2) == 1


class TestStatistics:
    def test_the_status_shape(self) -> None:
        """Statistics encode with the status socket's camelCase names."""
        s = scheduler(debounce_ms=0)
        s.on_item(addressed(1), 0.0)
        assert s.statistics().state == "debouncing"
        s.due(0.0)
        assert msgspec.json.decode(msgspec.json.encode(s.statistics())) == {
            "state": "in_turn", "pendingWakes": 0, "held": False, "turnsLastHour": 1}
        s.turn_ended(HOUR_S + 1)
        assert s.statistics().turns_last_hour == 0 and s.statistics().state == "idle"


CHANNELS = ["disc:g1:room", "disc:g1:other", "disc:g2:room"]
DEBOUNCE_S, MAX_WAIT_S = 0.3, 1.0


@functools.cache
def _arrival(waking: bool, channel: int, sender: int) -> NewItem:
    """The item of an arrival of this kind, through the real pipeline once per kind, not once per arrival (a burst
    offers up to 150): the scheduler reads its tags, channel and author, never its message id."""
    return event(0, tags=ADDRESSED if waking else [], channel=CHANNELS[channel], author_id=f"u{sender}").item


class SchedulerMachine(RuleBasedStateMachine):
    """Random seeded turns, arrivals, clock steps, turns and catch-ups against a model of ids and turns."""

    @initialize(scope=st.sampled_from(["agent", "conversation"]),
                seeded=st.lists(st.floats(-HOUR_S, 0, allow_nan=False), max_size=8))
    def start(self, scope: str, seeded: list[float]) -> None:
        self.agent = AgentConfig(name="scout", wake_on=["addressed"], debounce_ms=300, max_wait_ms=1000,
                                 max_turns_per_hour=6, max_wakes_per_sender_per_hour=20, context_scope=scope)
        self.s = AgentScheduler(self.agent)
        self.s.seed_turns(seeded, 0.0)  # a restart: turns of the last hour, from the ledger
        self.now = 0.0
        self.turn_starts = sorted(seeded)  # every turn begun, seeded ones included, for the hourly cap
        self.next_id = 1
        self.woke: set[int] = set()
        self.woke_count = 0
        self.arrivals: dict[str | None, list[float]] = {}  # per group: when its pending items arrived
        self.due_at_once: set[str | None] = set()  # groups a catch-up made due at once (no debounce to check)
        self.unchecked: set[str | None] = set()  # groups that may have lent items to the overflow group
        self.handed: list[int] = []
        self.handed_overflow = 0
        self.in_turn = False
        self.in_flight_overflow = 0
        self.in_flight: set[int] = set()  # the explicit ids of the wake in its turn
        self.ended: set[int] = set()  # the explicit ids of wakes whose turn ended
        self.ended_overflow = 0  # counted-only items of wakes whose turn ended
        self.dropped: list[Stored] = []  # events not offered yet (dropped, to be read back from the store)

    def _group(self, conversation: str | None) -> str | None:
        return conversation if self.agent.context_scope == "conversation" else None

    def _event(self, waking: bool, channel: int, sender: int) -> Stored:
        stored = Stored(self.next_id, _arrival(waking, channel, sender))
        self.next_id += 1
        return stored

    @rule(waking=st.booleans(), channel=st.integers(0, 2), sender=st.integers(0, 2))
    def arrive(self, waking: bool, channel: int, sender: int) -> None:
        self._offer(self._event(waking, channel, sender))

    @rule(items=st.lists(st.tuples(st.booleans(), st.integers(0, 2)), min_size=2, max_size=5), data=st.data())
    def arrive_out_of_order(self, items: list[tuple[bool, int]], data: st.DataObject) -> None:
        """Events of one commit, offered in any order."""
        events = [self._event(waking, channel, i) for i, (waking, channel) in enumerate(items)]
        for stored in data.draw(st.permutations(events)):
            self._offer(stored)

    @rule(items=st.lists(st.tuples(st.booleans(), st.integers(0, 2)), min_size=1, max_size=3))
    def drop(self, items: list[tuple[bool, int]]) -> None:
        """Events dropped by a full stream: stored, but not offered until the gap is read back."""
        self.dropped.extend(self._event(waking, channel, 3) for waking, channel in items)

    @precondition(lambda self: self.dropped)
    @rule()
    def fill_the_gap(self) -> None:
        for stored in self.dropped:
            self._offer(stored)
        self.dropped.clear()

    def _offer(self, stored: Stored) -> None:
        if self.s.statistics().pending_wakes >= MAX_PENDING_IDS:
            # It may be counted only, perhaps in the shared overflow group: its group's times are unknown.
            self.unchecked.add(self._group(stored.item.conversation_id))
        if self.s.on_item(stored, self.now):
            assert ADDRESSED[0] in stored.item.metadata["tags"]
            self.woke.add(stored.id)
            self.woke_count += 1
            self.arrivals.setdefault(self._group(stored.item.conversation_id), []).append(self.now)

    @rule(count=st.integers(50, 150), channel=st.integers(0, 2))
    def burst(self, count: int, channel: int) -> None:
        for i in range(count):
            self.arrive(True, channel, i)  # many senders: the per-sender cap stays out of the way

    @rule(items=st.lists(st.tuples(st.booleans(), st.integers(0, 2)), max_size=5))
    def catch_up(self, items: list[tuple[bool, int]]) -> None:
        events = [self._event(waking, channel, 0) for waking, channel in items]
        self.s.catch_up(events, self.now)
        for stored in events:
            if wake_matches(self.agent, view_of(stored)):
                self.woke.add(stored.id)
                self.woke_count += 1
                self.due_at_once.add(self._group(stored.item.conversation_id))

    @rule(seconds=st.floats(0, 5, allow_nan=False))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def tick(self) -> None:
        deadline = self.s.next_deadline()
        wake = self.s.due(self.now)
        if self.in_turn:
            assert wake is None and deadline is None, "never two turns at once"
            return
        if deadline is not None and self.now >= deadline:
            assert wake is not None, "a deadline that has passed is honoured"
        if wake is None:
            return
        assert deadline is not None and self.now >= deadline, "never before its deadline"
        in_hour = [at for at in self.turn_starts if at + HOUR_S > self.now]
        assert len(in_hour) < self.agent.max_turns_per_hour, "max_turns_per_hour, seeded turns included"
        self.turn_starts.append(self.now)
        group = self._group(wake.conversations[0] if wake.conversations else None)
        # A wake of counted items only is the shared overflow group: it is not the group of the conversation it
        # names, whose own pending items (and their arrival times) are still there.
        if wake.item_ids:
            arrivals = self.arrivals.pop(group, [])
            if arrivals and group not in self.due_at_once | self.unchecked:
                assert self.now >= min(max(arrivals) + DEBOUNCE_S, min(arrivals) + MAX_WAIT_S) - 1e-9
            self.due_at_once.discard(group)
            self.unchecked.discard(group)
        self.handed.extend(wake.item_ids)
        self.handed_overflow += wake.overflow
        self.in_flight = set(wake.item_ids)
        self.in_flight_overflow = wake.overflow
        self.in_turn = True

    @rule()
    def jump_to_the_deadline(self) -> None:
        deadline = self.s.next_deadline()
        if deadline is not None and math.isfinite(deadline):
            self.now = max(self.now, deadline)
            self.tick()

    @precondition(lambda self: self.in_turn)
    @rule()
    def end_turn(self) -> None:
        self.s.turn_ended(self.now)
        self.in_turn = False
        self.ended |= self.in_flight
        self.ended_overflow += self.in_flight_overflow
        self.in_flight = set()

    @property
    def seen_through(self) -> int:
        """Every id up to this one was offered (ids past a dropped event's are not vouched for)."""
        return min([self.next_id - 1, *(stored.id - 1 for stored in self.dropped)])

    def _check_low_water(self, cursor: int, ended: set[int], ended_overflow: int, in_flight: set[int]) -> None:
        assert cursor <= self.seen_through
        assert not {i for i in in_flight if i <= cursor}, "never past the running turn's items"
        # Each waking item at or below the cursor is handled: one of the ended wakes' ids, or one of their counted
        # ones (whose ids a wake does not carry).
        unexplained = {i for i in self.woke if i <= cursor} - ended
        assert len(unexplained) <= ended_overflow, (cursor, sorted(unexplained))
        if not self.handed_overflow and self.s.statistics().pending_wakes == len(self.woke) - len(self.handed):
            # Nothing counted only: the mark is exact, the highest such id.
            outstanding = self.woke - ended
            assert cursor == min([self.seen_through, *(i - 1 for i in outstanding)])

    @invariant()
    def the_cursor_is_the_low_water_mark(self) -> None:
        self._check_low_water(self.s.handled_through(self.seen_through), self.ended, self.ended_overflow,
                              self.in_flight)
        if self.in_turn:  # the cursor written with the turn's end counts that turn as handled
            self._check_low_water(self.s.handled_through(self.seen_through, turn_done=True),
                                  self.ended | self.in_flight, self.ended_overflow + self.in_flight_overflow, set())

    @invariant()
    def no_waking_item_is_lost(self) -> None:
        assert len(self.handed) == len(set(self.handed)) and set(self.handed) <= self.woke
        pending = self.s.statistics().pending_wakes
        assert len(self.handed) + self.handed_overflow + pending == self.woke_count

    @invariant()
    def the_state_is_the_model_s(self) -> None:
        assert (self.s.statistics().state == "in_turn") == self.in_turn


SchedulerMachine.TestCase.settings = settings(max_examples=examples(50), stateful_step_count=40, deadline=None)
TestSchedulerMachine = SchedulerMachine.TestCase
