"""AgentsRuntime on a real store and the real Stored stream: wakes, cursors, catch-up, gaps, isolation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from anyio.abc import ObjectSendStream
from structlog.testing import capture_logs

from mcplhost.agents import startup
from mcplhost.agents.runtime import AgentsRuntime
from mcplhost.agents.wakes.scheduler import HOUR_S
from mcplhost.agents.wiring import build_agents
from mcplhost.config import AgentConfig, Config
from mcplhost.errors import ConfigError
from mcplhost.ingest import Ingest, Stored
from mcplhost.secrets import Secrets
from mcplhost.speech.echoes import EchoMemory
from mcplhost.store import export_line
from mcplhost.store.operations import RecordTurn, SetCursor

from ..harness import wait_for
from .support import ADDRESSED, HangingBackend, RecordingBackend, agent_config, agent_store, heard


@asynccontextmanager
async def running(store: Any, writer: Any, agents: list[AgentConfig], backends: dict[str, Any], **options: Any
                  ) -> AsyncIterator[tuple[AgentsRuntime, Ingest]]:
    """The runtime fed by an Ingest's real Stored stream; yields both; cancelled on exit."""
    send, receive = anyio.create_memory_object_stream[Stored](64)
    ingest = Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox), events=send)
    runtime = build_agents(Config(agents=agents), store, writer, {}, backends=backends, **options)
    async with send, anyio.create_task_group() as tg:
        await tg.start(runtime.run, receive)
        yield runtime, ingest
        tg.cancel_scope.cancel()


@asynccontextmanager
async def hand_fed(store: Any, writer: Any, agents: list[AgentConfig], backends: dict[str, Any]
                   ) -> AsyncIterator[ObjectSendStream[Stored]]:
    """The runtime fed by hand: yields the sending end of its Stored stream; cancelled on exit."""
    send, receive = anyio.create_memory_object_stream[Stored](8)
    runtime = build_agents(Config(agents=agents), store, writer, {}, backends=backends)
    async with send, anyio.create_task_group() as tg:
        await tg.start(runtime.run, receive)
        yield send
        tg.cancel_scope.cancel()


async def turns_of(store: Any, agent: str, count: int, timeout: float = 10) -> list[Any]:
    async def enough() -> list[Any]:
        return [t for t in await store.turns.list() if t.agent == agent and t.outcome is not None]

    with anyio.fail_after(timeout):
        while len(found := await enough()) < count:
            await anyio.sleep(0.01)
    return found


