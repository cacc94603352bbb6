"""The PostgreSQL fixture (tests/postgres.py): a real server on a Unix socket, a fresh database per test."""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
import pytest

from ..postgres import PostgresDatabase, PostgresServer, unavailable


class TestPostgresFixture:
    async def test_a_test_gets_a_fresh_database_on_a_socket_only_server(self, postgres_db: PostgresDatabase) -> None:
        connection = await asyncpg.connect(postgres_db.url)
        try:
            assert await connection.fetchval("SELECT current_database()") == postgres_db.name
            assert await connection.fetchval("SELECT 6 * 7") == 42
            tables = await connection.fetchval(
                "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")
            assert tables == 0
            assert await connection.fetchval("SHOW listen_addresses") == ""
            data_directory = Path(await connection.fetchval("SHOW data_directory"))
        finally:
            await connection.close()
        if os.geteuid() == 0:  # PostgreSQL refuses root: the fixture runs it as an unprivileged user
            assert data_directory.stat().st_uid != 0

    async def test_databases_are_separate_and_a_finished_one_is_dropped(
            self, postgres_server: PostgresServer, postgres_db: PostgresDatabase) -> None:
        other = postgres_server.create_database()
        assert other.name != postgres_db.name
        first = await asyncpg.connect(postgres_db.url)
        second = await asyncpg.connect(other.url)
        try:
            await first.execute("CREATE TABLE items (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
            assert await first.fetchval("INSERT INTO items (body) VALUES ('x') RETURNING id") == 1
            assert await second.fetchval("SELECT to_regclass('items')") is None
        finally:
            await first.close()
        # A test that leaves a connection open does not keep its database: the next create drops it.
        postgres_server.finish(other)
        third = postgres_server.create_database()
        postgres_server.finish(third)
        assert second.is_closed() or await connection_lost(second)
        names = postgres_server.sql("SELECT datname FROM pg_database").split()
        assert other.name not in names and third.name in names and postgres_db.name in names


async def connection_lost(connection: asyncpg.Connection) -> bool:
    try:
        await connection.fetchval("SELECT 1")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError):
        return True
    finally:
        connection.terminate()
    return False


class TestUnavailable:
    def test_fails_in_ci(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("CI", "true")
        with pytest.raises(pytest.fail.Exception, match="PostgreSQL: no server binaries"):
            unavailable("no server binaries")

    def test_skips_elsewhere(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("CI", raising=False)
        with pytest.raises(pytest.skip.Exception, match="PostgreSQL: no server binaries"):
            unavailable("no server binaries")
