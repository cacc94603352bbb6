"""Tests for migrations/sqlite/*.sql: what 0002 does to a database from 0001, duplicates included."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import msgspec

from mcplhost.store import open_store
from mcplhost.store.migrate import default_folder

from .conftest import make_item

DIGEST = "a" * 64


async def version_1_database(tmp_path: Path) -> Path:
    """A database migrated by the 0001 schema only (what a host before 0002 left behind)."""
    folder = tmp_path / "v1"
    folder.mkdir()
    shutil.copy(Path(str(default_folder())) / "0001_initial.sql", folder / "0001_initial.sql")
    db = tmp_path / "old.db"
    async with open_store(db, migrations_folder=folder):
        pass
    return db


def old_row(conn: sqlite3.Connection, text: str, *, lane: str = "channels/incoming", message: str | None = "m-1",
            thread: str | None = None, event: str | None = None, server: str = "disc") -> int:
    metadata = {"serverId": server, "channelId": "disc:room", "messageId": message, "threadId": thread,
                "eventId": event, "source": {"lane": lane}, "sourceBodyDigest": DIGEST}
    cursor = conn.execute(
        "INSERT INTO items (agent, participant, role, content, metadata, server_id, channel_id, message_id, created_at)"
        " VALUES (NULL, 'Alice', 'user', ?, ?, ?, 'disc:room', ?, 1)",
        (json.dumps([{"type": "text", "text": text}]), json.dumps(metadata), server, message))
    return cursor.lastrowid


class TestMigration0002:
    async def test_old_duplicates_stay_and_the_first_becomes_the_original(self, tmp_path: Path):
        """Redeliveries stored twice before 0002 are kept; the first gets the key, so a new redelivery maps to it."""
        db = await version_1_database(tmp_path)
        with sqlite3.connect(db) as conn:
            first = old_row(conn, "hello")
            copy = old_row(conn, "hello")
            threaded = old_row(conn, "in a thread", message="m-2", thread="topic")
            pushed = old_row(conn, "tick", lane="push/event", message=None, event="e-1")
            conn.execute("INSERT INTO push_events VALUES ('disc', 'e-1', '{\"accepted\":true}', 1)")
            conn.execute("INSERT INTO push_events VALUES ('disc', 'e-lost', '{\"accepted\":true}', 1)")
        conn.close()

        async with open_store(db) as store:
            item = make_item("hello again", server="disc", channel="disc:room")
            redelivery = msgspec.structs.replace(item, metadata={**item.metadata, "messageId": "m-1"},
                                                 dedup_digest=DIGEST)
            async with store.transaction():
                (written,) = await store.items.insert_many_nocommit([redelivery])
            assert (written.id, written.duplicate, written.conversation_id) == (first, True, None)
            assert await store.items.thread_of("disc", "disc:room", "m-2") == "topic"
            assert len(await store.items.list()) == 4  # nothing deleted, nothing added

        with sqlite3.connect(db) as conn:
            keys = dict(conn.execute("SELECT id, dedup_digest FROM items").fetchall())
            pushes = dict(conn.execute("SELECT event_id, item_id FROM push_events").fetchall())
        conn.close()
        assert keys == {first: DIGEST, copy: None, threaded: DIGEST, pushed: None}
        assert pushes == {"e-1": pushed, "e-lost": None}
