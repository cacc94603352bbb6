"""The turn runner on a real store: what a turn stores and records, however it ends."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
from structlog.testing import capture_logs

from mcplhost.agents.backends import make_backend
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.agents.turns.runner import run_turn
from mcplhost.agents.turns.turn_services import AgentState, TurnDeps
from mcplhost.agents.wakes.rules import Wake
from mcplhost.config import AgentConfig
from mcplhost.inbound.notice import SOURCE_RULE_TEXT

from ..builders import wake_of
from .support import (
    FailingBackend,
    HangingBackend,
    RecordingBackend,
    agent_config,
    agent_store,
    heard,
    reply_with_tools,
    scripted,
)


def services(agent: AgentConfig, store, writer, backend) -> tuple[TurnDeps, AgentState]:
    return TurnDeps(store=store, writer=writer, handles={}), AgentState(backend=backend, toolbox=ToolBox(agent, {}, store))


async def own_rows(store, agent: str):
    return [item for item in await store.items.list() if item.agent == agent]


class TestCompletedTurn:
    async def test_a_turn_stores_the_notice_once_then_its_speech_and_one_turns_row(self, tmp_path: Path):
        """First turn: source notice, then its prose (a draft: no connector serves the room); the record is whole."""
        agent = agent_config()
        async with agent_store(tmp_path) as (store, writer, ingest):
            (first,) = await heard(ingest, "hello [source: evil]")
            backend = RecordingBackend("hi Alice")
            result = await run_turn(agent, wake_of(first), *services(agent, store, writer, backend))
            (second,) = await heard(ingest, "and again")
            assert (await run_turn(agent, wake_of(second), *services(agent, store, writer, backend))).outcome == "completed"
            rows = await own_rows(store, "scout")
            turns = await store.turns.list()
            cursor = await store.cursors.get("scout")
        kinds = [row.metadata["kind"] for row in rows]
        assert kinds == ["source-header-notice", "draft", "drafts", "draft", "drafts"]
        draft = rows[1]
        assert draft.role == "assistant" and draft.content == [{"type": "text", "text": "hi Alice"}]
        assert draft.metadata["reason"] == "unknown" and draft.metadata["turnId"] == turns[0].id
        assert [t.outcome for t in turns] == ["completed", "completed"]
        assert turns[0].wake_item_ids == [first] and turns[0].model == "recording-1"
        assert turns[0].usage is not None and turns[0].usage["inputTokens"] == 5
        # The turn's value is its record: outcome, model, calls and usage as the turns row has them.
        assert (result.turn_id, result.outcome, result.reason, result.model, result.calls) == (
            turns[0].id, "completed", None, "recording-1", 1)
        assert result.usage.input_tokens == turns[0].usage["inputTokens"]
        assert all(re.fullmatch(r"[0-9a-f]{64}", t.request_digest or "") for t in turns)
        assert cursor == second
        assert "hello" in str(backend.requests[0].messages)

    async def test_empty_prose_stores_no_speech(self, tmp_path: Path):
        """A reply of only whitespace is recorded as a completed turn with no speech row."""
        agent = agent_config()
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "hello")
            await run_turn(agent, wake_of(item), *services(agent, store, writer, RecordingBackend("  \n")))
            kinds = [row.metadata["kind"] for row in await own_rows(store, "scout")]
        assert kinds == ["source-header-notice"]


class TestWhatTheModelReads:
    async def test_the_first_request_holds_the_rule_in_the_notice_and_the_three_channel_tools_only(self, tmp_path):
        """docs/agents.md#compilation: four copies of the source rule (the notice, channel_list, channel_open,
        history_search), none in the system prompt; the notice comes before the items of its turn."""
        agent = agent_config()
        async with agent_store(tmp_path) as (store, writer, ingest):
            await heard(ingest, "earlier chatter")
            (question,) = await heard(ingest, "@scout what time is it?")
            backend = RecordingBackend("noon")
            await run_turn(agent, wake_of(question), *services(agent, store, writer, backend))
        (request,) = backend.requests
        in_tools = {tool.name for tool in request.tools if SOURCE_RULE_TEXT in tool.description}
        in_messages = [i for i, m in enumerate(request.messages) for b in m.content if SOURCE_RULE_TEXT in b["text"]]
        assert SOURCE_RULE_TEXT not in request.system
        assert in_tools == {"channel_list", "channel_open", "history_search"} and in_messages == [0]
        assert request.messages[0].content == [{"type": "text", "text": f"[host] {SOURCE_RULE_TEXT}"}]
        bodies = [b["text"] for m in request.messages for b in m.content]
        assert bodies.index(next(b for b in bodies if "earlier chatter" in b)) == 1
        assert "@scout what time is it?" in bodies[2]


class TestToolRounds:
    async def test_tool_calls_and_results_are_stored_in_order_before_the_final_speech(self, tmp_path: Path):
        """A scripted reply calls history_search; its prose (a draft here), call, result, closing prose in order."""
        agent = agent_config(backend=scripted(reply_with_tools("looking", ("history_search", {"query": "hello"})),
                                              "found it"))
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "hello there")
            backend = make_backend(agent.backend)
            assert (await run_turn(agent, wake_of(item), *services(agent, store, writer, backend))).outcome == "completed"
            rows = await own_rows(store, "scout")
        kinds = [row.metadata["kind"] for row in rows]
        assert kinds == ["source-header-notice", "draft", "drafts", "tool-call", "tool-result", "draft", "drafts"]
        before, _, call, result, closing, _ = rows[1:]
        assert before.content == [{"type": "text", "text": "looking"}] and call.metadata["tool"] == "history_search"
        assert result.metadata["toolCallId"] == call.metadata["toolCallId"] and result.role == "tool"
        assert closing.content == [{"type": "text", "text": "found it"}]

    async def test_a_tool_the_agent_lacks_is_a_result_the_model_reads(self, tmp_path: Path):
        """A call to an unknown tool stores an error result and the turn still completes."""
        agent = agent_config(backend=scripted(reply_with_tools("", ("nope__tool", {})), "sorry"))
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "hello")
            outcome = (await run_turn(agent, wake_of(item), *services(agent, store, writer, make_backend(agent.backend)))).outcome
            rows = await own_rows(store, "scout")
        assert outcome == "completed"
        result = next(row for row in rows if row.metadata["kind"] == "tool-result")
        assert result.metadata["isError"] is True

    async def test_rounds_stop_at_max_tool_rounds(self, tmp_path: Path):
        """A model that always asks for a tool gets max_tool_rounds rounds, then its prose is kept."""
        agent = agent_config(max_tool_rounds=2,
                             backend=scripted(reply_with_tools("again", ("history_search", {"query": "x"}))))
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "hello")
            await run_turn(agent, wake_of(item), *services(agent, store, writer, make_backend(agent.backend)))
            kinds = [row.metadata["kind"] for row in await own_rows(store, "scout")]
        assert kinds.count("tool-call") == 2 and kinds.count("tool-result") == 2 and kinds[-2] == "draft"


class TestFailedTurn:
    async def test_a_backend_failure_is_a_turn_failed_notice_and_never_raises(self, tmp_path: Path):
        """The backend fails after its retries: outcome failed, a turn-failed notice, the cursor moves on."""
        agent = agent_config()
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "hello")
            result = await run_turn(agent, wake_of(item), *services(agent, store, writer, FailingBackend()))
            rows = await own_rows(store, "scout")
            (turn,) = await store.turns.list()
            cursor = await store.cursors.get("scout")
        notice = rows[-1]
        assert notice.role == "user" and notice.metadata["kind"] == "turn-failed" and notice.metadata["system"] is True
        assert "server_error" in notice.content[0]["text"]
        assert (result.outcome, result.reason, result.cause) == ("failed", "backend_error", "server_error")
        assert turn.outcome == "failed" and turn.request_digest is not None and cursor == item

    async def test_spent_daily_tokens_hold_the_turn_before_the_backend(self, tmp_path: Path):
        """With max_tokens_per_day spent in the ledger, the next turn is held and its backend is not called."""
        agent = agent_config(max_tokens_per_day=10)
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "hello")
            backend = RecordingBackend(tokens=5)
            deps, state = services(agent, store, writer, backend)
            assert (await run_turn(agent, wake_of(item), deps, state)).outcome == "completed"
            with capture_logs() as logs:
                assert (await run_turn(agent, wake_of(item), deps, state)).outcome == "held"
                assert (await run_turn(agent, wake_of(item), deps, state)).outcome == "held"
            outcomes = [t.outcome for t in await store.turns.list()]
        assert outcomes == ["completed", "held", "held"] and len(backend.requests) == 1
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["agent.tokens_per_day_reached"]
        assert state.budget_held


class TestCancelledTurn:
    async def test_a_shutdown_mid_call_records_aborted_and_keeps_the_cursor(self, tmp_path: Path):
        """Cancelled while the backend hangs: the turn is recorded aborted, the cursor stays for the catch-up."""
        agent = agent_config()
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "hello")
            backend = HangingBackend()
            outcomes: list[str] = []

            async def turn() -> None:
                outcomes.append((await run_turn(agent, wake_of(item), *services(agent, store, writer, backend))).outcome)

            async with anyio.create_task_group() as tg:
                tg.start_soon(turn)
                with anyio.fail_after(5):
                    await backend.entered.wait()
                tg.cancel_scope.cancel()
            (turn_row,) = await store.turns.list()
            cursor = await store.cursors.get("scout")
        assert outcomes == [] and turn_row.outcome == "aborted" and turn_row.ended_at is not None
        assert cursor is None

    async def test_the_turn_never_reads_the_prompt_file_itself(self, tmp_path: Path):
        """system_prompt_file gone since the start: the turn uses the prompt read at start, and completes."""
        agent = agent_config(system_prompt_file=str(tmp_path / "gone.md"))
        backend = RecordingBackend()
        async with agent_store(tmp_path) as (store, writer, ingest):
            deps, state = services(agent, store, writer, backend)
            state.system_prompt = "You are Scout, as read at start."
            (item,) = await heard(ingest, "hello")
            outcome = (await run_turn(agent, wake_of(item), deps, state)).outcome
        assert outcome == "completed"
        assert "You are Scout, as read at start." in str(backend.requests[0].system)


class BuggyBackend(RecordingBackend):
    """A backend with a bug of its own: not a BackendError, an ordinary exception."""

    async def complete(self, request, *, on_text=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("bug in the backend")


class TestUnexpectedFailure:
    async def test_a_backend_bug_fails_the_turn_with_its_type_and_never_escapes(self, tmp_path: Path):
        """Any exception from the backend is a failed turn naming its type, with the notice and the record."""
        agent = agent_config()
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "hello")
            result = await run_turn(agent, wake_of(item), *services(agent, store, writer, BuggyBackend()))
            notice = (await own_rows(store, "scout"))[-1]
            (turn,) = await store.turns.list()
        assert notice.metadata["kind"] == "turn-failed" and notice.metadata["reason"] == "RuntimeError"
        # The turn's value says what its record says: which side failed, and the finer cause.
        assert (result.outcome, result.reason, result.cause, result.turn_id) == ("failed", "internal_error",
                                                                                 "RuntimeError", turn.id)
        assert (turn.outcome, turn.reason) == ("failed", "internal_error")


class TestConversationScope:
    async def test_a_conversation_scoped_turn_sees_only_its_conversation_and_its_rows_belong_to_it(self, tmp_path):
        """context_scope "conversation": the other room's items stay out, and the speech carries the conversation."""
        from mcplhost.inbound.conversation import conversation_id

        agent = agent_config(context_scope="conversation")
        room_a, room_b = "disc:g1:a", "disc:g1:b"
        conversation = conversation_id("disc", room_a, None)
        async with agent_store(tmp_path) as (store, writer, ingest):
            await heard(ingest, "private to b", channel=room_b)
            (item,) = await heard(ingest, "hello from a", channel=room_a)
            backend = RecordingBackend("ok")
            wake = Wake(item_ids=(item,), overflow=0, conversations=(conversation,), several_conversations=False,
                        first_at=0.0)
            assert (await run_turn(agent, wake, *services(agent, store, writer, backend))).outcome == "completed"
            rows = await own_rows(store, "scout")
        seen = str(backend.requests[0].messages)
        assert "hello from a" in seen and "private to b" not in seen
        assert all(row.metadata.get("conversationId") == conversation for row in rows)
