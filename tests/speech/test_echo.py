"""Tests for echo suppression: mcplhost/speech/echoes.py, its marking in ingest and the wake's second look."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import structlog
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mcplhost.agents.wakes.rules import StoredView, Wake, is_echo, view_of, wake_matches, without_late_echoes
from mcplhost.config import AgentConfig, BackendConfig
from mcplhost.inbound.conversation import conversation_id
from mcplhost.inbound.pipeline import Delivered, Processed, run_pipeline
from mcplhost.ingest import Ingest, Stored, now_ms
from mcplhost.protocol.intake import AdmittedMessage, AdmittedPush
from mcplhost.speech.echoes import ECHO_TAG, FROM_SELF, EchoMemory, echo_of, marked
from mcplhost.store import NewItem, StoredItem, open_store
from mcplhost.store.operations import EndPublish, PublishSpeech, SetCursor
from mcplhost.store.outbox import OutboxEntry
from mcplhost.store.rows import item_meta
from mcplhost.store.writer import GroupWriter

from ..agents.support import RecordingBackend, agent_config, agent_store, heard
from ..agents.test_runtime import running, turns_of
from ..builders import admitted_message

ROOM = "disc:g1:room"
OTHER = "disc:g1:other"
AT = 1_700_000_000_000


def mention(message_id: str) -> AdmittedMessage:
    return admitted_message(message_id, "@scout hi", tags=["chat:mention", "chat:addressed"])


def agent() -> AgentConfig:
    return AgentConfig(name="scout", backend=BackendConfig(kind="scripted"), wake_on=["addressed"])


@asynccontextmanager
async def ingest(path: Path) -> AsyncIterator[Ingest]:
    """An Ingest over a real store (outbox included) and group writer."""
    async with open_store(path) as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        yield Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox), clock_ms=lambda: AT)
        tg.cancel_scope.cancel()


async def delivered_publish(intake: Ingest, message_id: str, *, channel: str = ROOM, at: int = AT) -> int:
    """Queue a publish the real way (PublishSpeech) and end it delivered as `message_id`; its outbox id."""
    speech = NewItem(role="assistant", content=[{"type": "text", "text": "hi"}],
                     metadata={"kind": "speech"}, created_at=AT, agent="scout")
    entry = OutboxEntry(agent="scout", turn_id=None, server_id="disc", channel_id=channel, thread_id=None,
                        conversation_id=conversation_id("disc", channel, None), text="hi", created_at=AT)
    published = await intake.writer.write(PublishSpeech(speech, [entry]))
    (outbox_id,) = published.outbox_ids
    await intake.writer.submit(EndPublish(outbox_id, "delivered", at, message_id=message_id))
    return outbox_id


def stored_view(item: StoredItem) -> StoredView:
    return view_of(Stored(item.id, NewItem(role=item.role, content=item.content, metadata=item.metadata,
                                           created_at=item.created_at)))


def processed(message_id: str | None, tags: list[str], *, server: str = "disc", channel: str | None = ROOM) -> Processed:
    """An inbound item through the pipeline, as ingest hands it to the echo mark."""
    outcome = run_pipeline(Delivered(lane="channels/incoming" if channel else "push/event",
                                     kind="channel" if channel else "unscoped", server_id=server, accepted_at=AT,
                                     blocks=[{"type": "text", "text": "hi"}], channel_id=channel,
                                     message_id=message_id, tags=tags))
    assert isinstance(outcome, Processed)
    return outcome


class TestRules:
    def test_a_delivered_message_id_in_its_channel_is_an_echo_of_that_publish(self):
        """Same connector, channel and messageId as a delivered publish: echoOf is its outbox id."""
        delivered = {("disc", ROOM, "m-1"): 7}
        metadata = {"serverId": "disc", "channelId": ROOM, "messageId": "m-1", "tags": ["chat:mention"]}
        assert echo_of(item_meta(metadata), lambda *key: delivered.get(key)) == 7
        result = marked(processed("m-1", ["chat:mention"]), lambda *key: delivered.get(key))
        assert result.metadata["echoOf"] == result.echo_of == 7

    def test_the_same_message_id_in_another_channel_or_connector_is_not(self):
        """The key is the whole (connector, channel, messageId): a platform's ids repeat across channels."""
        delivered = {("disc", ROOM, "m-1"): 7}
        for server, channel in (("disc", OTHER), ("zulip", ROOM)):
            metadata = {"serverId": server, "channelId": channel, "messageId": "m-1", "tags": []}
            assert echo_of(item_meta(metadata), lambda *key: delivered.get(key)) is None
            item = processed("m-1", [], server=server, channel=channel)
            assert marked(item, lambda *key: delivered.get(key)) is item

    def test_a_from_self_tag_alone_marks_true(self):
        """Tagged chat:from-self with no matching publish: echoOf is true, and the host tag is added."""
        result = marked(processed("m-9", [FROM_SELF]), lambda *key: None)
        assert result.metadata["echoOf"] is True and result.metadata["tags"] == [FROM_SELF, ECHO_TAG]

    def test_a_connectors_own_host_echo_tag_is_dropped(self):
        """A connector cannot label an item as the host's echo: its host:echo tag is removed, nothing marked."""
        result = marked(processed("m-2", ["chat:mention", ECHO_TAG]), lambda *key: None)
        assert result.metadata["tags"] == ["chat:mention"] and "echoOf" not in result.metadata
        assert result.echo_of is None

    def test_an_ordinary_item_is_returned_unchanged(self):
        """The common case costs no copy: the very same item comes back."""
        item = processed("m-3", ["chat:mention"])
        assert marked(item, lambda *key: None) is item

    @given(tags=st.lists(st.sampled_from(["chat:mention", FROM_SELF, ECHO_TAG, "x:y"])),
           delivered=st.booleans(), message_id=st.text(max_size=8))
    def test_marked_means_echo_of_and_the_tag_only_together(self, tags: list[str], delivered: bool,
                                                             message_id: str):
        """Whatever the tags: host:echo is present exactly when echoOf is set, and it is there at most once."""
        result = marked(processed(message_id, tags), lambda *key: 3 if delivered else None).metadata
        assert ("echoOf" in result) == (ECHO_TAG in result["tags"]) == (delivered or FROM_SELF in tags)
        assert result["tags"].count(ECHO_TAG) <= 1
        assert [t for t in result["tags"] if t != ECHO_TAG] == [t for t in tags if t != ECHO_TAG]

    @given(tags=st.lists(st.sampled_from(["chat:mention", FROM_SELF, ECHO_TAG, "x:y"])),
           channel=st.sampled_from([ROOM, None]), message_id=st.sampled_from(["m1", None]),
           delivered=st.booleans(), with_lookup=st.booleans())
    def test_the_mark_at_ingest_is_the_typed_read_of_the_stored_row(self, tags: list[str], channel: str | None,
                                                                    message_id: str | None, delivered: bool,
                                                                    with_lookup: bool):
        """What `marked` decides from the delivered item is what `echo_of` reads from the metadata it stores."""
        item = processed(message_id, tags, channel=channel)
        lookup = (lambda *key: 3 if delivered else None) if with_lookup else None
        meta = item_meta(item.metadata)
        changes = echo_of(meta, lookup) is not None or ECHO_TAG in meta.tags
        result = marked(item, lookup)
        assert (result is not item) == changes
        assert result.echo_of == echo_of(meta, lookup)


