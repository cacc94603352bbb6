"""The outbox sender against real connector processes: delivery, order, refusals, retries, restarts."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcplhost.config import ConnectorConfig, RestartConfig
from mcplhost.ingest import conversation_id
from mcplhost.speech.outbox import OutboxSender
from mcplhost.speech.retry import RetryRules
from mcplhost.store.items import NewItem
from mcplhost.store.operations import PublishSpeech
from mcplhost.store.outbox import OutboxEntry, OutboxRow

from ..harness import config_with, record, running_host, scripted, stored_items, wait_for

MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "channels": {"register": True, "incoming": True, "publish": True},
    "featureSets": {"chat": {"description": "chat", "uses": ["channels.register", "channels.publish"]}},
}
GRANT = ["channels.register", "channels.publish"]
DELIVERED = {"result": {"delivered": True, "messageId": "m-1"}}
#: Retries in tens of milliseconds instead of seconds.
QUICK = RetryRules(first_s=0.02, max_s=0.05, max_attempts=3, window_s=60)


def error(code: int) -> dict[str, Any]:
    return {"error": {"code": code, "message": f"refused {code}"}}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def publish_entry(text: str, *, channel: str = "room", thread: str | None = None, created_at: int | None = None,
                  server: str = "disc") -> tuple[NewItem, OutboxEntry]:
    at = now_ms() if created_at is None else created_at
    conversation = conversation_id(server, channel, thread)
    speech = NewItem(role="assistant", content=[{"type": "text", "text": text}],
                     metadata={"kind": "speech", "turnId": None,
                               "destination": {"serverId": server, "channelId": channel, "threadId": thread}},
                     created_at=at, agent="scout", participant="scout", thread_id=thread,
                     conversation_id=conversation)
    return speech, OutboxEntry(agent="scout", turn_id=None, server_id=server, channel_id=channel, thread_id=thread,
                               conversation_id=conversation, text=text, created_at=at)


async def queue(host: Any, text: str, **fields: Any) -> int:
    """Queue one publish as a turn would: PublishSpeech, then the sender's notify()."""
    speech, entry = publish_entry(text, **fields)
    (published,) = await host.writer.submit(PublishSpeech(speech, [entry]))
    host.outbox_senders[entry.server_id].notify()
    return published.outbox_ids[0]


async def ended(store: Any, outbox_id: int, timeout: float = 15) -> OutboxRow:
    """The row once it is no longer pending (polled, bounded)."""
    with anyio.fail_after(timeout):
        while (row := await store.outbox.get(outbox_id)) is None or row.state == "pending":
            await anyio.sleep(0.01)
    return row


def publishes(folder: Path, name: str = "disc") -> list[dict[str, Any]]:
    return [m for m in record(folder, name).received if m.get("method") == "channels/publish"]


def connector(tmp_path: Path, handlers: dict[str, Any], **fields: Any) -> ConnectorConfig:
    return scripted("disc", {"manifest": MANIFEST, "handlers": handlers}, tmp_path, grant=GRANT, **fields)


class TestDelivery:
    async def test_a_publish_is_delivered_into_its_conversation_and_remembered(self, tmp_path: Path):
        """channels/publish carries the conversation id of (connector, channel, thread); the messageId is kept."""
        async with running_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            oid = await queue(host, "hello there", thread="t-1")
            row = await ended(host.writer.store, oid)
            assert await host.writer.store.outbox.delivered_message("disc", "room", "m-1") == oid
        assert (row.state, row.message_id, row.attempts) == ("delivered", "m-1", 1)
        (sent,) = publishes(tmp_path)
        assert sent["params"] == {"conversationId": conversation_id("disc", "room", "t-1"), "channelId": "room",
                                  "stream": False, "content": [{"type": "text", "text": "hello there"}]}
        assert "id" in sent  # a Request: the host wants the ACK

    async def test_publishes_to_one_channel_go_in_order(self, tmp_path: Path):
        """Rows queued together reach the connector in the order they were queued."""
        async with running_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            ids = [await queue(host, f"n{n}") for n in range(5)]
            for oid in ids:
                await ended(host.writer.store, oid)
        assert [m["params"]["content"][0]["text"] for m in publishes(tmp_path)] == [f"n{n}" for n in range(5)]

    async def test_a_publish_queued_before_the_connector_is_ready_waits_for_it(self, tmp_path: Path):
        """A row queued while the connector is still starting is sent once it is ready."""
        async with running_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED})),
                                wait_ready=False) as host:
            await wait_for(lambda: host.writer is not None and host.outbox_senders)
            oid = await queue(host, "early")
            assert (await ended(host.writer.store, oid)).state == "delivered"


