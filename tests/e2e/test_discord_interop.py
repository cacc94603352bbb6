"""Typing, acknowledge and backscroll with the discord-mcpl look-alike (docs/mcpl-compat.md#typing-and-acknowledge).

An in-process Host with one agent on the scripted backend answers the
mention mcplhost.connectors.discordish delivers in #random. Its turn calls the
stub's `wait_typing` tool (which returns once the fake Discord showed the
indicator, so the turn lasts at least that long) and `channel_open` with
`history`, then replies. The stub's record is what the fake Discord saw.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from structlog.testing import capture_logs

from mcplhost.agents.turns.acknowledge import ACK_TIMEOUT_S
from mcplhost.config import Config

from ..agents.support import agent_config, reply_with_tools, scripted
from ..builders import texts
from ..connectors.test_discordish import discordish, events
from ..harness import config_with, running_host, stored_items, wait_for

RANDOM = "discord:g1:random"
#: The grant of the issue's outside check, with the two extensions.
GRANT = ["channels.register", "channels.incoming", "channels.publish", "channels.lifecycle", "pushEvents", "tools",
         "channels.typing", "channels.acknowledge"]
WITHOUT = [path for path in GRANT if path not in ("channels.typing", "channels.acknowledge")]
REPLY = "The deploy notes are up."


def config(folder: Path, grant: list[str], *, tools: bool = True, **env: str) -> Config:
    connector = discordish(folder, grant=grant)
    connector = msgspec.structs.replace(connector, env={**connector.env, "DISCORD_MESSAGES": "2", **env})
    calls = [("discord__wait_typing", {"channelId": RANDOM, "timeout_s": 10}),
             ("channel_open", {"channel": f"discord/{RANDOM}", "history": 5})] if tools else []
    first = reply_with_tools("", *calls) if calls else REPLY
    agent = agent_config("scout", wake_on=["addressed"], ack_reaction=" 👀 ", backend=scripted(first, REPLY))
    return msgspec.structs.replace(config_with(folder, connector), agents=[agent])


def kinds(record: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in record if e["kind"] == kind]


def published(folder: Path) -> list[dict[str, Any]]:
    return kinds(events(folder), "published")


class TestDiscordInterop:
    async def test_typing_during_the_turn_a_reaction_on_the_waking_message_and_backscroll(self, tmp_path) -> None:
        async with running_host(config(tmp_path, GRANT)):
            await wait_for(lambda: published(tmp_path))
            items = await stored_items(tmp_path)
        record = events(tmp_path)
        order = [e["kind"] for e in record]
        typing = kinds(record, "typing")
        # Typing: start in the mention's channel while the turn ran (the tool saw it), stop before the reply.
        assert typing[0] == {"kind": "typing", "channelId": RANDOM, "op": "start", "indicator": True}
        assert typing[-1]["op"] == "stop" and [e["op"] for e in typing].count("stop") == 1
        assert {e["channelId"] for e in typing} == {RANDOM}
        opened_at = next(i for i, e in enumerate(record) if e["kind"] == "opened" and e["channelId"] == RANDOM)
        stopped_at = len(order) - 1 - order[::-1].index("typing")
        assert order.index("typing") < opened_at < stopped_at < order.index("published")
        # Acknowledge: the 👀 (trimmed) on the waking message m-1, once.
        (reaction,) = kinds(record, "reaction")
        assert reaction == {"kind": "reaction", "channelId": RANDOM, "messageId": "m-1", "value": "👀",
                            "intent": "seen", "answer": {"acknowledged": True, "representation": "👀"}}
        # Backscroll: asked with history.limit, answered with history, each entry shown under its own header.
        (opened,) = [e for e in kinds(record, "opened") if e["channelId"] == RANDOM]
        assert opened["history"] == {"limit": 5} and opened["answered"] == ["h-random-0", "h-random-1",
                                                                            "h-random-2", "m-1"]
        results = [item for item in items if item.metadata.get("kind") == "tool-result"
                   or item.role == "tool"]
        shown = "\n".join(t for item in results for t in texts(item.content))
        assert "typing indicator shown in discord:g1:random" in shown
        assert "4 recent message(s)" in shown and "Earlier in #random, message 2." in shown
        assert f"[source: discord / {RANDOM}" in shown
        (reply,) = published(tmp_path)
        assert reply["channelId"] == RANDOM and json.dumps(reply["content"], ensure_ascii=False).count(REPLY) == 1

    async def test_a_connector_without_the_paths_gets_no_typing_and_no_acknowledge(self, tmp_path) -> None:
        """Granted neither path, the stub sees no typing and no reaction, and the reply goes out all the same."""
        async with running_host(config(tmp_path, WITHOUT, tools=False)):
            await wait_for(lambda: published(tmp_path))
        record = events(tmp_path)
        assert kinds(record, "typing") == [] and kinds(record, "reaction") == []
        assert published(tmp_path)[0]["channelId"] == RANDOM

    async def test_an_acknowledge_that_is_never_answered_does_not_delay_the_turn(self, tmp_path) -> None:
        """The stub takes the acknowledge and never answers: the reply is delivered long before its bound."""
        with capture_logs() as logs:
            async with running_host(config(tmp_path, GRANT, tools=False, DISCORD_ACK="hang")):
                with_ack = await wait_for(lambda: kinds(events(tmp_path), "reaction"))
                await wait_for(lambda: published(tmp_path), timeout=ACK_TIMEOUT_S / 2)
                turns = [e for e in logs if e["event"] == "agent.turn"]
        assert with_ack[0]["messageId"] == "m-1" and with_ack[0]["answer"] is None
        assert [e["outcome"] for e in turns] == ["completed"]
        assert turns[0]["seconds"] < ACK_TIMEOUT_S / 2
