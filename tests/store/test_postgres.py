"""Tests for mcplhost/store/postgres.py and open.py's dispatch: what differs by engine, beyond the contract suite."""

from __future__ import annotations

import sys

import anyio
import asyncpg
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mcplhost.store import (
    ForeignDatabase,
    SchemaTooNew,
    StoreError,
    StoreMissing,
    is_database_url,
    open_reader,
    open_store,
)
from mcplhost.store.items import NewItem, readable_json
from mcplhost.store.open import redacted_url, server_of
from mcplhost.store.postgres import numbered, rowcount
from tests.postgres import PostgresDatabase


class TestNumbered:
    def test_placeholders_are_numbered_in_order(self):
        assert numbered("SELECT a FROM t WHERE b = ? AND c IN (?, ?)") == "SELECT a FROM t WHERE b = $1 AND c IN ($2, $3)"

    def test_a_question_mark_in_quotes_or_a_comment_is_text(self):
        sql = "SELECT '?', \"a?\" FROM t -- why?\nWHERE x = ? AND y ~ '^-?[0-9]$'"
        assert numbered(sql) == "SELECT '?', \"a?\" FROM t -- why?\nWHERE x = $1 AND y ~ '^-?[0-9]$'"

    @given(st.lists(st.sampled_from(["a", " ", "?", "'x?'", "''"]), max_size=20))
    def test_as_many_numbers_as_placeholders_outside_quotes(self, parts: list[str]):
        sql = "".join(parts)
        outside = sum(1 for part in parts if part == "?")
        result = numbered(sql)
        assert [f"${n}" in result for n in range(1, outside + 1)] == [True] * outside
        assert f"${outside + 1}" not in result


def test_rowcount_reads_the_command_tag():
    assert [rowcount(tag) for tag in ("INSERT 0 5", "UPDATE 3", "DELETE 0", "BEGIN")] == [5, 3, 0, -1]


class TestLocation:
    def test_the_password_is_never_shown(self):
        assert redacted_url("postgresql://app:s3cret@db.example:6432/mcpl") == "postgresql://app:***@db.example:6432/mcpl"
        assert redacted_url("postgres://db/mcpl?user=app&password=s3cret&sslmode=require") == (
            "postgres://db/mcpl?user=app&password=***&sslmode=require")
        assert redacted_url("postgresql://app@/mcpl?host=/run/postgresql") == "postgresql://app@/mcpl?host=/run/postgresql"

    def test_the_server_is_named_by_host_and_port(self):
        assert server_of("postgresql://app:pw@db.example:6432/mcpl") == "db.example:6432"
        assert server_of("postgresql://app@/mcpl?host=/run/postgresql") == "/run/postgresql:5432"

    def test_only_the_two_schemes_are_urls(self):
        assert is_database_url("postgresql://h/db") and is_database_url("postgres://h/db")
        assert not is_database_url("state/postgresql.db") and not is_database_url("sqlite:///x.db")


async def test_without_asyncpg_a_url_is_one_clear_error(monkeypatch: pytest.MonkeyPatch):
    """An installation without the postgres extra is told what to install, not shown an ImportError."""
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    monkeypatch.delitem(sys.modules, "mcplhost.store.postgres")
    for opener in (open_store, open_reader):
        with pytest.raises(StoreError) as refused:
            async with opener("postgresql://app@db.example/mcpl"):
                pass
        assert "asyncpg" in str(refused.value) and "mcplhost[postgres]" in refused.value.explanation


async def test_a_store_says_where_it_is_and_how_large(migrated_db: PostgresDatabase):
    async with open_store(migrated_db.url) as store:
        assert store.location == migrated_db.url  # no password in the test server's URL
        assert await store.size_bytes() > 0
        assert await store.schema_version() >= 10
        assert await store.migrate() == []