class TestIngest:
    async def test_the_bots_own_delivered_message_tagged_as_a_mention_is_stored_and_wakes_no_one(
            self, tmp_path: Path):
        """The echo is stored with echoOf = the outbox id and host:echo; the wake rules refuse it."""
        async with ingest(tmp_path / "host.db") as intake:
            outbox_id = await delivered_publish(intake, "m-1")
            intake.store.outbox.remember_delivered("disc", ROOM, "m-1", outbox_id)  # what the sender does
            (answer,) = await intake.store_messages("disc", "channels/incoming", [mention("m-1")])
            assert answer["accepted"]
            (item,) = [i for i in await intake.store.items.list() if i.role == "user"]
            assert item.metadata["echoOf"] == outbox_id and ECHO_TAG in item.metadata["tags"]
            assert is_echo(stored_view(item)) and not wake_matches(agent(), stored_view(item))

    async def test_someone_elses_mention_still_wakes(self, tmp_path: Path):
        """A message id no publish was delivered as is an ordinary item and wakes the agent."""
        async with ingest(tmp_path / "host.db") as intake:
            outbox_id = await delivered_publish(intake, "m-1")
            intake.store.outbox.remember_delivered("disc", ROOM, "m-1", outbox_id)
            await intake.store_messages("disc", "channels/incoming", [mention("m-2")])
            (item,) = [i for i in await intake.store.items.list() if i.role == "user"]
            assert "echoOf" not in item.metadata and wake_matches(agent(), stored_view(item))

    async def test_after_a_restart_the_window_is_seeded_from_the_outbox(self, tmp_path: Path):
        """A publish delivered before the host stopped is still known as such when its echo comes after."""
        async with ingest(tmp_path / "host.db") as intake:
            outbox_id = await delivered_publish(intake, "m-1")
        async with ingest(tmp_path / "host.db") as restarted:
            assert restarted.store.outbox.recent_delivered("disc", ROOM, "m-1") is None  # memory starts empty
            await restarted.store_messages("disc", "channels/incoming", [mention("m-1")])
            (item,) = [i for i in await restarted.store.items.list() if i.role == "user"]
            assert item.metadata["echoOf"] == outbox_id

    async def test_an_echo_is_logged_once_with_its_place_and_publish(self, tmp_path: Path):
        """ingest.echo names the connector, channel and messageId of the echo and the outbox id it echoes."""
        async with ingest(tmp_path / "host.db") as intake:
            outbox_id = await delivered_publish(intake, "m-1")
            intake.store.outbox.remember_delivered("disc", ROOM, "m-1", outbox_id)
            with capture_logs() as logs:
                await intake.store_messages("disc", "channels/incoming", [mention("m-1"), mention("m-2")])
        echoes = [{k: v for k, v in e.items() if k != "log_level"} for e in logs if e["event"] == "ingest.echo"]
        assert echoes == [{"event": "ingest.echo", "connector": "disc", "channel": ROOM, "message": "m-1",
                           "echo_of": outbox_id}]

    async def test_a_push_tagged_from_self_is_marked_too(self, tmp_path: Path):
        """Both lanes are marked: a push carrying chat:from-self is stored as an echo (echoOf true)."""
        async with ingest(tmp_path / "host.db") as intake:
            await intake.store_push("disc", AdmittedPush(
                event_id="e-1", feature_set="disc.alerts", source_timestamp=None, channel_id=ROOM,
                content=[{"type": "text", "text": "me"}], tags=[FROM_SELF, "chat:mention", "chat:addressed"]))
            (item,) = await intake.store.items.list()
            assert item.metadata["echoOf"] is True and not wake_matches(agent(), stored_view(item))


