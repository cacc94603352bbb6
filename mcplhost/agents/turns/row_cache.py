"""The newest stored rows, kept in memory between turns, so a turn reads from the store only what is new.

Reading and decoding a full context (a few thousand rows of JSON) on every
turn would cost more than the rest of the turn; the context changes by a
few rows between turns. `RowCache` is shared by every agent of the host:

- everyone's rows (items heard from connectors, `agent` NULL) in one bounded
  deque, and for each agent its context so far (everyone's rows and its own,
  merged by id) in a bounded deque of its own; other agents' rows are never
  handed to an agent;
- `rows_for(agent)` first reads the rows stored since the last read (ids
  commit in order, so `after(last id read)` misses nothing) and appends each
  to the contexts it belongs to, so a read copies the newest `limit` rows
  instead of merging them again;
- an agent seen for the first time is seeded with the store's exact
  `context_rows` read, so its first context equals an uncached read; the
  rows it adds to everyone's deque are older than any other agent's window.
  Once everyone's deque is full, a new agent reads only its own rows above
  the deque's first (the same context, without reading `limit` rows again:
  each agent's first turn is on a wake's path).

It also holds the store's `RenderedRows`, so a row is rendered for the
compiler once (for each message cap and set of connectors shown without
the `from:` line, docs/agents.md#who-said-what), not on every turn of
every agent that hears it.

Bounded: `limit` rows of everyone's plus `limit` of each agent's context
(references to the same rows), and RENDERED_ROWS renderings.
"""

from __future__ import annotations

import heapq
from collections import deque
from operator import attrgetter

import anyio

from mcplhost.agents.turns.history import RenderedRows
from mcplhost.store import StoredItem
from mcplhost.store.interfaces import Items

#: Rows read per page when catching up with what was stored since the last read.
READ_PAGE = 1000

_row_id = attrgetter("id")


class RowCache:
    def __init__(self, items: Items, limit: int) -> None:
        self.items = items
        self.limit = limit
        self.rendered = RenderedRows()  # this store's rows as the compiler renders them (ids are per store)
        self._everyone: deque[StoredItem] = deque(maxlen=limit)
        self._contexts: dict[str, deque[StoredItem]] = {}  # agent → newest `limit` of everyone's and its own
        self._last_id: int | None = None  # the highest id read; None: nothing read yet
        # One reader at a time, so rows are appended in id order; taken free without a yield to the loop,
        # which a busy loop makes cost a whole round on the way to the backend call.
        self._lock = anyio.Lock(fast_acquire=True)

    async def rows_for(self, agent: str) -> list[StoredItem]:
        """The newest `limit` rows that are everyone's or `agent`'s own, oldest first (like `context_rows`)."""
        async with self._lock:
            if agent not in self._contexts:
                await self._seed(agent)
            else:
                await self._read_new()
            return list(self._contexts[agent])

    async def _seed(self, agent: str) -> None:
        await self._read_new()  # every row up to `read` is now where it belongs
        read = self._last_id or 0
        own_rows = await self._own_in_window(agent)
        if own_rows is not None:  # everyone's deque is full: only the agent's own rows are to be read
            own = [r for r in own_rows if r.id <= read]
            self._contexts[agent] = deque(heapq.merge(self._everyone, own, key=_row_id), maxlen=self.limit)
            await self._read_new()
            return
        rows = [r for r in await self.items.context_rows(agent, limit=self.limit) if r.id <= read]
        own = [r for r in rows if r.agent == agent]
        everyone = [r for r in rows if r.agent is None]
        if self._everyone:
            everyone = [r for r in everyone if r.id < self._everyone[0].id]  # the deque holds the rest already
        room = self.limit - len(self._everyone)
        if room > 0 and everyone:
            self._everyone.extendleft(reversed(everyone[-room:]))
        self._contexts[agent] = deque(heapq.merge(self._everyone, own, key=_row_id), maxlen=self.limit)
        await self._read_new()  # what was stored meanwhile, this agent's own rows included

    async def _own_in_window(self, agent: str) -> list[StoredItem] | None:
        """The agent's own rows that can be among its newest `limit`, when everyone's deque is full, else None.

        Full, it holds everyone's newest `limit` rows up to the last id read, so an own row older than its
        first is pushed out of the context by them: the rows to read are those above it (by items_by_agent,
        not the context's `limit` rows). None too when there are `limit` such rows or more (then read as a
        new agent's context is).
        """
        if len(self._everyone) < self.limit or not self._everyone:
            return None
        rows: list[StoredItem] = await self.items.own_after(agent, self._everyone[0].id, limit=self.limit)
        return rows if len(rows) < self.limit else None

    async def _read_new(self) -> None:
        if self._last_id is None:
            self._last_id = await self.items.last_id()
            return
        while True:
            page: list[StoredItem] = await self.items.after(self._last_id, limit=READ_PAGE)
            for row in page:
                if row.agent is None:
                    self._everyone.append(row)
                    for context in self._contexts.values():
                        context.append(row)
                elif row.agent in self._contexts:
                    self._contexts[row.agent].append(row)
            if page:
                self._last_id = page[-1].id
            if len(page) < READ_PAGE:
                return
