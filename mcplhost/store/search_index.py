"""The search index on SQLite, written off the ack path: what it holds, the indexer that keeps it, its deletes.

What is indexed is what a search reads (`body_text`: the body's text blocks joined with nothing between,
the stored source header skipped), for every item, agents' own rows too (a search's filter leaves
them out where it must). The table is `items_search` (migrations/sqlite/*_search_index.sql): FTS5 with the `trigram` tokenizer,
contentless (`content=''`: no second copy of the bodies), `detail=none` and `columnsize=0` (no positions,
no sizes: a search asks only which rows hold all of some trigrams, and the rows' own text confirms each
match), which keeps it near the bodies' size on disk (docs/operations.md#searching).

An item is acknowledged to its connector when it is committed, as before; the index follows later.
`SqliteSearchIndex.index_next` indexes the next items above the high-water mark
(`search_index.indexed_to`: every item at or below it is indexed) in one short write transaction
on the writer's connection, and moves the mark with them; `run_indexer` is the daemon's task that calls it
in small batches, and merges the index's segments in steps as short (`merge_step`), pausing when inbound
commits had to wait for it. A search answers
from the index at or below the mark and reads the rows above it (store/search_reader.py), so a fresh
item is found at once, and a store migrated with items in it is searchable, only slower, while its index
is built in the background.

The text is made inside SQLite by the function BODY_FUNCTION (`index_text`), registered on the
writer's connection: the bodies never pass through Python parameters, so the writer's secret redaction
(db.py RedactingWriter) does not search them again; they were redacted when stored. A contentless table
forgets a row only when told its exact text: retention (store/retention.py) calls `forget_nocommit`
in its delete's transaction, which gives the text again from the same stored row with the same function.
Were the text given then to differ from the text indexed (a release that changes `body_text` or
`reader_body`), the row's old trigrams would stay: candidates for an id no longer in items, which the
search's join drops, so no result is wrong, but the index holds them. Such a release empties the table and
sets the mark to 0 in a migration, so the index is built again under the new rule.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import structlog

from mcplhost.inbound.notice import reader_body
from mcplhost.store.connection import Conn, Connections
from mcplhost.store.interfaces import SearchIndex
from mcplhost.store.search_query import IndexProgress

log = structlog.get_logger()

#: The SQL function that gives a stored row's indexed text: BODY_FUNCTION(content, metadata).
BODY_FUNCTION = "mcplhost_body_text"
#: Items indexed per transaction: a few milliseconds of the writer's time, so an inbound commit hardly waits.
INDEX_BATCH_ROWS = 500
#: How often the indexer looks for new items once it has caught up (a search reads the rows above the mark).
INDEX_POLL_S = 0.25
#: After a round whose transactions kept other writers waiting, the indexer pauses this many times as long as
#: they took: building or catching up beside inbound, it takes at most 1 / (1 + this) of the writer's time.
INDEX_PAUSE_FACTOR = 2.0
#: ... but never longer than this (a WAL checkpoint in a round's commit can make one round long).
INDEX_PAUSE_MAX_S = 0.5
#: Pages one merge of the index's segments writes at most (FTS5 'merge'): a transaction of a few milliseconds.
INDEX_MERGE_PAGES = 64
#: Merges after a batch that caught up, at most, while there is merging to do (a batch behind gets one): enough
#: to keep up with the segments the batches add (each row is merged again once per level, a handful of levels at
#: a million rows). New items come first, so a flood leaves merging for after it; FTS5's crisis merge (16
#: segments on one level) bounds how far behind it gets.
INDEX_MERGES_PER_BATCH = 4
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


def body_text(content: list[dict[str, Any]], header: str | None) -> str:
    """The body's text blocks joined with nothing between, header (`metadata.sourceHeader`) dropped: what a
    search reads, and indexes."""
    return "".join(b["text"] for b in reader_body(content, header) if b.get("type") == "text")


def index_text(content: str, metadata: str) -> str:
    """BODY_FUNCTION: `body_text` of a stored row's JSON columns, as SQLite can hold it.

    Never raises (an error would fail the indexer's statement for good): a row it cannot read gives "".
    An unpaired surrogate becomes "?", one character for one, so no trigram around it moves.
    """
    try:
        header = _header_decoder.decode(metadata).sourceHeader
        text = body_text(_content_decoder.decode(content), header if isinstance(header, str) else None)
        if not text.isascii():
            text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()
    except Exception:  # a row that is not what the store writes: nothing of it is indexed, and the scan decides
        return ""
    return text


class IndexWrites:
    """The index's transactions on the writer's connection, and how long they held other writers up: what both
    engines' index share."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections
        #: Seconds the index's transactions (BEGIN to COMMIT, not the wait for the writer) took so far, counting
        #: only those that ended with another writer waiting: the time they held inbound commits up.
        self.contended_s = 0.0

    @asynccontextmanager
    async def _holding(self, operation: str) -> AsyncIterator[Conn]:
        """A transaction on the writer's connection, counted in `contended_s` when another writer waits at its end."""
        async with self._connections.transaction():
            began = time.monotonic()
            yield self._connections.writer(operation)
            waiting = self._connections.writers_waiting()
        if waiting:
            self.contended_s += time.monotonic() - began


class SqliteSearchIndex(IndexWrites):
    """The index's writes (the indexer's batches, retention's forgetting) and its progress, on SQLite."""

    async def index_next(self, limit: int = INDEX_BATCH_ROWS) -> int:
        """Index the next `limit` items above the mark and move it past them, in one transaction; how many."""
        async with self._holding("search_index.index_next") as conn:
            ((mark, count, last),) = await conn.fetch(
                "SELECT indexed_to, (SELECT count(*) FROM (SELECT id FROM items WHERE id > indexed_to"
                " ORDER BY id LIMIT ?)), (SELECT max(id) FROM (SELECT id FROM items WHERE id > indexed_to"
                " ORDER BY id LIMIT ?)) FROM search_index", (limit, limit))
            if not count:
                return 0
            await conn.execute(f"INSERT INTO items_search (rowid, body) SELECT id, {BODY_FUNCTION}(content, metadata)"
                               " FROM items WHERE id > ? AND id <= ?", (mark, last))
            await conn.execute("UPDATE search_index SET indexed_to = ?", (last,))
            return int(count)

    async def merge_step(self, pages: int = INDEX_MERGE_PAGES) -> bool:
        """Merge some of the index's segments (at most about `pages` pages written), in one transaction; whether
        there was any to merge (FTS5: fewer than 2 changes means none)."""
        async with self._holding("search_index.merge_step") as conn:
            # total_changes() counts FTS5's writes to its own tables too (the statement's rowcount does not).
            ((before,),) = await conn.fetch("SELECT total_changes()")
            await conn.execute("INSERT INTO items_search (items_search, rank) VALUES ('merge', ?)", (pages,))
            ((after,),) = await conn.fetch("SELECT total_changes()")
            return int(after) - int(before) >= 2

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
            ((mark, newest),) = await conn.fetch(
                "SELECT (SELECT indexed_to FROM search_index), (SELECT coalesce(max(id), 0) FROM items)")
        return IndexProgress(indexed_to=mark, newest=newest)


async def run_indexer(index: SearchIndex, *, batch_rows: int = INDEX_BATCH_ROWS,
                      poll_s: float = INDEX_POLL_S) -> None:
    """The daemon's task: index what is above the mark, a batch at a time, and then what arrives.

    Each batch is followed by merges of the index's segments (INDEX_MERGES_PER_BATCH), each its own short
    transaction (FTS5's own merging, in the transaction of each write, would hold inbound commits up).
    Behind (a build, or a catch-up after a flood) or with merging left, it goes on at once, but after a round
    whose transactions kept other writers waiting (inbound commits, retention) it pauses INDEX_PAUSE_FACTOR
    times as long as those transactions took, so under load it takes at most 1 / (1 + INDEX_PAUSE_FACTOR) of
    the writer. Caught up with nothing to merge, it writes nothing and looks again every `poll_s`.
    """
    building: tuple[float, int] | None = None  # (started, items indexed so far) while a large backlog is built
    merging = True  # whether the last merge found more to do (at start: look)
    while True:
        try:
            progress = await index.progress()
            if not progress.behind and not merging:  # caught up and tidy: no transaction at all
                if building is not None:
                    log.info("store.index_built", items=building[1], seconds=round(time.monotonic() - building[0], 1))
                    building = None
                await anyio.sleep(poll_s)
                continue
            if building is None and progress.behind >= INDEX_BUILD_LOG_ROWS:
                log.info("store.index_building", behind=progress.behind)
                building = (time.monotonic(), 0)
            contended = index.contended_s
            indexed = await index.index_next(batch_rows) if progress.behind else 0
            # New items first: behind, one merge per batch; caught up, as many as there is work for.
            for _ in range(INDEX_MERGES_PER_BATCH if indexed < batch_rows else 1):
                merging = await index.merge_step()
                if not merging:
                    break
            held_up = index.contended_s - contended  # the writer's time others waited for while the round had it
        except Exception:  # a failed batch (disk full, a locked file) is tried again; the host goes on
            log.error("store.index_failed", exc_info=True)
            await anyio.sleep(INDEX_RETRY_S)
            continue
        if building is not None:
            building = (building[0], building[1] + indexed)
        await anyio.sleep(min(held_up * INDEX_PAUSE_FACTOR, INDEX_PAUSE_MAX_S))
