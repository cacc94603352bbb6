"""One agent's wake scheduler: a state object with time as a parameter (docs/agents.md#scheduling).

    scheduler.on_item(stored, now)   # record a waking item (True) or not (False)
    wake = scheduler.due(now)        # the wake to run now, or None; the agent is then in its turn
    scheduler.turn_ended(now)        # the turn is over; what arrived meanwhile is one follow-up
    scheduler.next_deadline()        # when `due` next has something (None: nothing pending)

It only records and signals: nothing here waits, reads the store or calls
a backend. The driver (agents/agent_loop.py) sleeps until `next_deadline()`; tests
pass `now` and never sleep. `now` is seconds on one monotonic clock.

Theory of operation:

- Waking items are *pending* in a group: one group for the agent when
  `context_scope = "agent"`, one per conversation when it is
  `"conversation"`, and under either one of its own for peer messages
  (`PEER_GROUP`: sealed). A group is due `debounce_ms` after its latest item, but
  never later than `max_wait_ms` after its first.
- Single flight: `due` hands out at most one wake until `turn_ended`. Items
  that wake the agent during a turn pend as usual, so they make one
  follow-up turn (per group) with the same debounce, measured from their
  arrival: if that time has passed when the turn ends, it is due at once.
- Bounded: at most `MAX_PENDING_IDS` ids pend per agent; past that a group
  keeps only a count (`overflow`) and whether it spans several
  conversations (per conversation, past the cap an item of a conversation
  with nothing pending joins one shared overflow group). Every waking item is in exactly one wake, by id or in its
  overflow count.
- Runaway guard: at most `max_turns_per_hour` wakes are handed out per
  sliding hour. Past it the agent is *held*: items keep pending (capped as
  above), one warning is logged per held spell, and the next wake is due
  when the oldest turn of the hour leaves the window. A restarted host
  seeds the window with the turns the ledger has from the last hour
  (`seed_turns`), so a restart does not reset the guard.
- Per-sender cap: past `max_wakes_per_sender_per_hour` waking items from one
  sender in a sliding hour, that sender's items are heard but do not wake,
  with one log line per sender and hour.
- Decisions: each item held by the sender cap, and each pending id held by
  the turn cap (once per held spell), is reported to `take_decisions`, so
  the runtime can record it for `mcplhost explain`.
- Low-water mark (`handled_through`): the highest id such that every
  waking item at or below it is handled (its turn ended, whatever the
  outcome); an item that wakes nobody is handled when it is offered. It
  never passes an item still pending (debouncing, held, a follow-up, in
  another conversation's group, counted only) or in the running turn, nor
  `seen_through`, the caller's word that every item up to it was offered
  (so an item not yet offered, such as a dropped event still to be read
  back, holds it too). That is the durable cursor
  (docs/agents.md#the-durable-cursor).
- Stop (`drop_pending`): a stop command lets every pending wake go unrun;
  its items count as handled (docs/agents.md#stop).
- Catch-up (`catch_up`) takes the items a restart found after the durable
  cursor (the caller has applied `catch_up_max_age_s`) and makes them one
  wake (one per conversation under `"conversation"`), due at once. It
  applies the wake rules, not the per-sender cap: those items were already
  paid for before the restart.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Literal

import msgspec
import structlog

from mcplhost.agents.wakes.rules import NO_ADDRESSING, Addressing, Wake, sender_key, view_of, wake_matches
from mcplhost.config import AgentConfig, effective_max_wait_ms
from mcplhost.ingest import Stored

log = structlog.get_logger()

#: Most waking item ids kept per agent; past it only a count.
MAX_PENDING_IDS = 100
#: The window of max_turns_per_hour and max_wakes_per_sender_per_hour, in seconds.
HOUR_S = 3600.0
#: Senders whose recent wakes are remembered for the per-sender cap; the least recent is forgotten first.
MAX_TRACKED_SENDERS = 10_000
#: Ids of recent wakes remembered so an item offered twice (an event and a catch-up read) wakes once.
RECENT_WAKE_IDS = 4096

#: The group of peer messages (docs/peers.md#delivery): sealed, never one wake with other waking items,
#: under either context_scope (not a conversation id either).
PEER_GROUP = "peer"
#: Under context_scope "conversation", where waking items of conversations with no pending group go
#: once the cap is reached, so the groups stay bounded too (not a conversation id: those begin "conv_").
OVERFLOW_GROUP = "overflow"

#: Decisions kept for `take_decisions` at most; past it the oldest are forgotten.
MAX_UNTAKEN_DECISIONS = 10_000
#: The stateful holds the scheduler reports (store/decisions.py DECISION_REASONS).
DECISION_SENDER_CAP = "sender_cap"
DECISION_TURN_CAP = "turn_cap"

_UNSET = object()

State = Literal["idle", "debouncing", "in_turn"]


class SchedulerStats(msgspec.Struct, frozen=True, rename="camel"):
    """One agent's scheduler, as the status socket shows it."""

    state: State
    pending_wakes: int  # waking items not yet in a wake (ids and overflow)
    held: bool  # past max_turns_per_hour: wakes wait for the hour's window
    turns_last_hour: int


