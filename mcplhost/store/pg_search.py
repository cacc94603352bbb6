"""The search index's writes on PostgreSQL (pg_trgm, migrations/postgresql/*_search_index.sql).

The same `SearchIndex` as SQLite's FTS5 one (store/search_index.py): the indexer
follows the items by id, writing each body as searched (`index_text`, in Python:
the server cannot call it) into items_search, whose trigram GIN index PostgreSQL
keeps itself, so there is nothing to merge. The mark is safe to follow because
items' ids become visible in order (store/order.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from mcplhost.store.connection import Conn, Connections
from mcplhost.store.search_index import INDEX_BATCH_ROWS, index_text
from mcplhost.store.search_query import IndexProgress


class PgSearchIndex:
    """The index's writes (the indexer's batches, retention's forgetting) and its progress, on PostgreSQL."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections
        #: Seconds the index's transactions took that ended with another writer of this process waiting.
        self.contended_s = 0.0

    @asynccontextmanager
    async def _holding(self, operation: str) -> AsyncIterator[Conn]:
        async with self._connections.transaction():
            began = time.monotonic()
            yield self._connections.writer(operation)
            waiting = self._connections.writers_waiting()
        if waiting:
            self.contended_s += time.monotonic() - began

    async def index_next(self, limit: int = INDEX_BATCH_ROWS) -> int:
        """Index the next `limit` items above the mark and move it past them, in one transaction; how many."""
        async with self._holding("search_index.index_next") as conn:
            rows = await conn.fetch(
                "SELECT id, CAST(content AS TEXT), CAST(metadata AS TEXT) FROM items"
                " WHERE id > (SELECT indexed_to FROM search_index) ORDER BY id LIMIT ?", (limit,))
            if not rows:
                return 0
            await conn.executemany("INSERT INTO items_search (item_id, body) VALUES (?, ?) ON CONFLICT DO NOTHING",
                                   [(item_id, index_text(content, metadata)) for item_id, content, metadata in rows])
            await conn.execute("UPDATE search_index SET indexed_to = ?", (rows[-1][0],))
            return len(rows)

    async def merge_step(self, pages: int = 0) -> bool:
        """Nothing to merge: PostgreSQL maintains the GIN index itself."""
        return False

    async def forget_nocommit(self, ids: Sequence[int]) -> None:
        """Take the items `ids` out of the index, inside the caller's transaction, before it deletes them."""
        conn = self._connections.writer("search_index.forget_nocommit")
        await conn.execute("DELETE FROM items_search WHERE item_id = ANY(CAST(? AS BIGINT[]))", (list(ids),))

    async def progress(self) -> IndexProgress:
        """The mark and the newest item's id, read together (one statement, one snapshot)."""
        async with self._connections.read() as conn:
            ((mark, newest),) = await conn.fetch(
                "SELECT (SELECT indexed_to FROM search_index), (SELECT coalesce(max(id), 0) FROM items)")
        return IndexProgress(indexed_to=mark, newest=newest)
