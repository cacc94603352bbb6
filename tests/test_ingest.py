"""Tests for mcplhost/ingest/service.py: idempotent answers, Stored events and their drop policy, push featureSet."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog
from structlog.testing import capture_logs

from mcplhost.inbound.conversation import conversation_id
from mcplhost.inbound.pipeline import Processed
from mcplhost.ingest import STORED_EVENTS_BUFFER, Ingest, Stored
from mcplhost.logs import LINES_PER_WINDOW
from mcplhost.speech.echoes import EchoMemory
from mcplhost.store import export_line, open_store
from mcplhost.store.writer import GroupWriter

from .builders import admitted_message, admitted_push
from .harness import wait_for

ROOM = "disc:g1:room"


@asynccontextmanager
async def ingest(folder: Path, *, buffer: int = STORED_EVENTS_BUFFER,
                 events: bool = True) -> AsyncIterator[tuple[Ingest, Any]]:
    """An Ingest over a real store and group writer, with its Stored stream's receiving end."""
    send, receive = anyio.create_memory_object_stream[Stored](buffer)
    async with open_store(folder / "host.db") as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        yield Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox),
                     events=send if events else None), receive
        tg.cancel_scope.cancel()
    send.close()
    receive.close()


def drain(receive: Any) -> list[Stored]:
    events = []
    while True:
        try:
            events.append(receive.receive_nowait())
        except anyio.WouldBlock:
            return events


class TestRedelivery:
    async def test_an_identical_redelivery_is_answered_as_the_first(self, tmp_path: Path):
        """Same connector, channel, messageId and body: one row, the same answer, no second Stored event."""
        async with ingest(tmp_path) as (intake, events):
            first = await intake.store_messages("disc", "channels/incoming", [admitted_message()])
            again = await intake.store_messages("disc", "channels/incoming", [admitted_message()])
            assert first == again == [{"messageId": "m-1", "accepted": True,
                                       "conversationId": conversation_id("disc", ROOM, None)}]
            assert len(await intake.store.items.list()) == 1
            assert len(drain(events)) == 1

    async def test_a_redelivery_gets_the_originals_conversation(self, tmp_path: Path):
        """A repeat that would compute another conversation (its thread differs) is answered with the original's."""
        async with ingest(tmp_path) as (intake, _):
            (first,) = await intake.store_messages("disc", "channels/incoming", [admitted_message(thread_id="t-1")])
            (again,) = await intake.store_messages("disc", "channels/incoming", [admitted_message(thread_id="t-2")])
            assert again["conversationId"] == first["conversationId"] == conversation_id("disc", ROOM, "t-1")

    async def test_a_batch_with_a_message_twice_stores_it_once(self, tmp_path: Path):
        """Two copies in one request: one row, both accepted with the same conversation."""
        async with ingest(tmp_path) as (intake, events):
            with capture_logs() as logs:
                twice = [admitted_message(), admitted_message()]
                results = await intake.store_messages("disc", "channels/incoming", twice)
            assert results[0] == results[1] and results[0]["accepted"]
            (item,) = await intake.store.items.list()
            assert len(drain(events)) == 1
            assert [(e["event"], e["duplicates"], e["first_original"]) for e in logs] == [
                ("ingest.redelivered", 1, item.id)]
            assert intake.statistics()["redelivered"] == 1

    async def test_a_connector_replaying_in_a_loop_is_counted_exactly_and_logged_a_few_times(self, tmp_path: Path):
        """Each replayed request counts; only the limiter's allowance of them is logged."""
        async with ingest(tmp_path) as (intake, _):
            await intake.store_messages("disc", "channels/incoming", [admitted_message()])
            with capture_logs() as logs:
                for _ in range(3 * LINES_PER_WINDOW):
                    await intake.store_messages("disc", "channels/incoming", [admitted_message()])
            assert intake.statistics()["redelivered"] == 3 * LINES_PER_WINDOW
            assert len([e for e in logs if e["event"] == "ingest.redelivered"]) == LINES_PER_WINDOW
            assert all(e["connector"] == "disc" for e in logs)

    async def test_an_edit_is_its_own_item(self, tmp_path: Path):
        """chat:edited with a new body is stored beside the original, in the original's thread."""
        async with ingest(tmp_path) as (intake, _):
            await intake.store_messages("disc", "channels/incoming", [admitted_message(thread_id="t-1")])
            (edit,) = await intake.store_messages("disc", "channels/incoming",
                                                  [admitted_message(body="hello!", tags=["chat:edited"])])
            stored = await intake.store.items.list()
            assert len(stored) == 2 and stored[1].metadata["threadId"] == "t-1"
            assert edit["conversationId"] == conversation_id("disc", ROOM, "t-1")


