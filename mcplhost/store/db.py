"""The SQLite connections: pragmas, transactions, and opening a store.

The daemon holds one writer connection. aiosqlite runs its calls in order on
one worker thread; a lock here makes each transaction one task's at a time,
so two tasks never interleave statements inside one BEGIN ... COMMIT.

Beside it, a `StoreReader`: a few read-only connections to the same file.
The store runs in WAL mode, where a reader sees the last commit and never
waits for the writer, nor the writer for it; so the reads of items (context,
catch-up, search, the CLI) take no lock and hold up no commit, however long
they take (docs/architecture.md#the-store). A read inside the current
task's own transaction uses the writer's connection, to see what that
transaction wrote.

The turns ledger, the outbox, the peer queue, agents' cursors and push claims
read the same way: every repository reads with `read()`.

Cancellation: aiosqlite finishes a queued call even if the awaiting task is
cancelled, so BEGIN, COMMIT and ROLLBACK run shielded from anyio cancellation
(task groups, fail_after); a cancelled transaction body always ends in a
rollback queued after whatever was still in flight.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal, get_args

import aiosqlite
import anyio

from mcplhost.errors import HostStateError
from mcplhost.secrets import Secrets
from mcplhost.store.composed import SCAN_WORKERS, Store
from mcplhost.store.connection import SQLITE, Conn, Engine
from mcplhost.store.errors import StoreError, StoreMissing
from mcplhost.store.files import make_private
from mcplhost.store.migrate import applied_versions, load_migrations, refuse_foreign, refuse_newer, refuse_unusable
from mcplhost.store.migrate import migrate as apply_migrations
from mcplhost.store.redacting import RedactingWriter
from mcplhost.store.search_index import BODY_FUNCTION, SqliteSearchIndex, index_text
from mcplhost.store.search_reader import IndexReader
from mcplhost.store.sqlite_conn import SqliteConn

#: Read-only connections a daemon's `StoreReader` holds: reads beyond this many at once wait for one.
READER_CONNECTIONS = 2
#: SQLite virtual-machine steps between two checks whether a search's statement must stop (its deadline, a cancel).
SEARCH_PROGRESS_STEPS = 10_000

# How long a statement waits for another process's lock (a `mcplhost migrate`
# or a reader checkpointing) before failing with "database is locked".
BUSY_TIMEOUT_MS = 5000

# With WAL, NORMAL loses nothing when the process is killed (committed pages
# are in the OS's hands); a power loss can drop the last commits. FULL syncs
# the WAL on every commit and also survives power loss, at a cost per commit.
SynchronousLevel = Literal["OFF", "NORMAL", "FULL", "EXTRA"]
SYNCHRONOUS_LEVELS: tuple[SynchronousLevel, ...] = get_args(SynchronousLevel)
DEFAULT_SYNCHRONOUS: SynchronousLevel = "NORMAL"
#: The connection settings `apply_pragmas` makes that `Store.pragmas()` reads back.
REPORTED_PRAGMAS = ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")

_OPEN_EXPLANATION = (
    "check that store.path names an SQLite file (or a place to create one) "
    "that the mcplhost user can read and write"
)
#: The readers (messages, search, turns, outbox) are given their database with --db, not through the config.
_READ_EXPLANATION = "check that --db names an mcplhost database that this user can read"

# The database whose transaction the current task is inside, if any.
_current_transaction: ContextVar[Database | None] = ContextVar("store_transaction", default=None)


async def apply_pragmas(
    conn: aiosqlite.Connection,
    synchronous: str = DEFAULT_SYNCHRONOUS,
    *,
    read_only: bool = False,
) -> None:
    """Set every connection pragma mcplhost relies on; the one place they are set."""
    await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    await conn.execute("PRAGMA foreign_keys = ON")
    if read_only:
        await conn.execute("PRAGMA query_only = ON")
        return
    level = synchronous.upper()
    if level not in SYNCHRONOUS_LEVELS:
        raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_LEVELS)}, not {synchronous!r}")
    (mode,) = list(await conn.execute_fetchall("PRAGMA journal_mode = WAL"))[0]
    if mode.lower() != "wal":
        raise StoreError(
            f"the database refused WAL mode (journal mode is {mode!r})",
            explanation="put the database on a local filesystem; WAL does not work on network shares",
        )
    await conn.execute(f"PRAGMA synchronous = {level}")  # checked against the list above


class StoreReader:
    """Read-only connections to the store's file, lent one read at a time; they never take the writer's lock.

    A worker thread's scan (search) opens its own with `connect_read_only`,
    at most SCAN_WORKERS at once (`scan_slots`).
    """

    def __init__(self, path: Path, connections: list[aiosqlite.Connection]) -> None:
        if not connections:
            raise ValueError("a StoreReader needs at least one connection")
        self.path = path
        self._free = list(connections)
        self._lent = anyio.Semaphore(len(connections))  # a free connection for each token
        #: Held while a worker thread scans this store.
        self.scan_slots = anyio.Semaphore(SCAN_WORKERS)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[aiosqlite.Connection]:
        """A free read-only connection for one read (a few statements at most: a long hold delays checkpoints)."""
        async with self._lent:
            conn = self._free.pop()
            try:
                yield conn
            finally:
                self._free.append(conn)


class Database:
    """The writer's aiosqlite connection and the lock that gives its transactions to one task at a time.

    The SQLite implementation of `connection.Connections`, which is all the
    repositories see of it. `reader`: where `read()` reads outside a
    transaction; None shares the writer's connection and lock
    (`open_store(reader_connections=0)`, the path before the reader, kept
    for benchmarks).
    """

    def __init__(self, conn: aiosqlite.Connection, reader: StoreReader | None = None,
                 secrets: Secrets | None = None) -> None:
        self.conn = conn  # the writer's; a repository gets it only from `writer()`, inside a transaction
        self.reader = reader
        #: Redacted from every parameter a repository writes with (the host fills it: `Store.secrets`).
        self.secrets = secrets if secrets is not None else Secrets()
        self._redacting = RedactingWriter(SqliteConn(conn), self.secrets)
        self._lock = anyio.Lock()

    @property
    def engine(self) -> Engine:
        return SQLITE

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any error or cancellation.

        Nested use in the same task joins the outer transaction, which then
        commits or rolls back everything. Tasks started inside a transaction
        inherit it (contextvars), so do not hand the store to new tasks there.
        """
        if _current_transaction.get() is self:
            yield
            return
        async with self._lock:
            token = _current_transaction.set(self)
            try:
                try:
                    # BEGIN inside the try: should a plain asyncio cancel (which
                    # no shield stops) land here, the rollback below is queued
                    # after the BEGIN and undoes it.
                    with anyio.CancelScope(shield=True):
                        await self.conn.execute("BEGIN IMMEDIATE")
                    yield
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        await self.conn.rollback()
                    raise
                with anyio.CancelScope(shield=True):
                    try:
                        await self.conn.execute("COMMIT")
                    except BaseException:
                        await self.conn.rollback()  # a no-op if COMMIT got through
                        raise
            finally:
                _current_transaction.reset(token)

    def writers_waiting(self) -> int:
        """How many tasks wait now for the writer's lock (for their transaction or `reading()`)."""
        return self._lock.statistics().tasks_waiting

    def writer(self, operation: str) -> Conn:
        """The writer's connection for the current task's transaction; HostStateError naming `operation` outside one."""
        if _current_transaction.get() is not self:
            raise HostStateError(f"{operation} must run inside store.transaction()")
        return self._redacting

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[aiosqlite.Connection]:
        """Hold the writer's connection for reads: inside this task's transaction, or between transactions.

        This takes the writer's lock, so it waits for another task's transaction: the migrations hold
        the connection so. Repositories read with `read()`, which does not wait.
        """
        if _current_transaction.get() is self:
            yield self.conn
            return
        async with self._lock:
            yield self.conn

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Conn]:
        """A connection to read committed rows from without the writer's lock (the reader's).

        Inside the current task's transaction, the writer's own connection
        instead, which sees that transaction's rows.
        """
        if self.reader is None or _current_transaction.get() is self:
            async with self.reading() as conn:
                yield SqliteConn(conn)
            return
        async with self.reader.connection() as conn:
            yield SqliteConn(conn)


