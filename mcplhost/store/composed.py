"""The store as its callers see it, whatever the engine: the repositories composed over one `Connections`.

sqlite.py's `SqliteStore` (store/db.py) and postgres.py's `PgStore` add how each
engine opens, migrates, measures and scans; everything else is here, so the
host, the CLI and the tests hold one type (docs/architecture.md#the-store).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

import anyio

from mcplhost.secrets import Secrets
from mcplhost.store.connection import Connections, Engine, Session
from mcplhost.store.cursors import CursorRepository
from mcplhost.store.decisions import DecisionRepository
from mcplhost.store.interfaces import SearchIndex, SearchReads
from mcplhost.store.items import ItemRepository
from mcplhost.store.migrate import applied_versions
from mcplhost.store.outbox import OutboxRepository
from mcplhost.store.peers import PeerRepository
from mcplhost.store.pushes import PushRepository
from mcplhost.store.quotas import QuotaRepository
from mcplhost.store.retention import RetentionRepository
from mcplhost.store.turns import TurnRepository

#: Worker threads scanning one store at once (searches: CPU work whose cost a query's author controls).
SCAN_WORKERS = 2


class StoreConnections(Connections, Protocol):
    """An engine's connections as the store composes them: the repositories' port plus the secrets it redacts."""

    @property
    def secrets(self) -> Secrets:
        ...


class Store:
    """An open database: repositories for items, push events, turns, cursors, the outbox, the peer queue,
    retention, quota usage and the search index, and `transaction()` to combine them.

    The implementation of `interfaces.Repositories`: it composes the repositories over one engine's
    connections, which each sees only as `Connections`.
    """

    #: The database file: an SQLite store's only (PostgreSQL's has none), kept while callers still read it;
    #: `location` names either.
    path: Path

    def __init__(self, database: StoreConnections, search_index: SearchIndex, *,
                 scan_slots: anyio.Semaphore | None = None) -> None:
        self.engine: Engine = database.engine
        self.items = ItemRepository(database)
        self.pushes = PushRepository(database)
        self.turns = TurnRepository(database)
        self.cursors = CursorRepository(database)
        self.outbox = OutboxRepository(database)
        self.peers = PeerRepository(database)
        #: The search index's writes and progress (store/search_index.py); searches read it in their worker.
        self.search_index = search_index
        self.retention = RetentionRepository(database, search_index)
        self.quotas = QuotaRepository(database)
        self.decisions = DecisionRepository(database)
        #: The secret values redacted from every row written (docs/agents.md#secrets); the host fills it in place
        #: (`Secrets.update`) and shares it with whatever withholds them.
        self.secrets = database.secrets
        #: Held while a worker thread scans this store (a search).
        self.scan_slots = scan_slots if scan_slots is not None else anyio.Semaphore(SCAN_WORKERS)
        self._connections = database

    @property
    def location(self) -> str:
        """Where the store is, for people: a file's path, or a URL with its password replaced by ***."""
        raise NotImplementedError

    async def size_bytes(self) -> int:
        """How many bytes the database takes."""
        raise NotImplementedError

    def open_search_reads(self, interrupt: Callable[[], bool]) -> SearchReads:
        """A search's reads for the calling worker thread (which closes them); `interrupt` True stops a statement."""
        raise NotImplementedError

    def session(self) -> AbstractAsyncContextManager[Session]:
        """A connection of its own, outside the pool, for session-level state (store/hosts.py's advisory locks):
        PostgreSQL only; an SQLite store has one daemon and nothing to share."""
        raise NotImplementedError

    async def migrate(self) -> list[int]:
        """Apply pending migrations now; return the versions applied."""
        raise NotImplementedError

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """One transaction across repositories, e.g. items and a push claim together.

        Use the repositories' `*_nocommit` methods inside it.
        """
        return self._connections.transaction()

    async def schema_version(self) -> int:
        """The newest migration applied to the database (0: none)."""
        async with self._connections.read() as conn:
            return max(await applied_versions(conn), default=0)
