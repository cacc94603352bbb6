"""Schema migrations: numbered `.sql` files applied in order, the mautrix way.

Each file `NNNN_name.sql` in an engine's migrations folder (migrations/sqlite/,
migrations/postgresql/: the same numbers and names, each engine's SQL) is one step. Versions start
at 1 and have no gaps. Every step runs in its own `BEGIN IMMEDIATE`
transaction together with its row in `schema_version`, so a step is either
applied and recorded or not there at all (SQLite's DDL is transactional).
A database carrying a version newer than the newest file is refused with
`SchemaTooNew`: the code cannot know what that schema means.

The folder is `mcplhost/_migrations` inside an installed wheel (pyproject's
force-include maps the repository's top-level `migrations/` there), else the
repository's `migrations/` next to the package (editable installs, tests).

Why the runner splits statements itself: `sqlite3.executescript` commits any
open transaction before it starts, so it cannot run a step inside a
transaction the runner controls. `sqlite3.complete_statement` finds where each
statement ends, with string literals, comments and trigger bodies handled by
SQLite's own tokenizer. PostgreSQL's runner (store/postgres.py) runs a file
whole, as one simple-protocol statement list inside its transaction.

A database is mcplhost's when it is empty or its `schema_version` has our
columns and names each version it records as our file does (`foreign_reason`);
anything else is another program's and is refused before anything is written.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

import aiosqlite
import anyio
import structlog

import mcplhost
from mcplhost.store.connection import POSTGRESQL, SQLITE, Conn, Engine
from mcplhost.store.errors import BrokenMigration, ForeignDatabase, SchemaBehind, SchemaTooNew
from mcplhost.store.sqlite_conn import SqliteConn

log = structlog.get_logger()

MIGRATION_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")

# A step must not end the runner's transaction early, or a failure after that
# point would leave half a migration behind.
_TRANSACTION_CONTROL = re.compile(
    r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b",
    re.IGNORECASE | re.DOTALL,
)

#: The table each engine records applied migrations in, and its columns (the owner check asks for them).
VERSION_TABLE = "schema_version"
VERSION_COLUMNS = ("version", "name", "applied_at")

_CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at INTEGER NOT NULL  -- epoch ms
)
"""


@dataclass(frozen=True)
class Migration:
    """One numbered step: its version, its name (from the file name) and its SQL."""

    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        return list(_statements_of(self.sql))


def default_folder(engine: Engine = SQLITE) -> Traversable:
    """Where this installation's migrations for `engine` live (see the module docstring)."""
    packaged = importlib.resources.files("mcplhost") / "_migrations"
    root = packaged if packaged.is_dir() else Path(mcplhost.__file__).resolve().parent.parent / "migrations"
    return root / engine


def load_migrations(folder: Traversable | Path | None = None, *, engine: Engine = SQLITE) -> list[Migration]:
    """Read and order the migration files; a misnamed file or a gap is a bug, raised as ValueError.

    `folder`: the files themselves (tests), read at each call; None: this installation's, for `engine`, read
    once per process (they are part of the installed package, and every store open and check reads them).
    """
    if folder is None:
        return list(_installed_migrations(engine))
    return _read_migrations(folder)


@functools.cache
def _installed_migrations(engine: Engine) -> tuple[Migration, ...]:
    return tuple(_read_migrations(default_folder(engine)))


def _read_migrations(root: Traversable | Path) -> list[Migration]:
    if not root.is_dir():
        raise ValueError(f"migrations folder not found: {root}")
    found: dict[int, Migration] = {}
    for entry in root.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = MIGRATION_FILE.match(entry.name)
        if match is None:
            raise ValueError(f"migration file {entry.name!r} is not named NNNN_name.sql")
        version = int(match["version"])
        if version in found:
            raise ValueError(f"two migration files share version {version}")
        migration = Migration(version, match["name"], entry.read_text(encoding="utf-8"))
        for statement in migration.statements():
            if _TRANSACTION_CONTROL.match(statement):
                raise ValueError(f"{entry.name}: the runner owns the transaction; remove {statement!r}")
        found[version] = migration
    ordered = [found[v] for v in sorted(found)]
    expected = list(range(1, len(ordered) + 1))
    if [m.version for m in ordered] != expected:
        raise ValueError(f"migration versions must run 1..N without gaps, found {sorted(found)}")
    return ordered


@functools.lru_cache(maxsize=64)
def _statements_of(script: str) -> tuple[str, ...]:
    """`split_statements`, once per migration text: each open checks every step and a fresh store runs them."""
    return tuple(split_statements(script))


def split_statements(script: str) -> list[str]:
    """Split SQL text into single statements, using SQLite's tokenizer to find their ends."""
    statements: list[str] = []
    start = 0
    semicolon = script.find(";")
    while semicolon != -1:
        candidate = script[start : semicolon + 1]
        if sqlite3.complete_statement(candidate):
            statements.append(candidate.strip())
            start = semicolon + 1
        semicolon = script.find(";", semicolon + 1)
    rest = script[start:].strip()
    if rest:
        statements.append(rest)  # a last statement without its ';', or trailing comments
    return statements