class _Pending:
    """The waking items of one group not yet handed out (mutable; owned by one scheduler)."""

    __slots__ = ("ids", "overflow", "floor", "conversations", "first_place", "several", "first_at", "last_at",
                 "due_now")

    def __init__(self, now: float) -> None:
        self.ids: list[int] = []
        self.overflow = 0
        self.floor: int | None = None  # the lowest id among its items, counted-only ones included
        self.conversations: dict[str, None] = {}  # at most MAX_PENDING_IDS + 1 entries
        self.first_place: object = _UNSET  # the first item's conversation id (None: it has none)
        self.several = False
        self.first_at = now
        self.last_at = now
        self.due_now = False  # catch-up: no debounce

    def add(self, item_id: int, conversation: str | None, now: float, *, keep_id: bool) -> None:
        if keep_id:
            self.ids.append(item_id)
        else:
            self.overflow += 1
        self.floor = item_id if self.floor is None else min(self.floor, item_id)
        # An item of no conversation (an unscoped push, console input) is a place of its own: mixed
        # with a channel's items, the wake has no one conversation to answer in.
        if self.first_place is _UNSET:
            self.first_place = conversation
        elif conversation != self.first_place:
            self.several = True
        if conversation is not None and (keep_id or not self.conversations):
            self.conversations.setdefault(conversation, None)
        self.last_at = max(self.last_at, now)

    def deadline(self, debounce_s: float, max_wait_s: float) -> float:
        if self.due_now:
            return self.first_at
        return min(self.last_at + debounce_s, self.first_at + max_wait_s)

    def wake(self) -> Wake:
        return Wake(item_ids=tuple(sorted(self.ids)), overflow=self.overflow,
                    conversations=tuple(sorted(self.conversations)), several_conversations=self.several,
                    first_at=self.first_at, catch_up=self.due_now)


def low_water_mark(seen_through: int, outstanding_floors: Iterable[int | None]) -> int:
    """The highest id at or below which nothing is outstanding: below the lowest outstanding id, at most `seen_through`.

    `outstanding_floors`: the lowest id of each group of waking items not yet
    handled (None: an empty group, ignored).
    """
    lowest = min((floor for floor in outstanding_floors if floor is not None), default=None)
    return seen_through if lowest is None else min(seen_through, lowest - 1)


