"""What a repository needs of an open store's connections: a Protocol, so repositories never see `db.Database`.

The repositories (items.py, pushes.py, turns.py, cursors.py, outbox.py, peers.py) hold
their SQL and take a `Connections`; db.py implements it with the writer's
connection, its lock and the `StoreReader`, and composes the repositories
into a `Store`. So the repositories sit below db.py and no import goes back
up (docs/architecture.md#the-store).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

import aiosqlite


class Connections(Protocol):
    """The ways a repository reaches SQLite (db.py's `Database` also has `reading()`, for the migrations)."""

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """BEGIN IMMEDIATE ... COMMIT on the writer's connection; nested use in one task joins the outer one."""
        ...

    def writer(self, operation: str) -> aiosqlite.Connection:
        """The writer's connection, for statements of the current task's transaction.

        Raises HostStateError naming `operation` when the task is inside none.
        """
        ...

    def writers_waiting(self) -> int:
        """How many tasks wait now for the writer (a transaction that ends with some waiting held them up)."""
        ...

    def read(self) -> AbstractAsyncContextManager[aiosqlite.Connection]:
        """A connection that reads committed rows without the writer's lock (inside a transaction: the writer's)."""
        ...
