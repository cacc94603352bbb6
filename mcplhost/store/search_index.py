"""The search index on SQLite, written off the ack path: what it holds, the indexer that keeps it, its deletes.

What is indexed is what a search reads (`body_text`: the body's text blocks joined with nothing between,
the stored source header skipped), for every item, agents' own rows too (a search's filter leaves
them out where it must). The table is `items_search` (migration 0009): FTS5 with the `trigram` tokenizer,
contentless (`content=''`: no second copy of the bodies), `detail=none` and `columnsize=0` (no positions,
no sizes: a search asks only which rows hold all of some trigrams, and the rows' own text confirms each
match), which keeps it near the bodies' size on disk (docs/operations.md#searching).

An item is acknowledged to its connector when it is committed, as before; the index follows later.
`SqliteSearchIndex.index_next` indexes the next items above the high-water mark
(`search_index.indexed_to`: every item at or below it is indexed) in one short write transaction
on the writer's connection, and moves the mark with them; `run_indexer` is the daemon's task that calls it
in small batches, pausing between them so inbound commits keep most of the writer. A search answers
from the index at or below the mark and reads the rows above it (store/search_reader.py), so a fresh
item is found at once, and a store migrated with items in it is searchable, only slower, while its index
is built in the background.

The text is made inside SQLite by the function BODY_FUNCTION (`index_text`), registered on the
writer's connection: the bodies never pass through Python parameters, so the writer's secret redaction
(db.py RedactingWriter) does not search them again; they were redacted when stored. A contentless table
forgets a row only when told its exact text: retention (store/retention.py) calls `forget_nocommit`
in its delete's transaction, which gives the text again from the same stored row with the same function.
A release that changes `body_text` must empty the table and set the mark to 0 in a migration, so the
index is built again under the new rule.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import aiosqlite
import anyio
import msgspec
import structlog

from mcplhost.inbound.notice import reader_body
from mcplhost.store.connection import Connections

log = structlog.get_logger()

#: The SQL function that gives a stored row's indexed text: BODY_FUNCTION(content, metadata).
BODY_FUNCTION = "mcplhost_body_text"
#: Items indexed per transaction: a few milliseconds of the writer's time, so an inbound commit hardly waits.
INDEX_BATCH_ROWS = 500
#: How often the indexer looks for new items once it has caught up (a search reads the rows above the mark).
INDEX_POLL_S = 0.25
#: While items arrive, the indexer pauses after a full batch this many times as long as the batch took: building
#: or catching up beside inbound, it takes at most 1 / (1 + this) of the writer's time, inbound the rest.
INDEX_PAUSE_FACTOR = 4.0
#: How long the indexer waits after a failed batch (a locked or full disk) before it tries again.
INDEX_RETRY_S = 5.0
#: Items behind the mark at which the indexer logs that it is building (and then when it has caught up).
INDEX_BUILD_LOG_ROWS = 10_000
IDS_PER_STATEMENT = 900

_content_decoder = msgspec.json.Decoder(list[dict[str, Any]])


class _Header(msgspec.Struct):
    """The one member of an item's metadata `body_text` reads (decoding only it is a quarter of the cost)."""

    sourceHeader: Any = None


_header_decoder = msgspec.json.Decoder(_Header)


class IndexProgress(msgspec.Struct, frozen=True):
    """How far the index has got: every item with an id at or below `indexed_to` is in it."""

    indexed_to: int
    newest: int  # the newest item's id (0: none)

    @property
    def behind(self) -> int:
        """Ids above the mark: at most this many items a search reads row by row."""
        return max(0, self.newest - self.indexed_to)


def body_text(content: list[dict[str, Any]], metadata: dict[str, Any]) -> str:
    """The body's text blocks joined with nothing between, header dropped: what a search reads, and indexes."""
    return "".join(b["text"] for b in reader_body(content, metadata) if b.get("type") == "text")


def index_text(content: str, metadata: str) -> str:
    """BODY_FUNCTION: `body_text` of a stored row's JSON columns, as SQLite can hold it.

    Never raises (an error would fail the indexer's statement for good): a row it cannot read gives "".
    An unpaired surrogate becomes "?", one character for one, so no trigram around it moves.
    """
    try:
        text = body_text(_content_decoder.decode(content), {"sourceHeader": _header_decoder.decode(metadata).sourceHeader})
        if not text.isascii():
            text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()
    except Exception:  # a row that is not what the store writes: nothing of it is indexed, and the scan decides
        return ""
    return text


