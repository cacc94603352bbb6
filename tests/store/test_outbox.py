"""The outbox table and its typed operations: queued with its speech, ended once, read back as exported."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import msgspec
import pytest

from mcplhost.store import open_store
from mcplhost.store.operations import EndPublish, PublishSpeech, RecordPublishAttempt
from mcplhost.store.outbox import ECHO_WINDOW_MS, RECENT_DELIVERED, RECENT_SPOKEN, OutboxEntry, outbox_line

from .conftest import make_item, with_writer

T0 = 1_790_000_000_000


def entry(text: str = "hi", *, channel: str = "discord:g1:room", thread: str | None = None) -> OutboxEntry:
    return OutboxEntry(agent="scout", turn_id=7, server_id="discord", channel_id=channel, thread_id=thread,
                       conversation_id=f"conv-{channel}-{thread}", text=text, created_at=T0)


def speech(text: str = "hi"):
    item = make_item(text, server=None, channel=None, agent="scout", role="assistant")
    return msgspec.structs.replace(item, metadata={"kind": "speech", "turnId": 7, "outboxId": None})




class TestPublishSpeech:
    async def test_the_speech_row_names_its_outbox_row_and_both_commit_together(self, store):
        """PublishSpeech stores the pending outbox row and the speech row carrying its id, in one transaction."""
        (published,) = await with_writer(store, PublishSpeech(speech("hello"), [entry("hello")]))
        (row,) = await store.outbox.list()
        assert published.outbox_ids == [row.id] and row.state == "pending" and row.attempts == 0
        (item,) = await store.items.get_many([published.item_id])
        assert item.metadata["outboxId"] == row.id and "outboxIds" not in item.metadata

    async def test_several_entries_are_all_named(self, store):
        """A speech sent to two channels keeps the first id as outboxId and lists both."""
        (published,) = await with_writer(store, PublishSpeech(speech(), [entry(channel="a"), entry(channel="b")]))
        (item,) = await store.items.get_many([published.item_id])
        assert item.metadata["outboxId"] == published.outbox_ids[0]
        assert item.metadata["outboxIds"] == published.outbox_ids and len(set(published.outbox_ids)) == 2

    async def test_a_failed_group_stores_neither(self, store):
        """When the transaction fails, neither the outbox row nor the speech row exists."""
        with pytest.raises(sqlite3.Error):
            async with store.transaction():
                await PublishSpeech.apply_all(store, [PublishSpeech(speech(), [entry()])])
                raise sqlite3.OperationalError("forced")
        assert await store.outbox.list() == [] and await store.items.list() == []

    def test_an_entry_without_its_destination_is_refused(self):
        """An entry without a channel is refused when built, never in a group commit."""
        with pytest.raises(ValueError, match="channel_id"):
            OutboxEntry(agent="a", turn_id=None, server_id="s", channel_id="", thread_id=None,
                        conversation_id="c", text="t", created_at=0)


class TestEnding:
    async def test_delivered_records_the_message_and_ends_once(self, store):
        """A delivered row keeps its messageId; a second end of it changes nothing and writes no notice."""
        (published,) = await with_writer(store, PublishSpeech(speech(), [entry()]))
        (oid,) = published.outbox_ids
        assert await with_writer(store, EndPublish(oid, "delivered", T0 + 5, message_id="m-9")) == [True]
        notice = make_item("late", agent="scout")
        assert await with_writer(store, EndPublish(oid, "failed", T0 + 6, error="x", notice=notice)) == [False]
        row = await store.outbox.get(oid)
        assert (row.state, row.message_id, row.attempts, row.delivered_at) == ("delivered", "m-9", 1, T0 + 5)
        assert len(await store.items.list()) == 1  # the speech row only: no notice for a row already ended

    async def test_a_failure_stores_its_notice_with_it(self, store):
        """A failed end stores the notice in the same transaction, and the row keeps the reason."""
        (published,) = await with_writer(store, PublishSpeech(speech(), [entry()]))
        (oid,) = published.outbox_ids
        notice = make_item("not delivered", server=None, channel=None, agent="scout")
        await with_writer(store, EndPublish(oid, "failed", T0 + 1, error="refused", notice=notice))
        row = await store.outbox.get(oid)
        assert (row.state, row.last_error) == ("failed", "refused")
        assert [i.content[0]["text"] for i in await store.items.list()] == ["hi", "not delivered"]

    async def test_attempts_count_up_and_keep_the_first_try(self, store):
        """Each recorded try counts; the first try's time stays; the next try's time is the latest."""
        (published,) = await with_writer(store, PublishSpeech(speech(), [entry()]))
        (oid,) = published.outbox_ids
        await with_writer(store, RecordPublishAttempt(oid, T0 + 1, T0 + 1001, "timeout"))
        await with_writer(store, RecordPublishAttempt(oid, T0 + 1001, T0 + 3001, "timeout"))
        (pending,) = await store.outbox.pending("discord", limit=10)
        assert (pending.attempts, pending.first_attempt_at, pending.next_attempt_at) == (2, T0 + 1, T0 + 3001)

    def test_an_end_must_be_delivered_or_failed(self):
        """EndPublish refuses any other state when built."""
        with pytest.raises(ValueError):
            EndPublish(1, "pending", T0)


class TestReading:
    async def test_pending_is_per_connector_in_order_and_state_filters(self, store):
        """pending() lists one connector's pending rows oldest first; iterate(state=) filters."""
        other = OutboxEntry(agent="scout", turn_id=None, server_id="zulip", channel_id="z", thread_id=None,
                            conversation_id="cz", text="z", created_at=T0)
        (published,) = await with_writer(store, PublishSpeech(speech(), [entry("1"), other, entry("2")]))
        first, _, last = published.outbox_ids
        await with_writer(store, EndPublish(first, "delivered", T0, message_id="m"))
        assert [p.id for p in await store.outbox.pending("discord", limit=10)] == [last]
        assert [r.id for r in await store.outbox.list(state="delivered")] == [first]
        assert await store.outbox.count("pending") == 2
        assert await store.outbox.pending_connectors() == ["discord", "zulip"]
        await with_writer(store, EndPublish(last, "failed", T0, error="x"))
        assert await store.outbox.pending_connectors() == ["zulip"]  # a connector with none pending is not named

    async def test_pending_per_channel_takes_every_channels_oldest_first_and_keeps_channel_order(self, store):
        """With per_channel, a long channel gives up its place: each channel's heads come first, in id order."""
        channels = ["a"] * 6 + ["b", "a", "c", "b"]
        (published,) = await with_writer(store, PublishSpeech(speech(), [entry(c, channel=c) for c in channels]))
        ids = dict(zip(published.outbox_ids, channels))
        page = await store.outbox.pending("discord", limit=5, per_channel=2)
        assert [(ids[p.id], p.text) for p in page] == [("a", "a"), ("b", "b"), ("c", "c"), ("a", "a"), ("b", "b")]
        assert [p.id for p in page if p.channel_id == "a"] == published.outbox_ids[:2]
        assert [p.id for p in page if p.channel_id == "b"] == [published.outbox_ids[6], published.outbox_ids[9]]
        everything = await store.outbox.pending("discord", limit=100)
        assert [p.id for p in everything] == published.outbox_ids  # without per_channel: oldest first

    async def test_the_export_line_has_every_key_in_order(self, store):
        """outbox_line is README.md#commands's object: every key, nulls included, in its order."""
        (published,) = await with_writer(store, PublishSpeech(speech(), [entry(thread="t1")]))
        line = json.loads(outbox_line(await store.outbox.get(published.outbox_ids[0])))
        assert list(line) == ["id", "agent", "turnId", "serverId", "channelId", "threadId", "state", "attempts",
                              "messageId", "lastError", "createdAt", "deliveredAt"]
        assert line["threadId"] == "t1" and line["messageId"] is None and line["deliveredAt"] is None


