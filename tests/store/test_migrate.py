"""Tests for mcplhost/store/migrate.py: numbered files, one transaction each, refusal of newer or foreign schemas."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiosqlite
import pytest
from structlog.testing import capture_logs

from mcplhost.store import BrokenMigration, ForeignDatabase, SchemaTooNew, open_reader, open_store
from mcplhost.store.migrate import (
    VERSION_COLUMNS,
    Migration,
    applied_versions,
    default_folder,
    foreign_reason,
    load_migrations,
    migrate,
    split_statements,
)
from mcplhost.store.sqlite_conn import SqliteConn


def write_migrations(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, sql in files.items():
        (folder / name).write_text(sql, encoding="utf-8")
    return folder


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    conn.close()
    return {name for (name,) in rows}


def recorded_versions(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
    conn.close()
    return [version for (version,) in rows]


class TestSplitStatements:
    def test_splits_on_statement_ends(self):
        """Two statements on one line come apart, each keeping its semicolon."""
        assert split_statements("CREATE TABLE a (x); CREATE TABLE b (y);") == [
            "CREATE TABLE a (x);",
            "CREATE TABLE b (y);",
        ]

    def test_semicolons_in_strings_comments_and_triggers_stay_inside(self):
        """A ';' inside a literal, a comment or a trigger body does not end the statement."""
        script = (
            "INSERT INTO t VALUES ('a;b'); -- note; here\n"
            "CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; SELECT 2; END;\n"
        )
        statements = split_statements(script)
        assert statements[0] == "INSERT INTO t VALUES ('a;b');"
        assert statements[1].startswith("-- note; here\nCREATE TRIGGER")
        assert statements[1].endswith("END;")
        assert len(statements) == 2

    def test_keeps_a_last_statement_without_semicolon(self):
        """Trailing text without ';' is kept as a last statement."""
        assert split_statements("SELECT 1; SELECT 2") == ["SELECT 1;", "SELECT 2"]


class TestLoadMigrations:
    def test_default_folder_holds_the_initial_migration(self):
        """The repository's migrations/ folder is found and starts at version 1."""
        migrations = load_migrations(default_folder())
        assert migrations[0].version == 1
        assert migrations[0].name == "initial"

    def test_orders_by_version(self, tmp_path: Path):
        """Files are applied by number, not by listing order."""
        folder = write_migrations(tmp_path, {"0002_b.sql": "SELECT 2;", "0001_a.sql": "SELECT 1;"})
        assert [m.name for m in load_migrations(folder)] == ["a", "b"]

    def test_refuses_a_misnamed_file(self, tmp_path: Path):
        """An .sql file not named NNNN_name.sql is a mistake, not something to skip."""
        folder = write_migrations(tmp_path, {"0001_a.sql": "SELECT 1;", "2-b.sql": "SELECT 2;"})
        with pytest.raises(ValueError, match="NNNN_name.sql"):
            load_migrations(folder)

    def test_refuses_a_gap(self, tmp_path: Path):
        """Versions must run 1..N without a missing number."""
        folder = write_migrations(tmp_path, {"0001_a.sql": "SELECT 1;", "0003_c.sql": "SELECT 3;"})
        with pytest.raises(ValueError, match="without gaps"):
            load_migrations(folder)

    def test_refuses_transaction_control(self, tmp_path: Path):
        """A file that would commit the runner's transaction early is refused."""
        folder = write_migrations(tmp_path, {"0001_a.sql": "CREATE TABLE a (x);\n-- done\nCOMMIT;"})
        with pytest.raises(ValueError, match="runner owns the transaction"):
            load_migrations(folder)


class TestMigrate:
    async def test_from_empty_creates_the_schema(self, db_path: Path):
        """A new database gets every table and its version recorded."""
        async with open_store(db_path):
            pass
        assert {"items", "push_events", "schema_version"} <= tables(db_path)
        assert recorded_versions(db_path) == [m.version for m in load_migrations()]

    async def test_logs_each_step_applied(self, db_path: Path):
        """Each applied step is one structured log line with its version and name."""
        with capture_logs() as logs:
            async with open_store(db_path):
                pass
        applied = [entry for entry in logs if entry["event"] == "store.migration_applied"]
        assert [(entry["version"], entry["name"]) for entry in applied] == [
            (migration.version, migration.name) for migration in load_migrations()
        ]

    async def test_rerun_applies_nothing(self, db_path: Path):
        """Running the migrations again is a no-op returning no versions."""
        async with open_store(db_path) as store:
            assert await store.migrate() == []
        async with open_store(db_path) as store:
            assert await store.migrate() == []
        assert recorded_versions(db_path) == [m.version for m in load_migrations()]

    async def test_returns_the_versions_applied(self, tmp_path: Path):
        """migrate() reports exactly the versions it applied, in order."""
        folder = write_migrations(tmp_path / "m", {"0001_a.sql": "CREATE TABLE a (x);"})
        async with aiosqlite.connect(tmp_path / "x.db", isolation_level=None) as conn:
            assert await migrate(conn, folder) == [1]
            write_migrations(folder, {"0002_b.sql": "CREATE TABLE b (y);", "0003_c.sql": "CREATE TABLE c (z);"})
            assert await migrate(conn, folder) == [2, 3]
            assert await migrate(conn, folder) == []
            assert await applied_versions(SqliteConn(conn)) == {1, 2, 3}

    async def test_newer_schema_is_refused(self, db_path: Path):
        """A database recorded at a version beyond the newest file raises SchemaTooNew."""
        async with open_store(db_path):
            pass
        newest = len(load_migrations())
        with sqlite3.connect(db_path) as conn:
            conn.execute("INSERT INTO schema_version VALUES (?, 'from_the_future', 0)", (newest + 1,))
        conn.close()
        for opener in (open_store, lambda p: open_store(p, migrate=False), open_reader):
            with pytest.raises(SchemaTooNew) as refused:
                async with opener(db_path):
                    pass
            assert (refused.value.found, refused.value.newest_known) == (newest + 1, newest)
            assert str(db_path) in str(refused.value)
            assert "never downgrades" in refused.value.explanation

    async def test_broken_migration_leaves_nothing_applied(self, tmp_path: Path):
        """A step failing halfway rolls back its own statements and its version row."""
        folder = write_migrations(
            tmp_path / "m",
            {
                "0001_fine.sql": "CREATE TABLE fine (x);",
                "0002_broken.sql": "CREATE TABLE half (x);\nINSERT INTO half VALUES (1);\nINSERT INTO nowhere VALUES (1);",
            },
        )
        db = tmp_path / "x.db"
        with pytest.raises(BrokenMigration) as broken:
            async with open_store(db, migrations_folder=folder):
                pass
        assert broken.value.version == 2
        assert "nowhere" in str(broken.value)
        assert "half" not in tables(db)
        assert recorded_versions(db) == [1]

        write_migrations(folder, {"0002_broken.sql": "CREATE TABLE half (x);"})
        async with open_store(db, migrations_folder=folder):
            pass
        assert "half" in tables(db)
        assert recorded_versions(db) == [1, 2]

    async def test_broken_first_migration_leaves_an_empty_schema(self, tmp_path: Path):
        """When the very first step fails, no table of it exists afterwards."""
        folder = write_migrations(
            tmp_path / "m", {"0001_broken.sql": "CREATE TABLE a (x);\nCREATE TABLE a (x);"}
        )
        db = tmp_path / "x.db"
        with pytest.raises(BrokenMigration):
            async with open_store(db, migrations_folder=folder):
                pass
        assert tables(db) == {"schema_version"}
        assert recorded_versions(db) == []