async def list_tables(conn: Conn) -> list[str]:
    """The database's tables and views, by name (PostgreSQL: in the connection's current schema only)."""
    if conn.engine == POSTGRESQL:
        rows = await conn.fetch("SELECT table_name FROM information_schema.tables"
                                " WHERE table_schema = current_schema() ORDER BY table_name")
    else:
        rows = await conn.fetch("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                                " AND name NOT LIKE 'sqlite%' ORDER BY name")
    return [name for (name,) in rows]


async def applied_versions(conn: Conn) -> set[int]:
    """The versions recorded in `schema_version`; empty for a new database."""
    if VERSION_TABLE not in await list_tables(conn):
        return set()
    rows = await conn.fetch("SELECT version FROM schema_version")
    return {int(row[0]) for row in rows}


async def refuse_foreign(conn: Conn, *, path: str | None = None,
                         known: Sequence[Migration] | None = None) -> set[int]:
    """Raise ForeignDatabase unless the database is empty or mcplhost's own (`foreign_reason`); the versions
    it records (as `applied_versions`, read in passing).

    Checked before anything is written to it (even SQLite's WAL pragma, which would persist in the file).
    `known`: the migrations whose names a recorded version must carry (default: this engine's).
    """
    tables = await list_tables(conn)
    if not tables:
        return set()
    columns: list[str] = []
    recorded: list[tuple[int, str]] = []
    if VERSION_TABLE in tables:
        if conn.engine == POSTGRESQL:
            found = await conn.fetch("SELECT column_name FROM information_schema.columns"
                                     " WHERE table_schema = current_schema() AND table_name = 'schema_version'")
        else:
            found = await conn.fetch("SELECT name FROM pragma_table_info('schema_version')")
        columns = [name for (name,) in found]
        if set(VERSION_COLUMNS) <= set(columns):
            recorded = [(int(version), str(name))
                        for version, name in await conn.fetch("SELECT version, name FROM schema_version")]
    migrations = load_migrations(engine=conn.engine) if known is None else known
    if foreign_reason(tables, columns, recorded, migrations):
        raise ForeignDatabase(tables, path=path)
    return {version for version, _ in recorded}


def foreign_reason(tables: Sequence[str], version_columns: Sequence[str], recorded: Sequence[tuple[int, str]],
                   known: Sequence[Migration]) -> str | None:
    """Why a database holding `tables` is another program's, or None when it is mcplhost's.

    Another program's: tables but no `schema_version`; a `schema_version` without our columns; or one
    recording a version we know under another name (a program with a table of the same name). A version
    newer than we know is not judged here: `refuse_newer` says that.
    """
    if VERSION_TABLE not in tables:
        return "no schema_version table"
    if not set(VERSION_COLUMNS) <= set(version_columns):
        return "schema_version has other columns"
    names = {migration.version: migration.name for migration in known}
    for version, name in recorded:
        if version in names and names[version] != name:
            return f"version {version} is {name!r}, not {names[version]!r}"
    return None


def refuse_newer(applied: set[int], newest_known: int, *, path: str | None = None) -> None:
    """Raise SchemaTooNew when the database has a version beyond the newest file."""
    found = max(applied, default=0)
    if found > newest_known:
        raise SchemaTooNew(found, newest_known, path=path)


async def refuse_unusable(conn: Conn, migrations: Sequence[Migration], *, path: str, current: bool) -> None:
    """Refuse, without migrating, another program's database or a schema newer than `migrations`; with `current`
    (a reader), also one that still needs migrations (SchemaBehind)."""
    applied = await refuse_foreign(conn, path=path, known=migrations)
    refuse_newer(applied, len(migrations), path=path)
    if current and max(applied, default=0) < len(migrations):
        raise SchemaBehind(max(applied, default=0), len(migrations), path=path)


async def migrate(
    conn: aiosqlite.Connection,
    folder: Traversable | Path | None = None,
    *,
    path: str | None = None,
) -> list[int]:
    """Apply every pending migration in order; return the versions applied (empty when up to date).

    `conn` must be in autocommit mode (isolation_level=None) with no open
    transaction. Safe to run from two processes at once: each step re-checks
    its version under the write lock.
    """
    migrations = load_migrations(folder)
    await refuse_foreign(SqliteConn(conn), path=path, known=migrations)
    refuse_newer(await applied_versions(SqliteConn(conn)), len(migrations), path=path)
    await conn.execute(_CREATE_VERSION_TABLE)
    applied: list[int] = []
    for migration in migrations:
        if await _apply(conn, migration):
            applied.append(migration.version)
    return applied


async def _apply(conn: aiosqlite.Connection, migration: Migration) -> bool:
    """Run one step and record it in one transaction; False if it was already applied."""
    try:
        await conn.execute("BEGIN IMMEDIATE")
        already = await conn.execute_fetchall(
            "SELECT 1 FROM schema_version WHERE version = ?", (migration.version,)
        )
        if list(already):
            await conn.execute("ROLLBACK")
            return False
        started = time.monotonic()
        for statement in migration.statements():
            await conn.execute(statement)
        await conn.execute(
            "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
            (migration.version, migration.name, int(time.time() * 1000)),
        )
        await conn.execute("COMMIT")
    except BaseException as exc:
        # aiosqlite runs calls in order on one thread, so this rollback follows
        # whatever was still queued when we were cancelled, and sqlite3's
        # rollback() does nothing if that call happened to be the COMMIT.
        with anyio.CancelScope(shield=True):
            await conn.rollback()
        if isinstance(exc, sqlite3.Error):
            raise BrokenMigration(migration.version, migration.name, exc) from exc
        raise
    log.info(
        "store.migration_applied",
        version=migration.version,
        name=migration.name,
        ms=round((time.monotonic() - started) * 1000, 1),
    )
    return True