class TestWakes:
    async def test_a_stored_item_wakes_the_agent_and_its_turn_is_recorded(self, tmp_path: Path):
        """One item through the stream: one completed turn naming it; the backend saw its body."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, _), \
                running(store, writer, [agent_config()], {"scout": backend}) as (_, ingest):
            (item,) = await heard(ingest, "hello scout")
            (turn,) = await turns_of(store, "scout", 1)
            assert await store.cursors.get("scout") == item
        assert turn.wake_item_ids == [item] and "hello scout" in str(backend.requests[0].messages)

    async def test_an_item_that_matches_no_wake_rule_wakes_no_one(self, tmp_path: Path):
        """wake_on addressed: an ambient message is heard (in the next context) but starts no turn."""
        backend = RecordingBackend()
        agent = agent_config(wake_on=["addressed"])
        async with agent_store(tmp_path) as (store, writer, _), \
                running(store, writer, [agent], {"scout": backend}) as (runtime, ingest):
            await heard(ingest, "just chatting", tags=["chat:ambient"])
            (woke,) = await heard(ingest, "scout?")
            (turn,) = await turns_of(store, "scout", 1)
        assert turn.wake_item_ids == [woke] and "just chatting" in str(backend.requests[0].messages)

    async def test_statistics_name_each_agent(self, tmp_path: Path):
        """statistics() has one scheduler snapshot per configured agent."""
        async with agent_store(tmp_path) as (store, writer, _), \
                running(store, writer, [agent_config("a"), agent_config("b")],
                        {"a": RecordingBackend(), "b": RecordingBackend()}) as (runtime, _):
            stats = runtime.statistics()
        assert set(stats) == {"a", "b"} and stats["a"].state == "idle"

    async def test_a_wake_reads_its_items_as_the_store_holds_them_without_reading_the_store(self, tmp_path: Path):
        """The items a wake remembers from their events are the store's rows to the byte (secret redaction
        included); once read they are forgotten, and a wake with an item not remembered reads the store."""
        send, receive = anyio.create_memory_object_stream[Stored](16)
        async with send, receive, agent_store(tmp_path) as (store, writer, _):
            ingest = Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox), events=send,
                            secrets=Secrets({"BOT_TOKEN": "hunter2-secret"}))
            runner = build_agents(Config(agents=[agent_config()]), store, writer, {},
                                 backends={"scout": RecordingBackend()}).runners["scout"]
            ids = await heard(ingest, "scout, hello", "scout: the key is hunter2-secret", tags=ADDRESSED)
            events = [receive.receive_nowait() for _ in ids]
            for event in events:
                runner.offer(event, anyio.current_time())
            remembered = runner._remembered(tuple(ids))
            assert remembered is not None
            assert [export_line(item) for item in remembered] == \
                [export_line(item) for item in await store.items.get_many(ids)]
            assert b"hunter2" not in b"".join(export_line(item) for item in remembered)
            assert runner._remembered(tuple(ids)) is None  # forgotten once read: the next wake's are new items


class TestCursors:
    async def test_a_new_agent_gets_a_cursor_at_the_end_at_once_and_old_items_never_wake_it(self, tmp_path: Path):
        """Items stored before the agent existed: its cursor is their last id before any turn, and no turn runs."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, ingest):
            before = await heard(ingest, "old one", "old two")
            async with running(store, writer, [agent_config()], {"scout": backend}):
                assert await store.cursors.get("scout") == before[-1]
        assert backend.requests == []

    async def test_at_start_items_after_the_cursor_wake_the_agent_once(self, tmp_path: Path):
        """A cursor behind three waking items (a crash between commit and turn): one catch-up turn for all three."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, ingest):
            (seen,) = await heard(ingest, "handled")
            await writer.submit(SetCursor("scout", seen, 0))
            missed = await heard(ingest, "one", "two", "three")
            async with running(store, writer, [agent_config()], {"scout": backend}):
                (turn,) = await turns_of(store, "scout", 1)
                assert await store.cursors.get("scout") == missed[-1]
        assert turn.wake_item_ids == missed and len(backend.requests) == 1

    async def test_agents_behind_by_different_amounts_each_catch_up_from_their_own_cursor(self, tmp_path: Path):
        """a's cursor is before two items, b's before one: one pass over the store gives each its own wake."""
        backends = {"a": RecordingBackend(), "b": RecordingBackend()}
        async with agent_store(tmp_path) as (store, writer, ingest):
            (first,) = await heard(ingest, "one")
            await writer.submit(SetCursor("a", first, 0))
            (second,) = await heard(ingest, "two")
            await writer.submit(SetCursor("b", second, 0))
            (third,) = await heard(ingest, "three")
            async with running(store, writer, [agent_config("a"), agent_config("b")], backends):
                (turn_a,) = await turns_of(store, "a", 1)
                (turn_b,) = await turns_of(store, "b", 1)
        assert turn_a.wake_item_ids == [second, third] and turn_b.wake_item_ids == [third]

    async def test_items_older_than_catch_up_max_age_do_not_wake(self, tmp_path: Path):
        """catch_up_max_age_s = 0 turns catch-up off: items after the cursor are heard, not woken for."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, ingest):
            (seen,) = await heard(ingest, "handled")
            await writer.submit(SetCursor("scout", seen, 0))
            await heard(ingest, "stale")
            async with running(store, writer, [agent_config(catch_up_max_age_s=0)], {"scout": backend}) as (_, ing):
                (fresh,) = await heard(ing, "fresh")
                (turn,) = await turns_of(store, "scout", 1)
        assert turn.wake_item_ids == [fresh]

    async def test_dropped_events_are_read_from_the_store(self, tmp_path: Path):
        """An event saying two were dropped before it: the runtime reads them, and the wake has all three."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, ingest), \
                hand_fed(store, writer, [agent_config(debounce_ms=50, max_wait_ms=1000)], {"scout": backend}) as send:
            ids = await heard(ingest, "one", "two", "three")  # this ingest has no stream: no events
            ((last_id, last),) = await store.items.after_as_written(ids[-2])
            await send.send(Stored(last_id, last, missed_before=2))
            (turn,) = await turns_of(store, "scout", 1)
        assert sorted(turn.wake_item_ids) == ids


#: A wall-clock instant (epoch ms) the turn-guard tests fix the runtime's clock at.
FIXED_MS = 1_800_000_000_000
MINUTE_MS = 60_000


class TestTurnGuardAcrossRestarts:
    async def test_a_restart_does_not_reset_max_turns_per_hour(self, tmp_path: Path):
        """A turn run before a restart still fills a cap of 1: after the restart the next wake is held, no turn."""
        agent = agent_config(max_turns_per_hour=1)
        async with agent_store(tmp_path) as (store, writer, _):
            before = RecordingBackend()
            async with running(store, writer, [agent], {"scout": before}) as (_, ingest):
                await heard(ingest, "first")
                await turns_of(store, "scout", 1)
            after = RecordingBackend()
            async with running(store, writer, [agent], {"scout": after}) as (runtime, ingest):
                assert runtime.statistics()["scout"].turns_last_hour == 1
                await heard(ingest, "second")
                await wait_for(lambda: runtime.statistics()["scout"].held, timeout=5)
                assert runtime.statistics()["scout"].pending_wakes == 1
            assert len(await store.turns.list()) == 1
        assert len(before.requests) == 1 and after.requests == []

    async def test_seeded_turns_age_out_when_they_leave_the_hour(self, tmp_path: Path):
        """Ledger turns 30 and 10 minutes old fill a cap of 2; the held wake is due when the older is an hour old."""
        agent = agent_config(max_turns_per_hour=2)
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, _):
            for minutes_ago in (61, 30, 10):  # the first has left the window already
                started = FIXED_MS - minutes_ago * MINUTE_MS
                await writer.submit(RecordTurn("scout", (), started, started + 1, "completed"))
            began = anyio.current_time()
            async with running(store, writer, [agent], {"scout": backend},
                               clock_ms=lambda: FIXED_MS) as (runtime, ingest):
                started = anyio.current_time()
                await heard(ingest, "held back")
                await wait_for(lambda: runtime.statistics()["scout"].held, timeout=5)
                deadline = runtime.runners["scout"].scheduler.next_deadline()
        assert deadline is not None
        # Seeded between `began` and `started`, the 30-minute-old turn leaves the window 30 minutes on.
        assert began + HOUR_S - 30 * 60 <= deadline <= started + HOUR_S - 30 * 60
        assert backend.requests == []

    async def test_turns_older_than_an_hour_do_not_hold(self, tmp_path: Path):
        """A ledger turn 61 minutes old is out of the window: a cap of 1 lets the next wake run at once."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, _):
            started = FIXED_MS - 61 * MINUTE_MS
            await writer.submit(RecordTurn("scout", (), started, started + 1, "completed"))
            async with running(store, writer, [agent_config(max_turns_per_hour=1)], {"scout": backend},
                               clock_ms=lambda: FIXED_MS) as (runtime, ingest):
                assert runtime.statistics()["scout"].turns_last_hour == 0
                (item,) = await heard(ingest, "go")
                turns = await turns_of(store, "scout", 2)
        assert turns[-1].wake_item_ids == [item] and len(backend.requests) == 1


