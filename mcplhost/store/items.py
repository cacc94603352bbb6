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
import re
from collections.abc import AsyncIterator, Sequence
from functools import cached_property
from itertools import chain
from operator import itemgetter
from typing import Any

import msgspec

from mcplhost.errors import HostStateError
from mcplhost.store.connection import POSTGRESQL, Conn, Connections, json_field, json_int, notify_at_commit
from mcplhost.store.order import ITEMS_CHANNEL, ITEMS_ORDER_KEY
from mcplhost.store.rows import HostRow, ItemMeta, host_row, item_meta

# Rows fetched per round trip when reading; bounds memory for a long export.
READ_PAGE_SIZE = 1000
#: Rows the console's reads look through at most for one page (`newest`, `turn_rows`, `recent_drafts`).
CONSOLE_WINDOW_ROWS = 10_000
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
#: The columns a `StoredItem` is read from (`stored_item`), in its field order.
STORED_COLUMNS = ("id", "agent", "participant", "role", "content", "metadata", "created_at")
_COLUMNS = ", ".join(STORED_COLUMNS)
_WRITTEN_COLUMNS = ("id, agent, participant, role, content, metadata, thread_id, conversation_id, dedup_digest,"
                    " created_at")
_FIND_ORIGINAL = f"SELECT id, conversation_id FROM items WHERE {' AND '.join(f'{k} = ?' for k in _KEY_COLUMNS)}"


class _TypedMetadata:
    """`meta` and `host`: an item's metadata read typed (store/rows.py), each decoded on first read and kept.

    They are no Struct fields (the item's `__dict__` holds them), so no encoding of the item holds them.
    """

    __slots__ = ()
    metadata: dict[str, Any]

    @cached_property
    def meta(self) -> ItemMeta:
        """The host-written keys of its metadata: ids, tags, the frozen source, header, author, echo mark."""
        return item_meta(self.metadata)

    @cached_property
    def host(self) -> HostRow | None:
        """What it is when it is a host row (an agent's speech, draft, tool call or result, notice, peer message)."""
        return host_row(self.metadata)


class NewItem(_TypedMetadata, msgspec.Struct, frozen=True, dict=True):
    """An item about to be stored; the store assigns its id. Its metadata reads typed as `meta` and `host`."""

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


