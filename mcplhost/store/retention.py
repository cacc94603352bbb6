"""Retention: pruning items older than `[store] retention_days`, never one that is still needed.

The rule (docs/operations.md#retention), decided by the pure `prunable`:
items are pruned oldest id first, a batch of RETENTION_BATCH_ROWS per
transaction, and a pass ends at the first item that is too new: created at
or after the cutoff (now minus the retention), or above the *floor*. The
floor keeps, whatever their age:

- the newest item, so ids keep rising (SQLite gives a new row the largest id
  plus one: were the newest deleted, its id would be given again, and a
  cursor or a `messages --follow` that passed it would skip the new row);
- everything above the lowest cursor of a configured agent (what it has not
  handled yet, its catch-up); on a store several hosts share, of every agent
  with a cursor, since another host's agents are no less configured;
- each configured agent's newest `context_rows` rows that it sees (everyone's
  and its own: a turn's context, mcplhost/agents/turns/runner.py CONTEXT_ROWS).

Below the floor and past the cutoff, an item is still kept when

- it is a speech row (`metadata.outboxId` / `metadata.outboxIds`) with a
  publish still pending in the outbox;
- a peer queue entry that is still queued names it (`peer_messages.item_id`);
- a push-event dedup record still inside its window names it
  (`push_events.item_id`: a redelivered event is answered with that item).

An item deleted leaves the search index in the same transaction
(store/search_index.py `forget_nocommit`), so no search finds it after.

Each batch is one short write transaction on the writer's connection, so
an inbound commit waits for at most one batch, and the pass pauses between
batches as long as the last one took: inbound keeps at least half the
writer's time while a pass runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import anyio
import msgspec
import structlog

from mcplhost.store.connection import POSTGRESQL, SQLITE, Connections, Engine
from mcplhost.store.interfaces import SearchIndex
from mcplhost.store.items import IDS_PER_QUERY
from mcplhost.store.pushes import PUSH_DEDUP_WINDOW_MS
from mcplhost.store.turns import DAY_MS

log = structlog.get_logger()

#: Items looked at (and at most deleted) per transaction: short enough that an inbound commit hardly waits.
RETENTION_BATCH_ROWS = 300
#: Longest pause between two batches; each pause is as long as the batch before it took, up to this.
RETENTION_PAUSE_MAX_S = 0.05
#: How often a pass runs (the first one right at start).
RETENTION_INTERVAL_S = 3600.0
#: Outbox ids taken from one speech row's metadata.outboxIds (a publish names a few destinations at most).
OUTBOX_IDS_PER_ROW = 64

_outbox_ids_decoder = msgspec.json.Decoder(list[int])


class RetentionRow(msgspec.Struct, frozen=True):
    """What the rule needs of one item: its id, its age, and the outbox rows it caused (speech rows only)."""

    id: int
    created_at: int
    outbox_ids: tuple[int, ...] = ()


class Kept(msgspec.Struct):
    """Items past the cutoff kept because something still needs them, by reason."""

    outbox: int = 0
    peer: int = 0
    push: int = 0


class Decision(msgspec.Struct, frozen=True):
    delete: list[int]  # ids to delete, ascending
    last_id: int  # the last id looked at and decided (the next batch starts after it)
    done: bool  # True: the pass met an item that is too new (or no more items)
    kept: Kept


def prunable(rows: Sequence[RetentionRow], *, cutoff_ms: int, floor_id: int, pending_outbox: frozenset[int],
             queued_peer_items: frozenset[int], claimed_items: frozenset[int], after_id: int) -> Decision:
    """Which of `rows` (ascending ids, all above `after_id`) to delete, by the module docstring's rule."""
    delete: list[int] = []
    kept = Kept()
    last = after_id
    for row in rows:
        if row.id > floor_id or row.created_at >= cutoff_ms:
            return Decision(delete, last, True, kept)
        last = row.id
        if any(outbox_id in pending_outbox for outbox_id in row.outbox_ids):
            kept.outbox += 1
        elif row.id in queued_peer_items:
            kept.peer += 1
        elif row.id in claimed_items:
            kept.push += 1
        else:
            delete.append(row.id)
    return Decision(delete, last, len(rows) == 0, kept)


def outbox_ids(outbox_id: object, listed: object) -> tuple[int, ...]:
    """The outbox rows a speech row names: metadata.outboxId and metadata.outboxIds (JSON text), ints only."""
    found = [outbox_id] if isinstance(outbox_id, int) else []
    if isinstance(listed, str):
        try:
            found.extend(_outbox_ids_decoder.decode(listed)[:OUTBOX_IDS_PER_ROW])
        except msgspec.DecodeError:  # our own metadata; a malformed list names nothing
            pass
    return tuple(found)


class PassCounts(msgspec.Struct):
    removed: int = 0
    batches: int = 0
    kept: Kept = msgspec.field(default_factory=Kept)


#: The columns `outbox_ids` reads, per engine: metadata.outboxId as an integer (else NULL), metadata.outboxIds as
#: JSON text; only an agent's rows name outbox rows.
_NAMED_OUTBOX: dict[Engine, str] = {
    SQLITE: "CASE WHEN agent IS NOT NULL THEN json_extract(metadata, '$.outboxId') END,"
            " CASE WHEN agent IS NOT NULL THEN json_extract(metadata, '$.outboxIds') END",
    POSTGRESQL: "CASE WHEN agent IS NOT NULL AND metadata->>'outboxId' ~ '^-?[0-9]{1,18}$'"
                " THEN CAST(metadata->>'outboxId' AS BIGINT) END,"
                " CASE WHEN agent IS NOT NULL THEN CAST(metadata->'outboxIds' AS TEXT) END",
}