class TestIsolation:
    async def test_a_hung_backend_delays_only_its_own_agent(self, tmp_path: Path):
        """Agent a's model hangs; agent b, woken by the same item, completes its turn well within a second."""
        hung, quick = HangingBackend(), RecordingBackend()
        agents = [agent_config("a"), agent_config("b")]
        async with agent_store(tmp_path) as (store, writer, _), \
                running(store, writer, agents, {"a": hung, "b": quick}) as (_, ingest):
            started = anyio.current_time()
            await heard(ingest, "both of you")
            await turns_of(store, "b", 1, timeout=5)
            took = anyio.current_time() - started
            assert hung.entered.is_set()
            await heard(ingest, "b again")
            await wait_for(lambda: len(quick.requests) == 2, timeout=5)
        assert took < 1.0, took
        assert len(hung.requests) == 1  # a is still in its first turn: single flight


class GatedBackend(RecordingBackend):
    """A backend whose n-th call answers only once the test opens gate n."""

    def __init__(self, calls: int) -> None:
        super().__init__()
        self.gates = [anyio.Event() for _ in range(calls)]
        self.entered = [anyio.Event() for _ in range(calls)]

    async def complete(self, request, *, on_text=None):  # type: ignore[no-untyped-def]
        call = len(self.requests)
        response = await super().complete(request)
        self.entered[call].set()
        await self.gates[call].wait()
        return response


