"""The store on PostgreSQL: an asyncpg pool, the same repositories and SQL, PostgreSQL's migrations.

The only module that imports asyncpg (pyproject's import-linter contract), and only
when a `postgresql://` target is opened (store/open.py imports it lazily).

- `PgConn` runs the repositories' SQL: `?` placeholders numbered `$1…$n`
  (outside quoted text; cached per statement), rows as tuples, the rowcount
  read from the command tag ("UPDATE 3").
- `PgDatabase` is `Connections`: a transaction is one pooled connection
  between BEGIN and COMMIT (READ COMMITTED), joined by nested use in the same
  task as on SQLite, one task's at a time in this process (the repositories'
  in-memory state assumes it; the group writer is one task anyway); reads
  outside it take a pooled connection in autocommit, so each statement reads
  its own snapshot and never waits for a commit (MVCC: the WAL readers' promise).
- Items are inserted under the order lock (store/order.py), so ids become
  visible in the order they were taken, as SQLite's single writer gives.
- Migrations: migrations/postgresql/, each file whole in one transaction
  behind an advisory lock, recorded in the same `schema_version` table.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import anyio
import asyncpg  # type: ignore[import-untyped]  # no stubs; this module is its only user
import structlog

from mcplhost.errors import HostStateError
from mcplhost.secrets import Secrets
from mcplhost.store.composed import Store
from mcplhost.store.connection import POSTGRESQL, Conn, Engine, Params, Session
from mcplhost.store.errors import BrokenMigration, StoreError, StoreMissing
from mcplhost.store.interfaces import SearchReads
from mcplhost.store.migrate import (
    Migration,
    applied_versions,
    load_migrations,
    refuse_foreign,
    refuse_newer,
    refuse_unusable,
)
from mcplhost.store.open import redacted_url, server_of
from mcplhost.store.order import MIGRATION_KEY
from mcplhost.store.pg_search import PgSearchIndex, PgSearchReads
from mcplhost.store.redacting import RedactingWriter
from mcplhost.store.retention import RetentionRepository

log = structlog.get_logger()

#: Connections a reader (`open_reader`: the CLI) holds at most.
READER_POOL_SIZE = 2
#: Connections the pool keeps open when idle.
POOL_MIN_SIZE = 1
#: Seconds one attempt to reach the server may take (asyncpg's connect timeout).
CONNECT_TIMEOUT_S = 10
#: Seconds an opener keeps trying a server it cannot reach (one starting beside the host), then gives up.
CONNECT_DEADLINE_S = 30
#: The backoff between attempts: first, and at most.
CONNECT_RETRY_FIRST_S = 0.25
CONNECT_RETRY_MAX_S = 5.0
#: Distinct statements whose numbered form is kept (the repositories have a few hundred).
NUMBERED_CACHE = 1024
#: A session that sits in an open transaction this long is ended by the server (a stuck host holds no locks).
IDLE_IN_TRANSACTION_MS = 60_000
#: What the server shows in pg_stat_activity for our sessions.
APPLICATION_NAME = "mcplhost"
#: PostgreSQL text cannot hold NUL; a parameter's NUL is stored as this instead (SQLite keeps it).
NUL_REPLACEMENT = "\ufffd"

_OPEN_EXPLANATION = ("check that store.url names a reachable PostgreSQL database this user may use "
                     "(host, port, user, password, database)")
_READ_EXPLANATION = "check that --db names an mcplhost database on a reachable server"

_CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    BIGINT PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at BIGINT NOT NULL
)
"""

# The database whose transaction the current task is inside, if any.
_current_transaction: ContextVar[PgDatabase | None] = ContextVar("pg_store_transaction", default=None)

# A quoted literal, a quoted identifier, a line comment, or a `?`.
_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|\?")


@functools.lru_cache(maxsize=NUMBERED_CACHE)
def numbered(sql: str) -> str:
    """`sql` with each `?` placeholder outside quotes and comments as `$1`, `$2`, … in order."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group() != "?":
            return match.group()
        count += 1
        return f"${count}"

    return _TOKENS.sub(number, sql)


def rowcount(status: str) -> int:
    """The rows a command changed, from its tag ("INSERT 0 5", "UPDATE 3", "DELETE 0"); -1 when it says none."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else -1


def _cleaned(params: Params) -> Sequence[Any]:
    return [value.replace("\x00", NUL_REPLACEMENT) if type(value) is str and "\x00" in value else value
            for value in params]


class PgConn:
    """Statements on one asyncpg connection as the engine-neutral `Conn`."""

    engine: Engine = POSTGRESQL

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.raw = conn

    async def fetch(self, sql: str, params: Params = (), *, searched: object = None) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await self.raw.fetch(numbered(sql), *_cleaned(params))]

    async def execute(self, sql: str, params: Params = ()) -> int:
        return rowcount(await self.raw.execute(numbered(sql), *_cleaned(params)))

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        await self.raw.executemany(numbered(sql), [_cleaned(row) for row in rows])

    async def listen(self, channel: str, heard: Callable[[str], None]) -> None:
        """LISTEN on `channel`; asyncpg calls `heard(payload)` on the event loop for each notification."""
        await self.raw.add_listener(channel, lambda _conn, _pid, _channel, payload: heard(payload))

    def on_lost(self, lost: Callable[[], None]) -> None:
        self.raw.add_termination_listener(lambda _conn: lost())


