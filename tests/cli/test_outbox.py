"""`mcplhost outbox` (in-process): the export shape, --state, the plain line, and a missing database."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import anyio

from mcplhost.store import NewItem, open_store
from mcplhost.store.operations import EndPublish, PublishSpeech
from mcplhost.store.outbox import OutboxEntry
from mcplhost.store.writer import GroupWriter

from .support import cli

EXPORT_KEYS = ["id", "agent", "turnId", "serverId", "channelId", "threadId", "state", "attempts", "messageId",
               "lastError", "createdAt", "deliveredAt"]
QUEUED = 1_790_000_000_000  # 2026-09-21T14:13:20Z


async def seed(db: Path) -> None:
    """Three publishes: one delivered, one failed (its error has a quote and a newline), one pending."""
    speech = NewItem(role="assistant", content=[{"type": "text", "text": "x"}], metadata={"kind": "speech"},
                     created_at=QUEUED, agent="scout", participant="scout")
    entries = [OutboxEntry(agent="scout", turn_id=4, server_id="disc", channel_id=f"room{n}",
                           thread_id="t 1" if n == 2 else None, conversation_id=f"c{n}", text=f"n{n}",
                           created_at=QUEUED + n) for n in range(3)]
    async with open_store(db) as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        published = await writer.write(PublishSpeech(speech, entries))
        first, second, _ = published.outbox_ids
        await writer.submit(EndPublish(first, "delivered", QUEUED + 50, message_id="m-1"),
                            EndPublish(second, "failed", QUEUED + 60, error='refused "no"\nreally'))
        tg.cancel_scope.cancel()


def lines(*args: str) -> list[str]:
    done = cli("outbox", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_json_lists_every_publish_with_its_state(tmp_path: Path):
    """--json prints one README.md#commands object per publish, oldest first, every key present."""
    db = tmp_path / "host.db"
    anyio.run(seed, db)
    rows = [json.loads(line) for line in lines("--db", str(db), "--json")]
    assert [list(row) for row in rows] == [EXPORT_KEYS] * 3
    assert [(r["state"], r["attempts"], r["messageId"]) for r in rows] == [
        ("delivered", 1, "m-1"), ("failed", 1, None), ("pending", 0, None)]
    assert rows[0]["deliveredAt"] == QUEUED + 50 and rows[1]["lastError"] == 'refused "no"\nreally'
    assert rows[2]["threadId"] == "t 1" and rows[2]["deliveredAt"] is None and rows[2]["turnId"] == 4


def test_state_filters_and_plain_lines_stay_one_line_each(tmp_path: Path):
    """--state keeps one state; the plain line quotes a multi-line error so each publish stays on one line."""
    db = tmp_path / "host.db"
    anyio.run(seed, db)
    assert [json.loads(x)["state"] for x in lines("--db", str(db), "--json", "--state", "pending")] == ["pending"]
    plain = lines("--db", str(db))
    assert len(plain) == 3 and "2026-09-21T14:13:20Z" in plain[0] and "message=m-1" in plain[0]
    assert "failed" in plain[1] and "\\n" in plain[1] and "disc/room2 thread t 1" in plain[2]


def test_a_missing_database_is_one_clear_line(tmp_path: Path):
    """A --db that does not exist exits non-zero with one line on stderr, nothing on stdout."""
    done = cli("outbox", "--db", str(tmp_path / "nope.db"))
    assert done.returncode != 0 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1


def test_a_database_before_the_outbox_asks_for_migrate(tmp_path: Path):
    """A database at schema 3 (no outbox table yet) is refused with one line naming migrate, not a traceback."""
    db = tmp_path / "host.db"
    anyio.run(seed, db)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM schema_version WHERE version >= 4")  # the outbox came with 4
        conn.execute("DROP TABLE outbox")
    conn.close()
    done = cli("outbox", "--db", str(db))
    assert done.returncode == 1 and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert "migrate" in done.stderr
