"""A host killed with kill -9 while a publish is pending delivers it after the next start (at least once)."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import anyio

from mcplhost.store import open_store
from mcplhost.store.operations import PublishSpeech
from mcplhost.store.writer import GroupWriter

from ..cli.support import daemon, scripted_connector, write_config
from ..harness import alive, record, wait_for
from .test_outbox import DELIVERED, GRANT, MANIFEST, REGISTER, publish_entry, publishes


async def queue_offline(db: Path, text: str) -> int:
    """Queue a publish in the database before any host runs, as a turn of an earlier run left it."""
    speech, entry = publish_entry(text)
    async with open_store(db) as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        published = await writer.write(PublishSpeech(speech, [entry]))
        tg.cancel_scope.cancel()
    return published.outbox_ids[0]


def outbox_row(db: Path, outbox_id: int) -> tuple[str, int, str | None]:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT state, attempts, message_id FROM outbox WHERE id = ?", (outbox_id,)).fetchone()
    conn.close()
    return row


async def test_kill_9_with_a_publish_pending_delivers_it_after_the_restart(tmp_path: Path):
    """First run: the connector never answers and the host is killed; the second run sends it again, delivered."""
    db = tmp_path / "host.db"
    oid = await queue_offline(db, "still here")
    table = scripted_connector("disc", {"manifest": MANIFEST, "handlers": {"channels/publish": "ignore"}, "steps": [REGISTER]}, tmp_path,
                               grant=GRANT, restart={"policy": "never"})
    config = write_config(tmp_path, [table])
    async with daemon(config, tmp_path) as first:
        await wait_for(lambda: publishes(tmp_path), timeout=30)
        first.signal(signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
    assert outbox_row(db, oid)[0] == "pending"
    pid = next(e["pid"] for e in record(tmp_path, "disc").events if e["kind"] == "start")
    await wait_for(lambda: not alive(pid))

    script = tmp_path / "disc.script.json"
    script.write_text(json.dumps({**json.loads(script.read_text()), "handlers": {"channels/publish": DELIVERED}}))
    async with daemon(config, tmp_path) as second:
        await wait_for(lambda: outbox_row(db, oid)[0] != "pending", timeout=30)
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0
    assert outbox_row(db, oid) == ("delivered", 1, "m-1")  # the lost try was never recorded: one counted
    assert [m["params"]["content"][0]["text"] for m in publishes(tmp_path)] == ["still here", "still here"]