class PgDatabase:
    """A pool of connections as the repositories' `Connections` (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool, secrets: Secrets | None = None) -> None:
        self.pool = pool
        #: Redacted from every parameter a repository writes with (the host fills it: `Store.secrets`).
        self.secrets = secrets if secrets is not None else Secrets()
        self._lock = anyio.Lock()
        self._writer: RedactingWriter | None = None
        self._own: PgConn | None = None

    @property
    def engine(self) -> Engine:
        return POSTGRESQL

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """BEGIN ... COMMIT on one pooled connection, rolled back on any error or cancellation.

        Nested use in the same task joins the outer transaction, as on SQLite.
        """
        if _current_transaction.get() is self:
            yield
            return
        async with self._lock, self.pool.acquire() as conn:
            token = _current_transaction.set(self)
            self._own = PgConn(conn)
            self._writer = RedactingWriter(self._own, self.secrets)
            try:
                with anyio.CancelScope(shield=True):
                    await conn.execute("BEGIN")
                try:
                    yield
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        await _rollback(conn)
                    raise
                with anyio.CancelScope(shield=True):
                    try:
                        await conn.execute("COMMIT")
                    except BaseException:
                        await _rollback(conn)
                        raise
            finally:
                self._own = self._writer = None
                _current_transaction.reset(token)

    def writers_waiting(self) -> int:
        """How many tasks of this process wait now for the writer's turn."""
        return self._lock.statistics().tasks_waiting

    def writer(self, operation: str) -> Conn:
        """The transaction's connection for the current task; HostStateError naming `operation` outside one."""
        if _current_transaction.get() is not self or self._writer is None:
            raise HostStateError(f"{operation} must run inside store.transaction()")
        return self._writer

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Conn]:
        """A pooled connection in autocommit (inside this task's transaction: the transaction's own)."""
        if _current_transaction.get() is self and self._own is not None:
            yield self._own
            return
        async with self.pool.acquire() as conn:
            yield PgConn(conn)


async def _rollback(conn: asyncpg.Connection) -> None:
    """End the connection's transaction; a connection that cannot is closed (the pool replaces it)."""
    try:
        await conn.execute("ROLLBACK")
    except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError):
        conn.terminate()


class PgStore(Store):
    """A store in a PostgreSQL database."""

    def __init__(self, url: str, database: PgDatabase, migrations_folder: Traversable | Path | None) -> None:
        super().__init__(database, PgSearchIndex(database))
        # Hosts may share this store: a retention pass takes its lock on a connection of its own (store/retention.py).
        self.retention = RetentionRepository(database, self.search_index, sessions=self.session)
        self.url = url
        self._database = database
        self._migrations_folder = migrations_folder

    @property
    def location(self) -> str:
        """The database's URL with its password replaced by ***."""
        return redacted_url(self.url)

    async def size_bytes(self) -> int:
        """The database's size as the server counts it (pg_database_size)."""
        async with self._database.read() as conn:
            ((size,),) = await conn.fetch("SELECT pg_database_size(current_database())")
        return int(size)

    def open_search_reads(self, interrupt: Callable[[], bool]) -> SearchReads:
        """A search's reads for the calling worker thread: pages on pooled connections (pg_search.py)."""
        return PgSearchReads(self._database, interrupt)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """A connection outside the pool (store/hosts.py holds its advisory locks on it), closed on exit."""
        try:
            raw = await asyncpg.connect(self.url, timeout=CONNECT_TIMEOUT_S,
                                        server_settings={"application_name": f"{APPLICATION_NAME}-session"})
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"{self.location}: cannot open the host's session connection: {_one_line(exc)}",
                             explanation=_OPEN_EXPLANATION) from exc
        try:
            yield PgConn(raw)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await raw.close(timeout=CONNECT_TIMEOUT_S)
                except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    raw.terminate()

    async def migrate(self) -> list[int]:
        async with self._database.pool.acquire() as conn:
            return await migrate_database(conn, load_migrations(self._migrations_folder, engine=POSTGRESQL),
                                          location=self.location)