ROOM_A, ROOM_B, ROOM_C = "disc:g1:a", "disc:g1:b", "disc:g1:c"


class TestCursorLowWaterMark:
    async def test_another_conversation_s_turn_never_moves_the_cursor_past_a_pending_item(self, tmp_path: Path):
        """Items 10 (A), 11 (B), 12 (A) pend while a turn runs; B's turn ends first: the cursor stays below 10."""
        backend = GatedBackend(3)
        agent = agent_config(context_scope="conversation", max_wait_ms=60_000)
        async with agent_store(tmp_path) as (store, writer, _), \
                running(store, writer, [agent], {"scout": backend}) as (runtime, ingest):
            (first,) = await heard(ingest, "c", channel=ROOM_C)
            await backend.entered[0].wait()  # its turn is running: what follows pends
            (ten,) = await heard(ingest, "a1", channel=ROOM_A)
            (eleven,) = await heard(ingest, "b", channel=ROOM_B)
            (twelve,) = await heard(ingest, "a2", channel=ROOM_A)
            await wait_for(lambda: runtime.statistics()["scout"].pending_wakes == 3)
            backend.gates[0].set()
            await backend.entered[1].wait()  # the second turn: B's, whose item came first to its group's end
            assert first < await store.cursors.get("scout") == ten - 1  # past C's turn, not into what pends
            backend.gates[1].set()
            await backend.entered[2].wait()  # B's turn has ended and A's is running
            b_turn = (await turns_of(store, "scout", 2))[1]
            assert b_turn.wake_item_ids == [eleven]
            assert await store.cursors.get("scout") == ten - 1  # not 11: 10 is still A's
            backend.gates[2].set()
            a_turn = (await turns_of(store, "scout", 3))[2]
            assert a_turn.wake_item_ids == [ten, twelve]
            assert await store.cursors.get("scout") == twelve

    async def test_a_gap_of_dropped_events_holds_the_cursor_until_it_is_read_back(self, tmp_path: Path):
        """A gap read that fails leaves every cursor below the gap: the next start's catch-up still has it."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, ingest), \
                hand_fed(store, writer, [agent_config()], {"scout": backend}) as send:
            (start,) = await heard(ingest, "before")  # this ingest has no stream: sent by hand below
            ((_, before),) = await store.items.after_as_written(start - 1)
            await send.send(Stored(start, before))
            await turns_of(store, "scout", 1)
            ids = await heard(ingest, "one", "two", "three")
            broken_read = store.items.after_as_written

            async def failing(*args: Any, **kwargs: Any) -> Any:
                raise OSError("disk gone")

            store.items.after_as_written = failing  # the gap's read back fails
            ((last_id, last),) = [(i, item) for i, item in await broken_read(ids[-2])]
            await send.send(Stored(last_id, last, missed_before=2))
            await turns_of(store, "scout", 2)
            assert await store.cursors.get("scout") == start  # not past one and two, never read


class TestBuildTime:
    async def test_the_prompt_file_is_read_once_at_build_an_edit_counts_after_a_restart(self, tmp_path: Path):
        """The file is edited after the runtime was built: the turn still uses the text read at start."""
        prompt = tmp_path / "scout.md"
        prompt.write_text("You are Scout, at start.", encoding="utf-8")
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, _), \
                running(store, writer, [agent_config(system_prompt_file=str(prompt))], {"scout": backend}) as (
                    _, ingest):
            prompt.write_text("You are Scout, edited.", encoding="utf-8")
            await heard(ingest, "hello")
            await turns_of(store, "scout", 1)
        assert "You are Scout, at start." in backend.requests[0].system
        assert "edited" not in backend.requests[0].system

    async def test_an_unreadable_prompt_file_at_build_is_a_config_error(self, tmp_path: Path):
        async with agent_store(tmp_path) as (store, writer, _):
            agent = agent_config(system_prompt_file=str(tmp_path / "gone.md"))
            with pytest.raises(ConfigError, match="system_prompt_file"):
                build_agents(Config(agents=[agent]), store, writer, {}, backends={"scout": RecordingBackend()})


class TestExceptionBoundary:
    async def test_a_bug_while_handling_a_wake_fails_that_turn_and_the_agent_answers_the_next(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """The first count of a wake's cause (the loop guard, before the turn) raises, as a bug there would: a
        failed turn with its notice; the second wake is answered."""
        from mcplhost.peers.service import PeerService

        backend = RecordingBackend()
        counted, counts = PeerService.consecutive_wakes, []

        def faulty(self: PeerService, agent: str) -> int:
            counts.append(agent)
            if len(counts) == 1:
                raise KeyError("a bug in the agent's code")
            return counted(self, agent)

        monkeypatch.setattr(PeerService, "consecutive_wakes", faulty)
        with capture_logs() as logs:
            async with agent_store(tmp_path) as (store, writer, _):
                async with running(store, writer, [agent_config()], {"scout": backend}) as (_, ingest):
                    (first,) = await heard(ingest, "one")
                    (failed,) = await turns_of(store, "scout", 1)
                    (second,) = await heard(ingest, "two")
                    later = (await turns_of(store, "scout", 2))[1]
                    notices = [row for row in await store.items.list()
                               if row.agent == "scout" and row.metadata.get("kind") == "turn-failed"]
                    cursor = await store.cursors.get("scout")
        assert counts[0] == "scout"
        assert failed.outcome == "failed" and failed.wake_item_ids == [first]
        assert len(notices) == 1 and notices[0].metadata["reason"] == "KeyError"
        assert later.outcome == "completed" and later.wake_item_ids == [second] and cursor == second
        (line,) = [e for e in logs if e["event"] == "agent.turn_failed"]
        assert "KeyError: \"a bug in the agent's code\"" in line["traceback"]  # logged once, with its traceback


class TestOutOfOrderEvents:
    async def test_events_of_one_commit_out_of_id_order_are_offered_in_order_as_one_batch(self, tmp_path: Path):
        """12's event comes before 11's: both are offered together, one wake for both, the cursor at 12."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, ingest), \
                hand_fed(store, writer, [agent_config()], {"scout": backend}) as send:
            ids = await heard(ingest, "eleven", "twelve")  # this ingest has no stream: sent by hand below
            events = {i: Stored(i, item) for i, item in await store.items.after_as_written(ids[0] - 1)}
            send.send_nowait(events[ids[1]])  # as two callers of one commit may emit them
            send.send_nowait(events[ids[0]])
            (turn,) = await turns_of(store, "scout", 1)
            assert await store.cursors.get("scout") == ids[1]
        assert turn.wake_item_ids == ids