class TestEchoLookup:
    async def test_a_delivery_is_found_in_memory_and_after_a_reopen(self, db_path: Path):
        """recent_delivered answers from memory; after a reopen, once seeded from the table, within ECHO_WINDOW_MS."""
        async with open_store(db_path) as store:
            (published,) = await with_writer(store, PublishSpeech(speech(), [entry()]))
            (oid,) = published.outbox_ids
            await with_writer(store, EndPublish(oid, "delivered", T0, message_id="m-1"))
            store.outbox.remember_delivered("discord", "discord:g1:room", "m-1", oid)
            assert store.outbox.recent_delivered("discord", "discord:g1:room", "m-1") == oid
        async with open_store(db_path) as store:
            assert store.outbox.recent_delivered("discord", "discord:g1:room", "m-1") is None
            assert await store.outbox.load_recent_delivered(T0 + ECHO_WINDOW_MS + 1) == 0  # too old to seed
            assert await store.outbox.load_recent_delivered(T0 + 1) == 1
            assert store.outbox.recent_delivered("discord", "discord:g1:room", "m-1") == oid
            assert store.outbox.recent_delivered("discord", "other", "m-1") is None

    async def test_the_memory_window_is_bounded(self, store):
        """The in-memory window keeps the newest RECENT_DELIVERED deliveries only."""
        for n in range(RECENT_DELIVERED + 1):
            store.outbox.remember_delivered("s", "c", f"m{n}", n)
        assert store.outbox.recent_delivered("s", "c", "m0") is None
        assert store.outbox.recent_delivered("s", "c", f"m{RECENT_DELIVERED}") == RECENT_DELIVERED


class TestSpeakerLookup:
    async def test_an_agents_delivered_text_is_known_in_memory_and_after_a_reopen(self, db_path: Path):
        """recent_speaker names the agent whose delivered publish had the text (whitespace aside), also when seeded."""
        async with open_store(db_path) as store:
            (published,) = await with_writer(store, PublishSpeech(speech(), [entry("Thanks,  you too!\n")]))
            (oid,) = published.outbox_ids
            await with_writer(store, EndPublish(oid, "delivered", T0, message_id=None))
            store.outbox.remember_delivered("discord", "discord:g1:room", None, oid, agent="scout",
                                            text="Thanks,  you too!\n")
            assert store.outbox.recent_speaker("Thanks, you too!") == "scout"
            assert store.outbox.recent_speaker("Thanks, you too") is None  # another text
            assert store.outbox.recent_delivered("discord", "discord:g1:room", "None") is None  # no messageId: no echo key
        async with open_store(db_path) as store:
            assert store.outbox.recent_speaker("Thanks, you too!") is None  # memory starts empty
            await store.outbox.load_recent_delivered(T0 + 1)
            assert store.outbox.recent_speaker("Thanks, you too!") == "scout"

    async def test_the_speech_window_is_bounded(self, store):
        """The window of recent speech keeps the newest RECENT_SPOKEN texts only."""
        for n in range(RECENT_SPOKEN + 1):
            store.outbox.remember_delivered("s", "c", None, n, agent="a", text=f"t{n}")
        assert store.outbox.recent_speaker("t0") is None
        assert store.outbox.recent_speaker(f"t{RECENT_SPOKEN}") == "a"
