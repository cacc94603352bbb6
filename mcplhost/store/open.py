"""Opening a store: an SQLite file or a PostgreSQL database, chosen by the target's form.

The contract every caller (host, CLI, control) relies on:

    async with open_store(target, synchronous="NORMAL", pool_size=10, migrate=True) as store:
        store.location            # for people: the file's path, or the URL with its password as ***
        await store.size_bytes()  # the database's size: file + WAL, or pg_database_size()
        store.path                # SQLite only (a Path), kept until every caller reads `location`

    async with open_reader(target) as store:   # the CLI's readers: read-only, the schema must be current
        ...

`target` is a `str | os.PathLike`. A str starting with `postgresql://` or
`postgres://` (`is_database_url`) selects PostgreSQL: libpq's URL form, so a
Unix socket is `postgresql://user@/db?host=/run/postgresql`. Anything else is
an SQLite file's path. `synchronous` is SQLite's (it is ignored with a URL:
the server's synchronous_commit decides); `pool_size` is PostgreSQL's
(connections the store holds at most; ignored for a file). Either engine
raises a StoreError subclass with a one-line message on a target it cannot
use: SchemaTooNew, ForeignDatabase, StoreMissing (open_reader), and for
PostgreSQL one naming what is missing when the `postgres` extra (asyncpg)
is not installed, one naming host and port for a server not reachable
within `connect_deadline_s` (30 s by default; tried again meanwhile, as a
server starting beside the host is), and one for a refused password.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources.abc import Traversable
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qs, urlsplit, urlunsplit

from mcplhost.store.composed import Store
from mcplhost.store.db import (
    DEFAULT_SYNCHRONOUS,
    READER_CONNECTIONS,
    open_sqlite_reader,
    open_sqlite_store,
)
from mcplhost.store.errors import StoreError

#: What a PostgreSQL target starts with (libpq accepts both).
URL_SCHEMES = ("postgresql://", "postgres://")
#: Connections a PostgreSQL store holds at most, unless `[store] pool_size` says otherwise.
DEFAULT_POOL_SIZE = 10


def is_database_url(target: str | os.PathLike[str]) -> bool:
    """Whether `target` names a PostgreSQL database (a URL) rather than an SQLite file."""
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


def redacted_url(url: str) -> str:
    """`url` with its password (in the authority or a `password=` parameter) replaced by ***."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        credentials, _, host = netloc.rpartition("@")
        if ":" in credentials:
            credentials = credentials.split(":", 1)[0] + ":***"
        netloc = f"{credentials}@{host}"
    query = re.sub(r"(^|&)password=[^&]*", r"\1password=***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def server_of(url: str) -> str:
    """The host and port `url` names, for messages ("localhost:5432", a socket folder, or "the default server")."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    host = parts.hostname or (query.get("host") or [""])[0] or "localhost"
    port = parts.port or (query.get("port") or ["5432"])[0]
    return f"{host}:{port}"


@asynccontextmanager
async def open_store(
    target: str | os.PathLike[str],
    *,
    synchronous: str = DEFAULT_SYNCHRONOUS,
    pool_size: int = DEFAULT_POOL_SIZE,
    migrate: bool = True,
    migrations_folder: Traversable | Path | None = None,
    reader_connections: int = READER_CONNECTIONS,
    connect_deadline_s: float | None = None,
) -> AsyncIterator[Store]:
    """The daemon's read-write store at `target` (see the module docstring), migrated unless `migrate` is False.

    `connect_deadline_s`: how long PostgreSQL's opener keeps trying a server it cannot reach (None: its default).
    """
    if isinstance(target, str) and is_database_url(target):
        postgres = _postgres()
        deadline = {} if connect_deadline_s is None else {"connect_deadline_s": connect_deadline_s}
        async with postgres.open_pg_store(target, pool_size=pool_size, migrate=migrate,
                                          migrations_folder=migrations_folder, **deadline) as pg_store:
            yield pg_store
        return
    async with open_sqlite_store(Path(target), synchronous=synchronous, migrate=migrate,
                                 migrations_folder=migrations_folder,
                                 reader_connections=reader_connections) as store:
        yield store


@asynccontextmanager
async def open_reader(
    target: str | os.PathLike[str],
    *,
    migrations_folder: Traversable | Path | None = None,
    connect_deadline_s: float | None = None,
) -> AsyncIterator[Store]:
    """An existing store at `target`, read-only (the CLI's readers, beside a running daemon)."""
    if isinstance(target, str) and is_database_url(target):
        postgres = _postgres()
        deadline = {} if connect_deadline_s is None else {"connect_deadline_s": connect_deadline_s}
        async with postgres.open_pg_reader(target, migrations_folder=migrations_folder, **deadline) as pg_store:
            yield pg_store
        return
    async with open_sqlite_reader(Path(target), migrations_folder=migrations_folder) as store:
        yield store


def _postgres() -> ModuleType:
    """store/postgres.py, imported only now: asyncpg is an extra an SQLite-only installation lacks."""
    try:
        return importlib.import_module("mcplhost.store.postgres")
    except ModuleNotFoundError as exc:
        if exc.name != "asyncpg":
            raise
        raise StoreError("a postgresql:// store needs the asyncpg driver, which is not installed",
                         explanation="install mcplhost[postgres] (pip install 'mcplhost[postgres]')") from exc