class TestBoundedCatchUp:
    async def test_items_a_bounded_catch_up_did_not_read_hold_the_cursor_until_the_next_start(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """The catch-up stops after two of four items: its turn and later ones never move the cursor past them."""
        monkeypatch.setattr(startup, "CATCH_UP_PAGE", 1)
        monkeypatch.setattr(startup, "CATCH_UP_MAX_ITEMS", 2)
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, ingest):
            (seen,) = await heard(ingest, "handled")
            await writer.submit(SetCursor("scout", seen, 0))
            missed = await heard(ingest, "one", "two", "three", "four")
            async with running(store, writer, [agent_config()], {"scout": backend}) as (_, live):
                (caught,) = await turns_of(store, "scout", 1)
                assert await store.cursors.get("scout") == missed[1]
                (later,) = await heard(live, "five")
                assert (await turns_of(store, "scout", 2))[1].wake_item_ids == [later]
                assert await store.cursors.get("scout") == missed[1]  # three and four were never offered
        assert caught.wake_item_ids == missed[:2]


class TestCatchUpSkipsHandled:
    async def test_items_above_the_cursor_a_finished_turn_handled_do_not_wake_again(self, tmp_path: Path):
        """Cursor below 'pending', 'answered' handled by a completed turn, 'aborted' by an aborted one: two wake."""
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, ingest):
            (seen,) = await heard(ingest, "handled")
            await writer.submit(SetCursor("scout", seen, 0))
            pending, answered, aborted = await heard(ingest, "pending", "answered", "aborted")
            await writer.submit(RecordTurn("scout", (answered,), 1, 2, "completed"),
                                RecordTurn("scout", (aborted,), 3, 4, "aborted"))
            async with running(store, writer, [agent_config()], {"scout": backend}):
                caught = (await turns_of(store, "scout", 3))[2]
                assert await store.cursors.get("scout") >= aborted
        assert caught.wake_item_ids == [pending, aborted] and len(backend.requests) == 1
