"""The outbox sender against real connector processes: delivery, order, refusals, retries, restarts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from mcplhost.config import ConnectorConfig, RestartConfig
from mcplhost.inbound.conversation import conversation_id
from mcplhost.protocol.ports import State
from mcplhost.rpc import RemoteError
from mcplhost.speech.outbox import CRASHES_PER_ROW, NOT_PERMITTED, PENDING_PAGE, TOO_LARGE, OutboxSender
from mcplhost.speech.retry import RetryRules
from mcplhost.store.items import NewItem
from mcplhost.store.operations import PublishSpeech
from mcplhost.store.outbox import LAST_ERROR_MAX_CHARS, OutboxEntry, OutboxRow

from ..builders import descriptor, register
from ..harness import HINT, Beside, config_with, logged, received, record, scripted, stored_items, wait_for
from ..memory_pair import kill, memory_host

MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "channels": {"register": True, "incoming": True, "publish": True},
    "featureSets": {"chat": {"description": "chat", "uses": ["channels.register", "channels.publish"]}},
}
GRANT = ["channels.register", "channels.publish"]
#: The channels the tests publish to, registered once the connector is ready (the sender checks, every try).
REGISTER = register("room", "other")
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
    published = await host.writer.write(PublishSpeech(speech, [entry]))
    host.outbox_senders[entry.server_id].notify()
    return published.outbox_ids[0]


async def ended(store: Any, outbox_id: int, timeout: float = 15) -> OutboxRow:
    """The row once it is no longer pending (polled, bounded)."""
    with anyio.fail_after(timeout):
        while (row := await store.outbox.get(outbox_id)) is None or row.state == "pending":
            await anyio.sleep(0.01)
    return row


def publishes(folder: Path, name: str = "disc") -> list[dict[str, Any]]:
    return received(folder, name, "channels/publish")


def connector(tmp_path: Path, handlers: dict[str, Any], name: str = "disc", **fields: Any) -> ConnectorConfig:
    script = {"manifest": MANIFEST, "handlers": handlers, "steps": [REGISTER]}
    return scripted(name, script, tmp_path, grant=GRANT, **fields)


class TestDelivery:
    async def test_a_publish_is_delivered_into_its_conversation_and_remembered(self, tmp_path: Path):
        """channels/publish carries the conversation id of (connector, channel, thread); the messageId is kept."""
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            oid = await queue(host, "hello there", thread="t-1")
            row = await ended(host.writer.store, oid)
            assert host.store.outbox.recent_delivered("disc", "room", "m-1") == oid  # for echo suppression
        assert (row.state, row.message_id, row.attempts) == ("delivered", "m-1", 1)
        (sent,) = publishes(tmp_path)
        assert sent["params"] == {"conversationId": conversation_id("disc", "room", "t-1"), "channelId": "room",
                                  "stream": False, "content": [{"type": "text", "text": "hello there"}]}
        assert "id" in sent  # a Request: the host wants the ACK

    async def test_publishes_to_one_channel_go_in_order(self, tmp_path: Path):
        """Rows queued together reach the connector in the order they were queued."""
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            ids = [await queue(host, f"n{n}") for n in range(5)]
            for oid in ids:
                await ended(host.writer.store, oid)
        assert [m["params"]["content"][0]["text"] for m in publishes(tmp_path)] == [f"n{n}" for n in range(5)]

    async def test_a_publish_queued_before_the_connector_is_ready_waits_for_it(self, tmp_path: Path):
        """A row queued while the connector is still starting is sent once it is ready."""
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED})),
                                wait_ready=False) as host:
            assert host.connectors["disc"].state is State.STARTING  # the host was built whole: queue at once
            oid = await queue(host, "early")
            assert (await ended(host.writer.store, oid)).state == "delivered"

    async def test_a_sender_whose_host_no_longer_owns_the_connector_holds_its_rows_unsent(self, tmp_path: Path):
        """On a shared store the sender asks before each try whether its host still owns the connector: when not,
        the row stays pending, no try counted, nothing written to the connector; an owner's sender sends it."""
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            handle = host.connectors["disc"]
            await wait_for(lambda: handle.channel("room") is not None)
            speech, entry = publish_entry("whose?")
            oid = (await host.writer.write(PublishSpeech(speech, [entry]))).outbox_ids[0]  # no notify(): ours alone

            async def lost() -> bool:
                return False

            async def held() -> bool:
                return True

            retry_at = await OutboxSender(host.store.outbox, host.writer, handle, owned=lost).deliver_due()
            row = await host.store.outbox.get(oid)
            assert (row.state, row.attempts) == ("pending", 0) and retry_at is not None and retry_at > now_ms()
            assert publishes(tmp_path) == []
            await OutboxSender(host.store.outbox, host.writer, handle, owned=held).deliver_due()
            assert (await host.store.outbox.get(oid)).state == "delivered"
        assert len(publishes(tmp_path)) == 1