class StoredItem(_TypedMetadata, msgspec.Struct, frozen=True, rename="camel", dict=True):
    """An item as stored; its JSON encoding is the `mcplhost messages --json` line.

    Field order is the export's key order, and no field has a default, so
    a null agent or participant is written as null, never left out. Its
    metadata reads typed as `meta` and `host`, which the export never holds.
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
        if items and conn.engine == POSTGRESQL:
            # Ids become visible in the order they are taken, whatever other writers do (store/order.py).
            await conn.execute("SELECT pg_advisory_xact_lock(?)", (ITEMS_ORDER_KEY,))
        if rows is None:
            rows = [item_row(item) for item in items]
            searched = None
        elif len(rows) != len(items):
            raise ValueError("rows given for items must be one per item")
        written: builtins.list[ItemWritten] = []
        for start in range(0, len(items), ROWS_PER_INSERT):
            end = start + ROWS_PER_INSERT
            written.extend(await _insert_chunk(conn, items[start:end], rows[start:end], searched))
        if conn.engine == POSTGRESQL:  # the newest id is only worth finding where other hosts listen
            newest = max((w.id for w in written if not w.duplicate), default=None)
            if newest is not None:  # other hosts' agents read after it
                await notify_at_commit(conn, ITEMS_CHANNEL, (str(newest),))
        return written

    async def is_stored(self, server_id: str, channel_id: str, message_id: str, dedup_digest: str) -> bool:
        """Whether a channel item with this redelivery key is stored (so delivering it again stores nothing)."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(_FIND_ORIGINAL, (channel_id, message_id, server_id, dedup_digest))
        return bool(rows)

    async def thread_of(self, server_id: str, channel_id: str, message_id: str) -> str | None:
        """The thread of the latest stored item with this message id in this channel, if any.

        A correction that names no thread inherits its original's (docs/provenance.md §2).
        """
        async with self._connections.read() as conn:
            rows = await conn.fetch(
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
            ((last,),) = await conn.fetch("SELECT coalesce(max(id), 0) FROM items")
            after = after_id
            if limit is not None:
                # The id just below the newest `limit` matching items (0 if there are fewer).
                rows = await conn.fetch(
                    f"SELECT id FROM items WHERE {where} AND id > ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                    (*params, after_id, limit),
                )
                after = next((row[0] for row in rows), after_id)
        while True:
            async with self._connections.read() as conn:
                rows = await conn.fetch(
                    f"SELECT {_COLUMNS} FROM items WHERE {where} AND id > ? AND id <= ? ORDER BY id LIMIT ?",
                    (*params, after, last, READ_PAGE_SIZE),
                )
            rows = builtins.list(rows)
            for row in rows:
                yield stored_item(row)
            if len(rows) < READ_PAGE_SIZE:
                return
            after = rows[-1][0]


    # --- reads for agents: catch-up, context, and the items of a wake ----------------

    async def last_id(self) -> int:
        """The newest item's id (0 when the store is empty): where a new agent's cursor starts."""
        async with self._connections.read() as conn:
            ((last,),) = await conn.fetch("SELECT coalesce(max(id), 0) FROM items")
        return int(last)

    async def after(self, item_id: int, *, since_ms: int = 0, limit: int | None = None) -> builtins.list[StoredItem]:
        """Items with an id above `item_id` created at or after `since_ms`, oldest first (catch-up).

        With `limit`, the first `limit` of them; page on by passing the last id returned.
        """
        return [stored_item(row) for row in await self._rows_after(_COLUMNS, item_id, since_ms, limit)]

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
            sql = f"SELECT {columns} FROM items WHERE id > ? AND created_at >= ? ORDER BY id"
            if limit is None:
                return await conn.fetch(sql, (item_id, since_ms))
            return await conn.fetch(sql + " LIMIT ?", (item_id, since_ms, limit))

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
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM items WHERE {where} ORDER BY id DESC LIMIT ?", (*params, limit))
        return [stored_item(row) for row in reversed(builtins.list(rows))]

    async def own_after(self, agent: str, item_id: int, *, limit: int) -> builtins.list[StoredItem]:
        """The agent's own rows with an id above `item_id`, oldest first, at most `limit` (items_by_agent).

        A running turn reads its own rows with it, however many items others stored meanwhile.
        """
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM items WHERE agent = ? AND id > ? ORDER BY id LIMIT ?", (agent, item_id, limit))
        return [stored_item(row) for row in rows]

    async def newest_turn_drafts(self, agent: str) -> int:
        """The draft rows (prose not sent, docs/agents.md#drafts) of the agent's newest turn.

        Looked for among the agent's newest DRAFT_SCAN_ROWS rows, so the count
        costs the same however long the agent has run.
        """
        newest_turn = "(SELECT id FROM turns WHERE agent = ? ORDER BY started_at DESC, id DESC LIMIT 1)"
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT count(*) FROM (SELECT metadata FROM items WHERE agent = ? ORDER BY id DESC LIMIT ?) AS recent"
                f" WHERE {json_field(conn.engine, 'metadata', 'kind')} = 'draft'"
                f" AND {json_field(conn.engine, 'metadata', 'turnId')} = {json_int(conn.engine, newest_turn)}",
                (agent, DRAFT_SCAN_ROWS, agent))
        return int(next(iter(rows))[0])

    async def turn_drafts(self, agent: str, turn_id: int) -> builtins.list[tuple[int, str | None]]:
        """(row id, reason) of each draft row (docs/agents.md#drafts) the agent's turn left, by id (explain)."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT id, {json_field(conn.engine, 'metadata', 'reason')} FROM items WHERE agent = ?"
                f" AND {json_field(conn.engine, 'metadata', 'kind')} = 'draft'"
                f" AND {json_field(conn.engine, 'metadata', 'turnId')} = {json_int(conn.engine, '?')}"
                " ORDER BY id", (agent, turn_id))
        return [(row_id, reason if isinstance(reason, str) else None) for row_id, reason in rows]

    async def get_many(self, ids: Sequence[int]) -> builtins.list[StoredItem]:
        """The stored items among `ids`, by ascending id, each once; ids not stored are left out."""
        wanted = sorted(set(ids))
        found: builtins.list[StoredItem] = []
        async with self._connections.read() as conn:
            for start in range(0, len(wanted), IDS_PER_QUERY):
                chunk = wanted[start : start + IDS_PER_QUERY]
                rows = await conn.fetch(
                    f"SELECT {_COLUMNS} FROM items WHERE id IN ({', '.join('?' * len(chunk))}) ORDER BY id", chunk)
                found.extend(stored_item(row) for row in rows)
        return found


    # --- reads for the console: bounded windows of the newest rows --------------------

    async def newest(self, limit: int, *, before: int | None = None, server_id: str | None = None,
                     channel: str | None = None, agent: str | None = None,
                     window: int = CONSOLE_WINDOW_ROWS) -> builtins.list[StoredItem]:
        """Up to `limit` items with ids below `before` (default: all), newest first, among the `window` ids below it.

        The id window bounds the scan whatever the filters (`server_id`,
        `channel`, `agent`: exact), so a filter that matches nothing costs
        `window` rows at most; the next page starts below the window.
        """
        if before is None:
            before = await self.last_id() + 1
        clauses, params = ["id < ?", "id >= ?"], builtins.list[int | str]([before, before - window])
        for column, value in (("server_id", server_id), ("channel_id", channel), ("agent", agent)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM items WHERE {' AND '.join(clauses)} ORDER BY id DESC LIMIT ?",
                (*params, limit))
        return [stored_item(row) for row in rows]

    async def turn_rows(self, agent: str, turn_id: int, *, after: int = 0,
                        window: int = CONSOLE_WINDOW_ROWS) -> builtins.list[StoredItem]:
        """The agent's rows a turn wrote (metadata `turnId`: speech, drafts, tool calls and results), by id.

        Looked for among the agent's first `window` rows above `after`: give an id just below the turn's
        (its first waking item's), since its rows follow them.
        """
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM (SELECT {_COLUMNS} FROM items WHERE agent = ? AND id > ? ORDER BY id LIMIT ?)"
                f" AS recent WHERE {json_field(conn.engine, 'metadata', 'turnId')} = {json_int(conn.engine, '?')}"
                " ORDER BY id", (agent, after, window, turn_id))
        return [stored_item(row) for row in rows]

    async def recent_drafts(self, agent: str, limit: int,
                            window: int = CONSOLE_WINDOW_ROWS) -> builtins.list[StoredItem]:
        """The agent's newest draft rows (docs/agents.md#drafts), newest first, among its newest `window` rows."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM (SELECT {_COLUMNS} FROM items WHERE agent = ? ORDER BY id DESC LIMIT ?)"
                f" AS recent WHERE {json_field(conn.engine, 'metadata', 'kind')} = 'draft' ORDER BY id DESC LIMIT ?",
                (agent, window, limit))
        return [stored_item(row) for row in rows]