class AgentScheduler:
    """The wake state of one agent; every method takes the time it decides at."""

    def __init__(self, agent: AgentConfig, addressing: Addressing = NO_ADDRESSING) -> None:
        self._settings(agent)
        #: Whom addressed items address (docs/agents.md#addressing); the runtime sets it again at a reload.
        self.addressing = addressing
        self._groups: OrderedDict[str | None, _Pending] = OrderedDict()
        self._pending_ids: set[int] = set()
        self._in_turn = False
        self._in_flight_floor: int | None = None  # the lowest id of the wake in its turn
        self._turn_starts: deque[float] = deque()  # within the last hour, oldest first
        self._held = False
        self._senders: OrderedDict[str, deque[float]] = OrderedDict()
        self._capped_logged: dict[str, float] = {}  # sender -> when its cap was last logged
        self._recent: OrderedDict[int, None] = OrderedDict()
        self._now = 0.0  # the latest time any method was given (statistics has none of its own)
        #: Stateful holds not yet taken by `take_decisions`: (item id, DECISION_*), at most MAX_PENDING_IDS + one
        #: per offered item between takes (the runtime takes them after each offer and each `due`).
        self._decided: list[tuple[int, str]] = []
        self._held_reported: set[int] = set()  # pending ids already reported held by the turn cap, this spell

    def reconfigure(self, agent: AgentConfig) -> None:
        """Take the agent's new settings (a config reload), between turns; what pends stays pending.

        Debounce, max_wait and the caps apply from now on. A changed
        `context_scope` groups the items that arrive from now on; the groups
        pending already keep their keys.
        """
        self._settings(agent)
        while len(self._turn_starts) > agent.max_turns_per_hour:  # the newest still count, as seed_turns keeps
            self._turn_starts.popleft()

    def _settings(self, agent: AgentConfig) -> None:
        """What the scheduler reads of the agent's table, derived once (at construction and at each reload)."""
        self.agent = agent
        self._debounce_s = agent.debounce_ms / 1000
        self._max_wait_s = effective_max_wait_ms(agent) / 1000
        self._per_conversation = agent.context_scope == "conversation"
        self._log = log.bind(agent=agent.name)

    # --- recording -----------------------------------------------------------------

    def on_item(self, stored: Stored, now: float) -> bool:
        """Record a just-stored item; True when it wakes the agent (now pending)."""
        self._tick(now)
        view = view_of(stored, self.addressing)
        if view.id in self._pending_ids or view.id in self._recent or not wake_matches(self.agent, view,
                                                                                         self.addressing):
            return False
        sender = sender_key(view)
        if sender is not None and not self._sender_allows(sender, now):
            self._report([(view.id, DECISION_SENDER_CAP)])
            return False
        self._add(view.id, view.conversation_id, now, peer=view.peer_trigger)
        return True

    def catch_up(self, stored_list: Iterable[Stored], now: float) -> None:
        """Record the items found after the durable cursor: one wake for those that match, due at once."""
        self._tick(now)
        for stored in stored_list:
            view = view_of(stored, self.addressing)
            if view.id in self._pending_ids or view.id in self._recent or not wake_matches(self.agent, view,
                                                                                             self.addressing):
                continue
            self._add(view.id, view.conversation_id, now, peer=view.peer_trigger).due_now = True

    def _add(self, item_id: int, conversation: str | None, now: float, *, peer: bool = False) -> _Pending:
        keep = len(self._pending_ids) < MAX_PENDING_IDS
        key = PEER_GROUP if peer else conversation if self._per_conversation else None
        if not keep and key not in self._groups:
            key = OVERFLOW_GROUP  # a new conversation past the cap: counted, never a group of its own
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Pending(now)
        if keep:
            self._pending_ids.add(item_id)
        group.add(item_id, conversation, now, keep_id=keep)
        return group

    def _sender_allows(self, sender: str, now: float) -> bool:
        """Count one wake for `sender`, unless it is past its hourly cap (then log once per hour)."""
        times = self._senders.pop(sender, None) or deque()
        while times and times[0] + HOUR_S <= now:
            times.popleft()
        self._senders[sender] = times  # most recently seen last
        while len(self._senders) > MAX_TRACKED_SENDERS:
            forgotten, _ = self._senders.popitem(last=False)
            self._capped_logged.pop(forgotten, None)
        if len(times) < self.agent.max_wakes_per_sender_per_hour:
            times.append(now)
            return True
        logged = self._capped_logged.get(sender)
        if logged is None or logged + HOUR_S <= now:
            self._capped_logged[sender] = now
            self._log.info("agent.sender_capped", sender=sender,
                           max_wakes_per_sender_per_hour=self.agent.max_wakes_per_sender_per_hour)
        return False

    def seed_turns(self, started: Iterable[float], now: float) -> None:
        """Count turns begun before this scheduler existed (a restart) against max_turns_per_hour.

        `started` are their start times on this scheduler's clock (the caller
        converts the ledger's wall-clock ms relative to `now`), so each leaves
        the window when it would have. A time after `now` (the wall clock went
        back) counts as now. Only the newest `max_turns_per_hour` are kept:
        the window is full until the oldest of those leaves it either way.
        """
        self._tick(now)
        merged = sorted([*self._turn_starts, *(min(at, now) for at in started if at + HOUR_S > self._now)])
        self._turn_starts = deque(merged[-self.agent.max_turns_per_hour:])

    # --- handing out -----------------------------------------------------------------

    def due(self, now: float) -> Wake | None:
        """The wake to run now (the agent is then in its turn), or None."""
        self._tick(now)
        if self._in_turn:
            return None
        earliest = self._earliest()
        if earliest is None or earliest[1] > now:
            return None
        if len(self._turn_starts) >= self.agent.max_turns_per_hour:
            self._report([(item_id, DECISION_TURN_CAP) for item_id in sorted(self._pending_ids)
                          if item_id not in self._held_reported])
            self._held_reported.update(self._pending_ids)
            if not self._held:
                self._held = True
                self._log.warning("agent.wakes_held", reason="max_turns_per_hour",
                                  max_turns_per_hour=self.agent.max_turns_per_hour,
                                  resumes_in_s=round(self._turn_starts[0] + HOUR_S - now, 3))
            return None
        self._held = False
        self._held_reported.clear()
        group = self._groups.pop(earliest[0])
        for item_id in group.ids:
            self._pending_ids.discard(item_id)
            self._recent[item_id] = None
        while len(self._recent) > RECENT_WAKE_IDS:
            self._recent.popitem(last=False)
        self._in_turn = True
        self._in_flight_floor = group.floor
        self._turn_starts.append(now)
        return group.wake()

    def drop_pending(self, now: float) -> tuple[list[int], int]:
        """A stop command: every pending wake is let go, unrun; (the ids dropped, the counted-only ones).

        The dropped items are handled from now on (the low-water mark passes
        them) and remembered, so the same item offered again wakes nothing.
        The running turn, if any, is the caller's to abort.
        """
        self._tick(now)
        ids = sorted(item_id for group in self._groups.values() for item_id in group.ids)
        overflow = sum(group.overflow for group in self._groups.values())
        self._groups.clear()
        self._pending_ids.clear()
        for item_id in ids:
            self._recent[item_id] = None
        while len(self._recent) > RECENT_WAKE_IDS:
            self._recent.popitem(last=False)
        return ids, overflow

    def turn_ended(self, now: float) -> None:
        """The turn handed out by `due` is over (whatever its outcome)."""
        self._tick(now)
        self._in_turn = False
        self._in_flight_floor = None

    def handled_through(self, seen_through: int, *, turn_done: bool = False) -> int:
        """The low-water mark: every waking item at or below it is handled (see the module's docstring).

        `seen_through`: every item up to this id has been offered (`on_item`
        or `catch_up`). `turn_done`: count the running turn as handled (its
        end is being written now, with this cursor).
        """
        floors = [group.floor for group in self._groups.values()]
        if self._in_turn and not turn_done:
            floors.append(self._in_flight_floor)
        return low_water_mark(seen_through, floors)

    def next_deadline(self) -> float | None:
        """When `due` next returns a wake; None while in a turn or with nothing pending."""
        if self._in_turn:
            return None
        earliest = self._earliest()
        if earliest is None:
            return None
        deadline = earliest[1]
        if len(self._turn_starts) >= self.agent.max_turns_per_hour:
            # Held: the next slot opens when the oldest turn of the window leaves it.
            deadline = max(deadline, self._turn_starts[0] + HOUR_S)
        return deadline

    def _earliest(self) -> tuple[str | None, float] | None:
        """The key and deadline of the group due first (ties: the group that began first), if any."""
        best: tuple[str | None, float] | None = None
        for key, group in self._groups.items():
            deadline = group.deadline(self._debounce_s, self._max_wait_s)
            if best is None or deadline < best[1]:
                best = (key, deadline)
        return best

    def _tick(self, now: float) -> None:
        self._now = max(self._now, now)
        while self._turn_starts and self._turn_starts[0] + HOUR_S <= self._now:  # as next_deadline adds
            self._turn_starts.popleft()

    # --- reporting -----------------------------------------------------------------

    def take_decisions(self) -> list[tuple[int, str]]:
        """The stateful holds decided since the last take, (item id, DECISION_*), oldest first (docs/agents.md#explain).

        A turn-capped item is reported once per held spell; it still runs when
        the window frees a slot, and explain then says it woke.
        """
        taken, self._decided = self._decided, []
        return taken

    def _report(self, decided: list[tuple[int, str]]) -> None:
        self._decided.extend(decided)
        del self._decided[:-MAX_UNTAKEN_DECISIONS]  # nobody taking them (a scheduler driven by hand) stays bounded

    def statistics(self) -> SchedulerStats:
        """The state as of the latest time this scheduler was given."""
        self._tick(self._now)
        pending = len(self._pending_ids) + sum(g.overflow for g in self._groups.values())
        state: State = "in_turn" if self._in_turn else "debouncing" if self._groups else "idle"
        held = self._held and len(self._turn_starts) >= self.agent.max_turns_per_hour
        return SchedulerStats(state=state, pending_wakes=pending, held=held, turns_last_hour=len(self._turn_starts))
