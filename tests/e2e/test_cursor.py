"""The durable cursor as a low-water mark, end to end through `mcplhost run` and kill -9.

Under `context_scope = "conversation"`, items 10 (room A), 11 (room B) and
12 (A) make B's wake due first. B's turn ends while A's items still pend;
the cursor written with it must stay below 10, so that a host killed then
wakes the agent for 10 on the next start.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

from ..builders import incoming, message
from ..cli.support import daemon, scripted_connector, write_config
from ..harness import CHAT_GRANT, CHAT_MANIFEST, alive, record, wait_for
from .test_agents import finished_turns, item_ids, turns, with_agents

ROOM_A, ROOM_B = "disc:g1:a", "disc:g1:b"
REGISTER = {"request": "channels/register", "params": {"channels": [
    {"id": room, "type": "disc", "direction": "bidirectional", "address": {}, "label": f"#{room[-1]}"}
    for room in (ROOM_A, ROOM_B)]}}


ASKED = {"author": {"id": "u-alice", "name": "Alice"}, "tags": ["chat:addressed"]}


def cursor_of(db: Path, agent: str) -> int | None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT item_id FROM agent_cursors WHERE agent = ?", (agent,)).fetchone()
    finally:
        conn.close()
    return row[0] if row else None


def completed_wakes(db: Path) -> list[list[int]]:
    """Each completed turn's waking item ids, read with plain sqlite3 beside the running host."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT wake_item_ids FROM turns WHERE outcome = 'completed' ORDER BY id").fetchall()
    finally:
        conn.close()
    return [json.loads(row[0]) for row in rows]


class TestLowWaterMarkAcrossKill:
    async def test_kill_9_after_another_conversation_s_turn_still_wakes_the_first_item(self, tmp_path: Path):
        """First run: B's turn ends, A's is held (max_turns_per_hour = 1); kill -9. The next run wakes A for 10."""
        db = tmp_path / "host.db"
        # Pauses keep the three in separate commits, so the scheduler sees them in id order; the long debounce
        # (each group is due 2 s after its latest item) makes B's group due first, however slow the machine.
        steps = [REGISTER, incoming(message(ROOM_A, "m-10", "a first", **ASKED)), {"sleep": 0.05},
                 incoming(message(ROOM_B, "m-11", "b only", **ASKED)), {"sleep": 0.05},
                 incoming(message(ROOM_A, "m-12", "a again", **ASKED))]
        connector = scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path,
                                       grant=CHAT_GRANT, restart={"policy": "never"})
        agent = {"name": "scout", "wake_on": ["addressed"], "context_scope": "conversation"}
        backend = {"kind": "scripted", "script": ["seen"]}
        held = with_agents(write_config(tmp_path, [connector], name="held.toml"),
                           ({**agent, "debounce_ms": 2000, "max_wait_ms": 10_000, "max_turns_per_hour": 1}, backend))
        async with daemon(held, tmp_path) as first:
            await wait_for(lambda: len(item_ids(db)) == 3 and finished_turns(db) >= 1, timeout=30)
            ten, eleven, twelve = item_ids(db)
            (b_turn,) = turns(db)
            cursor = cursor_of(db, "scout")
            first.signal(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        assert b_turn["wakeItemIds"] == [eleven] and b_turn["outcome"] == "completed"
        assert cursor is not None and cursor < ten  # B's turn did not move it past A's pending 10
        pid = next(e["pid"] for e in record(tmp_path, "disc").events if e["kind"] == "start")
        await wait_for(lambda: not alive(pid))

        again = with_agents(write_config(tmp_path, [connector], name="again.toml"), ({**agent, "debounce_ms": 10},
                                                                                     backend))
        async with daemon(again, tmp_path) as second:
            await wait_for(lambda: any(ten in wake for wake in completed_wakes(db)), timeout=30)
            second.signal(signal.SIGTERM)
            assert await second.wait() == 0
        # Catch-up: one wake for conversation A; 11, above the cursor but handled by B's turn, does not wake again.
        assert completed_wakes(db) == [[eleven], [ten, twelve]]
        assert cursor_of(db, "scout") >= twelve
