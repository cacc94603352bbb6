"""A turn's speech on a real store: routed prose becomes speech and outbox rows, the rest drafts and a notice."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcplhost.agents.backends import make_backend
from mcplhost.agents.model import BackendError
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.agents.turns.runner import run_turn
from mcplhost.agents.turns.turn_services import AgentState, TurnDeps
from mcplhost.agents.wakes.rules import Wake
from mcplhost.config import AgentConfig, ConnectorConfig
from mcplhost.inbound.conversation import conversation_id
from mcplhost.ingest import Ingest
from mcplhost.ingest.service import EDITED_TAG
from mcplhost.protocol.answers import ListedTool
from mcplhost.protocol.channels import Channel
from mcplhost.protocol.intake import AdmittedMessage
from mcplhost.speech.budget import DUPLICATE, PUBLISH_CAP
from mcplhost.supervisor.handle import State

from ..builders import wake_of
from .support import ADDRESSED, ROOM, agent_config, agent_store, reply_with_tools, scripted

OTHER = "disc:g1:other"
PUBLISH = "channels.publish"


@dataclass
class StandInHandle:
    """What routing reads of a connector handle: its name, grant and registered channels (no process needed)."""

    name: str
    registered: list[Channel]
    grant: frozenset[str] = frozenset({PUBLISH, "channels.incoming", "channels.register"})
    spec: ConnectorConfig = field(default_factory=lambda: ConnectorConfig(name="disc", command=["stand-in"]))
    state: State = State.READY

    def channels(self) -> list[Channel]:
        return list(self.registered)

    def channel(self, channel_id: str) -> Channel | None:
        return next((c for c in self.registered if c.id == channel_id), None)

    def tools(self) -> list[ListedTool]:
        return []


@dataclass
class CountingSender:
    """Stands in for an OutboxSender: counts how often the turn woke it."""

    notified: int = 0
    history: list[int] = field(default_factory=list)

    def notify(self) -> None:
        self.notified += 1


def disc(*channels: Channel, grant: frozenset[str] | None = None, name: str = "disc") -> StandInHandle:
    handle = StandInHandle(name, list(channels))
    if grant is not None:
        handle.grant = grant
    return handle


ROOMS = (Channel(id=ROOM, label="#room"), Channel(id=OTHER, label="#other"))


async def said(ingest: Ingest, body: str, *, channel: str = ROOM, thread: str | None = None,
               server: str = "disc", tags: list[str] | None = None, message_id: str | None = None) -> int:
    """One addressed channel message (thread optional) through the inbound pipeline; its item id."""
    message = AdmittedMessage(channel_id=channel, label="#room", message_id=message_id or f"m-{body}-{channel}",
                              participant="Alice", content=[{"type": "text", "text": body}],
                              tags=list(ADDRESSED if tags is None else tags), thread_id=thread)
    await ingest.store_messages(server, "channels/incoming", [message])
    items = await ingest.store.items.list()
    return max(item.id for item in items if item.metadata.get("messageId") == message.message_id)


async def turn(tmp_path_store: Any, agent: AgentConfig, handles: dict[str, Any], wake: Wake,
               senders: dict[str, CountingSender] | None = None) -> str:
    store, writer = tmp_path_store
    deps = TurnDeps(store=store, writer=writer, handles=handles, outbox=senders or {})
    state = AgentState(backend=make_backend(agent.backend), toolbox=ToolBox(agent, handles, store))
    return (await run_turn(agent, wake, deps, state)).outcome


async def own(store: Any, kind: str | None = None) -> list[Any]:
    rows = [item for item in await store.items.list() if item.agent == "scout"]
    return [row for row in rows if kind is None or row.metadata.get("kind") == kind]


def text_of(row: Any) -> str:
    return "".join(block["text"] for block in row.content if block.get("type") == "text")


class TestDefaultDestination:
    async def test_a_mention_in_a_thread_is_answered_into_that_thread(self, tmp_path: Path):
        """The reply is a speech row for (disc, room, thread) with its outbox row, and that sender is woken."""
        agent = agent_config(backend=scripted("hi Alice"))
        senders = {"disc": CountingSender()}
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello", thread="t-1")
            assert await turn((store, writer), agent, {"disc": disc(*ROOMS)}, wake_of(item), senders) == "completed"
            (speech,) = await own(store, "speech")
            (entry,) = await store.outbox.list()
        assert speech.metadata["destination"] == {"serverId": "disc", "channelId": ROOM, "threadId": "t-1"}
        assert speech.metadata["outboxId"] == entry.id and text_of(speech) == "hi Alice"
        assert (entry.server_id, entry.channel_id, entry.thread_id, entry.state) == ("disc", ROOM, "t-1", "pending")
        assert speech.metadata["conversationId"] == conversation_id("disc", ROOM, "t-1")
        assert senders["disc"].notified == 1

    async def test_a_correction_is_answered_into_its_inherited_thread(self, tmp_path: Path):
        """An edit sent without a thread counts as the thread of the message it corrects."""
        agent = agent_config(backend=scripted("fixed"))
        async with agent_store(tmp_path) as (store, writer, ingest):
            await said(ingest, "helo", thread="t-7", message_id="m-orig")
            edit = await said(ingest, "hello", tags=[*ADDRESSED, EDITED_TAG], message_id="m-orig")
            await turn((store, writer), agent, {"disc": disc(*ROOMS)}, wake_of(edit))
            (entry,) = await store.outbox.list()
        assert (entry.channel_id, entry.thread_id) == (ROOM, "t-7")

    async def test_several_conversations_make_a_draft_and_a_notice_and_publish_nothing(self, tmp_path: Path):
        """A wake over two channels has no default: the prose is a draft, a drafts notice follows, no outbox row."""
        agent = agent_config(backend=scripted("to whom?"))
        async with agent_store(tmp_path) as (store, writer, ingest):
            first = await said(ingest, "one")
            second = await said(ingest, "two", channel=OTHER)
            await turn((store, writer), agent, {"disc": disc(*ROOMS)}, wake_of(first, second))
            drafts, notices = await own(store, "draft"), await own(store, "drafts")
            assert await store.outbox.list() == [] and await own(store, "speech") == []
        assert [text_of(d) for d in drafts] == ["to whom?"] and len(notices) == 1
        assert "channel_publish" in text_of(notices[0])

    async def test_an_overflowed_wake_is_undecided(self, tmp_path: Path):
        """Even with one visible conversation, an overflowed wake publishes nothing."""
        agent = agent_config(backend=scripted("hi"))
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello")
            await turn((store, writer), agent, {"disc": disc(*ROOMS)}, wake_of(item, overflow=3))
            assert await store.outbox.list() == [] and len(await own(store, "draft")) == 1


class TestPins:
    async def test_a_pin_sends_what_follows_elsewhere_and_the_pin_line_is_not_sent(self, tmp_path: Path):
        """Prose before the pin goes to the default; after `>>> #other`, to that channel; the pin line to no one."""
        agent = agent_config(backend=scripted("here\n>>> #other\nthere"))
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello")
            await turn((store, writer), agent, {"disc": disc(*ROOMS)}, wake_of(item))
            entries = await store.outbox.list()
            speech = await own(store, "speech")
        assert [(e.channel_id) for e in entries] == [ROOM, OTHER]
        assert [text_of(s).strip() for s in speech] == ["here", "there"]

    async def test_a_pin_before_a_tool_call_holds_for_the_closing_prose(self, tmp_path: Path):
        """A pin written in a round's prose still routes the turn's final prose (rest of the turn)."""
        agent = agent_config(backend=scripted(reply_with_tools(">>> #other\nchecking", ("history_search",
                                                                                     {"query": "x"})), "done"))
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello")
            await turn((store, writer), agent, {"disc": disc(*ROOMS)}, wake_of(item))
            entries = await store.outbox.list()
        assert [e.channel_id for e in entries] == [OTHER, OTHER]


class TestProseBeforeToolCalls:
    async def test_prose_before_a_call_is_queued_before_the_call_runs(self, tmp_path: Path):
        """The round's prose has its outbox row before channel_publish queues the call's own publish."""
        agent = agent_config(backend=scripted(reply_with_tools(
            "first", ("channel_publish", {"channel": "#other", "text": "second"})), ""))
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello")
            await turn((store, writer), agent, {"disc": disc(*ROOMS)}, wake_of(item))
            entries = await store.outbox.list()
            rows = await own(store)
        assert [(e.channel_id, e.id) for e in entries] == [(ROOM, entries[0].id), (OTHER, entries[1].id)]
        assert entries[0].id < entries[1].id
        kinds = [r.metadata["kind"] for r in rows]
        assert kinds.index("speech") < kinds.index("tool-call")  # stored before the call, which joins it


class TestChannelPublish:
    async def _publish(self, tmp_path: Path, handles: dict[str, Any], arguments: dict[str, Any],
                       closing: str = "") -> tuple[dict[str, Any], list[Any], list[Any]]:
        agent = agent_config(backend=scripted(reply_with_tools("", ("channel_publish", arguments)), closing))
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello")
            await turn((store, writer), agent, handles, wake_of(item))
            (result,) = await own(store, "tool-result")
            entries = await store.outbox.list()
            rows = await own(store)
        return json.loads(text_of(result)), entries, rows

    async def test_queued_with_its_outbox_id_and_thread(self, tmp_path: Path):
        """A permitted channel answers queued with the outbox id of the row it wrote, thread included."""
        answer, entries, _ = await self._publish(tmp_path, {"disc": disc(*ROOMS)},
                                                 {"channel": "disc/" + OTHER, "text": "hey", "thread": "t-9"})
        (entry,) = entries
        assert answer == {"status": "queued", "outboxId": entry.id}
        assert (entry.channel_id, entry.thread_id) == (OTHER, "t-9")

    async def test_refusals_name_their_reason(self, tmp_path: Path):
        """Inbound-only, no channels.publish, unknown and ambiguous are refusals, and nothing is queued."""
        inbound = Channel(id="disc:feed", label="#feed", direction="inbound")
        cases = {
            "inbound_only": ({"disc": disc(inbound, *ROOMS)}, "#feed"),
            "no_publish": ({"disc": disc(*ROOMS, grant=frozenset({"channels.incoming"}))}, "#other"),
            "unknown": ({"disc": disc(*ROOMS)}, "#nowhere"),
            "ambiguous": ({"disc": disc(*ROOMS), "twin": disc(*ROOMS, name="twin")}, OTHER),
        }
        for index, (reason, (handles, channel)) in enumerate(cases.items()):
            folder = tmp_path / str(index)
            folder.mkdir()
            answer, entries, _ = await self._publish(folder, handles, {"channel": channel, "text": "x"})
            assert (answer, entries) == ({"status": "refused", "reason": reason}, []), reason

    async def test_no_double_send_to_the_default_destination(self, tmp_path: Path):
        """After channel_publish reached the default destination, the closing prose is a draft with the reason."""
        _, entries, rows = await self._publish(tmp_path, {"disc": disc(*ROOMS)},
                                               {"channel": "#room", "text": "the answer"}, closing="the answer again")
        assert len(entries) == 1
        (draft,) = [r for r in rows if r.metadata["kind"] == "draft"]
        assert text_of(draft) == "the answer again" and draft.metadata["reason"]


class TestPublishBounds:
    async def test_a_turn_repeating_the_same_channel_publish_publishes_it_once(self, tmp_path: Path):
        """A script whose last step repeats the same channel_publish (every round until max_tool_rounds): one
        publish; every later call is told it was a duplicate and queues nothing."""
        call = ("channel_publish", {"channel": "#other", "text": "the same news"})
        agent = agent_config(backend=scripted(reply_with_tools("", call)), max_tool_rounds=3)
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello")
            await turn((store, writer), agent, {"disc": disc(*ROOMS)}, wake_of(item))
            spoken = [text_of(r) for r in await own(store, "speech")]
            entries = await store.outbox.list()
            answers = [json.loads(text_of(r)) for r in await own(store, "tool-result")]
        assert spoken == ["the same news"] and len(entries) == 1
        assert [a["status"] for a in answers] == ["queued", "refused", "refused"]
        assert {a.get("reason") for a in answers[1:]} == {DUPLICATE}

    async def test_past_the_cap_calls_are_refused_and_prose_is_a_draft(self, tmp_path: Path):
        """With max_publishes_per_turn = 2: two calls queue, the third is refused publish_cap, and the closing
        prose is a draft with that reason and its notice."""
        calls = [("channel_publish", {"channel": "#other", "text": f"part {n}"}) for n in range(3)]
        agent = agent_config(backend=scripted(reply_with_tools("", *calls), "and a summary"),
                             max_publishes_per_turn=2)
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello")
            await turn((store, writer), agent, {"disc": disc(*ROOMS)}, wake_of(item))
            spoken = [text_of(r) for r in await own(store, "speech")]
            entries = await store.outbox.list()
            answers = [json.loads(text_of(r)) for r in await own(store, "tool-result")]
            (draft,) = await own(store, "draft")
            (notice,) = await own(store, "drafts")
        assert spoken == ["part 0", "part 1"] and len(entries) == 2
        assert [a.get("reason") for a in answers] == [None, None, PUBLISH_CAP]
        assert (text_of(draft), draft.metadata["reason"]) == ("and a summary", PUBLISH_CAP)
        assert "max_publishes_per_turn" in text_of(notice) and "channel_publish {" not in text_of(notice)


class FailsAfter:
    """A backend that answers its first `answered` rounds from a script, then fails every call."""

    def __init__(self, script: Any, *, answered: int) -> None:
        self.script = make_backend(script)
        self.answered = answered
        self.calls = 0

    async def complete(self, request: Any, *, on_text: Any = None) -> Any:
        self.calls += 1
        if self.calls <= self.answered:
            return await self.script.complete(request, on_text=on_text)
        raise BackendError("server_error", "HTTP 500 after 2 retries")

    async def aclose(self) -> None:
        return None


class TestFailedTurnNotice:
    async def test_a_turn_that_fails_after_queuing_prose_says_that_prose_went_out(self, tmp_path: Path):
        """Prose queued before an earlier round's tool calls is sent even when a later round fails:
        the turn-failed notice says so instead of "nothing of it was sent"."""
        agent = agent_config(backend=scripted(reply_with_tools("on it", ("history_search", {"query": "x"}))))
        handles = {"disc": disc(*ROOMS)}
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello")
            deps = TurnDeps(store=store, writer=writer, handles=handles)
            state = AgentState(backend=FailsAfter(agent.backend, answered=1), toolbox=ToolBox(agent, handles, store))
            assert (await run_turn(agent, wake_of(item), deps, state)).outcome == "failed"
            (entry,) = await store.outbox.list()
            (notice,) = await own(store, "turn-failed")
        assert entry.channel_id == ROOM
        assert text_of(notice) == ("Your last turn failed (server_error); the publish queued before the failure"
                                   " went out, the rest was not sent.")

    async def test_a_turn_that_fails_before_saying_anything_says_nothing_was_sent(self, tmp_path: Path):
        agent = agent_config()
        handles = {"disc": disc(*ROOMS)}
        async with agent_store(tmp_path) as (store, writer, ingest):
            item = await said(ingest, "hello")
            deps = TurnDeps(store=store, writer=writer, handles=handles)
            state = AgentState(backend=FailsAfter(agent.backend, answered=0), toolbox=ToolBox(agent, handles, store))
            assert (await run_turn(agent, wake_of(item), deps, state)).outcome == "failed"
            (notice,) = await own(store, "turn-failed")
            assert await store.outbox.list() == []
        assert text_of(notice) == "Your last turn failed (server_error); nothing of it was sent."
