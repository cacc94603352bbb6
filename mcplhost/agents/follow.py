"""The agents' feed on a shared PostgreSQL store: the items table itself, read after a mark
(docs/architecture.md#engines).

    follower = ItemsFollower(store.items, after=end, offer=runtime_offer)
    sharing.listen(ITEMS_CHANNEL, follower.heard)     # another host's commit (NOTIFY, store/order.py)
    follower.nudge()                                  # this host's commit (its Stored event)
    await follower.run()                              # forever: read, offer in id order, wait for a nudge or POLL_S

Several hosts store items in one table, and an agent hears them all, so its
owner cannot learn of items from its own ingest alone. The follower reads
`id > mark` page by page and offers each item once, in id order, whoever
stored it; local events and notifications only say when to read. Ids are
visible in the order they were taken (store/order.py), so a read that returned
items up to N saw every id below N that will ever commit: `mark` is the
runtime's "offered through", with no gap, and no item is offered twice.

A notification lost (a reconnect, a full queue) or a read that failed delays
the next read by at most POLL_S; it never skips an item: the mark moves only
over what a read returned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import anyio
import structlog

from mcplhost.ingest import Stored
from mcplhost.store import NewItem

log = structlog.get_logger()

#: Seconds between reads when nothing nudges: the most a lost notification delays a wake.
POLL_S = 1.0
#: Items read per page.
FOLLOW_PAGE = 1000
#: Digits of the largest id (a bigint) a notification's payload may name.
ID_DIGITS = 19


class ItemsAfter(Protocol):
    """What the follower reads (store/items.py `ItemRepository`)."""

    async def after_as_written(self, item_id: int, *, since_ms: int = 0,
                               limit: int | None = None) -> list[tuple[int, NewItem]]: ...


class ItemsFollower:
    """Reads the items after its mark when nudged or every POLL_S, and offers each, in id order."""

    def __init__(self, items: ItemsAfter, *, after: int, offer: Callable[[Stored], None],
                 poll_s: float | None = None) -> None:
        self.mark = after  # every item up to this id has been offered (or was before the follower started)
        self._items = items
        self._offer = offer
        self._poll_s = POLL_S if poll_s is None else poll_s
        self._nudged = anyio.Event()
        self._failing = False

    def nudge(self) -> None:
        """Read now: an item was committed (this host's event, or another host's notification)."""
        self._nudged.set()

    def heard(self, payload: str) -> None:
        """A NOTIFY on the items channel (payload: the newest id, only a hint: everything after the mark is read).

        Anyone who may write the database may notify: a payload that is no id of ours nudges, never raises."""
        if not (payload.isascii() and payload.isdigit() and len(payload) <= ID_DIGITS) or int(payload) > self.mark:
            self._nudged.set()

    async def run(self) -> None:
        while True:
            self._nudged = anyio.Event()  # before the read: a nudge during it reads again
            full = await self.read_once()
            if not full:
                with anyio.move_on_after(self._poll_s):
                    await self._nudged.wait()

    async def read_once(self) -> bool:
        """One page after the mark, offered; True when it was full (read on at once)."""
        try:
            page = await self._items.after_as_written(self.mark, limit=FOLLOW_PAGE)
        except Exception as exc:  # the store is away: the mark stays, the next poll reads from it again
            if not self._failing:
                log.warning("agent.follow_failed", after=self.mark, error=str(exc))
            self._failing = True
            return False
        if self._failing:
            log.info("agent.follow_resumed", after=self.mark)
            self._failing = False
        for item_id, item in page:
            self._offer(Stored(item_id, item))
            self.mark = item_id
        return len(page) == FOLLOW_PAGE
