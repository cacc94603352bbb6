"""Stored items: the attributed rows every agent's context is built from.

`StoredItem` encodes (msgspec JSON) to exactly the export line of
docs/provenance.md §6: id, agent, participant, role, content, metadata, createdAt.
Content and metadata are kept as JSON text; `server_id`, `channel_id` and
`message_id` are copied out of metadata into their own columns so reads by
channel use an index, and the thread, conversation and redelivery key are
columns the writer fills from the `NewItem`.

Idempotence: a channel item carries `dedup_digest` (its delivered body's
digest). (channel, message id, server, dedup_digest) is UNIQUE in the schema,
so an identical redelivery, even one in the same batch or one after a crash
between commit and answer, is a conflict: nothing is stored and the caller
learns the original's id and conversation (`ItemWritten.duplicate`).

Reads go through `Connections.read()`: the store's reader connections, which
see the last commit and never take the writer's lock
(docs/architecture.md#the-store); inside the caller's own transaction, the writer's connection.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import aiosqlite
import msgspec

from mcplhost.errors import HostStateError
from mcplhost.store.connection import Connections

# Rows fetched per round trip when reading; bounds memory for a long export.
READ_PAGE_SIZE = 1000
#: How many of an agent's newest rows `newest_turn_drafts` looks through: one turn writes far fewer.
DRAFT_SCAN_ROWS = 1000

_encoder = msgspec.json.Encoder()
_content_decoder = msgspec.json.Decoder(builtins.list[dict[str, Any]])
_metadata_decoder = msgspec.json.Decoder(dict[str, Any])

# Ids per `IN (...)` list in get_many (one parameter each, below SQLite's old 999-variable limit).
IDS_PER_QUERY = 900

# Rows per INSERT statement: 12 parameters each stays far below SQLite's
# 32766-variable limit, and a group of MAX_GROUP writes needs few statements.
ROWS_PER_INSERT = 512

_INSERT_COLUMNS = (
    "agent, participant, role, content, metadata, server_id, channel_id, message_id,"
    " thread_id, conversation_id, dedup_digest, created_at"
)
#: Content and metadata are given as their JSON's UTF-8 bytes and stored as TEXT (a BLOB would be read as JSONB
#: by SQLite's JSON functions): the cast costs SQLite a copy, where a str would cost Python a decode and the
#: driver an encode back.
_JSON_COLUMNS = ("content", "metadata")
_ROW_PLACEHOLDERS = "(" + ", ".join("CAST(? AS TEXT)" if column.strip() in _JSON_COLUMNS else "?"
                                    for column in _INSERT_COLUMNS.split(",")) + ")"
# The UNIQUE index items_by_message (migration 0002): a row is constrained
# only when all four are non-null, i.e. a channel item carrying its digest.
_KEY_COLUMNS = ("channel_id", "message_id", "server_id", "dedup_digest")
_KEY_POSITIONS = tuple([c.strip() for c in _INSERT_COLUMNS.split(",")].index(k) for k in _KEY_COLUMNS)
_COLUMNS = "id, agent, participant, role, content, metadata, created_at"
_WRITTEN_COLUMNS = ("id, agent, participant, role, content, metadata, thread_id, conversation_id, dedup_digest,"
                    " created_at")
_FIND_ORIGINAL = f"SELECT id, conversation_id FROM items WHERE {' AND '.join(f'{k} = ?' for k in _KEY_COLUMNS)}"


class NewItem(msgspec.Struct, frozen=True):
    """An item about to be stored; the store assigns its id."""

    role: str
    content: builtins.list[dict[str, Any]]
    metadata: dict[str, Any]
    created_at: int  # epoch ms
    agent: str | None = None
    participant: str | None = None
    thread_id: str | None = None
    conversation_id: str | None = None  # ingest.conversation_id of (server, channel, thread)
    #: The redelivery key (a channel item's sourceBodyDigest); None: never deduplicated.
    dedup_digest: str | None = None


class ItemWritten(msgspec.Struct, frozen=True):
    """What storing one `NewItem` came to."""

    id: int  # the new row's id, or the original's for a duplicate
    duplicate: bool  # True: an identical redelivery; nothing new was stored
    conversation_id: str | None  # the stored row's (the original's for a duplicate; None on rows before 0002)


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

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def insert(self, item: NewItem) -> int:
        """Store one item in its own transaction; return its id (the original's for a duplicate)."""
        (item_id,) = await self.insert_many([item])
        return item_id

    async def insert_many(self, items: Sequence[NewItem]) -> builtins.list[int]:
        """Store all items in one transaction; return their ids in order (the original's for a duplicate)."""
        if not items:
            return []
        async with self._connections.transaction():
            return [written.id for written in await self.insert_many_nocommit(items)]

    async def insert_many_nocommit(self, items: Sequence[NewItem], *, rows: Sequence[ItemRow] | None = None,
                                   searched: object = None) -> builtins.list[ItemWritten]:
        """Store items inside the caller's `store.transaction()`; one `ItemWritten` per item, in order.

        Ids come from the database (`RETURNING`). An item whose redelivery
        key is already stored, or earlier in `items`, stores nothing and
        gets the original's id and conversation.

        `rows`: the items' `item_row`s, when the caller built them already
        (ingest does, to size and search them once). `searched`: the secrets
        version (`Secrets.version`) those rows were searched with and found
        to hold none of, so the writer's connection need not search them again
        (store/db.py `RedactingWriter`); it searches as usual if the set
        changed since.
        """
        conn = self._connections.writer("items.insert_many_nocommit")
        if rows is None:
            rows = [item_row(item) for item in items]
            searched = None
        elif len(rows) != len(items):
            raise ValueError("rows given for items must be one per item")
        written: builtins.list[ItemWritten] = []
        for start in range(0, len(items), ROWS_PER_INSERT):
            end = start + ROWS_PER_INSERT
            written.extend(await _insert_chunk(conn, items[start:end], rows[start:end], searched))
        return written

    async def is_stored(self, server_id: str, channel_id: str, message_id: str, dedup_digest: str) -> bool:
        """Whether a channel item with this redelivery key is stored (so delivering it again stores nothing)."""
        async with self._connections.read() as conn:
            rows = await conn.execute_fetchall(_FIND_ORIGINAL, (channel_id, message_id, server_id, dedup_digest))
        return bool(rows)

    async def thread_of(self, server_id: str, channel_id: str, message_id: str) -> str | None:
        """The thread of the latest stored item with this message id in this channel, if any.

        A correction that names no thread inherits its original's (docs/provenance.md §2).
        """
        async with self._connections.read() as conn:
            rows = await conn.execute_fetchall(
                "SELECT thread_id FROM items"
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
        since_ms: int | None = None,
        after_id: int = 0,
    ) -> AsyncIterator[StoredItem]:
        """What `list` returns, fetched a page at a time (for exports of any size).

        `channel` matches the channel id, `agent` the agent column exactly,
        `since_ms` keeps items created at or after that epoch-ms time, and
        `after_id` items with a larger id (`messages --follow` polls with the
        last id it printed). Items stored after the iteration starts are not included.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be at least 0, not {limit}")
        if limit == 0:
            return
        where, params = _filters(channel=channel, agent=agent, since_ms=since_ms)
        async with self._connections.read() as conn:
            ((last,),) = await conn.execute_fetchall("SELECT coalesce(max(id), 0) FROM items")
            after = after_id
            if limit is not None:
                # The id just below the newest `limit` matching items (0 if there are fewer).
                rows = await conn.execute_fetchall(
                    f"SELECT id FROM items WHERE {where} AND id > ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                    (*params, after_id, limit),
                )
                after = next((row[0] for row in rows), after_id)
        while True:
            async with self._connections.read() as conn:
                rows = await conn.execute_fetchall(
                    f"SELECT {_COLUMNS} FROM items WHERE {where} AND id > ? AND id <= ? ORDER BY id LIMIT ?",
                    (*params, after, last, READ_PAGE_SIZE),
                )
            rows = builtins.list(rows)
            for row in rows:
                yield _stored_item(row)
            if len(rows) < READ_PAGE_SIZE:
                return
            after = rows[-1][0]


    # --- reads for agents: catch-up, context, and the items of a wake ----------------

    async def last_id(self) -> int:
        """The newest item's id (0 when the store is empty): where a new agent's cursor starts."""
        async with self._connections.read() as conn:
            ((last,),) = await conn.execute_fetchall("SELECT coalesce(max(id), 0) FROM items")
        return last

    async def after(self, item_id: int, *, since_ms: int = 0, limit: int | None = None) -> builtins.list[StoredItem]:
        """Items with an id above `item_id` created at or after `since_ms`, oldest first (catch-up).

        With `limit`, the first `limit` of them; page on by passing the last id returned.
        """
        return [_stored_item(row) for row in await self._rows_after(_COLUMNS, item_id, since_ms, limit)]

    async def after_as_written(self, item_id: int, *, since_ms: int = 0,
                               limit: int | None = None) -> builtins.list[tuple[int, NewItem]]:
        """What `after` returns, each as (id, the `NewItem` as written): thread, conversation and key included.

        Catch-up rebuilds ingest's `Stored` events from these, so a replayed
        item has the conversation id the live event had (None for an unscoped
        push or local input), not one recomputed from its metadata.
        """
        return [_written_item(row) for row in await self._rows_after(_WRITTEN_COLUMNS, item_id, since_ms, limit)]

    async def _rows_after(self, columns: str, item_id: int, since_ms: int, limit: int | None) -> builtins.list[Any]:
        """`columns` of the items above `item_id` created at or after `since_ms`, oldest first, at most `limit`."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be at least 0, not {limit}")
        async with self._connections.read() as conn:
            return await conn.execute_fetchall(
                f"SELECT {columns} FROM items WHERE id > ? AND created_at >= ? ORDER BY id LIMIT ?",
                (item_id, since_ms, -1 if limit is None else limit),
            )

    async def context_rows(self, agent: str, *, limit: int,
                           conversation_id: str | None = None) -> builtins.list[StoredItem]:
        """The newest `limit` items that are everyone's (agent NULL) or `agent`'s own, oldest first.

        Other agents' rows are never among them. With `conversation_id`
        (context_scope "conversation"), only rows stored with that
        conversation id, read through the index items_by_conversation
        (migration 0005); rows from before migration 0002 have none.
        """
        if limit < 0:
            raise ValueError(f"limit must be at least 0, not {limit}")
        where, params = "(agent IS NULL OR agent = ?)", [agent]
        if conversation_id is not None:
            where += " AND conversation_id = ?"
            params.append(conversation_id)
        async with self._connections.read() as conn:
            rows = await conn.execute_fetchall(
                f"SELECT {_COLUMNS} FROM items WHERE {where} ORDER BY id DESC LIMIT ?", (*params, limit))
        return [_stored_item(row) for row in reversed(builtins.list(rows))]

    async def newest_turn_drafts(self, agent: str) -> int:
        """The draft rows (prose not sent, docs/agents.md#drafts) of the agent's newest turn.

        Looked for among the agent's newest DRAFT_SCAN_ROWS rows, so the count
        costs the same however long the agent has run.
        """
        async with self._connections.read() as conn:
            rows = await conn.execute_fetchall(
                "SELECT count(*) FROM (SELECT metadata FROM items WHERE agent = ? ORDER BY id DESC LIMIT ?)"
                " WHERE json_extract(metadata, '$.kind') = 'draft' AND json_extract(metadata, '$.turnId') ="
                " (SELECT id FROM turns WHERE agent = ? ORDER BY started_at DESC, id DESC LIMIT 1)",
                (agent, DRAFT_SCAN_ROWS, agent))
        return next(iter(rows))[0]

    async def turn_drafts(self, agent: str, turn_id: int) -> builtins.list[tuple[int, str | None]]:
        """(row id, reason) of each draft row (docs/agents.md#drafts) the agent's turn left, by id (explain)."""
        async with self._connections.read() as conn:
            rows = await conn.execute_fetchall(
                "SELECT id, json_extract(metadata, '$.reason') FROM items WHERE agent = ?"
                " AND json_extract(metadata, '$.kind') = 'draft' AND json_extract(metadata, '$.turnId') = ?"
                " ORDER BY id", (agent, turn_id))
        return [(row_id, reason if isinstance(reason, str) else None) for row_id, reason in rows]

    async def get_many(self, ids: Sequence[int]) -> builtins.list[StoredItem]:
        """The stored items among `ids`, by ascending id, each once; ids not stored are left out."""
        wanted = sorted(set(ids))
        found: builtins.list[StoredItem] = []
        async with self._connections.read() as conn:
            for start in range(0, len(wanted), IDS_PER_QUERY):
                chunk = wanted[start : start + IDS_PER_QUERY]
                rows = await conn.execute_fetchall(
                    f"SELECT {_COLUMNS} FROM items WHERE id IN ({', '.join('?' * len(chunk))}) ORDER BY id", chunk)
                found.extend(_stored_item(row) for row in rows)
        return found


