"""The durable peer queue: one row per admitted peer message, and each agent's run of peer-started turns.

A message the host answered `accepted` or `queued` is written here before the
sender reads that answer (operations.EnqueuePeerMessage), so it survives a
crash. Delivery stores the peer row for the target and marks the entry
delivered in one transaction, with a conditional UPDATE (`state = 'queued'`),
so an entry is delivered exactly once however often delivery is tried, before
or after a restart (docs/operations.md#the-peer-queue). Entries are sealed:
each is its own row and becomes its own item, never merged with another.

The throttles are seeded from here after a restart: `recent_sends` (the
admitted non-guidance sends of the longest window), `queued_counts` (the
queue cap's count) and `wake_counts` (the consecutive peer-started turns).
The numbers themselves belong to mcplhost/peers/limits.py; the store takes
them as arguments and holds none.

Writes are validated when their value is built (`PeerEntry`), in the
caller's task: a bad value never reaches a group commit, where it would fail
the other writes sharing the transaction.

Hosts sharing a PostgreSQL store (docs/peers.md#across-hosts): the commit
that queues entries names each target on the PEER_CHANNEL notification
channel, so the host that runs the target delivers them; `to_target` reads
one target's guard counts from the table, so every host's admission counts
every host's sends.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import AsyncIterator, Sequence
from typing import Literal, get_args

import msgspec

from mcplhost.store.connection import Connections, notify_at_commit
from mcplhost.store.items import NewItem

#: The sender's relation to the target: `ancestor` is guidance (from above), the others are peer messages.
PeerRelationship = Literal["ancestor", "sibling", "descendant"]
RELATIONSHIPS: tuple[PeerRelationship, ...] = get_args(PeerRelationship)
#: Guidance: exempt from the throttles and the queue cap.
GUIDANCE = "ancestor"
#: The PostgreSQL notification channel on which a commit that queued entries names their target.
PEER_CHANNEL = "mcplhost_peers"
#: When a queued message is handed over: at the target's next tool boundary, or at its turn end.
DISPATCHES = ("tool-end", "turn-end")
#: What the sender was answered for a stored message (refusals are never stored).
STATUSES = ("accepted", "queued")
#: Rows fetched per round trip when reading.
READ_PAGE_SIZE = 1000
#: The row metadata key naming the entry a delivered peer row came from.
ENTRY_ID_KEY = "peerMessageId"


def with_entry_id(row: NewItem, entry_id: int) -> NewItem:
    """A peer row as stored: a copy naming its queue entry (the caller's metadata is left as it was)."""
    return msgspec.structs.replace(row, metadata={**row.metadata, ENTRY_ID_KEY: entry_id})

_TEXT_KEY = re.compile(r"[0-9a-f]{64}")
_COLUMNS = ("id, sender, target, relationship, dispatch, text, status, state, created_at, delivered_at,"
            " item_id")
_QUEUED_COLUMNS = "id, sender, target, relationship, dispatch, text, created_at"


class PeerEntry(msgspec.Struct, frozen=True):
    """An admitted peer message about to be stored; the store gives it its id."""

    sender: str
    target: str
    relationship: PeerRelationship
    dispatch: str  # one of DISPATCHES
    text: str  # the message as sent
    text_key: str  # 64 lowercase hex: SHA-256 of the trimmed text
    status: str  # one of STATUSES
    created_at: int  # epoch ms

    def __post_init__(self) -> None:
        for name in ("sender", "target"):
            if not getattr(self, name):
                raise ValueError(f"a peer message needs its {name}")
        for name, allowed in (("relationship", RELATIONSHIPS), ("dispatch", DISPATCHES), ("status", STATUSES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"a peer message's {name} is one of {', '.join(allowed)}, "
                                 f"not {getattr(self, name)!r}")
        if not _TEXT_KEY.fullmatch(self.text_key):
            raise ValueError(f"a peer message's text_key is 64 lowercase hex characters, not {self.text_key!r}")


class QueuedPeerMessage(msgspec.Struct, frozen=True):
    """What a delivery needs of a queued entry."""

    id: int
    sender: str
    target: str
    relationship: PeerRelationship
    dispatch: str
    text: str
    created_at: int  # epoch ms


class PeerSend(msgspec.Struct, frozen=True):
    """One admitted non-guidance send, to seed the throttles after a restart."""

    sender: str
    target: str
    text_key: str
    created_at: int  # epoch ms


class TargetCounts(msgspec.Struct, frozen=True):
    """One target's guard counts as the store holds them, for admission on a shared store."""

    sends: list[PeerSend]  # its admitted non-guidance sends since the asked time, oldest first
    queued: int  # its queued entries that count toward the queue cap (guidance does not)
    consecutive_wakes: int


class PeerRow(msgspec.Struct, frozen=True, rename="camel"):
    """An entry as recorded; fields it lacks (a queued entry's delivery) are null."""

    id: int
    sender: str
    target: str
    relationship: str
    dispatch: str
    text: str
    status: str
    state: str
    created_at: int
    delivered_at: int | None
    item_id: int | None


class PeerRepository:
    """Queue peer messages, deliver each once, and keep the guards' counts; the only code that knows these tables."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def insert_many_nocommit(self, entries: Sequence[PeerEntry]) -> builtins.list[int]:
        """Queue each entry, inside the caller's transaction; their new ids, in order."""
        conn, ids = self._connections.writer("peers.insert_many_nocommit"), []
        for e in entries:  # RETURNING per row: ids come from the database, in order
            rows = await conn.fetch(
                "INSERT INTO peer_messages (sender, target, relationship, dispatch, text, text_key, status,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (e.sender, e.target, e.relationship, e.dispatch, e.text, e.text_key, e.status, e.created_at))
            ids.append(next(iter(rows))[0])
        # Delivered at commit: the host that runs the target delivers them.
        await notify_at_commit(conn, PEER_CHANNEL, (e.target for e in entries if e.status == "queued"))
        return ids

    async def deliver_many_nocommit(self, deliveries: Sequence[tuple[int, int | None, int]]) -> builtins.list[bool]:
        """Mark queued entries delivered: (entry_id, item_id, at); True only for each entry this changed.

        The UPDATE is conditional on the entry being queued, so a second
        delivery of an entry, in this call or a later one, is False. `item_id`
        None: the row is stored after the mark and named with `attach_items_nocommit`.
        """
        conn = self._connections.writer("peers.deliver_many_nocommit")
        results = []
        for entry_id, item_id, at in deliveries:
            changed = await conn.execute(
                "UPDATE peer_messages SET state = 'delivered', delivered_at = ?, item_id = ?"
                " WHERE id = ? AND state = 'queued'", (at, item_id, entry_id))
            results.append(changed == 1)
        return results

    async def attach_items_nocommit(self, attachments: Sequence[tuple[int, int]]) -> None:
        """Name the row stored for each delivered entry: (entry_id, item_id); an entry keeps its first."""
        conn = self._connections.writer("peers.attach_items_nocommit")
        if attachments:
            await conn.executemany(
                "UPDATE peer_messages SET item_id = ? WHERE id = ? AND state = 'delivered' AND item_id IS NULL",
                [(item_id, entry_id) for entry_id, item_id in attachments])

    async def queued(self, target: str, *, limit: int) -> builtins.list[QueuedPeerMessage]:
        """The target's queued entries, oldest first (at most `limit`)."""
        _check_limit(limit)
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT {_QUEUED_COLUMNS} FROM peer_messages WHERE target = ? AND state = 'queued'"
                " ORDER BY id LIMIT ?", (target, limit))
        return [QueuedPeerMessage(*row) for row in rows]

    async def queued_counts(self) -> dict[str, int]:
        """Per target, its queued entries that count toward the queue cap (guidance does not)."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT target, count(*) FROM peer_messages WHERE state = 'queued' AND relationship != ?"
                " GROUP BY target", (GUIDANCE,))
        return {target: count for target, count in rows}

    async def queued_targets(self) -> builtins.list[str]:
        """The targets holding any queued entry (guidance included), by name: what to deliver at start."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT DISTINCT target FROM peer_messages WHERE state = 'queued' ORDER BY target")
        return [target for (target,) in rows]

    async def recent_sends(self, since_ms: int, *, limit: int) -> builtins.list[PeerSend]:
        """Admitted non-guidance sends (queued or delivered) since `since_ms`, oldest first.

        At most `limit`: the newest `limit` when there are more, since the
        newest are the ones a throttle window still holds.
        """
        _check_limit(limit)
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT sender, target, text_key, created_at FROM peer_messages"
                " WHERE created_at >= ? AND relationship != ? ORDER BY created_at DESC, id DESC LIMIT ?",
                (since_ms, GUIDANCE, limit))
        return [PeerSend(*row) for row in reversed(builtins.list(rows))]

    async def to_target(self, target: str, since_ms: int, *, limit: int) -> TargetCounts:
        """`target`'s guard counts: its sends since `since_ms` (the newest `limit`), its queue, its wake count."""
        _check_limit(limit)
        async with self._connections.read() as conn:
            sends = await conn.fetch(
                "SELECT sender, target, text_key, created_at FROM peer_messages"
                " WHERE target = ? AND created_at >= ? AND relationship != ? ORDER BY created_at DESC, id DESC LIMIT ?",
                (target, since_ms, GUIDANCE, limit))
            ((queued,),) = await conn.fetch(
                "SELECT count(*) FROM peer_messages WHERE target = ? AND state = 'queued' AND relationship != ?",
                (target, GUIDANCE))
            wakes = await conn.fetch("SELECT consecutive FROM peer_wake_counts WHERE agent = ?", (target,))
        return TargetCounts(sends=[PeerSend(*row) for row in reversed(builtins.list(sends))], queued=int(queued),
                            consecutive_wakes=int(next((w for (w,) in wakes), 0)))

    async def set_wake_counts_nocommit(self, counts: Sequence[tuple[str, int, int]]) -> None:
        """Record each agent's consecutive peer-started turns: (agent, consecutive, at), replacing the last."""
        conn = self._connections.writer("peers.set_wake_counts_nocommit")
        if counts:
            await conn.executemany(
                "INSERT INTO peer_wake_counts (agent, consecutive, updated_at) VALUES (?, ?, ?)"
                " ON CONFLICT (agent) DO UPDATE SET consecutive = excluded.consecutive,"
                " updated_at = excluded.updated_at", counts)

    async def wake_counts(self) -> dict[str, int]:
        """Every recorded agent's consecutive peer-started turns."""
        async with self._connections.read() as conn:
            rows = await conn.fetch("SELECT agent, consecutive FROM peer_wake_counts")
        return {agent: consecutive for agent, consecutive in rows}

    async def get(self, entry_id: int) -> PeerRow | None:
        async with self._connections.read() as conn:
            rows = await conn.fetch(f"SELECT {_COLUMNS} FROM peer_messages WHERE id = ?", (entry_id,))
        return next((PeerRow(*row) for row in rows), None)

    async def iterate(self, *, target: str | None = None) -> AsyncIterator[PeerRow]:
        """Every entry (or those to `target`), oldest first, a page at a time."""
        after = 0
        where, chosen = ("id > ? AND target = ?", (target,)) if target is not None else ("id > ?", ())
        while True:
            async with self._connections.read() as conn:
                rows = list(await conn.fetch(f"SELECT {_COLUMNS} FROM peer_messages WHERE {where} ORDER BY id LIMIT ?",
                                             (after, *chosen, READ_PAGE_SIZE)))
            for row in rows:
                yield PeerRow(*row)
            if len(rows) < READ_PAGE_SIZE:
                return
            after = rows[-1][0]


def _check_limit(limit: int) -> None:
    # SQLite reads a negative LIMIT as no limit at all: a caller's slip would read the whole table.
    if limit < 0:
        raise ValueError(f"a read's limit is a whole number from 0, not {limit!r}")