class TestForeignDatabase:
    def foreign(self, tmp_path: Path) -> Path:
        path = tmp_path / "notes.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.close()
        return path

    async def test_another_applications_tables_are_refused_untouched(self, tmp_path: Path):
        """A file with tables but no schema_version raises ForeignDatabase from every opener and is not changed."""
        path = self.foreign(tmp_path)
        for opener in (open_store, lambda p: open_store(p, migrate=False), open_reader):
            with pytest.raises(ForeignDatabase) as refused:
                async with opener(path):
                    pass
            assert refused.value.tables == ["users"]
            assert "another application" in str(refused.value) and str(path) in str(refused.value)
            assert "new file" in refused.value.explanation
        assert tables(path) == {"users"}
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)  # WAL was never set
        conn.close()

    async def test_an_empty_sqlite_file_is_ours_to_migrate(self, tmp_path: Path):
        """A database with no tables at all is a new store, not a foreign one."""
        path = tmp_path / "empty.db"
        sqlite3.connect(path).close()
        async with open_store(path):
            pass
        assert "items" in tables(path)

    def test_migrate_command_prints_one_line(self, tmp_path: Path):
        """`mcplhost migrate --db` on a foreign file exits non-zero with the reason, no traceback."""
        from tests.cli.support import cli

        done = cli("migrate", "--db", str(self.foreign(tmp_path)))
        assert done.returncode != 0
        assert "another application" in done.stderr and "Traceback" not in done.stderr


class TestEngines:
    def test_both_engines_have_the_same_steps(self):
        """migrations/sqlite/ and migrations/postgresql/ hold the same (version, name) pairs."""
        sqlite_steps = [(m.version, m.name) for m in load_migrations(engine="sqlite")]
        assert sqlite_steps == [(m.version, m.name) for m in load_migrations(engine="postgresql")]
        assert sqlite_steps[-1][0] >= 10

    def test_the_sqlite_files_are_the_ones_always_shipped(self):
        """The default folder is the SQLite engine's: a store migrated before the split reads as current."""
        assert load_migrations() == load_migrations(default_folder("sqlite"))


class TestOwner:
    """A database is ours when empty, or when its schema_version has our columns and names (foreign_reason)."""

    known = [Migration(1, "initial", ""), Migration(2, "idempotent_items", "")]

    def test_our_own_is_ours(self):
        assert foreign_reason(["items", "schema_version"], VERSION_COLUMNS, [(1, "initial")], self.known) is None
        # A version newer than we know is refuse_newer's to judge, not a sign of another program.
        assert foreign_reason(["schema_version"], VERSION_COLUMNS, [(1, "initial"), (3, "later")], self.known) is None

    def test_tables_without_a_version_table_are_another_programs(self):
        assert foreign_reason(["items"], [], [], self.known) == "no schema_version table"

    def test_a_version_table_of_other_columns_is_another_programs(self):
        assert foreign_reason(["items", "schema_version"], ["version"], [], self.known) is not None

    def test_a_version_we_know_under_another_name_is_another_programs(self):
        assert foreign_reason(["items", "schema_version"], VERSION_COLUMNS, [(1, "create_users")], self.known)

    async def test_another_programs_items_and_schema_version_are_refused_untouched(self, tmp_path: Path):
        """A file with `items` and a schema_version of its own is refused before anything is written."""
        path = tmp_path / "other.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, title TEXT)")
            conn.execute("CREATE TABLE schema_version (version INTEGER, name TEXT, applied_at INTEGER)")
            conn.execute("INSERT INTO schema_version VALUES (1, 'todo_items', 0)")
        conn.close()
        with pytest.raises(ForeignDatabase):
            async with open_store(path):
                pass
        assert tables(path) == {"items", "schema_version"}
