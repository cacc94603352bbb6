"""Tests for mcplhost/store/db.py: pragmas, transactions, and the two openers."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
from pathlib import Path

import anyio
import pytest

from mcplhost.errors import HostStateError
from mcplhost.store import (
    BUSY_TIMEOUT_MS,
    SYNCHRONOUS_LEVELS,
    PushClaim,
    SchemaBehind,
    Store,
    StoreError,
    StoreMissing,
    item_row,
    open_reader,
    open_store,
)
from mcplhost.store.migrate import load_migrations

from .conftest import make_item


async def pragma(store: Store, name: str):
    return (await store.pragmas())[name]


class TestPragmas:
    async def test_wal_and_busy_timeout(self, store: Store):
        """The writer runs in WAL mode with the named busy timeout and foreign keys on."""
        assert await pragma(store, "journal_mode") == "wal"
        assert await pragma(store, "busy_timeout") == BUSY_TIMEOUT_MS
        assert await pragma(store, "foreign_keys") == 1

    async def test_default_synchronous_is_normal(self, store: Store):
        """Without a configured level the writer uses NORMAL (1)."""
        assert await pragma(store, "synchronous") == 1

    @pytest.mark.parametrize("level", SYNCHRONOUS_LEVELS)
    async def test_configured_synchronous_is_set(self, db_path: Path, level: str):
        """Each configured level is what SQLite reports for the connection."""
        async with open_store(db_path, synchronous=level.lower()) as store:
            assert await pragma(store, "synchronous") == SYNCHRONOUS_LEVELS.index(level)

    async def test_unknown_synchronous_is_refused(self, db_path: Path):
        """A level outside the four SQLite knows is a ValueError, never interpolated."""
        with pytest.raises(ValueError, match="synchronous must be one of"):
            async with open_store(db_path, synchronous="NORMAL; DROP TABLE items"):
                pass


class TestTransaction:
    async def test_commits_items_and_pushes_together(self, store: Store):
        """Work done with the nocommit methods inside one transaction is committed together."""
        async with store.transaction():
            written = await store.items.insert_many_nocommit([make_item("a"), make_item("b")])
            await store.pushes.claim_many([PushClaim("discord", "e-1", b'{"ok":true}', 1)])
        assert [item.id for item in await store.items.list()] == [w.id for w in written]
        assert await store.pushes.get("discord", "e-1") == b'{"ok":true}'

    async def test_error_rolls_back_everything(self, store: Store):
        """An exception in the body undoes the items and push record written in it."""
        with pytest.raises(RuntimeError):
            async with store.transaction():
                await store.items.insert_many_nocommit([make_item()])
                await store.pushes.claim_many([PushClaim("discord", "e-1", b"{}", 1)])
                raise RuntimeError("boom")
        assert await store.items.list() == []
        assert await store.pushes.get("discord", "e-1") is None

    async def test_cancellation_rolls_back_and_frees_the_connection(self, store: Store):
        """A body cancelled by an anyio scope rolls back, and the next transaction works."""
        with anyio.CancelScope() as scope:
            async with store.transaction():
                await store.items.insert_many_nocommit([make_item("lost")])
                scope.cancel()
                await anyio.sleep_forever()
        assert scope.cancelled_caught
        assert await store.items.list() == []
        await store.items.insert_many([make_item("kept")])
        assert [item.content[0]["text"] for item in await store.items.list()] == ["kept"]

    async def test_asyncio_task_cancel_rolls_back(self, store: Store):
        """A plain asyncio cancel of a task inside a transaction rolls it back too."""
        inside = asyncio.Event()

        async def writer() -> None:
            async with store.transaction():
                await store.items.insert_many_nocommit([make_item("lost")])
                inside.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(writer())
        await inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await store.items.list() == []
        await store.items.insert_many([make_item("kept")])
        assert len(await store.items.list()) == 1

    async def test_nested_transaction_joins_the_outer(self, store: Store):
        """insert_many inside a transaction joins it and is undone by the outer rollback."""
        with pytest.raises(RuntimeError):
            async with store.transaction():
                await store.items.insert_many([make_item()])
                raise RuntimeError("boom")
        assert await store.items.list() == []

    async def test_concurrent_transactions_do_not_interleave(self, store: Store):
        """Two tasks' transactions run one after the other on the one connection."""
        async def writer(name: str) -> None:
            async with store.transaction():
                await store.items.insert_many_nocommit([make_item(f"{name}-1")])
                await anyio.lowlevel.checkpoint()
                await store.items.insert_many_nocommit([make_item(f"{name}-2")])

        async with anyio.create_task_group() as tg:
            for name in ("a", "b", "c"):
                tg.start_soon(writer, name)
        texts = [item.content[0]["text"] for item in await store.items.list()]
        assert len(texts) == 6
        for first, second in zip(texts[::2], texts[1::2]):
            assert first.split("-")[0] == second.split("-")[0]

    async def test_nocommit_outside_a_transaction_is_a_bug(self, store: Store):
        """The nocommit methods refuse to run outside store.transaction()."""
        with pytest.raises(HostStateError):
            await store.items.insert_many_nocommit([make_item()])
        with pytest.raises(HostStateError):
            await store.pushes.claim_many([PushClaim("discord", "e-1", b"{}", 1)])
        with pytest.raises(HostStateError):
            await store.pushes.attach_items_nocommit([("discord", "e-1", 1)])