async def _insert_chunk(conn: Conn, items: Sequence[NewItem], rows: Sequence[ItemRow],
                        searched: object) -> builtins.list[ItemWritten]:
    """One INSERT of up to ROWS_PER_INSERT items, inside the caller's transaction on `conn`."""
    if conn.engine == POSTGRESQL:
        placeholders = _PG_ROW_PLACEHOLDERS
        rows = [_pg_row(row) for row in rows]
    else:
        placeholders = _ROW_PLACEHOLDERS
    statement = (f"INSERT INTO items ({_INSERT_COLUMNS}) VALUES {', '.join([placeholders] * len(rows))}"
                 " ON CONFLICT DO NOTHING RETURNING id")
    values = builtins.list(chain.from_iterable(rows))
    # `searched`: the writer's connection (store/redacting.py) skips a search already made for the same secrets
    returned = await conn.fetch(statement, values, searched=searched)
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
        inserted.extend(await conn.fetch(
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


async def _original(conn: Conn, key: tuple[Any, ...]) -> ItemWritten:
    rows = await conn.fetch(_FIND_ORIGINAL, key)
    for item_id, conversation in rows:
        return ItemWritten(item_id, True, conversation)
    raise HostStateError(f"an item conflicted on {key!r} but no original has that key")


def _filters(*, channel: str | None, agent: str | None, since_ms: int | None = None) -> tuple[str, tuple[Any, ...]]:
    clauses: builtins.list[str] = ["TRUE"]
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


#: Where `item_row` puts the content and metadata JSON.
_CONTENT = [c.strip() for c in _INSERT_COLUMNS.split(",")].index("content")
_METADATA = [c.strip() for c in _INSERT_COLUMNS.split(",")].index("metadata")
#: PostgreSQL's json columns take the JSON as text (no cast: text has no assignment cast to json).
_PG_ROW_PLACEHOLDERS = "(" + ", ".join("?" * len(_INSERT_COLUMNS.split(","))) + ")"


def _pg_row(row: ItemRow) -> ItemRow:
    """`row` as PostgreSQL takes it: content and metadata as text, the metadata's NULs readable (`readable_json`)."""
    values = builtins.list(row)
    values[_CONTENT] = row[_CONTENT].decode()
    values[_METADATA] = readable_json(row[_METADATA].decode())
    return tuple(values)


#: A JSON `\u0000` escape (after an even run of backslashes, so not an escaped backslash's `u0000`).
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def readable_json(text: str) -> str:
    """JSON text whose members PostgreSQL can read (`->>`): its `\u0000` escapes as U+FFFD's.

    PostgreSQL's `->>` and `->` unescape every string of the document they read, and text cannot hold NUL, so
    one NUL anywhere in a row's metadata (an author's name, say) would fail every query reading a member of it.
    """
    return _NUL_ESCAPE.sub(r"\1\\ufffd", text) if "\\u0000" in text else text


_key_of = itemgetter(*_KEY_POSITIONS)


def row_content(row: ItemRow) -> bytes:
    """The content column's value in `row`: the item's content blocks as compact JSON (UTF-8)."""
    return row[_CONTENT]  # type: ignore[no-any-return]


def _key(row: ItemRow) -> tuple[Any, ...] | None:
    """The row's `_KEY_COLUMNS` values, or None when the unique index does not constrain it (a null among them)."""
    key = _key_of(row)
    return None if None in key else key


def stored_item(row: Sequence[Any]) -> StoredItem:
    """A row of `STORED_COLUMNS` as its `StoredItem`."""
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