class RetentionRepository:
    """The SQL of retention: the floor, and one batch (read, decide, delete) in one transaction."""

    def __init__(self, connections: Connections, index: SearchIndex) -> None:
        self._connections = connections
        self._index = index

    async def floor(self, agents: Iterable[str] | None, *, context_rows: int) -> int:
        """The largest id retention may delete (0: none): below the newest item, each agent's cursor and context.

        `agents` None: every agent with a cursor (a shared store: other hosts run agents this one does not)."""
        async with self._connections.read() as conn:
            if agents is None:
                agents = [agent for (agent,) in await conn.fetch("SELECT agent FROM agent_cursors")]
            names = sorted(set(agents))
            ((newest,),) = await conn.fetch("SELECT coalesce(max(id), 0) FROM items")
            floor = int(newest) - 1
            if names:
                marks = ", ".join("?" * len(names))
                ((lowest,),) = await conn.fetch(
                    f"SELECT min(item_id) FROM agent_cursors WHERE agent IN ({marks})", names)
                if lowest is not None:
                    floor = min(floor, lowest)
            for name in names:
                rows = await conn.fetch(
                    "SELECT id FROM items WHERE agent IS NULL OR agent = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                    (name, context_rows - 1))
                oldest_in_context = int(next((row[0] for row in rows), 0))  # 0: fewer rows than a context holds
                floor = min(floor, oldest_in_context - 1)
        return max(floor, 0)

    async def prune_batch(self, *, after_id: int, cutoff_ms: int, floor_id: int, now_ms: int,
                          limit: int = RETENTION_BATCH_ROWS) -> Decision:
        """Decide and delete one batch of items above `after_id`, in its own transaction."""
        async with self._connections.transaction():
            conn = self._connections.writer("retention.prune_batch")
            found = await conn.fetch(
                f"SELECT id, created_at, {_NAMED_OUTBOX[conn.engine]}"
                " FROM items WHERE id > ? AND id <= ? ORDER BY id LIMIT ?", (after_id, floor_id, limit))
            rows = [RetentionRow(item_id, created_at, outbox_ids(one, listed))
                    for item_id, created_at, one, listed in found]
            if not rows:
                return Decision([], after_id, True, Kept())
            low, high = rows[0].id, rows[-1].id
            named = sorted({outbox_id for row in rows for outbox_id in row.outbox_ids})
            pending: set[int] = set()
            for start in range(0, len(named), IDS_PER_QUERY):
                chunk = named[start : start + IDS_PER_QUERY]
                pending.update(r[0] for r in await conn.fetch(
                    f"SELECT id FROM outbox WHERE state = 'pending' AND id IN ({', '.join('?' * len(chunk))})",
                    chunk))
            peer = {r[0] for r in await conn.fetch(
                "SELECT item_id FROM peer_messages WHERE state = 'queued' AND item_id BETWEEN ? AND ?", (low, high))}
            claimed = {r[0] for r in await conn.fetch(
                "SELECT item_id FROM push_events WHERE created_at >= ? AND item_id BETWEEN ? AND ?",
                (now_ms - PUSH_DEDUP_WINDOW_MS, low, high))}
            decision = prunable(rows, cutoff_ms=cutoff_ms, floor_id=floor_id, pending_outbox=frozenset(pending),
                                queued_peer_items=frozenset(peer), claimed_items=frozenset(claimed),
                                after_id=after_id)
            if decision.delete:
                await self._index.forget_nocommit(decision.delete)
                await conn.execute(f"DELETE FROM items WHERE id IN ({', '.join('?' * len(decision.delete))})",
                                   decision.delete)
            return decision

    async def prune(self, *, retention_days: int, agents: Iterable[str] | None, context_rows: int, now_ms: int) -> PassCounts:
        """One pass: batches until an item that is too new; logs `store.retention_pruned` when it removed any."""
        started = time.monotonic()
        floor_id = await self.floor(agents, context_rows=context_rows)
        counts = PassCounts()
        after = 0
        while True:
            batch_began = time.monotonic()
            decision = await self.prune_batch(after_id=after, cutoff_ms=now_ms - retention_days * DAY_MS,
                                              floor_id=floor_id, now_ms=now_ms)
            batch_s = time.monotonic() - batch_began
            counts.batches += 1
            counts.removed += len(decision.delete)
            counts.kept.outbox += decision.kept.outbox
            counts.kept.peer += decision.kept.peer
            counts.kept.push += decision.kept.push
            after = decision.last_id
            if decision.done:
                break
            # As long again as the batch took (bounded): inbound commits keep at least half the writer's time.
            await anyio.sleep(min(batch_s, RETENTION_PAUSE_MAX_S))
        if counts.removed or counts.kept.outbox or counts.kept.peer or counts.kept.push:
            log.info("store.retention_pruned", removed=counts.removed, batches=counts.batches,
                     kept_outbox=counts.kept.outbox, kept_peer=counts.kept.peer, kept_push=counts.kept.push,
                     floor_id=floor_id, retention_days=retention_days,
                     seconds=round(time.monotonic() - started, 3))
        return counts


async def run_retention(retention: RetentionRepository, *, retention_days: int, agents: Sequence[str] | None,
                        context_rows: int, clock: Callable[[], int]) -> None:
    """The host's task: a pass now, then one every RETENTION_INTERVAL_S (started only when retention_days > 0)."""
    while True:
        try:
            await retention.prune(retention_days=retention_days, agents=agents, context_rows=context_rows,
                                  now_ms=clock())
        except Exception:  # a failed pass (disk full, a locked file) is retried at the next; the host goes on
            log.error("store.retention_failed", exc_info=True)
        await anyio.sleep(RETENTION_INTERVAL_S)
