"""Fixtures for the store tests: real SQLite files under tmp_path and real PostgreSQL databases, no mocks.

The contract modules (CONTRACT_MODULES) run each test that takes `store` (and not `db_path`) on both engines:
SQLite in a file, PostgreSQL in one database per session (on tests/postgres.py's server), migrated once
and emptied before each test.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from mcplhost.store import NewItem, Store, open_store
from mcplhost.store.writer import GroupWriter
from tests.postgres import PostgresDatabase, PostgresServer, or_unavailable

#: The modules whose `store` tests are the store's contract, run on both engines (the rest: SQLite's own).
CONTRACT_MODULES = frozenset({"test_items", "test_turns", "test_outbox", "test_cursors", "test_pushes",
                              "test_peers", "test_quotas", "test_retention", "test_writer"})
#: The session's migrated database the PostgreSQL tests share, emptied before each.
CONTRACT_DATABASE = "mcplhost_contract"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    # A test that takes db_path reaches the SQLite file itself: SQLite's own.
    contract = module in CONTRACT_MODULES and "db_path" not in metafunc.fixturenames
    # `engine` asked for by the test itself: a test of both engines wherever it is.
    if "engine" in inspect.signature(metafunc.function).parameters or ("store" in metafunc.fixturenames and contract):
        metafunc.parametrize("engine", ["sqlite", "postgresql"], scope="function")


@pytest.fixture
def engine() -> str:
    return "sqlite"  # tests outside the contract modules; parametrized over both engines inside them


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "mcplhost.db"


@pytest.fixture(scope="session")
def contract_database(postgres_server: PostgresServer) -> PostgresDatabase:
    """A database migrated to the newest schema, once per session (per xdist worker)."""

    async def migrate() -> None:
        async with open_store(postgres_server.url(CONTRACT_DATABASE), pool_size=1):
            pass

    def create() -> PostgresDatabase:
        postgres_server.sql(f'CREATE DATABASE "{CONTRACT_DATABASE}" TEMPLATE template0')
        # A thread of its own: the fixture may be first asked for inside a test's running event loop.
        with ThreadPoolExecutor(1) as thread:
            thread.submit(asyncio.run, migrate()).result()
        return PostgresDatabase(name=CONTRACT_DATABASE, url=postgres_server.url(CONTRACT_DATABASE))

    return or_unavailable(create)


async def emptied(contract_database: PostgresDatabase) -> PostgresDatabase:
    """The session's migrated database, emptied for this test: no rows, every id sequence back at 1.

    Emptying it (one TRUNCATE) costs a few milliseconds; a database of each test's own, a copy of a
    migrated template, cost 0.3-0.8 s each on this loaded machine.
    """
    conn = await asyncpg.connect(contract_database.url)
    try:
        # DELETE and a sequence restart: cheaper than TRUNCATE's new files for tables of a few rows.
        tables = [name for (name,) in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename <> 'schema_version'")]
        sequences = [name for (name,) in await conn.fetch(
            "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()")]
        await conn.execute("".join(f"DELETE FROM {table};" for table in tables)
                           + "".join(f"ALTER SEQUENCE {sequence} RESTART;" for sequence in sequences)
                           + "INSERT INTO search_index (id, indexed_to) VALUES (1, 0)")
    finally:
        await conn.close()
    return contract_database


@pytest.fixture
async def migrated_db(contract_database: PostgresDatabase) -> PostgresDatabase:
    """The session's migrated PostgreSQL database, emptied for this test."""
    return await emptied(contract_database)


@pytest.fixture
async def store(engine: str, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    target: str | Path
    if engine == "postgresql":
        target = (await emptied(request.getfixturevalue("contract_database"))).url
    else:
        target = request.getfixturevalue("db_path")
    async with open_store(target) as opened:
        yield opened


def make_item(
    text: str = "hello",
    *,
    server: str | None = "discord",
    channel: str | None = "discord:g1:room",
    agent: str | None = None,
    participant: str | None = "Alice",
    role: str = "user",
    created_at: int = 1_790_000_000_000,
) -> NewItem:
    """An item shaped like docs/provenance.md §6's example, varied by the arguments."""
    metadata: dict = {"tags": [], "adapter": {}}
    if server is not None:
        metadata["serverId"] = server
    if channel is not None:
        metadata["channelId"] = channel
    return NewItem(
        role=role,
        content=[{"type": "text", "text": text}],
        metadata=metadata,
        created_at=created_at,
        agent=agent,
        participant=participant,
    )


async def submitted(writer: GroupWriter, *operations: Any) -> list[Any]:
    """Submit `operations` as one write; each one's result, in the order given."""
    committed = await writer.submit(*operations)
    return [committed[operation] for operation in operations]


async def with_writer(store: Store, *operations: Any) -> list[Any]:
    """Submit `operations` as one group through a GroupWriter run for the occasion; the group's results."""
    writer = GroupWriter(store)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.run)
        results = await submitted(writer, *operations)
        tg.cancel_scope.cancel()
    return results
