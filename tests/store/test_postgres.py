"""Tests for mcplhost/store/postgres.py and open.py's dispatch: what differs by engine, beyond the contract suite."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.store import StoreError, is_database_url, open_reader, open_store
from mcplhost.store.postgres import numbered, redacted_url, rowcount, server_of
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