class TestFailure:
    @pytest.mark.parametrize("code", [-32017, -32023, -32602, -32002])
    async def test_a_permanent_refusal_fails_at_once_with_a_notice(self, tmp_path: Path, code: int):
        """A permanent error ends the row failed after one try and stores a failed-reply notice that names it."""
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": error(code)}))) as host:
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
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": error(-32603)}))) as host:
            host.outbox_senders["disc"].rules = QUICK
            oid = await queue(host, "hi")
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts) == ("failed", QUICK.max_attempts) and "gave up" in row.last_error
        assert len(publishes(tmp_path)) == QUICK.max_attempts
        assert (await stored_items(tmp_path))[-1].metadata["kind"] == "failed-reply"

    async def test_a_retry_that_succeeds_is_delivered_and_keeps_the_channel_order(self, tmp_path: Path):
        """After one -32603 the row is delivered on its second try, and the row behind it waited for it."""
        handlers = {"channels/publish": [error(-32603), DELIVERED]}
        async with memory_host(config_with(tmp_path, connector(tmp_path, handlers))) as host:
            host.outbox_senders["disc"].rules = QUICK
            first, second = await queue(host, "one"), await queue(host, "two")
            rows = [await ended(host.writer.store, oid) for oid in (first, second)]
        assert [(r.state, r.attempts) for r in rows] == [("delivered", 2), ("delivered", 1)]
        assert [m["params"]["content"][0]["text"] for m in publishes(tmp_path)] == ["one", "one", "two"]

    async def test_a_publish_older_than_publish_max_age_fails_unsent(self, tmp_path: Path):
        """A row pending longer than publish_max_age_s (default 3600 s) fails without being sent."""
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            oid = await queue(host, "stale", created_at=now_ms() - 3_601_000)
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts) == ("failed", 0) and publishes(tmp_path) == []
        assert "publish_max_age_s" in (await stored_items(tmp_path))[-1].content[0]["text"]


    async def test_a_publish_for_a_connector_that_stopped_for_good_still_fails_when_too_old(self, tmp_path: Path):
        """A connector that never becomes ready does not keep a stale row pending forever: it fails, with a notice."""
        dead = scripted("disc", {"manifest": MANIFEST, "initialize": "exit"}, tmp_path, grant=GRANT)
        async with memory_host(config_with(tmp_path, dead)) as host:
            store, handle = host.writer.store, host.connectors["disc"]
            await wait_for(lambda: handle.state.value == "stopped")
            speech, entry = publish_entry("stale", created_at=now_ms() - 3_601_000)
            published = await host.writer.write(PublishSpeech(speech, [entry]))
            sender = OutboxSender(store.outbox, host.writer, handle, age_check_s=0.02)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sender.run)
                row = await ended(store, published.outbox_ids[0])
                tg.cancel_scope.cancel()
        assert (row.state, row.attempts) == ("failed", 0) and publishes(tmp_path) == []
        assert [i.metadata.get("kind") for i in await stored_items(tmp_path)] == ["speech", "failed-reply"]