class TestStoredEvents:
    async def test_each_new_item_is_an_event_with_its_id_and_conversation(self, tmp_path: Path):
        """After the commit, Stored carries the row's id and the item with conversation and thread ids."""
        async with ingest(tmp_path) as (intake, events):
            await intake.store_messages("disc", "channels/incoming",
                                        [admitted_message("a", thread_id="t"), admitted_message("b")])
            stored = await intake.store.items.list()
            got = drain(events)
            assert [e.id for e in got] == [item.id for item in stored]
            assert [(e.item.thread_id, e.item.conversation_id) for e in got] == [
                ("t", conversation_id("disc", ROOM, "t")), (None, conversation_id("disc", ROOM, None))]
            assert all(e.missed_before == 0 for e in got)

    async def test_a_slow_consumer_loses_events_visibly_and_storage_never_waits(self, tmp_path: Path):
        """With the buffer full, items are still stored and answered; drops are counted, logged once, flagged next."""
        async with ingest(tmp_path, buffer=1) as (intake, events):
            with capture_logs() as logs:
                results = await intake.store_messages("disc", "channels/incoming",
                                                      [admitted_message(str(n)) for n in range(4)])
                assert all(r["accepted"] for r in results)
                assert [e.id for e in drain(events)] == [1]
                await intake.store_messages("disc", "channels/incoming", [admitted_message("later")])
            (flagged,) = drain(events)
            assert (flagged.id, flagged.missed_before) == (5, 3)
            assert intake.statistics() == {"stored_events": 2, "stored_events_dropped": 3, "redelivered": 0}
            assert [e["event"] for e in logs if e["event"].startswith("ingest.stored_events")] == [
                "ingest.stored_events_dropped", "ingest.stored_events_resumed"]

    async def test_a_consumer_that_closed_its_end_stops_the_events_not_the_storage(self, tmp_path: Path):
        """Once the receiving end is closed, items are still stored and answered, and the closure is logged once."""
        async with ingest(tmp_path) as (intake, events):
            events.close()
            with capture_logs() as logs:
                for n in range(2):
                    (result,) = await intake.store_messages("disc", "channels/incoming", [admitted_message(str(n))])
                    assert result["accepted"]
            assert [e["event"] for e in logs] == ["ingest.stored_events_closed"]
            assert len(await intake.store.items.list()) == 2

    async def test_without_a_stream_there_are_no_events(self, tmp_path: Path):
        """An Ingest given no stream stores and answers as usual."""
        async with ingest(tmp_path, events=False) as (intake, _):
            (result,) = await intake.store_messages("disc", "channels/incoming", [admitted_message()])
            assert result["accepted"] and intake.statistics()["stored_events"] == 0


class HeldEchoes:
    """An echo port that holds its seed until released and says every item is an echo of outbox row 9."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.seeds = 0
        self.marked_early = 0  # items marked before the seed was in

    async def seed(self, now_ms: int) -> int:
        self.seeds += 1
        await self.release.wait()
        return 0

    def marked(self, processed: Processed) -> Processed:
        self.marked_early += not self.release.is_set()
        return msgspec.structs.replace(processed, metadata=dict(processed.metadata, echoOf=9), echo_of=9)


class TestEchoPort:
    async def test_the_port_is_seeded_once_before_any_item_and_its_mark_is_stored(self, tmp_path: Path):
        """Two concurrent first requests: one seed, nothing stored or marked until it is in; the port's mark kept."""
        echoes = HeldEchoes()
        async with open_store(tmp_path / "host.db") as store, anyio.create_task_group() as tg:
            writer = GroupWriter(store)
            await tg.start(writer.run)
            intake = Ingest(store, writer, structlog.get_logger(), echoes=echoes)
            async with anyio.create_task_group() as requests:
                requests.start_soon(intake.store_messages, "disc", "channels/incoming", [admitted_message("m-1")])
                requests.start_soon(intake.store_push, "disc", admitted_push())
                await wait_for(lambda: echoes.seeds)
                await anyio.wait_all_tasks_blocked()
                assert await store.items.list() == []
                echoes.release.set()
            stored = await store.items.list()
            tg.cancel_scope.cancel()
        assert echoes.seeds == 1 and echoes.marked_early == 0
        assert len(stored) == 2 and all(item.metadata["echoOf"] == 9 for item in stored)