def waking(item_id: int, message_id: str, *, channel: str = ROOM) -> StoredItem:
    metadata = {"serverId": "disc", "channelId": channel, "messageId": message_id, "threadId": None,
                "tags": ["chat:mention", "chat:addressed"], "source": {"kind": "channel"}}
    return StoredItem(id=item_id, agent=None, participant="ann", role="user", content=[], metadata=metadata,
                      created_at=AT)


def wake_for(*items: StoredItem, overflow: int = 0) -> Wake:
    places = sorted({conversation_id("disc", i.metadata["channelId"], None) for i in items})
    return Wake(item_ids=tuple(i.id for i in items), overflow=overflow, conversations=tuple(places),
                several_conversations=len(places) > 1, first_at=0.0)


class TestWakeSecondLook:
    def test_an_echo_answered_after_it_was_stored_is_dropped_when_the_wake_fires(self):
        """The echo beat its publish's answer, so it was stored unmarked; by the wake it is known and left out."""
        echo, mention = waking(1, "m-1", channel=OTHER), waking(2, "m-2")
        kept = without_late_echoes(wake_for(echo, mention), [echo, mention],
                                   lambda *key: 5 if key == ("disc", OTHER, "m-1") else None)
        assert kept is not None and kept.item_ids == (2,)
        assert kept.conversations == (conversation_id("disc", ROOM, None),) and not kept.several_conversations

    def test_a_wake_of_echoes_only_is_no_turn(self):
        """Every waking item is an echo: no wake is left."""
        echo = waking(1, "m-1")
        assert without_late_echoes(wake_for(echo), [echo], lambda *key: 5) is None

    def test_an_overflowed_wake_keeps_its_counted_items_and_its_places(self):
        """Counted-only items cannot be checked: the wake stays, with the scheduler's several conversations."""
        echo, mention = waking(1, "m-1", channel=OTHER), waking(2, "m-2")
        wake = wake_for(echo, mention, overflow=3)
        kept = without_late_echoes(wake, [echo, mention], lambda *key: 5 if key[2] == "m-1" else None)
        assert kept is not None and kept.item_ids == (2,) and kept.overflow == 3 and kept.several_conversations

    def test_no_echo_returns_the_same_wake(self):
        """Nothing to drop: the very same wake comes back (no copy, no log)."""
        mention = waking(2, "m-2")
        wake = wake_for(mention)
        assert without_late_echoes(wake, [mention], lambda *key: None) is wake