class TestAnswerShapes:
    """What each shape of publish answer makes of the row (docs/connectors.md §13's table)."""

    async def test_an_answer_without_message_id_is_delivered_without_echo_memory(self, tmp_path: Path):
        """`{delivered: true}` alone ends the row delivered, with no messageId to remember; members added are ignored."""
        handlers = {"channels/publish": {"result": {"delivered": True, "platform": {"extra": [1]}}}}
        async with memory_host(config_with(tmp_path, connector(tmp_path, handlers))) as host:
            oid = await queue(host, "hi")
            row = await ended(host.writer.store, oid)
        assert (row.state, row.message_id, row.attempts) == ("delivered", None, 1)

    async def test_delivered_false_is_tried_again(self, tmp_path: Path):
        """`{delivered: false}` is a retry, so the next try can deliver it."""
        handlers = {"channels/publish": [{"result": {"delivered": False}}, DELIVERED]}
        async with memory_host(config_with(tmp_path, connector(tmp_path, handlers))) as host:
            host.outbox_senders["disc"].rules = QUICK
            oid = await queue(host, "hi")
            row = await ended(host.writer.store, oid)
        assert (row.state, row.message_id, row.attempts) == ("delivered", "m-1", 2)

    @pytest.mark.parametrize("result", [
        "delivered", [True], None, {}, {"delivered": "yes"}, {"delivered": True, "messageId": 1002},
        {"delivered": True, "messageId": "x" * 100_000, "extra": 1} | {"messageId": ["long"] * 10_000},
    ])
    async def test_a_result_that_is_not_delivered_and_message_id_fails_at_once(self, tmp_path: Path, result: Any):
        """Any other result fails the row after one try, with a notice whose reason stays short."""
        handlers = {"channels/publish": {"result": result}}
        async with memory_host(config_with(tmp_path, connector(tmp_path, handlers))) as host:
            oid = await queue(host, "hi")
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts) == ("failed", 1)
        assert "was not {delivered, messageId}" in row.last_error and len(row.last_error) <= LAST_ERROR_MAX_CHARS
        assert len(publishes(tmp_path)) == 1
        notice = (await stored_items(tmp_path))[-1]
        assert notice.metadata["kind"] == "failed-reply" and len(notice.content[0]["text"]) < 2_000


class TestBounds:
    async def test_more_than_a_page_of_stale_rows_all_fail_in_one_check(self, tmp_path: Path):
        """While the connector is down, one age check fails every row too old, not one page of them."""
        dead = scripted("disc", {"manifest": MANIFEST, "initialize": "exit"}, tmp_path, grant=GRANT)
        async with memory_host(config_with(tmp_path, dead)) as host:
            store, handle = host.writer.store, host.connectors["disc"]
            await wait_for(lambda: handle.state.value == "stopped")
            entries = [publish_entry(f"s{n}", created_at=now_ms() - 3_601_000) for n in range(PENDING_PAGE + 20)]
            await host.writer.submit(PublishSpeech(entries[0][0], [entry for _, entry in entries]))
            failed = await OutboxSender(store.outbox, host.writer, handle).expire_old()
            left = await store.outbox.count("pending")
        assert (failed, left) == (PENDING_PAGE + 20, 0)

    async def test_a_connectors_long_refusal_text_is_cut_before_the_notice(self, tmp_path: Path):
        """A 50,000-character error message reaches neither the row nor the agent's notice whole."""
        refusal = {"error": {"code": -32017, "message": "no " * 16_000}}
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": refusal}))) as host:
            oid = await queue(host, "hi")
            row = await ended(host.writer.store, oid)
        notice = (await stored_items(tmp_path))[-1].content[0]["text"]
        assert row.state == "failed" and len(row.last_error) <= LAST_ERROR_MAX_CHARS
        assert "no no" in notice and len(notice) < 1000


    async def test_a_publish_past_the_line_cap_fails_at_once_unsent_and_the_next_goes_out(self, tmp_path: Path):
        """A row whose channels/publish line would pass the connector's max_line_bytes is never written: it fails
        with reason too_large and no try, its notice says so, and the channel's next row is delivered."""
        spec = connector(tmp_path, {"channels/publish": DELIVERED}, max_line_bytes=4096)
        async with memory_host(config_with(tmp_path, spec)) as host:
            big = await queue(host, "x" * 5000)
            small = await queue(host, "fits")
            row, after = await ended(host.writer.store, big), await ended(host.writer.store, small)
        assert (row.state, row.attempts, after.state) == ("failed", 0, "delivered")
        assert row.last_error.startswith(f"{TOO_LARGE}: it is too large to send")
        assert [m["params"]["content"][0]["text"] for m in publishes(tmp_path)] == ["fits"]
        (notice,) = [i for i in await stored_items(tmp_path) if i.metadata.get("kind") == "failed-reply"]
        assert notice.metadata["reason"] == TOO_LARGE and "too large to send" in notice.content[0]["text"]


