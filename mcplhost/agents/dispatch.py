"""The agents' feed: each `Stored` event offered to every running agent's scheduler, and what was offered.

    offered = Offered()                                  # what the runtime vouches for (`seen_through`)
    dispatcher = Dispatcher(store.items, offered, running.runners, running.standby, rows=deps.rows)
    await dispatcher.run(stored_events)                  # until the stream ends or the task is cancelled

The dispatcher never waits for a turn: it hands each event to every
scheduler (pure, time as a parameter) and goes on, so inbound storage and
other agents are never held up by one agent. When the event stream says
events were dropped (`missed_before`), it reads the missing items from the
store (after the highest id offered) and offers them like events.

`Offered.seen_through` is what the durable cursors may pass: every id up
to the start's end (or as far as a bounded catch-up read, agents/startup.py)
and every event since, but never past a gap of dropped events not read
back yet; a gap whose read failed holds every cursor below it until the
next start's catch-up. Events of one commit can come out of id order, so
the dispatcher takes everything the stream holds as one batch and offers
it in id order without a yield: the writer wakes every caller of a commit
at once, and each emits its events before the dispatcher runs again, so
the highest id offered never has an unoffered waking item below it.

On a shared store the items table is the feed (agents/follow.py): an event
only says when to read, and the follower offers through `offer`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from mcplhost.agents.agent_loop import AgentRunner
from mcplhost.agents.follow import ItemsAfter, ItemsFollower
from mcplhost.agents.turns.row_cache import RowCache
from mcplhost.ingest import Stored

log = structlog.get_logger()

#: Items read per page when catching up (at start, or after dropped events).
CATCH_UP_PAGE = 1000
#: Item ids remembered as offered, so a gap's read never offers an item twice.
RECENT_IDS = 8192


class Offered:
    """What was offered to every scheduler this run: the start's end, the ids since, and what is held back."""

    def __init__(self) -> None:
        self.start_end = 0  # the store's last id at start: what catch-up covered
        #: Ids offered lately (events of concurrent requests may come out of id order), bounded.
        self.recent: OrderedDict[int, None] = OrderedDict()
        self.max_offered = 0
        #: The lowest id known not offered this run (a bounded catch-up's rest, a gap whose read failed):
        #: no cursor passes it before the next start's catch-up.
        self.unoffered: float = math.inf

    def through(self) -> int:
        """The highest id offered: the start's end or the highest event since."""
        return max(self.start_end, self.max_offered)

    def seen_through(self) -> int:
        """Every item up to this id has been offered to every scheduler (or decided for at start)."""
        offered = self.through()
        return offered if self.unoffered > offered else int(self.unoffered) - 1

    def hold_from(self, item_id: int) -> None:
        """`item_id` (and what follows) was not offered: no cursor passes it before the next start."""
        self.unoffered = min(self.unoffered, item_id)

    def take(self, item_id: int) -> bool:
        """Whether `item_id` is new (recorded as offered now); False: the start's catch-up read it, or it was
        offered already."""
        if item_id <= self.start_end or item_id in self.recent:
            return False  # read by the start's catch-up (ids commit in order), or offered already
        self.recent[item_id] = None
        self.max_offered = max(self.max_offered, item_id)
        if len(self.recent) > RECENT_IDS:
            self.recent.popitem(last=False)
        return True


class Dispatcher:
    """Offers each `Stored` event to every agent not standing by, once, in id order within a batch."""

    def __init__(self, items: ItemsAfter, offered: Offered, runners: Mapping[str, AgentRunner],
                 standby: set[str], *, rows: RowCache | None = None) -> None:
        self._items = items
        self.offered = offered
        self._runners = runners  # `Running.runners`: the runtime adds and removes agents in place
        self._standby = standby  # `Running.standby`: offered nothing until taken over
        self._rows = rows
        #: On a shared store, the reader of the items table that offers instead (agents/follow.py).
        self.follower: ItemsFollower | None = None

    async def run(self, stored: MemoryObjectReceiveStream[Stored]) -> None:
        """Offer each event; everything the stream holds at once is one batch, offered in id order."""
        async with stored:
            async for first in stored:
                if self.follower is not None:  # the items are read from the store: an event only says when
                    _buffered(stored)
                    self.follower.nudge()
                    continue
                for event in sorted([first, *_buffered(stored)], key=lambda e: e.id):
                    if event.missed_before:
                        try:
                            await self._fill_gap(event)
                        except Exception:  # the items stay after the cursors; the next start's catch-up has them
                            log.error("agent.events_gap_unfilled", missed=event.missed_before, exc_info=True)
                            self.offered.hold_from(self.offered.through() + 1)
                    self.offer(event)

    async def _fill_gap(self, event: Stored) -> None:
        """Events were dropped just before `event`: read those items from the store, page by page, and offer them.

        They are the ids between the highest offered and this event (an event
        of a concurrent request that came out of order and was dropped too is
        left to the next start's catch-up, from the durable cursor).
        """
        after, read = self.offered.through(), 0
        while after < event.id - 1:
            page = await self._items.after_as_written(after, limit=CATCH_UP_PAGE)
            for item_id, item in page:
                if item_id < event.id:
                    read += 1
                    self.offer(Stored(item_id, item))
            if len(page) < CATCH_UP_PAGE:
                break
            after = page[-1][0]
        log.info("agent.events_gap_filled", missed=event.missed_before, read=read)

    def offer(self, event: Stored) -> None:
        """One item to every agent not standing by (and to the row cache), unless offered already."""
        if not self.offered.take(event.id):
            return
        if self._rows is not None:  # the row as stored: a turn need not read it (turns/row_cache.py)
            self._rows.feed(event.id, event.item)
        now = anyio.current_time()
        for name, runner in self._runners.items():
            if name not in self._standby:
                runner.offer(event, now)


def _buffered(stored: MemoryObjectReceiveStream[Stored]) -> list[Stored]:
    """The events already waiting in the stream (at most its buffer), taken without a yield."""
    events: list[Stored] = []
    while True:
        try:
            events.append(stored.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            return events
