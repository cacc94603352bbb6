"""Schema migrations: numbered `.sql` files applied in order, the mautrix way.

Each file `NNNN_name.sql` in the migrations folder is one step. Versions start
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
SQLite's own tokenizer.
"""

from __future__ import annotations

import importlib.resources
import re
import sqlite3
import time
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

import aiosqlite
import anyio
import structlog

import mcplhost
from mcplhost.store.connection import Conn
from mcplhost.store.errors import BrokenMigration, ForeignDatabase, SchemaTooNew
from mcplhost.store.sqlite_conn import SqliteConn

log = structlog.get_logger()

MIGRATION_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")

# A step must not end the runner's transaction early, or a failure after that
# point would leave half a migration behind.
_TRANSACTION_CONTROL = re.compile(
    r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b",
    re.IGNORECASE | re.DOTALL,
)

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
        return split_statements(self.sql)


def default_folder() -> Traversable:
    """Where the migrations of this installation live (see the module docstring)."""
    packaged = importlib.resources.files("mcplhost") / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(mcplhost.__file__).resolve().parent.parent / "migrations"


def load_migrations(folder: Traversable | Path | None = None) -> list[Migration]:
    """Read and order the migration files; a misnamed file or a gap is a bug, raised as ValueError."""
    root = default_folder() if folder is None else folder
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


async def applied_versions(conn: Conn) -> set[int]:
    """The versions recorded in `schema_version`; empty for a new database."""
    has_table = await conn.fetch(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    )
    if not list(has_table):
        return set()
    rows = await conn.fetch("SELECT version FROM schema_version")
    return {row[0] for row in rows}


async def refuse_foreign(conn: Conn, *, path: str | None = None) -> None:
    """Raise ForeignDatabase when the file holds tables but no `schema_version`: another application's.

    Checked before anything is written to the file (even the WAL pragma,
    which would persist in it).
    """
    rows = await conn.fetch(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite%' ORDER BY name"
    )
    names = [name for (name,) in rows]
    if names and "schema_version" not in names:
        raise ForeignDatabase(names, path=path)


def refuse_newer(applied: set[int], newest_known: int, *, path: str | None = None) -> None:
    """Raise SchemaTooNew when the database has a version beyond the newest file."""
    found = max(applied, default=0)
    if found > newest_known:
        raise SchemaTooNew(found, newest_known, path=path)


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
    await refuse_foreign(SqliteConn(conn), path=path)
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