class TestAuthorId:
    async def test_the_author_id_is_host_metadata_when_known(self, tmp_path: Path):
        """metadata.authorId is the admitted author id; absent without one; a connector's own copy stays in adapter."""
        async with ingest(tmp_path) as (intake, _):
            await intake.store_messages("disc", "channels/incoming", [
                admitted_message("m-1", participant="Alice", author_id="u-7", metadata={"authorId": "forged"}),
                admitted_message("m-2")])
            known, unknown = [json.loads(export_line(i)) for i in await intake.store.items.list()]
            assert known["metadata"]["authorId"] == "u-7" and known["participant"] == "Alice"
            assert known["metadata"]["adapter"] == {"authorId": "forged"}
            assert "authorId" not in unknown["metadata"]


class TestPush:
    async def test_a_repeat_names_the_original_item(self, tmp_path: Path):
        """store_push returns PushStored: the answer, the item id, and whether it was a repeat."""
        async with ingest(tmp_path) as (intake, events):
            first = await intake.store_push("disc", admitted_push())
            again = await intake.store_push("disc", admitted_push())
            (item,) = await intake.store.items.list()
            assert (first.answer, first.item_id, first.duplicate) == ({"accepted": True}, item.id, False)
            assert (again.answer, again.item_id, again.duplicate) == ({"accepted": True}, item.id, True)
            assert [e.id for e in drain(events)] == [item.id]

    async def test_the_feature_set_is_in_the_export(self, tmp_path: Path):
        """A push's featureSet is in metadata next to eventId; a channel item's is null."""
        async with ingest(tmp_path) as (intake, _):
            await intake.store_push("disc", admitted_push())
            await intake.store_messages("disc", "channels/incoming", [admitted_message()])
            pushed, incoming = [json.loads(export_line(i)) for i in await intake.store.items.list()]
            assert pushed["metadata"]["featureSet"] == "disc.alerts" and pushed["metadata"]["eventId"] == "e-1"
            assert incoming["metadata"]["featureSet"] is None
            keys = list(pushed["metadata"])
            assert keys.index("featureSet") == keys.index("eventId") + 1


class TestSecrets:
    async def test_one_search_per_request_and_a_request_holding_a_secret_is_redacted_as_before(self, tmp_path: Path):
        """Ingest searches a request's rows once (the writer then skips its own search); a secret anywhere in the
        request sends it down the item-by-item path: the body redacted in the event and the row, the author's
        name in the row by the writer, and the clean message beside them untouched."""
        token = "discord-token-0123456789"
        send, receive = anyio.create_memory_object_stream[Stored](16)
        async with open_store(tmp_path / "host.db") as store, anyio.create_task_group() as tg:
            store.secrets.update({"DISCORD_TOKEN": token})
            writer = GroupWriter(store)
            await tg.start(writer.run)
            intake = Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox), events=send,
                            secrets=store.secrets)
            await intake.store_messages("disc", "channels/incoming", [admitted_message("m-0", "all clear")])
            await intake.store_messages("disc", "channels/incoming", [
                admitted_message("m-1", "fine"), admitted_message("m-2", f"leaked {token}"),
                admitted_message("m-3", "by name", participant=f"ann {token}")])
            rows = {item.metadata["messageId"]: item for item in await store.items.list()}
            tg.cancel_scope.cancel()
        events = {event.item.metadata["messageId"]: event.item for event in drain(receive)}
        send.close()
        receive.close()
        assert rows["m-0"].content[1:] == events["m-0"].content[1:] == [{"type": "text", "text": "all clear"}]
        assert rows["m-1"].content[1:] == [{"type": "text", "text": "fine"}]
        assert rows["m-2"].content[1:] == events["m-2"].content[1:] == [
            {"type": "text", "text": "leaked [redacted:DISCORD_TOKEN]"}]
        assert rows["m-3"].participant == "ann [redacted:DISCORD_TOKEN]"
        assert token not in (tmp_path / "host.db").read_bytes().decode("utf-8", "replace")