class TestRestarts:
    async def test_a_connector_killed_before_answering_gets_the_publish_again_answered_once(self, tmp_path: Path):
        """The first life never answers and is killed; after the restart the publish is sent again and delivered."""
        script = tmp_path / "disc.script.json"
        base = {"manifest": MANIFEST, "record": str(tmp_path / "disc.jsonl"), "steps": [REGISTER]}
        script.write_text(json.dumps({**base, "handlers": {"channels/publish": "ignore"}}))
        spec = ConnectorConfig(name="disc", command=list(connector(tmp_path, {}).command), grant=GRANT,
                               env={**connector(tmp_path, {}).env, "MCPL_SCRIPT": f"@{script}"},
                               cwd=connector(tmp_path, {}).cwd, request_timeout_s=30.0,
                               restart=RestartConfig(policy="always", backoff_initial_s=0.05))
        async with memory_host(config_with(tmp_path, spec)) as host:
            host.outbox_senders["disc"].rules = QUICK
            oid = await queue(host, "survive")
            await wait_for(lambda: publishes(tmp_path))
            script.write_text(json.dumps({**base, "handlers": {"channels/publish": DELIVERED}}))
            kill(host, "disc")
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts, row.message_id) == ("delivered", 2, "m-1")
        assert len(publishes(tmp_path)) == 2
        answered = [m for m in record(tmp_path, "disc").sent if m.get("result", {}).get("messageId") == "m-1"]
        assert len(answered) == 1



def faulty(handle: Any, fault: Callable[[Any], None]) -> Beside:
    """`handle`, whose requests first pass their params to `fault` (which may raise, as a bug in the try would)."""

    async def request(method: str, params: Any, **options: Any) -> Any:
        fault(params)
        return await handle.request(method, params, **options)

    return Beside(handle, request=request)


