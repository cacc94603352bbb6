"""Stored items: the attributed rows every agent's context is built from.

`StoredItem` encodes (msgspec JSON) to exactly the export line of
INTERFACES.md: id, agent, participant, role, content, metadata, createdAt.
Content and metadata are kept as JSON text; `server_id` and `channel_id` are
copied out of metadata into their own columns so reads by channel use an index.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from mcplhost.store.db import Database

# Rows fetched per round trip when reading; bounds memory for a long export.
READ_PAGE_SIZE = 1000

_encoder = msgspec.json.Encoder()
_content_decoder = msgspec.json.Decoder(builtins.list[dict[str, Any]])
_metadata_decoder = msgspec.json.Decoder(dict[str, Any])

_INSERT = (
    "INSERT INTO items (id, agent, participant, role, content, metadata, server_id, channel_id, message_id,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_COLUMNS = "id, agent, participant, role, content, metadata, created_at"


class NewItem(msgspec.Struct, frozen=True):
    """An item about to be stored; the store assigns its id."""

    role: str
    content: builtins.list[dict[str, Any]]
    metadata: dict[str, Any]
    created_at: int  # epoch ms
    agent: str | None = None
    participant: str | None = None


class StoredItem(msgspec.Struct, frozen=True, rename="camel"):
    """An item as stored; its JSON encoding is the `mcplhost messages --json` line.

    Field order is the export's key order, and no field has a default, so
    a null agent or participant is written as null, never left out.
    """

    id: int
    agent: str | None
    participant: str | None
    role: str
    content: builtins.list[dict[str, Any]]
    metadata: dict[str, Any]
    created_at: int  # epoch ms; exported as createdAt


def export_line(item: StoredItem) -> bytes:
    """The item as one line of `mcplhost messages --json` (without the newline)."""
    return _encoder.encode(item)


class ItemRepository:
    """Insert and read items; the only code that knows the items table."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def insert(self, item: NewItem) -> int:
        """Store one item in its own transaction; return its id."""
        (item_id,) = await self.insert_many([item])
        return item_id

    async def insert_many(self, items: Sequence[NewItem]) -> builtins.list[int]:
        """Store all items in one transaction; return their ids in order."""
        if not items:
            return []
        async with self._database.transaction():
            return await self.insert_many_nocommit(items)

    async def insert_many_nocommit(self, items: Sequence[NewItem]) -> builtins.list[int]:
        """Store items inside the caller's `store.transaction()`; return their ids in order.

        Ids are assigned here, after the largest id so far: the transaction
        holds SQLite's write lock, so no one else can take them meanwhile.
        """
        self._database.require_transaction("items.insert_many_nocommit")
        if not items:
            return []
        conn = self._database.conn
        ((largest,),) = await conn.execute_fetchall("SELECT coalesce(max(id), 0) FROM items")
        first = largest + 1
        await conn.executemany(_INSERT, [_row(first + offset, item) for offset, item in enumerate(items)])
        return builtins.list(range(first, first + len(items)))

    async def thread_of(self, server_id: str, channel_id: str, message_id: str) -> str | None:
        """The thread of the latest stored item with this message id in this channel, if any.

        A correction that names no thread inherits its original's (PROVENANCE §2).
        """
        async with self._database.reading():
            rows = await self._database.conn.execute_fetchall(
                "SELECT json_extract(metadata, '$.threadId') FROM items"
                " WHERE channel_id = ? AND message_id = ? AND server_id = ? ORDER BY id DESC LIMIT 1",
                (channel_id, message_id, server_id),
            )
        for (thread,) in rows:
            return thread if isinstance(thread, str) else None
        return None

    async def list(
        self,
        *,
        limit: int | None = None,
        channel: str | None = None,
        agent: str | None = None,
    ) -> builtins.list[StoredItem]:
        """Items oldest first; with `limit`, only the newest `limit` of them (still oldest first)."""
        return [item async for item in self.iterate(limit=limit, channel=channel, agent=agent)]

    async def iterate(
        self,
        *,
        limit: int | None = None,
        channel: str | None = None,
        agent: str | None = None,
    ) -> AsyncIterator[StoredItem]:
        """What `list` returns, fetched a page at a time (for exports of any size).

        `channel` matches the channel id, `agent` the agent column exactly.
        Items stored after the iteration starts are not included.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be at least 0, not {limit}")
        if limit == 0:
            return
        where, params = _filters(channel=channel, agent=agent)
        async with self._database.reading():
            conn = self._database.conn
            ((last,),) = await conn.execute_fetchall("SELECT coalesce(max(id), 0) FROM items")
            after = 0
            if limit is not None:
                # The id just below the newest `limit` matching items (0 if there are fewer).
                rows = await conn.execute_fetchall(
                    f"SELECT id FROM items WHERE {where} ORDER BY id DESC LIMIT 1 OFFSET ?",
                    (*params, limit),
                )
                after = next((row[0] for row in rows), 0)
        while True:
            async with self._database.reading():
                rows = await self._database.conn.execute_fetchall(
                    f"SELECT {_COLUMNS} FROM items WHERE {where} AND id > ? AND id <= ? ORDER BY id LIMIT ?",
                    (*params, after, last, READ_PAGE_SIZE),
                )
            rows = builtins.list(rows)
            for row in rows:
                yield _stored_item(row)
            if len(rows) < READ_PAGE_SIZE:
                return
            after = rows[-1][0]


def _filters(*, channel: str | None, agent: str | None) -> tuple[str, tuple[str, ...]]:
    clauses, params = ["1"], []
    if channel is not None:
        clauses.append("channel_id = ?")
        params.append(channel)
    if agent is not None:
        clauses.append("agent = ?")
        params.append(agent)
    return " AND ".join(clauses), tuple(params)


def _row(item_id: int, item: NewItem) -> tuple[Any, ...]:
    server_id = item.metadata.get("serverId")
    channel_id = item.metadata.get("channelId")
    message_id = item.metadata.get("messageId")
    return (
        item_id,
        item.agent,
        item.participant,
        item.role,
        # Stored as TEXT (a bytes value would be a BLOB, which SQLite's JSON
        # functions would read as JSONB).
        _encoder.encode(item.content).decode(),
        _encoder.encode(item.metadata).decode(),
        server_id if isinstance(server_id, str) else None,
        channel_id if isinstance(channel_id, str) else None,
        message_id if isinstance(message_id, str) else None,
        item.created_at,
    )


def _stored_item(row: Sequence[Any]) -> StoredItem:
    item_id, agent, participant, role, content, metadata, created_at = row
    return StoredItem(
        id=item_id,
        agent=agent,
        participant=participant,
        role=role,
        content=_content_decoder.decode(content),
        metadata=_metadata_decoder.decode(metadata),
        created_at=created_at,
    )