async def register_functions(conn: aiosqlite.Connection) -> None:
    """Give the writer's connection BODY_FUNCTION, which the indexer and retention's deletes call."""
    await conn.create_function(BODY_FUNCTION, 2, index_text, deterministic=True)


class SqliteSearchIndex:
    """The index's writes (the indexer's batches, retention's forgetting) and its progress, on SQLite."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def index_next(self, limit: int = INDEX_BATCH_ROWS) -> int:
        """Index the next `limit` items above the mark and move it past them, in one transaction; how many."""
        async with self._connections.transaction():
            conn = self._connections.writer("search_index.index_next")
            ((mark, count, last),) = await conn.execute_fetchall(
                "SELECT indexed_to, (SELECT count(*) FROM (SELECT id FROM items WHERE id > indexed_to"
                " ORDER BY id LIMIT ?)), (SELECT max(id) FROM (SELECT id FROM items WHERE id > indexed_to"
                " ORDER BY id LIMIT ?)) FROM search_index", (limit, limit))
            if not count:
                return 0
            await conn.execute(f"INSERT INTO items_search (rowid, body) SELECT id, {BODY_FUNCTION}(content, metadata)"
                               " FROM items WHERE id > ? AND id <= ?", (mark, last))
            await conn.execute("UPDATE search_index SET indexed_to = ?", (last,))
            return int(count)

    async def forget_nocommit(self, ids: Sequence[int]) -> None:
        """Take the items `ids` out of the index, inside the caller's transaction, before it deletes them."""
        conn = self._connections.writer("search_index.forget_nocommit")
        for start in range(0, len(ids), IDS_PER_STATEMENT):
            chunk = list(ids[start : start + IDS_PER_STATEMENT])
            await conn.execute(
                f"INSERT INTO items_search (items_search, rowid, body) SELECT 'delete', id,"
                f" {BODY_FUNCTION}(content, metadata) FROM items WHERE id IN ({', '.join('?' * len(chunk))})"
                " AND id <= (SELECT indexed_to FROM search_index)", chunk)

    async def progress(self) -> IndexProgress:
        """The mark and the newest item's id, read together (one statement, one snapshot)."""
        async with self._connections.read() as conn:
            ((mark, newest),) = await conn.execute_fetchall(
                "SELECT (SELECT indexed_to FROM search_index), (SELECT coalesce(max(id), 0) FROM items)")
        return IndexProgress(indexed_to=mark, newest=newest)


async def run_indexer(index: SqliteSearchIndex, *, batch_rows: int = INDEX_BATCH_ROWS,
                      poll_s: float = INDEX_POLL_S) -> None:
    """The daemon's task: index what is above the mark, a batch at a time, and then what arrives.

    Behind by more than a batch (a build, or a catch-up after a flood), it goes on at once while no item
    arrives, and while items do, it pauses after each batch INDEX_PAUSE_FACTOR times as long as the batch
    took, leaving most of the writer to inbound. Caught up, it looks again every `poll_s`.
    """
    building: tuple[float, int] | None = None  # (started, items indexed so far) while a large backlog is built
    last_newest = -1
    while True:
        try:
            progress = await index.progress()
            arriving = progress.newest != last_newest  # items came in since the last batch began: inbound is busy
            last_newest = progress.newest
            if building is None and progress.behind >= INDEX_BUILD_LOG_ROWS:
                log.info("store.index_building", behind=progress.behind)
                building = (time.monotonic(), 0)
            began = time.monotonic()
            indexed = await index.index_next(batch_rows)
            took = time.monotonic() - began
        except Exception:  # a failed batch (disk full, a locked file) is tried again; the host goes on
            log.error("store.index_failed", exc_info=True)
            await anyio.sleep(INDEX_RETRY_S)
            continue
        if building is not None:
            building = (building[0], building[1] + indexed)
        if indexed < batch_rows:
            if building is not None:
                log.info("store.index_built", items=building[1], seconds=round(time.monotonic() - building[0], 1))
                building = None
            await anyio.sleep(poll_s)
        else:
            await anyio.sleep(took * INDEX_PAUSE_FACTOR if arriving else 0)