def without_publish(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` no longer advertising channels.publish, nor a feature set using it."""
    return {**manifest, "channels": {"register": True, "incoming": True},
            "featureSets": {"chat": {"description": "chat", "uses": ["channels.register"]}}}


def policies(folder: Path, name: str = "disc") -> list[dict[str, Any]]:
    return received(folder, name, "featureSets/update")


class TestSendTimeCheck:
    async def test_a_grant_revoked_between_tries_fails_the_retry_unsent(self, tmp_path: Path):
        """-32603, then the connector drops channels.publish: the retry is never sent; the row fails not_permitted."""
        script = {"manifest": MANIFEST,
                  "handlers": {"channels/publish": [error(-32603), DELIVERED],
                               "mcpl/manifest": {"result": without_publish(MANIFEST)}},
                  "steps": [REGISTER, {"wait": "channels/publish"}, HINT, {"wait": "featureSets/update", "count": 2}]}
        spec = scripted("disc", script, tmp_path, grant=GRANT)
        async with memory_host(config_with(tmp_path, spec)) as host:
            sender, handle = host.outbox_senders["disc"], host.connectors["disc"]
            skew = [0]  # the test moves the sender's clock to the retry, once the grant has narrowed
            sender.clock_ms = lambda: now_ms() + skew[0]
            sender.rules = RetryRules(first_s=60, max_s=60, max_attempts=8, window_s=3600)
            oid = await queue(host, "hi")
            await wait_for(lambda: record(tmp_path, "disc").done and "channels.publish" not in handle.grant)
            assert (await host.writer.store.outbox.get(oid)).state == "pending"
            skew[0] = 61_000
            sender.notify()
            row = await ended(host.writer.store, oid)
        assert "channels.publish" not in policies(tmp_path)[1]["params"]["effectiveCapabilities"]
        assert (row.state, row.attempts) == ("failed", 1) and row.last_error.startswith(NOT_PERMITTED)
        assert len(publishes(tmp_path)) == 1
        notice = (await stored_items(tmp_path))[-1]
        assert (notice.metadata["kind"], notice.metadata["reason"]) == ("failed-reply", NOT_PERMITTED)
        assert "channels.publish" in notice.content[0]["text"]

    async def test_a_channel_never_registered_fails_not_permitted_after_the_grace(self, tmp_path: Path):
        """A row for a channel the connector does not register is waited for, then failed unsent."""
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            host.outbox_senders["disc"].channel_grace_s = 0.2
            oid = await queue(host, "hi", channel="nowhere")
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts) == ("failed", 0) and row.last_error.startswith(NOT_PERMITTED)
        assert publishes(tmp_path) == []
        assert (await stored_items(tmp_path))[-1].metadata["reason"] == NOT_PERMITTED

    async def test_a_row_queued_before_its_channel_is_registered_waits_for_it(self, tmp_path: Path):
        """Right after the connector is ready its channels may not be registered yet: the row waits, then goes."""
        script = {"manifest": MANIFEST, "handlers": {"channels/publish": DELIVERED},
                  "steps": [{"wait": "test/register"}, REGISTER]}
        async with memory_host(config_with(tmp_path, scripted("disc", script, tmp_path, grant=GRANT))) as host:
            oid = await queue(host, "early")
            await wait_for(lambda: record(tmp_path, "disc").received)
            assert (await host.writer.store.outbox.get(oid)).state == "pending"
            with pytest.raises(RemoteError):  # the script goes on once it sees the request (unknown to it)
                await host.connectors["disc"].request("test/register", {})
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts) == ("delivered", 1)

    async def test_an_inbound_only_channel_fails_not_permitted(self, tmp_path: Path):
        """The send-time check is routing's: an inbound-only channel cannot be published to."""
        steps = [{"request": "channels/register", "params": {"channels": [descriptor("room", direction="inbound")]}}]
        script = {"manifest": MANIFEST, "handlers": {"channels/publish": DELIVERED}, "steps": steps}
        async with memory_host(config_with(tmp_path, scripted("disc", script, tmp_path, grant=GRANT))) as host:
            await wait_for(lambda: host.connectors["disc"].channel("room"))
            oid = await queue(host, "hi")
            row = await ended(host.writer.store, oid)
        assert (row.state, row.attempts) == ("failed", 0) and "inbound only" in row.last_error
        assert publishes(tmp_path) == []


class TestFairness:
    async def test_a_channel_in_backoff_does_not_hold_back_another_channel(self, tmp_path: Path):
        """More than a page of rows wait behind a channel's head in backoff; another channel's row still goes."""
        handlers = {"channels/publish": [error(-32603), DELIVERED]}
        async with memory_host(config_with(tmp_path, connector(tmp_path, handlers))) as host:
            sender = host.outbox_senders["disc"]
            sender.rules = RetryRules(first_s=3600, max_s=3600, max_attempts=8, window_s=7200)
            entries = [publish_entry(f"r{n}") for n in range(PENDING_PAGE + 44)] + [publish_entry("o", channel="other")]
            speech, _ = entries[0]
            published = await host.writer.write(PublishSpeech(speech, [entry for _, entry in entries]))
            sender.notify()
            other = await ended(host.writer.store, published.outbox_ids[-1])
            head = await host.writer.store.outbox.get(published.outbox_ids[0])
        assert (other.state, head.state, head.attempts) == ("delivered", "pending", 1)
        assert [m["params"]["channelId"] for m in publishes(tmp_path)] == ["room", "other"]


class TestBoundary:
    async def test_an_unexpected_exception_restarts_the_sender_and_loses_nothing(self, tmp_path: Path):
        """A fault in one sender is logged once per crash with its traceback; it restarts; the other goes on."""
        config = config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}),
                             connector(tmp_path, {"channels/publish": DELIVERED}, name="zul"))
        faults: list[str] = []

        def fault(params: Any) -> None:
            if len(faults) < CRASHES_PER_ROW - 1:  # one crash short of failing the row
                faults.append(params["content"][0]["text"])
                raise RuntimeError("injected sender fault")

        with capture_logs() as logs:
            async with memory_host(config) as host:
                disc = host.outbox_senders["disc"]
                disc.restart_rules = RetryRules(first_s=0.3, max_s=1)
                disc.handle = faulty(disc.handle, fault)
                first, second = await queue(host, "one"), await queue(host, "two")
                await wait_for(lambda: faults)
                zul = await ended(host.writer.store, await queue(host, "elsewhere", server="zul"))
                rows = [await ended(host.writer.store, oid) for oid in (first, second)]
        assert zul.state == "delivered" and [(r.state, r.attempts) for r in rows] == [("delivered", 1)] * 2
        assert [m["params"]["content"][0]["text"] for m in publishes(tmp_path)] == ["one", "two"]
        crashes = logged(logs, "outbox.sender_crashed")
        assert len(crashes) == len(faults) == CRASHES_PER_ROW - 1
        assert all(c["exc_info"] is True and c["connector"] == "disc" and c["outbox_id"] == first for c in crashes)

    async def test_a_row_that_keeps_crashing_the_sender_fails_and_the_queue_goes_on(self, tmp_path: Path):
        """After CRASHES_PER_ROW crashes on the same row, it ends failed with a notice; the row behind it is sent."""
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            disc = host.outbox_senders["disc"]
            disc.restart_rules = RetryRules(first_s=0.01, max_s=0.05)

            def fault(params: Any) -> None:
                if params["content"][0]["text"] == "poison":
                    raise RuntimeError("injected: this row always crashes the sender")

            disc.handle = faulty(disc.handle, fault)
            bad, good = await queue(host, "poison"), await queue(host, "fine")
            rows = [await ended(host.writer.store, oid) for oid in (bad, good)]
        assert [r.state for r in rows] == ["failed", "delivered"] and disc.stats["crashed"] == CRASHES_PER_ROW
        assert [m["params"]["content"][0]["text"] for m in publishes(tmp_path)] == ["fine"]
        assert [i.metadata.get("kind") for i in await stored_items(tmp_path)].count("failed-reply") == 1

    async def test_cancellation_passes_through_the_boundary(self, tmp_path: Path):
        """A sender cancelled while it restarts after a fault ends at once: the boundary catches no cancellation."""
        async with memory_host(config_with(tmp_path, connector(tmp_path, {"channels/publish": DELIVERED}))) as host:
            crashed = anyio.Event()

            def hold(params: Any) -> None:
                raise RuntimeError("injected")  # the host's own sender must not send the row meanwhile

            def fault(params: Any) -> None:
                crashed.set()
                raise RuntimeError("injected")

            own = host.outbox_senders["disc"]
            own.handle = faulty(own.handle, hold)
            await queue(host, "one")
            sender = OutboxSender(host.writer.store.outbox, host.writer, faulty(host.connectors["disc"], fault),
                                  restart_rules=RetryRules(first_s=3600, max_s=3600))
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(sender.run)
                    await crashed.wait()
                    tg.cancel_scope.cancel()
        assert sender.stats["crashed"] == 1