async def _insert_chunk(conn: aiosqlite.Connection, items: Sequence[NewItem], rows: Sequence[ItemRow],
                        searched: object) -> builtins.list[ItemWritten]:
    """One INSERT of up to ROWS_PER_INSERT items, inside the caller's transaction on `conn`."""
    statement = (f"INSERT INTO items ({_INSERT_COLUMNS}) VALUES {', '.join([_ROW_PLACEHOLDERS] * len(rows))}"
                 " ON CONFLICT DO NOTHING RETURNING id")
    values = builtins.list(chain.from_iterable(rows))
    if searched is None:
        returned = await conn.execute_fetchall(statement, values)
    else:  # the writer's connection (store/db.py) skips a search already made for the same secrets
        returned = await conn.execute_fetchall(statement, values, searched=searched)  # type: ignore[call-arg]
    # RETURNING's row order is unspecified, but ids are given in the order
    # the VALUES rows are processed; so the inserted rows, sorted by id,
    # are the items in order minus those that conflicted.
    ids = sorted(row[0] for row in returned)
    if len(ids) == len(items):  # none conflicted, the usual case
        return [ItemWritten(item_id, False, item.conversation_id) for item_id, item in zip(ids, items)]
    # Only an item with a key can conflict, and an inserted key is unique, so
    # a keyed item whose key is not the next inserted row's was a conflict.
    inserted: builtins.list[Any] = []
    for start in range(0, len(ids), IDS_PER_QUERY):
        chunk = ids[start : start + IDS_PER_QUERY]
        inserted.extend(await conn.execute_fetchall(
            f"SELECT id, {', '.join(_KEY_COLUMNS)} FROM items WHERE id IN ({', '.join('?' * len(chunk))}) ORDER BY id",
            chunk))
    written: builtins.list[ItemWritten] = []
    next_row = 0
    for item, row in zip(items, rows):
        key = _key(row)
        if next_row < len(inserted) and (key is None or tuple(inserted[next_row][1:]) == key):
            written.append(ItemWritten(inserted[next_row][0], False, item.conversation_id))
            next_row += 1
            continue
        if key is None:
            raise HostStateError("an item without a redelivery key was not inserted")
        written.append(await _original(conn, key))
    if next_row != len(inserted):
        raise HostStateError("inserted rows do not match the items in order")
    return written


