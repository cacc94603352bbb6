"""A queued peer message survives kill -9 of `mcplhost run` and is delivered exactly once after the restart.

writer is held in a turn by a connector tool that does not answer in the first run; scout (woken later by the same chat item,
its debounce longer) sends it a message, which is answered `queued` and written to the queue. The host is
killed with SIGKILL; the next start delivers the message (one row, the entry marked delivered) and wakes
writer for it; a third start delivers nothing again.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

from ..builders import incoming, message
from ..cli.support import daemon, scripted_connector, write_config
from ..harness import CHAT_MANIFEST, count_rows, record, wait_for
from .test_agents import agent_rows, turns, with_agents
from .test_speech import ASKED, GRANT, REGISTER, ROOM

SLOW_TOOL = {"name": "wait", "description": "Waits", "inputSchema": {"type": "object", "properties": {}}}


def config(tmp_path: Path, name: str, *, tool_delay_s: float) -> Path:
    """Three agents of one tree; writer's first turn calls `disc__wait`, which answers after `tool_delay_s`."""
    handlers = {"tools/list": {"result": {"tools": [SLOW_TOOL]}},
                "tools/call": {"delay": tool_delay_s, "result": {"content": [{"type": "text", "text": "done"}]}}}
    connector = scripted_connector("disc", {"manifest": CHAT_MANIFEST, "tools": True, "handlers": handlers,
                                            "steps": [REGISTER, incoming(message(ROOM, "m-1", "@writer @scout, everyone, go", **ASKED))]},
                                   tmp_path, grant=GRANT, restart={"policy": "never"})
    send = json.dumps({"text": "", "tool_calls": [{"name": "task_send_message", "arguments": {
        "target": "writer", "message": "the notes are in the wiki"}}]})
    wait = json.dumps({"text": "", "tool_calls": [{"name": "disc__wait", "arguments": {}}]})
    lead: dict[str, Any] = {"name": "lead", "wake_on": []}  # woken by peer messages only
    return with_agents(write_config(tmp_path, [connector], name=name),
                       (lead, {"kind": "scripted", "script": [""]}),
                       ({"name": "writer", "parent": "lead", "wake_on": ["addressed"], "debounce_ms": 0,
                         "tool_timeout_s": 3600}, {"kind": "scripted", "script": [wait, ""]}),
                       ({"name": "scout", "parent": "lead", "wake_on": ["addressed"], "debounce_ms": 500},
                        {"kind": "scripted", "script": [send, ""]}))


def queue(db: Path) -> list[tuple[str, str, int | None]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT status, state, item_id FROM peer_messages ORDER BY id").fetchall()
    finally:
        conn.close()


class TestQueueAcrossKill:
    async def test_a_queued_message_is_delivered_once_after_kill_9(self, tmp_path: Path):
        db = tmp_path / "host.db"
        async with daemon(config(tmp_path, "first.toml", tool_delay_s=3600), tmp_path) as first:
            await wait_for(lambda: count_rows(db, "peer_messages", "state = 'queued'") == 1, timeout=30)
            first.signal(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        assert queue(db) == [("queued", "queued", None)]
        assert [r for r in agent_rows(db, "writer") if "peer" in r["metadata"]] == []

        async with daemon(config(tmp_path, "second.toml", tool_delay_s=0), tmp_path) as second:
            await wait_for(lambda: count_rows(db, "peer_messages", "state = 'delivered'") == 1, timeout=30)
            await wait_for(lambda: any(t["agent"] == "writer" and len(t["wakeItemIds"]) == 1
                                       and t["wakeItemIds"][0] == queue(db)[0][2] for t in turns(db)), timeout=30)
            second.signal(signal.SIGKILL)
            assert await second.wait() == -signal.SIGKILL

        def starts() -> int:
            return sum(e["kind"] == "start" for e in record(tmp_path, "disc").events)

        before = starts()
        async with daemon(config(tmp_path, "third.toml", tool_delay_s=0), tmp_path) as third:
            # The connector starts only once the agents (and the peer queue's start) are up.
            await wait_for(lambda: starts() == before + 1, timeout=30)
            third.signal(signal.SIGTERM)
            assert await third.wait() == 0
        (status, state, item_id) = queue(db)[0]
        rows = [r for r in agent_rows(db, "writer") if "peer" in r["metadata"]]
        assert (status, state) == ("queued", "delivered") and [r["id"] for r in rows] == [item_id]
        assert rows[0]["metadata"]["peer"] == {"from": "scout", "relationship": "sibling"}
        assert "the notes are in the wiki" in rows[0]["content"][0]["text"]
