"""Echo suppression end to end through `mcplhost run`: the bot's own delivered message comes back and wakes no one.

A scripted connector answers the agent's `channels/publish` with a messageId,
then delivers a message with that id back, tagged as a mention (as a platform
showing the bot its own words might), then a real mention from someone else.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from ..builders import incoming, message
from ..cli.support import cli, daemon
from ..harness import wait_for
from .test_agents import finished_turns, turns
from .test_speech import ASKED, REGISTER, ROOM, config_for, outbox

BOT = {"id": "u-scout", "name": "Scout"}


def echo(message_id: str) -> dict[str, Any]:
    """The platform delivering the bot's own published message back, tagged as a mention of the bot."""
    return message(ROOM, message_id, "you said: scout, hello", author=BOT, tags=["chat:mention"])


def stored(db: Path, message_id: str) -> dict[str, Any]:
    """The one inbound item with that messageId, as `mcplhost messages --json` exports it."""
    lines = cli("messages", "--db", str(db), "--json").stdout.splitlines()
    (item,) = [r for r in map(json.loads, lines) if r["role"] == "user" and r["metadata"].get("messageId") == message_id]
    return item


async def run_with(tmp_path: Path, steps: list[dict[str, Any]]) -> Path:
    """Run the host over the steps until two turns have finished; the database."""
    db = tmp_path / "host.db"
    async with daemon(config_for(tmp_path, steps, ["you said: {{echo}}"]), tmp_path) as run:
        await wait_for(lambda: finished_turns(db) >= 2, timeout=30)
        run.signal(signal.SIGTERM)
        assert await run.wait() == 0
    return db


class TestEcho:
    async def test_the_bots_own_delivered_message_tagged_as_a_mention_wakes_no_one(self, tmp_path: Path):
        """The echo is stored with echoOf = the outbox id and host:echo; only the two real mentions get turns."""
        steps = [REGISTER, incoming(message(ROOM, "m-1", "scout, hello", **ASKED)), {"wait": "channels/publish"},
                 {"sleep": 0.5},  # the platform's echo comes after its answer was taken in (stage.ECHO_DELAY_S)
                 incoming(echo("sent-1")), incoming(message(ROOM, "m-2", "scout, again", **ASKED)),
                 {"wait": "channels/publish", "count": 2}]
        db = await run_with(tmp_path, steps)
        item = stored(db, "sent-1")
        (first, *_) = outbox(db)
        assert item["metadata"]["echoOf"] == first["id"] and "host:echo" in item["metadata"]["tags"]
        ledger = turns(db)
        woke = [i for t in ledger for i in t["wakeItemIds"]]
        assert item["id"] not in woke and len(ledger) == 2

    async def test_an_echo_before_its_publish_is_answered_still_wakes_no_one(self, tmp_path: Path):
        """Sent at once after the publish (its answer may not be in yet): the wake's second look leaves it out."""
        steps = [REGISTER, incoming(message(ROOM, "m-1", "scout, hello", **ASKED)), {"wait": "channels/publish"},
                 incoming(echo("sent-1")), incoming(message(ROOM, "m-2", "scout, again", **ASKED)),
                 {"wait": "channels/publish", "count": 2}]
        db = await run_with(tmp_path, steps)
        item = stored(db, "sent-1")
        ledger = turns(db)
        woke = [i for t in ledger for i in t["wakeItemIds"]]
        assert item["id"] not in woke and len(ledger) == 2