async def _original(conn: aiosqlite.Connection, key: tuple[Any, ...]) -> ItemWritten:
    rows = await conn.execute_fetchall(_FIND_ORIGINAL, key)
    for item_id, conversation in rows:
        return ItemWritten(item_id, True, conversation)
    raise HostStateError(f"an item conflicted on {key!r} but no original has that key")


def newest_first(conn: sqlite3.Connection, *, page_rows: int = READ_PAGE_SIZE) -> Iterator[StoredItem]:
    """Every item stored before the scan began, newest first, on a plain sqlite3 connection (a worker thread's).

    A page of `page_rows` per statement, each statement ended before the
    next begins; rows are decoded one at a time as they are taken, so
    memory is one row whatever the bodies' sizes. Close the generator to
    stop early.
    """
    ((before,),) = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM items").fetchall()
    while True:
        cursor = conn.execute(f"SELECT {_COLUMNS} FROM items WHERE id < ? ORDER BY id DESC LIMIT ?",
                              (before, page_rows))
        try:
            taken = 0
            for row in cursor:
                taken += 1
                before = row[0]
                yield _stored_item(row)
        finally:
            cursor.close()
        if taken < page_rows:
            return


def _filters(*, channel: str | None, agent: str | None, since_ms: int | None = None) -> tuple[str, tuple[Any, ...]]:
    clauses: builtins.list[str] = ["1"]
    params: builtins.list[Any] = []
    if channel is not None:
        clauses.append("channel_id = ?")
        params.append(channel)
    if agent is not None:
        clauses.append("agent = ?")
        params.append(agent)
    if since_ms is not None:
        clauses.append("created_at >= ?")
        params.append(since_ms)
    return " AND ".join(clauses), tuple(params)