class SqliteStore(Store):
    """A store in an SQLite file: the writer's connection and the `StoreReader` beside it."""

    def __init__(self, path: Path, database: Database, migrations_folder: Traversable | Path | None) -> None:
        reader = database.reader
        super().__init__(database, SqliteSearchIndex(database),
                         scan_slots=reader.scan_slots if reader is not None else anyio.Semaphore(1))
        self.path = path
        #: The read-only connections reads go through (None: they share the writer's).
        self.reader = reader
        self._database = database
        self._migrations_folder = migrations_folder

    @property
    def location(self) -> str:
        """The database file's path."""
        return str(self.path)

    async def size_bytes(self) -> int:
        """The database file and its WAL, in bytes (a part not there counts 0)."""
        return await anyio.to_thread.run_sync(_file_bytes, self.path)

    def open_search_reads(self, interrupt: Callable[[], bool]) -> IndexReader:
        """A search's reads over a new read-only connection, for the calling worker thread (which closes it).

        `interrupt` is asked every SEARCH_PROGRESS_STEPS steps of SQLite's work: True stops the statement.
        """
        conn = connect_read_only(self.path)
        conn.set_progress_handler(interrupt, SEARCH_PROGRESS_STEPS)
        return IndexReader(conn)

    async def pragmas(self) -> dict[str, int | str]:
        """The writer connection's REPORTED_PRAGMAS as SQLite reports them now (synchronous as 0-3)."""
        async with self._database.reading():
            return {name: list(await self._database.conn.execute_fetchall(f"PRAGMA {name}"))[0][0]
                    for name in REPORTED_PRAGMAS}

    async def migrate(self) -> list[int]:
        """Apply pending migrations now; return the versions applied."""
        async with self._database.reading() as conn:  # holds the connection between transactions
            return await apply_migrations(conn, self._migrations_folder, path=str(self.path))