class TestRefusals:
    """What the operator is told, in one line each, about a PostgreSQL target the store cannot use."""

    async def test_a_server_that_is_not_there_is_named_by_host_and_port(self):
        import socket

        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"postgresql://app:s3cret@127.0.0.1:{port}/mcpl"
        with capture_logs() as logs, anyio.fail_after(30):
            with pytest.raises(StoreError) as refused:
                async with open_store(url, connect_deadline_s=1):
                    pass
        message = str(refused.value)
        assert f"127.0.0.1:{port}" in message and "within 1 s" in message
        assert "s3cret" not in message and "\n" not in message
        assert [log["event"] for log in logs].count("store.server_unreachable") >= 1  # tried again before giving up

    async def test_a_database_that_does_not_exist_is_missing(self, migrated_db: PostgresDatabase):
        url = migrated_db.url.replace(f"/{migrated_db.name}?", "/no_such_db?")
        with pytest.raises(StoreMissing):
            async with open_reader(url):
                pass

    async def test_another_programs_tables_are_refused_untouched(self, postgres_db: PostgresDatabase):
        conn = await asyncpg.connect(postgres_db.url)
        try:
            await conn.execute("CREATE TABLE items (id serial PRIMARY KEY, title text)")
            for opener in (open_store, open_reader):
                with pytest.raises(ForeignDatabase) as refused:
                    async with opener(postgres_db.url):
                        pass
                assert refused.value.tables == ["items"]
            tables = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            assert [row[0] for row in tables] == ["items"]
        finally:
            await conn.close()

    async def test_a_newer_schema_is_refused(self, migrated_db: PostgresDatabase):
        conn = await asyncpg.connect(migrated_db.url)
        try:
            await conn.execute("INSERT INTO schema_version VALUES (999, 'future', 0)")
            for opener in (open_store, open_reader):
                with pytest.raises(SchemaTooNew) as refused:
                    async with opener(migrated_db.url):
                        pass
                assert refused.value.found == 999
        finally:
            await conn.execute("DELETE FROM schema_version WHERE version = 999")
            await conn.close()


async def test_two_hosts_migrating_a_new_database_at_once_apply_each_step_once(postgres_db: PostgresDatabase):
    """Each step takes the migration lock and looks at its version again: both opens succeed, each step once."""
    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(_open_and_close, postgres_db.url)
    conn = await asyncpg.connect(postgres_db.url)
    try:
        versions = [row[0] for row in await conn.fetch("SELECT version FROM schema_version ORDER BY version")]
    finally:
        await conn.close()
    assert versions == list(range(1, len(versions) + 1)) and len(versions) >= 10


async def _open_and_close(url: str) -> None:
    async with open_store(url):
        pass


@given(st.text(alphabet=st.sampled_from(["\x00", "\\", "u", "0", "a", '"'])))
def test_metadata_reads_back_with_nul_as_the_replacement_character(text: str):
    """readable_json changes exactly the NULs of the decoded value, whatever backslashes surround them."""
    encoded = msgspec.json.encode({"name": text, "kind": "x"}).decode()
    assert msgspec.json.decode(readable_json(encoded)) == {"name": text.replace("\x00", "\ufffd"), "kind": "x"}


async def test_a_nul_in_a_rows_metadata_fails_no_read(migrated_db: PostgresDatabase):
    """A NUL anywhere in metadata (an author's name) would fail every `->>` over the row: stored as U+FFFD, the
    content keeping its NUL as SQLite does (json keeps the escape, read back whole)."""
    async with open_store(migrated_db.url) as store:
        (item_id,) = await store.items.insert_many([NewItem(
            role="assistant", content=[{"type": "text", "text": "a\x00b"}],
            metadata={"kind": "draft", "turnId": 1, "reason": "r", "author": "x\x00y"}, created_at=1, agent="scout")])
        assert await store.items.turn_drafts("scout", 1) == [(item_id, "r")]
        (stored,) = await store.items.list()
        assert stored.content == [{"type": "text", "text": "a\x00b"}] and stored.metadata["author"] == "x\ufffdy"
        decision = await store.retention.prune_batch(after_id=0, cutoff_ms=10, floor_id=item_id, now_ms=10)
        assert decision.delete == [item_id]


async def test_a_cancelled_or_failed_transaction_leaves_nothing_and_the_pool_usable(migrated_db: PostgresDatabase):
    """The rollback runs shielded whatever ended the body; the connection goes back to the pool clean."""
    async with open_store(migrated_db.url, pool_size=1) as store:  # one connection: a dirty one would be reused
        with anyio.CancelScope() as scope:
            async with store.transaction():
                await store.items.insert_many_nocommit([NewItem(role="user", content=[], metadata={}, created_at=1)])
                scope.cancel()
                await anyio.sleep_forever()
        with pytest.raises(asyncpg.UndefinedTableError):
            async with store.transaction():
                await store.items.insert_many_nocommit([NewItem(role="user", content=[], metadata={}, created_at=2)])
                await store._connections.writer("test").execute("SELECT * FROM no_such_table")
        assert await store.items.list() == []
        assert await store.items.insert_many([NewItem(role="user", content=[], metadata={}, created_at=3)]) == [3]
