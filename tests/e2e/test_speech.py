"""Speech end to end through `mcplhost run`: a scripted connector answering channels/publish, the scripted backend.

docs/agents.md#routing and #outbox: a mention is answered into its own conversation (thread
included); a wake over several conversations becomes a draft and a notice
and publishes nothing; a `>>>` pin splits a reply; prose written before a tool call is published while
the call is still running; `channel_publish` refuses an inbound-only channel.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from mcplhost.inbound.conversation import conversation_id

from ..builders import incoming, message
from ..cli.support import cli, daemon, scripted_connector, write_config
from ..harness import CHAT_MANIFEST, count_rows, received, record, wait_for
from .test_agents import agent_rows, finished_turns, with_agents

ROOM, OTHER, FEED = "disc:g1:room", "disc:g1:other", "disc:g1:feed"
GRANT = ["channels.register", "channels.incoming", "channels.publish", "pushEvents", "channels.lifecycle", "tools"]
REGISTER = {"request": "channels/register", "params": {"channels": [
    {"id": ROOM, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#room"},
    {"id": OTHER, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#other"},
    {"id": FEED, "type": "disc", "direction": "inbound", "address": {}, "label": "#feed"}]}}
DELIVERED = {"result": {"delivered": True, "messageId": "sent-1"}}
#: Alice, asking scout.
ASKED: dict[str, Any] = {"author": {"id": "u-alice", "name": "Alice"}, "tags": ["chat:addressed"]}
WEATHER = {"name": "forecast", "description": "The weather", "inputSchema": {"type": "object", "properties": {}}}


def config_for(tmp_path: Path, steps: list[dict[str, Any]], script: list[Any], *,
               handlers: dict[str, Any] | None = None, debounce_ms: int = 50) -> Path:
    connector = scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": steps, "tools": True,
                                            "handlers": {"channels/publish": DELIVERED,
                                                         "tools/list": {"result": {"tools": [WEATHER]}},
                                                         **(handlers or {})}},
                                   tmp_path, grant=GRANT, restart={"policy": "never"})
    return with_agents(write_config(tmp_path, [connector]),
                       ({"name": "scout", "wake_on": ["addressed"], "debounce_ms": debounce_ms},
                        {"kind": "scripted", "script": script}))


def publishes(tmp_path: Path) -> list[dict[str, Any]]:
    return [m["params"] for m in received(tmp_path, "disc", "channels/publish")]


def outbox(db: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in cli("outbox", "--db", str(db), "--json").stdout.splitlines()]


def delivered(db: Path) -> int:
    """Outbox rows delivered (a poll beside the running host that spawns no process)."""
    return count_rows(db, "outbox", "state = 'delivered'")


def published_text(params: dict[str, Any]) -> str:
    content = params.get("content")
    if isinstance(content, list):
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return str(params.get("text", content))


class TestDefaultDestination:
    async def test_a_mention_in_a_thread_is_published_into_that_thread_and_delivered(self, tmp_path: Path):
        """The reply goes to the room with the thread's conversation id; the outbox row ends delivered, thread kept."""
        db = tmp_path / "host.db"
        steps = [REGISTER, incoming(message(ROOM, "m-1", "scout, hello", threadId="t-1", **ASKED)),
                 {"wait": "channels/publish"}]
        async with daemon(config_for(tmp_path, steps, ["you said: {{echo}}"]), tmp_path) as run:
            await wait_for(lambda: publishes(tmp_path), timeout=30)
            await wait_for(lambda: delivered(db), timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        (sent,) = publishes(tmp_path)
        # The wire names the thread only through the conversation id (docs/connectors.md §13, channels/publish).
        assert sent["channelId"] == ROOM and sent["conversationId"] == conversation_id("disc", ROOM, "t-1")
        assert published_text(sent) == "you said: scout, hello"
        (row,) = outbox(db)
        assert (row["serverId"], row["channelId"], row["threadId"], row["messageId"]) == ("disc", ROOM, "t-1",
                                                                                           "sent-1")

    async def test_several_conversations_give_a_draft_and_a_notice_and_nothing_is_published(self, tmp_path: Path):
        """One wake over two channels: the prose is a draft, a drafts notice follows, no channels/publish goes out."""
        db = tmp_path / "host.db"
        steps = [REGISTER, incoming(message(ROOM, "m-1", "scout?", **ASKED), message(OTHER, "m-2", "scout!", **ASKED))]
        async with daemon(config_for(tmp_path, steps, ["hello both"], debounce_ms=300), tmp_path) as run:
            await wait_for(lambda: finished_turns(db) >= 1, timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        kinds = [r["metadata"]["kind"] for r in agent_rows(db, "scout")]
        assert kinds[-2:] == ["draft", "drafts"]
        assert publishes(tmp_path) == [] and outbox(db) == []


class TestPins:
    async def test_a_pin_sends_what_follows_to_its_channel_and_the_pin_line_to_no_one(self, tmp_path: Path):
        """`>>> #other` splits the reply: the first part to the room, the rest to #other, in that order."""
        db = tmp_path / "host.db"
        steps = [REGISTER, incoming(message(ROOM, "m-1", "scout, tell both", **ASKED)),
                 {"wait": "channels/publish", "count": 2}]
        async with daemon(config_for(tmp_path, steps, ["here\n>>> #other\nthere"]), tmp_path) as run:
            await wait_for(lambda: len(publishes(tmp_path)) >= 2, timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        sent = publishes(tmp_path)
        assert [(p["channelId"], published_text(p).strip()) for p in sent] == [(ROOM, "here"), (OTHER, "there")]
        assert all(">>>" not in published_text(p) for p in sent) and len(outbox(db)) == 2


class TestToolCalls:
    async def test_prose_before_a_tool_call_is_published_while_the_call_runs(self, tmp_path: Path):
        """The connector receives the round's prose as a publish before it answers the (slow) tool call."""
        db = tmp_path / "host.db"
        script = [json.dumps({"text": "let me look", "tool_calls": [{"name": "disc__forecast", "arguments": {}}]}),
                  ""]
        steps = [REGISTER, incoming(message(ROOM, "m-1", "scout, weather?", **ASKED))]
        handlers = {"tools/call": {"delay": 1.0, "result": {"content": [{"type": "text", "text": "sunny"}]}}}
        async with daemon(config_for(tmp_path, steps, script, handlers=handlers), tmp_path) as run:
            await wait_for(lambda: finished_turns(db) >= 1, timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        events = record(tmp_path, "disc").events
        published = next(i for i, e in enumerate(events) if e["kind"] == "in"
                         and e["message"].get("method") == "channels/publish")
        call = next(e["message"]["id"] for e in events if e["kind"] == "in"
                    and e["message"].get("method") == "tools/call")
        answered = next(i for i, e in enumerate(events) if e["kind"] == "out" and e["message"].get("id") == call)
        assert published < answered
        assert published_text(events[published]["message"]["params"]) == "let me look"

    async def test_channel_publish_to_an_inbound_only_channel_is_refused(self, tmp_path: Path):
        """The tool answers refused/inbound_only, and nothing is published or queued."""
        db = tmp_path / "host.db"
        script = [json.dumps({"text": "", "tool_calls": [
            {"name": "channel_publish", "arguments": {"channel": "#feed", "text": "x"}}]}), ""]
        steps = [REGISTER, incoming(message(ROOM, "m-1", "scout, post to feed", **ASKED))]
        async with daemon(config_for(tmp_path, steps, script), tmp_path) as run:
            await wait_for(lambda: finished_turns(db) >= 1, timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        (result,) = [r for r in agent_rows(db, "scout") if r["metadata"]["kind"] == "tool-result"]
        assert json.loads(result["content"][0]["text"]) == {"reason": "inbound_only", "status": "refused"}
        assert publishes(tmp_path) == [] and outbox(db) == []