class TestOpenStore:
    async def test_creates_missing_folders(self, tmp_path: Path):
        """The database's parent folders are created on first open."""
        path = tmp_path / "a" / "b" / "mcplhost.db"
        async with open_store(path) as store:
            assert store.path == path
        assert path.is_file()

    async def test_the_store_files_are_this_users_alone_whatever_the_umask(self, tmp_path: Path):
        """Under umask 0 the new database and the WAL and SHM SQLite makes beside it are 0600; a database an older
        version left 0644 loses others' read (its group's stays: the operator's choice)."""
        fresh, older = tmp_path / "fresh.db", tmp_path / "older.db"
        older.touch()
        os.chmod(older, 0o644)
        previous = os.umask(0)
        try:
            async with open_store(fresh), open_store(older):
                modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in tmp_path.iterdir()}
        finally:
            os.umask(previous)
        assert modes == {"fresh.db": 0o600, "fresh.db-wal": 0o600, "fresh.db-shm": 0o600,
                         "older.db": 0o640, "older.db-wal": 0o640, "older.db-shm": 0o640}

    async def test_without_migrate_applies_nothing_until_asked(self, db_path: Path):
        """migrate=False only checks the version; store.migrate() then applies the steps."""
        async with open_store(db_path, migrate=False) as store:
            assert await store.migrate() == [m.version for m in load_migrations()]

    async def test_not_a_database_is_a_store_error(self, tmp_path: Path):
        """A file that is not SQLite gives a StoreError naming the path and what to check."""
        path = tmp_path / "notes.db"
        path.write_text("these are not the pages you are looking for\n" * 100)
        with pytest.raises(StoreError) as refused:
            async with open_store(path):
                pass
        assert str(path) in str(refused.value)
        assert "store.path" in refused.value.explanation


class TestOpenReader:
    async def test_missing_file(self, tmp_path: Path):
        """A reader pointed at no file raises StoreMissing and creates nothing."""
        path = tmp_path / "absent.db"
        with pytest.raises(StoreMissing) as missing:
            async with open_reader(path):
                pass
        assert missing.value.explanation
        assert not path.exists()

    async def test_reads_beside_a_running_writer(self, store: Store, db_path: Path):
        """A reader sees what the writer committed while the writer stays open."""
        await store.items.insert_many([make_item("one"), make_item("two")])
        async with open_reader(db_path) as reader:
            assert [item.content[0]["text"] for item in await reader.items.list()] == ["one", "two"]

    async def test_cannot_write(self, store: Store, db_path: Path):
        """The reader's connection refuses writes."""
        async with open_reader(db_path) as reader:
            with pytest.raises(sqlite3.OperationalError):
                await reader.items.insert_many([make_item()])

    async def test_unmigrated_database_is_behind(self, tmp_path: Path):
        """A reader on a database still needing migrations says to run `mcplhost migrate`."""
        path = tmp_path / "old.db"
        sqlite3.connect(path).close()
        with pytest.raises(SchemaBehind) as behind:
            async with open_reader(path):
                pass
        assert "mcplhost migrate" in behind.value.explanation


class TestSecretsSearchedOnce:
    """Rows a caller searched for the store's secrets (ingest: one search per request) are not searched again
    while the set is the same; any other write is (docs/architecture.md#the-inbound-hot-path)."""

    async def test_rows_searched_for_this_version_pass_and_a_changed_set_searches_again(self, store: Store):
        store.secrets.update({"DISCORD_TOKEN": "token-0123456789"})
        # The claim is trusted as it stands (the caller made this very search), so a row wrongly claimed clean
        # is written as given: what shows the writer's own search is skipped.
        claimed = make_item("token-0123456789")
        async with store.transaction():
            (first,) = await store.items.insert_many_nocommit(
                [claimed], rows=[item_row(claimed)], searched=store.secrets.version)
        # A row claimed clean for an older version is searched again: its secret is redacted.
        stale = store.secrets.version
        store.secrets.update({"OTHER_TOKEN": "other-0123456789"})
        leaky = make_item("other-0123456789 and token-0123456789")
        async with store.transaction():
            (second,) = await store.items.insert_many_nocommit([leaky], rows=[item_row(leaky)], searched=stale)
            (third,) = await store.items.insert_many_nocommit([leaky])  # no claim: searched as always
        texts = {item.id: item.content[0]["text"] for item in await store.items.list()}
        assert texts[first.id] == "token-0123456789"
        assert texts[second.id] == texts[third.id] == "[redacted:OTHER_TOKEN] and [redacted:DISCORD_TOKEN]"