#: An item as the INSERT writes it: its values in `_INSERT_COLUMNS` order.
ItemRow = tuple[Any, ...]


def item_row(item: NewItem) -> ItemRow:
    """The INSERT's values for `item`, in `_INSERT_COLUMNS` order (content and metadata as compact JSON, UTF-8)."""
    server_id = item.metadata.get("serverId")
    channel_id = item.metadata.get("channelId")
    message_id = item.metadata.get("messageId")
    return (
        item.agent,
        item.participant,
        item.role,
        _encoder.encode(item.content),  # stored as TEXT: see _ROW_PLACEHOLDERS
        _encoder.encode(item.metadata),
        server_id if isinstance(server_id, str) else None,
        channel_id if isinstance(channel_id, str) else None,
        message_id if isinstance(message_id, str) else None,
        item.thread_id,
        item.conversation_id,
        item.dedup_digest,
        item.created_at,
    )


_key_of = itemgetter(*_KEY_POSITIONS)
_CONTENT_POSITION = [c.strip() for c in _INSERT_COLUMNS.split(",")].index("content")


def row_content(row: ItemRow) -> bytes:
    """The content column's value in `row`: the item's content blocks as compact JSON (UTF-8)."""
    return row[_CONTENT_POSITION]  # type: ignore[no-any-return]


def _key(row: ItemRow) -> tuple[Any, ...] | None:
    """The row's `_KEY_COLUMNS` values, or None when the unique index does not constrain it (a null among them)."""
    key = _key_of(row)
    return None if None in key else key


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


def _written_item(row: Sequence[Any]) -> tuple[int, NewItem]:
    item_id, agent, participant, role, content, metadata, thread_id, conversation_id, dedup_digest, created_at = row
    return item_id, NewItem(
        role=role,
        content=_content_decoder.decode(content),
        metadata=_metadata_decoder.decode(metadata),
        created_at=created_at,
        agent=agent,
        participant=participant,
        thread_id=thread_id,
        conversation_id=conversation_id,
        dedup_digest=dedup_digest,
    )
