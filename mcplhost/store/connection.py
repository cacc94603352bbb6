"""What a repository needs of an open store: `Connections` and the engine-neutral `Conn` it lends.

The repositories (items.py, pushes.py, turns.py, cursors.py, outbox.py, peers.py, …)
hold their SQL and take a `Connections`; sqlite.py and postgres.py implement it
and compose the repositories into a `Store`. So the repositories sit below the
engines and never import a driver (docs/architecture.md#the-store).

One SQL text runs on both engines: `?` placeholders (the PostgreSQL adapter
numbers them), the subset both engines read alike (docs/architecture.md#the-store).
Where a statement must differ, the repository picks it by `conn.engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

Engine = Literal["sqlite", "postgresql"]
SQLITE: Engine = "sqlite"
POSTGRESQL: Engine = "postgresql"

Params = Sequence[Any]


class Conn(Protocol):
    """One connection's statements, whatever the engine: rows come back as tuples."""

    @property
    def engine(self) -> Engine:
        ...

    async def fetch(self, sql: str, params: Params = (), *, searched: object = None) -> list[tuple[Any, ...]]:
        """Run one statement and return every row it yields.

        `searched`: the secrets version these parameters were already searched at (store/redacting.py reads
        it; an engine's own connection ignores it).
        """
        ...

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; how many rows it inserted, updated or deleted."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement once per parameter row."""
        ...


class Session(Conn, Protocol):
    """A connection of its own, outside the pool (`Store.session`): session-level locks, and notifications."""

    async def listen(self, channel: str, heard: Callable[[str], None]) -> None:
        """LISTEN on `channel`: `heard(payload)` is called for each NOTIFY on it for as long as the session lasts."""
        ...

    def on_lost(self, lost: Callable[[], None]) -> None:
        """Call `lost()` as soon as the connection is closed, whoever closed it (the server ending the session)."""
        ...


class Connections(Protocol):
    """The ways a repository reaches the store."""

    @property
    def engine(self) -> Engine:
        ...

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """BEGIN ... COMMIT on the writer's connection; nested use in one task joins the outer one."""
        ...

    def writer(self, operation: str) -> Conn:
        """The writer's connection, for statements of the current task's transaction.

        Raises HostStateError naming `operation` when the task is inside none.
        """
        ...

    def writers_waiting(self) -> int:
        """How many tasks wait now for the writer (a transaction that ends with some waiting held them up)."""
        ...

    def read(self) -> AbstractAsyncContextManager[Conn]:
        """A connection that reads committed rows without the writer's lock (inside a transaction: the writer's)."""
        ...


def json_field(engine: Engine, column: str, key: str) -> str:
    """SQL for `column`'s top-level JSON member `key` (NULL when absent); `key` is ours, never input.

    SQLite reads it typed (json_extract); PostgreSQL as text (`->>`), so compare a number with `json_int`.
    """
    if engine == POSTGRESQL:
        return f"({column}->>'{key}')"
    return f"json_extract({column}, '$.{key}')"


def json_int(engine: Engine, expression: str) -> str:
    """SQL for an integer `expression` (a parameter, a column) in the form `json_field` compares equal to."""
    if engine == POSTGRESQL:
        return f"CAST(CAST({expression} AS BIGINT) AS TEXT)"
    return expression


async def notify_at_commit(conn: Conn, channel: str, payloads: Iterable[str]) -> None:
    """NOTIFY `channel` once for each distinct payload, inside `conn`'s transaction: PostgreSQL delivers them at its
    COMMIT and never for a rollback (other hosts act on what is committed). Nothing on SQLite: one daemon per file."""
    if conn.engine != POSTGRESQL:
        return
    for payload in dict.fromkeys(payloads):
        await conn.fetch("SELECT pg_notify(?, ?)", (channel, payload))