def _file_bytes(path: Path) -> int:
    total = 0
    for part in (path, path.with_name(path.name + "-wal")):
        try:
            total += part.stat().st_size
        except FileNotFoundError:
            pass
    return total


@asynccontextmanager
async def open_sqlite_store(
    path: str | Path,
    *,
    synchronous: str = DEFAULT_SYNCHRONOUS,
    migrate: bool = True,
    migrations_folder: Traversable | Path | None = None,
    reader_connections: int = READER_CONNECTIONS,
) -> AsyncIterator[SqliteStore]:
    """Open (creating folders and file if needed) the daemon's read-write store, and its `StoreReader`.

    The database file and SQLite's files beside it are private to this user (mcplhost/store/files.py).

    With `migrate` (the default) pending migrations are applied; without it
    the schema is only checked not to be newer than the code. Either way a
    newer database raises SchemaTooNew, and a file holding another
    application's tables raises ForeignDatabase before anything is written.
    `reader_connections=0`: no reader, every read shares the writer's lock
    (the path before the reader, kept for tests/bench).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"{path}: cannot create its folder: {exc}", explanation=_OPEN_EXPLANATION) from exc
    if not path.is_dir():  # a folder is SQLite's to refuse, in its own words
        try:
            make_private(path)
        except OSError as exc:
            raise StoreError(f"{path}: cannot open: {exc.strerror or exc}", explanation=_OPEN_EXPLANATION) from exc
    async with _connection(path, str(path), uri=False) as conn:
        try:
            await refuse_foreign(SqliteConn(conn), path=str(path), known=load_migrations(migrations_folder))
            await apply_pragmas(conn, synchronous)
            if migrate:
                await apply_migrations(conn, migrations_folder, path=str(path))
            else:
                newest = len(load_migrations(migrations_folder))
                refuse_newer(await applied_versions(SqliteConn(conn)), newest, path=str(path))
            # BODY_FUNCTION: what the search indexer and retention's deletes call on the writer's connection.
            await conn.create_function(BODY_FUNCTION, 2, index_text, deterministic=True)
        except sqlite3.Error as exc:
            raise _cannot_open(path, exc) from exc
        async with AsyncExitStack() as readers:
            # Opened after the migrations, so every reader sees the current schema.
            connections = [await readers.enter_async_context(_read_only_connection(path))
                           for _ in range(reader_connections)]
            reader = StoreReader(path, connections) if connections else None
            yield SqliteStore(path, Database(conn, reader), migrations_folder)


@asynccontextmanager
async def _read_only_connection(path: Path) -> AsyncIterator[aiosqlite.Connection]:
    async with _connection(path, _read_only_uri(path), uri=True) as conn:
        try:
            await apply_pragmas(conn, read_only=True)
        except sqlite3.Error as exc:
            raise _cannot_open(path, exc) from exc
        yield conn


def _read_only_uri(path: Path) -> str:
    return path.resolve().as_uri() + "?mode=ro"


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A new read-only sqlite3 connection to the store at `path`, for the calling (worker) thread; the caller closes it.

    Like the reader's, it never takes the writer's lock (WAL).
    """
    try:
        conn = sqlite3.connect(_read_only_uri(path), uri=True, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA query_only = ON")
    except sqlite3.Error as exc:
        raise _cannot_open(path, exc) from exc
    return conn


@asynccontextmanager
async def open_sqlite_reader(
    path: str | Path,
    *,
    migrations_folder: Traversable | Path | None = None,
) -> AsyncIterator[SqliteStore]:
    """Open an existing store read-only (for the CLI's readers, beside a running daemon).

    Raises StoreMissing when there is no file, ForeignDatabase when it holds
    another application's tables, SchemaTooNew when it is newer than the
    code, and SchemaBehind when it still needs migrations.
    """
    path = Path(path)
    if not path.is_file():
        raise StoreMissing(str(path))
    async with _connection(path, _read_only_uri(path), uri=True) as conn:
        try:
            await apply_pragmas(conn, read_only=True)  # query_only before anything is read
            await refuse_unusable(SqliteConn(conn), load_migrations(migrations_folder), path=str(path), current=True)
        except sqlite3.Error as exc:
            raise _cannot_open(path, exc, _READ_EXPLANATION) from exc
        # Nothing in this process writes: its one read-only connection is also its reader.
        yield SqliteStore(path, Database(conn, StoreReader(path, [conn])), migrations_folder)


@asynccontextmanager
async def _connection(path: Path, target: str, *, uri: bool) -> AsyncIterator[aiosqlite.Connection]:
    """An autocommit aiosqlite connection, closed (shielded) however the block ends."""
    try:
        # isolation_level=None: no implicit BEGINs; transactions are ours alone.
        conn = await aiosqlite.connect(target, uri=uri, isolation_level=None)
    except sqlite3.Error as exc:
        raise _cannot_open(path, exc) from exc
    try:
        yield conn
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()


def _cannot_open(path: Path, exc: sqlite3.Error, explanation: str = _OPEN_EXPLANATION) -> StoreError:
    return StoreError(f"{path}: cannot use the database: {exc}", explanation=explanation)
