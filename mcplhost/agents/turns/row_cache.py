"""The newest stored rows, kept in memory between turns, so a turn reads from the store only what is new.

Reading and decoding a full context (a few thousand rows of JSON) on every
turn would cost more than the rest of the turn; the context changes by a
few rows between turns. `RowCache` is shared by every agent of the host:

- everyone's rows (items heard from connectors, `agent` NULL) in one bounded
  deque, and for each agent its context so far (everyone's rows and its own,
  merged by id) in a bounded deque of its own; other agents' rows are never
  handed to an agent;
- new rows are appended to the contexts they belong to as they are fed
  or read (ids commit in order, so `after(last id known)` misses nothing),
  so `rows_for` copies the newest `limit` rows instead of merging them again;
- an agent seen for the first time is seeded with the store's exact
  `context_rows` read, so its first context equals an uncached read; the
  rows it adds to everyone's deque are older than any other agent's window.
  Once everyone's deque is full, a new agent reads only its own rows above
  the deque's first (the same context, without reading `limit` rows again:
  each agent's first turn is on a wake's path).

Fed rows (docs/agents.md#the-row-cache): the rows the host learns of as they
commit (the runtime's `Stored` events, which on a shared store are the
items table read in id order, and the turns' own `InsertItems` results) are
`feed`-ed in, so a turn's read of new rows is usually no read at all. A fed
row is applied only when every id below it is known (ids commit in order:
store/order.py), else held in `_pending` (bounded) until the gap is fed;
`rows_for` reads the store as before whenever a gap is held, or when the
rows known stop short of the ids the caller says must be there (the wake's
items). A row fed while a read is in progress waits in `_pending` too, so
the read's rows and the fed ones are never appended twice. A turn's rows
are then the newest `limit` up to the last id known with no gap, which
always includes its wake; a row that committed without being fed (a CLI
write, a peer message, another host's agent row) is read by the next read
that a gap or a wake forces. An agent's own rows not fed (a publish's speech
row) are read after its turn (`turn_ended`, then `run` reads in the
background), or by its next `rows_for` if that comes first.

Off the wake path as well: `warm` reads and renders an agent's context at
start, and `render_ahead` renders each new row between turns.

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
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import anyio
import structlog

from mcplhost.agents.turns.history import RenderedRows
from mcplhost.secrets import NO_SECRETS, Secrets
from mcplhost.store import NewItem, StoredItem
from mcplhost.store.interfaces import Items
from mcplhost.store.items import ItemWritten
from mcplhost.store.operations import InsertItems, Operation
from mcplhost.store.writer import Committed

log = structlog.get_logger()

#: Rows read per page when catching up with what was stored since the last read.
READ_PAGE = 1000
#: Rows rendered between two yields to the loop when warming an agent's context (~50 µs each).
WARM_SLICE = 100
#: Fed rows held above a gap at most; past it they are let go (the read a gap forces reads them).
PENDING_ROWS = 4096

_row_id = attrgetter("id")


class RowCache:
    def __init__(self, items: Items, limit: int, secrets: Secrets = NO_SECRETS) -> None:
        self.items = items
        self.limit = limit
        #: The writer's secrets (store/redacting.py): a turn's row holding one is stored redacted, so never fed.
        self.secrets = secrets
        self.rendered = RenderedRows()  # this store's rows as the compiler renders them (ids are per store)
        self._everyone: deque[StoredItem] = deque(maxlen=limit)
        self._contexts: dict[str, deque[StoredItem]] = {}  # agent → newest `limit` of everyone's and its own
        self._last_id: int | None = None  # every row up to this id is known; None: nothing read yet
        self._pending: dict[int, StoredItem] = {}  # fed rows above `_last_id` not applied yet (a gap, a read)
        #: Agents whose turn ended since the last read of new rows began (their own rows may be unfed), by
        #: the `_reads_begun` count at their turn's end.
        self._dirty: dict[str, int] = {}
        self._reads_begun = 0
        self._refresh = anyio.Event()
        #: Rows appended and not rendered yet (`render_ahead` renders them between turns), newest `limit`.
        self._to_render: deque[StoredItem] = deque(maxlen=limit)
        self._render_due = anyio.Event()
        #: rows_for calls that read the store for new rows, and those that needed none (the benchmark prints them).
        self.stats = {"reads": 0, "fed": 0, "refreshes": 0}
        # One reader at a time, so rows are appended in id order; taken free without a yield to the loop,
        # which a busy loop makes cost a whole round on the way to the backend call.
        self._lock = anyio.Lock(fast_acquire=True)

    async def rows_for(self, agent: str, *, through: int = 0) -> list[StoredItem]:
        """The newest `limit` rows that are everyone's or `agent`'s own, oldest first (like `context_rows`), up
        to the newest row known with no gap below it; the store is read first when that is below `through` (the
        ids the caller knows are stored), or a fed row waits above a gap."""
        async with self._lock:
            if agent not in self._contexts:
                await self._seed(agent)
            elif self._pending or (self._last_id or 0) < through or agent in self._dirty:
                await self._read_new()
            else:
                self.stats["fed"] += 1
            return list(self._contexts[agent])

    async def warm(self, agent: str, message_cap: int, no_author_line: frozenset[str]) -> None:
        """Seed `agent`'s context and render its rows as its compile will (at start, off the wake path), a slice
        at a time between yields to the loop: its first turn then reads and renders only what is new."""
        rows = await self.rows_for(agent)
        for start in range(0, len(rows), WARM_SLICE):
            self.rendered.lookup(rows[start:start + WARM_SLICE], message_cap, no_author_line)
            await anyio.sleep(0)

    async def render_ahead(self) -> None:
        """Forever: render each new row under every message cap in use, a slice at a time between yields to the
        loop, so a turn's compile finds the rows that came since the last turn rendered already (it renders any
        not yet, itself, as before)."""
        while True:
            await self._render_due.wait()
            self._render_due = anyio.Event()
            while self._to_render:
                rows = [self._to_render.popleft() for _ in range(min(WARM_SLICE, len(self._to_render)))]
                for message_cap, no_author_line in self.rendered.keys():
                    self.rendered.lookup(rows, message_cap, no_author_line)
                await anyio.sleep(0)

    def turn_ended(self, agent: str) -> None:
        """`agent`'s turn and its writes are committed: the rows they stored (a publish's speech row, a peer
        message delivered in it) are read by the next refresh (`run`), or by the agent's next `rows_for` if that
        comes first."""
        self._dirty[agent] = self._reads_begun
        self._refresh.set()

    async def run(self) -> None:
        """Forever: after each turn's end, read what was stored since the last read, off every wake's path."""
        while True:
            await self._refresh.wait()
            self._refresh = anyio.Event()
            if self._last_id is None:
                continue
            try:
                await self.refresh()
            except Exception as exc:  # the store is away: the next rows_for reads (and fails its turn) instead
                log.warning("agent.rows_refresh_failed", error=str(exc))

    async def refresh(self) -> None:
        """Read the rows stored after the last id known, without the lock: applied once read, unless a read under
        the lock is in progress (then held as fed rows, which it applies or lets go)."""
        self.stats["refreshes"] += 1
        begun = self._reads_begun = self._reads_begun + 1
        while self._last_id is not None:
            page: list[StoredItem] = await self.items.after(self._last_id, limit=READ_PAGE)
            for row in page:
                self._take(row)
            if len(page) < READ_PAGE or self._lock.locked():
                break
        self._clean(begun)

    def _take(self, row: StoredItem) -> None:
        """A row read without the lock: every id below it up to `_last_id` is known, or was read with it."""
        if self._last_id is None or row.id <= self._last_id:
            return
        if self._lock.locked():
            if len(self._pending) < PENDING_ROWS:
                self._pending[row.id] = row
            return
        self._pending.pop(row.id, None)
        self._append(row)
        self._last_id = row.id

    def _clean(self, begun: int) -> None:
        """The agents marked before the read numbered `begun` began are now known through their turns' ends."""
        if not self._lock.locked():
            self._apply_pending()
            for agent in [a for a, mark in self._dirty.items() if mark < begun]:
                del self._dirty[agent]

    def feed(self, item_id: int, item: NewItem) -> None:
        """A row just committed as `item_id`, exactly as stored (an ingest event's item is redacted already)."""
        last = self._last_id
        if last is None or item_id <= last:
            return  # nothing read yet (the first read reads it), or known already
        row = StoredItem(id=item_id, agent=item.agent, participant=item.participant, role=item.role,
                         content=item.content, metadata=item.metadata, created_at=item.created_at)
        if item_id != last + 1 or self._lock.locked():
            if len(self._pending) < PENDING_ROWS:
                self._pending[item_id] = row
            return
        self._append(row)
        self._last_id = item_id
        self._apply_pending()

    def feed_written(self, items: Sequence[NewItem], written: Sequence[ItemWritten]) -> None:
        """A turn's `InsertItems` as committed: each row stored anew is fed, unless it holds a secret (the writer
        stored it redacted: the read a gap forces has it)."""
        for item, result in zip(items, written, strict=True):
            if not result.duplicate and not (self.secrets and self.secrets.find_json([item.content, item.metadata])):
                self.feed(result.id, item)

    def feed_committed(self, operations: Sequence[Operation[Any]], committed: Committed) -> None:
        """Every `InsertItems` among `operations`, as `committed` (other operations' rows are read instead)."""
        for operation in operations:
            if isinstance(operation, InsertItems):
                self.feed_written(operation.items, committed[operation])

    def _append(self, row: StoredItem) -> None:
        self._to_render.append(row)
        if not self._render_due.is_set():
            self._render_due.set()
        if row.agent is None:
            self._everyone.append(row)
            for context in self._contexts.values():
                context.append(row)
        elif row.agent in self._contexts:
            self._contexts[row.agent].append(row)

    def _apply_pending(self) -> None:
        """Apply the fed rows that now follow `_last_id` with no gap; let go of those it passed."""
        pending, last = self._pending, self._last_id
        if not pending or last is None:
            return
        while (row := pending.pop(last + 1, None)) is not None:
            self._append(row)
            last = row.id
        self._last_id = last
        if pending and min(pending) <= last:
            for item_id in [i for i in pending if i <= last]:
                del pending[item_id]

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
        """Read the rows stored after `_last_id` (the lock held, so nothing fed is applied meanwhile), then
        apply the fed rows that follow them."""
        self.stats["reads"] += 1
        begun = self._reads_begun = self._reads_begun + 1
        try:
            await self._read_all_new()
        finally:
            for agent in [a for a, mark in self._dirty.items() if mark < begun]:
                del self._dirty[agent]

    async def _read_all_new(self) -> None:
        if self._last_id is None:
            self._last_id = await self.items.last_id()
            self._apply_pending()
            return
        while True:
            page: list[StoredItem] = await self.items.after(self._last_id, limit=READ_PAGE)
            for row in page:
                self._append(row)
            if page:
                self._last_id = page[-1].id
            if len(page) < READ_PAGE:
                break
        self._apply_pending()
