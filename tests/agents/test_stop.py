"""Stop commands (docs/agents.md#stop): the pure rule, and a stop against a real host and real connector processes.

A stop from a `control_from` sender aborts the running turn (outcome
aborted, reason stopped, one lifecycle `aborted`), drops the pending wakes
(each recorded `dropped_by_stop`), fails the turn's unsent publishes with
`stopped`, wakes nobody, and moves the cursor past all of it, so a restart
runs no catch-up for them. From anyone else, `!stop` is an ordinary message.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mcplhost.agents.wakes.scheduler import AgentScheduler
from mcplhost.agents.wakes.stop import DROPPED_BY_STOP, is_stop_command
from mcplhost.agents.wiring import build_agents
from mcplhost.config import AgentConfig, BackendConfig, Config
from mcplhost.inbound.conversation import conversation_id
from mcplhost.ingest import Ingest, Stored
from mcplhost.protocol.intake import AdmittedMessage
from mcplhost.speech.echoes import EchoMemory
from mcplhost.store import NewItem
from mcplhost.store.operations import PublishSpeech, StartCursor
from mcplhost.store.outbox import OutboxEntry

from ..builders import incoming, message
from ..harness import Beside, config_with, record, scripted, wait_for
from ..memory_pair import memory_host
from .llm_server import LlmServer, Reply, ToolUse
from .support import RecordingBackend, agent_config, agent_store
from .test_scheduler import addressed

ROOM = "disc:g1:room"
BOSS, ALICE = "u-boss", "u-alice"
#: Alice (or, with author replaced, the boss) asking scout.
ASKED: dict[str, Any] = {"author": {"id": ALICE, "name": ALICE}, "tags": ["chat:addressed"]}
MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "channels": {"register": True, "incoming": True, "publish": True},
    "inferenceLifecycle": True,
    "featureSets": {"chat": {"description": "chat", "uses": [
        "channels.register", "channels.incoming", "channels.publish", "inferenceLifecycle"]}},
}
GRANT = ["channels.register", "channels.incoming", "channels.publish", "inferenceLifecycle"]
REGISTER = {"request": "channels/register", "params": {"channels": [
    {"id": ROOM, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#room"}]}}


def lifecycle_phases(folder: Path) -> list[str]:
    return [e["params"]["phase"] for e in record(folder, "disc").events
            if e["kind"] == "notified" and e["method"] == "inference/lifecycle"]


def published_texts(folder: Path) -> list[str]:
    return [m["params"]["content"][0]["text"] for m in record(folder, "disc").received
            if m.get("method") == "channels/publish"]


async def until(condition: Callable[[], Awaitable[Any]], timeout: float = 20) -> Any:
    """Await an async condition over the store (polled, bounded)."""
    with anyio.fail_after(timeout):
        while not (value := await condition()):
            await anyio.sleep(0.02)
    return value


def scout(llm: LlmServer, **fields: Any) -> AgentConfig:
    backend = BackendConfig(kind="openai", model="m", base_url=llm.openai_base_url, api_key_env="TEST_LLM_KEY",
                            max_retries=0, timeout_s=30)
    return AgentConfig(name="scout", wake_on=["addressed"], debounce_ms=0, max_wait_ms=0, backend=backend,
                       control_from=[f"disc/{BOSS}"], **fields)


def host_config(tmp_path: Path, steps: list[dict[str, Any]], agent: AgentConfig, **handlers: Any) -> Config:
    script = {"manifest": MANIFEST, "steps": [REGISTER, *steps], "notifications": ["inference/lifecycle"],
              "handlers": {"channels/publish": {"result": {"delivered": True, "messageId": "sent-1"}}, **handlers}}
    connector = scripted("disc", script, tmp_path, grant=GRANT, request_timeout_s=60.0)
    return msgspec.structs.replace(config_with(tmp_path, connector), agents=[agent])


async def item_id(store: Any, message_id: str) -> int:
    return next(item.id for item in await store.items.list() if item.metadata.get("messageId") == message_id)


# --- the pure rule --------------------------------------------------------------------------------

def channel_item(body: str, author: str | None = BOSS, server: str = "disc", **metadata: Any) -> NewItem:
    meta = {"serverId": server, "channelId": ROOM, "source": {"kind": "channel"}, "tags": ["chat:addressed"],
            **({"authorId": author} if author is not None else {}), **metadata}
    return NewItem(role="user", content=[{"type": "text", "text": body}], metadata=meta, created_at=0)


CONTROLLED = AgentConfig(name="scout", control_from=["disc/u-b*"])
SPACE = st.sampled_from([" ", "\t", "\n", "  ", "\u3000"])


class TestIsStopCommand:
    @given(command=st.sampled_from(["!stop", "/stop"]), before=st.lists(SPACE, max_size=3),
           after=st.lists(SPACE, max_size=3), upper=st.lists(st.booleans(), min_size=5, max_size=5))
    def test_a_configured_command_trimmed_and_in_any_case_from_control_from_stops(
            self, command: str, before: list[str], after: list[str], upper: list[bool]):
        cased = "".join(c.upper() if up else c for c, up in zip(command, upper, strict=True))
        assert is_stop_command(CONTROLLED, channel_item("".join(before) + cased + "".join(after)))

    @given(body=st.text(max_size=20))
    def test_a_body_that_is_not_a_command_never_stops(self, body: str):
        assert is_stop_command(CONTROLLED, channel_item(body)) == (body.strip().casefold() in {"!stop", "/stop"})

    @given(author=st.text(min_size=1, max_size=8))
    def test_only_a_control_from_sender_stops(self, author: str):
        assert is_stop_command(CONTROLLED, channel_item("!stop", author)) == author.startswith("u-b")

    def test_the_configured_commands_are_compared_case_folded_too(self):
        agent = AgentConfig(name="scout", control_from=["disc/*"], stop_commands=["  HALT  "])
        assert is_stop_command(agent, channel_item("halt"))
        assert not is_stop_command(agent, channel_item("!stop"))

    @pytest.mark.parametrize("item", [
        channel_item("!stop", author=None),  # no author id: no sender to match
        channel_item("!stop", server="other"),  # another connector's author with the same id
        channel_item("!stop", tags=["chat:from-self"]),  # the echo of this host's own publish
        channel_item("!stop", source={"kind": "unscoped"}),  # a push, not a channel message
        msgspec.structs.replace(channel_item("!stop"), agent="scout"),  # an agent's own row
    ])
    def test_what_is_no_stop(self, item: NewItem):
        assert not is_stop_command(CONTROLLED, item)

    def test_no_control_from_no_stop_and_an_unheard_channel_is_no_stop(self):
        assert not is_stop_command(AgentConfig(name="scout"), channel_item("!stop"))
        deaf = AgentConfig(name="scout", control_from=["disc/*"], hears=["disc/elsewhere"])
        assert not is_stop_command(deaf, channel_item("!stop"))


# --- against a real host ---------------------------------------------------------------------------

class TestStopMidTurn:
    async def test_a_stop_aborts_the_turn_drops_the_pending_wake_and_fails_unsent_publishes(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """Turn: "one" (sent, its answer slow), "two" (queued behind it), then a hanging call; " !STOP " arrives.

        The turn ends aborted/stopped with one lifecycle `aborted`; Alice's
        pending m-2 is dropped with its decision; "two" is never sent; the
        cursor is past the stop, so a restart runs no catch-up turn.
        """
        monkeypatch.setenv("TEST_LLM_KEY", "k")
        steps = [incoming(message(ROOM, "m-1", "scout, go", **ASKED)),
                 {"wait": "inference/lifecycle", "count": 5},  # the third inference has started
                 incoming(message(ROOM, "m-2", "and this too", **ASKED)),
                 incoming(message(ROOM, "m-3", " !STOP ", **{**ASKED, "author": {"id": BOSS, "name": BOSS}}))]
        slow_publish = {"delay": 30, "result": {"delivered": True, "messageId": "sent-1"}}
        with LlmServer(default=Reply(hang=True)) as llm:
            llm.push(Reply("one", tool_calls=(ToolUse("c1", "history_search", {"query": "a"}),)),
                     Reply("two", tool_calls=(ToolUse("c2", "history_search", {"query": "b"}),)))
            config = host_config(tmp_path, steps, scout(llm), **{"channels/publish": slow_publish})
            async with memory_host(config) as host:
                store = host.store
                (turn,) = await until(lambda: _ended_turns(store))
                m2, m3 = await item_id(store, "m-2"), await item_id(store, "m-3")
                cursor = await until(lambda: _cursor_at_least(store, m3))
                await wait_for(lambda: "aborted" in lifecycle_phases(tmp_path))
                # Written by the runner's next step, after the aborted turn's own end (which may move the cursor first).
                decisions = await until(lambda: store.decisions.for_item(m2))
                rows = await store.outbox.list()
                assert (await store.turns.list()) == [turn]  # neither m-2 nor the stop woke another turn
        assert (turn.outcome, turn.reason) == ("aborted", "stopped")
        assert lifecycle_phases(tmp_path) == ["started", "completed", "started", "completed", "started", "aborted"]
        assert [(d.agent, d.reason) for d in decisions] == [("scout", DROPPED_BY_STOP)]
        assert cursor >= m3
        assert {row.state for row in rows} == {"failed"} and all(row.last_error == "stopped" for row in rows)
        assert len(rows) == 2 and "two" not in published_texts(tmp_path)
        with capture_logs() as logs:
            async with memory_host(host_config(tmp_path, [], scout(llm))) as host:
                await wait_for(lambda: [e for e in logs if e["event"] == "agent.catch_up"])
                assert len(await host.store.turns.list()) == 1
        (catch_up,) = [e for e in logs if e["event"] == "agent.catch_up"]
        assert catch_up["items"] == 0


async def _ended_turns(store: Any) -> list[Any]:
    return [t for t in await store.turns.list() if t.outcome is not None]


async def _cursor_at_least(store: Any, item: int) -> int | None:
    cursor = await store.cursors.get("scout")
    return cursor if cursor is not None and cursor >= item else None


# --- the runtime on a real store ------------------------------------------------------------------

async def say(ingest: Ingest, body: str, author: str, message_id: str) -> int:
    """One addressed channel message from `author`, through the inbound pipeline; its item id."""
    admitted = AdmittedMessage(channel_id=ROOM, label="#room", message_id=message_id, participant=author,
                               author_id=author, content=[{"type": "text", "text": body}],
                               tags=["chat:addressed", "chat:mention"])
    await ingest.store_messages("disc", "channels/incoming", [admitted])
    return next(i.id for i in await ingest.store.items.list() if i.metadata.get("messageId") == message_id)


class TestStopInTheRuntime:
    async def _run(self, tmp_path: Path, agent: AgentConfig, backend: Any,
                   body: Callable[[Ingest, Any], Awaitable[None]]) -> None:
        async with agent_store(tmp_path) as (store, writer, _):
            await self._run_on(store, writer, agent, backend, body)

    async def _run_on(self, store: Any, writer: Any, agent: AgentConfig, backend: Any,
                      body: Callable[[Ingest, Any], Awaitable[None]]) -> None:
        """The runtime fed by an Ingest's real Stored stream, while `body` runs."""
        send, receive = anyio.create_memory_object_stream[Stored](64)
        ingest = Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox), events=send)
        runtime = build_agents(Config(agents=[agent]), store, writer, {}, backends={agent.name: backend})
        async with send, anyio.create_task_group() as tg:
            await tg.start(runtime.run, receive)
            await body(ingest, store)
            tg.cancel_scope.cancel()

    async def test_a_stop_from_outside_control_from_is_an_ordinary_message_and_wakes(self, tmp_path: Path):
        backend = RecordingBackend()

        async def body(ingest: Ingest, store: Any) -> None:
            stop = await say(ingest, "!stop", ALICE, "m-1")
            (turn,) = await until(lambda: _ended_turns(store))
            assert turn.wake_item_ids == [stop] and turn.outcome == "completed"

        await self._run(tmp_path, agent_config(control_from=[f"disc/{BOSS}"]), backend, body)

    async def test_with_no_turn_running_a_stop_drops_the_pending_wake_and_wakes_no_one(self, tmp_path: Path):
        """Alice's item waits out a long debounce; the boss's stop drops it: no turn, its decision, the cursor past both."""
        backend = RecordingBackend()
        agent = agent_config(control_from=[f"disc/{BOSS}"], debounce_ms=600_000, max_wait_ms=600_000)

        async def body(ingest: Ingest, store: Any) -> None:
            with capture_logs() as logs:
                pending = await say(ingest, "scout, do the thing", ALICE, "m-1")
                stop = await say(ingest, "/STOP", BOSS, "m-2")
                assert await until(lambda: _cursor_at_least(store, stop))
            assert [(d.reason, d.item_id) for d in await store.decisions.for_item(pending)] == [
                (DROPPED_BY_STOP, pending)]
            assert await store.decisions.for_item(stop) == []  # the stop is no dropped wake: it is the stop
            read_back = {row.id: row for row in await store.items.get_many([pending, stop])}
            assert is_stop_command(agent, read_back[stop]) and not is_stop_command(agent, read_back[pending])
            (line,) = [e for e in logs if e["event"] == "agent.stop"]
            assert (line["turn_aborted"], line["dropped"]) == (False, 1)

        await self._run(tmp_path, agent, backend, body)
        assert backend.requests == []

    async def test_a_stop_found_by_the_start_s_catch_up_wakes_no_one(self, tmp_path: Path):
        """A stop stored after the cursor while the host was down: the catch-up leaves it out.

        The next ordinary item then wakes a turn of its own alone.
        """
        backend = RecordingBackend()
        agent = agent_config(control_from=[f"disc/{BOSS}"])
        async with agent_store(tmp_path) as (store, writer, quiet):
            await writer.submit(StartCursor(agent.name, time.time_ns() // 1_000_000))
            await say(quiet, " !Stop", BOSS, "m-1")  # stored with no runtime listening

            async def body(ingest: Ingest, store: Any) -> None:
                hello = await say(ingest, "scout, hello", ALICE, "m-2")
                (turn,) = await until(lambda: _ended_turns(store))
                assert turn.wake_item_ids == [hello]

            await self._run_on(store, writer, agent, backend, body)



class TestSenderNeverSendsAFailedRow:
    async def test_a_row_failed_after_the_sender_read_it_is_not_sent(self, tmp_path: Path):
        """The stop's write lands between the sender's read and its try: the row is looked at again, not sent."""
        script = {"manifest": MANIFEST, "steps": [REGISTER],
                  "handlers": {"channels/publish": {"result": {"delivered": True, "messageId": "sent-1"}}}}
        db = tmp_path / "host.db"
        config = config_with(tmp_path, scripted("disc", script, tmp_path, grant=GRANT))

        def stop_lands(outbox: Any) -> Beside:  # the sender's check just before its try, after a write beside it

            async def is_pending(outbox_id: int) -> bool:
                with sqlite3.connect(db) as conn:
                    conn.execute("UPDATE outbox SET state = 'failed', last_error = 'stopped' WHERE id = ?", (outbox_id,))
                return await outbox.is_pending(outbox_id)

            return Beside(outbox, is_pending=is_pending)

        with capture_logs() as logs:
            async with memory_host(config) as host:
                await wait_for(lambda: any(e["kind"] == "step" for e in record(tmp_path, "disc").events))
                sender = host.outbox_senders["disc"]
                sender.outbox = stop_lands(sender.outbox)
                speech = NewItem(role="assistant", content=[{"type": "text", "text": "late"}],
                                 metadata={"kind": "speech"}, created_at=1, agent="scout")
                entry = _entry("late")
                published = await host.writer.write(PublishSpeech(speech, [entry]))
                host.outbox_senders["disc"].notify()
                await wait_for(lambda: [e for e in logs if e["event"] == "outbox.no_longer_pending"])
                row = await host.store.outbox.get(published.outbox_ids[0])
        assert (row.state, row.last_error) == ("failed", "stopped")
        assert published_texts(tmp_path) == []


def _entry(text: str) -> OutboxEntry:
    return OutboxEntry(agent="scout", turn_id=None, server_id="disc", channel_id=ROOM, thread_id=None,
                       conversation_id=conversation_id("disc", ROOM, None), text=text,
                       created_at=time.time_ns() // 1_000_000)


class TestSchedulerDropsPendingWakes:
    @given(ids=st.lists(st.integers(min_value=1, max_value=500), min_size=1, max_size=150, unique=True),
           conversation_scope=st.booleans())
    def test_dropped_wakes_are_handled_never_due_and_never_wake_again(self, ids: list[int], conversation_scope: bool):
        """Whatever pended (several conversations, past MAX_PENDING_IDS): dropped, the mark passes it, nothing is due."""
        agent = AgentConfig(name="scout", wake_on=["addressed"], max_wakes_per_sender_per_hour=1000,
                            context_scope="conversation" if conversation_scope else "agent")
        s = AgentScheduler(agent)
        for item_id in ids:
            s.on_item(addressed(item_id, channel=f"room-{item_id % 3}"), 1.0)
        dropped, counted_only = s.drop_pending(2.0)
        assert len(dropped) + counted_only == len(ids) and set(dropped) <= set(ids)
        assert s.due(1_000.0) is None and s.next_deadline() is None
        assert s.handled_through(max(ids)) == max(ids)
        assert not any(s.on_item(addressed(item_id), 3.0) for item_id in dropped)