async def migrate_database(conn: asyncpg.Connection, migrations: Sequence[Migration], *, location: str) -> list[int]:
    """Apply every pending migration in order on `conn` (autocommit); the versions applied.

    Each step runs whole in its own transaction after taking MIGRATION_KEY's advisory lock and checking its
    version again, so two hosts migrating at once apply each step once.
    """
    neutral = PgConn(conn)
    await refuse_foreign(neutral, path=location, known=migrations)
    refuse_newer(await applied_versions(neutral), len(migrations), path=location)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_KEY)
        await conn.execute(_CREATE_VERSION_TABLE)
    applied: list[int] = []
    for migration in migrations:
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_KEY)
                if await conn.fetchval("SELECT 1 FROM schema_version WHERE version = $1", migration.version):
                    continue
                await conn.execute(migration.sql)  # no parameters: the simple protocol, the whole file
                await conn.execute("INSERT INTO schema_version (version, name, applied_at)"
                                   " VALUES ($1, $2, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)",
                                   migration.version, migration.name)
        except asyncpg.PostgresError as exc:
            raise BrokenMigration(migration.version, migration.name, exc) from exc
        log.info("store.migration_applied", version=migration.version, name=migration.name)
        applied.append(migration.version)
    return applied


async def _pool(url: str, *, max_size: int, read_only: bool, explanation: str,
                connect_deadline_s: float) -> asyncpg.Pool:
    """A pool with one connection made; a server not reachable (yet: starting beside us) is tried again, with
    backoff, until `connect_deadline_s`, then named by host and port. A refusal (password, database) is final."""
    settings = {"application_name": APPLICATION_NAME,
                "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_MS)}
    if read_only:
        settings["default_transaction_read_only"] = "on"
    deadline = time.monotonic() + connect_deadline_s
    delay = CONNECT_RETRY_FIRST_S
    while True:
        remaining = deadline - time.monotonic()
        try:
            return await asyncpg.create_pool(url, min_size=min(POOL_MIN_SIZE, max_size), max_size=max_size,
                                             timeout=max(min(CONNECT_TIMEOUT_S, remaining), 0.1),
                                             server_settings=settings)
        except asyncpg.InvalidCatalogNameError as exc:
            raise StoreMissing(redacted_url(url)) from exc
        except asyncpg.InvalidPasswordError as exc:
            raise StoreError(f"{redacted_url(url)}: the server at {server_of(url)} refused the password",
                             explanation=explanation) from exc
        except (OSError, TimeoutError, asyncpg.CannotConnectNowError) as exc:
            if time.monotonic() + delay >= deadline:
                raise StoreError(f"{redacted_url(url)}: no PostgreSQL server reachable at {server_of(url)} within"
                                 f" {connect_deadline_s:g} s: {_one_line(exc)}", explanation=explanation) from exc
            # debug: a bad input is one plain line on stderr (docs/operations.md), the verdict below
            log.debug("store.server_unreachable", server=server_of(url), retry_s=delay, error=_one_line(exc))
            await anyio.sleep(delay)
            delay = min(delay * 2, CONNECT_RETRY_MAX_S)
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"{redacted_url(url)}: cannot use the database at {server_of(url)}: {_one_line(exc)}",
                             explanation=explanation) from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@asynccontextmanager
async def _pooled_store(url: str, *, max_size: int, read_only: bool, explanation: str,
                        migrations_folder: Traversable | Path | None,
                        connect_deadline_s: float) -> AsyncIterator[tuple[PgStore, asyncpg.Pool]]:
    """A store over a new pool (`_pool`), and the pool, closed on the way out whatever happens."""
    pool = await _pool(url, max_size=max_size, read_only=read_only, explanation=explanation,
                       connect_deadline_s=connect_deadline_s)
    try:
        yield PgStore(url, PgDatabase(pool), migrations_folder), pool
    finally:
        with anyio.CancelScope(shield=True):
            await pool.close()


@asynccontextmanager
async def open_pg_store(url: str, *, pool_size: int, migrate: bool = True,
                        migrations_folder: Traversable | Path | None = None,
                        connect_deadline_s: float = CONNECT_DEADLINE_S) -> AsyncIterator[PgStore]:
    """The daemon's read-write store in the database at `url`, its pool at most `pool_size` connections."""
    migrations = load_migrations(migrations_folder, engine=POSTGRESQL)
    async with _pooled_store(url, max_size=pool_size, read_only=False, explanation=_OPEN_EXPLANATION,
                             migrations_folder=migrations_folder, connect_deadline_s=connect_deadline_s) \
            as (store, pool):
        async with pool.acquire() as conn:
            if migrate:
                await migrate_database(conn, migrations, location=store.location)
            else:
                await refuse_unusable(PgConn(conn), migrations, path=store.location, current=False)
        yield store


@asynccontextmanager
async def open_pg_reader(url: str, *, migrations_folder: Traversable | Path | None = None,
                         connect_deadline_s: float = CONNECT_DEADLINE_S) -> AsyncIterator[PgStore]:
    """The database at `url`, read-only (the CLI's readers); its schema must be current."""
    migrations = load_migrations(migrations_folder, engine=POSTGRESQL)
    async with _pooled_store(url, max_size=READER_POOL_SIZE, read_only=True, explanation=_READ_EXPLANATION,
                             migrations_folder=migrations_folder, connect_deadline_s=connect_deadline_s) \
            as (store, pool):
        async with pool.acquire() as conn:
            await refuse_unusable(PgConn(conn), migrations, path=store.location, current=True)
        yield store
