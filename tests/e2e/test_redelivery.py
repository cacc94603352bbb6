"""Redelivered channel messages through real processes: a connector restart, a lost answer, a host kill -9.

docs/connectors.md §6: an identical redelivery (same connector, channel, messageId and
delivered body) is stored once and answered as the first delivery was.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from mcplhost.config import ConnectorConfig, RestartConfig
from mcplhost.inbound.conversation import conversation_id

from ..cli.support import cli, daemon, scripted_connector, write_config
from ..harness import (
    CHAT_GRANT,
    CHAT_MANIFEST,
    REPO,
    SCRIPTED_COMMAND,
    alive,
    config_with,
    record,
    running_host,
    wait_for,
)

ROOM = "disc:g1:room"
#: Requests in flight when the host is killed.
LOAD = 200
REGISTER = {"request": "channels/register", "params": {"channels": [
    {"id": ROOM, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#room"}]}}
MESSAGE = {"channelId": ROOM, "messageId": "m-1", "author": {"id": "alice", "name": "Alice"},
           "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": "hello"}]}
INCOMING = {"request": "channels/incoming", "params": {"messages": [MESSAGE]}}
RAW_INCOMING = {"raw": json.dumps({"jsonrpc": "2.0", "id": 900, "method": "channels/incoming",
                                   "params": {"messages": [MESSAGE]}})}
ACCEPTED = {"results": [{"messageId": "m-1", "accepted": True, "conversationId": conversation_id("disc", ROOM, None)}]}


def rows(db: Path) -> list[tuple[Any, ...]]:
    """(id, message_id) of every stored item, read with plain sqlite3 beside the host."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        try:
            found = conn.execute("SELECT id, message_id FROM items ORDER BY id").fetchall()
        except sqlite3.OperationalError:  # the host is still creating the schema
            found = []
    conn.close()
    return found


def answers(folder: Path, name: str, step: int) -> list[dict[str, Any]]:
    """Every process life's answer to `step`, in order."""
    return [e for e in record(folder, name).events if e["kind"] == "answer" and e.get("step") == step]


def lives(folder: Path, name: str) -> int:
    return sum(1 for e in record(folder, name).events if e["kind"] == "start")


def restarting(folder: Path, first_steps: list[dict[str, Any]]) -> tuple[ConnectorConfig, Path]:
    """A scripted connector read from a file, so a test can give the next process life other steps."""
    script = folder / "disc.script.json"
    script.write_text(json.dumps({"manifest": CHAT_MANIFEST, "steps": first_steps,
                                  "record": str(folder / "disc.jsonl")}), encoding="utf-8")
    spec = ConnectorConfig(name="disc", command=SCRIPTED_COMMAND,
                           env={"MCPL_SCRIPT": f"@{script}", "PYTHONPATH": str(REPO)}, cwd=str(REPO),
                           grant=CHAT_GRANT, request_timeout_s=5.0,
                           restart=RestartConfig(policy="on-failure", backoff_initial_s=0.5))
    return spec, script


class TestRedeliveryAcrossRestarts:
    @pytest.mark.parametrize("first_delivery", [INCOMING, RAW_INCOMING], ids=["answered", "answer-lost"])
    async def test_a_restarted_connector_resending_stores_nothing_new(self, tmp_path: Path,
                                                                      first_delivery: dict[str, Any]):
        """The connector sends m-1, dies (with or without reading the answer), restarts and sends it again: one row."""
        spec, script = restarting(tmp_path, [REGISTER, first_delivery, {"exit": 1}])
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: lives(tmp_path, "disc") >= 1)
            # The first life has read its script; the restarted one resends and then stays up.
            script.write_text(json.dumps({"manifest": CHAT_MANIFEST, "steps": [REGISTER, INCOMING],
                                          "record": str(tmp_path / "disc.jsonl")}), encoding="utf-8")
            await wait_for(lambda: lives(tmp_path, "disc") == 2 and record(tmp_path, "disc").events[-1]["kind"]
                           == "done")
        second = answers(tmp_path, "disc", 1)[-1]
        assert second["result"] == ACCEPTED
        if first_delivery is INCOMING:
            assert answers(tmp_path, "disc", 1)[0]["result"] == ACCEPTED  # answered the same both times
        assert [message for _, message in rows(tmp_path / "host.db")] == ["m-1"]


class TestKilledHost:
    async def test_kill_9_after_the_commit_then_a_redelivery_stores_no_duplicate(self, tmp_path: Path):
        """`mcplhost run` killed once m-1 is committed (answer sent or not); the next run's redelivery adds no row."""
        db = tmp_path / "host.db"
        config = write_config(tmp_path, [scripted_connector(
            "disc", {"manifest": CHAT_MANIFEST, "steps": [REGISTER, INCOMING]}, tmp_path, grant=CHAT_GRANT,
            restart={"policy": "never"})], store=str(db))
        async with daemon(config, tmp_path) as first:
            await wait_for(lambda: db.exists() and rows(db), interval=0.002)
            first.signal(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        pid = next(e["pid"] for e in record(tmp_path, "disc").events if e["kind"] == "start")
        await wait_for(lambda: not alive(pid))  # the orphaned connector ends at its stdin's end

        async with daemon(config, tmp_path) as second:
            await wait_for(lambda: lives(tmp_path, "disc") == 2 and record(tmp_path, "disc").events[-1]["kind"]
                           == "done")
            second.signal(signal.SIGTERM)
            assert await second.wait() == 0
        assert answers(tmp_path, "disc", 1)[-1]["result"] == ACCEPTED
        assert [message for _, message in rows(db)] == ["m-1"]
        exported = [json.loads(line) for line in cli("messages", "--db", str(db), "--json").stdout.splitlines()]
        assert len(exported) == 1 and exported[0]["metadata"]["messageId"] == "m-1"

    async def test_kill_9_under_load_then_a_full_replay_stores_each_message_once(self, tmp_path: Path):
        """Killed while 200 requests are in flight (some committed, not all answered); a replay of all adds only the rest."""
        db = tmp_path / "host.db"
        flood = [["channels/incoming", {"messages": [{**MESSAGE, "messageId": f"m-{n}"}]}] for n in range(LOAD)]
        config = write_config(tmp_path, [scripted_connector(
            "disc", {"manifest": CHAT_MANIFEST, "steps": [REGISTER, {"requests": flood}]}, tmp_path,
            grant=CHAT_GRANT, restart={"policy": "never"})], store=str(db))
        async with daemon(config, tmp_path) as first:
            await wait_for(lambda: db.exists() and len(rows(db)) >= LOAD // 4, interval=0.002)
            first.signal(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        pid = next(e["pid"] for e in record(tmp_path, "disc").events if e["kind"] == "start")
        await wait_for(lambda: not alive(pid))
        committed = len(rows(db))

        async with daemon(config, tmp_path) as second:
            await wait_for(lambda: lives(tmp_path, "disc") == 2 and record(tmp_path, "disc").events[-1]["kind"]
                           == "done", timeout=60)
            second.signal(signal.SIGTERM)
            assert await second.wait() == 0
        stored = [message for _, message in rows(db)]
        assert sorted(stored) == sorted(f"m-{n}" for n in range(LOAD)), f"{committed} were committed before the kill"