class TestFailure:
    @pytest.mark.parametrize("code", [-32017, -32023, -32602, -32002])
    async def test_a_permanent_refusal_fails_at_once_with_a_notice(self, tmp_path: Path, code: int):
        """A permanent error ends the row failed after one try and stores a failed-reply notice that names it."""
        async with running_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": error(code)}))) as host:
            oid = await queue(host, "hi", thread="t\"1")
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts) == ("failed", 1) and str(code) in row.last_error
        assert len(publishes(tmp_path)) == 1
        notice = (await stored_items(tmp_path))[-1]
        assert (notice.role, notice.agent, notice.metadata["kind"], notice.metadata["system"]) == (
            "user", "scout", "failed-reply", True)
        assert notice.metadata["outboxId"] == oid and 'thread "t\\"1"' in notice.content[0]["text"]

    async def test_a_retryable_error_backs_off_then_fails_with_a_notice(self, tmp_path: Path):
        """-32603 is tried again after a backoff, up to the limit, then the row fails with a notice."""
        async with running_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": error(-32603)}))) as host:
            host.outbox_senders["disc"].rules = QUICK
            oid = await queue(host, "hi")
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts) == ("failed", QUICK.max_attempts) and "gave up" in row.last_error
        assert len(publishes(tmp_path)) == QUICK.max_attempts
        assert (await stored_items(tmp_path))[-1].metadata["kind"] == "failed-reply"

    async def test_a_retry_that_succeeds_is_delivered_and_keeps_the_channel_order(self, tmp_path: Path):
        """After one -32603 the row is delivered on its second try, and the row behind it waited for it."""
        handlers = {"channels/publish": [error(-32603), DELIVERED]}
        async with running_host(config_with(tmp_path, connector(tmp_path, handlers))) as host:
            host.outbox_senders["disc"].rules = QUICK
            first, second = await queue(host, "one"), await queue(host, "two")
            rows = [await ended(host.writer.store, oid) for oid in (first, second)]
        assert [(r.state, r.attempts) for r in rows] == [("delivered", 2), ("delivered", 1)]
        assert [m["params"]["content"][0]["text"] for m in publishes(tmp_path)] == ["one", "one", "two"]

    async def test_a_publish_older_than_publish_max_age_fails_unsent(self, tmp_path: Path):
        """A row pending longer than publish_max_age_s (default 3600 s) fails without being sent."""
        async with running_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            oid = await queue(host, "stale", created_at=now_ms() - 3_601_000)
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts) == ("failed", 0) and publishes(tmp_path) == []
        assert "publish_max_age_s" in (await stored_items(tmp_path))[-1].content[0]["text"]


    async def test_a_publish_for_a_connector_that_stopped_for_good_still_fails_when_too_old(self, tmp_path: Path):
        """A connector that never becomes ready does not keep a stale row pending forever: it fails, with a notice."""
        dead = scripted("disc", {"manifest": MANIFEST, "initialize": "exit"}, tmp_path, grant=GRANT)
        async with running_host(config_with(tmp_path, dead)) as host:
            store, handle = host.writer.store, host.connectors["disc"]
            await wait_for(lambda: handle.state.value == "stopped")
            speech, entry = publish_entry("stale", created_at=now_ms() - 3_601_000)
            (published,) = await host.writer.submit(PublishSpeech(speech, [entry]))
            sender = OutboxSender(store, host.writer, handle, age_check_s=0.02)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sender.run)
                row = await ended(store, published.outbox_ids[0])
                tg.cancel_scope.cancel()
        assert (row.state, row.attempts) == ("failed", 0) and publishes(tmp_path) == []
        assert [i.metadata.get("kind") for i in await stored_items(tmp_path)] == ["speech", "failed-reply"]


class TestRestarts:
    async def test_a_connector_killed_before_answering_gets_the_publish_again_answered_once(self, tmp_path: Path):
        """The first life never answers and is killed; after the restart the publish is sent again and delivered."""
        script = tmp_path / "disc.script.json"
        base = {"manifest": MANIFEST, "record": str(tmp_path / "disc.jsonl")}
        script.write_text(json.dumps({**base, "handlers": {"channels/publish": "ignore"}}))
        spec = ConnectorConfig(name="disc", command=list(connector(tmp_path, {}).command), grant=GRANT,
                               env={**connector(tmp_path, {}).env, "MCPL_SCRIPT": f"@{script}"},
                               cwd=connector(tmp_path, {}).cwd, request_timeout_s=30.0,
                               restart=RestartConfig(policy="always", backoff_initial_s=0.05))
        async with running_host(config_with(tmp_path, spec)) as host:
            host.outbox_senders["disc"].rules = QUICK
            oid = await queue(host, "survive")
            await wait_for(lambda: publishes(tmp_path))
            script.write_text(json.dumps({**base, "handlers": {"channels/publish": DELIVERED}}))
            (first_pid,) = [e["pid"] for e in record(tmp_path, "disc").events if e["kind"] == "start"]
            os.kill(first_pid, signal.SIGKILL)
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts, row.message_id) == ("delivered", 2, "m-1")
        assert len(publishes(tmp_path)) == 2
        answered = [m for m in record(tmp_path, "disc").sent if m.get("result", {}).get("messageId") == "m-1"]
        assert len(answered) == 1

