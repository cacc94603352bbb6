"""Moderation in a running Host over a real streaming-capable connector (docs/agents.md#moderation).

A refused segment is a draft with reason `moderation` and a notice, and
nothing of it reaches the connector; an allowed one is published; with
moderation on nothing is streamed, though the connector holds
channels.streaming. Checked by a real command and by the local moderations
endpoint (a 500 refuses).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec

from mcplhost.config import AgentConfig, BackendConfig, Config, ModerationConfig
from mcplhost.host import Host

from ..builders import text_of
from ..harness import config_with, received
from ..memory_pair import memory_host
from ..speech.test_moderation import JUDGE
from ..speech.test_streaming import outgoing, turn_connector
from .llm_server import LlmServer
from .support import reply_with_tools

GRANT = ["channels.register", "channels.incoming", "channels.publish", "channels.streaming"]
ROOM = "disc:g1:room"


def judge(tmp_path: Path) -> ModerationConfig:
    """The real command: refuses a text holding "forbidden"."""
    script = tmp_path / "moderate.py"
    script.write_text(JUDGE, encoding="utf-8")
    return ModerationConfig(kind="command", command=[sys.executable, str(script), str(tmp_path / "seen.json")])


def host_config(tmp_path: Path, moderation: ModerationConfig, script: list[Any]) -> Config:
    config = config_with(tmp_path, turn_connector(tmp_path, "disc", GRANT))
    agent = AgentConfig(name="scout", wake_on=["addressed"], debounce_ms=0,
                        backend=BackendConfig(kind="scripted", script=script))
    return msgspec.structs.replace(config, agents=[agent], moderation=moderation)


async def turn_done(host: Host) -> Any:
    """The first finished turn of scout (awaited on the store, bounded)."""
    with anyio.fail_after(30):
        while not (done := [t for t in await host.store.turns.list() if t.outcome is not None]):
            await anyio.sleep(0.02)
    return done[0]


async def rows(host: Host, kind: str) -> list[Any]:
    return [r for r in await host.store.items.list() if r.agent == "scout" and r.metadata.get("kind") == kind]


def publishes(tmp_path: Path) -> list[dict[str, Any]]:
    return received(tmp_path, "disc", "channels/publish")


class TestRefused:
    async def test_a_refused_reply_is_a_draft_with_a_notice_and_nothing_reaches_the_connector(self, tmp_path: Path):
        async with memory_host(host_config(tmp_path, judge(tmp_path), ["this is forbidden"])) as host:
            assert (await turn_done(host)).outcome == "completed"
            (draft,) = await rows(host, "draft")
            (notice,) = await rows(host, "drafts")
            assert await host.store.outbox.list() == []
        assert draft.metadata["reason"] == "moderation" and text_of(draft.content) == "this is forbidden"
        # re-sending would be refused
        assert "moderation" in text_of(notice.content) and "channel_publish" not in text_of(notice.content)
        assert publishes(tmp_path) == [] and outgoing(tmp_path, "disc") == []

    async def test_a_refused_channel_publish_answers_refused_and_is_kept_as_a_draft(self, tmp_path: Path):
        script = [reply_with_tools("", ("channel_publish", {"channel": ROOM, "text": "forbidden words"})), "fine"]
        async with memory_host(host_config(tmp_path, judge(tmp_path), script)) as host:
            await turn_done(host)
            (result,) = await rows(host, "tool-result")
            (draft,) = await rows(host, "draft")
            (speech,) = await rows(host, "speech")
        assert json.loads(text_of(result.content)) == {"status": "refused", "reason": "moderation"}
        assert draft.metadata["reason"] == "moderation" and text_of(draft.content) == "forbidden words"
        assert text_of(speech.content) == "fine" and speech.metadata["outboxId"]  # the closing prose passed and was queued

    async def test_a_moderations_endpoint_answering_500_refuses(self, tmp_path: Path):
        """Fail-closed: the check errs, so the segment is a draft; the endpoint was asked."""
        with LlmServer() as server:
            server.moderation_status = 500
            moderation = ModerationConfig(kind="openai", base_url=server.openai_base_url, timeout_s=5.0)
            async with memory_host(host_config(tmp_path, moderation, ["hello, Ann"])) as host:
                await turn_done(host)
                (draft,) = await rows(host, "draft")
                assert await host.store.outbox.list() == []
            asked = [r for r in server.requests if r.path == "/v1/moderations"]
        assert draft.metadata["reason"] == "moderation" and asked
        assert publishes(tmp_path) == [] and outgoing(tmp_path, "disc") == []


class TestAllowed:
    async def test_an_allowed_reply_is_published_and_nothing_was_streamed(self, tmp_path: Path):
        """The connector holds channels.streaming, yet with moderation on no channels/outgoing/* goes out."""
        async with memory_host(host_config(tmp_path, judge(tmp_path), ["hello, Ann"])) as host:
            await turn_done(host)
            with anyio.fail_after(30):
                while not publishes(tmp_path):
                    await anyio.sleep(0.02)
            assert await rows(host, "draft") == []
        assert json.loads((tmp_path / "seen.json").read_text())["destination"] == f"disc/{ROOM}"
        assert outgoing(tmp_path, "disc") == []

    async def test_a_reply_the_endpoint_does_not_flag_is_published(self, tmp_path: Path):
        with LlmServer() as server:
            server.flag_words = {"forbidden"}
            moderation = ModerationConfig(kind="openai", base_url=server.openai_base_url, timeout_s=5.0)
            async with memory_host(host_config(tmp_path, moderation, ["hello, Ann"])) as host:
                await turn_done(host)
                with anyio.fail_after(30):
                    while not publishes(tmp_path):
                        await anyio.sleep(0.02)
        assert outgoing(tmp_path, "disc") == []