class TestRuntime:
    async def test_an_echo_stored_before_its_publish_was_answered_starts_no_turn(self, tmp_path: Path):
        """The echo is stored unmarked, its delivery is remembered during the debounce: no turn, cursor past it."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, _), \
                running(store, writer, [agent_config(debounce_ms=300, max_wait_ms=300)],
                        {"scout": backend}) as (_, intake):
            (echo,) = await heard(intake, "hi, I am scout")
            (item,) = await store.items.get_many([echo])
            assert "echoOf" not in item.metadata  # ingest could not know yet
            store.outbox.remember_delivered("disc", item.metadata["channelId"], item.metadata["messageId"], 1)
            with anyio.fail_after(10):
                while (await store.cursors.get("scout") or 0) < echo:  # a low-water mark: at or past it
                    await anyio.sleep(0.01)
            (mention,) = await heard(intake, "scout, a real question")
            (turn,) = await turns_of(store, "scout", 1)
        assert turn.wake_item_ids == [mention] and len(backend.requests) == 1

    async def test_after_a_restart_the_catch_up_knows_an_echo_stored_before_its_answer(self, tmp_path: Path):
        """Echo stored unmarked, then its publish delivered, then the host stops: the restart's catch-up runs no turn."""
        async with agent_store(tmp_path) as (store, writer, intake):
            await writer.submit(SetCursor("scout", 0, AT))
            (echo,) = await heard(intake, "hi, I am scout")
            (item,) = await store.items.get_many([echo])
            await delivered_publish(intake, item.metadata["messageId"], channel=item.metadata["channelId"],
                                    at=now_ms())
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, _), \
                running(store, writer, [agent_config(catch_up_max_age_s=10**9)], {"scout": backend}):
            with anyio.fail_after(10):
                while (await store.cursors.get("scout") or 0) < echo:  # a low-water mark: at or past it
                    await anyio.sleep(0.01)
            assert await store.turns.list() == [] and backend.requests == []
